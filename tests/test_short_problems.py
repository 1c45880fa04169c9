"""benchmarks/short_problems.py: the tuned problems whose calls are short, to retime (NOTES 112)."""

import datetime
import sys
from pathlib import Path

from autoflash import codegen, families
from autoflash.db.store import Store
from autoflash.gpu import KNOWN
from autoflash.shapes import load_problems

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from short_problems import short_problems  # noqa: E402


def _tuned(tmp_path, times):
    """A problems file of two causal d64 problems (seqlen_q 128 and 4096) and a database holding one trial of each,
    of `times` ms, recorded in order; (file, database, the time between the two trials, ISO UTC)."""
    shapes = tmp_path / "shapes.yaml"
    shapes.write_text("problems:\n  - {batch: 2, heads_q: 4, seqlen_q: [128, 4096], head_dim: 64, causal: true}\n")
    db = str(tmp_path / "t.db")
    store, between = Store(db), None
    for problem, ms in zip(load_problems(shapes), times):
        if between is None and problem.seqlen_q == 4096:
            between = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds")[:26]
        knobs = families.default_knobs(problem, KNOWN["h100"], "fwd")
        fingerprint = codegen.template_fingerprint(knobs.family, "fwd", problem.gates())
        store.record_trial(KNOWN["h100"], problem, knobs.to_json(), fingerprint, "ok", ms)
    store.close()
    return str(shapes), db, between


def test_only_problems_tuned_under_the_bound_are_kept(tmp_path):
    shapes, db, _ = _tuned(tmp_path, (0.05, 0.9))
    kept = short_problems([shapes], db, "h100", "fwd", 0.2)
    assert kept == [dict(batch=2, heads_q=4, heads_kv=4, seqlen_q=128, seqlen_k=128, head_dim=64, causal=True,
                         dtype="float16")]
    assert short_problems([shapes], db, "h100", "bwd", 0.2) == []  # (no backward trial)
    assert short_problems([shapes], db, "h200", "fwd", 0.2) == []  # (another GPU's records)
    assert short_problems([shapes], db, "h100", "fwd", float("inf"), head_dim_above=64) == []
    assert len(short_problems([shapes], db, "h100", "fwd", float("inf"), head_dim_above=32)) == 2
    assert short_problems([shapes], db, "h100", "fwd", float("inf"), head_dim_above=32, head_dim_to=63) == []
    assert len(short_problems([shapes], db, "h100", "fwd", float("inf"), head_dim_above=32, head_dim_to=64)) == 2


def test_problems_retimed_since_a_time_are_left_out(tmp_path):
    """--retimed-since: a problem with a trial recorded since then is done (a retime over several calls)."""
    shapes, db, between = _tuned(tmp_path, (0.05, 0.06))
    kept = short_problems([shapes], db, "h100", "fwd", 0.2, retimed_since=between)
    assert [p["seqlen_q"] for p in kept] == [128]  # (4096's trial is since `between`)
    assert short_problems([shapes], db, "h100", "fwd", 0.2, retimed_since="2000-01-01T00:00") == []
    assert len(short_problems([shapes], db, "h100", "fwd", 0.2, retimed_since="2999-01-01T00:00")) == 2
