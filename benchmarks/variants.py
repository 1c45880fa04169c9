"""Issue 16's variants beside plain attention and FlexAttention, one GPU: forward and backward times of
autoflash.attention (its database's kernel for the problem, else the heuristic default), of FlexAttention
(torch.compile'd, the same variant as score_mod / block mask) and, for the plain cases, of plain SDPA (no backend
forced), all in one run; TFLOP/s count only the pairs that attend (`Problem.flops`). A line of JSON per case.

    python benchmarks/variants.py --seqlen 32768 --heads 32/8 --head-dim 128 --out variants.jsonl
"""

import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from triton.testing import do_bench

import autoflash
from autoflash.problem import Problem
from autoflash.tune.trial import TUNING_SOFTCAP, variant_kwargs

CASES = {  # name -> (causal, the problem's variant fields: Problem.with_variants)
    "causal": (True, dict()),
    "causal window 4096": (True, dict(window_size=(4096, -1))),
    "causal softcap": (True, dict(softcap=True)),
    "causal alibi": (True, dict(alibi=True)),
    "full": (False, dict()),
    "full softcap": (False, dict(softcap=True)),
}

torch._dynamo.config.recompile_limit = 64  # one compile per case and grad mode: past the default 8, dynamo would
_flex = torch.compile(flex_attention, dynamic=False)  # fall back to eager flex_attention, which holds all scores


def flex_call(problem: Problem, kwargs: dict, device):
    """FlexAttention computing `problem`'s attention: (q, k, v) -> out."""
    lowest, highest = problem.bounds()  # of j - (i + offset): the keys a query sees
    offset = problem.seqlen_k - problem.seqlen_q  # bottom-right aligned, as flash-attn and autoflash

    def mask_mod(b, h, i, j):
        seen = j >= 0
        if lowest is not None:
            seen = seen & (j - i - offset >= lowest)
        if highest is not None:
            seen = seen & (j - i - offset <= highest)
        return seen

    slopes = kwargs["alibi_slopes"]

    def score_mod(score, b, h, i, j):
        if problem.softcap:
            score = TUNING_SOFTCAP * torch.tanh(score / TUNING_SOFTCAP)
        if slopes is not None:
            score = score - slopes[h] * (i + offset - j).abs()
        return score

    masked = lowest is not None or highest is not None
    block_mask = create_block_mask(mask_mod, None, None, problem.seqlen_q, problem.seqlen_k, device=device) \
        if masked else None
    plain = not (problem.softcap or slopes is not None)
    return lambda q, k, v: _flex(q, k, v, score_mod=None if plain else score_mod, block_mask=block_mask,
                                 enable_gqa=problem.heads_q != problem.heads_kv)


def timed(fn, q, k, v, dout):
    """(forward ms, backward ms) of fn(q, k, v)."""
    fwd_ms = do_bench(lambda: fn(q, k, v))
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    both_ms = do_bench(lambda: fn(qg, kg, vg).backward(dout), grad_to_none=[qg, kg, vg])
    return fwd_ms, both_ms - fwd_ms


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqlen", type=int, default=32768)
    parser.add_argument("--heads", default="32/8")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--cases", help="comma-separated names of CASES to run (default: all)")
    parser.add_argument("--out", help="append a JSON line per measurement to this file")
    args = parser.parse_args()
    heads_q, heads_kv = (int(h) for h in args.heads.split("/"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(args.batch, heads_q, args.seqlen, args.head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(args.batch, heads_kv, args.seqlen, args.head_dim, device="cuda", dtype=torch.bfloat16,
                        generator=gen) for _ in range(2))
    dout = torch.randn_like(q)
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=__import__("triton").__version__,
                command="python benchmarks/variants.py " + " ".join(f"--{n.replace('_', '-')} {a}"
                                                                    for n, a in vars(args).items() if n != "out"))
    for name, (causal, fields) in CASES.items():
        if args.cases and name not in args.cases.split(","):
            continue
        problem = Problem.from_tensors(q, k, causal).with_variants(**fields)
        kwargs = dict(variant_kwargs(problem, q.device), causal=causal)
        impls = {"autoflash": lambda q, k, v: autoflash.attention(q, k, v, **kwargs),
                 "flex": flex_call(problem, kwargs, q.device)}
        if not (problem.gates() or fields):
            impls["sdpa"] = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        for impl, fn in impls.items():
            try:
                fwd_ms, bwd_ms = timed(fn, q, k, v, dout)
            except Exception as error:  # one backend's failure is recorded, the others still run
                row = dict(case=name, impl=impl, error=f"{type(error).__name__}: {str(error)[:300]}")
            else:
                row = dict(case=name, impl=impl, problem=problem.key(), fwd_ms=round(fwd_ms, 4),
                           bwd_ms=round(bwd_ms, 4), fwd_tflops=round(problem.flops("fwd") / fwd_ms * 1e-9, 1),
                           bwd_tflops=round(problem.flops("bwd") / bwd_ms * 1e-9, 1))
            print(json.dumps(row), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(dict(row, **meta)) + "\n")


if __name__ == "__main__":
    main()
