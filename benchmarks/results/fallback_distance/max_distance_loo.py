"""Leave-one-out with dispatch.MAX_DISTANCE at several values (past it: the heuristic default), on the shipped
databases: `python benchmarks/results/fallback_distance/max_distance_loo.py` (NOTES 104)."""
import statistics, sys
ROOT = __import__("pathlib").Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks")); sys.path.insert(0, str(ROOT))
import leave_one_out as loo
from autoflash import dispatch, families
from autoflash.dispatch import Record, choose
from autoflash.gpu import KNOWN

def run(db, gpu_name, direction):
    gpu = KNOWN[gpu_name]
    times = loo.timed(db, gpu_name, direction)
    best = {p: min(t.items(), key=lambda item: item[1]) for p, t in times.items()}
    per = []
    for problem in times:
        others = [Record(p, families.knobs_from_json(direction, k), ms, 0.0) for p, (k, ms) in best.items() if p != problem]
        dispatch.MAX_DISTANCE = 1e9
        chosen = choose(problem, gpu, [("loo", others)], direction)
        d = float(chosen.reason.split("distance ")[1].rstrip(")")) if "distance" in chosen.reason else None
        knobs = families.of(chosen.knobs).fit(chosen.knobs, problem, gpu) or chosen.knobs
        near_ms = times[problem].get(knobs.to_json())
        default = families.default_knobs(problem, gpu, direction)
        default_ms = times[problem].get(default.to_json())
        if near_ms and default_ms and d is not None:
            per.append((d, best[problem][1] / near_ms, best[problem][1] / default_ms))
    print(f"{gpu_name} {direction}: {len(per)} problems with both timed")
    for T in (1, 2, 3, 4, 5, 6, 8, 1e9):
        f = sorted(n if d <= T else df for d, n, df in per)
        p10 = statistics.quantiles(f, n=10, method="inclusive")[0]
        print(f"  T={T:g}: median {statistics.median(f):.3f} p10 {p10:.3f} min {f[0]:.3f} geomean {statistics.geometric_mean(f):.4f}")
    for lo, hi in ((0, 2), (2, 4), (4, 6), (6, 8), (8, 99)):
        sel = [(n, df) for d, n, df in per if lo < d <= hi]
        if sel:
            print(f"  distance ({lo},{hi}]: {len(sel)}: nearest geomean {statistics.geometric_mean([n for n,_ in sel]):.3f}, default {statistics.geometric_mean([df for _,df in sel]):.3f}; nearest better {sum(n>df*1.02 for n,df in sel)}, worse {sum(n<df/1.02 for n,df in sel)}")

for g in ("h100", "h200"):
    for direction in ("fwd", "bwd"):
        run(str(ROOT / "tuning_db" / f"{g}.db"), g, direction)
