"""The `tl` family's heuristic default variants per GPU and direction (what runs where nothing is tuned), and
how tuned knobs are fitted to another problem or to one call.

The table is searched most specific first; the first row of the direction whose GPU family,
compute capability, dtype and head dim match gives the knobs, which `fit` then shrinks to the
problem at hand.
"""

from dataclasses import replace

from autoflash.families.tl.knobs import BwdKnobs, FwdKnobs
from autoflash.families.tl.limits import (grid_y, not_worth_timing, packed_loads, programs, query_rows,
                                          split_programs_per_sm, split_saves_columns, tma_violations, violations)
from autoflash.gpu import Gpu, tma_aligned
from autoflash.knobs import MAX_GRID_Y, Knobs, head_dim_pad, next_power_of_2
from autoflash.problem import Problem

HALF = ("float16", "bfloat16")
ANY = ("float16", "bfloat16", "float32")

# (gpu family or "*", smallest compute capability, dtypes, largest padded head dim, knobs)
_TABLE = [
    # The interpreter runs numpy: large tiles mean fewer Python-level steps.
    ("interpreter", (0, 0), ANY, 256, FwdKnobs(block_m=32, block_n=32, num_warps=4, num_stages=1)),
    # H100, fp16, d64, FlashAttention grid (benchmarks/results/2026-11-22_h100_fa_grid_fwd_tune.log): 128x64,
    # 8 warps, 3-4 stages won 11 of 12 problems (pointer loads in 10).
    ("*", (9, 0), HALF, 64, FwdKnobs(block_m=128, block_n=64, num_warps=8, num_stages=4)),
    # H100, fp16, d128, exhaustive grid of 272 variants at 1k/4k/16k tokens (2026-11-22_h100_exhaustive_grid.log):
    # 128x64, 4 warps, 2 stages, TMA was fastest on all three; 128x128/8 warps/3 stages ran 7% (4k), 4% (16k) slower.
    # Descriptors built on the host ran 1.6-11% faster than built per program, most at 512-1k tokens
    # (benchmarks/NOTES.md, 21.).
    ("*", (9, 0), HALF, 128, FwdKnobs(block_m=128, block_n=64, num_warps=4, num_stages=2, loads="tma_host")),
    ("*", (9, 0), HALF, 256, FwdKnobs(block_m=128, block_n=64, num_warps=8, num_stages=2, loads="tma")),
    ("*", (8, 0), HALF, 128, FwdKnobs(block_m=128, block_n=64, num_warps=4, num_stages=3)),
    ("*", (0, 0), ANY, 256, FwdKnobs(block_m=64, block_n=32, num_warps=4, num_stages=2)),
    # Backward: FlashAttention-2's shape, 64 query rows streamed past 128 resident keys (a starting
    # point; the shipped tuning_db holds the measured winners).
    ("interpreter", (0, 0), ANY, 256, BwdKnobs(block_m=32, block_n=32, num_warps=4, num_stages=1)),
    ("*", (9, 0), HALF, 128, BwdKnobs(block_m=64, block_n=128, num_warps=8, num_stages=2)),
    ("*", (0, 0), ANY, 256, BwdKnobs(block_m=32, block_n=64, num_warps=4, num_stages=2)),
]


def default_knobs(problem: Problem, gpu: Gpu, direction: str = "fwd") -> Knobs | None:
    d = head_dim_pad(problem.head_dim)
    for family, capability, dtypes, max_head_dim, knobs in _TABLE:
        if knobs.DIRECTION == direction and family in ("*", gpu.family) and gpu.capability >= capability \
                and problem.dtype in dtypes and d <= max_head_dim:
            return split_keys(fit(split_head_dim(pack_heads(knobs, problem), problem), problem, gpu), problem, gpu)
    return None


