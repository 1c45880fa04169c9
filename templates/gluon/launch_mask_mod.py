"""Launchers of the Gluon kernels for problems with a mask_mod (MASK_MOD: templates/gluon/attn_fwd.py.jinja and
attn_bwd.py.jinja rendered with the user's mod, autoflash/mask_mod.py): the `tl` family's (`masks`,
templates/tl/launch_mask_mod.py), whose block tables list each query tile's key blocks (the forward) and each key
block's query blocks (the backward), built at the Gluon kernels' granularity: the forward's tile of block_m x
consumers query rows (the consumers' rows together, one list for the producer and them all) by block_n keys; the
backward's program of `_block_n` keys (64 a warpgroup up to head dim 128, else 64) by steps of block_m query rows.
Set by the loader (autoflash.resources.launcher). Needs only torch and triton."""

import triton

base = None  # the module of templates/gluon/launch.py, set by the loader
base_bwd = None  # the module of templates/gluon/launch_bwd.py, set by the loader
masks = None  # the module of templates/tl/launch_mask_mod.py, set by the loader


def forward_plan(kernels, knobs, q, k, v, out, lse, softmax_scale, causal, compile, variant, fixed):
    """`forward(q, k, v, out, lse, *variant tensors)`: the fixed variants' Gluon plan with the mask's table."""
    return masks.forward_plan(kernels, knobs, q, k, v, out, lse, softmax_scale, causal, compile, variant, fixed,
                              knobs["block_m"] * knobs["consumers"])


def backward_plan(kernels, knobs, q, k, v, out, lse, dout, dq, dk, dv, softmax_scale, causal, dlse, compile, variant,
                  fixed):
    """`backward(q, k, v, out, lse, dout, dq, dk, dv, dlse, *variant tensors)`: the fixed variants' Gluon plan with
    the mask's table transposed, a row per program's key block listing its query blocks."""
    block_n = base_bwd._block_n(max(16, triton.next_power_of_2(q.shape[3])), knobs["warpgroups"])
    return masks.backward_plan(kernels, knobs, q, k, v, out, lse, dout, dq, dk, dv, softmax_scale, causal, dlse,
                               compile, variant, fixed, [("Mask_cols", knobs["block_m"], block_n)])
