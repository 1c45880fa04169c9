"""Host time of `autoflash.attention` over a bare launch of the same compiled kernel.

    python benchmarks/overhead.py --out benchmarks/results/overhead.jsonl

On a tiny problem the GPU finishes each kernel before the CPU issues the next, so the time per
call of a long loop is host time. Overhead = attention's time minus the launcher's (`forward`).
"""

import argparse
import datetime
import json
import statistics
import sys
import time

import torch
import triton

import autoflash
from autoflash import api, codegen, gpu as gpus
from autoflash.problem import Problem


def host_us(fn, calls: int = 3000, repeats: int = 7) -> float:
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out")
    args = parser.parse_args()
    q, k, v = (torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    out = torch.empty_like(q)
    problem = Problem.from_tensors(q, k, False)
    knobs = api._choice_for(problem, gpus.current(q.device), api._tma_aligned(q, k, v, out)).knobs
    forward = codegen.load(knobs).forward
    scale = 64 ** -0.5
    bare = host_us(lambda: forward(q, k, v, out, None, scale, False))
    # What a hand-written launcher does per call: allocate the output, then launch.
    bare_alloc = host_us(lambda: forward(q, k, v, torch.empty_like(q), None, scale, False))
    full = host_us(lambda: autoflash.attention(q, k, v))
    # The parts of attention's own work, timed alone.
    parts = dict(call_key_us=host_us(lambda: api._call_key(q, k, v, False, None, False)),
                 plan_lookup_us=host_us(lambda: api._plans.get(api._call_key(q, k, v, False, None, False))),
                 empty_like_us=host_us(lambda: torch.empty_like(q)))
    row = dict(bench="overhead", attention_us=full, bare_launch_us=bare, overhead_us=full - bare,
               bare_launch_with_output_us=bare_alloc, overhead_over_launch_with_output_us=full - bare_alloc, **parts,
               knobs=knobs.to_json(), gpu=torch.cuda.get_device_name(), torch=torch.__version__,
               triton=triton.__version__, autoflash=autoflash.__version__,
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               command="python " + " ".join(sys.argv))
    print(f"autoflash.attention {full:.2f} us/call, bare launch {bare:.2f} us/call (with output allocation "
          f"{bare_alloc:.2f}), overhead {full - bare:.2f} us ({full - bare_alloc:.2f} over the launch with allocation); "
          + ", ".join(f"{k} {v:.2f}" for k, v in parts.items()))
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
