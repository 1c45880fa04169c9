"""The knobs of a forward kernel variant, declared once.

Everything else derives from `FwdKnobs`: the template context (`template_context`), the search
space (`search_space`), the database record and the export header (`to_json` / `from_json`),
and the cache fingerprint. A new knob is one field here, one use in the template, one test.
`violations` rejects combinations before anything compiles.
"""

import json
from dataclasses import asdict, dataclass, field, fields

import triton

from autoflash.gpu import Gpu
from autoflash.problem import Problem


def knob(default, choices, doc, searched=None):
    """A knob: its default, every valid value, a line of doc, and the values the tuner searches
    (all of them unless given)."""
    return field(default=default, metadata={"choices": tuple(choices), "doc": doc,
                                            "searched": tuple(choices if searched is None else searched)})


@dataclass(frozen=True)
class FwdKnobs:
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
    loads: str = knob("pointer", ("pointer", "tma"),
                      "how tiles move: pointer tensors with masks, or TMA tensor descriptors (Hopper on); "
                      "block pointers are not offered: Triton removed them after 3.6")

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if value not in f.metadata["choices"]:
                raise ValueError(f"FwdKnobs.{f.name}={value!r} is not one of {f.metadata['choices']}")

    def template_context(self) -> dict:
        """Jinja context: each knob under its upper-case name (BLOCK_M, LOADS, ...)."""
        return {name.upper(): value for name, value in asdict(self).items()}

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "FwdKnobs":
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


def head_dim_pad(head_dim: int) -> int:
    """Tiles span the head dim padded to a power of two (tl.arange and tl.dot need one; at least 16)."""
    return max(16, triton.next_power_of_2(head_dim))


# A thread's fp32 tiles (scores + output accumulator) beyond this spill out of the 255 registers.
MAX_ACCUMULATOR_REGISTERS = 192


def shared_memory_bytes(knobs: FwdKnobs, problem: Problem) -> int:
    """Estimate of a program's shared memory: the Q tile plus `num_stages` buffers of K and V tiles."""
    d, size = head_dim_pad(problem.head_dim), problem.element_size
    if knobs.loop_order == "fa1":  # K/V resident, Q, O (fp32) streamed
        return size * 2 * knobs.block_n * d + knobs.num_stages * knobs.block_m * d * (size + 4)
    return size * (knobs.block_m * d + knobs.num_stages * 2 * knobs.block_n * d)


def accumulator_registers(knobs: FwdKnobs, problem: Problem) -> int:
    """fp32 registers per thread for the score tile and the output accumulator."""
    d = head_dim_pad(problem.head_dim)
    return (knobs.block_m * knobs.block_n + knobs.block_m * d) // (32 * knobs.num_warps)


def tma_violations(problem: Problem, gpu: Gpu) -> list[str]:
    why = []
    if not gpu.has_tma:
        why.append(f"TMA needs compute capability 9.0 or newer; {gpu.name} has {gpu.capability}")
    if problem.head_dim * problem.element_size % 16:
        why.append(f"TMA needs 16-byte rows; head_dim {problem.head_dim} x {problem.element_size} bytes is not")
    return why


def violations(knobs: FwdKnobs, problem: Problem, gpu: Gpu) -> list[str]:
    """Why `knobs` cannot (or should not) run `problem` on `gpu`; empty when it can."""
    why = []
    if knobs.loop_order == "fa1" and knobs.loads != "pointer":
        why.append("fa1 is the paper's baseline loop order and loads through pointers only")
    if knobs.loads == "tma":
        why += tma_violations(problem, gpu)
    if knobs.block_m * knobs.block_n < 128 * knobs.num_warps:
        why.append(f"{knobs.block_m}x{knobs.block_n} tile is too small for {knobs.num_warps} warps")
    if knobs.block_m > max(16, triton.next_power_of_2(problem.seqlen_q)):
        why.append(f"block_m {knobs.block_m} exceeds seqlen_q {problem.seqlen_q}")
    if knobs.block_n > max(16, triton.next_power_of_2(problem.seqlen_k)):
        why.append(f"block_n {knobs.block_n} exceeds seqlen_k {problem.seqlen_k}")
    smem = shared_memory_bytes(knobs, problem)
    if smem > gpu.shared_memory_per_block:
        why.append(f"needs ~{smem} B shared memory, {gpu.name} gives {gpu.shared_memory_per_block}")
    regs = accumulator_registers(knobs, problem)
    if regs > MAX_ACCUMULATOR_REGISTERS:
        why.append(f"needs ~{regs} accumulator registers per thread (limit {MAX_ACCUMULATOR_REGISTERS})")
    return why


def not_worth_timing(knobs: FwdKnobs, problem: Problem) -> list[str]:
    """Valid variants the tuner skips because they cannot win: tiles far smaller than the problem
    leave the tensor cores idle (Hopper's wgmma works on 64 rows a warpgroup), and warps that
    share fewer than 16 query rows each duplicate work."""
    why = []
    rows, keys = triton.next_power_of_2(problem.seqlen_q), triton.next_power_of_2(problem.seqlen_k)
    if knobs.block_m < min(64, rows):
        why.append(f"block_m {knobs.block_m} is far below seqlen_q {problem.seqlen_q}")
    if knobs.block_n < min(32, keys):
        why.append(f"block_n {knobs.block_n} is far below seqlen_k {problem.seqlen_k}")
    if rows >= 16 * knobs.num_warps > knobs.block_m:
        why.append(f"{knobs.num_warps} warps share {knobs.block_m} query rows")
    return why


class InvalidKnobs(ValueError):
    pass


def check(knobs: FwdKnobs, problem: Problem, gpu: Gpu) -> None:
    why = violations(knobs, problem, gpu)
    if why:
        raise InvalidKnobs(f"{knobs} cannot run {problem} on {gpu.family}: " + "; ".join(why))
