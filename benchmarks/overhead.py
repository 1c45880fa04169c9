"""Host time of `autoflash.attention` over a bare launch of the same compiled kernel.

    python benchmarks/overhead.py --out benchmarks/results/overhead.jsonl

On a tiny problem the GPU finishes each kernel before the CPU issues the next, so the time per
call of a long loop is host time. The bare launch starts the variant's compiled kernel directly (its
a variant's `forward_plan` with autoflash/launch.py). Overhead is taken like for like, call by call in alternation:
`attention(q, k, v, out=out)` over the bare launch into the same preallocated output, and
`attention(q, k, v)` over the bare launch that allocates its output as attention does. Also timed: the
variant's plan launched through Triton's per-call argument binding (`kernel[grid](...)`), parts
of attention's own work alone, and the backward variant's kernels started by its plan and through Triton's
binding, and the whole backward through torch.autograd.grad with its two parts (the plan's backward outside
autograd; autograd's round trip into a Python Function that only allocates) and its timeline (timestamps taken in
the backward, on autograd's thread: `timeline_*`); plain SDPA's forward and backward the same way.
`--no-gc` times it all with Python's cyclic garbage collector off: what of the host time its collections take.
"""

import argparse
import datetime
import gc
import json
import statistics
import sys
import time

import torch
import triton

import autoflash
from autoflash import api, checks, codegen, gpu as gpus
from autoflash.problem import Problem
from forced_knobs import forced_knobs


def host_us(fns: dict, calls: int = 2000, rounds: int = 9) -> dict[str, float]:
    """Median per-call host time of each function, µs, over `rounds` loops of `calls` calls each."""
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - start) / calls * 1e6)
            torch.cuda.synchronize()
    return {name: statistics.median(t) for name, t in times.items()}


def paired_overhead_us(call, base, pairs: int = 20000) -> float:
    """Median of call()'s host time minus base()'s, µs, each timed alone and the two in alternation
    (call, base, base, call, ...): both see the same state of the host, and the median ignores the
    calls an interrupt or a page fault hit, which decide a difference of means of ~30 µs loops."""
    clock = time.perf_counter_ns
    differences = []
    for i in range(pairs):
        if i % 2:
            t0 = clock(); call(); t1 = clock(); base(); t2 = clock()
            differences.append((t1 - t0) - (t2 - t1))
        else:
            t0 = clock(); base(); t1 = clock(); call(); t2 = clock()
            differences.append((t2 - t1) - (t1 - t0))
    torch.cuda.synchronize()
    return statistics.median(differences) / 1e3


def backward_timeline(grad, calls: int = 2000) -> dict[str, float]:
    """Where the host time of `grad()` (torch.autograd.grad through one autoflash call) goes, by timestamps taken in
    _Attention.backward, on whichever thread autograd runs it: from grad's call to the backward's entry (the engine's
    hand-off to its device thread), the saved tensors' unpacking, the plan's backward there, and from its return
    to grad's (the engine's checks of the gradients, the hand-back). Medians of the calls' parts, µs. (cProfile
    cannot split these: the engine's threads and their hand-offs are C++.)"""
    clock, marks, original = time.perf_counter_ns, [], api._Attention.backward

    def timed(ctx, dout, dlse):  # _Attention.backward, its two steps timed apart
        entered = clock()
        q, k, v, out, lse, *extra = ctx.saved_tensors
        unpacked = clock()
        grads = ctx.plan.backward(q, k, v, out, lse, dout, dlse, tuple(extra))
        marks.append((entered, unpacked, clock()))
        return *grads, None, *(None for _ in extra)

    api._Attention.backward = staticmethod(timed)
    parts = []
    try:
        for _ in range(calls):
            start = clock()
            grad()
            end = clock()
            entered, unpacked, left = marks.pop()
            parts.append((entered - start, unpacked - entered, left - unpacked, end - left))
    finally:
        api._Attention.backward = staticmethod(original)
    names = ("engine_to_backward", "saved_tensors", "plan_in_autograd", "engine_after_backward")
    return {f"timeline_{name}_us": statistics.median(p[i] for p in parts) / 1e3 for i, name in enumerate(names)}


class _EngineFloor(torch.autograd.Function):
    """out = q; its backward allocates dq, dk, dv and returns them: what autograd costs a Python Function."""

    @staticmethod
    def forward(ctx, q, k, v):
        return q.clone()

    @staticmethod
    def backward(ctx, dout):
        return torch.empty_like(dout), torch.empty_like(dout), torch.empty_like(dout)


def triton_binding(kernel, grid, args, options, tensor_count):
    """A launcher's `compile` that launches through Triton's per-call binding, `kernel[grid](...)`, every call."""
    rest = args[tensor_count:]
    return lambda *tensors: kernel[grid](*tensors, *rest, **options)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out")
    parser.add_argument("--profile", metavar="NAME", help="also print cProfile's top entries for the timed function "
                        "NAME (e.g. backward_autograd)")
    parser.add_argument("--knobs", default="{}", help="a change to the dispatched forward's knobs, as "
                        "benchmarks/forced_knobs.py takes one: '{\"family\": \"gluon\", \"default\": true}' times the "
                        "Gluon forward's default")
    parser.add_argument("--no-gc", action="store_true", help="time with the cyclic garbage collector off")
    args = parser.parse_args()
    with forced_knobs(json.loads(args.knobs)):
        measure(args)


