"""Forward attention speed: autoflash beside PyTorch SDPA's backends, measured in one run.

    python benchmarks/bench_fwd.py --problems headline --out benchmarks/results/fwd.jsonl
    python benchmarks/bench_fwd.py --problems fa-grid --sweep

Each problem is timed with triton.testing.do_bench (median of many runs after warm-up) on fresh
normal inputs; TFLOP/s use the FlashAttention-paper count (causal = half). `--sweep` also times
a grid of variants around the default and reports the fastest. Results go out as JSON lines
naming the GPU, the versions and the command.
"""

import argparse
import datetime
import itertools
import json
import platform
import sys
from dataclasses import replace

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention

import autoflash
from autoflash import codegen, gpu as gpus
from autoflash.api import _choice_for
from autoflash.knobs import FwdKnobs, violations
from autoflash.problem import Problem

SDPA_BACKENDS = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
                 "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION}


def problem_sets(name: str, dtype: str) -> list[Problem]:
    """headline: d128, 16k tokens, 16 heads. fa-grid: the FlashAttention paper's grid at 16k tokens."""
    if name == "headline":
        return [Problem(1, 16, 16, 16384, 16384, 128, False, dtype)]
    if name == "fa-grid":
        return [Problem(16384 // s, 2048 // d, 2048 // d, s, s, d, causal, dtype)
                for d in (64, 128) for causal in (False, True) for s in (512, 1024, 2048, 4096, 8192, 16384)]
    raise SystemExit(f"unknown problem set {name!r}: use headline or fa-grid")


def inputs(p: Problem):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(p.batch, p.heads_q, p.seqlen_q, p.head_dim, device="cuda", dtype=p.torch_dtype, generator=gen)
    k = torch.randn(p.batch, p.heads_kv, p.seqlen_k, p.head_dim, device="cuda", dtype=p.torch_dtype, generator=gen)
    v = torch.randn_like(k)
    return q, k, v


def time_ms(fn) -> float:
    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")


def sdpa_runner(backend, q, k, v, causal):
    gqa = q.shape[1] != k.shape[1]

    def run():
        with sdpa_kernel(backend):
            return scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    return run


def sweep_knobs(base: FwdKnobs):
    for block_m, block_n, warps, stages, loads in itertools.product(
            (64, 128), (64, 128), (4, 8), (2, 3, 4), ("pointer", "tma")):
        yield replace(base, block_m=block_m, block_n=block_n, num_warps=warps, num_stages=stages, loads=loads)


def measure(p: Problem, sweep: bool) -> list[dict]:
    q, k, v = inputs(p)
    gpu = gpus.current(q.device)
    rows = []

    def record(name, fn, **extra):
        try:
            ms = time_ms(fn)
            rows.append(dict(backend=name, ms=ms, tflops=p.fwd_flops() / ms * 1e-9, **extra))
        except Exception as e:  # a backend that refuses the shape is recorded, not fatal
            rows.append(dict(backend=name, error=f"{type(e).__name__}: {str(e)[:200]}", **extra))

    default = _choice_for(p, gpu, True).knobs
    record("autoflash", lambda: autoflash.attention(q, k, v, causal=p.causal), knobs=default.to_json())
    for name, backend in SDPA_BACKENDS.items():
        record(name, sdpa_runner(backend, q, k, v, p.causal))
    if sweep:
        out = torch.empty_like(q)
        for knobs in sweep_knobs(default):
            if not violations(knobs, p, gpu):
                forward = codegen.load(knobs).forward
                record("autoflash_variant", lambda: forward(q, k, v, out, None, p.head_dim ** -0.5, p.causal),
                       knobs=knobs.to_json())
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", default="headline", help="headline or fa-grid")
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    parser.add_argument("--sweep", action="store_true", help="also time a grid of variants around the default")
    parser.add_argument("--out", help="append JSON lines here")
    args = parser.parse_args()
    context = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                   autoflash=autoflash.__version__, template=codegen.template_fingerprint(),
                   host=platform.node(), date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   command="python " + " ".join(sys.argv))
    print(f"{'problem':<44} {'backend':<18} {'ms':>8} {'TFLOP/s':>8}  knobs")
    for p in problem_sets(args.problems, args.dtype):
        rows = measure(p, args.sweep)
        best_variant = max((r for r in rows if r["backend"] == "autoflash_variant" and "ms" in r),
                           key=lambda r: r["tflops"], default=None)
        for r in rows:
            r.update(context, problem=p.__dict__)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(r) + "\n")
            if r["backend"] != "autoflash_variant" or r is best_variant:
                label = f"b{p.batch} h{p.heads_q}/{p.heads_kv} s{p.seqlen_q}/{p.seqlen_k} d{p.head_dim}" \
                        f"{' causal' if p.causal else ''}"
                speed = f"{r['ms']:8.3f} {r['tflops']:8.1f}" if "ms" in r else f"{'error':>17}  {r['error'][:60]}"
                print(f"{label:<44} {r['backend']:<18} {speed}  {r.get('knobs', '')}", flush=True)


if __name__ == "__main__":
    main()
