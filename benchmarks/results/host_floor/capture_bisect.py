"""Session 28: which part of autoflash's autograd backward breaks CUDA graph capture (capture_repro.py: the plan's
backward captures on the main thread, torch.autograd.grad through _Attention does not, SDPA's does). Each case is
a torch.autograd.Function whose backward does part of ours, captured like the bench captures. After session 28's
run, three cases went first: SDPA's node, then ours twice (is it the process's first capture that fails, or
our node?)."""
import torch

import autoflash

b, hq, hkv, s, d = 4, 8, 8, 128, 64
q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16, requires_grad=True) for h in (hq, hkv, hkv))
out = autoflash.attention(q, k, v, causal=True)
dout = torch.randn_like(out)
plan = out.grad_fn.plan
saved = out.grad_fn.saved_tensors


def case(name, backward=None, outputs=1, attend=None):
    """Capture torch.autograd.grad through `attend(q, k, v)` (default: a Function whose backward is `backward`,
    with one or two outputs) as the bench does: warm-up on a side stream, then the capture."""
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            ctx.set_materialize_grads(False)
            return (q.clone(), q.new_empty(q.shape[:3], dtype=torch.float32)) if outputs == 2 else q.clone()

        @staticmethod
        def backward(ctx, dout, *rest):
            return backward(dout)

    inputs = tuple(t.detach().clone().requires_grad_() for t in (q, k, v))
    y = attend(*inputs) if attend else F.apply(*inputs)
    y = y[0] if outputs == 2 else y
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.autograd.grad(y, inputs, dout, retain_graph=True)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            torch.autograd.grad(y, inputs, dout, retain_graph=True)
        g.replay()
        torch.cuda.synchronize()
        print(f"{name}: ok")
    except Exception as e:
        print(f"{name}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:140]}")
        try:
            torch.cuda.synchronize()
        except Exception:
            pass


def stream_report(dout):
    print("  on the backward's thread: current stream", torch.cuda.current_stream(),
          "device", torch.cuda.current_device())
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


# (session 29) which fails first in a fresh process: SDPA's node, then ours, then ours again
case("plain SDPA, first capture of the process",
     attend=lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
case("autoflash.attention", attend=lambda q, k, v: autoflash.attention(q, k, v, causal=True))
case("autoflash.attention again", attend=lambda q, k, v: autoflash.attention(q, k, v, causal=True))
case("stream report (no capture meaning)", stream_report)
case("allocations only", lambda dout: (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)))
case("plan.backward, one output", lambda dout: plan.backward(*saved, dout, None))
case("plan.backward, two outputs", lambda dout: plan.backward(*saved, dout, None), outputs=2)
case("torch ops only (zero_ + copy_)",
     lambda dout: (torch.empty_like(q).copy_(dout), torch.zeros_like(k), torch.zeros_like(v)))
print("main thread stream:", torch.cuda.current_stream())
