"""Time knob changes against each problem's best known forward variant, in one run on one GPU.

    python benchmarks/fwd_variants.py --shapes examples/fa_grid.yaml --db tuning_db/h100.db \
        --vary kv_splits=2 --vary loads=tma,num_warps=8 --out results.jsonl

For each problem: the base is its best variant in the database (the winner under the newest template
that has one, old templates included: the experiment asks whether a new knob value beats it), else the
default. Each --vary sets knobs on the base; every variant is compiled, checked against the reference
and timed by the tuner's workers (compiles in parallel), and a row per variant says its TFLOP/s and
its ratio to the base measured in the same run.
"""

import argparse
import datetime
import json
import sys
from dataclasses import replace

import torch
import triton

import autoflash
from autoflash import gpu as gpus
from autoflash.db.store import Store
from autoflash.families import default_knobs, violations
from autoflash.shapes import load_problems
from autoflash.tune.runner import Runner
from autoflash.tune.tuner import earlier_best


def override(text: str, knobs_class) -> dict:
    """'loads=tma,warp_specialize=true' -> {'loads': 'tma', 'warp_specialize': True}, typed by the knobs."""
    types = {name: type(choices[0]) for name, choices in knobs_class.choices().items()}
    pairs = dict(item.split("=", 1) for item in text.split(","))
    return {name: (value.lower() == "true") if types[name] is bool else types[name](value)
            for name, value in pairs.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", required=True)
    parser.add_argument("--db", required=True, help="database holding the base variants (URL or SQLite file)")
    parser.add_argument("--vary", action="append", default=[], help="knob=value[,knob=value]; repeatable")
    parser.add_argument("--out")
    args = parser.parse_args()
    gpu, store = gpus.current(), Store(args.db, readonly=True)
    common = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                  autoflash=autoflash.__version__, command="python " + " ".join(sys.argv),
                  date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    rows = []
    with Runner(interpret=False) as runner:
        for problem in load_problems(args.shapes):
            known = earlier_best(store, gpu, problem)
            base = known[0] if known else default_knobs(problem, gpu)
            changes = [override(text, type(base)) for text in args.vary]
            variants = [base] + [v for v in dict.fromkeys(replace(base, **c) for c in changes)
                                 if v != base and not violations(v, problem, gpu)]
            outcomes = runner.run(problem, variants)
            base_ms = outcomes[0].median_ms
            for knobs, outcome in zip(variants, outcomes):
                ms = outcome.median_ms
                row = dict(problem=problem.label(), knobs=json.loads(knobs.to_json()), status=outcome.status, ms=ms,
                           tflops=problem.flops("fwd") / ms * 1e-9 if ms else None,
                           vs_base=base_ms / ms if ms and base_ms else None,
                           error=(outcome.error or "")[-300:] or None, **common)
                rows.append(row)
                changed = {k: v for k, v in row["knobs"].items() if getattr(base, k) != v} or "base"
                speed = f"{row['tflops']:7.1f} TFLOP/s {row['vs_base'] or 0:5.3f}x" if ms else outcome.status
                print(f"{problem.label():<34} {speed}  {changed}", flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)


if __name__ == "__main__":
    main()
