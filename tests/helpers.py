"""Shared by the kernel tests: fresh random inputs, poisoned outputs, checks against the fp64 reference."""

import math

import torch

from autoflash.families.tl.knobs import BwdKnobs, FwdKnobs
from autoflash.reference import (GRAD_TOLERANCE, TOLERANCE, attention_backward_reference, attention_reference,
                                gradient_errors, relative_error)

# lse is computed in fp32 from rounded inputs' exact scores; it is off by rounding of the scores only.
LSE_TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}


def make_qkv(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, dtype, device, transposed=False, seed=0):
    """Fresh normal inputs; `transposed` builds (batch, seqlen, heads, dim) storage viewed as (b, h, s, d)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def one(heads, seqlen):
        shape = (batch, seqlen, heads, head_dim) if transposed else (batch, heads, seqlen, head_dim)
        t = torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype=dtype, device=device)
        return t.transpose(1, 2) if transposed else t

    return one(heads_q, seqlen_q), one(heads_kv, seqlen_k), one(heads_kv, seqlen_k)


def poisoned_outputs(q):
    out = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:3], float("nan"), dtype=torch.float32, device=q.device)
    return out, lse


# The user-written mods' kernel tests (test_mask_mod.py, test_score_mod.py): (batch, heads_q, heads_kv, seqlen_q,
# seqlen_k, head_dim) with lengths 1, 7, 123 no block divides, GQA, both ways round; small tiles of each kind.
MOD_SHAPES = [(1, 2, 1, 1, 7, 16), (2, 4, 2, 45, 61, 32), (1, 1, 1, 123, 77, 40)]
MOD_FWD_KNOBS = [
    FwdKnobs(block_m=16, block_n=16, num_warps=2, num_stages=2),
    FwdKnobs(block_m=32, block_n=16, num_warps=2, num_stages=2, exp="exp", kv_splits=2),
    FwdKnobs(block_m=16, block_n=32, num_warps=2, num_stages=2, loads="tma_host", head_dim_split=True),
]
MOD_BWD_KNOBS = [
    BwdKnobs(block_m=16, block_n=32, num_warps=2, num_stages=1),
    BwdKnobs(block_m=32, block_n=16, num_warps=2, num_stages=1, dq="atomic"),
]


MOD_GPU_SHAPES = [(2, 8, 2, 1000, 1000, 128), (1, 4, 4, 4097, 4097, 64), (3, 2, 1, 257, 1000, 80)]


def assert_mods_match_on_the_gpu(causal, dtype, argument: str, mods_of):
    """autoflash.attention with each mod of `mods_of(shape)` as its `argument` (mask_mod, score_mod), on
    MOD_GPU_SHAPES: out, lse and gradients against the fp64 reference."""
    import autoflash

    for i, shape in enumerate(MOD_GPU_SHAPES):
        q, k, v = make_qkv(*shape, dtype, "cuda", seed=i)
        for mod in mods_of(shape):
            out, lse = autoflash.attention(q, k, v, causal=causal, return_lse=True, **{argument: mod})
            assert_matches_reference(out, lse, q, k, v, causal, **{argument: mod})
            assert_gradients_match(q, k, v, causal, **{argument: mod})


def assert_forward_kernels_match(kernels, variant, q, k, v, causal, softmax_scale, **variants):
    """One launch of a loaded variant's forward (codegen.load) into NaN-poisoned outputs, against the fp64
    reference; `variants` as attention_reference takes them."""
    out, lse = poisoned_outputs(q)
    kernels.forward(q, k, v, out, lse, softmax_scale, causal, variant=variant)
    assert_matches_reference(out, lse, q, k, v, causal, softmax_scale, **variants)


def assert_backward_kernels_match(kernels, variant, q, k, v, causal, seed, **variants):
    """One launch of a loaded variant's backward, from the fp64 reference's out and lse into NaN-poisoned gradients,
    against the fp64 reference's gradients."""
    out, lse = attention_reference(q, k, v, causal, **variants)
    out, lse = out.to(q.dtype), lse.float()
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed)).to(q)
    grads = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
    kernels.backward(q, k, v, out, lse, dout, *grads, q.shape[-1] ** -0.5, causal, variant=variant)
    expected = attention_backward_reference(q, k, v, dout, causal, **variants)
    for name, error in zip(("dq", "dk", "dv"), gradient_errors(grads, expected)):
        assert error < GRAD_TOLERANCE[q.dtype], f"{sorted(variants)} causal={causal}: {name} error {error:.2e}"


