"""Issue 16's variants beside plain attention, one GPU: forward and forward+backward times of autoflash.attention
(heuristic default kernels unless a database has the problem), as TFLOP/s counting only the pairs that attend
(`Problem.flops`). A line of JSON per case.

    python benchmarks/variants.py --seqlen 32768 --heads 32/8 --head-dim 128 > variants.jsonl
"""

import argparse
import json

import torch
from triton.testing import do_bench

import autoflash
from autoflash.problem import Problem
from autoflash.tune.trial import variant_kwargs

CASES = {  # name -> the problem's variant fields (Problem.with_variants)
    "causal": (True, dict()),
    "causal window 4096": (True, dict(window_size=(4096, -1))),
    "causal softcap": (True, dict(softcap=True)),
    "causal alibi": (True, dict(alibi=True)),
    "full": (False, dict()),
    "full softcap": (False, dict(softcap=True)),
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqlen", type=int, default=32768)
    parser.add_argument("--heads", default="32/8")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()
    heads_q, heads_kv = (int(h) for h in args.heads.split("/"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(args.batch, heads_q, args.seqlen, args.head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(args.batch, heads_kv, args.seqlen, args.head_dim, device="cuda", dtype=torch.bfloat16,
                        generator=gen) for _ in range(2))
    dout = torch.randn_like(q)
    for name, (causal, fields) in CASES.items():
        problem = Problem.from_tensors(q, k, causal).with_variants(**fields)
        kwargs = dict(variant_kwargs(problem, q.device), causal=causal)
        fwd_ms = do_bench(lambda: autoflash.attention(q, k, v, **kwargs))
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        both_ms = do_bench(lambda: autoflash.attention(qg, kg, vg, **kwargs).backward(dout), grad_to_none=[qg, kg, vg])
        bwd_ms = both_ms - fwd_ms
        print(json.dumps(dict(case=name, problem=problem.key(), fwd_ms=round(fwd_ms, 4), bwd_ms=round(bwd_ms, 4),
                              fwd_tflops=round(problem.flops("fwd") / fwd_ms * 1e-9, 1),
                              bwd_tflops=round(problem.flops("bwd") / bwd_ms * 1e-9, 1))), flush=True)


if __name__ == "__main__":
    main()
