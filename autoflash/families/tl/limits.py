"""What the `tl` family's kernels can run, and what the tuner need not time: a resource model of shared
memory, registers and the launch grid, checked before anything compiles."""

from autoflash.families.tl.knobs import BwdKnobs, FwdKnobs
from autoflash.gpu import Gpu
from autoflash.knobs import MAX_GRID_Y, Knobs, cdiv, head_dim_pad, next_power_of_2
from autoflash.problem import Problem
from autoflash.resources import launcher_tiles


def column_tiles(knobs: Knobs, problem: Problem) -> tuple[int, ...]:
    """Widths of the column tiles a program's Q, K, V and O tiles span, as the launcher splits them: the head
    dim padded to a power of two, or with head_dim_split the largest power of two below it and the rest."""
    return launcher_tiles("common", "columns", "column_tiles", problem.head_dim,
                          head_dim_split=isinstance(knobs, FwdKnobs) and knobs.head_dim_split)


def split_saves_columns(problem: Problem) -> bool:
    """Whether head_dim_split's two column tiles span fewer columns than one padded tile (80: 64 + 16 < 128)."""
    return sum(column_tiles(FwdKnobs(head_dim_split=True), problem)) < head_dim_pad(problem.head_dim)


# A thread's fp32 tiles beyond this spill out of the 255 registers.
MAX_ACCUMULATOR_REGISTERS = {"fwd": 192, "bwd": 256}


def shared_memory_bytes(knobs: Knobs, problem: Problem) -> int:
    """Estimate of a program's shared memory: its resident tiles plus `num_stages` buffers of the streamed ones."""
    d, size = sum(column_tiles(knobs, problem)), problem.element_size
    if isinstance(knobs, BwdKnobs):
        # K, V resident; Q, dO streamed (the dQ pass: the same, transposed); Pᵀ and dSᵀ staged for the MMAs.
        # Measured (H100, d128, atomic dQ): 128x128 tiles, 2 stages need 263168 B, 128x64 (block_m x block_n),
        # 3 stages 264192 B: this estimate gives 262144 and 262144.
        return size * (d * (2 * knobs.block_n + knobs.num_stages * 2 * knobs.block_m) + 2 * knobs.block_m * knobs.block_n)
    return size * (knobs.block_m * d + knobs.num_stages * 2 * knobs.block_n * d)


def accumulator_registers(knobs: Knobs, problem: Problem) -> int:
    """fp32 registers per thread for the score tile(s) and the accumulators."""
    d = sum(column_tiles(knobs, problem))
    if isinstance(knobs, BwdKnobs):  # Sᵀ and dPᵀ, dK and dV
        return (2 * knobs.block_n * knobs.block_m + 2 * knobs.block_n * d) // (32 * knobs.num_warps)
    return (knobs.block_m * knobs.block_n + knobs.block_m * d) // (32 * knobs.num_warps)


def query_rows(knobs: FwdKnobs, problem: Problem) -> int:
    """Rows a forward program's query tiles walk through: seqlen_q, or seqlen_q x group with pack_gqa."""
    return problem.seqlen_q * (problem.group if knobs.pack_gqa else 1)


def grid_heads(knobs: FwdKnobs, problem: Problem) -> int:
    """Heads along a forward launch grid: the query heads, or the KV heads with pack_gqa."""
    return problem.heads_kv if knobs.pack_gqa else problem.heads_q


def grid_y(knobs: Knobs, problem: Problem) -> int:
    """Programs along the y axis of the launch grid: batch x heads, or the query blocks of longest_first (packed
    sequences: none, their tiles and heads share the x axis)."""
    if "VARLEN" in problem.variants:
        return 1
    if isinstance(knobs, BwdKnobs):
        return problem.batch * problem.heads_q
    if knobs.schedule == "longest_first":
        return cdiv(query_rows(knobs, problem), knobs.block_m)
    return problem.batch * grid_heads(knobs, problem)


def programs(knobs: FwdKnobs, problem: Problem) -> int:
    """Programs of a forward launch before any key split: query blocks x batch x heads."""
    return cdiv(query_rows(knobs, problem), knobs.block_m) * problem.batch * grid_heads(knobs, problem)


def packed_loads(knobs: FwdKnobs, problem: Problem) -> str:
    """How a packed problem's tiles move under `knobs`: tma stays (each program describes its own sequence's
    rows, so a tile stops at the sequence's end), but not over pages, which gather rows; else pointers (tma_host's
    descriptors span every sequence)."""
    return "tma" if knobs.loads == "tma" and "PAGED" not in problem.variants else "pointer"


def tma_violations(problem: Problem, gpu: Gpu) -> list[str]:
    why = []
    if not gpu.has_tma:
        why.append(f"TMA needs compute capability 9.0 or newer; {gpu.name} has {gpu.capability}")
    if problem.head_dim * problem.element_size % 16:
        why.append(f"TMA needs 16-byte rows; head_dim {problem.head_dim} x {problem.element_size} bytes is not")
    return why


