"""What a `gluon` variant cannot run (`violations`: Hopper and Gluon, shared memory, registers, the knobs' own
constraints) and the resource models behind it."""

from functools import cache, lru_cache

from autoflash.families.gluon.knobs import BwdKnobs, FwdKnobs
from autoflash.gpu import Gpu
from autoflash.knobs import MAX_GRID_Y, cdiv, head_dim_pad
from autoflash.problem import Problem
from autoflash.resources import launcher, launcher_tiles

MAX_REGISTERS = 65536  # per SM, shared by the programs_per_sm programs on it
BLOCK_RESERVED_BYTES = 1024  # shared memory the SM keeps for each resident program
BWD_CONSUMER_REGISTERS = 240  # setmaxnreg of the backward's consumer warpgroups (templates/gluon/attn_bwd.py.jinja)
MBARRIER_BYTES = 1024  # the barriers and the compiler's scratch, rounded up (measured: 368-472 B)


def column_tiles(knobs: FwdKnobs | BwdKnobs, problem: Problem) -> tuple[int, ...]:
    """Widths of the column tiles Q, K, V and O span, as the launcher splits them (templates/common/launch_columns.py):
    the head dim padded to a power of two, or with head_dim_split the largest power of two below it and the rest
    padded (the backward's second tile at least 64 columns with split_keys: templates/gluon/launch_bwd.py)."""
    if knobs.DIRECTION == "bwd":
        return _bwd_column_tiles(knobs.head_dim_split, knobs.split_keys, problem.head_dim)
    return launcher_tiles("common", "columns", "column_tiles", problem.head_dim, head_dim_split=knobs.head_dim_split)


def _bwd_column_tiles(head_dim_split: bool, split_keys: bool, head_dim: int) -> tuple[int, ...]:
    return launcher_tiles("gluon", "bwd", "_column_tiles", head_dim, head_dim_split=head_dim_split,
                          split_keys=split_keys)


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
        tiles = _bwd_column_tiles(True, knobs.split_keys, head_dim)
        # (split_keys: 64 // wg keys a consumer, both tiles' columns; dQ's a tile a warpgroup, the first's here)
        return 64, sum(tiles) if knobs.split_keys and d > 128 else tiles[0], m, tiles[0]
    if knobs.split_keys and d > 128:  # (64 // wg keys a consumer, all their columns; dQ's columns split)
        return 64, d, m, d // wg
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
    ds = (3 * 64 if knobs.split_keys else 2 * 64 * knobs.warpgroups) * knobs.block_m * size  # (split_keys: P too)
    dq = 4 * (dq_rows * d if knobs.head_dim_split else knobs.warpgroups * dq_rows * dq_cols) * (
        2 if knobs.dq_writer else 1)
    return 2 * block_n * d * size + ring + ds + dq + MBARRIER_BYTES


def bwd_registers(knobs: BwdKnobs, problem: Problem) -> int:
    """Registers a consumer thread needs (its warpgroup owns 64 keys): the fp32 dK and dV tiles, S^T (then
    P^T) and dP^T at once with P^T's half-precision copy, and ~24 for addresses and loop state (dQ's tile comes
    when S^T and dP^T are gone). Consumers get 240 (setmaxnreg, beside a 24-register producer warp); on sm_90
    compiles (NOTES G-bwd3) d128 in 64-row steps (232 by this count) spills a few loop scalars under triton 3.6
    (132 B), d64 in 128-row steps (248) ~850 B."""
    keys = 64 // knobs.warpgroups if knobs.split_keys and head_dim_pad(problem.head_dim) > 128 else 64
    dkdv = 2 * keys * bwd_tiles(knobs, problem.head_dim)[1] // 128
    s = keys * knobs.block_m // 128
    return dkdv + 2 * s + s // 2 + 24


