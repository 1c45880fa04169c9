"""Check and time the Gluon backward on the GPU beside torch's SDPA backends and the `tl` backward, without
autoflash's dispatcher (its tuned records and defaults are timed as they are, not as dispatch picks them).

Run from the checkout:
    python benchmarks/gluon_bwd.py --check            # correctness sweep against the fp64 reference gradients
    python benchmarks/gluon_bwd.py --bench fa_grid --variants '["default", {"num_buffers": 3}]' --out rows.jsonl
    python benchmarks/gluon_bwd.py --bench fa_grid --variants '[{"family": "tl", "block_m": 32}]'  # tl points too

The backward times are of the kernels alone (a plan per problem, out and lse from autoflash's forward) for gluon
and for the variant autoflash dispatches today (tl's tuned records); SDPA's (plain: cuDNN on the H100; cuDNN
forced; FA2) are of torch.autograd.grad after a kept forward, as autoflash.bench times them, so they carry
autograd's few microseconds more.
"""

import argparse
import json
import math
import sys
from pathlib import Path

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]
import autoflash  # noqa: E402
from autoflash import codegen, families  # noqa: E402
from autoflash.api import DISPATCHER  # noqa: E402
from autoflash.families.gluon.defaults import default_knobs  # noqa: E402
from autoflash.families.gluon.knobs import BwdKnobs  # noqa: E402
from autoflash.gpu import current  # noqa: E402
from autoflash.problem import Problem  # noqa: E402
from autoflash.reference import (GRAD_TOLERANCE, attention_backward_reference, attention_reference,  # noqa: E402
                                 gradient_errors, sdpa_attention)
from autoflash.tune.timing import backward_ms, median_ms  # noqa: E402
from gluon_fwd import fa_grid  # noqa: E402  (the forward's grid: NOTES G2, 40)
from helpers import make_qkv  # noqa: E402

# Head dims past 128 (odd_shapes.yaml's d256 cells, 16k-32k tokens): (batch, heads, seqlen, head_dim, causal, dtype).
WIDE = [(b, h, s, d, causal, dtype) for b, h, s in ((4, 8, 4096), (1, 16, 16384)) for d in (160, 192, 256)
        for causal in (False, True) for dtype in (torch.float16, torch.bfloat16)]
