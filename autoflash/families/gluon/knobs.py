"""The knobs of the `gluon` family (templates/gluon: the forward in FlashAttention-3's shape and a FlashAttention-2/3
backward, written in Triton's Gluon dialect for Hopper), what they cannot run, and the heuristic defaults."""

import math
from dataclasses import dataclass, replace
from typing import ClassVar

from autoflash.gpu import Gpu, tma_aligned
from autoflash.knobs import MAX_GRID_Y, Knobs, cdiv, family_knob, head_dim_pad, knob
from autoflash.problem import Problem
from autoflash.resources import launcher

FAMILY_DOC = ("FlashAttention-3's shape in Gluon (templates/gluon), Hopper only: a TMA producer warp and "
              "consumer warpgroups with registers split between them, asynchronous wgmma")
BWD_DOC = ("FlashAttention-3's backward in Gluon (templates/gluon), Hopper only: a TMA producer warp, consumer "
           "warpgroups of 64 keys, asynchronous wgmma, dQ added by TMA reduce-add")
MAX_REGISTERS = 65536  # per SM, and one program holds an SM
BWD_CONSUMER_REGISTERS = 240  # setmaxnreg of the backward's consumer warpgroups (templates/gluon/attn_bwd.py.jinja)
MBARRIER_BYTES = 1024  # the barriers and the compiler's scratch, rounded up (measured: 368-472 B)


@dataclass(frozen=True)
class FwdKnobs(Knobs):
    DIRECTION: ClassVar[str] = "fwd"

    family: str = family_knob("gluon", FAMILY_DOC)
    block_m: int = knob(64, (64,), "query rows of one consumer warpgroup (one wgmma row block)")
    block_n: int = knob(128, (64, 128), "key rows of one K/V block")
    num_buffers: int = knob(2, (2, 3), "slots of the K/V ring in shared memory")
    q_buffers: int = knob(1, (1, 2), "Q tiles of each consumer: with 2 the next tile's Q loads under this whole "
                                      "tile (a persistent grid's), with 1 once this one's last Q K^T is done")
    consumers: int = knob(2, (1, 2, 3), "consumer warpgroups; a program's tile has consumers x block_m query rows")
    overlap: bool = knob(True, (True, False),
                         "each block's Q K^T and softmax under the last block's P V (intra-warpgroup overlap); "
                         "False: Q K^T, softmax, P V one after the other")
    pingpong: bool = knob(False, (False, True),
                          "two consumers take turns issuing their wgmmas (mbarriers), so one's softmax runs under "
                          "the other's matrix work")
    persistent: bool = knob(True, (True, False),
                            "one program per SM walks the tiles (the next tile's loads under this one's "
                            "epilogue); False: one program per tile")
    dynamic: bool = knob(False, (False, True),
                         "(persistent) each program takes its next tile from a global counter as it finishes one, "
                         "so unequal causal tiles go longest first to whichever SM is free; False: every "
                         "num_programs-th tile")
    stage_o_in_q: bool = knob(False, (False, True),
                              "O leaves through the consumer's Q tile (saves its shared memory; the next Q waits "
                              "for the store) instead of a tile of its own")
    tile_overlap: bool = knob(False, (False, True),
                              "(persistent, two Q tiles, overlap) the next tile's first Q K^T and softmax run under "
                              "this tile's last P V, before its epilogue (plain problems)")
    head_dim_split: bool = knob(False, (False, True),
                                "the head dim as two column tiles, the largest power of two below it and one for "
                                "the rest, instead of one padded to a power of two: head dim 160 computes 128 + 32 "
                                "columns, not 256 (two wgmmas for Q K^T and for P V, two O accumulators)")
    consumer_regs: int = knob(240, (240, 232, 160), "registers per thread of each consumer warpgroup but the first")
    producer_regs: int = knob(24, (24, 32, 40), "registers per thread of the producer warp('s warpgroup)")


