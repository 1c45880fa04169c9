"""The `gluon` family: the forward in FlashAttention-3's shape, written in Triton's Gluon dialect for Hopper
(templates/gluon/): a TMA producer warp feeding consumer warpgroups; and a FlashAttention-2/3 backward (TMA,
asynchronous wgmma, dQ by atomics). Hopper, fp16 and bf16; the tuner searches it beside `tl`, and dispatch takes
it where its tuned records are faster."""

from autoflash.families.base import KernelFamily
from autoflash.families.gluon.defaults import default_knobs, fit, for_call
from autoflash.families.gluon.knobs import BwdKnobs, FwdKnobs
from autoflash.families.gluon.limits import problem_violations, violations

FAMILY = KernelFamily(name="gluon", knobs={"fwd": FwdKnobs, "bwd": BwdKnobs}, searched=True, violations=violations,
                      problem_violations=problem_violations, default=default_knobs, fit=fit, for_call=for_call)