# The head dims the backward splits into two column tiles (NOTES G-bwd23): bf16, 16 heads, 16k tokens at 1k and 4k
# a sequence.
SPLIT = [(16384 // s, 16, s, d, causal, torch.bfloat16) for s in (1024, 4096) for d in (160, 192)
         for causal in (False, True)]
# Past head dim 128 in one padded tile (200-256), where shared_scores computes S^T and dP^T once a step (NOTES
# G-bwd24): bf16, 16 heads, 16k tokens at 1k and 4k a sequence; Gemma-2's GQA 2:1, causal.
PADDED = [(16384 // s, 16, s, d, causal, torch.bfloat16) for s in (1024, 4096) for d in (224, 256)
          for causal in (False, True)] + [(2, 16, 4096, 256, True, torch.bfloat16, 8)]
# Grouped-query causal backward (bwd_spread.yaml's rows): (batch, heads_q, seqlen, head_dim, causal, dtype, heads_kv).
GQA_CAUSAL = [(4, 32, 4096, d, True, torch.bfloat16, 4) for d in (64, 128, 256)] + [
    (1, 8, 8192, 128, True, torch.bfloat16, 8), (1, 32, 32768, 128, True, torch.bfloat16, 8)]
LENGTHS = ((1, 1), (7, 7), (123, 123), (1000, 1000), (4097, 4097), (123, 1000), (1000, 123), (7, 4097))


def gradients(knobs, q, k, v, out, lse, dout, causal, scale, dlse=None):
    """(dq, dk, dv) of the `knobs` backward, poisoned with NaN first."""
    grads = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
    codegen.load(knobs).backward(q, k, v, out, lse, dout, *grads, scale, causal, dlse)
    return grads


def check_cases():
    """(knobs, b, hq, hkv, sq, sk, d, causal, dtype, transposed, with_dlse)."""
    cases = []
    for values in (dict(), dict(num_buffers=3), dict(warpgroups=1)):
        for sq, sk in LENGTHS:
            for causal in (False, True):
                cases.append((BwdKnobs(**values), 2, 4, 2, sq, sk, 128, causal, torch.float16, False, False))
    for values in (dict(block_m=128), dict(warpgroups=1, num_buffers=3)):
        for sq, sk in LENGTHS[2::2]:
            for causal in (False, True):
                cases.append((BwdKnobs(**values), 2, 4, 2, sq, sk, 64, causal, torch.float16, False, False))
    for d in (40, 64, 80, 96, 128, 192, 256):
        for causal in (False, True):
            for dtype, (b, hq, hkv, sq, sk) in ((torch.float16, (2, 8, 2, 1000, 1000)),
                                                (torch.bfloat16, (1, 4, 1, 123, 4097))):
                knobs = default_knobs(Problem(b, hq, hkv, sq, sk, d, causal, str(dtype)[6:]), current(), "bwd")
                cases.append((knobs, b, hq, hkv, sq, sk, d, causal, dtype, False, False))
    for causal in (False, True):
        cases.append((BwdKnobs(), 2, 8, 2, 1000, 777, 128, causal, torch.bfloat16, True, True))
        cases.append((BwdKnobs(), 1, 8, 1, 4097, 4097, 128, causal, torch.float16, False, True))
    return cases


def check(cases):
    failures = 0
    for knobs, b, hq, hkv, sq, sk, d, causal, dtype, transposed, with_dlse in cases:
        q, k, v = make_qkv(b, hq, hkv, sq, sk, d, dtype, "cuda", transposed=transposed)
        scale = 0.7 / d ** 0.5
        out, lse = attention_reference(q, k, v, causal, scale)
        out, lse = out.to(dtype), lse.float()
        gen = torch.Generator(device="cpu").manual_seed(sq + sk)
        dout = torch.randn(q.shape, generator=gen).to(dtype=dtype, device="cuda")
        dlse = torch.randn(lse.shape, generator=gen).to("cuda") if with_dlse else None
        grads = gradients(knobs, q, k, v, out, lse, dout, causal, scale, dlse)
        refs = attention_backward_reference(q, k, v, dout, causal, scale, dlse=dlse)
        errors = gradient_errors(grads, refs)
        ok = all(err < GRAD_TOLERANCE[dtype] for err in errors) and not any(math.isnan(err) for err in errors)
        failures += not ok
        point = {name: value for name, value in knobs.as_point().items() if name != "family"}
        print(f"{'ok  ' if ok else 'FAIL'} {point} b{b} h{hq}/{hkv} s{sq}/{sk} d{d} {'causal' if causal else 'full'}"
              f" {str(dtype)[6:]}{' bshd' if transposed else ''}{' dlse' if with_dlse else ''}: "
              + " ".join(f"{name} {err:.2e}" for name, err in zip(("dq", "dk", "dv"), errors)), flush=True)
    return failures


def _sdpa(backend, causal):
    def run(q, k, v):
        if backend is None:
            return sdpa_attention(q, k, v, causal)
        with sdpa_kernel(backend):
            return sdpa_attention(q, k, v, causal)
    return run


def bench(problems, variants, out_path, command):
    """Time each problem's backward, appending its rows to out_path (JSON lines)."""
    rows = []
    device = torch.device("cuda")
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__, command=command)
    for b, h, s, d, causal, dtype, *kv_heads in problems:
        problem = Problem(b, h, (kv_heads or [h])[0], s, s, d, causal, str(dtype)[6:])
        q, k, v, dout = problem.random_inputs(device, 0, with_dout=True)
        out, lse = autoflash.attention(q, k, v, causal=causal, return_lse=True)
        flops = problem.flops("bwd")
        label = f"b{b} h{problem.heads_q}/{problem.heads_kv} s{s} d{d}{' causal' if causal else ''} {str(dtype)[6:]}"
        line = []

        def record(backend, ms, **extra):
            rows.append(dict(meta, problem=label, backend=backend, ms=ms, tflops=flops / ms * 1e-9, **extra))
            line.append(f"{backend} {flops / ms * 1e-9:.0f}")

        for name, backend in (("sdpa", None), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
            record(name, backward_ms(_sdpa(backend, causal), [(q, k, v, dout)], device))
        base = rows[-3]["ms"]
        grads = tuple(torch.empty_like(t) for t in (q, k, v))
        tuned = DISPATCHER.choice(problem, current(), "bwd").knobs  # what autoflash runs today (tl's tuned records)
        changed = [(_name(change), _knobs(change, problem, tuned)) for change in variants]
        timed = set()
        for name, knobs in [(f"autoflash {tuned.family}", tuned)] + changed:
            if knobs is None or knobs in timed:  # cannot run the problem, or a change its default already has
                continue
            timed.add(knobs)
            plan = codegen.load(knobs).backward_plan(q, k, v, out, lse, dout, *grads, d ** -0.5, causal, None)
            ms = median_ms(lambda i: plan(q, k, v, out, lse, dout, *grads, None), 1, device)
            record(name, ms, knobs=knobs.as_point(), vs_sdpa=base / ms)
            line[-1] += f" ({base / ms:.2f}x)"
        with open(out_path, "a") as f:  # each problem's rows as they come: a run cut short keeps what it timed
            f.writelines(json.dumps(row) + "\n" for row in rows[-len(line):])
        print(f"{label:28s} " + " | ".join(line), flush=True)


def _name(change) -> str:
    return "gluon default" if change == "default" else f"{change.get('family', 'gluon')} {json.dumps(change)}"


def _knobs(change, problem, tuned):
    """The Gluon family's default for the problem (change "default"), or it with these knobs changed; a change
    naming {"family": "tl"} changes the dispatched tl knobs instead. None where the result cannot run the problem."""
    if change != "default" and change.get("family") == "tl":
        if tuned.family != "tl":
            return None
        knobs = type(tuned)(**tuned.as_point() | change)
    else:
        knobs = default_knobs(problem, current(), "bwd")
        if change == "default" or knobs is None:
            return knobs
        knobs = BwdKnobs(**knobs.as_point() | change)
    return None if families.violations(knobs, problem, current()) else knobs


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--every", type=int, default=1, help="check every n-th case only")
    parser.add_argument("--bench", choices=["fa_grid", "fa_grid_fp16", "causal", "gqa_causal", "short",
                                                         "d64", "d128", "wide", "split", "padded"])
    parser.add_argument("--variants", default='["default"]')
    parser.add_argument("--out", default="gluon_bwd_bench.jsonl")
    args = parser.parse_args()
    failures = check(check_cases()[::args.every]) if args.check else 0
    if args.bench:
        problems = {"fa_grid": fa_grid(), "fa_grid_fp16": fa_grid((torch.float16,)),
                    "causal": [p for p in fa_grid((torch.float16,)) if p[4]], "gqa_causal": GQA_CAUSAL,
                    "short": [p for p in fa_grid((torch.float16,)) if p[2] <= 2048],
                    "d64": [p for p in fa_grid((torch.float16,)) if p[3] == 64],
                    "d128": [p for p in fa_grid((torch.float16,)) if p[3] == 128],
                    "wide": WIDE, "split": SPLIT, "padded": PADDED}[args.bench]
        bench(problems, json.loads(args.variants), args.out, " ".join(sys.argv))
    print(f"{failures} failures")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
