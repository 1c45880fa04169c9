"""The `tl` family: FlashAttention-2 kernels in Triton's language, forward and backward (templates/tl/)."""

from autoflash.families.base import KernelFamily
from autoflash.families.tl.defaults import default_knobs, fit, for_call
from autoflash.families.tl.knobs import BwdKnobs, FwdKnobs
from autoflash.families.tl.limits import not_worth_timing, violations

FAMILY = KernelFamily(name="tl", knobs={"fwd": FwdKnobs, "bwd": BwdKnobs}, searched=True, violations=violations,
                      not_worth_timing=not_worth_timing, default=default_knobs, fit=fit, for_call=for_call)
