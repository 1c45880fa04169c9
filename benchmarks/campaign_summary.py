"""What a tuning database holds for the problems of some problems files: per problem and direction, the best
passed trial under the current templates against plain SDPA as the tuner timed it (the baseline row), and the
geomean, lowest and count per file and direction. Read from the database, not from a run's printed reports (a
tuner sharing a database with others prints a problem when it leaves it, perhaps before the others' trials end).

    python benchmarks/campaign_summary.py DB GPU_FAMILY FILE[:DIRECTION]... [--out ROWS.jsonl]
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from autoflash import codegen, families  # noqa: E402
from autoflash.bench import ratio_summary  # noqa: E402
from autoflash.db.base import connect_readonly  # noqa: E402
from autoflash.shapes import load_problems  # noqa: E402
from autoflash.tune.tuner import baseline_name  # noqa: E402

BEST = """
SELECT MIN(t.median_ms), v.knobs FROM autoflash_trials t JOIN autoflash_variants v ON v.id = t.variant_id
JOIN autoflash_problems p ON p.id = t.problem_id JOIN autoflash_gpus g ON g.id = t.gpu_id
WHERE t.status = 'ok' AND g.family = ? AND p."key" = ? AND v.direction = ? AND v.fingerprint IN ({})
"""
BASELINE = """
SELECT MIN(b.median_ms) FROM autoflash_baselines b JOIN autoflash_problems p ON p.id = b.problem_id
JOIN autoflash_gpus g ON g.id = b.gpu_id WHERE g.family = ? AND p."key" = ? AND b.backend = ?
"""


def rows(db: str, gpu: str, path: str, directions=("fwd", "bwd")):
    """One dict per problem of `path` and direction that the database holds a passed trial of."""
    connection = connect_readonly(db)
    for problem in load_problems(path):
        for direction in directions:
            fingerprints = list(codegen.current_fingerprints(direction, problem.gates()).values())
            ms, knobs = connection.execute(BEST.format(", ".join("?" * len(fingerprints))),
                                           (gpu, problem.key(), direction, *fingerprints)).fetchone()
            if ms is None:
                continue
            sdpa, = connection.execute(BASELINE, (gpu, problem.key(), baseline_name(direction))).fetchone()
            family = families.knobs_from_json(direction, knobs).family
            yield dict(problem=problem.label(), direction=direction, ms=ms, sdpa_ms=sdpa,
                       vs_plain_sdpa=sdpa / ms if sdpa else None, family=family, knobs=json.loads(knobs), file=path,
                       gpu_family=gpu)


def summary(found: list[dict], count: int) -> str:
    ratios = [(r["vs_plain_sdpa"], r["problem"]) for r in found if r["vs_plain_sdpa"]]
    return f"{len(found)} of {count} tuned" + (f"; vs plain SDPA {ratio_summary(ratios)}" if ratios else "")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("db")
    parser.add_argument("gpu")
    parser.add_argument("files", nargs="+",
                        help="problems files, each FILE or FILE:DIRECTION (fwd or bwd; default both)")
    parser.add_argument("--out", help="write one JSON line per problem and direction here")
    args = parser.parse_args()
    every = []
    for entry in args.files:
        path, _, only = entry.partition(":")
        for direction in (only,) if only else ("fwd", "bwd"):
            found = list(rows(args.db, args.gpu, path, (direction,)))
            print(f"{path} {direction}: {summary(found, len(load_problems(path)))}")
            every += found
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in every)


if __name__ == "__main__":
    main()
