"""How well dispatch's fallback does on problems nobody tuned, measured on a tuning database (issue 18).

For each tuned problem P of a GPU family and direction: hide P's records, let dispatch choose from the others
(`dispatch.choose` and the family's `fit`, as for an untuned call), and compare the chosen variant's time on P
with P's best. Only variants timed on P have a time there: the rest are counted, not guessed. With --borrow-from,
dispatch chooses from another GPU family's records instead (all of them, P's included): what a GPU without records
would run if it borrowed them, beside the heuristic defaults it runs (NOTES 157).

    python benchmarks/leave_one_out.py [--db tuning_db/h100.db] [--gpu h100] [--borrow-from tuning_db/h200.db:h200]
"""

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from autoflash import codegen, families  # noqa: E402
from autoflash.db.base import connect_readonly  # noqa: E402
from autoflash.dispatch import Record, choose  # noqa: E402
from autoflash.gpu import KNOWN  # noqa: E402
from autoflash.problem import Problem  # noqa: E402

TRIALS = """
SELECT p.batch, p.heads_q, p.heads_kv, p.seqlen_q, p.seqlen_k, p.head_dim, p.causal, p.dtype, v.knobs, t.median_ms
FROM autoflash_trials t JOIN autoflash_variants v ON v.id = t.variant_id
JOIN autoflash_problems p ON p.id = t.problem_id JOIN autoflash_gpus g ON g.id = t.gpu_id
WHERE t.status = 'ok' AND g.family = ? AND v.direction = ? AND v.fingerprint IN ({})
ORDER BY t.created_at, t.id
"""


def timed(db: str, gpu: str, direction: str) -> dict[Problem, dict[str, float]]:
    """Problem -> {knobs JSON (canonical): latest time} of every ok trial under the current templates (a variant
    by its latest trial, as dispatch reads records: autoflash/db/base.py best_per_problem)."""
    fingerprints = list(codegen.current_fingerprints(direction).values())
    rows = connect_readonly(db).execute(TRIALS.format(", ".join("?" * len(fingerprints))),
                                        (gpu, direction, *fingerprints)).fetchall()
    times = defaultdict(dict)
    for *shape, knobs, ms in rows:
        problem = Problem(*shape[:6], bool(shape[6]), shape[7])
        key = families.current_json(direction, knobs)
        times[problem][key] = ms
    return times


def leave_one_out(times, gpu, direction, source=None):
    """A row per problem of `times`: dispatch's choice from the other problems' records, or from every record of
    `source` (another GPU's times) where given."""
    best = {p: min(t.items(), key=lambda item: item[1]) for p, t in times.items()}
    records = {p: min(t.items(), key=lambda item: item[1]) for p, t in (source or times).items()}
    rows = []
    for problem in times:
        others = sorted((Record(p, families.knobs_from_json(direction, k), ms, 0.0)
                         for p, (k, ms) in records.items() if source or p != problem), key=lambda r: r.median_ms)
        chosen = choose(problem, gpu, [("loo", others)], direction)
        knobs = families.of(chosen.knobs).fit(chosen.knobs, problem, gpu) or chosen.knobs
        ms = times[problem].get(knobs.to_json())
        default = families.default_knobs(problem, gpu, direction)  # what an untuned problem would run instead
        default_ms = times[problem].get(default.to_json())
        rows.append(dict(problem=problem.label(), reason=chosen.reason, knobs=knobs.to_json(),
                         fraction=None if ms is None else best[problem][1] / ms,
                         default_fraction=None if default_ms is None else best[problem][1] / default_ms))
    return rows


def summary(fractions) -> str:
    known = sorted(f for f in fractions if f is not None)
    if not known:
        return "timed on none"
    p10 = statistics.quantiles(known, n=10, method="inclusive")[0] if len(known) > 1 else known[0]
    return (f"timed on {len(known)}: fraction of the best's speed median {statistics.median(known):.3f}, "
            f"p10 {p10:.3f}, min {known[0]:.3f}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", default=str(Path(__file__).resolve().parents[1] / "tuning_db" / "h100.db"))
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--borrow-from", metavar="DB:GPU",
                        help="choose from this database's records of that GPU family instead of the others of --db")
    parser.add_argument("--out", help="append one JSON line per problem here")
    args = parser.parse_args()
    for direction in ("fwd", "bwd"):
        source = timed(*args.borrow_from.rsplit(":", 1), direction) if args.borrow_from else None
        rows = leave_one_out(timed(args.db, args.gpu, direction), KNOWN[args.gpu], direction, source)
        print(f"{direction}: {len(rows)} problems; dispatch's choice {summary(r['fraction'] for r in rows)}")
        print(f"  the heuristic default instead {summary(r['default_fraction'] for r in rows)}")
        both = [r for r in rows if r["fraction"] is not None and r["default_fraction"] is not None]
        print(f"  where both were timed ({len(both)}): dispatch's {summary(r['fraction'] for r in both)}; "
              f"the default's {summary(r['default_fraction'] for r in both)}")
        for row in rows:
            if row["fraction"] is None or row["fraction"] < 0.85:
                print(f"  {row['problem']:34s} {row['fraction'] or 'untimed'!s:>8.8}  {row['reason']}")
        if args.out:
            with open(args.out, "a") as f:
                for row in rows:
                    f.write(json.dumps(dict(row, direction=direction, db=args.db, gpu=args.gpu,
                                            borrow_from=args.borrow_from)) + "\n")


if __name__ == "__main__":
    main()
