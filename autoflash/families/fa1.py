"""The `fa1` family: FlashAttention-1's loop order (FA1 paper, Algorithm 1), a forward baseline in Triton's
language (templates/fa1/). One program per (batch, head); key/value blocks outer, query blocks inner, the running
output and its row statistics rescaled and written back to an fp32 workspace every step. Selectable, never
searched: slower than `tl` by design."""

from dataclasses import dataclass
from typing import ClassVar

from autoflash.families.base import KernelFamily
from autoflash.gpu import Gpu
from autoflash.knobs import Knobs, family_knob, head_dim_pad, knob, next_power_of_2
from autoflash.problem import Problem


@dataclass(frozen=True)
class FwdKnobs(Knobs):
    DIRECTION: ClassVar[str] = "fwd"

    family: str = family_knob("fa1", "FlashAttention-1's loop order (templates/fa1): a baseline, never searched")
    block_m: int = knob(64, (16, 32, 64, 128), "query rows per tile")
    block_n: int = knob(64, (16, 32, 64, 128), "key rows per tile")
    num_warps: int = knob(4, (2, 4, 8), "warps per program")
    num_stages: int = knob(2, (1, 2, 3), "software-pipelining depth of the query loop")
    exp: str = knob("exp2", ("exp2", "exp"), "exp2 with log2(e) folded into the scale, or exp")
    causal_split: bool = knob(True, (True, False),
                              "per key block, a masked loop over the query blocks of the causal band and an "
                              "unmasked one over those that see it whole; False masks every block")


def violations(knobs: Knobs, problem: Problem, gpu: Gpu) -> list[str]:
    """Why `knobs` cannot run `problem` on `gpu`: tiles too small for the warps or larger than the sequences,
    shared memory (K/V resident, Q and the fp32 O streamed) or registers beyond the GPU's."""
    why = []
    if problem.variants & {"VARLEN", "PAGED"}:
        why.append("packed sequences and paged caches run in the tl family only")
    if problem.gates() - problem.variants:
        why.append(f"the fa1 forward has no attention variants "
                   f"({', '.join(sorted(problem.gates() - problem.variants))}): the tl family runs them")
    if knobs.block_m * knobs.block_n < 128 * knobs.num_warps:
        why.append(f"{knobs.block_m}x{knobs.block_n} tile is too small for {knobs.num_warps} warps")
    if knobs.block_m > max(16, next_power_of_2(problem.seqlen_q)):
        why.append(f"block_m {knobs.block_m} exceeds the {problem.seqlen_q} query rows")
    if knobs.block_n > max(16, next_power_of_2(problem.seqlen_k)):
        why.append(f"block_n {knobs.block_n} exceeds seqlen_k {problem.seqlen_k}")
    d, size = head_dim_pad(problem.head_dim), problem.element_size
    smem = size * 2 * knobs.block_n * d + knobs.num_stages * knobs.block_m * d * (size + 4)
    if smem > gpu.shared_memory_per_block:
        why.append(f"needs ~{smem} B shared memory, {gpu.name} gives {gpu.shared_memory_per_block}")
    registers = (knobs.block_m * knobs.block_n + knobs.block_m * d) // (32 * knobs.num_warps)
    if registers > 192:  # fp32 score tile and output tile per thread: more spills out of the 255 registers
        why.append(f"needs ~{registers} accumulator registers per thread (limit 192)")
    return why


FAMILY = KernelFamily(name="fa1", knobs={"fwd": FwdKnobs}, searched=False, violations=violations)