def consumer_registers(knobs: FwdKnobs, problem: Problem) -> int:
    """Registers a consumer thread needs: the fp32 O and S tiles, P in half precision (with overlap, the next
    block's S beside the last block's P) and ~32 for addresses, row statistics and loop state; with tile_overlap
    the next tile's P besides, through this tile's epilogue (sm_90 compiles, NOTES G9: 2 consumers at head dim 128
    (224 by this count) spill nothing, 3 at head dim 64 with 128-key blocks (192, at 160) 248-276 B)."""
    threads = 128
    o, s = knobs.block_m * sum(column_tiles(knobs, problem)) // threads, knobs.block_m * knobs.block_n // threads
    return o + s + s // 2 * (2 if knobs.tile_overlap else 1) + 32


@cache
def gluon_available() -> bool:
    try:
        from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma  # noqa: F401
    except ImportError:
        return False
    return True


def problem_violations(problem: Problem, gpu: Gpu, direction: str) -> list[str]:
    """Why no variant of the `direction` family can run `problem` on `gpu`, whatever its knobs (the part of
    `violations` that reads no knob: the tuner asks it before walking the space)."""
    return list(_problem_violations(problem, gpu, direction))


@lru_cache(maxsize=64)  # (once per problem: the tuner's walk of the space asks it for every point)
def _problem_violations(problem: Problem, gpu: Gpu, direction: str) -> tuple[str, ...]:
    what = "forward" if direction == "fwd" else "backward"
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
    if direction == "fwd" and not 16 <= problem.head_dim <= 256:
        why.append(f"head_dim {problem.head_dim} is outside 16..256")
    return tuple(why)


def violations(knobs: FwdKnobs | BwdKnobs, problem: Problem, gpu: Gpu) -> list[str]:
    """Why `knobs` cannot run `problem` on `gpu`; empty when it can (the `tl` family covers what this refuses)."""
    why = problem_violations(problem, gpu, knobs.DIRECTION)
    if knobs.DIRECTION == "bwd":
        return why + _bwd_violations(knobs, problem, gpu)
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
    if knobs.consumer_keys:
        why += _consumer_keys_violations(knobs, problem)
    if knobs.programs_per_sm > 1 and problem.gates():
        why.append(f"{knobs.programs_per_sm} programs an SM run plain problems only (the GPU tests cover no variant "
                   "with them yet)")
    if knobs.programs_per_sm > 1 and knobs.dynamic:
        # The GPU tests (NOTES 147, 149): at two programs an SM, one tile's rows left unwritten in 2 of 48 calls (head
        # dim 128, causal, 1000 tokens, with one Q tile and with two); every other case passed.
        why.append(f"{knobs.programs_per_sm} programs an SM claiming tiles from the counter left outputs unwritten "
                   "(NOTES 147, 149)")
    if knobs.programs_per_sm > 1 and knobs.consumers != 1:
        why.append(f"{knobs.programs_per_sm} programs an SM hold one consumer warpgroup each (their share of the "
                   "registers at launch, twice that less the producer's for the consumer)")
    why += _resource_violations(shared_memory_bytes(knobs, problem), consumer_registers(knobs, problem),
                                _first_consumer_registers(knobs), gpu, knobs.programs_per_sm)
    # The first consumer (the default partition) gets at least what the others get.
    if (knobs.consumers * knobs.consumer_regs + knobs.producer_regs) * 128 > MAX_REGISTERS:
        why.append(f"{knobs.consumers} consumers x {knobs.consumer_regs} + producer {knobs.producer_regs} registers "
                   f"x 128 threads exceed the SM's {MAX_REGISTERS}")
    return why


def _first_consumer_registers(knobs: FwdKnobs) -> int:
    """Registers a thread of the first consumer warpgroup (the default partition) gets: consumer_regs beside other
    consumers; alone, what the producer leaves of twice the program's share of the SM a thread (the launch's
    maxnreg: 128 at two programs an SM, 80 at three), at most 240."""
    if knobs.consumers > 1:
        return knobs.consumer_regs
    return min(240, 2 * _launch_registers(knobs.programs_per_sm) - knobs.producer_regs)


