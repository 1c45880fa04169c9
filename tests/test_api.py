"""`autoflash.attention`: the default path, layouts, dtypes, and every bad input it must refuse."""

import math

import pytest
import torch

import autoflash
from conftest import DEVICE
from helpers import assert_matches_reference, make_qkv, poisoned_outputs


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_default_variant(dtype, causal):
    q, k, v = make_qkv(2, 4, 2, 123, 77, 80, dtype, DEVICE, seed=11)
    out, lse = autoflash.attention(q, k, v, causal=causal, return_lse=True)
    assert out.shape == q.shape and out.dtype == dtype and lse.shape == (2, 4, 123) and lse.dtype == torch.float32
    assert_matches_reference(out, lse, q, k, v, causal)


def test_transposed_views_keep_their_layout():
    q, k, v = make_qkv(1, 4, 4, 33, 50, 64, torch.float16, DEVICE, transposed=True, seed=12)
    out = autoflash.attention(q, k, v, softmax_scale=0.3)
    assert out.stride() == q.stride(), "output should be laid out like q, (batch, seqlen, heads, dim)"
    assert_matches_reference(out, None, q, k, v, False, 0.3)


def test_non_unit_last_stride_is_copied():
    q, k, v = make_qkv(1, 2, 2, 20, 20, 32, torch.float16, DEVICE, seed=13)
    q_strided = torch.empty(*q.shape[:3], 64, dtype=q.dtype, device=q.device)[..., ::2]
    q_strided.copy_(q)
    assert q_strided.stride(-1) == 2
    out = autoflash.attention(q_strided, k, v)
    assert_matches_reference(out, None, q, k, v, False)


def test_empty_query_gives_empty_output():
    q, k, v = make_qkv(1, 2, 2, 0, 5, 32, torch.float16, DEVICE)
    out, lse = autoflash.attention(q, k, v, return_lse=True)
    assert out.shape == (1, 2, 0, 32) and lse.shape == (1, 2, 0)


def test_out_is_written_and_returned_in_its_own_layout():
    q, k, v = make_qkv(1, 4, 2, 123, 77, 40, torch.float16, DEVICE, seed=14)
    out, _ = poisoned_outputs(q)
    # (batch, seqlen, heads, dim) storage, as a (batch, heads, seqlen, dim) view: strides unlike q's.
    out_transposed = torch.full((1, 123, 4, 40), float("nan"), dtype=q.dtype, device=DEVICE).transpose(1, 2)
    for given in (out, out_transposed):
        result, lse = autoflash.attention(q, k, v, causal=True, return_lse=True, out=given)
        assert result is given
        assert_matches_reference(given, lse, q, k, v, True)
    fresh = make_qkv(1, 4, 2, 123, 77, 40, torch.float16, DEVICE, seed=15)
    out.fill_(float("nan"))
    assert autoflash.attention(*fresh, out=out) is out, "the second call reuses the plan and the buffer"
    assert_matches_reference(out, None, *fresh, False)


@pytest.mark.parametrize("out, error, message", [
    (lambda q: q.tolist(), TypeError, "out must be a torch.Tensor or None"),
    (lambda q: torch.empty_like(q[:, :, 1:]), ValueError, "out must be shaped like q"),
    (lambda q: torch.empty_like(q, dtype=torch.float32), TypeError, "out must have q's dtype and device"),
    (lambda q: torch.empty(*q.shape[:3], 2 * q.shape[3], dtype=q.dtype, device=q.device)[..., ::2], ValueError,
     "last stride 1"),
])
def test_bad_out(out, error, message):
    q, k, v = _inputs()
    with pytest.raises(error, match=message):
        autoflash.attention(q, k, v, out=out(q))


def test_out_refuses_inputs_that_require_grad():
    q, k, v = _inputs()
    out = torch.empty_like(q)
    q.requires_grad_()
    with pytest.raises(RuntimeError, match="not differentiable.*torch.no_grad"):
        autoflash.attention(q, k, v, out=out)
    with torch.no_grad():
        assert autoflash.attention(q, k, v, out=out) is out
    assert_matches_reference(out, None, q.detach(), k, v, False)


def _inputs(**changes):
    shapes = dict(q=(1, 4, 16, 32), k=(1, 2, 16, 32), v=(1, 2, 16, 32))
    shapes.update({name: value for name, value in changes.items() if name in shapes})
    dtype = changes.get("dtype", torch.float16)
    return [torch.randn(shape, device=DEVICE).to(dtype) for shape in shapes.values()]


@pytest.mark.parametrize("changes, error, message", [
    (dict(q=(4, 16, 32)), ValueError, "must be 4-D"),
    (dict(k=(1, 2, 16, 32, 1)), ValueError, "must be 4-D"),
    (dict(k=(2, 2, 16, 32), v=(2, 2, 16, 32)), ValueError, "batch sizes differ"),
    (dict(k=(1, 2, 16, 64), v=(1, 2, 16, 64)), ValueError, "head dims differ"),
    (dict(v=(1, 2, 17, 32)), ValueError, "same heads and length"),
    (dict(k=(1, 3, 16, 32), v=(1, 3, 16, 32)), ValueError, "multiple of heads_kv"),
    (dict(q=(1, 4, 16, 8), k=(1, 2, 16, 8), v=(1, 2, 16, 8)), ValueError, "outside the supported 16..256"),
    (dict(q=(1, 4, 16, 288), k=(1, 2, 16, 288), v=(1, 2, 16, 288)), ValueError, "outside the supported"),
    (dict(k=(1, 2, 0, 32), v=(1, 2, 0, 32)), ValueError, "no keys"),
    (dict(dtype=torch.float64), TypeError, "supports float16, bfloat16 and float32"),
])
def test_bad_shapes_and_dtypes(changes, error, message):
    with pytest.raises(error, match=message):
        autoflash.attention(*_inputs(**changes))


