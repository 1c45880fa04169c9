"""The benchmarks' knob sweep (benchmarks/forced_knobs.py): a change reaches the dispatched forward, a plan cached
before it is not reused, and the result stays right."""

import json
import sys
from pathlib import Path

import torch

import autoflash
from autoflash import api
from autoflash.reference import attention_reference, relative_error

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
from forced_knobs import changes_of, forced_knobs  # noqa: E402


def _fwd_knobs() -> dict:
    q = torch.randn(1, 2, 7, 16)
    line = next(s for s in autoflash.explain(q, q, q).splitlines() if s.startswith("fwd knobs:"))
    return json.loads(line.split(":", 1)[1])


def test_change_reaches_the_forward_and_plans_are_built_again():
    q, k, v = (torch.randn(1, 2, 7, 16) for _ in range(3))
    autoflash.attention(q, k, v)
    assert api._plans
    before = _fwd_knobs()
    change = {"num_warps": 2 if before["num_warps"] != 2 else 4}
    with forced_knobs(change):
        assert not api._plans
        assert _fwd_knobs() == dict(before, **change)
        out = autoflash.attention(q, k, v)
    assert _fwd_knobs() == before
    with forced_knobs({"family": "gluon", "dynamic": True}):  # another family's change: the tl choice stands
        assert _fwd_knobs() == before
    assert relative_error(out, attention_reference(q, k, v)[0]) < 1e-4


def test_a_family_default_replaces_the_choice_where_the_family_has_one():
    q, k, v = (torch.randn(1, 2, 7, 16) for _ in range(3))
    before = _fwd_knobs()
    with forced_knobs({"family": "tl", "default": True, "num_warps": 2}):
        assert _fwd_knobs()["family"] == "tl" and _fwd_knobs()["num_warps"] == 2
        out = autoflash.attention(q, k, v)
    with forced_knobs({"family": "gluon", "default": True}):  # none under the interpreter: the choice stands
        assert _fwd_knobs() == before
    with forced_knobs({"family": "tl", "default": True, "num_warps": 2, "direction": "bwd"}):  # the backward's alone
        assert _fwd_knobs() == before
    assert relative_error(out, attention_reference(q, k, v)[0]) < 1e-4


def test_changes_of_refuses_what_is_not_a_list_of_objects():
    assert changes_of('[{}, {"kv_splits": 8}]') == [{}, {"kv_splits": 8}]
    try:
        changes_of('{"kv_splits": 8}')
    except SystemExit as exit_:
        assert "JSON list of objects" in str(exit_)
    else:
        raise AssertionError("a bare object was accepted")
