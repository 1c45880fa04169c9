"""Which Gluon forward variants that claim tiles from the counter (`dynamic`) leave query rows unwritten (GPU;
NOTES 149). Each variant's plan is called --calls times on outputs poisoned with NaN; a row is one variant, head dim
and problem, with per call: the NaN rows, the rows written wrong (a tile's rows written to another tile's place
would be), each kind's (batch, head) pairs and row span, the error against the fp64 reference over the rows written,
and the counter's value after the call (the kernel's last claim sets it back to 0: a launch that left it past 0
would start the next one's claims there, skipping tiles). --host-reset zeroes the counter before every call too:
rows that still go unwritten are lost within one launch.

    python benchmarks/dynamic_claims.py --out results.jsonl
    python benchmarks/dynamic_claims.py --only "pps2 c1 dyn" --head-dims 128 --calls 20 [--host-reset]
"""

import argparse
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from autoflash import codegen  # noqa: E402
from autoflash.families.gluon.knobs import FwdKnobs  # noqa: E402
from autoflash.reference import attention_reference  # noqa: E402
from autoflash.resources import launcher  # noqa: E402
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


def recording_counters(host_reset: bool) -> list:
    """The Gluon launcher's tile counters, as its plans hand them to each launch (zeroed first with `host_reset`):
    the list they are appended to, one a launch."""
    gluon = launcher("gluon")
    made, counter_maker = [], gluon._counter_maker

    def maker(q, dynamic):
        counter = counter_maker(q, dynamic)
        if not dynamic:  # (the kernel is handed q in its place, and reads nothing there)
            return counter

        def recorded():
            tensor = counter()
            if host_reset:
                tensor.zero_()
            made.append(tensor)
            return tensor
        return recorded
    gluon._counter_maker = maker
    return made


def one_call(plan, q, k, v, out, lse, ref, counters) -> dict:
    out.fill_(float("nan"))
    lse.fill_(float("nan"))
    launched = len(counters)
    plan(q, k, v, out, lse)
    torch.cuda.synchronize()
    after = int(counters[-1].item()) if len(counters) > launched else None  # (None: a static grid's)
    nan = torch.isnan(out).any(-1)  # (batch, head, row)
    # the error over the rows written: a tile whose rows went to another tile's place leaves those wrong, not NaN
    wrong = ((out.double() - ref).abs().amax(-1) > 1e-2 * ref.abs().max()) & ~nan
    row = dict(nan_rows=int(nan.sum()), wrong_rows=int(wrong.sum()), counter_after=after,
               err=((out.double() - ref).abs()[~nan].max() / ref.abs().max()).item())
    for kind, rows in (("nan", nan), ("wrong", wrong)):
        if rows.any():
            where = rows.nonzero()
            row |= {f"{kind}_heads": sorted({(b, h) for b, h, _ in where.tolist()})[:8],
                    f"{kind}_row_span": [int(where[:, 2].min()), int(where[:, 2].max())]}
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="append JSON lines here")
    parser.add_argument("--calls", type=int, default=3, help="calls of each plan")
    parser.add_argument("--only", default="", help="the variants whose names contain this")
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--host-reset", action="store_true", help="zero the counter before every call")
    args = parser.parse_args()
    counters = recording_counters(args.host_reset)
    for name, knobs in VARIANTS.items():
        if args.only not in name:
            continue
        for head_dim in map(int, args.head_dims.split(",")):
            for seqlen_q, seqlen_k, causal in PROBLEMS:
                batch, heads = (4, 16) if seqlen_q <= 1000 else (2, 8)  # several tiles a program
                q, k, v = make_qkv(batch, heads, heads // 4, seqlen_q, seqlen_k, head_dim, torch.bfloat16, "cuda",
                                   seed=seqlen_q)
                ref, _ = attention_reference(q, k, v, causal)
                out, lse = torch.empty_like(q), torch.empty(q.shape[:3], device="cuda")
                variant = FwdKnobs(**knobs, **(dict(block_n=64) if head_dim > 64 else {}))
                plan = codegen.load(variant).forward_plan(q, k, v, out, lse, head_dim ** -0.5, causal)
                row = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                           command=" ".join(sys.argv), variant=name, head_dim=head_dim, seqlen_q=seqlen_q,
                           seqlen_k=seqlen_k, causal=causal, host_reset=args.host_reset,
                           calls=[one_call(plan, q, k, v, out, lse, ref, counters) for _ in range(args.calls)])
                print(row, flush=True)
                append_row(args.out, row)


if __name__ == "__main__":
    main()
