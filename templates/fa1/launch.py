"""Launcher of the `fa1` family's kernel: plain Python, the variant's knobs passed in as data (see
templates/tl/launch.py for the conventions). Needs only torch and triton."""

import torch


def forward_plan(kernels, knobs, q, k, v, out, lse, softmax_scale, causal, compile):
    """`forward(q, k, v, out, lse)` for every call shaped like this one. q, out: (batch, heads_q, seqlen_q,
    head_dim); k, v: (batch, heads_kv, seqlen_k, head_dim), each with unit last stride; lse: fp32 (batch,
    heads_q, seqlen_q), contiguous, or None. One program per (batch, head), with an fp32 workspace for the
    running output and row statistics."""
    batch, heads_q, seqlen_q, head_dim = q.shape
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    head_dim_pad = kernels._head_dim_pad(head_dim)
    workspace = ((batch * heads_q, seqlen_q, head_dim_pad), (batch * heads_q, seqlen_q), (batch * heads_q, seqlen_q))
    main = compile(
        kernels._attn_fwd_fa1, (batch * heads_q,),
        (q, k, v, out, out if lse is None else lse,
         *(torch.empty(shape, dtype=torch.float32, device=q.device) for shape in workspace),
         softmax_scale, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
         heads_q, heads_q // heads_kv, seqlen_q, seqlen_k),
        dict(HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, IS_CAUSAL=causal, RETURN_LSE=lse is not None,
             INPUT_PRECISION=kernels._input_precision(q.dtype), BLOCK_M=knobs["block_m"], BLOCK_N=knobs["block_n"],
             num_warps=knobs["num_warps"], num_stages=knobs["num_stages"], enable_fp_fusion=True),
        8)

    def forward(q, k, v, out, lse):
        main(q, k, v, out, out if lse is None else lse,
             *(torch.empty(shape, dtype=torch.float32, device=q.device) for shape in workspace))
    return forward
