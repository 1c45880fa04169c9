"""Where a replayed small pass's host time goes: each step of the call timed alone, beside plain SDPA's whole call.

    python benchmarks/host_breakdown.py [--only LABEL ...] --out FILE [--profile FILE]

host_per_call.py says a pass is host-bound; this says on what. Per problem (examples/holdout.yaml, or --only), graphs
on, after warm-up (the graphs captured): the median host time (no synchronisation inside a timed call; the queue is
drained every 50 calls, outside the timings) of the whole forward without autograd, the whole backward
(torch.autograd.grad), plain SDPA's two, and the steps of ours: the plan's backward outside autograd, its three
gradient allocations, a graph's replay alone, the stream lookups Replayed makes. With --profile, cProfile of 300
backwards on the calling thread, by own time.
"""

import argparse
import cProfile
import io
import pstats
import torch

import autoflash
from autoflash import api, graphs
from autoflash.shapes import load_problems
from host_per_call import host_ms
from results_file import append_row

CALLS = 400


def host_us(fn) -> float:
    """Median host time of one call of fn, µs, after 30 warm-up calls (the GPU drained every 50 calls)."""
    for _ in range(30):
        fn()
    torch.cuda.synchronize()
    return 1e3 * host_ms(fn, CALLS, drain_every=50)


def steps(p, device) -> dict:
    q, k, v, dout = p.random_inputs(device, 0, with_dout=True)
    leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
    gqa = dict(enable_gqa=True) if p.heads_q != p.heads_kv else {}
    out = autoflash.attention(*leaves, causal=p.causal)
    ref = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=p.causal, **gqa)
    key = next(key for key in api._plans if key[0] == q.shape and key[1] == k.shape)
    plan = api._plans[key]
    with torch.no_grad():
        _, lse = autoflash.attention(q, k, v, causal=p.causal, return_lse=True)
    grads = lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True)  # noqa: E731
    times = {}
    with torch.no_grad():
        times["fwd_nograd"] = host_us(lambda: autoflash.attention(q, k, v, causal=p.causal))
        times["sdpa_fwd_nograd"] = host_us(lambda: torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=p.causal, **gqa))
    times["fwd_grad"] = host_us(lambda: autoflash.attention(*leaves, causal=p.causal))
    times["sdpa_fwd_grad"] = host_us(lambda: torch.nn.functional.scaled_dot_product_attention(
        *leaves, is_causal=p.causal, **gqa))
    times["bwd"] = host_us(grads)
    times["sdpa_bwd"] = host_us(lambda: torch.autograd.grad(ref, leaves, dout, retain_graph=True))
    times["plan_backward"] = host_us(lambda: plan.backward(q, k, v, out.detach(), lse, dout, None))
    times["empty_like_x3"] = host_us(lambda: (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)))
    times["current_stream"] = host_us(torch.cuda.current_stream)
    times["is_capturing"] = host_us(torch.cuda.is_current_stream_capturing)
    if graphs._graphs:
        graph = next(reversed(graphs._graphs.values()))[0]
        times["graph_replay_last"] = host_us(graph.replay)
    times["counts"] = dict(graphs.COUNTS)
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="examples/holdout.yaml")
    parser.add_argument("--only", nargs="*", help="problem labels to keep (as printed), default all")
    parser.add_argument("--out")
    parser.add_argument("--profile", help="write cProfile of 300 backwards of the first problem here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("host_breakdown.py times CUDA calls: run it on a GPU machine")
    device = torch.device("cuda")
    profiled = False
    for p in load_problems(args.shapes):
        if args.only and p.label() not in args.only:
            continue
        api._plans.clear()
        row = steps(p, device)
        append_row(args.out, dict(bench="host_breakdown", gpu=torch.cuda.get_device_name(), problem=p.label(), **row))
        print(p.label(), " ".join(f"{k} {v:.1f}" for k, v in row.items() if k != "counts"), flush=True)
        if args.profile and not profiled:
            profiled = True
            q, k, v, dout = p.random_inputs(device, 0, with_dout=True)
            leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
            out = autoflash.attention(*leaves, causal=p.causal)
            torch.autograd.set_multithreading_enabled(False)  # (the backward on this thread, where cProfile sees it)
            for _ in range(30):
                torch.autograd.grad(out, leaves, dout, retain_graph=True)
            profile = cProfile.Profile()
            profile.enable()
            for i in range(300):
                torch.autograd.grad(out, leaves, dout, retain_graph=True)
                if i % 50 == 0:
                    torch.cuda.synchronize()
            profile.disable()
            torch.autograd.set_multithreading_enabled(True)
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(40)
            with open(args.profile, "w") as f:
                f.write(f"{p.label()}: cProfile of 300 backwards (graphs on)\n{text.getvalue()}")


if __name__ == "__main__":
    main()
