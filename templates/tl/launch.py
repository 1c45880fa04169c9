"""Launchers of the `tl` family's kernels: plain Python, the variant's knobs passed in as data.

`forward_plan` and `backward_plan` take the rendered module of a variant (`kernels`: its jit functions and
the header's helpers), its knobs (a dict, as `Knobs.as_point()` gives them) and one call's tensors, and
return a function that launches the kernels for every call shaped like that one. `compile(kernel, grid,
args, options, tensor_count)` turns each launch into a function of its first tensor_count args: autoflash
passes one that compiles now and then starts the compiled kernel directly, and gives the "tma" variants the
scratch memory they write their descriptors to (autoflash/launch.py; exported packages carry a copy). Needs
only torch and triton.
"""

import math

import torch
import triton

columns = None  # the module of templates/common/launch_columns.py (column_tiles), set by the loader


def tma_aligned(*tensors):
    """Whether TMA can read these tensors: 16-byte aligned addresses and strides (but the last)."""
    return all(t.data_ptr() % 16 == 0 and all(s * t.element_size() % 16 == 0 for s in t.stride()[:-1])
               for t in tensors)


def _check_tma_alignment(*tensors):
    if not tma_aligned(*tensors):
        raise ValueError("this TMA variant needs 16-byte aligned tensors and strides; got strides "
                         f"{[t.stride() for t in tensors]}: pass contiguous tensors or use a non-TMA variant")


def _stride_unit(element_size, strides):
    """Elements in 16 bytes if every stride is a multiple of that, else 1.
    Strides of 2^31 elements or more keep unit 1: divided, one could reach the kernel as int32, and
    multiplying it back there would overflow."""
    unit = 16 // element_size
    return unit if math.gcd(*strides) % unit == 0 and max(strides) < 2 ** 31 else 1


