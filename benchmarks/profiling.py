"""GPU time per kernel of a call, for the benchmarks' --profile (torch.profiler; tells kernel time from gaps)."""

import torch


def kernel_times(fn, reps=20):
    """ms per call on the GPU of each kernel fn launches, the longest first."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    times = {event.key: event.self_device_time_total / reps / 1e3 for event in profile.key_averages()
             if event.self_device_time_total > 0}
    return dict(sorted(times.items(), key=lambda item: -item[1]))
