"""A problem no variant can run is recorded as such (show, explain), the tuning run goes on to the next problem,
and attention still runs a working default for it. Backward at head dim 256 on the H100 has a space to search."""

import torch
from click.testing import CliRunner

import autoflash
import dataclasses

from autoflash import api, codegen, families
from autoflash.families import tl
from autoflash.cli import main
from autoflash.db.store import Store
from autoflash.dispatch import Dispatcher
from autoflash.gpu import KNOWN, Gpu
from autoflash.problem import Problem
from autoflash.tune import tuner
from conftest import DEVICE
from helpers import assert_matches_reference, make_qkv, poisoned_outputs

NOTHING_RUNS = Problem(batch=1, heads_q=2, heads_kv=1, seqlen_q=40, seqlen_k=33, head_dim=32, causal=False,
                       dtype="float16")
TUNABLE = Problem(**{**NOTHING_RUNS.__dict__, "causal": True})  # of another kind: never its nearest neighbour


def test_backward_at_head_dim_256_on_the_h100_has_variants_to_search():
    problem = Problem(batch=2, heads_q=8, heads_kv=8, seqlen_q=4096, seqlen_k=4096, head_dim=256, causal=False,
                      dtype="bfloat16")
    _, space = tuner.searched_space(tl.FAMILY, problem, KNOWN["h100"], "bwd")
    assert all(space.values()), space


def test_a_gpu_with_tiny_shared_memory_leaves_no_variant():
    tiny = Gpu("tiny", "tiny", (9, 0), 1, shared_memory_per_block=1024, registers_per_multiprocessor=65536)
    for direction in ("fwd", "bwd"):
        _, space = tuner.searched_space(tl.FAMILY, NOTHING_RUNS, tiny, direction)
        assert not any(space.values()), space


def test_a_problem_with_no_valid_variant_is_recorded_and_the_run_goes_on(tmp_path, monkeypatch):
    real = tl.FAMILY.violations
    monkeypatch.setitem(families.FAMILIES, "tl", dataclasses.replace(tl.FAMILY, violations=lambda knobs, problem, gpu:
                        ["forced: nothing fits"] if problem == NOTHING_RUNS else real(knobs, problem, gpu)))
    shapes = tmp_path / "shapes.yaml"
    shapes.write_text("problems:\n  - {batch: 1, heads_q: 2, heads_kv: 1, seqlen_q: 40, seqlen_k: 33, head_dim: 32,"
                      " causal: [false, true]}\n")
    url = f"sqlite:///{tmp_path / 'tune.db'}"
    for run in range(2):  # the second run resumes: nothing is recorded twice
        result = CliRunner().invoke(main, ["tune", "--interpret", "--shapes", str(shapes), "--trials", "3",
                                           "--db", url, "--seed", "0"])
        assert result.exit_code == 0, result.output
        assert "no valid variant: tl: none of the" in result.output and "forced: nothing fits" in result.output
    store = Store(url)
    searched = len(families.searched("fwd"))  # one row per family that was searched and found nothing
    assert store.count_trials("no_valid_variant") == searched and store.count_trials() == 3 + searched
    fingerprint = codegen.template_fingerprint("tl")
    assert len(store.finished("interpreter", TUNABLE, fingerprint)) == 3, "the problem after it is tuned"
    assert [b.problem for b in store.best("interpreter", fingerprint)] == [TUNABLE]

    shown = CliRunner().invoke(main, ["show", "--db", url])
    assert shown.exit_code == 0, shown.output
    row = next(line for line in shown.output.splitlines() if line.startswith(NOTHING_RUNS.label() + " "))
    assert "tl: no valid variant (none of the" in row and "forced: nothing fits" in row
    assert row.split()[NOTHING_RUNS.label().count(" ") + 2:][:2] == ["0", "0"], "no trial was run for it"

    monkeypatch.setattr(api, "DISPATCHER", Dispatcher([url]))
    monkeypatch.setattr(api, "_plans", {})
    q, k, v = make_qkv(1, 2, 1, 40, 33, 32, torch.float16, DEVICE, seed=3)
    explained = autoflash.explain(q, k, v)
    assert "fwd source:  default" in explained
    assert "fwd tuned:   tl: no valid variant (none of the" in explained and "running the default" in explained
    out, _ = poisoned_outputs(q)
    autoflash.attention(q, k, v, out=out)
    assert_matches_reference(out, None, q, k, v, False)


def test_a_problem_whose_every_trial_failed_is_explained(tmp_path, monkeypatch):
    store = Store(f"sqlite:///{tmp_path / 'failed.db'}")
    fingerprint = codegen.template_fingerprint("tl")
    for status, knobs in (("wrong_result", '{"block_m": 16}'), ("timeout", '{"block_m": 32}'),
                          ("wrong_result", '{"block_m": 64}')):
        store.record_trial(KNOWN["interpreter"], NOTHING_RUNS, knobs, fingerprint, status, error="failed on purpose")
    assert store.unusable("interpreter", fingerprint) == {
        NOTHING_RUNS.key(): "all 3 trials failed (1 timeout, 2 wrong_result)"}
    store.record_trial(KNOWN["interpreter"], NOTHING_RUNS, '{"block_m": 128}', fingerprint, "ok", median_ms=1.0)
    assert store.unusable("interpreter", fingerprint) == {}
