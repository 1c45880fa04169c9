"""Host time of `autoflash.attention` over a bare launch of the same compiled kernel.

    python benchmarks/overhead.py --out benchmarks/results/overhead.jsonl

On a tiny problem the GPU finishes each kernel before the CPU issues the next, so the time per
call of a long loop is host time. The bare launch starts the variant's compiled kernel directly (its
`forward_plan` with autoflash/launch.py) on a preallocated output; overhead = attention's time minus that. Also timed:
the bare launch that allocates its output (what any launcher must do per call), and the variant's
`forward`, which goes through Triton's per-call argument binding (`kernel[grid](...)`).
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
from autoflash.launch import forward_plan
from autoflash.problem import Problem


def host_us(fns: dict, calls: int = 2000, rounds: int = 9) -> dict[str, list[float]]:
    """Per-call host time of each function, µs, in `rounds` rounds that run every function in turn: a
    drift of the host's speed hits all of them alike, and differences are taken round by round."""
    for fn in fns.values():
        for _ in range(200):
            fn()
    torch.cuda.synchronize()
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - start) / calls * 1e6)
            torch.cuda.synchronize()
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out")
    args = parser.parse_args()
    q, k, v = (torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    out = torch.empty_like(q)
    problem = Problem.from_tensors(q, k, False)
    knobs = api._choice_for(problem, gpus.current(q.device), api._tma_aligned(q, k, v, out)).knobs
    module = codegen.load(knobs)
    scale = 64 ** -0.5
    launch = forward_plan(module, q, k, v, out, None, scale, False)
    key = (q, k, v, False, None, False)
    times = host_us(dict(
        attention=lambda: autoflash.attention(q, k, v),
        bare_launch=lambda: launch(q, k, v, out, None),
        # What a hand-written launcher does per call: allocate the output, then launch.
        bare_launch_with_output=lambda: launch(q, k, v, torch.empty_like(q), None),
        triton_jit_launch=lambda: module.forward(q, k, v, out, None, scale, False),
        # The parts of attention's own work, timed alone.
        call_key=lambda: api._call_key(*key),
        plan_lookup=lambda: api._plans.get(api._call_key(*key)),
        empty_like=lambda: torch.empty_like(q)))
    median = {f"{name}_us": statistics.median(t) for name, t in times.items()}
    over = {f"overhead_over_{base}_us": statistics.median(a - b for a, b in zip(times["attention"], times[base]))
            for base in ("bare_launch", "bare_launch_with_output")}
    row = dict(bench="overhead", **median, **over, rounds=times, knobs=knobs.to_json(),
               gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
               autoflash=autoflash.__version__,
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               command="python " + " ".join(sys.argv))
    print(", ".join(f"{name} {value:.2f}" for name, value in (median | over).items()))
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
