"""A kernel loader that fails on purpose, by knob value, to test how the tuner records failures.

Used as `loader="faulty_kernels:load"` (tests/ is on the workers' path); every other variant is real.
"""

import os
import time

from autoflash import codegen


class _WrongKernel:
    def __init__(self, module):
        self.module = module

    def forward(self, q, k, v, out, lse, softmax_scale, causal):
        self.module.forward(q, k, v, out, lse, softmax_scale, causal)
        out.mul_(1.5)


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
