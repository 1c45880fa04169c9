"""Reference attention in float64 (or any dtype): the ground truth every kernel is checked against."""

import math

import torch

# Largest ‖out − ref‖ / ‖ref‖ accepted from a kernel: the rounding of P and of the output to fp16
# costs ~1e-3, to bf16 ~1e-2; fp32 kernels compute in fp32 throughout.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; nan if out holds a nan."""
    return ((out.double() - ref.double()).norm() / ref.double().norm().clamp(min=1e-30)).item()


def attention_reference(q, k, v, causal=False, softmax_scale=None, dtype=torch.float64):
    """Plain attention with the same conventions as `autoflash.attention`.

    q: (batch, heads_q, seqlen_q, head_dim); k, v: (batch, heads_kv, seqlen_k, head_dim).
    Returns (out, lse): out like q in `dtype`; lse (batch, heads_q, seqlen_q), natural log.
    Rows that see no key (bottom-right causal with seqlen_q > seqlen_k) give out 0 and lse -inf.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else softmax_scale
    group = q.shape[1] // k.shape[1]
    q, k, v = (t.to(dtype) for t in (q, k, v))
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if causal:
        seqlen_q, seqlen_k = q.shape[2], k.shape[2]
        rows = torch.arange(seqlen_q, device=q.device)[:, None]
        cols = torch.arange(seqlen_k, device=q.device)[None, :]
        scores = scores.masked_fill(cols > rows + (seqlen_k - seqlen_q), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    # A row that sees no key has lse -inf; clamping keeps exp(-inf - lse) at 0 instead of nan.
    probs = torch.exp(scores - lse[..., None].clamp(min=torch.finfo(dtype).min))
    return torch.matmul(probs, v), lse
