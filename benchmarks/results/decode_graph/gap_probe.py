"""Session 21 probe (NOTES K5), run from the repository root on the GPU machine: graph replays of N decode calls
(dense cache vs pages of 16; batch 32, GQA 64/8, d128, bf16, 1k-32k lengths): time a call in back-to-back replays
and one replay at a time, the kernels' busy time and the largest gaps between them; then autoflash's own graph
timing (_graph_ms, median_ms). The outputs under this folder came from versions of it with calls (1, 5), then
(5, 50) and the median_ms lines."""
import sys

import torch

import autoflash
from autoflash.tune.timing import _graph_ms, captured, median_ms

sys.path.insert(0, "benchmarks")
from kvcache_decode import lengths_of, paged_cache  # noqa: E402

torch.manual_seed(0)
batch, hq, hkv, d = 32, 64, 8, 128
lengths = lengths_of(batch, 1024, 32768, 0)
cap = max(lengths)
q = torch.randn(batch, 1, hq, d, dtype=torch.bfloat16, device="cuda")
k = torch.randn(batch, cap, hkv, d, dtype=torch.bfloat16, device="cuda")
v = torch.randn_like(k)
seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
kp, vp, table = paged_cache(k, v, lengths, 16, seed=16)
cases = {"dense": lambda _: autoflash.attention_with_kvcache(q, k, v, cache_seqlens=seqlens),
         "paged16": lambda _: autoflash.attention_with_kvcache(q, kp, vp, cache_seqlens=seqlens, block_table=table)}
for name, fn in cases.items():
    for calls in (5, 50):
        g = captured(fn, 1, calls)
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                g.replay()
            torch.cuda.synchronize()
        ev = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time > 0),
                    key=lambda e: e.time_range.start)
        busy = sum(e.time_range.end - e.time_range.start for e in ev) / 10 / calls
        names = {}
        for e in ev:
            names[e.name[:28]] = names.get(e.name[:28], 0) + (e.time_range.end - e.time_range.start) / 10 / calls
        gaps = [b.time_range.start - a.time_range.end for a, b in zip(ev, ev[1:])]
        big = sorted(((g_, a.name[:24], b.name[:24]) for g_, a, b in zip(gaps, ev, ev[1:])), reverse=True)[:3]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            g.replay()
        end.record()
        torch.cuda.synchronize()
        print(f"{name} calls {calls}: {start.elapsed_time(end) / 20 / calls * 1e3:.1f} us a call, kernels busy "
              f"{busy:.1f} us; {', '.join(f'{n} {t:.1f}' for n, t in sorted(names.items(), key=lambda x: -x[1]))}")
        print("   largest gaps (us):", [(round(g_, 1), a, b) for g_, a, b in big])
        alone = []
        for _ in range(10):
            start.record()
            g.replay()
            end.record()
            torch.cuda.synchronize()
            alone.append(start.elapsed_time(end) / calls * 1e3)
        print(f"   replays timed one by one: median {sorted(alone)[5]:.1f} us a call")
for name, fn in cases.items():
    for calls in (5, 50):
        print(f"{name} _graph_ms calls {calls}: {_graph_ms(fn, 1, calls, 15) * 1e3:.1f} us")
    print(f"{name} median_ms graph: {median_ms(fn, 1, q.device, warmup_ms=50, rep_ms=300, graph=True) * 1e3:.1f} us")
