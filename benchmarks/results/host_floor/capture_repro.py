"""Session 28: the autoflash backward of b32 h32/8 s128 d128 causal bf16 failed under CUDA graph capture in
`autoflash bench --graph` ("operation failed due to a previous error during capture"). Capture it alone, in
several ways, and print what fails first."""
import sys
import traceback

import torch

import autoflash
from autoflash import api

shape = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "32,32,8,128,128").split(",")]
b, hq, hkv, s, d = shape
dt = torch.bfloat16


def inputs():
    q = torch.randn(b, hq, s, d, device="cuda", dtype=dt, requires_grad=True)
    k = torch.randn(b, hkv, s, d, device="cuda", dtype=dt, requires_grad=True)
    v = torch.randn(b, hkv, s, d, device="cuda", dtype=dt, requires_grad=True)
    return q, k, v


q, k, v = inputs()
print(autoflash.explain(q, k, v, causal=True))
out = autoflash.attention(q, k, v, causal=True)
dout = torch.randn_like(out)
torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
torch.cuda.synchronize()
print("eager backward ok")


def capture(name, grad, mode="global", calls=1, stream=None):
    """Capture `calls` calls of grad() (after one on a side stream, as the bench warms up), replay, say how it went."""
    try:
        if stream is None:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                grad()
            torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, capture_error_mode=mode, stream=stream):
            for _ in range(calls):
                grad()
        g.replay()
        torch.cuda.synchronize()
        print(f"{name}: ok")
    except Exception:
        print(f"{name}: FAILED")
        print(traceback.format_exc(limit=3).splitlines()[-1][:200])
        torch.cuda.synchronize()


for mode in ("global", "thread_local", "relaxed"):
    for calls in (1, 3):
        capture(f"capture autograd mode={mode} calls={calls}",
                lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), mode, calls)

# the same capture of plain SDPA's backward, its forward on the default stream like ours
sq, sk, sv = (t.detach().clone().requires_grad_() for t in (q, k, v))
sout = torch.nn.functional.scaled_dot_product_attention(sq, sk, sv, is_causal=True, enable_gqa=hq != hkv)
for mode in ("global", "relaxed"):
    capture(f"capture sdpa autograd mode={mode}",
            lambda: torch.autograd.grad(sout, (sq, sk, sv), dout, retain_graph=True), mode)

# ours with the forward run on a side stream (as PyTorch's whole-network capture recipe does)
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    out2 = autoflash.attention(q, k, v, causal=True)
    torch.autograd.grad(out2, (q, k, v), dout, retain_graph=True)
torch.cuda.current_stream().wait_stream(side)
capture("capture autograd, forward on the capture stream",
        lambda: torch.autograd.grad(out2, (q, k, v), dout, retain_graph=True), stream=side)

# the plan's backward outside autograd, captured (on the main thread)
saved = out.grad_fn.saved_tensors
for mode in ("global", "relaxed"):
    capture(f"capture plan.backward mode={mode}", lambda: out.grad_fn.plan.backward(*saved, dout, None), mode)
