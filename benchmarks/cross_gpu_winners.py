"""Another GPU's winner of the same problem, run here: how close to this GPU's best, beside the heuristic default.

For each problem both shipped databases tuned (the same templates), the fraction of this GPU's best speed that
the other GPU's winner reaches, where this GPU timed it (the tuner guesses it early: `--warm-from`), and the
default's. It says whether a GPU family without records (an H800, a GH200, an H100 PCIe) would do better on a
known family's records than on the defaults (NOTES 113). Recorded trials only, no GPU:

    python benchmarks/cross_gpu_winners.py [--dbs tuning_db/h100.db tuning_db/h200.db]
"""

import argparse
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from leave_one_out import timed  # noqa: E402

from autoflash import families  # noqa: E402
from autoflash.gpu import KNOWN  # noqa: E402


def summary(fractions: list[float]) -> str:
    if not fractions:
        return "none timed"
    ordered = sorted(fractions)
    geomean = math.exp(statistics.fmean(map(math.log, ordered)))
    return (f"{len(ordered)} problems: geomean {geomean:.3f}, median {statistics.median(ordered):.3f}, "
            f"p10 {ordered[len(ordered) // 10]:.3f}, min {ordered[0]:.3f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dbs", nargs=2, default=["tuning_db/h100.db", "tuning_db/h200.db"])
    args = parser.parse_args()
    gpus = [Path(db).stem for db in args.dbs]
    for direction in ("fwd", "bwd"):
        times = {gpu: timed(db, gpu, direction) for gpu, db in zip(gpus, args.dbs)}
        for here, there in (gpus, gpus[::-1]):
            pairs = []  # (the other GPU's winner, the default), as fractions of the best here, where both timed
            for problem, trials in times[here].items():
                if problem not in times[there]:
                    continue
                best = min(trials.values())
                theirs = min(times[there][problem].items(), key=lambda item: item[1])[0]
                default = families.default_knobs(problem, KNOWN[here], direction).to_json()
                if theirs in trials and default in trials:
                    pairs.append((best / trials[theirs], best / trials[default]))
            print(f"{direction} on {here}: {there}'s winner {summary([w for w, _ in pairs])}; "
                  f"the default {summary([d for _, d in pairs])}")


if __name__ == "__main__":
    main()
