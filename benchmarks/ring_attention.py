"""Ring attention on the GPUs of one host, beside single-GPU autoflash and PyTorch's context_parallel over SDPA.

First run: benchmarks/NOTES.md 46 (2 H200s).

    torchrun --nproc-per-node 2 benchmarks/ring_attention.py --reps 10 \
        --out benchmarks/results/DATE_h200x2_ring_attention.jsonl

For causal and full attention (bf16, head_dim 128, 16 heads, batch 1) at each total length (32k, 64k, 128k):
- check: ring_attention's out, dq, dk, dv on the gathered sequence against autoflash.attention on the whole sequence
  on one GPU (each rank runs it), relative errors; first, at 4k tokens, both against the fp64 reference.
- speed: the forward, and the backward alone (after a forward whose graph is kept), of ring_attention at the total
  length; per-GPU TFLOP/s = the whole problem's FLOPs / world size / time (the FlashAttention count, causal half).
  Beside it, single-GPU autoflash at total / world size tokens (issue 20's bar: ring / single >= 0.9) and
  context_parallel over SDPA (its default backend and rotation) at the total length: causal with its head-tail load
  balancing (the default), full with it off (torch refuses full attention with it on). Times are medians of fixed
  repetitions, the slowest rank's.
"""

import argparse
import contextlib
import datetime
import importlib
import json
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]
import autoflash  # noqa: E402
from autoflash.distributed import gather_sequence, ring_attention, shard_sequence  # noqa: E402
from autoflash.problem import Problem  # noqa: E402
from autoflash.reference import attention_backward_reference, attention_reference, relative_error  # noqa: E402
from forced_knobs import changes_of, forced_knobs  # noqa: E402  (this folder: sys.path[0] when run as a script)

HEADS, HEAD_DIM, DTYPE = 16, 128, torch.bfloat16
# Where torch keeps context_parallel's options (private): torch 2.13 defines `_cp_options` in the second and
# re-exports it from the first, where earlier releases define it.
CP_OPTIONS_MODULES = ("torch.distributed.tensor.experimental._attention",
                      "torch.distributed.tensor.experimental._context_parallel._attention")