def measure(args):
    q, k, v = (torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    out = torch.empty_like(q)
    problem = Problem.from_tensors(q, k, False)
    knobs = api.DISPATCHER.for_call(problem, gpus.current(q.device), "fwd", (q, k, v, out)).knobs
    variant = codegen.load(knobs)
    scale = 64 ** -0.5
    launch = variant.forward_plan(q, k, v, out, None, scale, False)
    jit_launch = variant.forward_plan(q, k, v, out, None, scale, False, compile=triton_binding)
    bwd_knobs = api.DISPATCHER.for_call(problem, gpus.current(q.device), "bwd", (q, k, v, out)).knobs
    bwd_variant = codegen.load(bwd_knobs)
    lse, dout = torch.empty(q.shape[:3], dtype=torch.float32, device="cuda"), torch.randn_like(q)
    variant.forward(q, k, v, out, lse, scale, False)
    grads = tuple(torch.empty_like(t) for t in (q, k, v))
    bwd_launch = bwd_variant.backward_plan(q, k, v, out, lse, dout, *grads, scale, False, None)
    bwd_jit_launch = bwd_variant.backward_plan(q, k, v, out, lse, dout, *grads, scale, False, None,
                                               compile=triton_binding)

    graph_inputs = tuple(t.detach().clone().requires_grad_() for t in (q, k, v))
    graph_out = autoflash.attention(*graph_inputs)  # a kept graph: each backward_autograd call runs the backward
    saved = graph_out.grad_fn.saved_tensors  # (q, k, v, out, lse): what _Attention.backward hands its plan
    floor_inputs = tuple(t.detach().clone().requires_grad_() for t in (q, k, v))
    floor_out = _EngineFloor.apply(*floor_inputs)  # the engine's part alone: a Function whose backward allocates
    sdpa_inputs = tuple(t.detach().clone().requires_grad_() for t in (q, k, v))
    sdpa_out = torch.nn.functional.scaled_dot_product_attention(*sdpa_inputs)  # plain SDPA's, for comparison

    def call_key():  # the pointers are read for the key (and out's overlap check)
        return api._call_key(q, k, v, None, checks.addresses(q, k, v, None), False, None, False, False)

    fns = dict(
        attention_into_out=lambda: autoflash.attention(q, k, v, out=out),
        bare_launch=lambda: launch(q, k, v, out, None),
        attention=lambda: autoflash.attention(q, k, v),
        # What a hand-written launcher does per call: allocate the output, then launch.
        bare_launch_with_output=lambda: launch(q, k, v, torch.empty_like(q), None),
        triton_jit_launch=lambda: jit_launch(q, k, v, out, None),
        # The parts of attention's own work, timed alone.
        call_key=call_key,
        plan_lookup=lambda: api._plans.get(call_key()),
        empty_like=lambda: torch.empty_like(q),
        # What the backward's api no longer does per call (once per layout now, NOTES 78): out's and dO's TMA checks.
        layout_checks=lambda: (api._tma_readable(out), api._tma_readable(dout)),
        backward_bare_launch=lambda: bwd_launch(q, k, v, out, lse, dout, *grads, None),
        backward_triton_jit_launch=lambda: bwd_jit_launch(q, k, v, out, lse, dout, *grads, None),
        # What `autoflash bench --mode bwd` times: the whole backward through autograd (allocations, copies, plan).
        backward_autograd=lambda: torch.autograd.grad(graph_out, graph_inputs, dout, retain_graph=True),
        # Its two parts: the call's plan.backward outside autograd, and the engine's round trip into a Python
        # Function whose backward only allocates its three gradients.
        backward_plan=lambda: graph_out.grad_fn.plan.backward(*saved, dout, None),
        backward_engine_floor=lambda: torch.autograd.grad(floor_out, floor_inputs, dout, retain_graph=True),
        sdpa=lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v),
        sdpa_backward_autograd=lambda: torch.autograd.grad(sdpa_out, sdpa_inputs, dout, retain_graph=True))
    for fn in fns.values():  # compiled, planned and warm
        for _ in range(200):
            fn()
    torch.cuda.synchronize()
    if args.no_gc:
        gc.collect()
        gc.disable()
    if args.profile:
        import cProfile
        import pstats

        with cProfile.Profile() as profile:
            for _ in range(2000):
                fns[args.profile]()
        torch.cuda.synchronize()
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
    median = {f"{name}_us": t for name, t in host_us(fns).items()}
    median |= backward_timeline(fns["backward_autograd"])
    over = {f"overhead_{call}_over_{base}_us": paired_overhead_us(fns[call], fns[base])
            for call, base in (("attention_into_out", "bare_launch"), ("attention", "bare_launch_with_output"))}
    gc.enable()
    row = dict(bench="overhead", **median, **over, method="paired per-call medians", gc=not args.no_gc,
               knobs=knobs.to_json(),
               bwd_knobs=bwd_knobs.to_json(), forced=args.knobs, gpu=torch.cuda.get_device_name(),
               torch=torch.__version__, triton=triton.__version__, autoflash=autoflash.__version__,
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               command="python " + " ".join(sys.argv))
    print(", ".join(f"{name} {value:.2f}" for name, value in (median | over).items()))
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
