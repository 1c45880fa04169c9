"""The tuned problems whose calls are short, as problems files to retune: their trials were timed call after call,
host time included, until the tuner timed such calls in CUDA graphs (NOTES 112).

For a GPU family and direction: every plain problem of the given problems files whose best recorded time in the
database is under --below-ms, written as `<out-dir>/<direction>.yaml` for `FRESH=1 benchmarks/campaign.sh`
(ENTRIES="<out-dir>/fwd.yaml:fwd <out-dir>/bwd.yaml:bwd"). Recorded trials only, no GPU:

    python benchmarks/short_problems.py --db tuning_db/h100.db --gpu h100 --out-dir /tmp/retime [files ...]

With --head-dim-above / --head-dim-to (and --below-ms inf) it writes the problems a new variant of those head dims
should be timed on instead: the problems past head dim 192 once split_keys is the default there (NOTES 117), those
of 129-192 once it runs over two column tiles there (NOTES 131). With --retimed-since
(an ISO time, UTC) it leaves out the problems with a trial recorded since then: a retime that took several device
calls goes on where the last one stopped (each call's FRESH campaign is merged into the database read here; a
problem the time limit cut counts as retimed with the trials it got).
"""

import argparse
import glob
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from leave_one_out import timed  # noqa: E402

from autoflash import codegen  # noqa: E402
from autoflash.db.base import connect_readonly  # noqa: E402
from autoflash.problem import Problem  # noqa: E402
from autoflash.shapes import load_problems  # noqa: E402

FILES = ["examples/campaign/*.yaml", "examples/fa_grid.yaml", "examples/fa_grid_bf16.yaml", "examples/gqa.yaml",
         "examples/small_batch.yaml", "examples/odd_shapes.yaml", "examples/bwd_spread.yaml"]


RECORDED_SINCE = """
SELECT DISTINCT p.batch, p.heads_q, p.heads_kv, p.seqlen_q, p.seqlen_k, p.head_dim, p.causal, p.dtype
FROM autoflash_trials t JOIN autoflash_variants v ON v.id = t.variant_id
JOIN autoflash_problems p ON p.id = t.problem_id JOIN autoflash_gpus g ON g.id = t.gpu_id
WHERE g.family = ? AND v.direction = ? AND t.created_at >= ? AND v.fingerprint IN ({})
"""


def recorded_since(db: str, gpu: str, direction: str, since: str) -> set[Problem]:
    """The problems with a trial under the current templates recorded at or after `since` (ISO, UTC)."""
    fingerprints = list(codegen.current_fingerprints(direction).values())
    rows = connect_readonly(db).execute(RECORDED_SINCE.format(", ".join("?" * len(fingerprints))),
                                        (gpu, direction, since.replace("T", " "), *fingerprints)).fetchall()
    return {Problem(*shape[:6], bool(shape[6]), shape[7]) for shape in rows}


def short_problems(files: list[str], db: str, gpu: str, direction: str, below_ms: float,
                   head_dim_above: int = 0, retimed_since: str | None = None, head_dim_to: int | None = None
                   ) -> list[dict]:
    """Problems files' plain problems (no variant, packed sequence or cache) tuned faster than below_ms, past head
    dim head_dim_above and to head_dim_to, and with no trial since retimed_since, once each."""
    best = {problem: min(times.values()) for problem, times in timed(db, gpu, direction).items()}
    done = recorded_since(db, gpu, direction, retimed_since) if retimed_since else set()
    problems = dict.fromkeys(p for f in files for p in load_problems(f) if not p.gates() and p in best
                             and best[p] < below_ms and head_dim_above < p.head_dim <= (head_dim_to or p.head_dim)
                             and p not in done)
    return [dict(batch=p.batch, heads_q=p.heads_q, heads_kv=p.heads_kv, seqlen_q=p.seqlen_q, seqlen_k=p.seqlen_k,
                 head_dim=p.head_dim, causal=p.causal, dtype=p.dtype) for p in problems]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--gpu", required=True, help="GPU family, e.g. h100")
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--below-ms", type=float, default=0.2)
    parser.add_argument("--head-dim-above", type=int, default=0)
    parser.add_argument("--head-dim-to", type=int, help="the largest head dim kept [default: every one]")
    parser.add_argument("--retimed-since", help="ISO time (UTC): leave out problems with a trial recorded since")
    parser.add_argument("files", nargs="*", help="problems files [default: the campaign's and the examples']")
    args = parser.parse_args()
    files = sorted(f for pattern in (args.files or FILES) for f in glob.glob(pattern))
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for direction in ("fwd", "bwd"):
        problems = short_problems(files, args.db, args.gpu, direction, args.below_ms, args.head_dim_above,
                                  args.retimed_since, args.head_dim_to)
        (out / f"{direction}.yaml").write_text(
            f"# {args.gpu} {direction} problems of head dims {args.head_dim_above + 1}-{args.head_dim_to or 'any'} tuned under {args.below_ms} ms in "
            f"{args.db}: to retime (NOTES 112, 117)\n"
            + yaml.safe_dump({"problems": problems}, default_flow_style=None, sort_keys=False))
        print(f"{direction}: {len(problems)} problems -> {out / f'{direction}.yaml'}")


if __name__ == "__main__":
    main()