def assert_matches_reference(out, lse, q, k, v, causal, softmax_scale=None, **variants):
    """out and lse against the fp64 reference; `variants`: window_size, softcap, alibi_slopes, mask_mod as it takes
    them."""
    ref_out, ref_lse = attention_reference(q, k, v, causal, softmax_scale, **variants)
    assert not torch.isnan(out).any(), "output has NaN (an element was not written, or the math broke)"
    err = relative_error(out, ref_out)
    assert err < TOLERANCE[q.dtype], f"output relative error {err:.2e} > {TOLERANCE[q.dtype]:.0e}"
    if lse is None:
        return
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse.cpu()), finite.cpu()), "lse is finite where the reference is not"
    assert (lse.cpu()[~finite.cpu()] == -math.inf).all(), "rows that see no key must have lse -inf"
    lse_err = ((lse.double() - ref_lse)[finite].abs().max() / ref_lse[finite].abs().max().clamp(min=1)).item() \
        if finite.any() else 0.0
    assert lse_err < LSE_TOLERANCE[q.dtype], f"lse error {lse_err:.2e} > {LSE_TOLERANCE[q.dtype]:.0e}"


def assert_gradients_match(q, k, v, causal, softmax_scale=None, with_lse=False, deterministic=False, seed=1,
                           dout_transposed=False, attention=None, **variants):
    """Backpropagate random dout (and dlse) through `attention` (default autoflash.attention); compare dq, dk, dv
    with the fp64 reference. `dout_transposed`: dout laid out (batch, seqlen, heads, dim); `variants`: window_size,
    softcap, alibi_slopes. Returns the gradients."""
    import autoflash

    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    gen = torch.Generator(device="cpu").manual_seed(seed)
    out, lse = (attention or autoflash.attention)(q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=True,
                                                  deterministic=deterministic, **variants)
    b, h, s, d = out.shape
    dout = (torch.randn((b, s, h, d), generator=gen).transpose(1, 2) if dout_transposed
            else torch.randn(out.shape, generator=gen)).to(out)
    dlse = torch.randn(lse.shape, generator=gen).to(lse) if with_lse else None
    outputs, grads = ((out, lse), (dout, dlse)) if with_lse else ((out,), (dout,))
    torch.autograd.backward(outputs, grads)
    expected = attention_backward_reference(q.detach(), k.detach(), v.detach(), dout, causal, softmax_scale, dlse,
                                            **variants)
    for name, t in zip(("dq", "dk", "dv"), (q, k, v)):
        assert t.grad is not None and not torch.isnan(t.grad).any(), f"{name} is missing or holds NaN"
        assert t.grad.stride() == t.stride() or not t.is_contiguous(), f"{name} lost its layout"
    for name, err in zip(("dq", "dk", "dv"), gradient_errors((q.grad, k.grad, v.grad), expected)):
        assert err < GRAD_TOLERANCE[q.dtype], f"{name} relative error {err:.2e} > {GRAD_TOLERANCE[q.dtype]:.0e}"
    return q.grad, k.grad, v.grad


class RecordingRunner:
    """A tuner's runner that compiles nothing: it appends each batch of variants it is handed to `batches` and fails
    each (so a search's order of guesses can be read off)."""
    compilers = ()
    measuring = True

    def __init__(self, batches: list):
        self.batches = batches
        self.seconds = {}  # (the runner's compile and timing seconds: it spends none)

    def run(self, problem, variants, on_outcome, deadline=None):
        from autoflash.tune.trial import Outcome

        self.batches.append(variants)
        for knobs in variants:
            on_outcome(knobs, Outcome("compile_error", error="not run: a test's runner"))
        return [Outcome("compile_error") for _ in variants]

    def sdpa_ms(self, problem, direction):
        return None