@dataclass(frozen=True)
class BwdKnobs(Knobs):
    """templates/gluon/attn_bwd.py.jinja: a producer warp loads a program's 64 x warpgroups keys (K, V) once and
    streams block_m query rows of every query head that reads them through a ring of Q/dO tiles; each consumer
    warpgroup owns 64 of the keys (their dK, dV)."""
    DIRECTION: ClassVar[str] = "bwd"

    family: str = family_knob("gluon", BWD_DOC)
    block_m: int = knob(64, (32, 64, 128), "query rows of one step (the N of S^T = K Q^T's wgmma)")
    warpgroups: int = knob(2, (1, 2), "consumer warpgroups of a program, 64 keys each (past head dim 128: the "
                                      "program's 64 keys, half of dK's and dV's columns each)")
    num_buffers: int = knob(2, (2, 3), "slots of the Q/dO/lse/delta ring: the next steps' tiles load under this one")
    group_splits: int = knob(1, (1, 2, 4, 8), "programs sharing a KV head's group of query heads (GQA), each walking "
                                              "group / group_splits of them and adding its dK, dV into fp32 sums "
                                              "(TMA reduce-add); 1: one program sums the group in registers")
    query_splits: int = knob(1, (1, 2, 4, 8, 16), "programs sharing a key block's steps (query head, query block "
                                                  "pairs, in the order one program walks them), each walking an "
                                                  "equal run of them and adding its dK, dV into fp32 sums (TMA "
                                                  "reduce-add): more programs where key blocks x heads leave SMs "
                                                  "idle (cross-attention over a short context)")
    dq_writer: bool = knob(False, (False, True), "a 1-warp partition adds dQ's tiles by TMA from two shared slots a "
                                                 "consumer (the consumers hand them over by mbarrier); else each "
                                                 "consumer adds its own tile, waiting for the last one's reduce")
    dq_turns: bool = knob(False, (False, True), "(head dims to 64, two warpgroups) the warpgroups take turns, step by "
                                                "step, adding dQ's whole tile from both warpgroups' dS^T: one TMA "
                                                "reduce-add a step, not one from each warpgroup's own keys")
    dv_late: bool = knob(False, (False, True), "dV += P^T dO issued after dS^T is computed and stored (FA3's order), "
                                               "not between P^T and dS^T: fewer registers live at once")
    uneven_groups: bool = knob(False, (False, True), "(group_splits not dividing the group: MQA 71:1, GQA 7:1) each "
                                                     "program walks ceil(group / group_splits) query heads, the "
                                                     "last of a group fewer")
    head_dim_split: bool = knob(False, (False, True),
                                "(past head dim 128) the head dim as two column tiles, the largest power of two below "
                                "it and one for the rest, instead of one padded to a power of two: 160 computes 128 + "
                                "32 columns, not 256 (S^T and dP^T two chained wgmmas each; each warpgroup owns one "
                                "tile's dK, dV and dQ)")


def column_tiles(knobs: FwdKnobs | BwdKnobs, problem: Problem) -> tuple[int, ...]:
    """Widths of the column tiles Q, K, V and O span, as the launcher splits them (templates/common/launch_columns.py):
    the head dim padded to a power of two, or with head_dim_split the largest power of two below it and the rest
    padded."""
    columns = launcher("common", "columns").column_tiles({"head_dim_split": knobs.head_dim_split}, problem.head_dim)
    return tuple(w for w in columns if w)


def shared_memory_bytes(knobs: FwdKnobs, problem: Problem) -> int:
    """Q (and O) tiles of each consumer and the K/V ring. Measured on sm_90 compiles: d128, 2 consumers, 2 slots
    of 128 keys: 197000 B (this gives 197632); with O in Q 164152 (164864); d256, 64 keys, O in Q: 196968."""
    d, size = sum(column_tiles(knobs, problem)), problem.element_size
    q_tiles = knobs.consumers * knobs.block_m * d * (knobs.q_buffers + (0 if knobs.stage_o_in_q else 1))
    return size * (q_tiles + knobs.num_buffers * 2 * knobs.block_n * d) + MBARRIER_BYTES


