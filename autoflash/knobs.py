"""The knobs of a kernel variant, declared once: `FwdKnobs` for the forward, `BwdKnobs` for the backward.

Everything else derives from them: the template context (`template_context`), the search
space (`search_space`), the database record and the export header (`to_json` / `from_json`),
and the cache fingerprint. A new knob is one field here, one use in the template, one test.
`violations` rejects combinations before anything compiles.
"""

import json
from dataclasses import asdict, dataclass, field, fields
from typing import ClassVar

import triton

from autoflash.gpu import Gpu
from autoflash.problem import Problem


def knob(default, choices, doc, searched=None):
    """A knob: its default, every valid value, a line of doc, and the values the tuner searches
    (all of them unless given)."""
    return field(default=default, metadata={"choices": tuple(choices), "doc": doc,
                                            "searched": tuple(choices if searched is None else searched)})


class Knobs:
    """What both directions' knob dataclasses share: validation against the declared choices, the
    template context, JSON for the database, the search space. Subclasses are frozen dataclasses
    whose every field is a `knob`."""

    DIRECTION: ClassVar[str]

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if value not in f.metadata["choices"]:
                raise ValueError(f"{type(self).__name__}.{f.name}={value!r} is not one of {f.metadata['choices']}")

    def template_context(self) -> dict:
        """Jinja context: each knob under its upper-case name (BLOCK_M, LOADS, ...)."""
        return {name.upper(): value for name, value in asdict(self).items()}

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str):
        data = json.loads(text)
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown knobs {sorted(unknown)}: this record comes from another autoflash version")
        return cls(**data)

    def as_point(self) -> dict:
        """The knobs as a point of `search_space`."""
        return asdict(self)

    @classmethod
    def search_space(cls) -> dict[str, tuple]:
        """Each knob's name and the values the tuner searches, in declaration order."""
        return {f.name: f.metadata["searched"] for f in fields(cls)}

    @classmethod
    def choices(cls) -> dict[str, tuple]:
        """Each knob's name and every valid value."""
        return {f.name: f.metadata["choices"] for f in fields(cls)}

    @classmethod
    def docs(cls) -> dict[str, str]:
        return {f.name: f.metadata["doc"] for f in fields(cls)}


@dataclass(frozen=True)
class FwdKnobs(Knobs):
    DIRECTION: ClassVar[str] = "fwd"

    loop_order: str = knob("fa2", ("fa2", "fa1"),
                           "fa2: Q tile outer, K/V inner, normalise once at the end (FA2 Alg. 1); "
                           "fa1: K/V outer, Q inner, O/l/m rescaled and written back every step (FA1 Alg. 1), "
                           "one program per (batch, head): a baseline, never searched",
                           searched=("fa2",))
    block_m: int = knob(128, (16, 32, 64, 128, 256), "query rows per tile")
    block_n: int = knob(64, (16, 32, 64, 128, 256), "key rows per tile")
    num_warps: int = knob(4, (2, 4, 8), "warps per program")
    num_stages: int = knob(2, (1, 2, 3, 4, 5), "software-pipelining depth of the key loop", searched=(2, 3, 4))
    exp: str = knob("exp2", ("exp2", "exp"), "exp2 with log2(e) folded into the scale, or exp")
    causal_split: bool = knob(True, (True, False),
                              "an unmasked loop over the key blocks every row sees whole, then a masked "
                              "loop over the causal band and the ragged tail; False masks every block")
    loads: str = knob("pointer", ("pointer", "tma", "tma_host"),
                      "how tiles move: pointer tensors with masks, or TMA tensor descriptors (Hopper on) that "
                      "each program builds on the device (tma) or the launcher builds on the host, one per "
                      "tensor and call (tma_host); block pointers are not offered: Triton removed them after 3.6")
    schedule: str = knob("in_order", ("in_order", "longest_first"),
                         "order of the query blocks: in_order walks each head's blocks from the first; "
                         "longest_first launches every head's last block first (under causal masking it "
                         "sees the most keys, so short blocks fill the tail; fa2 only). Not searched: it "
                         "lost on every causal grid problem on the H100 (benchmarks/NOTES.md, 10.); fit() "
                         "uses it where batch x heads exceeds the grid's y axis",
                         searched=("in_order",))
    kv_splits: int = knob(1, (1, 2, 4, 8, 16),
                          "programs that share one query tile's keys, each over a run of whole key blocks, "
                          "their partial results merged by a second kernel (flash-decoding): more programs "
                          "where batch x heads x query blocks leave SMs idle (fa2 only)")
    pack_gqa: bool = knob(False, (False, True),
                          "GQA/MQA: the query heads that share a KV head are the rows of one tile, position-major "
                          "(row r: position r // group of the group's head r % group), so each K/V block is read "
                          "once for the group and a decode step fills the tile's rows (fa2, pointer loads)")
    head_dim_split: bool = knob(False, (False, True),
                                "the head dim as two column tiles, the largest power of two below it and one for "
                                "the rest, instead of one padded to a power of two: head dim 80 computes 64 + 16 "
                                "columns, not 128 (fa2)")

    @property
    def template(self) -> str:
        return f"attn_fwd_{self.loop_order}.py.jinja"


