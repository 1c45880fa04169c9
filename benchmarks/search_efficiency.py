"""How many TPE trials reach within 3% of the exhaustive best? Runs on the CPU, from a database
that holds an exhaustive grid (`autoflash tune --sampler grid`): every point TPE proposes is
answered from the recorded timings, so the count measures the search, not the timing noise.

    python benchmarks/search_efficiency.py --db sqlite:///benchmarks/results/2026-11-22_h100_exhaustive_grid.db \
        --gpu h100 --shapes examples/search_efficiency.yaml --out benchmarks/results/search_efficiency.jsonl
"""

import argparse
import json
import statistics
import sys

from autoflash import codegen
from autoflash.db.store import Store
from autoflash.families.tl.knobs import FwdKnobs
from autoflash.shapes import load_problems
from autoflash.tune.search import restricted_space, search


class Reached(Exception):
    pass


def trials_to_reach(timings: dict[str, float | None], seed: int, within: float, batch_size: int) -> int:
    """Trials (in proposal order, batches as the tuner runs them) until one is within `within` of the best."""
    best = min(ms for ms in timings.values() if ms is not None)
    order = []

    def evaluate(points):
        costs = [timings[FwdKnobs(**p).to_json()] for p in points]
        for ms in costs:
            order.append(ms)
            if ms is not None and ms <= best * (1 + within):
                raise Reached
        return costs

    def is_valid(point):
        return FwdKnobs(**point).to_json() in timings

    try:
        search(restricted_space(FwdKnobs.search_space(), is_valid), evaluate, study_name=f"efficiency-{seed}",
               sampler="tpe", seed=seed, n_trials=len(timings), is_valid=is_valid,
               batch_size=batch_size)
    except Reached:
        return len(order)
    return len(timings)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", required=True)
    parser.add_argument("--gpu", required=True, help="GPU family the grid was tuned on")
    parser.add_argument("--shapes", required=True)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--within", type=float, default=0.03)
    parser.add_argument("--batch-size", type=int, default=15, help="as the tuner on a 16-core machine")
    parser.add_argument("--out")
    args = parser.parse_args()
    store = Store(args.db)
    print(f"{'problem':<32} {'grid':>5} {'best ms':>8}  TPE trials to within {args.within:.0%} (seeds)  median  share")
    for problem in load_problems(args.shapes):
        done = store.finished(args.gpu, problem, codegen.template_fingerprint("tl"))
        timings = {k: t.median_ms if t.status == "ok" else None for k, t in done.items()}
        if not timings:
            sys.exit(f"no grid for {problem.label()} in {args.db}")
        counts = [trials_to_reach(timings, seed, args.within, args.batch_size) for seed in range(args.seeds)]
        median = statistics.median(counts)
        row = dict(problem=problem.__dict__, gpu=args.gpu, grid_trials=len(timings),
                   best_ms=min(ms for ms in timings.values() if ms is not None), tpe_trials=counts,
                   median=median, share=median / len(timings), within=args.within, batch_size=args.batch_size,
                   template=codegen.template_fingerprint("tl"), command="python " + " ".join(sys.argv))
        print(f"{problem.label():<32} {len(timings):>5} {row['best_ms']:8.4f}  {str(counts):<38} {median:6.0f}  "
              f"{row['share']:5.0%}")
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
