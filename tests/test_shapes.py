"""Problems files: grids, defaults, and errors that name the entry and the field."""

from pathlib import Path

import pytest

from autoflash.problem import Problem
from autoflash.shapes import ShapesError, load_problems


def write(tmp_path, text):
    path = tmp_path / "shapes.yaml"
    path.write_text(text)
    return path


def test_example_file_expands_to_a_grid():
    problems = load_problems("examples/shapes.yaml")
    assert problems[0] == Problem(4, 32, 8, 2048, 2048, 128, True, "bfloat16")
    assert len(problems) == 5 and {(p.seqlen_q, p.causal) for p in problems[1:]} == \
        {(1024, False), (1024, True), (4096, False), (4096, True)}
    assert all(p.heads_kv == 16 and p.seqlen_k == 4096 for p in problems[1:])


def test_fa_grid_has_24_problems_of_16k_tokens():
    problems = load_problems("examples/fa_grid.yaml")
    assert len(problems) == 24 and all(p.batch * p.seqlen_q == 16384 and p.heads_q * p.head_dim == 2048
                                       for p in problems)


EXAMPLES = Path(__file__).parent.parent / "examples"


@pytest.mark.parametrize("path", sorted(str(p) for p in EXAMPLES.rglob("*.yaml")))
def test_every_example_file_loads(path):
    assert load_problems(path)


def test_held_out_problems_are_tuned_in_no_shipped_database():
    """examples/holdout.yaml measures dispatch's fallback (issue 18): a record of one of its problems in a shipped
    database would measure the tuner instead."""
    import sqlite3
    held_out = load_problems(EXAMPLES / "holdout.yaml")
    assert len(held_out) >= 20
    for db in sorted((EXAMPLES.parent / "tuning_db").glob("*.db")):
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as connection:
            tuned = {Problem(*row[:6], bool(row[6]), row[7]) for row in connection.execute(
                "SELECT batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, causal, dtype FROM autoflash_problems")}
        assert tuned and not tuned & set(held_out), (db.name, sorted(p.label() for p in tuned & set(held_out)))


def test_held_out_problems_are_in_no_campaign_file():
    """The campaign (examples/campaign/) is tuned into the shipped databases: a held-out problem there would be
    tuned at the next campaign run, before the test above could tell."""
    held_out = set(load_problems(EXAMPLES / "holdout.yaml"))
    for path in sorted((EXAMPLES / "campaign").glob("*.yaml")):
        assert not held_out & set(load_problems(path)), path.name


@pytest.mark.parametrize("text, message", [
    ("problems:\n  - {batch: 1, heads_q: 2, seqlen_q: 8}\n", r"problems\[0\]: missing field\(s\) \['head_dim'\]"),
    ("problems:\n  - {batch: 1, heads_q: 2, seqlen_q: 8, head_dim: 64}\n  - {batch: 0, heads_q: 2, seqlen_q: 8, "
     "head_dim: 64}\n", r"problems\[1\]: field 'batch' must be a positive integer"),
    ("problems:\n  - {batch: 1, heads_q: 3, heads_kv: 2, seqlen_q: 8, head_dim: 64}\n", "field 'heads_kv'"),
    ("problems:\n  - {batch: 1, heads_q: 2, seqlen_q: 8, head_dim: 64, dtype: fp8}\n", "field 'dtype'"),
    ("problems:\n  - {batch: 1, heads_q: 2, seqlen_q: 8, head_dim: 64, window: 3}\n", r"unknown field\(s\)"),
    ("problems:\n  - {batch: 1, heads_q: 2, seqlen_q: 8, head_dim: 512}\n", "field 'head_dim' must be 16..256"),
    ("problems:\n  - {batch: 1, heads_q: 2, seqlen_q: 8, head_dim: 64, window_size: 3}\n",
     r"field 'window_size' must be \[left, right\]"),
    ("problems:\n  - {batch: 1, heads_q: 2, seqlen_q: 8, head_dim: 64, window_size: [-2, 0]}\n",
     r"field 'window_size' must be \[left, right\]"),
    ("problems:\n  - {batch: 1, heads_q: 2, seqlen_q: 8, head_dim: 64, softcap: -1}\n", "field 'softcap' must be a number"),
    ("problems:\n  - {batch: 1, heads_q: 2, seqlen_q: 8, head_dim: 64, alibi: 1}\n", "field 'alibi' must be true or false"),
    ("shapes: []\n", "a list under 'problems'"),
    ("problems: [\n", "cannot read"),
])
def test_errors_name_the_entry_and_field(tmp_path, text, message):
    with pytest.raises(ShapesError, match=message):
        load_problems(write(tmp_path, text))


def test_variants_and_their_grids(tmp_path):
    problems = load_problems(write(tmp_path, """problems:
  - {batch: 1, heads_q: 4, heads_kv: 2, seqlen_q: 64, head_dim: 32, causal: true, window_size: [16, -1], softcap: 30.0,
     alibi: true}
  - {batch: 1, heads_q: 4, seqlen_q: 64, head_dim: 32, window_size: [[8, 8], [-1, 0], [100, 100]], softcap: [0, 5]}
"""))
    assert [p.key().split("float16")[1] for p in problems] == [
        "-wl16-softcap-alibi", "-wl8-wr8", "-wl8-wr8-softcap", "", "-softcap", "", "-softcap"]
    assert problems[3].causal and not problems[5].causal  # a right bound of 0 is causal masking; [100, 100] is none
