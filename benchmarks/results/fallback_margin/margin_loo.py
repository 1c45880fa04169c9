"""NOTES 89 (session 28, no GPU): leave one out (benchmarks/leave_one_out.py) with a margin rule in the fallback:
run the heuristic default instead of the nearest tuned problem's winner where that problem's own default was
timed within `m` of its best. Run from the checkout's root:
    python benchmarks/results/fallback_margin/margin_loo.py
"""
import sys
sys.path.insert(0, "benchmarks")
from leave_one_out import timed, summary
from autoflash import families
from autoflash.dispatch import Record, choose
from autoflash.gpu import KNOWN

def run(db, gpu_name, direction, margins):
    gpu = KNOWN[gpu_name]
    times = timed(db, gpu_name, direction)
    best = {p: min(t.items(), key=lambda i: i[1]) for p, t in times.items()}
    out = {m: [] for m in margins}
    for problem in times:
        others = sorted((Record(p, families.knobs_from_json(direction, k), ms, 0.0)
                         for p, (k, ms) in best.items() if p != problem), key=lambda r: r.median_ms)
        chosen = choose(problem, gpu, [("loo", others)], direction)
        knobs = families.of(chosen.knobs).fit(chosen.knobs, problem, gpu) or chosen.knobs
        default = families.default_knobs(problem, gpu, direction)
        nd_frac = None
        if chosen.tuned is not None:
            n = chosen.tuned.problem
            nd = times[n].get(families.default_knobs(n, gpu, direction).to_json())
            nd_frac = None if nd is None else best[n][1] / nd
        for m in margins:
            use_default = chosen.tuned is None or (nd_frac is not None and nd_frac >= 1 - m)
            k = default if use_default else knobs
            ms = times[problem].get(k.to_json())
            out[m].append(None if ms is None else best[problem][1] / ms)
    for m in margins:
        both = [(a, b) for a, b in zip(out[-1.0], out[m]) if a is not None and b is not None]
        worse = sorted(b / a for a, b in both if b < a)
        better = sorted(b / a for a, b in both if b > a)
        print(direction, f"margin {m:.2f}", summary(out[m]), f"| on {len(both)} both timed: current",
              summary([a for a, _ in both]).split(':', 1)[1], "| margin", summary([b for _, b in both]).split(':', 1)[1],
              f"| {len(better)} better, {len(worse)} worse (worst {worse[0] if worse else 1:.3f})")

for db, g in (("tuning_db/h100.db", "h100"), ("tuning_db/h200.db", "h200")):
    for d in ("fwd", "bwd"):
        run(db, g, d, [-1.0, 0.02, 0.03, 0.05])
