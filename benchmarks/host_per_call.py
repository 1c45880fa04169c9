"""Is a small pass host-bound, and does it wait for the GPU? Per problem, forward and backward, graphs off and on.

    python benchmarks/host_per_call.py [--shapes examples/holdout.yaml] [--only LABEL ...] --out FILE

Three times a call, after 20 warm-up calls (the backward: torch.autograd.grad on a kept forward):
  host_ms   the median host time of one call over 100 calls without synchronising (the host's time alone, while the
            GPU's queue fills);
  after_sleep_ms  one call's host time right after ~50 ms of GPU work (torch.cuda._sleep) was queued: a call that
            synchronises with the GPU takes ~50 ms, one that does not, its host time;
  loop_ms   CUDA events around 50 back-to-back calls, per call: max(host, GPU) when nothing synchronises.
A loop_ms near host_ms and above the GPU's time (`autoflash bench --graph`) is a host-bound pass (NOTES 100).
"""

import argparse
import os
import statistics
import time

import torch

import autoflash
from autoflash import api
from autoflash.shapes import load_problems
from autoflash.tune.trial import variant_kwargs
from results_file import append_row

SLEEP_CYCLES = 100_000_000  # ~50 ms of one SM's clock


def host_ms(fn, calls: int = 100, drain_every: int | None = None) -> float:
    """Median host time of one call of fn, ms, over `calls` calls without synchronising inside one (the GPU's queue
    drained every `drain_every` calls, outside the timings, or never)."""
    times = []
    for i in range(calls):
        if drain_every and i % drain_every == 0:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


def per_call(fn) -> dict:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    host = host_ms(fn)
    torch.cuda._sleep(SLEEP_CYCLES)
    start = time.perf_counter()
    fn()
    after_sleep = (time.perf_counter() - start) * 1e3
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(50):
        fn()
    end.record()
    torch.cuda.synchronize()
    return dict(host_ms=host, after_sleep_ms=after_sleep, loop_ms=begin.elapsed_time(end) / 50)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="examples/holdout.yaml")
    parser.add_argument("--only", nargs="*", help="problem labels to keep (as printed), default all")
    parser.add_argument("--out")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("host_per_call.py times CUDA calls: run it on a GPU machine")
    device = torch.device("cuda")
    for p in load_problems(args.shapes):
        if args.only and p.label() not in args.only:
            continue
        for graphs in ("0", "1"):
            os.environ["AUTOFLASH_GRAPHS"] = graphs
            api._plans.clear()  # (a new plan reads the variable)
            q, k, v, dout = p.random_inputs(device, 0, with_dout=True)
            leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
            variants = variant_kwargs(p, device)
            forward = lambda: autoflash.attention(*leaves, causal=p.causal, **variants)  # noqa: E731
            out = forward()
            backward = lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True)  # noqa: E731
            for direction, fn in (("fwd", forward), ("bwd", backward)):
                row = per_call(fn)
                append_row(args.out, dict(bench="host_per_call", gpu=torch.cuda.get_device_name(), problem=p.label(),
                                          direction=direction, graphs=graphs == "1", **row))
                print(f"{p.label():40s} {direction} graphs {graphs}: host {row['host_ms']:.3f} ms, after sleep "
                      f"{row['after_sleep_ms']:.2f} ms, loop {row['loop_ms']:.3f} ms/call", flush=True)


if __name__ == "__main__":
    main()
