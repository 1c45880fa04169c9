"""torch.compile over `autoflash.attention` (the custom ops of autoflash/integrations/torch_ops.py): one graph,
no graph break, the same outputs and gradients as eager, one compile for every sequence length."""

import shutil

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import autoflash
from conftest import DEVICE, HAS_GPU
from helpers import make_qkv

HAS_CXX = shutil.which(torch._inductor.config.cpp.cxx[-1] or "g++") is not None
BACKENDS = ["aot_eager", pytest.param("inductor", marks=pytest.mark.skipif(not (HAS_GPU or HAS_CXX),
                                                                           reason="inductor on CPU needs g++"))]


def two_attentions(q, k, v, kv):
    """Causal GQA with lse, a scale and deterministic gradients, then full attention over its output:
    what a model asks of attention, in one graph."""
    out, lse = autoflash.attention(q, k, v, causal=True, softmax_scale=0.3, return_lse=True, deterministic=True)
    return autoflash.attention(out * 2, kv, kv), lse


def outputs_and_grads(fn, *inputs):
    inputs = [t.detach().requires_grad_() for t in inputs]
    out, lse = fn(*inputs)
    (out.float().square().sum() + lse.sin().sum()).backward()
    return [out.detach(), lse.detach()] + [t.grad for t in inputs]


def make_inputs(seqlen_q, seqlen_k, dtype=torch.float32, seed=0):
    q, k, v = make_qkv(2, 4, 2, seqlen_q, seqlen_k, 32, dtype, DEVICE, seed=seed)
    kv = make_qkv(2, 4, 4, 1, seqlen_q, 32, dtype, DEVICE, seed=seed + 1)[1]
    return q, k, v, kv


def assert_same(compiled, eager):
    for name, got, expected in zip(("out", "lse", "dq", "dk", "dv", "dkv"), compiled, eager):
        assert got is not None and not torch.isnan(got).any(), f"{name} is missing or holds NaN"
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name} differs: {m}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_matches_eager(backend):
    inputs = make_inputs(19, 23)
    compiled = torch.compile(two_attentions, backend=backend, fullgraph=True)
    assert_same(outputs_and_grads(compiled, *inputs), outputs_and_grads(two_attentions, *inputs))


def test_no_graph_break():
    explanation = torch._dynamo.explain(two_attentions)(*make_inputs(9, 5))
    assert explanation.graph_count == 1 and explanation.graph_break_count == 0, explanation.break_reasons


def test_one_compile_serves_every_sequence_length():
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(two_attentions, backend=counter, fullgraph=True, dynamic=True)
    for seqlen_q, seqlen_k in ((17, 30), (40, 45)):  # lse finite: seqlen_q <= seqlen_k
        inputs = make_inputs(seqlen_q, seqlen_k, torch.float16, seed=seqlen_q)
        got = outputs_and_grads(compiled, *inputs)
        assert_same(got, outputs_and_grads(two_attentions, *inputs))
    assert counter.frame_count == 1, f"compiled {counter.frame_count} times for two sequence lengths"


def test_ops_pass_opcheck():
    """Schema, fake implementations (shapes, dtypes, strides) against the real ones, autograd registration,
    and AOT dispatch with dynamic shapes, as torch.library.opcheck tests them."""
    q, k, v = make_qkv(1, 4, 2, 7, 12, 16, torch.float32, DEVICE, transposed=True)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    torch.library.opcheck(torch.ops.autoflash.attention_forward.default, (q, k, v, True, 0.5, False))
    out, lse = torch.ops.autoflash.attention_forward(q, k, v, True, 0.5, False)
    dout = torch.randn_like(out)
    torch.library.opcheck(torch.ops.autoflash.attention_backward.default,
                          (dout, q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), None, True, 0.5, False))


def test_out_is_refused_under_compile():
    q = make_qkv(1, 1, 1, 4, 4, 16, torch.float32, DEVICE)[0]
    compiled = torch.compile(lambda q: autoflash.attention(q, q, q, out=torch.empty_like(q)), backend="aot_eager",
                             fullgraph=True)
    with pytest.raises(Exception, match=r"out=\.\.\.\) is not supported under torch.compile: leave out=None"):
        compiled(q)


class Block(torch.nn.Module):
    """A pre-norm GQA attention block, attention by autoflash."""

    def __init__(self, dim=256, heads=8, heads_kv=2):
        super().__init__()
        self.heads, self.heads_kv, self.head_dim = heads, heads_kv, dim // heads
        self.norm = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, (heads + 2 * heads_kv) * self.head_dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, s, -1, self.head_dim).split(
            [self.heads, self.heads_kv, self.heads_kv], dim=2)
        out = autoflash.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
        return x + self.proj(out.transpose(1, 2).reshape(b, s, -1))


@pytest.mark.gpu
def test_compiled_block_trains_like_eager():
    torch.manual_seed(0)
    eager = Block().to(DEVICE, torch.float16)
    compiled_block = Block().to(DEVICE, torch.float16)
    compiled_block.load_state_dict(eager.state_dict())
    compiled = torch.compile(compiled_block, fullgraph=True, dynamic=True)
    assert torch._dynamo.explain(compiled_block)(torch.randn(2, 128, 256, device=DEVICE,
                                                             dtype=torch.float16)).graph_break_count == 0
    optimizers = [torch.optim.SGD(m.parameters(), lr=1e-2) for m in (eager, compiled_block)]
    for step, seqlen in enumerate((128, 200, 333)):
        x = torch.randn(2, seqlen, 256, device=DEVICE, dtype=torch.float16, generator=None)
        losses = []
        for model, optimizer in zip((eager, compiled), optimizers):
            loss = model(x).float().square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        assert losses[0] == pytest.approx(losses[1], rel=1e-2), f"step {step}: eager {losses[0]}, compiled {losses[1]}"
