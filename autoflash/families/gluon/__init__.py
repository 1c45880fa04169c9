"""The `gluon` family: the forward in FlashAttention-3's shape, written in Triton's Gluon dialect for Hopper
(templates/gluon/). Not registered yet: the lead adds it to autoflash/families/__init__.py."""

from autoflash.families.base import KernelFamily
from autoflash.families.gluon.knobs import FwdKnobs, default_knobs, violations

FAMILY = KernelFamily(name="gluon", knobs={"fwd": FwdKnobs}, searched=True, violations=violations,
                      default=default_knobs)
