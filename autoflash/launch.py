"""Launching compiled kernels without Triton's per-call argument binding.

`kernel[grid](*args)` binds, specialises and looks up every argument on every call: 31-62 µs of host
time for the forward's 30 arguments on the H100 machine (benchmarks/NOTES.md, 16.). A call signature
of `autoflash.attention` fixes everything but the tensors' addresses, so its plan compiles each kernel
once (`compile_launch`) and from then on starts the compiled kernel with the new tensors. The
backward's plans do the same for its two or three kernels. The families' launchers (templates/<family>/launch.py)
take it as their `compile` argument. Needs only torch and triton: exported packages carry a copy.
"""

import torch
import triton
from triton.runtime.jit import JITFunction


def _scratch(size: int, alignment: int, stream):
    """Global memory a kernel asks for at launch (where TMA variants write their tensor descriptors)."""
    return torch.empty(size, dtype=torch.int8, device="cuda" if torch.cuda.is_available() else "cpu")


def compile_launch(kernel, grid, args, options: dict, tensor_count: int, per_call: tuple[str, ...] = ()):
    """`kernel[grid](*args, **options)` compiled now for the device of `args[0]` (a tensor or a tensor
    descriptor), as a function of new values of its first `tensor_count` args, then of the `per_call` args
    (named in `options`: parameters after the constexprs); the rest stay as given here.

    Valid while everything Triton specialises on stays the same: the other args, and the new tensors'
    dtypes and 16-byte alignment (callers key their plans on these)."""
    if not isinstance(kernel, JITFunction):  # Triton's interpreter: nothing compiled to keep
        given = args[tensor_count:]

        def interpret(*tensors):
            triton.set_allocator(_scratch)
            kernel[grid](*tensors[:tensor_count], *given, **options | dict(zip(per_call, tensors[tensor_count:])))
        return interpret
    first = getattr(args[0], "base", args[0])  # a tensor, or a host-side TensorDescriptor of one
    index, driver = first.device.index, triton.runtime.driver.active
    with torch.cuda.device(index):  # compiled and loaded in the context of the tensors' device
        compiled = kernel.warmup(*args, grid=grid, **options)
        # The compiled kernel takes every parameter positionally, constexprs included (it skips them).
        named = dict(zip(kernel.arg_names, args)) | options
        run = compiled[tuple(grid) + (1,) * (3 - len(grid))]
    rest = [named[name] for name in kernel.arg_names[tensor_count:]]
    slots = [kernel.arg_names.index(name) - tensor_count for name in per_call]
    needs_allocator = compiled.metadata.global_scratch_size > 0

    def launch(*tensors):
        if driver.get_current_device() != index:
            with torch.cuda.device(index):
                return launch(*tensors)
        if needs_allocator:  # Triton's allocator is per thread (a ContextVar): set it where we launch
            triton.set_allocator(_scratch)
        given = rest
        if slots:
            given = list(rest)
            for slot, value in zip(slots, tensors[tensor_count:]):
                given[slot] = value
        run(*tensors[:tensor_count], *given, stream=driver.get_current_stream(index))
    return launch
