"""Tuning problems with a mask_mod or score_mod under Triton's interpreter: the mod travels to the worker processes as
its source and captures (they cannot import the user's script), its variants are compiled, checked against the fp64
reference of the problem's own heads and timed, and dispatch runs the winner; on first use the call's mods are
tuned."""

import pickle
import subprocess
import sys

import pytest
import torch

import autoflash
from autoflash.db.store import Store
from autoflash.gpu import INTERPRETER
from autoflash.problem import Problem
from autoflash.reference import attention_reference
from autoflash.tune import on_miss
from autoflash.tune.runner import DEFAULT_LOADER, Runner
from autoflash.tune.trial import Bench
from autoflash.tune.tuner import tune_problem


def same_document(b, h, q_idx, kv_idx, document_id):
    return document_id[q_idx] == document_id[kv_idx]


def heads_apart(b, h, q_idx, kv_idx):
    return ((kv_idx + h) % 3 != 0) | (kv_idx == q_idx)


def capped(score, b, h, q_idx, kv_idx, cap):
    return cap[0] * torch.tanh(score / cap[0])


DOCUMENTS = torch.tensor([0] * 9 + [1] * 20 + [2] * 11, dtype=torch.int32)  # 40 positions
PLAIN = Problem(batch=2, heads_q=4, heads_kv=2, seqlen_q=40, seqlen_k=40, head_dim=32, causal=True, dtype="float32")


def test_a_mod_travels_as_its_source_and_captures_to_a_process_that_cannot_import_it(tmp_path):
    mod = autoflash.MaskMod(same_document, DOCUMENTS)
    (tmp_path / "mod.pickle").write_bytes(pickle.dumps(mod))
    script = ("import pickle, sys, torch; mod = pickle.load(open(sys.argv[1], 'rb')); "
              "print(mod.fingerprint(), mod.rendered.source == sys.argv[2], "
              "mod.mask(1, 1, 40, 40, 'cpu').sum().item(), pickle.loads(pickle.dumps(mod)).fingerprint())")
    # (run from tmp_path: this test module is not importable there)
    answer = subprocess.run([sys.executable, "-c", script, str(tmp_path / "mod.pickle"), mod.rendered.source],
                            cwd=tmp_path, capture_output=True, text=True, check=True).stdout.split()
    assert answer == [mod.fingerprint(), "True", str(int(mod.mask(1, 1, 40, 40, "cpu").sum())), mod.fingerprint()]


def test_a_mod_at_a_head_is_that_head_of_the_whole_problems_mod():
    mod = autoflash.MaskMod(heads_apart)
    whole = mod.mask(2, 4, 7, 9, "cpu")
    assert torch.equal(mod.at(1, 2).mask(1, 1, 7, 9, "cpu")[0, 0], whole[1, 2])
    assert not torch.equal(whole[1, 2], whole[0, 0])  # (the mod reads the head: a slice's own indices would not do)


def test_a_problem_carries_the_mods_it_names_and_only_those():
    mod = autoflash.MaskMod(same_document, DOCUMENTS)
    problem = PLAIN.with_variants(mask_mod=mod.fingerprint()).with_mods(mod)
    assert problem.mods == (mod,) and problem == PLAIN.with_variants(mask_mod=mod.fingerprint())  # (not identity)
    with pytest.raises(ValueError, match="names the mods"):
        PLAIN.with_mods(mod)
    with pytest.raises(ValueError, match="names the mods"):
        problem.with_mods(autoflash.MaskMod(heads_apart))


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_a_mod_problem_is_tuned_with_its_mods_and_checked_on_its_own_heads(tmp_path, direction):
    """A per-head mask (the reference of the last head must be that head's) and a score_mod with a capture, GQA,
    two batch entries: every variant passes its check."""
    mask, score = autoflash.MaskMod(heads_apart), autoflash.ScoreMod(capped, torch.tensor([3.0]))
    problem = PLAIN.with_variants(mask_mod=mask.fingerprint(), score_mod=score.fingerprint()).with_mods(mask, score)
    with Runner(interpret=True, trial_timeout=120) as runner:
        report = tune_problem(problem, gpu=INTERPRETER, store=Store(f"sqlite:///{tmp_path / 'mods.db'}"),
                              runner=runner, direction=direction, sampler="random", n_trials=2, seed=0,
                              family_names=["tl"])
    assert report.best is not None and report.failures == 0 and report.trials == 2


def test_a_mod_problem_without_its_mod_says_how_to_tune_it():
    mask = autoflash.MaskMod(heads_apart)
    problem = PLAIN.with_variants(mask_mod=mask.fingerprint())  # (as one read from a problems file or database)
    with pytest.raises(ValueError, match="mask_mod .* did not come with it: a mod's problem is tuned with the mod"):
        Bench(problem, "fwd", torch.device("cpu"), DEFAULT_LOADER, measure=False)


def test_on_first_use_the_calls_mask_mod_is_tuned_and_its_winner_runs(fresh, tmp_path, monkeypatch):
    monkeypatch.setattr(on_miss, "TRIALS", 2)
    autoflash.configure(tune="on-miss", budget_s=60, db=tmp_path / "mine.db")
    mod = autoflash.MaskMod(same_document, DOCUMENTS[:33])
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 23, 32, generator=gen)
    k, v = (torch.randn(1, 1, 33, 32, generator=gen) for _ in range(2))
    out = autoflash.attention(q, k, v, causal=True, mask_mod=mod)
    torch.testing.assert_close(out.double(), attention_reference(q, k, v, causal=True, mask_mod=mod)[0],
                               atol=1e-4, rtol=1e-4)
    explained = autoflash.explain(q, k, v, causal=True, mask_mod=mod)
    assert "fwd on-miss: tuned here on first use" in explained and "fwd why:     exact problem tuned" in explained, \
        explained
    # (the mask's pairs are its captures' data, not the problem's: no TFLOP/s is claimed for it)
    assert "fwd tuned:" in explained and "TFLOP/s" not in explained, explained
    assert Store(str(tmp_path / "mine.db")).count_trials() > 0
