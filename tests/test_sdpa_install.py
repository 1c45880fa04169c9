"""`autoflash.install_sdpa()`: autoflash as SDPA's flash attention kernels (autoflash/integrations/sdpa.py).
SDPA's flash backend is CUDA-only: on the CPU the kernels are registered for the CPU key of the aten ops and
called through the dispatcher (autograd included); the GPU tests go through F.scaled_dot_product_attention."""

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, current_flash_attention_impl, sdpa_kernel

import autoflash
from autoflash import api
from autoflash.integrations import sdpa
from autoflash.reference import GRAD_TOLERANCE, attention_backward_reference, relative_error
from conftest import DEVICE
from helpers import assert_matches_reference, make_qkv

FLASH = torch.ops.aten._scaled_dot_product_flash_attention


@pytest.fixture
def on_cpu_key():
    """autoflash as the CPU kernels of SDPA's flash ops, for this test only."""
    handle = sdpa._register("CPU")
    yield
    handle.remove()


def test_install_registers_and_uninstall_restores():
    before = [torch._C._dispatch_dump(op) for op in (sdpa.FORWARD, sdpa.BACKWARD)]
    autoflash.install_sdpa()
    try:
        assert current_flash_attention_impl() == "autoflash"
        installed = [torch._C._dispatch_dump(op) for op in (sdpa.FORWARD, sdpa.BACKWARD)]
        assert all("sdpa.py" in dump and "CUDA" in dump for dump in installed), installed
    finally:
        autoflash.uninstall_sdpa()
    assert current_flash_attention_impl() is None
    assert [torch._C._dispatch_dump(op) for op in (sdpa.FORWARD, sdpa.BACKWARD)] == before
    autoflash.uninstall_sdpa()  # a second uninstall has nothing to do


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("causal, seqlen_k, scale", [(True, 37, None), (False, 20, 0.3)])
def test_registered_kernels_match_reference(on_cpu_key, dtype, causal, seqlen_k, scale):
    q, k, v = make_qkv(2, 4, 2, 37, seqlen_k, 40, dtype, DEVICE, seed=3)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, lse, *rest = FLASH(q, k, v, 0.0, causal, scale=scale)
    assert rest[2:4] == [37, seqlen_k]
    assert_matches_reference(out.detach(), lse, q.detach(), k.detach(), v.detach(), causal, scale)
    dout = torch.randn_like(out)
    out.backward(dout)  # autograd calls the backward op: autoflash's too
    expected = attention_backward_reference(q.detach(), k.detach(), v.detach(), dout, causal, scale)
    for name, t, ref in zip(("dq", "dk", "dv"), (q, k, v), expected):
        err = relative_error(t.grad, ref)
        assert err < GRAD_TOLERANCE[dtype], f"{name} relative error {err:.2e}"


@pytest.mark.parametrize("change, why", [
    (dict(dropout_p=0.1), "dropout"),
    (dict(return_debug_mask=True), "debug_mask"),
    (dict(is_causal=True, seqlen_k=9), "seqlen_q != seqlen_k"),
    (dict(scale=-1.0), "softmax_scale must be positive"),
    (dict(head_dim=8), "head_dim 8 is outside"),
])
def test_refused_calls_run_the_stock_kernels(change, why, caplog):
    """What autoflash refuses goes, arguments unchanged, to the kernel registered before it: never an error."""
    seqlen_k, head_dim = change.pop("seqlen_k", 12), change.pop("head_dim", 16)
    q, k, v = make_qkv(1, 2, 2, 12, seqlen_k, head_dim, torch.float16, DEVICE)
    call = dict(dropout_p=0.0, is_causal=False, return_debug_mask=False, scale=None) | change
    calls = []

    def stock(keyset, *args, **kwargs):
        calls.append((args, kwargs))
        return "stock"

    caplog.set_level("DEBUG", logger=sdpa.__name__)
    forward = sdpa.sdpa_flash_forward(stock)
    assert forward(None, q, k, v, call["dropout_p"], call["is_causal"], call["return_debug_mask"],
                   scale=call["scale"]) == "stock"
    (forward_args, forward_kwargs), = calls
    assert forward_args[:3] == (q, k, v) and forward_args[3:] == (call["dropout_p"], call["is_causal"],
                                                                   call["return_debug_mask"])
    assert forward_kwargs == {"scale": call["scale"]}
    assert why in caplog.text
    if call["return_debug_mask"]:  # the backward has no debug mask: nothing there to refuse
        return
    backward = sdpa.sdpa_flash_backward(stock)
    lse = torch.zeros(q.shape[:3])
    assert backward(None, q, q, k, v, q, lse, None, None, 12, seqlen_k, call["dropout_p"], call["is_causal"],
                    None, None, scale=call["scale"]) == "stock"
    backward_args, backward_kwargs = calls[1]
    assert len(backward_args) == 14 and backward_args[10:12] == (call["dropout_p"], call["is_causal"])
    assert backward_kwargs == {"scale": call["scale"]}


def test_refused_call_without_a_stock_kernel_says_so(on_cpu_key):
    """This CPU build has no CPU kernel of the op: a refused call fails as it would without autoflash."""
    q, k, v = make_qkv(1, 2, 2, 12, 12, 16, torch.float32, DEVICE)
    with pytest.raises(NotImplementedError, match="no CPU kernel in this torch build, and autoflash refused"):
        FLASH(q, k, v, 0.5)


@pytest.fixture
def installed():
    autoflash.install_sdpa()
    yield
    autoflash.uninstall_sdpa()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("causal, heads_kv", [(True, 8), (False, 2)])
def test_sdpa_runs_autoflash_forward_and_backward(installed, monkeypatch, dtype, causal, heads_kv):
    calls = []
    for name in ("attention_forward", "attention_backward"):
        original = getattr(api, name)
        monkeypatch.setattr(api, name, lambda *args, original=original, name=name: calls.append(name) or original(*args))
    q, k, v = make_qkv(2, 8, heads_kv, 300, 300, 128, dtype, DEVICE, seed=5)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=heads_kv != 8)
        dout = torch.randn_like(out)
        out.backward(dout)
    assert calls == ["attention_forward", "attention_backward"]
    assert_matches_reference(out.detach(), None, q.detach(), k.detach(), v.detach(), causal)
    expected = attention_backward_reference(q.detach(), k.detach(), v.detach(), dout, causal)
    for name, t, ref in zip(("dq", "dk", "dv"), (q, k, v), expected):
        err = relative_error(t.grad, ref)
        assert err < GRAD_TOLERANCE[dtype], f"{name} relative error {err:.2e}"


@pytest.mark.gpu
def test_sdpa_falls_back_on_dropout(installed):
    q, k, v = make_qkv(1, 4, 4, 128, 128, 64, torch.float16, DEVICE)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)
    assert out.shape == q.shape and torch.isfinite(out).all()


@pytest.mark.gpu
def test_compiled_sdpa_runs_autoflash(installed, monkeypatch):
    calls = []
    original = api.attention_forward
    monkeypatch.setattr(api, "attention_forward", lambda *args: calls.append(1) or original(*args))
    q, k, v = make_qkv(1, 4, 4, 256, 256, 64, torch.float16, DEVICE, seed=6)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                            fullgraph=True)(q, k, v)
    assert calls
    assert_matches_reference(out, None, q, k, v, True)
