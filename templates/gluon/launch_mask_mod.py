"""Launcher of the Gluon forward for problems with a mask_mod (MASK_MOD: templates/gluon/attn_fwd.py.jinja rendered
with the user's mod, autoflash/mask_mod.py): the `tl` family's (`masks`, templates/tl/launch_mask_mod.py), whose
block table lists each query tile's key blocks, built at the Gluon tile's granularity: block_m x consumers query rows
(the consumers' rows together, one list for the producer and them all) by block_n keys. Set by the loader
(autoflash.resources.launcher). Needs only torch and triton."""

base = None  # the module of templates/gluon/launch.py, set by the loader
masks = None  # the module of templates/tl/launch_mask_mod.py, set by the loader


def forward_plan(kernels, knobs, q, k, v, out, lse, softmax_scale, causal, compile, variant, fixed):
    """`forward(q, k, v, out, lse, *variant tensors)`: the fixed variants' Gluon plan with the mask's table."""
    return masks.forward_plan(kernels, knobs, q, k, v, out, lse, softmax_scale, causal, compile, variant, fixed,
                              knobs["block_m"] * knobs["consumers"])