def timed_ms(fn, reps: int) -> float:
    """Median of `reps` timed calls after 3 warm-up calls; the slowest rank's (every rank makes the same calls)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    starts, ends = ([torch.cuda.Event(enable_timing=True) for _ in range(reps)] for _ in range(2))
    for start, end in zip(starts, ends):
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    median = torch.tensor(statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)), device="cuda")
    dist.all_reduce(median, op=dist.ReduceOp.MAX)
    return median.item()


def forward_and_backward_ms(attend, inputs, dout, reps: int) -> tuple[float, float]:
    """(forward ms, backward ms) of out = attend(q, k, v): the backward alone, its graph built once and kept."""
    q, k, v = (t.detach().requires_grad_() for t in inputs)
    forward_ms = timed_ms(lambda: attend(q, k, v), reps)
    out = attend(q, k, v)
    backward_ms = timed_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), reps)
    return forward_ms, backward_ms


def full_inputs(total: int, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)  # the same tensors on every rank
    return [torch.randn(1, HEADS, total, HEAD_DIM, generator=gen, device="cuda", dtype=DTYPE) for _ in range(4)]


def ring_and_whole(q, k, v, dout, causal):
    """(ring's out, dq, dk, dv gathered; the same of autoflash.attention on the whole sequence on this GPU)."""
    shards = [shard_sequence(t, causal=causal).requires_grad_() for t in (q, k, v)]
    out = ring_attention(*shards, causal=causal)
    out.backward(shard_sequence(dout, causal=causal))
    ring = [gather_sequence(t, causal=causal) for t in (out, *(s.grad for s in shards))]
    whole_inputs = [t.detach().requires_grad_() for t in (q, k, v)]
    whole_out = autoflash.attention(*whole_inputs, causal=causal)
    whole_out.backward(dout)
    return ring, [whole_out.detach(), *(t.grad for t in whole_inputs)]


def check(total: int, causal: bool, fp64: bool) -> dict:
    q, k, v, dout = full_inputs(total, seed=total)
    ring, whole = ring_and_whole(q, k, v, dout, causal)
    names = ("out", "dq", "dk", "dv")
    row = dict(kind="check", total=total, causal=causal,
               ring_vs_single_gpu={n: relative_error(r, w) for n, r, w in zip(names, ring, whole)})
    if fp64:
        reference = [attention_reference(q, k, v, causal)[0], *attention_backward_reference(q, k, v, dout, causal)]
        row["ring_vs_fp64"] = {n: relative_error(r, x) for n, r, x in zip(names, ring, reference)}
        row["single_gpu_vs_fp64"] = {n: relative_error(w, x) for n, w, x in zip(names, whole, reference)}
    return row


def context_parallel_options():
    """torch's context_parallel options (`_cp_options`, with its `enable_load_balance` switch), or RuntimeError."""
    for name in CP_OPTIONS_MODULES:
        try:
            options = importlib.import_module(name)._cp_options
        except (ImportError, AttributeError):
            continue
        if hasattr(options, "enable_load_balance"):
            return options
    raise RuntimeError(f"torch {torch.__version__} has no _cp_options.enable_load_balance in "
                       f"{' or '.join(CP_OPTIONS_MODULES)}: context_parallel's load balancing cannot be turned off, "
                       "so full attention is not run (find the switch in torch's source and add its module)")


@contextlib.contextmanager
def load_balancing_off():
    """torch's context_parallel without its head-tail load balancing, restored after."""
    options = context_parallel_options()
    balanced = options.enable_load_balance
    options.enable_load_balance = False
    try:
        yield
    finally:
        options.enable_load_balance = balanced


def context_parallel_ms(q, k, v, dout, causal, reps: int):
    """(forward ms, backward ms) of torch's context_parallel over SDPA, or the error that stopped it. Full attention
    runs with its load balancing off (torch: "Load balancing requires `is_causal=True`")."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    mesh = init_device_mesh("cuda", (dist.get_world_size(),))
    q, k, v, dout = (t.clone() for t in (q, k, v, dout))  # context_parallel shards its buffers in place
    try:
        with contextlib.nullcontext() if causal else load_balancing_off(), \
                context_parallel(mesh, buffers=[q, k, v, dout], buffer_seq_dims=[2, 2, 2, 2]):
            return forward_and_backward_ms(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                                           (q, k, v), dout, reps)
    except Exception as e:  # recorded, not fatal: the experimental API changes between torch versions
        return f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"


def speed(total: int, causal: bool, reps: int, change: dict) -> dict:
    """Ring against one GPU at the local length (and torch's context parallel SDPA); the ring's forward steps run
    their dispatched knobs with `change` applied (benchmarks/forced_knobs.py), the single GPU its own."""
    world = dist.get_world_size()
    q, k, v, dout = full_inputs(total, seed=total)
    shards = [shard_sequence(t, causal=causal) for t in (q, k, v, dout)]
    with forced_knobs(change):
        ring = forward_and_backward_ms(lambda q, k, v: ring_attention(q, k, v, causal=causal), shards[:3],
                                       shards[3], reps)
    local = total // world
    single = forward_and_backward_ms(lambda q, k, v: autoflash.attention(q, k, v, causal=causal),
                                     [t[:, :, :local].contiguous() for t in (q, k, v)],
                                     dout[:, :, :local].contiguous(), reps)
    whole, part = (Problem(1, HEADS, HEADS, n, n, HEAD_DIM, causal, "bfloat16") for n in (total, local))
    row = dict(kind="speed", total=total, causal=causal, world=world, reps=reps, **({"knobs": change} if change else {}))
    for i, direction in enumerate(("fwd", "bwd")):
        ring_tflops = whole.flops(direction) / world / ring[i] * 1e-9
        single_tflops = part.flops(direction) / single[i] * 1e-9
        row[direction] = dict(ring_ms=ring[i], ring_tflops_per_gpu=ring_tflops, single_gpu_ms=single[i],
                              single_gpu_tflops=single_tflops, ring_over_single=ring_tflops / single_tflops)
    context_parallel = context_parallel_ms(q, k, v, dout, causal, reps)
    if isinstance(context_parallel, str):
        row["context_parallel_sdpa_error"] = context_parallel
    else:
        for i, direction in enumerate(("fwd", "bwd")):
            row[direction].update(context_parallel_sdpa_ms=context_parallel[i],
                                  context_parallel_sdpa_tflops_per_gpu=whole.flops(direction) / world
                                  / context_parallel[i] * 1e-9)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--totals", type=int, nargs="+", default=[32768, 65536, 131072])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--knobs", default="[{}]", help="JSON list of forward knob changes for the ring's steps, "
                        'e.g. \'[{}, {"family": "gluon", "persistent": true, "dynamic": true}]\' (NOTES R2)')
    parser.add_argument("--out", help="jsonl file for the rows (rank 0 writes it)")
    args = parser.parse_args()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))  # torchrun sets it; before NCCL starts
    dist.init_process_group("nccl")
    rows = []
    for causal in (False, True):
        rows.append(check(4096, causal, fp64=True))
        for total in args.totals:
            rows.append(check(total, causal, fp64=False))
            rows += [speed(total, causal, args.reps, change) for change in changes_of(args.knobs)]
            torch.cuda.empty_cache()
    if dist.get_rank() == 0:
        stamp = dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(),
                     torch=torch.__version__)
        text = "".join(json.dumps({**stamp, **row}) + "\n" for row in rows)
        print(text, end="")
        if args.out:
            Path(args.out).write_text(text)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