def _descriptor_maker(q, k, v, out, widths, block_m, block_n):
    """`make(q, k, v, out)`: the descriptors the kernel reads q, k, v and writes out through, Q K V Out for each
    column tile of `widths` in turn, for tensors shaped and strided like these ((batch, heads, seqlen, head_dim))."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    layouts = [(list(t.shape), list(t.stride())) for t in (q, k, v, out)] * len(widths)
    blocks = [[1, 1, rows, width] for width in widths for rows in (block_m, block_n, block_n, block_m)]

    def make(*tensors):
        return tuple(TensorDescriptor(t, shape, strides, block)
                     for t, (shape, strides), block in zip(tensors * len(widths), layouts, blocks))
    return make


def forward_plan(kernels, knobs, q, k, v, out, lse, softmax_scale, causal, compile):
    """`forward(q, k, v, out, lse)` for every call shaped like this one: the same shapes, strides, dtypes,
    16-byte alignment, softmax_scale, causal, and lse given or None. q, out: (batch, heads_q, seqlen_q,
    head_dim); k, v: (batch, heads_kv, seqlen_k, head_dim), each with unit last stride; lse: fp32 (batch,
    heads_q, seqlen_q), contiguous, or None."""
    batch, heads_q, seqlen_q, head_dim = q.shape
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    block_m, block_n, kv_splits, loads = knobs["block_m"], knobs["block_n"], knobs["kv_splits"], knobs["loads"]
    block_d, block_d2 = columns.column_tiles(knobs, head_dim)
    if kv_splits > 1:  # each key split writes an fp32 partial output and lse; a second kernel merges them
        head_dim_pad = kernels._head_dim_pad(head_dim)
        part_shape = (kv_splits * batch, heads_q, seqlen_q, head_dim_pad)
        main_out = torch.empty(part_shape, dtype=torch.float32, device=q.device)
        main_lse = torch.empty(part_shape[:3], dtype=torch.float32, device=q.device)
    else:
        main_out, main_lse = out, out if lse is None else lse
    if loads != "pointer":
        _check_tma_alignment(q, k, v, main_out)
    # What the kernel reads q, k, v and writes out through: the tensors, or descriptors built per call.
    if loads == "tma_host":
        make = _descriptor_maker(q, k, v, main_out, [w for w in (block_d, block_d2) if w], block_m, block_n)
        tiles, tile_count = make, 4 * (1 + (block_d2 > 0))
    else:
        tiles, tile_count = (lambda *tensors: tensors), 4
    query_rows, heads = (seqlen_q * (heads_q // heads_kv), heads_kv) if knobs["pack_gqa"] else (seqlen_q, heads_q)
    query_blocks = triton.cdiv(query_rows, block_m)
    grid = (batch * heads, query_blocks, kv_splits) if knobs["schedule"] == "longest_first" \
        else (query_blocks, batch * heads, kv_splits)
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *main_out.stride()[:3])
    unit = _stride_unit(q.element_size(), strides)
    # enable_fp_fusion in every launch: the softmax relies on `qk * scale - m` being one FMA, which Triton 3.10
    # no longer makes by default.
    main = compile(
        kernels._attn_fwd, grid,
        (*tiles(q, k, v, main_out), main_lse, softmax_scale, *[s // unit for s in strides],
         heads_q, heads_q // heads_kv, seqlen_q, seqlen_k),
        dict(HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_D2=block_d2, IS_CAUSAL=causal,
             RETURN_LSE=kv_splits > 1 or lse is not None, INPUT_PRECISION=kernels._input_precision(q.dtype),
             STRIDE_UNIT=unit, BLOCK_M=block_m, BLOCK_N=block_n, KV_SPLITS=kv_splits,
             num_warps=knobs["num_warps"], num_stages=knobs["num_stages"], enable_fp_fusion=True),
        tile_count + 1)
    if kv_splits == 1:
        def forward(q, k, v, out, lse):
            main(*tiles(q, k, v, out), out if lse is None else lse)
        return forward

    combine = compile(
        kernels._attn_fwd_combine, (triton.cdiv(seqlen_q, 32), batch * heads_q),
        (main_out, main_lse, out, out if lse is None else lse, *out.stride()[:3], heads_q, seqlen_q),
        dict(HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, KV_SPLITS=kv_splits, RETURN_LSE=lse is not None,
             BLOCK_M=32, num_warps=4, enable_fp_fusion=True),
        4)

    def forward(q, k, v, out, lse):
        part_out = torch.empty(part_shape, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(part_shape[:3], dtype=torch.float32, device=q.device)
        main(*tiles(q, k, v, part_out), part_lse)
        combine(part_out, part_lse, out, out if lse is None else lse)
    return forward


_PREPROCESS_BLOCK = 64


def backward_plan(kernels, knobs, q, k, v, out, lse, dout, dq, dk, dv, softmax_scale, causal, dlse, compile):
    """`backward(q, k, v, out, lse, dout, dq, dk, dv, dlse)` for every call shaped like this one: the same shapes,
    strides, dtypes, 16-byte alignment, softmax_scale, causal, and dlse given or None. q, out, dout, dq: (batch,
    heads_q, seqlen_q, head_dim); k, v, dk, dv: (batch, heads_kv, seqlen_k, head_dim), each with unit last
    stride; lse (the forward's) and dlse (the gradient of the returned lse, or None): fp32 (batch, heads_q,
    seqlen_q), contiguous. Writes dq, dk, dv."""
    batch, heads_q, seqlen_q, head_dim = q.shape
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    block_m, block_n, atomic_dq = knobs["block_m"], knobs["block_n"], knobs["dq"] == "atomic"
    head_dim_pad = kernels._head_dim_pad(head_dim)
    precision = kernels._input_precision(q.dtype)
    tile = dict(IS_CAUSAL=causal, CAUSAL_SPLIT=knobs["causal_split"], INPUT_PRECISION=precision,
                HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, num_warps=knobs["num_warps"],
                num_stages=knobs["num_stages"], enable_fp_fusion=True)
    delta = torch.empty_like(lse)
    preprocess = compile(
        kernels._attn_bwd_preprocess, (triton.cdiv(seqlen_q, _PREPROCESS_BLOCK), batch * heads_q),
        (out, dout, lse if dlse is None else dlse, delta, *out.stride()[:3], *dout.stride()[:3], heads_q, seqlen_q),
        dict(HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, HAS_DLSE=dlse is not None, BLOCK=_PREPROCESS_BLOCK,
             enable_fp_fusion=True),
        4)
    # atomic: the dK/dV programs add dQ into an fp32 buffer; separate: dQ in its own pass below.
    dq_sum = torch.zeros(q.shape, dtype=torch.float32, device=q.device) if atomic_dq else dq
    dkdv = compile(
        kernels._attn_bwd_dkdv, (triton.cdiv(seqlen_k, block_n), batch * heads_kv),
        (q, k, v, dout, lse, delta, dq_sum, dk, dv, softmax_scale,
         *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *dout.stride()[:3], *dq_sum.stride()[:3],
         *dk.stride()[:3], *dv.stride()[:3], heads_q, heads_kv, heads_q // heads_kv, seqlen_q, seqlen_k),
        dict(tile, ATOMIC_DQ=atomic_dq, BLOCK_M=block_m, BLOCK_N=block_n),
        9)
    if atomic_dq:
        def backward(q, k, v, out, lse, dout, dq, dk, dv, dlse):
            delta = torch.empty_like(lse)
            preprocess(out, dout, lse if dlse is None else dlse, delta)
            dq_sum = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
            dkdv(q, k, v, dout, lse, delta, dq_sum, dk, dv)
            dq.copy_(dq_sum)
        return backward

    # The dQ pass holds block_n query rows and streams block_m keys: the dK/dV tile, transposed.
    dq_pass = compile(
        kernels._attn_bwd_dq, (triton.cdiv(seqlen_q, block_n), batch * heads_q),
        (q, k, v, dout, lse, delta, dq, softmax_scale,
         *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *dout.stride()[:3], *dq.stride()[:3],
         heads_q, heads_q // heads_kv, seqlen_q, seqlen_k),
        dict(tile, BLOCK_M=block_n, BLOCK_N=block_m),
        7)

    def backward(q, k, v, out, lse, dout, dq, dk, dv, dlse):
        delta = torch.empty_like(lse)
        preprocess(out, dout, lse if dlse is None else dlse, delta)
        dkdv(q, k, v, dout, lse, delta, dq, dk, dv)
        dq_pass(q, k, v, dout, lse, delta, dq)
    return backward
