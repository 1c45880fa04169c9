"""A kernel loader that fails on purpose, by knob value, to test how the tuner records failures.

Used as `loader="faulty_kernels:load"` (tests/ is on the workers' path); every other variant is real.
"""

import ctypes
import os
import resource
import sys
import time

import torch

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


def _exhaust_memory():
    """Allocate past an address-space limit set just above what the worker holds: the allocation fails as it
    does where memory runs out (the limit is lifted again, as freed memory would be)."""
    with open("/proc/self/statm") as f:
        held = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limits = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (held + 2 ** 28, limits[1]))
    try:
        torch.empty(2 ** 32, dtype=torch.uint8)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, limits)


def load(knobs):
    if knobs.exp == "exp" and knobs.num_stages == 2 and knobs.loads == "tma_host":
        ctypes.string_at(0)  # a segmentation fault
    if knobs.exp == "exp" and knobs.num_stages == 3 and knobs.loads == "tma_host":
        _exhaust_memory()
    if knobs.exp == "exp" and knobs.num_stages == 2:
        raise RuntimeError("forced compile failure")
    if knobs.exp == "exp" and knobs.num_stages == 3:
        return _WrongKernel(codegen.load(knobs))
    if knobs.exp == "exp" and knobs.num_stages == 4 and knobs.loads == "tma":
        sys.stderr.write("faulty_kernels: an illegal memory access was encountered\n")
        sys.stderr.flush()
        os._exit(3)  # dies like a worker after an illegal memory access
    if knobs.exp == "exp" and knobs.num_stages == 4:
        time.sleep(3600)
    return codegen.load(knobs)
