"""benchmarks/short_problems.py: the tuned problems whose calls are short, to retime (NOTES 112)."""

import sys
from pathlib import Path

from autoflash import codegen, families
from autoflash.db.store import Store
from autoflash.gpu import KNOWN
from autoflash.shapes import load_problems

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from short_problems import short_problems  # noqa: E402


def test_only_problems_tuned_under_the_bound_are_kept(tmp_path):
    shapes = tmp_path / "shapes.yaml"
    shapes.write_text("problems:\n  - {batch: 2, heads_q: 4, seqlen_q: [128, 4096], head_dim: 64, causal: true}\n")
    short, long = load_problems(shapes)
    db = str(tmp_path / "t.db")
    store = Store(db)
    for problem, ms in ((short, 0.05), (long, 0.9)):
        knobs = families.default_knobs(problem, KNOWN["h100"], "fwd")
        fingerprint = codegen.template_fingerprint(knobs.family, "fwd", problem.gates())
        store.record_trial(KNOWN["h100"], problem, knobs.to_json(), fingerprint, "ok", ms)
    store.close()
    kept = short_problems([str(shapes)], db, "h100", "fwd", 0.2)
    assert kept == [dict(batch=2, heads_q=4, heads_kv=4, seqlen_q=128, seqlen_k=128, head_dim=64, causal=True,
                         dtype="float16")]
    assert short_problems([str(shapes)], db, "h100", "bwd", 0.2) == []  # (no backward trial)
    assert short_problems([str(shapes)], db, "h200", "fwd", 0.2) == []  # (another GPU's records)
    assert short_problems([str(shapes)], db, "h100", "fwd", float("inf"), head_dim_above=64) == []
    assert len(short_problems([str(shapes)], db, "h100", "fwd", float("inf"), head_dim_above=32)) == 2
