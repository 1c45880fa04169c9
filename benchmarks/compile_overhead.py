"""Host time per call of autoflash.attention eager and inside torch.compile (fullgraph), beside plain SDPA eager and
compiled; and which backend plain SDPA (no backend forced) runs on each FA-grid shape kind (issue 19).

    python benchmarks/compile_overhead.py --out benchmarks/results/DATE_GPU_compile_overhead.jsonl

On a tiny problem (batch 1, 1 head, 128 tokens, d64) the GPU finishes each kernel before the CPU issues the next,
so the time per call of a long loop is host time. The backend is read from the names of the CUDA kernels that
torch.profiler records for one call (cuDNN's, flash's, mem-efficient's or the math path's)."""

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

import autoflash
from results_file import append_row


def host_us(fn, args, calls=2000, rounds=5) -> float:
    """Median over rounds of the time per call of `calls` calls (after a warm-up), synchronised at the ends."""
    for _ in range(50):
        fn(*args)
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


KINDS = {"cudnn": "cudnn", "flash": "flash", "efficient": "mem_eff", "fmha": "mem_eff", "cutlass": "mem_eff"}


def backend_of(q, k, v, causal) -> str:
    """The SDPA backend whose kernels ran for one plain call (by their names), or the kernel names if unknown."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    # one kind a kernel, the first key it holds: cuDNN's attention kernels may name "flash" too
    found = {next((kind for key, kind in KINDS.items() if key in name.lower()), None) for name in names} - {None}
    return ",".join(sorted(found)) if found else "math? " + "; ".join(sorted(set(names)))[:200]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    args = parser.parse_args()
    meta = dict(gpu=torch.cuda.get_device_name())
    rows = []
    q, k, v = (torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    calls = {
        "autoflash eager": lambda q, k, v: autoflash.attention(q, k, v, causal=True),
        "autoflash compiled": torch.compile(lambda q, k, v: autoflash.attention(q, k, v, causal=True), fullgraph=True),
        "sdpa eager": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "sdpa compiled": torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                       fullgraph=True),
    }
    for name, fn in calls.items():
        rows.append(dict(kind="host_us", call=name, us=round(host_us(fn, (q, k, v)), 2)))
    for dtype in (torch.float16, torch.bfloat16):
        for d in (64, 128):
            for causal in (False, True):
                for seqlen in (512, 4096, 16384):
                    q, k, v = (torch.randn(16384 // seqlen, 2048 // d, seqlen, d, device="cuda", dtype=dtype)
                               for _ in range(3))
                    rows.append(dict(kind="sdpa_backend", shape=list(q.shape), dtype=str(dtype)[6:], causal=causal,
                                     backend=backend_of(q, k, v, causal)))
    for row in rows:
        print(json.dumps(row), flush=True)
        append_row(args.out, dict(row, **meta))


if __name__ == "__main__":
    main()
