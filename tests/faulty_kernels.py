"""A kernel loader that fails on purpose, by knob value, to test how the tuner records failures.

Used as `loader="faulty_kernels:load"` (tests/ is on the workers' path); every other variant is real.
"""

import os
import time

from autoflash import codegen


class _WrongKernel:
    """A variant whose forward plan scales its output: runs, and gives a wrong result."""

    def __init__(self, variant):
        self.variant = variant

    def forward_plan(self, *args, **kwargs):
        plan = self.variant.forward_plan(*args, **kwargs)

        def forward(q, k, v, out, lse):
            plan(q, k, v, out, lse)
            out.mul_(1.5)
        return forward


def load(knobs):
    if knobs.exp == "exp" and knobs.num_stages == 2:
        raise RuntimeError("forced compile failure")
    if knobs.exp == "exp" and knobs.num_stages == 3:
        return _WrongKernel(codegen.load(knobs))
    if knobs.exp == "exp" and knobs.num_stages == 4 and knobs.loads == "tma":
        os._exit(3)  # dies like a worker after an illegal memory access
    if knobs.exp == "exp" and knobs.num_stages == 4:
        time.sleep(3600)
    return codegen.load(knobs)