def fit(knobs: Knobs, problem: Problem, gpu: Gpu) -> Knobs:
    """Shrink `knobs` until it is valid for `problem`: tiles no larger than the sequences, TMA only
    where it can run, then smaller tiles and fewer warps until registers and shared memory fit."""
    rows = query_rows(knobs, problem) if isinstance(knobs, FwdKnobs) else problem.seqlen_q
    knobs = replace(knobs, block_m=min(knobs.block_m, max(16, next_power_of_2(rows))),
                    block_n=min(knobs.block_n, max(16, next_power_of_2(problem.seqlen_k))))
    if isinstance(knobs, FwdKnobs) and knobs.loads != "pointer" and tma_violations(problem, gpu):
        knobs = replace(knobs, loads="pointer")
    if isinstance(knobs, FwdKnobs) and "VARLEN" in problem.variants:  # a table of tiles, in its order
        knobs = replace(knobs, loads=packed_loads(knobs, problem), schedule="in_order")
        if knobs.loads == "pointer" and knobs.block_m * head_dim_pad(problem.head_dim) >= 128 * 128:
            # masked address tiles cost ~85 registers a thread: 128 x d128 at 4 warps spills 1164 B, 8 warps
            # none and ran 1.25x faster (NOTES 49, 55)
            knobs = replace(knobs, num_warps=max(knobs.num_warps, 8))
    if isinstance(knobs, FwdKnobs) and grid_y(knobs, problem) > MAX_GRID_Y:  # batch x heads beyond the y axis
        knobs = replace(knobs, schedule="longest_first" if knobs.schedule == "in_order" else "in_order")
    while violations(knobs, problem, gpu):
        if knobs.block_m * knobs.block_n < 128 * knobs.num_warps and knobs.num_warps > 2:
            knobs = replace(knobs, num_warps=knobs.num_warps // 2)
        elif knobs.num_stages > 1:
            knobs = replace(knobs, num_stages=knobs.num_stages - 1)
        elif knobs.block_n > 16:
            knobs = replace(knobs, block_n=knobs.block_n // 2)
        elif knobs.block_m > 16:
            knobs = replace(knobs, block_m=knobs.block_m // 2)
        else:
            raise LookupError(f"no variant fits {problem} on {gpu.name}: {violations(knobs, problem, gpu)}")
    return knobs


def pack_heads(knobs: Knobs, problem: Problem) -> Knobs:
    """GQA/MQA where one head's query rows leave most of a tile empty (decode, speculative decode): pack
    the query heads of a KV head into the tile. H100 (benchmarks/NOTES.md, 20.): decode and 4-token
    steps with 4-16 query heads per KV head ran 1.3-4.7x faster packed (with key splits); a 2048-token
    prefill ran at half the speed."""
    if not isinstance(knobs, FwdKnobs) or problem.heads_q == problem.heads_kv or problem.seqlen_q >= knobs.block_m \
            or problem.mask_mod or problem.score_mod:  # (a mod takes one head per tile: a mask_mod's block table
        # has a row per head's query block, a score_mod gets the head as a number)
        return knobs
    return replace(knobs, pack_gqa=True, loads="pointer")


def split_head_dim(knobs: Knobs, problem: Problem) -> Knobs:
    """Head dims between powers of two (40, 80, 96, ...): two column tiles where they span fewer columns than
    one padded tile. H100 (benchmarks/NOTES.md, 26.-27.): the best split variant ran 1.03-1.07x (d40),
    1.15-1.31x (d80) and 1.05-1.11x (d96) against the tuned unsplit ones, and tuning chose a split at all three."""
    if not isinstance(knobs, FwdKnobs):
        return knobs
    return replace(knobs, head_dim_split=True) if split_saves_columns(problem) else knobs


def split_keys(knobs: Knobs, problem: Problem, gpu: Gpu) -> Knobs:
    """Where the query tiles alone leave most SMs idle (decode, batch 1 with few heads), split the keys:
    the most splits (a power of two) that keep the programs within `split_programs_per_sm` per SM (2; 16 for
    packed sequences of unequal lengths) and each split two key blocks or more; none where the programs already
    fill a quarter of that. H100 (benchmarks/NOTES.md, 17.): 64 programs of 1024 x 16384 keys ran 1.9x faster
    with 4 splits; 128 programs of 4096 x 4096 keys ran 12% slower with 2."""
    if not isinstance(knobs, FwdKnobs):
        return knobs
    count, per_sm = programs(knobs, problem), split_programs_per_sm(problem)
    if 4 * count > per_sm * gpu.multiprocessors:
        return knobs
    for splits in sorted(FwdKnobs.choices()["kv_splits"], reverse=True):
        candidate = replace(knobs, kv_splits=splits)
        if count * splits <= per_sm * gpu.multiprocessors and not not_worth_timing(candidate, problem, gpu):
            return candidate
    return knobs


def for_call(knobs: Knobs, *, tensors, deterministic: bool) -> tuple[Knobs, str]:
    """The knobs one call can run: pointer loads where its tensors (q, k, v, out) are not 16-byte aligned for
    TMA, dQ in its own pass under deterministic=True; and a note saying what changed."""
    if isinstance(knobs, FwdKnobs) and knobs.loads != "pointer" and not tma_aligned(*tensors):
        return replace(knobs, loads="pointer"), "TMA needs 16-byte aligned strides: pointer loads instead"
    if isinstance(knobs, BwdKnobs) and deterministic and knobs.dq == "atomic":
        return replace(knobs, dq="separate"), "deterministic=True: dQ in its own pass instead of atomics"
    return knobs, ""
