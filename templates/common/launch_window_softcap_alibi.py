"""Launchers of a kernel family's kernels for the fixed attention variants (WINDOW, SOFTCAP, ALIBI: kernels rendered
with their gates): the family's plans (`base`, its launch.py, and `base_bwd`, its backward's launcher, set by the
loader, autoflash.resources.launcher), each kernel given its variant arguments on the way. Every family's (the
`tl` and Gluon ones): a file of its own, named for its variants, so that the fingerprint of plain problems'
kernels does not count it (codegen.template_fingerprint). Needs only torch and triton.

`variant`, the same for every variant: "tensors", per-call tensors by parameter name (a kernel that names one gets
it right after its plain tensors; the returned function takes them, in this order, after its own arguments), and
"args", the other variant parameters by name (scalars fixed for the plan), to each kernel that names them. Kernels
without variant parameters (the backward's preprocess, the key splits' combine) launch as launch.py has them.
"""

import threading

base = None  # the family's launch.py module, set by the loader
base_bwd = None  # the family's backward launcher (launch_bwd.py, or launch.py), set by the loader


def forward_plan(kernels, knobs, q, k, v, out, lse, softmax_scale, causal, compile, variant):
    """`forward(q, k, v, out, lse, *variant tensors)`: launch.py's forward plan, with the variant's arguments."""
    current = _current(variant)
    plan = base.forward_plan(kernels, knobs, q, k, v, out, lse, softmax_scale, causal,
                             _with_variant(compile, variant, current))

    def forward(q, k, v, out, lse, *tensors):
        current.tensors = tensors
        plan(q, k, v, out, lse)
    return forward


def backward_plan(kernels, knobs, q, k, v, out, lse, dout, dq, dk, dv, softmax_scale, causal, dlse, compile, variant):
    """`backward(q, k, v, out, lse, dout, dq, dk, dv, dlse, *variant tensors)`: the family's backward plan, with the
    variant's arguments."""
    current = _current(variant)
    plan = base_bwd.backward_plan(kernels, knobs, q, k, v, out, lse, dout, dq, dk, dv, softmax_scale, causal, dlse,
                              _with_variant(compile, variant, current))

    def backward(q, k, v, out, lse, dout, dq, dk, dv, dlse, *tensors):
        current.tensors = tensors
        plan(q, k, v, out, lse, dout, dq, dk, dv, dlse)
    return backward


def _current(variant):
    """Where a call's variant tensors wait for the kernels it launches: per thread, as calls of one plan may run
    in several threads at once."""
    current = threading.local()
    current.tensors = tuple(variant.get("tensors", {}).values())
    return current


def _with_variant(compile, variant, current):
    """launch.py's `compile` argument for the variant: each kernel that names a variant parameter gets the variant
    tensors it names after its plain ones (at each call, `current`'s) and its scalars among the options."""
    tensors, args = variant.get("tensors", {}), variant.get("args", {})

    def compile_variant(kernel, grid, kernel_args, options, tensor_count):
        names = set(kernel.arg_names)
        taken = [name for name in tensors if name in names]
        scalars = {name: value for name, value in args.items() if name in names}
        if not taken and not scalars:
            return compile(kernel, grid, kernel_args, options, tensor_count)
        picks = [list(tensors).index(name) for name in taken]
        launch = compile(kernel, grid, (*kernel_args[:tensor_count], *(tensors[name] for name in taken),
                                        *kernel_args[tensor_count:]),
                         dict(options, **scalars), tensor_count + len(taken))
        return lambda *plain: launch(*plain, *(current.tensors[i] for i in picks))
    return compile_variant