@dataclass(frozen=True)
class BwdKnobs(Knobs):
    """The backward's three kernels (preprocess, dK/dV, dQ) share one tile: a dK/dV program holds
    block_n keys and streams block_m query rows; the dQ pass holds block_n query rows and streams
    block_m keys (the same tile, transposed)."""
    DIRECTION: ClassVar[str] = "bwd"

    block_m: int = knob(64, (16, 32, 64, 128), "rows streamed per step: query rows in dK/dV, key rows in dQ")
    block_n: int = knob(128, (16, 32, 64, 128), "rows a program holds: key rows in dK/dV, query rows in dQ")
    num_warps: int = knob(8, (2, 4, 8), "warps per program")
    num_stages: int = knob(2, (1, 2, 3, 4, 5), "software-pipelining depth of the streamed loops",
                           searched=(1, 2, 3, 4))
    dq: str = knob("separate", ("separate", "atomic"),
                   "separate: dQ in its own pass (deterministic); atomic: the dK/dV programs add dS K into "
                   "an fp32 buffer with atomics (one pass fewer, not bitwise repeatable)")
    causal_split: bool = knob(True, (True, False),
                              "unmasked loops over the blocks that are whole and fully visible, masked loops "
                              "over the causal band and the ragged tails; False masks every block")

    @property
    def template(self) -> str:
        return "attn_bwd.py.jinja"


KNOBS = {cls.DIRECTION: cls for cls in (FwdKnobs, BwdKnobs)}
DIRECTIONS = tuple(KNOBS)


def head_dim_pad(head_dim: int) -> int:
    """Tiles span the head dim padded to a power of two (tl.arange and tl.dot need one; at least 16)."""
    return max(16, triton.next_power_of_2(head_dim))


def column_tiles(knobs: Knobs, problem: Problem) -> tuple[int, ...]:
    """Widths of the column tiles a program's Q, K, V and O tiles span: the head dim padded to a power of
    two, or with head_dim_split the largest power of two below it and the rest padded (at least 16)."""
    if not (isinstance(knobs, FwdKnobs) and knobs.head_dim_split):
        return (head_dim_pad(problem.head_dim),)
    first = triton.next_power_of_2(problem.head_dim) // 2
    return first, max(16, triton.next_power_of_2(problem.head_dim - first))


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
    if knobs.loop_order == "fa1":  # K/V resident, Q, O (fp32) streamed
        return size * 2 * knobs.block_n * d + knobs.num_stages * knobs.block_m * d * (size + 4)
    return size * (knobs.block_m * d + knobs.num_stages * 2 * knobs.block_n * d)


def accumulator_registers(knobs: Knobs, problem: Problem) -> int:
    """fp32 registers per thread for the score tile(s) and the accumulators."""
    d = sum(column_tiles(knobs, problem))
    if isinstance(knobs, BwdKnobs):  # Sᵀ and dPᵀ, dK and dV
        return (2 * knobs.block_n * knobs.block_m + 2 * knobs.block_n * d) // (32 * knobs.num_warps)
    return (knobs.block_m * knobs.block_n + knobs.block_m * d) // (32 * knobs.num_warps)