@cache  # (the tuner's walk of the space asks for every point)
def _launch_registers(programs_per_sm: int) -> int:
    """A thread's registers at the launch of a one-consumer program: the launcher's maxnreg, else its even share
    of the SM (two warpgroups a program)."""
    options = launcher("gluon").launch_options({"programs_per_sm": programs_per_sm, "consumers": 1})
    return options.get("maxnreg", MAX_REGISTERS // (2 * 128))


def _resource_violations(smem: int, registers: int, budget: int, gpu: Gpu, programs_per_sm: int = 1) -> list[str]:
    """A variant's estimated shared memory against its share of the GPU's (programs_per_sm programs an SM), a
    consumer thread's registers against its budget."""
    why = []
    share = (gpu.shared_memory_per_block + BLOCK_RESERVED_BYTES) // programs_per_sm - BLOCK_RESERVED_BYTES
    if smem > share:
        why.append(f"needs ~{smem} B shared memory, {gpu.name} gives {share}"
                   + (f" to each of {programs_per_sm} programs an SM" if programs_per_sm > 1 else ""))
    if registers > budget:
        why.append(f"a consumer needs ~{registers} registers a thread, it gets {budget}")
    return why


def _consumer_keys_violations(knobs: FwdKnobs, problem: Problem) -> list[str]:
    """consumer_keys stops each consumer at its own rows' diagonal: it changes only causal problems, is rendered
    for plain ones (no window, mask_mod or packed sequences), and leaves the ping-pong's turns unpaired."""
    why = []
    if not problem.causal:
        why.append("consumer_keys stops each consumer at its rows' diagonal: causal problems only")
    other = problem.gates() & {"WINDOW", "MASK_MOD", "VARLEN", "PAGED"}
    if other:
        why.append("consumer_keys is rendered for plain causal problems, softcapping and ALiBi, not "
                   + ", ".join(sorted(other)))
    if knobs.pingpong or knobs.consumers == 1:
        why.append("consumer_keys needs two or three consumers without ping-pong (a skipped block's turn unpaired)")
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


def split_pays(problem: Problem) -> bool:
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
    if knobs.uneven_groups and not splits_unevenly(group, knobs.group_splits):
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
    if knobs.split_keys:
        why += _split_keys_violations(knobs, problem)
    elif knobs.num_buffers == 1:
        why.append("one ring slot leaves the producer no lead: it is for split_keys, where a second does not fit")
    why += _resource_violations(bwd_shared_memory_bytes(knobs, problem), bwd_registers(knobs, problem),
                                BWD_CONSUMER_REGISTERS, gpu)
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
    if summed(knobs) and knobs.num_buffers * knobs.block_m < 128 and not knobs.split_keys:
        why.append("head_dim_split with split groups or steps stages the first tile's fp32 dK and dV in the ring's Q "
                   "and dO tiles: num_buffers x block_m must reach 128 rows")
    return why


def _split_keys_violations(knobs: BwdKnobs, problem: Problem) -> list[str]:
    """split_keys is rendered past head dim 128 for two warpgroups in 64-row steps (S's wgmma rows; 128-row steps
    do not fit shared memory), over one padded tile or two column tiles (head_dim_split, NOTES 118), for plain
    problems, windows and softcapping; the dQ knobs of the column split (dq_writer, dq_turns, dv_late) are other
    kernels."""
    why = []
    if head_dim_pad(problem.head_dim) <= 128:
        why.append(f"split_keys is rendered past head dim 128 (to 128 each warpgroup owns 64 keys already), not at "
                   f"{problem.head_dim}")
    if knobs.warpgroups != 2 or knobs.block_m != 64:
        why.append("split_keys runs two warpgroups of 32 keys in 64-row steps")
    if knobs.dq_writer or knobs.dq_turns or knobs.dv_late:
        why.append("split_keys has no dq_writer, dq_turns or dv_late (each warpgroup adds its dQ columns itself, "
                   "dV's wgmma after dS)")
    other = problem.gates() & {"VARLEN", "MASK_MOD", "ALIBI"}
    if other:
        why.append("split_keys is rendered for plain problems, windows and softcapping, not "
                   + ", ".join(sorted(other)))
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


def splits_unevenly(group: int, splits: int) -> bool:
    """Whether `splits` programs split a group of `group` query heads unevenly, ceil(group / splits) heads each but
    the last, none empty (5 over 4 would leave the fourth none)."""
    return group % splits > 0 and (splits - 1) * -(-group // splits) < group
