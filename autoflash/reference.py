"""Reference attention in float64 (or any dtype): the ground truth every kernel is checked against."""

import math

import torch

from autoflash.mask_mod import as_mask_mod
from autoflash.score_mod import as_score_mod

# Largest ‖out − ref‖ / ‖ref‖ accepted from a kernel: the rounding of P and of the output to fp16
# costs ~1e-3, to bf16 ~1e-2; fp32 kernels compute in fp32 throughout.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
# Gradients add the rounding of dO, dP and dS (and sum over every row): twice the forward's, and more
# for fp32, whose products on a GPU may still round operands.
GRAD_TOLERANCE = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3.2e-2}


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; nan if out holds a nan."""
    return ((out.double() - ref.double()).norm() / ref.double().norm().clamp(min=1e-30)).item()


def gradient_errors(grads, refs) -> list[float]:
    """Relative errors of (dq, dk, dv) against the reference's. Where every query sees a single key (one key in
    all, a window of one key) the softmax is constant and dq = dk = 0 exactly: their reference is fp64 rounding,
    so a kernel's rounding there is held to the problem's gradient scale, ‖dV‖ (relative to a zero it would be
    any size)."""
    dv_norm = refs[2].double().norm()
    return [relative_error(grad, ref) if ref.double().norm() > 1e-9 * dv_norm
            else ((grad.double() - ref.double()).norm() / dv_norm.clamp(min=1e-30)).item()
            for grad, ref in zip(grads, refs)]


def attention_reference(q, k, v, causal=False, softmax_scale=None, dtype=torch.float64, window_size=(-1, -1),
                        softcap=0.0, alibi_slopes=None, mask_mod=None, score_mod=None):
    """Attention with the same conventions as `autoflash.attention`, the full score matrix built.

    q: (batch, heads_q, seqlen_q, head_dim); k, v: (batch, heads_kv, seqlen_k, head_dim).
    Variants as in flash-attn: window_size (left, right) keys either side of the bottom-right diagonal (-1:
    unbounded), softcap (scores s become softcap·tanh(s / softcap); 0: off), alibi_slopes ((heads_q,) or
    (batch, heads_q): -slope·|i + seqlen_k - seqlen_q - j| added to the scores, after the softcap), and
    mask_mod (a function or autoflash.MaskMod: the pairs it refuses are masked, beside the others), score_mod (a
    function or autoflash.ScoreMod: applied to the scores after the softcap and ALiBi, before the masks).
    Returns (out, lse): out like q in `dtype`; lse (batch, heads_q, seqlen_q), natural log.
    Rows that see no key (bottom-right causal with seqlen_q > seqlen_k, a window beside every key) give out 0
    and lse -inf.
    """
    probs, lse, v, _ = _probabilities(q, k, v, causal, softmax_scale, dtype, window_size, softcap, alibi_slopes,
                                      mask_mod, score_mod)
    return torch.matmul(probs, v), lse


def attention_backward_reference(q, k, v, dout, causal=False, softmax_scale=None, dlse=None, dtype=torch.float64,
                                 window_size=(-1, -1), softcap=0.0, alibi_slopes=None, mask_mod=None,
                                 score_mod=None):
    """(dq, dk, dv) in `dtype`: the gradients of sum(out * dout) + sum(lse * dlse) for attention_reference's
    (out, lse), by the explicit formulas (dS = P * (dP - rowsum(dO * O) + dlse), times 1 - tanh² of the capped
    scores under softcap); GQA sums dk, dv over the query heads of each KV head. With a score_mod, by autograd
    through attention_reference (the mod's derivative as torch takes it)."""
    if score_mod is not None:
        return _autograd_backward(q, k, v, dout, causal, softmax_scale, dlse, dtype, window_size, softcap,
                                  alibi_slopes, mask_mod, score_mod)
    scale = _scale(softmax_scale, q.shape[-1])
    probs, _, v_rep, capped = _probabilities(q, k, v, causal, softmax_scale, dtype, window_size, softcap,
                                             alibi_slopes, mask_mod)
    q, dout = q.to(dtype), dout.to(dtype)
    k_rep = k.to(dtype).repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    delta = (dout * torch.matmul(probs, v_rep)).sum(-1, keepdim=True)
    if dlse is not None:
        delta = delta - dlse.to(dtype)[..., None]
    ds = probs * (torch.matmul(dout, v_rep.transpose(-1, -2)) - delta)
    if softcap:
        ds = ds * (1 - capped ** 2)
    dq = torch.matmul(ds, k_rep) * scale
    dk = torch.matmul(ds.transpose(-1, -2), q) * scale
    dv = torch.matmul(probs.transpose(-1, -2), dout)

    def per_kv_head(t):  # (batch, heads_q, seqlen_k, d) -> (batch, heads_kv, seqlen_k, d)
        return t.unflatten(1, (k.shape[1], -1)).sum(2)
    return dq, per_kv_head(dk), per_kv_head(dv)


def _autograd_backward(q, k, v, dout, causal, softmax_scale, dlse, dtype, *variants):
    """attention_backward_reference by autograd through attention_reference (rows that see no key give 0)."""
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    out, lse = attention_reference(q, k, v, causal, softmax_scale, dtype, *variants)
    outputs, grads = [out], [dout.to(dtype)]
    if dlse is not None:
        finite = torch.isfinite(lse)
        outputs.append(torch.where(finite, lse, 0.0))
        grads.append(torch.where(finite, dlse.to(dtype), 0.0))
    dq, dk, dv = torch.autograd.grad(outputs, (q, k, v), grads, allow_unused=True)
    return tuple(torch.zeros_like(t) if g is None else g.nan_to_num() for t, g in ((q, dq), (k, dk), (v, dv)))


def sdpa_attention(q, k, v, causal=False):
    """torch's scaled_dot_product_attention under autoflash's conventions (GQA, bottom-right causal),
    with whichever backend the caller's `sdpa_kernel` context allows."""
    from torch.nn.attention.bias import causal_lower_right
    from torch.nn.functional import scaled_dot_product_attention

    seqlen_q, seqlen_k = q.shape[2], k.shape[2]
    if causal and seqlen_q != seqlen_k:  # is_causal aligns top-left; ours is bottom-right
        mask = dict(attn_mask=causal_lower_right(seqlen_q, seqlen_k))
    else:
        mask = dict(is_causal=causal)
    return scaled_dot_product_attention(q, k, v, enable_gqa=q.shape[1] != k.shape[1], **mask)


def _scale(softmax_scale, head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim) if softmax_scale is None else softmax_scale


def _probabilities(q, k, v, causal, softmax_scale, dtype, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                   mask_mod=None, score_mod=None):
    """(P, lse, v repeated per query head, tanh(s / softcap) or None) in `dtype`."""
    scale = _scale(softmax_scale, q.shape[-1])
    group = q.shape[1] // k.shape[1]
    q, k, v = (t.to(dtype) for t in (q, k, v))
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    capped = None
    if softcap:
        capped = torch.tanh(scores / softcap)
        scores = softcap * capped
    seqlen_q, seqlen_k = q.shape[2], k.shape[2]
    # offset[i, j] = j - (i + seqlen_k - seqlen_q): where key j lies from query i's diagonal
    offset = torch.arange(seqlen_k, device=q.device)[None, :] - torch.arange(seqlen_q, device=q.device)[:, None] \
        - (seqlen_k - seqlen_q)
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(dtype)
        slopes = slopes[None, :] if slopes.dim() == 1 else slopes
        scores = scores - slopes[:, :, None, None] * offset.abs().to(dtype)
    if score_mod is not None:
        scores = as_score_mod(score_mod).apply(scores)
    left, right = window_size
    if causal:
        right = 0
    if right != -1:
        scores = scores.masked_fill(offset > right, float("-inf"))
    if left != -1:
        scores = scores.masked_fill(offset < -left, float("-inf"))
    if mask_mod is not None:
        scores = scores.masked_fill(~as_mask_mod(mask_mod).mask(*scores.shape, q.device), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    # A row that sees no key has lse -inf; clamping keeps exp(-inf - lse) at 0 instead of nan.
    probs = torch.exp(scores - lse[..., None].clamp(min=torch.finfo(dtype).min))
    return probs, lse, v, capped


def varlen_reference(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, softmax_scale=None, dout=None,
                     dtype=torch.float64):
    """`attention_reference` of each packed sequence (flash-attn's varlen layout: q (total_q, heads_q, head_dim),
    k, v (total_k, heads_kv, head_dim), sequence s the rows cu_seqlens[s]..cu_seqlens[s + 1]): (out, lse) with
    out like q and lse (heads_q, total_q) in `dtype`; with dout, also (dq, dk, dv) by
    `attention_backward_reference`."""
    results = []
    bounds = zip(cu_seqlens_q.tolist(), cu_seqlens_q.tolist()[1:], cu_seqlens_k.tolist(), cu_seqlens_k.tolist()[1:])
    for q0, q1, k0, k1 in bounds:
        sequence = [t[a:b].transpose(0, 1).unsqueeze(0) for t, a, b in ((q, q0, q1), (k, k0, k1), (v, k0, k1))]
        out, lse = attention_reference(*sequence, causal, softmax_scale, dtype)
        grads = () if dout is None else attention_backward_reference(
            *sequence, dout[q0:q1].transpose(0, 1).unsqueeze(0), causal, softmax_scale, dtype=dtype)
        results.append((out, lse, *grads))

    def packed(index, axis=1):  # (1, heads, rows, d) pieces -> (rows, heads, d); lse (1, heads, rows) -> (heads, rows)
        pieces = [r[index][0] for r in results]
        return torch.cat(pieces, axis).transpose(0, 1) if axis == 1 else torch.cat(pieces, axis)
    out, lse = packed(0), packed(1, axis=-1)
    return (out, lse) if dout is None else (out, lse, packed(2), packed(3), packed(4))