def query_rows(knobs: FwdKnobs, problem: Problem) -> int:
    """Rows a forward program's query tiles walk through: seqlen_q, or seqlen_q x group with pack_gqa."""
    return problem.seqlen_q * (problem.heads_q // problem.heads_kv if knobs.pack_gqa else 1)


def grid_heads(knobs: FwdKnobs, problem: Problem) -> int:
    """Heads along a forward launch grid: the query heads, or the KV heads with pack_gqa."""
    return problem.heads_kv if knobs.pack_gqa else problem.heads_q


# CUDA launches at most 65535 blocks along a grid's y axis (x allows 2^31 - 1).
MAX_GRID_Y = 65535


def grid_y(knobs: Knobs, problem: Problem) -> int:
    """Programs along the y axis of the launch grid: batch x heads, or the query blocks of longest_first."""
    if isinstance(knobs, BwdKnobs):
        return problem.batch * problem.heads_q
    if knobs.loop_order == "fa1":
        return 1
    if knobs.schedule == "longest_first":
        return triton.cdiv(query_rows(knobs, problem), knobs.block_m)
    return problem.batch * grid_heads(knobs, problem)


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
        if knobs.loop_order == "fa1" and (knobs.loads, knobs.schedule, knobs.kv_splits, knobs.pack_gqa,
                                          knobs.head_dim_split) != ("pointer", "in_order", 1, False, False):
            why.append("fa1 is the paper's baseline loop order: pointer loads, in order, one program per key range "
                       "and head")
        if knobs.loads != "pointer":
            why += tma_violations(problem, gpu)
            if knobs.pack_gqa:
                why.append("pack_gqa gathers the rows of several heads into a tile: pointer loads only")
        if knobs.head_dim_split and column_tiles(knobs, problem)[0] < 16:
            why.append(f"head_dim_split: head dim {problem.head_dim} leaves a first column tile below tl.dot's 16")
        rows = query_rows(knobs, problem)
    else:
        rows = problem.seqlen_q
    if knobs.block_m * knobs.block_n < 128 * knobs.num_warps:
        why.append(f"{knobs.block_m}x{knobs.block_n} tile is too small for {knobs.num_warps} warps")
    if knobs.block_m > max(16, triton.next_power_of_2(rows)):
        why.append(f"block_m {knobs.block_m} exceeds the {rows} query rows")
    if knobs.block_n > max(16, triton.next_power_of_2(problem.seqlen_k)):
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


def programs(knobs: FwdKnobs, problem: Problem) -> int:
    """Programs of a forward launch before any key split: query blocks x batch x heads."""
    return triton.cdiv(query_rows(knobs, problem), knobs.block_m) * problem.batch * grid_heads(knobs, problem)


def not_worth_timing(knobs: Knobs, problem: Problem, gpu: Gpu) -> list[str]:
    """Valid variants the tuner skips because they cannot win: tiles far smaller than the problem
    leave the tensor cores idle (Hopper's wgmma works on 64 rows a warpgroup), warps that
    share fewer than 16 rows of the tile's long side each duplicate work, and key splits where the
    SMs have work enough or a split would hold less than two key blocks."""
    why = []
    keys = triton.next_power_of_2(problem.seqlen_k)
    # The tile side the MMA's rows run along: query rows forward, held key (or query) rows backward.
    if isinstance(knobs, FwdKnobs):
        rows = triton.next_power_of_2(query_rows(knobs, problem))
        count = programs(knobs, problem)
        if knobs.pack_gqa and problem.heads_q == problem.heads_kv:
            why.append("no query heads share a KV head: nothing to pack")
        if knobs.head_dim_split and not split_saves_columns(problem):
            why.append(f"head_dim_split: column tiles {' + '.join(map(str, column_tiles(knobs, problem)))} are no "
                       f"fewer than one tile of {head_dim_pad(problem.head_dim)}")
        if knobs.schedule == "longest_first" and not problem.causal:
            why.append("without causal masking every query block does the same work: no order to choose")
        if knobs.kv_splits > 1 and count >= 2 * gpu.multiprocessors:
            why.append(f"{count} programs already fill {gpu.multiprocessors} SMs twice: no key split")
        if knobs.kv_splits > 1 and triton.cdiv(problem.seqlen_k, knobs.block_n) < 2 * knobs.kv_splits:
            why.append(f"{knobs.kv_splits} key splits of seqlen_k {problem.seqlen_k} hold less than 2 blocks each")
        small_m, small_n, mma_rows, extent = 64, 32, knobs.block_m, rows
    else:
        rows = triton.next_power_of_2(problem.seqlen_q)
        small_m, small_n, mma_rows, extent = 32, 64, knobs.block_n, min(rows, keys)
    if knobs.block_m < min(small_m, rows):
        why.append(f"block_m {knobs.block_m} is far below the query rows (padded: {rows})")
    if knobs.block_n < min(small_n, keys):
        why.append(f"block_n {knobs.block_n} is far below seqlen_k {problem.seqlen_k}")
    if extent >= 16 * knobs.num_warps > mma_rows:
        why.append(f"{knobs.num_warps} warps share {mma_rows} rows")
    return why


class InvalidKnobs(ValueError):
    pass


def check(knobs: Knobs, problem: Problem, gpu: Gpu) -> None:
    why = violations(knobs, problem, gpu)
    if why:
        raise InvalidKnobs(f"{knobs} cannot run {problem} on {gpu.family}: " + "; ".join(why))