def bwd_tiles(knobs: BwdKnobs, head_dim: int) -> tuple[int, int, int, int]:
    """(keys of a program, dK/dV columns of a consumer, rows and columns of the share of dQ each consumer adds by
    TMA) for `head_dim`: 64 keys a consumer warpgroup with all their dK/dV columns up to head dim 128, past it the
    program's 64 keys with the columns split; dQ in 64-column slices where the head dim has one a warpgroup, else
    64-row slices, else all of it from the warpgroup's own dS^T; with head_dim_split the first warpgroup's: the
    program's 64 keys and every row and column of the first column tile (the second warpgroup's, of the second
    tile). The launcher's `_block_n`, `_dkv_columns` and `_dq_share` (which need no autoflash: a test holds them
    equal)."""
    d, wg, m = head_dim_pad(head_dim), knobs.warpgroups, knobs.block_m
    if knobs.head_dim_split:
        first = launcher("common", "columns").column_tiles({"head_dim_split": True}, head_dim)[0]
        return 64, first, m, first
    block_n, dkv = (64 * wg, d) if d <= 128 else (64, d // wg)
    if d % (64 * wg) == 0:
        dq = (m, d // wg)
    elif m % (64 * wg) == 0:
        dq = (m // wg, d)
    else:
        dq = (m, d)
    return block_n, dkv, *dq


def bwd_shared_memory_bytes(knobs: BwdKnobs, problem: Problem) -> int:
    """K and V, the ring's Q, dO (and fp32 lse, delta) tiles, two dS^T tiles of each consumer's keys, each
    consumer's fp32 share of dQ (two with dq_writer; with head_dim_split each its column tile's). Measured on sm_90
    compiles (NOTES G-bwd3, G-bwd6, G-bwd23): d128, 2 warpgroups, 2 slots of 64 rows: 198080 B (this gives 198656);
    d64: 132512 (133120); d256 in 32-row steps: 181184 (182272); split d160 (128 + 32) in 64-row steps 198192
    (198656), d192 (128 + 64) 230960 (231424)."""
    d, size = sum(column_tiles(knobs, problem)), problem.element_size
    block_n, _, dq_rows, dq_cols = bwd_tiles(knobs, problem.head_dim)
    ring = knobs.num_buffers * knobs.block_m * (2 * d * size + 2 * 4)
    ds = 2 * 64 * knobs.warpgroups * knobs.block_m * size
    dq = 4 * (dq_rows * d if knobs.head_dim_split else knobs.warpgroups * dq_rows * dq_cols) * (
        2 if knobs.dq_writer else 1)
    return 2 * block_n * d * size + ring + ds + dq + MBARRIER_BYTES


def bwd_registers(knobs: BwdKnobs, problem: Problem) -> int:
    """Registers a consumer thread needs (its warpgroup owns 64 keys): the fp32 dK and dV tiles, S^T (then
    P^T) and dP^T at once with P^T's half-precision copy, and ~24 for addresses and loop state (dQ's tile comes
    when S^T and dP^T are gone). Consumers get 240 (setmaxnreg, beside a 24-register producer warp); on sm_90
    compiles (NOTES G-bwd3) d128 in 64-row steps (232 by this count) spills a few loop scalars under triton 3.6
    (132 B), d64 in 128-row steps (248) ~850 B."""
    dkdv = 2 * 64 * bwd_tiles(knobs, problem.head_dim)[1] // 128
    s = 64 * knobs.block_m // 128
    return dkdv + 2 * s + s // 2 + 24


def consumer_registers(knobs: FwdKnobs, problem: Problem) -> int:
    """Registers a consumer thread needs: the fp32 O and S tiles, P in half precision (with overlap, the next
    block's S beside the last block's P) and ~32 for addresses, row statistics and loop state; with tile_overlap
    the next tile's P besides, through this tile's epilogue (sm_90 compiles, NOTES G9: 2 consumers at head dim 128
    (224 by this count) spill nothing, 3 at head dim 64 with 128-key blocks (192, at 160) 248-276 B)."""
    threads = 128
    o, s = knobs.block_m * sum(column_tiles(knobs, problem)) // threads, knobs.block_m * knobs.block_n // threads
    return o + s + s // 2 * (2 if knobs.tile_overlap else 1) + 32


def violations(knobs: FwdKnobs | BwdKnobs, problem: Problem, gpu: Gpu) -> list[str]:
    """Why `knobs` cannot run `problem` on `gpu`; empty when it can (the `tl` family covers what this refuses)."""
    what = "forward" if knobs.DIRECTION == "fwd" else "backward"
    why = []
    if "PAGED" in problem.variants:
        why.append("paged KV caches run in the tl family only")
    elif "VARLEN" in problem.variants and problem.gates() - {"VARLEN"}:
        why.append(f"packed sequences run in the Gluon {what} without other variants; with them in tl")
    # Both directions render the fixed variants (window, softcap, ALiBi: the templates' gates) and a mask_mod (the
    # forward's key blocks, the backward's query blocks from the mask's block table, templates/gluon/
    # launch_mask_mod.py), not a score_mod.
    unsupported = problem.gates() - problem.variants - {"WINDOW", "SOFTCAP", "ALIBI", "MASK_MOD"}
    if unsupported:
        why.append(f"the Gluon {what} has no {', '.join(sorted(unsupported))}: the tl family runs them")
    if gpu.family == "interpreter":
        why.append("Gluon kernels have no interpreter: they run on a Hopper GPU only")
    elif gpu.capability != (9, 0):
        why.append(f"the Gluon {what} needs sm_90 (Hopper: wgmma, setmaxnreg); {gpu.name} is {gpu.capability}")
    if not gluon_available():
        why.append("this triton has no Gluon for Hopper (triton.experimental.gluon, 3.6 or newer)")
    if problem.dtype not in ("float16", "bfloat16"):
        why.append(f"the Gluon {what} takes fp16 or bf16, not {problem.dtype}")
    if problem.head_dim * problem.element_size % 16:
        why.append(f"TMA needs 16-byte rows; head_dim {problem.head_dim} x {problem.element_size} bytes is not")
    if knobs.DIRECTION == "bwd":
        return why + _bwd_violations(knobs, problem, gpu)
    if not 16 <= problem.head_dim <= 256:
        why.append(f"head_dim {problem.head_dim} is outside 16..256")
    if knobs.dynamic and not knobs.persistent:
        why.append("dynamic tile claiming needs a persistent grid (one program per tile has nothing to claim)")
    if knobs.pingpong and knobs.consumers != 2:
        why.append("ping-pong alternates two consumers")
    if knobs.q_buffers == 2 and not knobs.overlap:
        # The tuner's trials on the H100 (benchmarks/NOTES.md 38): 3 illegal memory accesses and one wrong result,
        # all causal, all with two Q tiles and no overlap. Refused until the Q-slot handshake of that path is fixed.
        why.append("two Q tiles without the softmax/QK^T overlap crash or compute wrong results (NOTES 38)")
    if knobs.tile_overlap:
        why += _tile_overlap_violations(knobs, problem)
    if knobs.head_dim_split:
        why += _head_dim_split_violations(knobs, problem)
    smem = shared_memory_bytes(knobs, problem)
    if smem > gpu.shared_memory_per_block:
        why.append(f"needs ~{smem} B shared memory, {gpu.name} gives {gpu.shared_memory_per_block}")
    need = consumer_registers(knobs, problem)
    budget = 240 if knobs.consumers == 1 else knobs.consumer_regs
    if need > budget:
        why.append(f"a consumer needs ~{need} registers a thread, it gets {budget}")
    # The first consumer (the default partition) gets at least what the others get.
    if (knobs.consumers * knobs.consumer_regs + knobs.producer_regs) * 128 > MAX_REGISTERS:
        why.append(f"{knobs.consumers} consumers x {knobs.consumer_regs} + producer {knobs.producer_regs} registers "
                   f"x 128 threads exceed the SM's {MAX_REGISTERS}")
    return why


def _tile_overlap_violations(knobs: FwdKnobs, problem: Problem) -> list[str]:
    """tile_overlap runs the next tile's block 0 under this tile's last P V: it needs that tile on the program
    (persistent), its Q already loaded (two Q tiles) and the P V issued asynchronously (overlap); the template
    renders it for plain problems; the GPU passed it only full, static, with two consumers."""
    why = []
    if not (knobs.persistent and knobs.q_buffers == 2 and knobs.overlap):
        why.append("tile_overlap needs a persistent grid, two Q tiles and the softmax/QK^T overlap")
    if problem.gates():
        why.append(f"tile_overlap is rendered for plain problems, not {', '.join(sorted(problem.gates()))}")
    # The H100's GPU tests (NOTES G9): right only for full attention on a static grid with two consumers; every
    # causal case, every dynamic one and every three-consumer one (all dynamic) computed wrong outputs (relative
    # error 0.17-0.76), cause not found. Refused until found.
    if problem.causal:
        why.append("tile_overlap computes wrong results under causal masking (NOTES G9): full attention only")
    if knobs.dynamic:
        why.append("tile_overlap computes wrong results with tiles claimed from the counter (NOTES G9): a static "
                   "grid only")
    if knobs.consumers != 2:
        why.append("tile_overlap is right on the GPU with two consumers only (three computed wrong results, NOTES G9)")
    return why


def _split_pays(problem: Problem) -> bool:
    """The default splits the head dim where the padded tile is past 64 columns and the split drops a quarter of
    them or more: 80, 96, 160, 192 measured +4-40% (NOTES G16), 72 by the rule; not 40 (32 + 16 of 64: 0.96-1.03x)."""
    padded = head_dim_pad(problem.head_dim)
    return padded > 64 and 4 * sum(column_tiles(FwdKnobs(head_dim_split=True), problem)) <= 3 * padded


def _head_dim_split_violations(knobs: FwdKnobs, problem: Problem) -> list[str]:
    """head_dim_split pays where its two column tiles span fewer columns than one padded tile (160: 128 + 32 < 256;
    not 128 or 112: 64 + 64). The template splits every kernel but tile_overlap's next-tile block."""
    why = []
    tiles, padded = column_tiles(knobs, problem), head_dim_pad(problem.head_dim)
    if sum(tiles) >= padded:
        why.append(f"head_dim_split: column tiles {' + '.join(map(str, tiles))} are no fewer than one tile of {padded}")
    if knobs.tile_overlap:
        why.append("head_dim_split is not rendered with tile_overlap")
    return why


def _bwd_violations(knobs: BwdKnobs, problem: Problem, gpu: Gpu) -> list[str]:
    why = []
    if not 16 <= problem.head_dim <= 256:
        why.append(f"the Gluon backward takes head dims 16..256, not {problem.head_dim}")
    if knobs.block_m < 64 and head_dim_pad(problem.head_dim) <= 128:
        why.append("32-row steps are for head dims past 128 (dQ's wgmma needs 64 rows where the warpgroups "
                   "hold different keys)")
    # The delta kernel's grid (the main one's is batch x heads_kv); packed sequences: one batch of every row, the
    # main grid one axis of (sequence, key block) pairs x heads.
    rows_y = problem.heads_q if "VARLEN" in problem.variants else problem.batch * problem.heads_q
    if rows_y > MAX_GRID_Y:
        why.append(f"{rows_y} programs (batch x heads_q) along the grid's y axis, CUDA allows {MAX_GRID_Y}")
    group = problem.group
    if group % knobs.group_splits and not knobs.uneven_groups:
        why.append(f"group_splits {knobs.group_splits} does not divide the {group} query heads of a KV head "
                   "(uneven_groups splits them so)")
    if knobs.uneven_groups and not _uneven(group, knobs.group_splits):
        why.append(f"uneven_groups is for group_splits that do not divide the group, each program walking at least "
                   f"one query head (group {group}, group_splits {knobs.group_splits}): the even split's kernels "
                   "otherwise")
    if summed(knobs) and knobs.warpgroups != 2:
        why.append("split groups and steps stage fp32 dK and dV in two warpgroups' buffers (K and V's tiles, the Q/dO "
                   "ring)")
    if knobs.query_splits > 1:
        why += _query_split_violations(knobs, problem, gpu)
    if knobs.dq_turns and (knobs.warpgroups != 2 or bwd_tiles(knobs, problem.head_dim)[2:] != (knobs.block_m,
                                                                                          head_dim_pad(problem.head_dim))):
        why.append("dq_turns alternates two warpgroups where each would add dQ's whole tile from its own keys (head "
                   "dims to 64 in steps under 128 rows)")
    if knobs.dq_turns and knobs.dq_writer:
        why.append("dq_turns hands no tile to the dQ writer on the steps where a warpgroup skips dQ")
    if knobs.head_dim_split:
        why += _bwd_head_dim_split_violations(knobs, problem)
    smem = bwd_shared_memory_bytes(knobs, problem)
    if smem > gpu.shared_memory_per_block:
        why.append(f"needs ~{smem} B shared memory, {gpu.name} gives {gpu.shared_memory_per_block}")
    need = bwd_registers(knobs, problem)
    if need > BWD_CONSUMER_REGISTERS:
        why.append(f"a consumer thread needs ~{need} registers, it gets {BWD_CONSUMER_REGISTERS}")
    return why


def _bwd_head_dim_split_violations(knobs: BwdKnobs, problem: Problem) -> list[str]:
    """The backward's split is rendered past head dim 128, where two warpgroups share the program's 64 keys: each
    owns one column tile's dK, dV and dQ (the first 128 columns, the second the rest), both compute S^T and dP^T
    over both tiles. At head dims 72-96 that would double S^T's and dP^T's work against the padded tile's kernel of
    each warpgroup's own keys (NOTES G-bwd23); packed sequences, the fixed variants and mask_mods take it."""
    why = []
    tiles, padded = column_tiles(knobs, problem), head_dim_pad(problem.head_dim)
    if sum(tiles) >= padded:
        why.append(f"head_dim_split: column tiles {' + '.join(map(str, tiles))} are no fewer than one tile of {padded}")
    elif padded <= 128:
        why.append(f"the backward's head_dim_split is rendered past head dim 128 (two warpgroups on the same keys, a "
                   f"column tile each), not at {problem.head_dim}")
    if knobs.warpgroups != 2:
        why.append("head_dim_split gives each of two warpgroups one column tile")
    if knobs.dq_writer:
        why.append("head_dim_split: each warpgroup adds its column tile's dQ itself (no dQ writer)")
    if knobs.block_m < 64 and tiles[-1] < 64:
        why.append(f"head_dim_split: dQ^T of 32-row steps needs 64 rows of the second tile, it has {tiles[-1]}")
    if summed(knobs) and knobs.num_buffers * knobs.block_m < 128:
        why.append("head_dim_split with split groups or steps stages the first tile's fp32 dK and dV in the ring's Q "
                   "and dO tiles: num_buffers x block_m must reach 128 rows")
    return why


def summed(knobs: BwdKnobs) -> bool:
    """Whether several programs add into one key block's dK and dV (split groups or steps): fp32 sums, by TMA."""
    return knobs.group_splits * knobs.query_splits > 1


def _query_split_violations(knobs: BwdKnobs, problem: Problem, gpu: Gpu) -> list[str]:
    why = []
    if problem.gates() & {"VARLEN", "MASK_MOD"}:
        why.append("query_splits: packed sequences and mask_mods walk their own lists of steps (one program a key "
                   "block)")
    programs, steps = bwd_programs(knobs, problem)
    if programs >= gpu.multiprocessors:
        why.append(f"query_splits: {programs} programs (key blocks x batch x KV heads x group_splits) fill the "
                   f"{gpu.multiprocessors} SMs already")
    if knobs.query_splits > steps:
        why.append(f"query_splits {knobs.query_splits} over a key block's {steps} steps leaves programs without one")
    return why


def bwd_programs(knobs: BwdKnobs, problem: Problem) -> tuple[int, int]:
    """(programs, steps) of the backward before query_splits: dK/dV programs (key blocks x batch x KV heads x
    group_splits) and the steps of an unmasked key block's program ((query head, query block) pairs)."""
    programs = cdiv(problem.seqlen_k, bwd_tiles(knobs, problem.head_dim)[0]) * problem.batch * problem.heads_kv
    return programs * knobs.group_splits, cdiv(problem.group, knobs.group_splits) * cdiv(problem.seqlen_q,
                                                                                         knobs.block_m)


def occupied(knobs: BwdKnobs, problem: Problem, gpu: Gpu) -> BwdKnobs:
    """A borrowed or default backward variant with query_splits fitted to `problem` (NOTES 107): where its programs
    fill at most half the SMs, each key block's steps over the most programs that stay within one wave, four steps
    a program at least (b2 h8 s4096/77 d40: 16 programs of 64 steps, 8 splits: its kernels' GPU time 2.66x
    shorter on an H100; b2 h8 s256/77 d160's 32 programs of 4 steps ran 5% slower in two); else none (a
    neighbour's splits answered its own programs)."""
    if problem.gates() & {"VARLEN", "MASK_MOD"}:
        return replace(knobs, query_splits=1)
    programs, steps = bwd_programs(knobs, problem)
    return replace(knobs, query_splits=max(s for s in BwdKnobs.choices()["query_splits"]
                                           if s == 1 or (s * programs <= gpu.multiprocessors and 4 * s <= steps)))


def gluon_available() -> bool:
    try:
        from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma  # noqa: F401
    except ImportError:
        return False
    return True


def default_knobs(problem: Problem, gpu: Gpu, direction: str = "fwd") -> FwdKnobs | BwdKnobs | None:
    """The measured best of the H100 FA grid (benchmarks/NOTES.md, G3-G6): 2 consumers of 64 rows,
    128-key blocks, overlap, two Q tiles where they fit, a persistent grid; under causal masking its programs
    claim tiles from a counter (the tiles' work is unequal: G6, +2% geomean over the grid's causal cells against
    G5's rule of one program per tile from 2k queries); 3 consumers (FA3's 192-row tile) for d64 from 2k queries
    without causal masking, from 8k with it; head dims past 128 take 64-key blocks, one Q tile and stage O in Q; a
    mask_mod's tiles claim from the counter too (the block table leaves their work unequal, as causal masking
    does); where tile_overlap runs (full attention, static grid, two consumers) the next tile's first block goes
    under this tile's last P V (NOTES G9: d128 full +1-6%); where the padded tile is past 64 columns and
    head_dim_split drops a quarter of them (72, 80, 96, 160, 192), two column tiles, 128-key blocks to 160 columns,
    no tile_overlap (NOTES G16: +4-40%; G17). None where the family cannot run the problem. The backward (every
    untuned backward's default where it runs: autoflash.families.default_order): two consumer warpgroups, 64-row
    steps (32 past head dim 128, where shared memory holds no more), two ring slots (NOTES G-bwd3, G-bwd6); under GQA with causal masking
    (no window) from 2k queries a KV head's query heads split over 4 programs at head dim 64, 2 past it (NOTES
    G-bwd13: GQA 8:1 causal 4k 0.80-0.83x plain SDPA -> 0.89-0.93x; the retuned records: causal 2k-32k 1.0-1.14x
    unsplit, full 0.94-1.02x, decode 0.32-0.70x: NOTES 59); groups of 16 or more from 512 queries, 8 programs past
    head dim 64 (NOTES 98), and at head dim 64 from 1k to 8k queries 8 with three ring slots (NOTES 102). Splits
    balance the causal band's unequal programs; a window's are equal (window 4096 at 32k: 481 TFLOP/s unsplit,
    454-475 split, NOTES 59). To head dim 64 the two warpgroups take turns adding dQ (dq_turns: 11 of the fp16
    grid's 12 d64 cells +3.5-10%, NOTES G-bwd20); full attention to head dim 128, and causal to 64, issues dV's
    wgmma after dS^T's store (dv_late: the fp16 grid's 6 d128 full cells +2-18%, NOTES G-bwd21; beside dq_turns on
    the d64 cells from 2k +1.9%, NOTES 68)."""
    d = head_dim_pad(problem.head_dim)
    if direction == "bwd":
        # A KV head that serves 16 query heads or more (MQA, GQA 16:1) runs few programs unsplit at any length: its
        # group splits from 512 queries, over 8 programs past head dim 64 (the tuned MQA 32/1 records: 8 won all 16
        # causal problems past d64 on both GPUs, the default's 2 ran 0.70-0.96 of it, unsplit 0.47-0.94; NOTES 98)
        wide = problem.group >= 16
        split = problem.causal and problem.window == (-1, -1) and problem.seqlen_q >= (512 if wide else 2048)
        group = problem.group if split else 1
        # (dq_turns has run on the GPU for dense problems and the fixed variants, not packed or masked ones yet)
        turns = d <= 64 and not problem.gates() & {"VARLEN", "MASK_MOD"}
        # (dv_late measured faster past head dim 64 on full attention only, causal cells -4 to +3%, NOTES G-bwd21;
        # to 64 beside dq_turns, causal or not, +1.9%, NOTES 68)
        late = (d <= 64 or not problem.causal) and d <= 128 and problem.window == (-1, -1) and not problem.gates() & {
            "VARLEN", "MASK_MOD"}
        # At head dim 64 a wide group runs 8 programs with three ring slots from 1k to 8k queries (the tuned d64
        # MQA and 16:1 records there: that variant won 7 of 7, 2-14% over 4 programs; 4 won at 512 and 32k; NOTES 102)
        eight = split and wide and d <= 64 and 1024 <= problem.seqlen_q <= 8192
        splits, uneven = _group_splits(group, 8 if eight else 4 if d <= 64 else 8 if wide else 2)
        unsplit = BwdKnobs(block_m=64 if d <= 128 else 32, group_splits=splits, uneven_groups=uneven,
                           num_buffers=3 if eight else 2, dq_turns=turns, dv_late=late and not eight)
        # (past head dim 128 where the split pays: two column tiles in 64-row steps, which the padded tile's shared
        # memory does not hold; NOTES G-bwd23)
        split = d > 128 and _split_pays(problem)
        knobs = replace(unsplit, block_m=64, head_dim_split=True) if split else unsplit
        candidates = tuple(occupied(k, problem, gpu) for k in (
            knobs, replace(knobs, group_splits=1, uneven_groups=False), unsplit,
            replace(unsplit, group_splits=1, uneven_groups=False),
            replace(unsplit, group_splits=1, uneven_groups=False, dq_turns=False, dv_late=False)))
    else:
        three = d <= 64 and problem.seqlen_q >= (8192 if problem.causal else 2048)
        split = _split_pays(problem)
        columns = sum(column_tiles(FwdKnobs(head_dim_split=split), problem))
        knobs = FwdKnobs(block_n=128 if columns <= (160 if split else 128) else 64, consumers=3 if three else 2,
                         consumer_regs=160 if three else 240, dynamic=problem.causal or bool(problem.mask_mod),
                         stage_o_in_q=d > 128, q_buffers=2 if d <= 128 else 1, head_dim_split=split,
                         tile_overlap=not split)
        candidates = (knobs, replace(knobs, tile_overlap=False), replace(knobs, q_buffers=1, tile_overlap=False),
                      replace(knobs, block_n=64, q_buffers=1, tile_overlap=False))
    return next((k for k in candidates if not violations(k, problem, gpu)), None)


def _group_splits(group: int, wanted: int) -> tuple[int, bool]:
    """(group_splits, uneven_groups) of the backward's default: `wanted` programs a KV head's group where they
    divide it, else as many as divide it, else (a group prime to `wanted`: MQA 71:1, GQA 7:1) the most of 2, 4, 8
    up to `wanted` below the group, unevenly (NOTES 74.(c): 71:1 unsplit ran 64 programs on 132 SMs, 0.34x)."""
    even = math.gcd(group, wanted)
    uneven = max((s for s in (2, 4, 8) if s <= wanted and _uneven(group, s)), default=1)
    return (even, False) if even > 1 or uneven == 1 else (uneven, True)


def _uneven(group: int, splits: int) -> bool:
    """Whether `splits` programs split a group of `group` query heads unevenly, ceil(group / splits) heads each but
    the last, none empty (5 over 4 would leave the fourth none)."""
    return group % splits > 0 and (splits - 1) * -(-group // splits) < group


def grouped(knobs: BwdKnobs, problem: Problem, gpu: Gpu) -> BwdKnobs:
    """A borrowed backward whose programs fill fewer than eight waves of the SMs, with its KV heads' query heads
    split over at least as many programs as the default's (causal GQA from 2k queries). A neighbour tuned with
    more programs says nothing of the split that balances this one's causal band: in the shipped databases' trials
    the default's split against none ran 1.11x / 1.18x (H100 / H200 medians; 23 of 23 faster) under four unsplit
    waves, 1.03x (37 of 49 faster, 4 slower) at four to eight, level past (NOTES 109: the held-out b1 h32/8 s4096
    and b4 h28/4 s2048 d128 causal backwards 0.78x -> 0.90x and 0.77x -> 0.87x plain SDPA on the H200)."""
    default = default_knobs(problem, gpu, "bwd")
    if (default is None or default.group_splits <= knobs.group_splits
            or bwd_programs(knobs, problem)[0] >= 8 * gpu.multiprocessors):
        return knobs
    return replace(knobs, group_splits=default.group_splits, uneven_groups=default.uneven_groups)


def fit(knobs: FwdKnobs | BwdKnobs, problem: Problem, gpu: Gpu) -> FwdKnobs | BwdKnobs | None:
    """Tuned knobs of a neighbouring problem if they run this one, a backward's with its query heads' split
    (`grouped`, where that runs too) and its query steps' (`occupied`) fitted to this one's programs; else this
    family's default for it (None where the family cannot run it: dispatch then takes the default variant)."""
    candidates = (knobs,)
    if knobs.DIRECTION == "bwd":
        candidates = (occupied(grouped(knobs, problem, gpu), problem, gpu), occupied(knobs, problem, gpu))
    return next((k for k in candidates if not violations(k, problem, gpu)),
                None) or default_knobs(problem, gpu, knobs.DIRECTION)


def for_call(knobs: FwdKnobs | BwdKnobs, *, tensors, deterministic: bool) -> tuple[FwdKnobs | BwdKnobs | None, str]:
    """TMA reads and writes every tensor: None (dispatch takes the default variant) where one of q, k, v, out is
    not 16-byte aligned, its address or a stride; and for a deterministic backward (the Gluon backward adds dQ
    with atomics; the `tl` family's separate dQ pass is deterministic)."""
    if knobs.DIRECTION == "bwd" and deterministic:
        return None, "deterministic=True: the Gluon backward adds dQ with atomics"
    if tma_aligned(*tensors):
        return knobs, ""
    return None, "Gluon's TMA needs 16-byte aligned tensors and strides"