def test_mixed_dtypes():
    q, k, v = _inputs()
    with pytest.raises(TypeError, match="share one dtype"):
        autoflash.attention(q, k.float(), v)


def test_not_a_tensor():
    q, k, v = _inputs()
    with pytest.raises(TypeError, match="k must be a torch.Tensor"):
        autoflash.attention(q, k.tolist(), v)


def test_mixed_devices():
    q, k, v = _inputs()
    with pytest.raises(ValueError, match="one device"):
        autoflash.attention(q, k.to("meta"), v)


@pytest.mark.parametrize("scale, error", [(math.inf, ValueError), (math.nan, ValueError), (0.0, ValueError), (-0.5, ValueError), ("0.1", TypeError),
                                          (torch.tensor(0.1), TypeError)])
def test_bad_softmax_scale(scale, error):
    with pytest.raises(error, match="softmax_scale"):
        autoflash.attention(*_inputs(), softmax_scale=scale)


def test_bad_causal():
    with pytest.raises(TypeError, match="causal"):
        autoflash.attention(*_inputs(), causal="yes")


def test_bad_return_lse():
    with pytest.raises(TypeError, match="return_lse must be True or False"):
        autoflash.attention(*_inputs(), return_lse="yes")


def test_bad_deterministic():
    with pytest.raises(TypeError, match="deterministic must be True or False"):
        autoflash.attention(*_inputs(), deterministic=1)


def test_cpu_tensors_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k, v = (t.cpu() for t in _inputs())
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        autoflash.attention(q, k, v)


def test_backward_given_an_out_laid_out_otherwise_reads_it_as_it_is():
    """attention_backward with out (and lse) slices of larger tensors, as ring attention's steps pass them, after a
    call of the same signature with fresh ones: each layout gets its own backward plan, so the same gradients."""
    from autoflash.api import attention_backward, attention_forward

    q, k, v = make_qkv(1, 2, 1, 7, 9, 16, torch.float32, DEVICE)
    dout = torch.randn_like(q)
    out, lse = attention_forward(q, k, v, True, None, False)
    fresh = attention_backward(dout, q, k, v, out, lse, None, True, None, False)
    wide_out = torch.full((1, 2, 14, 16), float("nan"), device=q.device)
    wide_out[:, :, 3:10] = out
    wide_lse = torch.full((1, 2, 14), float("nan"), device=q.device)
    wide_lse[:, :, 3:10] = lse
    sliced = attention_backward(dout, q, k, v, wide_out[:, :, 3:10], wide_lse[:, :, 3:10], None, True, None, False)
    for a, b in zip(fresh, sliced):
        torch.testing.assert_close(a, b)


def test_incoming_gradients_reach_the_kernels_tma_readable(monkeypatch):
    """A backward kernel family that loads dO by TMA (gluon, dispatched for most H100 backward problems) needs a
    unit last stride and 16-byte strides: out.sum()'s gradient (a broadcast) and a slice of a wider tensor are
    copied first, at the call that makes the layout's plan and at every later one; gradients stay right."""
    from autoflash import codegen, gpu

    seen = []
    real = codegen.Variant.backward_plan

    def spy(self, q, k, v, out, lse, dout, *args, **kwargs):
        seen.append(dout)
        return real(self, q, k, v, out, lse, dout, *args, **kwargs)
    monkeypatch.setattr(codegen.Variant, "backward_plan", spy)
    q, k, v = make_qkv(1, 2, 2, 7, 7, 16, torch.float32, DEVICE)
    wide = torch.randn(1, 2, 7, 17, device=DEVICE)[..., :16]  # rows of 68 bytes
    gradients = (torch.ones(1, 1, 1, 1, device=DEVICE).expand(1, 2, 7, 16), wide)  # (out.sum()'s, a slice)
    for gradient in (g for g in gradients for _ in range(2)):  # (each layout's second call runs the first's plan)
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        autoflash.attention(q, k, v, causal=True).backward(gradient)
        assert seen[-1].stride(-1) == 1 and gpu.tma_aligned(seen[-1]), seen[-1].stride()
        q2, k2, v2 = (t.detach().double().requires_grad_() for t in (q, k, v))
        probs = torch.softmax((q2 @ k2.transpose(-1, -2) / 4).masked_fill(
            torch.ones(7, 7, dtype=torch.bool, device=DEVICE).triu(1), float("-inf")), -1)
        (probs @ v2).backward(gradient.double())
        for got, want in ((q.grad, q2.grad), (k.grad, k2.grad), (v.grad, v2.grad)):
            torch.testing.assert_close(got.double(), want, atol=2e-4, rtol=2e-3)
