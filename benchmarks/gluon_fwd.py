"""Check and time the Gluon forward on the GPU beside torch's SDPA, without autoflash's dispatcher.

Run from the checkout:
    python benchmarks/gluon_fwd.py --check            # correctness sweep against fp64
    python benchmarks/gluon_fwd.py --bench fa_grid --variants '[{}, {"pingpong": true}]' --out rows.jsonl
"""

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from autoflash.families.gluon.defaults import default_knobs  # noqa: E402
from autoflash.families.gluon.knobs import FwdKnobs  # noqa: E402
from autoflash.families.gluon.limits import violations  # noqa: E402
from autoflash.gpu import current  # noqa: E402
from autoflash.launch import compile_launch  # noqa: E402
from autoflash.problem import Problem  # noqa: E402
from autoflash.reference import TOLERANCE, attention_reference, relative_error, sdpa_attention  # noqa: E402
from autoflash.resources import launcher  # noqa: E402
from gluon_sm90 import DEFAULT, load  # noqa: E402

gluon_launch = launcher("gluon")

_modules = {}
D256 = dict(block_n=64, stage_o_in_q=True)  # shared memory: no room for a separate O tile


def module_for(knobs, tmp):
    key = json.dumps(knobs, sort_keys=True)
    if key not in _modules:
        _modules[key] = load(knobs, tmp)
    return _modules[key]


def run(knobs, tmp, q, k, v, causal, with_lse=True, compile=compile_launch, layout="bhsd"):
    """(out, lse) of the Gluon forward, outputs poisoned with NaN first."""
    out = torch.full_like(q, float("nan"))
    if layout == "bshd":  # (batch, seqlen, heads, dim) memory seen as (batch, heads, seqlen, dim)
        out = torch.full_like(q.transpose(1, 2), float("nan")).transpose(1, 2)
    lse = torch.full(q.shape[:3], float("nan"), device=q.device) if with_lse else None
    forward = gluon_launch.forward_plan(module_for(knobs, tmp), knobs, q, k, v, out, lse, q.shape[-1] ** -0.5,
                                        causal, compile=compile)
    forward(q, k, v, out, lse)
    return out, lse


def inputs(b, hq, hkv, sq, sk, d, dtype, layout="bhsd", seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def normal(h, s):
        if layout == "bshd":
            return torch.randn(b, s, h, d, generator=gen, device="cuda", dtype=dtype).transpose(1, 2)
        return torch.randn(b, h, s, d, generator=gen, device="cuda", dtype=dtype)
    return normal(hq, sq), normal(hkv, sk), normal(hkv, sk)


def check_cases():
    """(knob changes, b, hq, hkv, sq, sk, d, causal, dtype, layout); a change "l2_bytes" shrinks the launcher's
    L2 budget per run of heads (runs of 2 heads, the last one shorter)."""
    cases = []
    lengths = ((1, 1), (7, 7), (123, 123), (1000, 1000), (4097, 4097), (123, 1000), (1000, 123), (7, 4097))
    for knobs in ({}, dict(pingpong=True), dict(overlap=False), dict(consumers=1), dict(persistent=False),
                  dict(stage_o_in_q=True), dict(stage_o_in_q=True, num_buffers=3), dict(q_buffers=2),
                  dict(q_buffers=2, stage_o_in_q=True), dict(dynamic=True), dict(dynamic=True, q_buffers=2)):
        for sq, sk in lengths if not knobs else lengths[2::2]:
            for causal in (False, True):
                cases.append((knobs, 2, 4, 4, sq, sk, 128, causal, torch.float16, "bhsd"))
        for causal in (False, True):  # several tiles per program on a persistent grid
            cases.append((knobs, 4, 32, 8, 1000, 1000, 128, causal, torch.bfloat16, "bhsd"))
    for knobs in (dict(l2_bytes=1 << 20), dict(l2_bytes=1 << 20, persistent=False),
                  dict(l2_bytes=1 << 20, dynamic=True)):
        cases.append((knobs, 1, 5, 5, 1000, 1000, 128, True, torch.float16, "bhsd"))
    for causal in (False, True):
        cases.append((dict(consumers=3, consumer_regs=160), 4, 32, 8, 1000, 999, 64, causal, torch.float16, "bhsd"))
    for d in (64, 96, 40, 80, 256, 16):
        for causal in (False, True):
            change = D256 if d == 256 else {}
            cases.append((change, 2, 8, 2, 1000, 1000, d, causal, torch.float16, "bhsd"))
            cases.append((change, 1, 4, 1, 123, 4097, d, causal, torch.bfloat16, "bhsd"))
    for causal in (False, True):
        cases.append(({}, 2, 8, 2, 1000, 777, 128, causal, torch.bfloat16, "bshd"))
        cases.append(({}, 1, 8, 1, 4097, 4097, 128, causal, torch.float16, "bhsd"))
    return cases


def check(tmp, cases, compile=compile_launch):
    failures = 0
    for change, b, hq, hkv, sq, sk, d, causal, dtype, layout in cases:
        knobs = DEFAULT | {name: value for name, value in change.items() if name != "l2_bytes"}
        gluon_launch.L2_BYTES_PER_RUN = change.get("l2_bytes", 24 << 20)
        q, k, v = inputs(b, hq, hkv, sq, sk, d, dtype, layout)
        ref, ref_lse = attention_reference(q, k, v, causal=causal)
        out, lse = run(knobs, tmp, q, k, v, causal, layout=layout, compile=compile)
        torch.cuda.synchronize()
        err = relative_error(out, ref)
        both_inf = torch.isinf(ref_lse) & (lse == ref_lse)
        lse_err = torch.where(both_inf, 0.0, (lse.double() - ref_lse).abs()).max().item()
        ok = err <= TOLERANCE[dtype] and lse_err <= 1e-3 and not math.isnan(err) and not math.isnan(lse_err)
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {change} b{b} h{hq}/{hkv} s{sq}/{sk} d{d} {'causal' if causal else 'full'}"
              f" {str(dtype)[6:]} {layout}: out {err:.2e} lse {lse_err:.2e}", flush=True)
    return failures


