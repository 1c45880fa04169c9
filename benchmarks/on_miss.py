"""Tune on first use, measured (issue 18): for problems nobody tuned, the first forward + backward call's wall time
under `configure(tune="on-miss", budget_s=...)` (the search of both directions is in it), and the speed of the
calls before (what dispatch falls back to) and after, beside plain SDPA, in one run. Each run records in a new
database of its own, so every problem starts untuned for this user.

    python benchmarks/on_miss.py [--budget-s 60] [--out rows.jsonl] [--db-dir DIR]

--db-dir keeps the user databases (user0.db, ...: every trial the searches timed) for reading afterwards.

The problems were chosen before any was measured: shapes of no problems file (`autoflash show` lists the
campaign), with head dims, head counts and lengths the campaign lacks.
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import autoflash
from autoflash import api, gpu as gpus
from autoflash.api import DISPATCHER
from autoflash.problem import Problem
from autoflash.reference import attention_reference, relative_error
from results_file import append_row
from variants import timed

PROBLEMS = [  # batch, heads_q, heads_kv, seqlen, head_dim, causal, dtype
    (2, 12, 4, 3000, 96, True, "bfloat16"),
    (1, 24, 24, 6000, 64, False, "float16"),
    (8, 20, 20, 700, 128, True, "bfloat16"),
]


def explained(q, k, v, causal, what: str) -> dict:
    """autoflash.explain's `what` line of each direction ("source": where dispatch takes its variant from;
    "on-miss": what tuning on first use did, its workers' start and search apart)."""
    lines = autoflash.explain(q, k, v, causal=causal).splitlines()
    return {line.split()[0]: line.split(":", 1)[1].strip() for line in lines if f" {what}:" in line}


def measure(problem: Problem, budget_s: float, db: Path) -> dict:
    q, k, v, dout = problem.random_inputs(torch.device("cuda"), 0, with_dout=True)
    causal = problem.causal

    def call(q, k, v):
        return autoflash.attention(q, k, v, causal=causal)

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)

    autoflash.configure(tune="off", db=db)
    for direction in ("fwd", "bwd"):  # the records an earlier problem's search left are not this user's
        DISPATCHER.forget(gpus.current(q.device).family, direction)
    api._plans.clear()  # a call signature keeps its first variant: each phase starts from a new plan
    before = timed(call, q, k, v, dout), explained(q, k, v, causal, "source")
    autoflash.configure(tune="on-miss", budget_s=budget_s)
    api._plans.clear()
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = call(qg, kg, vg)
    out.backward(dout)
    torch.cuda.synchronize()
    first_s = time.perf_counter() - start
    on_miss = explained(q, k, v, causal, "on-miss")
    after = timed(call, q, k, v, dout), explained(q, k, v, causal, "source")
    base = timed(sdpa, q, k, v, dout)
    error = relative_error(out, attention_reference(q, k, v, causal)[0])
    row = dict(problem=problem.key(), budget_s=budget_s, first_call_s=round(first_s, 2), error_vs_fp64=error,
               sdpa_fwd_ms=base[0], sdpa_bwd_ms=base[1], on_miss=on_miss)
    for phase, ((fwd_ms, bwd_ms), source) in (("fallback", before), ("tuned", after)):
        row[phase] = dict(fwd_ms=fwd_ms, bwd_ms=bwd_ms, fwd_vs_sdpa=base[0] / fwd_ms, bwd_vs_sdpa=base[1] / bwd_ms,
                          source=source)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=60.0, help="search seconds a problem and direction")
    parser.add_argument("--out", help="append a JSON line per problem to this file")
    parser.add_argument("--db-dir", help="keep the user databases here (default: a temporary folder)")
    args = parser.parse_args()
    meta = dict(gpu=torch.cuda.get_device_name())
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.db_dir or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for i, (b, hq, hkv, s, d, causal, dtype) in enumerate(PROBLEMS):
            row = measure(Problem(b, hq, hkv, s, s, d, causal, dtype), args.budget_s, folder / f"user{i}.db")
            print(json.dumps(row), flush=True)
            append_row(args.out, dict(row, **meta))


if __name__ == "__main__":
    main()