def violations(knobs: Knobs, problem: Problem, gpu: Gpu) -> list[str]:
    """Why `knobs` cannot (or should not) run `problem` on `gpu`; empty when it can."""
    why = []
    if isinstance(knobs, FwdKnobs):
        if "VARLEN" in problem.variants and knobs.schedule != "in_order":
            why.append("packed sequences run in order (the launcher's tile table orders the tiles)")
        if "VARLEN" in problem.variants and knobs.loads != packed_loads(knobs, problem):
            why.append("packed sequences: pointer loads, or tma (descriptors per sequence) where the keys are not "
                       "on pages")
        if knobs.loads != "pointer":
            why += tma_violations(problem, gpu)
            if knobs.pack_gqa:
                why.append("pack_gqa gathers the rows of several heads into a tile: pointer loads only")
        if knobs.pack_gqa and "MASK_MOD" in problem.gates():
            why.append("pack_gqa gathers the rows of several heads into a tile; a mask_mod's block table has a "
                       "row per head's query block")
        if knobs.pack_gqa and "SCORE_MOD" in problem.gates():
            why.append("pack_gqa gathers the rows of several heads into a tile; a score_mod gets one head per tile")
        if knobs.head_dim_split and column_tiles(knobs, problem)[0] < 16:
            why.append(f"head_dim_split: head dim {problem.head_dim} leaves a first column tile below tl.dot's 16")
        rows = query_rows(knobs, problem)
    else:
        if "PAGED" in problem.variants:
            why.append("a paged KV cache has no backward (attention_with_kvcache is forward only)")
        rows = problem.seqlen_q
    if knobs.block_m * knobs.block_n < 128 * knobs.num_warps:
        why.append(f"{knobs.block_m}x{knobs.block_n} tile is too small for {knobs.num_warps} warps")
    if knobs.block_m > max(16, next_power_of_2(rows)):
        why.append(f"block_m {knobs.block_m} exceeds the {rows} query rows")
    if knobs.block_n > max(16, next_power_of_2(problem.seqlen_k)):
        why.append(f"block_n {knobs.block_n} exceeds seqlen_k {problem.seqlen_k}")
    programs_y = grid_y(knobs, problem)
    if programs_y > MAX_GRID_Y:
        why.append(f"{programs_y} programs along the grid's y axis, CUDA allows {MAX_GRID_Y}")
    smem = shared_memory_bytes(knobs, problem)
    if smem > gpu.shared_memory_per_block:
        why.append(f"needs ~{smem} B shared memory, {gpu.name} gives {gpu.shared_memory_per_block}")
    regs, limit = accumulator_registers(knobs, problem), MAX_ACCUMULATOR_REGISTERS[knobs.DIRECTION]
    if regs > limit:
        why.append(f"needs ~{regs} accumulator registers per thread (limit {limit})")
    return why


def split_programs_per_sm(problem: Problem) -> int:
    """Programs per SM up to which splitting the keys pays: 2 where every sequence has the problem's lengths
    (benchmarks/NOTES.md 17.); 16 for packed sequences of unequal lengths, where the longest sequence's programs
    alone set the time and one program per SM reads far below its share of bandwidth (K1.)."""
    return 16 if "VARLEN" in problem.variants else 2


def not_worth_timing(knobs: Knobs, problem: Problem, gpu: Gpu) -> list[str]:
    """Valid variants the tuner skips because they cannot win: tiles far smaller than the problem
    leave the tensor cores idle (Hopper's wgmma works on 64 rows a warpgroup), warps that
    share fewer than 16 rows of the tile's long side each duplicate work, and key splits where the
    SMs have work enough or a split would hold less than two key blocks."""
    why = []
    keys = next_power_of_2(problem.seqlen_k)
    # The tile side the MMA's rows run along: query rows forward, held key (or query) rows backward.
    if isinstance(knobs, FwdKnobs):
        rows = next_power_of_2(query_rows(knobs, problem))
        count = programs(knobs, problem)
        if knobs.pack_gqa and problem.heads_q == problem.heads_kv:
            why.append("no query heads share a KV head: nothing to pack")
        if knobs.head_dim_split and not split_saves_columns(problem):
            why.append(f"head_dim_split: column tiles {' + '.join(map(str, column_tiles(knobs, problem)))} are no "
                       f"fewer than one tile of {head_dim_pad(problem.head_dim)}")
        if knobs.schedule == "longest_first" and not problem.causal:
            why.append("without causal masking every query block does the same work: no order to choose")
        per_sm = split_programs_per_sm(problem)
        if knobs.kv_splits > 1 and count >= per_sm * gpu.multiprocessors:
            why.append(f"{count} programs already fill {gpu.multiprocessors} SMs {per_sm} times: no key split")
        if knobs.kv_splits > 1 and cdiv(problem.seqlen_k, knobs.block_n) < 2 * knobs.kv_splits:
            why.append(f"{knobs.kv_splits} key splits of seqlen_k {problem.seqlen_k} hold less than 2 blocks each")
        small_m, small_n, mma_rows, extent = 64, 32, knobs.block_m, rows
    else:
        rows = next_power_of_2(problem.seqlen_q)
        small_m, small_n, mma_rows, extent = 32, 64, knobs.block_n, min(rows, keys)
    if knobs.block_m < min(small_m, rows):
        why.append(f"block_m {knobs.block_m} is far below the query rows (padded: {rows})")
    if knobs.block_n < min(small_n, keys):
        why.append(f"block_n {knobs.block_n} is far below seqlen_k {problem.seqlen_k}")
    if extent >= 16 * knobs.num_warps > mma_rows:
        why.append(f"{knobs.num_warps} warps share {mma_rows} rows")
    return why