def fa_grid(dtypes=(torch.float16, torch.bfloat16)):
    """(b, h, s, d, causal, dtype): batch x seqlen = 16k tokens, heads x d = 2048."""
    return [(16384 // s, 2048 // d, s, d, causal, dtype) for dtype in dtypes for d in (64, 128)
            for causal in (False, True) for s in (512, 1024, 2048, 4096, 8192, 16384)]


def head_dims():
    """(b, h, s, d, causal, bf16): the head dims a power of two pads most (40, 80, 96, 160, 192), 16 heads, 16k
    tokens at 1k and 4k a sequence, causal and full (NOTES G16: head_dim_split)."""
    return [(16384 // s, 16, s, d, causal, torch.bfloat16) for d in (40, 80, 96, 160, 192) for causal in (False, True)
            for s in (1024, 4096)]


def short_rows():
    """(b, h, s, d, causal, dtype): short full and causal problems of many programs (encoders, ViT, BERT), the
    H200's held-out forward rows under 0.85x plain SDPA among them (NOTES 145-147)."""
    fp16, bf16 = torch.float16, torch.bfloat16
    return [(64, 12, 197, 64, False, fp16), (32, 12, 512, 64, False, fp16), (64, 16, 256, 64, False, fp16),
            (32, 16, 257, 64, False, bf16), (16, 12, 1024, 64, True, fp16), (64, 16, 128, 64, False, fp16),
            (32, 16, 512, 128, False, bf16), (32, 32, 128, 128, True, bf16), (16, 16, 1024, 128, False, bf16)]


def bench(tmp, problems, variants, out_path, command):
    rows = []
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__, command=command)
    for b, h, s, d, causal, dtype in problems:
        q, k, v = inputs(b, h, h, s, s, d, dtype)
        flops = 4 * b * h * s * s * d / (2 if causal else 1)
        label = f"b{b} h{h} s{s} d{d}{' causal' if causal else ''} {str(dtype)[6:]}"
        line = []

        def record(backend, fn):
            ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
            rows.append(dict(meta, problem=label, backend=backend, ms=ms, tflops=flops / ms * 1e-9))
            line.append(f"{backend} {flops / ms * 1e-9:.0f}")
            return ms
        base = record("sdpa", lambda: sdpa_attention(q, k, v, causal))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            record("sdpa_flash", lambda: sdpa_attention(q, k, v, causal))
        for change in variants:
            if change != "default" and (d not in change.get("head_dims", [d]) or
                                        change.get("causal", causal) != causal):  # for some problems only
                continue
            if change == "default" or change.get("default"):  # the family's heuristic choice (and changes)
                knobs = default_knobs(Problem(b, h, h, s, s, d, causal, str(dtype)[6:]), current()).as_point()
                knobs |= {k: v for k, v in change.items() if k not in ("default", "head_dims", "causal")} \
                    if change != "default" else {}
                if violations(FwdKnobs(**knobs), Problem(b, h, h, s, s, d, causal, str(dtype)[6:]), current()):
                    continue
            else:
                knobs = DEFAULT | {k: v for k, v in change.items() if k not in ("head_dims", "causal")}
                knobs |= D256 if d == 256 else {}
            out = torch.empty_like(q)
            forward = gluon_launch.forward_plan(module_for(knobs, tmp), knobs, q, k, v, out, None, d ** -0.5, causal,
                                                compile=compile_launch)
            ms = record("gluon " + json.dumps(change, sort_keys=True), lambda: forward(q, k, v, out, None))
            rows[-1]["knobs"] = knobs
            rows[-1]["vs_sdpa"] = base / ms
            line[-1] += f" ({base / ms:.2f}x)"
        print(f"{label:28s} " + " | ".join(line), flush=True)
        with open(out_path, "a") as f:  # each problem's rows as it ends: a run cut short keeps them
            for row in rows[-len(line):]:
                f.write(json.dumps(row) + "\n")
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--plain-launch", action="store_true",
                        help="check through Triton's per-call launch (the launcher's compile=None) instead")
    parser.add_argument("--every", type=int, default=1, help="check every n-th case only")
    parser.add_argument("--repeat", type=int, default=1, help="time the problems this many times over")
    parser.add_argument("--bench", choices=["fa_grid", "fa_grid_fp16", "d128_16k", "short", "head_dims",
                                                         "short_rows"])
    parser.add_argument("--variants", default="[{}]")
    parser.add_argument("--out", default="gluon_bench.jsonl")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        compile = None if args.plain_launch else compile_launch
        failures = check(tmp, check_cases()[::args.every], compile) if args.check else 0
        if args.bench:
            problems = {"fa_grid": fa_grid(), "fa_grid_fp16": fa_grid((torch.float16,)),
                        "d128_16k": [(1, 16, 16384, 128, False, dtype) for dtype in (torch.float16, torch.bfloat16)],
                        "short": [p for p in fa_grid((torch.float16,)) if p[2] <= 2048],
                        "head_dims": head_dims(), "short_rows": short_rows()}[args.bench]
            bench(tmp, problems * args.repeat, json.loads(args.variants), args.out, " ".join(sys.argv))
    print(f"{failures} failures")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
