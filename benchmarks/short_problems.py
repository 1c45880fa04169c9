"""The tuned problems whose calls are short, as problems files to retune: their trials were timed call after call,
host time included, until the tuner timed such calls in CUDA graphs (NOTES 112).

For a GPU family and direction: every plain problem of the given problems files whose best recorded time in the
database is under --below-ms, written as `<out-dir>/<direction>.yaml` for `FRESH=1 benchmarks/campaign.sh`
(ENTRIES="<out-dir>/fwd.yaml:fwd <out-dir>/bwd.yaml:bwd"). Recorded trials only, no GPU:

    python benchmarks/short_problems.py --db tuning_db/h100.db --gpu h100 --out-dir /tmp/retime [files ...]

With --head-dim-above (and --below-ms inf) it writes the problems a new variant of those head dims should be timed
on instead: the problems past head dim 192 once split_keys is the default there (NOTES 117).
"""

import argparse
import glob
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from leave_one_out import timed  # noqa: E402

from autoflash.shapes import load_problems  # noqa: E402

FILES = ["examples/campaign/*.yaml", "examples/fa_grid.yaml", "examples/fa_grid_bf16.yaml", "examples/gqa.yaml",
         "examples/small_batch.yaml", "examples/odd_shapes.yaml", "examples/bwd_spread.yaml"]


def short_problems(files: list[str], db: str, gpu: str, direction: str, below_ms: float,
                   head_dim_above: int = 0) -> list[dict]:
    """Problems files' plain problems (no variant, packed sequence or cache) tuned faster than below_ms, past head
    dim head_dim_above, once each."""
    best = {problem: min(times.values()) for problem, times in timed(db, gpu, direction).items()}
    problems = dict.fromkeys(p for f in files for p in load_problems(f) if not p.gates() and p in best
                             and best[p] < below_ms and p.head_dim > head_dim_above)
    return [dict(batch=p.batch, heads_q=p.heads_q, heads_kv=p.heads_kv, seqlen_q=p.seqlen_q, seqlen_k=p.seqlen_k,
                 head_dim=p.head_dim, causal=p.causal, dtype=p.dtype) for p in problems]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--gpu", required=True, help="GPU family, e.g. h100")
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--below-ms", type=float, default=0.2)
    parser.add_argument("--head-dim-above", type=int, default=0)
    parser.add_argument("files", nargs="*", help="problems files [default: the campaign's and the examples']")
    args = parser.parse_args()
    files = sorted(f for pattern in (args.files or FILES) for f in glob.glob(pattern))
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for direction in ("fwd", "bwd"):
        problems = short_problems(files, args.db, args.gpu, direction, args.below_ms, args.head_dim_above)
        (out / f"{direction}.yaml").write_text(
            f"# {args.gpu} {direction} problems past head dim {args.head_dim_above} tuned under {args.below_ms} ms in "
            f"{args.db}: to retime (NOTES 112, 117)\n"
            + yaml.safe_dump({"problems": problems}, default_flow_style=None, sort_keys=False))
        print(f"{direction}: {len(problems)} problems -> {out / f'{direction}.yaml'}")


if __name__ == "__main__":
    main()
