"""autoflash beside PyTorch SDPA's backends, timed in one run on the same inputs.

TFLOP/s use the FlashAttention-paper count (causal = half of full for square problems; the
backward counts 2.5 x the forward and is timed alone, after a forward whose graph is kept).
"""

import math
import statistics
from collections import Counter

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import autoflash
from autoflash import graphs
from autoflash.problem import Problem
from autoflash.reference import sdpa_attention
from autoflash.tune.timing import backward_ms, input_sets, median_ms
from autoflash.tune.trial import variant_kwargs

ROUNDS = 3  # timings of each implementation a problem, interleaved with the others'

# Plain SDPA first (no backend forced: what a user gets without autoflash; cuDNN on the H100), then each backend.
SDPA_BACKENDS = {"sdpa": None, "sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
                 "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION}


def _sdpa(backend, p: Problem):
    if p.gates():
        def refuse(q, k, v):
            raise ValueError(f"SDPA has no {', '.join(sorted(p.gates()))}")
        return refuse
    if backend is None:
        return lambda q, k, v: sdpa_attention(q, k, v, p.causal)

    def run(q, k, v):
        with sdpa_kernel(backend):
            return sdpa_attention(q, k, v, p.causal)
    return run


def bench_problem(p: Problem, device: torch.device, direction: str = "fwd", rounds: int = ROUNDS,
                  graph: bool = False) -> list[dict]:
    """One row per implementation: backend, ms (the median of `rounds` rounds, each timing every implementation
    once, the order rotated a round: a GPU's clocks drift over a run, and the first or last of a row should not
    carry it alone) and TFLOP/s of the forward (or of the backward alone), or the error that stopped it. With
    `graph`, each timing replays a CUDA graph of many calls: the GPU's time alone, without host time. autoflash's
    row also holds, a round each, what its calls' plans did (autoflash/graphs.py's COUNTS: replayed, captured, ran
    as they are), since a small pass's time is the host's unless its calls replay."""
    sets = timing_sets(p, device, direction)
    variants = variant_kwargs(p, device)
    implementations = {"autoflash": lambda q, k, v: autoflash.attention(q, k, v, causal=p.causal, **variants)}
    implementations.update({name: _sdpa(backend, p) for name, backend in SDPA_BACKENDS.items()})
    timing = dict(rep_ms=max(20.0, 100.0 / rounds), graph=graph)

    def timed(fn):  # (a backward's graphs are built for the round and freed after it, as one backend's at a time)
        return pass_ms(fn, direction, sets, device, **timing)
    names, times, errors, plans_did = list(implementations), {name: [] for name in implementations}, {}, []
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            before = Counter(graphs.COUNTS)
            if name not in errors and (ms := _guarded(lambda: timed(implementations[name]), name, errors)) is not None:
                times[name].append(ms)
            if name == "autoflash":
                plans_did.append(dict(Counter(graphs.COUNTS) - before))
    rows = []
    for name in names:
        if name in errors:  # a backend that refuses the shape is recorded, not fatal
            rows.append(dict(backend=name, direction=direction, error=errors[name]))
        else:
            ms = statistics.median(times[name])
            rows.append(dict(backend=name, direction=direction, ms=ms, tflops=p.flops(direction) / ms * 1e-9,
                             rounds_ms=times[name]))
    torch.cuda.empty_cache()
    q, k, v = sets[0][:3]
    rows[0]["explain"] = autoflash.explain(q, k, v, causal=p.causal, **variants)
    rows[0]["graphs_by_round"] = plans_did
    return rows


def timing_sets(p: Problem, device: torch.device, direction: str) -> list[tuple]:
    """Random input sets of `p`, (q, k, v) or, for the backward, (q, k, v, dout), enough of them that together they
    span twice the L2 cache (timing.input_sets)."""
    per_set = p.element_size * p.head_dim * p.batch * 2 * (p.heads_q * p.seqlen_q + p.heads_kv * p.seqlen_k)
    return [p.random_inputs(device, seed, with_dout=direction == "bwd")
            for seed in range(input_sets(per_set * (2 if direction == "bwd" else 1), device))]


def pass_ms(fn, direction: str, sets: list, device: torch.device, **timing) -> float:
    """Median ms of one forward `fn(q, k, v)` over `sets`, or of its backward alone (timing.backward_ms)."""
    if direction == "fwd":
        return median_ms(lambda i: fn(*sets[i][:3]), len(sets), device, **timing)
    return backward_ms(fn, sets, device, **timing)


def _guarded(call, name: str, errors: dict):
    """call(), or None with the error recorded under `name`."""
    try:
        return call()
    except Exception as e:
        errors[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        return None


def precompile(problems: list[Problem], direction: str, workers: int) -> None:
    """Run each problem's kernels once in `workers` processes at a time, so that the timed run finds
    them compiled in Triton's disk cache instead of compiling one after another."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        pool.starmap(_run_once, [(p, direction) for p in problems])


def _run_once(p: Problem, direction: str) -> None:
    inputs = p.random_inputs(torch.device("cuda"), 0, with_dout=direction == "bwd")
    variants = variant_kwargs(p, torch.device("cuda"))
    if direction == "fwd":
        autoflash.attention(*inputs, causal=p.causal, **variants)
    else:
        q, k, v, dout = inputs
        autoflash.attention(q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), causal=p.causal,
                            **variants).backward(dout)
    torch.cuda.synchronize()


def plot(results: list[tuple[Problem, list[dict]]], path: str, direction: str = "fwd") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["backend"] for r in results[0][1]]
    fig, ax = plt.subplots(figsize=(max(8, len(results) * 0.7), 5))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        values = [next((r.get("tflops", 0) for r in rows if r["backend"] == name), 0) for _, rows in results]
        ax.bar([x + i * width for x in range(len(results))], values, width, label=name)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(results))])
    ax.set_xticklabels([p.label() for p, _ in results], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel(f"TFLOP/s ({'forward' if direction == 'fwd' else 'backward'})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def ratio_summary(ratios: list[tuple[float, str]]) -> str:
    """(speed ratio, problem label) pairs in one line: their geomean, the lowest (naming its problem) and the median."""
    ordered = sorted(ratios)
    geomean = math.exp(sum(math.log(r) for r, _ in ordered) / len(ordered))
    return (f"geomean {geomean:.3f}x over {len(ordered)}, lowest {ordered[0][0]:.2f}x ({ordered[0][1]}), "
            f"median {ordered[len(ordered) // 2][0]:.2f}x")
