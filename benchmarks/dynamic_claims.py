"""Which Gluon forward variants that claim tiles from the counter (`dynamic`) leave query rows unwritten (GPU;
NOTES 149). Each variant's plan is called three times on outputs poisoned with NaN; a row is one variant, head dim
and problem: per call the NaN rows, the (batch, head) pairs they are in and their row span, or the error against the
fp64 reference where none is NaN.

    python benchmarks/dynamic_claims.py --out results.jsonl
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from autoflash import codegen  # noqa: E402
from autoflash.families.gluon.knobs import FwdKnobs  # noqa: E402
from autoflash.reference import attention_reference  # noqa: E402
from helpers import make_qkv  # noqa: E402
from results_file import append_row  # noqa: E402

VARIANTS = {
    "pps1 c1 dyn q2": dict(consumers=1, dynamic=True, q_buffers=2),
    "pps2 c1 dyn q2": dict(consumers=1, programs_per_sm=2, dynamic=True, q_buffers=2),
    "pps1 c1 dyn q1": dict(consumers=1, dynamic=True),
    "pps2 c1 dyn q1": dict(consumers=1, programs_per_sm=2, dynamic=True),
    "pps1 c2 dyn q2": dict(dynamic=True, q_buffers=2),
    "pps2 c1 static q2": dict(consumers=1, programs_per_sm=2, q_buffers=2),
}
PROBLEMS = [(1000, 1000, True), (1000, 1000, False), (4097, 4097, True), (123, 1000, True)]  # seqlens, causal
CALLS = 3


def one_call(plan, q, k, v, out, lse, ref) -> dict:
    out.fill_(float("nan"))
    lse.fill_(float("nan"))
    plan(q, k, v, out, lse)
    torch.cuda.synchronize()
    nan = torch.isnan(out).any(-1)  # (batch, head, row)
    if not nan.any():
        return dict(nan_rows=0, err=((out.double() - ref).abs().max() / ref.abs().max()).item())
    where = nan.nonzero()
    return dict(nan_rows=int(nan.sum()), heads=sorted({(b, h) for b, h, _ in where.tolist()})[:8],
                row_span=[int(where[:, 2].min()), int(where[:, 2].max())])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="append JSON lines here")
    args = parser.parse_args()
    for name, knobs in VARIANTS.items():
        for head_dim in (64, 128):
            for seqlen_q, seqlen_k, causal in PROBLEMS:
                batch, heads = (4, 16) if seqlen_q <= 1000 else (2, 8)  # several tiles a program
                q, k, v = make_qkv(batch, heads, heads // 4, seqlen_q, seqlen_k, head_dim, torch.bfloat16, "cuda",
                                   seed=seqlen_q)
                ref, _ = attention_reference(q, k, v, causal)
                out, lse = torch.empty_like(q), torch.empty(q.shape[:3], device="cuda")
                variant = FwdKnobs(**knobs, **(dict(block_n=64) if head_dim > 64 else {}))
                plan = codegen.load(variant).forward_plan(q, k, v, out, lse, head_dim ** -0.5, causal)
                row = dict(gpu=torch.cuda.get_device_name(), variant=name, head_dim=head_dim, seqlen_q=seqlen_q,
                           seqlen_k=seqlen_k, causal=causal,
                           calls=[one_call(plan, q, k, v, out, lse, ref) for _ in range(CALLS)])
                print(row, flush=True)
                append_row(args.out, row)


if __name__ == "__main__":
    main()
