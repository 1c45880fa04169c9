"""Dispatch: exact problem, then nearest neighbour, then default; other GPUs and templates ignored."""

import dataclasses

import pytest

import autoflash
from autoflash import api, codegen, dispatch
from autoflash.db.store import Store
from autoflash.dispatch import Dispatcher
from autoflash.gpu import Gpu, current
from autoflash.families.gluon.knobs import BwdKnobs as GluonBwdKnobs
from autoflash.families.tl.knobs import BwdKnobs, FwdKnobs
from autoflash.problem import Problem
from conftest import DEVICE
from helpers import assert_gradients_match, assert_matches_reference, make_qkv

H100 = Gpu("h100", "NVIDIA H100 80GB HBM3", (9, 0), 132, 232448, 65536)
KNOWN_A100 = Gpu("a100", "NVIDIA A100-SXM4-80GB", (8, 0), 108, 166912, 65536)
A100 = Gpu("a100", "NVIDIA A100", (8, 0), 108, 166912, 65536)
BASE = Problem(4, 16, 16, 4096, 4096, 128, False, "float16")
FAST = FwdKnobs(block_m=128, block_n=64, num_warps=4, num_stages=2, loads="tma")
NEAR = FwdKnobs(block_m=64, block_n=64, num_warps=4, num_stages=3)
ELSEWHERE = FwdKnobs(block_m=256, block_n=64, num_warps=8, num_stages=2)


def record(store, gpu, problem, knobs, ms, fingerprint=None):
    store.record_trial(gpu, problem, knobs.to_json(),
                       fingerprint or codegen.template_fingerprint(knobs.family, knobs.DIRECTION), "ok", ms,
                       direction=knobs.DIRECTION)


@pytest.fixture
def tuned_db(tmp_path):
    url = f"sqlite:///{tmp_path / 'user.db'}"
    store = Store(url)
    record(store, H100, BASE, FAST, 1.0)
    record(store, H100, BASE, NEAR, 1.5)  # slower: never the best
    record(store, H100, dataclasses.replace(BASE, seqlen_q=16384, seqlen_k=16384, batch=1), NEAR, 3.0)
    record(store, H100, BASE, ELSEWHERE, 0.1, fingerprint="0000000000000000")  # other templates
    record(store, A100, dataclasses.replace(BASE, seqlen_q=1024, seqlen_k=1024), ELSEWHERE, 0.1)  # other GPU
    return url


def test_exact_then_nearest_then_default(tuned_db):
    d = Dispatcher([tuned_db])
    exact = d.choice(BASE, H100)
    assert exact.knobs == FAST and exact.reason == "exact problem tuned" and exact.tuned.median_ms == 1.0
    near = d.choice(dataclasses.replace(BASE, batch=1, seqlen_q=12000, seqlen_k=12000), H100)
    assert near.knobs == NEAR and near.reason.startswith("nearest") and near.source == tuned_db
    other_kind = d.choice(dataclasses.replace(BASE, head_dim=64), H100)
    assert other_kind.source == "default" and other_kind.tuned is None
    # 16 tokens: 8 log2 steps from BASE's 4096 in each of the lengths, past dispatch.MAX_DISTANCE
    far = d.choice(dataclasses.replace(BASE, seqlen_q=16, seqlen_k=16), H100)
    assert far.source == "default" and far.tuned is None and "nothing comparable" in far.reason
    within = d.choice(dataclasses.replace(BASE, seqlen_q=256, seqlen_k=256), H100)  # 4 + 4 steps
    assert within.knobs.block_n == FAST.block_n and within.reason.endswith("(log2 distance 8.00)")


def test_a_decode_winner_is_no_neighbour_of_a_prefill(tmp_path):
    """Fewer query rows a head than a tile holds (decode, speculative chunks) run other shapes of kernel: such a
    problem's winner is not borrowed by a prefill 6 log2 steps away, nor the reverse (NOTES 74)."""
    url = f"sqlite:///{tmp_path / 'user.db'}"
    decode = dataclasses.replace(BASE, batch=16, seqlen_q=16, seqlen_k=1024)
    record(Store(url), H100, decode, NEAR, 0.1)
    prefill = dataclasses.replace(BASE, batch=8, seqlen_q=1000, seqlen_k=1000)
    assert decode.distance(dataclasses.replace(decode, seqlen_q=63)) is not None
    assert prefill.distance(decode) is None and decode.distance(prefill) is None
    assert Dispatcher([url]).choice(prefill, H100).source == "default"
    assert Dispatcher([url]).choice(dataclasses.replace(decode, seqlen_q=4), H100).tuned.problem == decode


def test_a_variant_timed_again_counts_by_its_latest_timing(tmp_path):
    """A retune times the last winner again beside its rivals: that run decides, not the fastest of every run's
    timings (one lucky run kept a slower variant first, NOTES 151). Both read paths: SQLite's and the store's."""
    url = f"sqlite:///{tmp_path / 'user.db'}"
    store = Store(url)
    record(store, H100, BASE, FAST, 1.0)
    record(store, H100, BASE, NEAR, 1.2)
    record(store, H100, BASE, FAST, 1.3)  # timed again, later
    assert [(b.knobs, b.median_ms) for b in store.best("h100", codegen.template_fingerprint("tl", "fwd"))] == \
        [(NEAR.to_json(), 1.2)]
    chosen = Dispatcher([url]).choice(BASE, H100)
    assert chosen.knobs == NEAR and chosen.tuned.median_ms == 1.2
    record(store, H100, BASE, FAST, 1.1)  # and again
    assert Dispatcher([url]).choice(BASE, H100).knobs == FAST


def test_other_gpus_and_templates_are_ignored(tuned_db):
    d = Dispatcher([tuned_db])
    assert d.choice(dataclasses.replace(BASE, seqlen_q=1024, seqlen_k=1024), H100).knobs != ELSEWHERE
    assert d.choice(dataclasses.replace(BASE, seqlen_q=1024, seqlen_k=1024, head_dim=64), A100).source == "default"


def test_an_exact_match_in_a_later_source_beats_a_neighbour_in_an_earlier_one(tuned_db, tmp_path):
    shipped = f"sqlite:///{tmp_path / 'shipped.db'}"
    other = dataclasses.replace(BASE, seqlen_q=2048, seqlen_k=2048, batch=8)
    record(Store(shipped), H100, other, ELSEWHERE, 0.5)
    d = Dispatcher([tuned_db, shipped])
    assert d.choice(other, H100).knobs == ELSEWHERE and d.choice(other, H100).source == shipped
    assert d.choice(BASE, H100).source == tuned_db


def test_knobs_are_fitted_to_the_problem(tuned_db):
    tiny = dataclasses.replace(BASE, seqlen_q=1, seqlen_k=4096)
    assert Dispatcher([tuned_db]).choice(tiny, H100).knobs.block_m == 16


def test_a_backward_of_few_programs_runs_its_neighbours_knobs_with_the_steps_split(tmp_path):
    """A neighbour's Gluon backward, tuned where its programs filled the GPU, runs a problem whose programs fill at
    most half the SMs with each key block's steps over more programs (b2 h8 s4096/77: 16 programs, 8 splits; NOTES
    107); an exact record runs as its search chose."""
    url = f"sqlite:///{tmp_path / 'user.db'}"
    knobs = GluonBwdKnobs(dq_turns=True, dv_late=True)
    record(Store(url), H100, Problem(4, 16, 16, 4096, 4096, 40, False, "float16"), knobs, 1.6)
    cross = Problem(2, 8, 8, 4096, 77, 40, False, "float16")
    chosen = Dispatcher([url]).choice(cross, H100, "bwd")
    assert chosen.reason.startswith("nearest") and chosen.knobs == dataclasses.replace(knobs, query_splits=8)
    record(Store(url), H100, cross, knobs, 0.1)
    assert Dispatcher([url]).choice(cross, H100, "bwd").knobs == knobs


def test_a_causal_gqa_backward_of_few_programs_splits_its_groups_as_the_default_does(tmp_path):
    """A neighbour's unsplit Gluon backward, tuned with 2048 programs, runs a causal GQA problem of 256 programs
    (under four waves of 132 SMs) with the default's group split (NOTES 109); one of 768 (5.8 waves: NOTES 111)
    or 2048 programs keeps it unsplit."""
    url = f"sqlite:///{tmp_path / 'user.db'}"
    knobs = GluonBwdKnobs(dv_late=True)
    record(Store(url), H100, Problem(4, 32, 8, 8192, 8192, 128, True, "bfloat16"), knobs, 10.9)
    few = Problem(1, 32, 8, 4096, 4096, 128, True, "bfloat16")
    chosen = Dispatcher([url]).choice(few, H100, "bwd")
    assert chosen.reason.startswith("nearest") and chosen.knobs == dataclasses.replace(knobs, group_splits=2)
    for many in (Problem(3, 32, 8, 4096, 4096, 128, True, "bfloat16"),
                 Problem(2, 32, 8, 16384, 16384, 128, True, "bfloat16")):
        assert Dispatcher([url]).choice(many, H100, "bwd").knobs == knobs
    full = dataclasses.replace(few, causal=False)  # (the default splits no group without causal masking)
    assert Dispatcher([url]).choice(full, H100, "bwd").knobs == knobs


def test_a_broken_database_is_ignored_with_a_warning(tmp_path):
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"not a database")
    with pytest.warns(UserWarning, match="ignores the tuning database"):
        assert Dispatcher([f"sqlite:///{bad}"]).choice(BASE, H100).source == "default"


def test_directions_are_dispatched_apart(tuned_db):
    bwd = BwdKnobs(block_m=32, block_n=64, num_warps=4, dq="atomic")
    record(Store(tuned_db), H100, BASE, bwd, 5.0)
    dispatcher = Dispatcher([tuned_db])
    assert dispatcher.choice(BASE, H100, "bwd").knobs == bwd
    assert dispatcher.choice(BASE, H100).knobs == FAST
    assert dispatcher.choice(dataclasses.replace(BASE, causal=True), H100, "bwd").source == "default"


def test_a_forward_winner_serves_other_gqa_ratios_a_backward_winner_does_not(tuned_db):
    """The forward counts log2 steps of GQA ratio in its distance; the backward keeps the ratio in its kind (dK and
    dV summed over a group's query heads: NOTES 92)."""
    gqa = dataclasses.replace(BASE, heads_kv=4)  # 4:1, two doublings from BASE's 1:1: two steps each
    assert gqa.distance(BASE) == gqa.distance(BASE, "fwd") == 4.0 and gqa.distance(BASE, "bwd") is None
    assert gqa.distance(dataclasses.replace(gqa, heads_kv=2), "fwd") == 2.0  # (batch x heads the same)
    record(Store(tuned_db), H100, BASE, BwdKnobs(block_m=32, block_n=64, num_warps=4, dq="atomic"), 5.0)
    dispatcher = Dispatcher([tuned_db])
    forward = dispatcher.choice(gqa, H100)
    assert forward.knobs == FAST and forward.tuned.problem == BASE and forward.reason.endswith("(log2 distance 4.00)")
    assert dispatcher.choice(gqa, H100, "bwd").source == "default"


def test_attention_reads_each_database_once_and_uses_the_tuned_variants(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'interp.db'}"
    q, k, v = make_qkv(1, 2, 2, 40, 40, 32, __import__("torch").float16, DEVICE, seed=5)
    problem = Problem.from_tensors(q, k, True)
    tuned = FwdKnobs(block_m=64, block_n=16, num_warps=2, num_stages=2, exp="exp")
    tuned_bwd = BwdKnobs(block_m=16, block_n=64, num_warps=2, dq="atomic", causal_split=False)
    record(Store(url), current(q.device), problem, tuned, 2.0)
    record(Store(url), current(q.device), problem, tuned_bwd, 3.0)
    reads = []
    real_read = dispatch.read_records
    monkeypatch.setattr(dispatch, "read_records", lambda u, f, d: reads.append((u, d)) or real_read(u, f, d))
    monkeypatch.setattr(api, "DISPATCHER", Dispatcher([url]))
    monkeypatch.setattr(api, "_plans", {})
    for _ in range(3):
        out, lse = autoflash.attention(q, k, v, causal=True, return_lse=True)
    assert_matches_reference(out, lse, q, k, v, True)
    assert reads == [(url, "fwd")], "the database is read once per process, the backward's at the first backward"
    assert_gradients_match(q, k, v, True)
    assert reads == [(url, "fwd"), (url, "bwd")]
    text = autoflash.explain(q, k, v, causal=True)
    assert text.count("exact problem tuned") == 2 and tuned.to_json() in text and tuned_bwd.to_json() in text
    deterministic = autoflash.explain(q, k, v, causal=True, deterministic=True)
    assert "dQ in its own pass" in deterministic
    assert reads == [(url, "fwd"), (url, "bwd")]


def test_merge_copies_each_trial_once_and_can_keep_current_templates_only(tuned_db, tmp_path):
    into = Store(f"sqlite:///{tmp_path / 'gathered.db'}")
    assert into.merge(Store(tuned_db, readonly=True)) == (5, 0)
    assert into.merge(Store(tuned_db, readonly=True)) == (0, 0), "merging again copies nothing"
    current = {d: set(codegen.current_fingerprints(d).values()) for d in ("fwd", "bwd")}
    only = Store(f"sqlite:///{tmp_path / 'current.db'}")
    assert only.merge(Store(tuned_db, readonly=True), current) == (4, 0), "the other templates' trial stays out"
    assert Dispatcher([only.url]).choice(BASE, H100).knobs == FAST


def test_merge_command_takes_file_paths_and_explains_a_bad_source(tuned_db, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from autoflash.cli import main

    monkeypatch.chdir(tmp_path)  # relative paths, as a user types them
    merged = CliRunner().invoke(main, ["merge", "--into", "gathered.db", "user.db", "--current-only"])
    assert merged.exit_code == 0, merged.output
    assert "4 trial(s)" in merged.output and (tmp_path / "gathered.db").exists()
    bad = CliRunner().invoke(main, ["merge", "--into", "gathered.db", "missing/nothing.db"])
    assert bad.exit_code != 0 and "cannot open the database" in bad.output and "Traceback" not in bad.output


def test_tuner_starts_from_the_winners_of_earlier_templates(tuned_db):
    from autoflash.tune.tuner import earlier_best

    store = Store(tuned_db)
    assert earlier_best(store, H100, BASE) == [ELSEWHERE], "the record of other templates is a first guess"
    assert earlier_best(store, H100, dataclasses.replace(BASE, causal=True)) == []


@pytest.mark.parametrize("loads", ["tma", "tma_host"])
def test_tma_winners_use_pointer_loads_on_misaligned_tensors(tmp_path, loads):
    url = f"sqlite:///{tmp_path / 'tma.db'}"
    record(Store(url), H100, BASE, dataclasses.replace(FAST, loads=loads), 1.0)
    dispatcher = Dispatcher([url])
    aligned = make_qkv(1, 2, 2, 8, 8, 64, __import__("torch").float16, "cpu")
    misaligned = make_qkv(1, 2, 2, 8, 8, 68, __import__("torch").float16, "cpu")
    misaligned = tuple(t[..., :64] for t in misaligned)  # rows of 136 bytes: not a multiple of 16
    assert dispatcher.for_call(BASE, H100, "fwd", aligned).knobs.loads == loads
    fallback = dispatcher.for_call(BASE, H100, "fwd", misaligned)
    assert fallback.knobs.loads == "pointer" and "pointer loads instead" in fallback.reason


def test_a_family_that_cannot_run_a_call_gives_way_to_the_default(tmp_path):
    from autoflash.families import gluon

    url = f"sqlite:///{tmp_path / 'gluon.db'}"
    record(Store(url), H100, BASE, gluon.FwdKnobs(), 1.0)
    dispatcher = Dispatcher([url])
    aligned = make_qkv(1, 2, 2, 8, 8, 64, __import__("torch").float16, "cpu")
    assert dispatcher.for_call(BASE, H100, "fwd", aligned).knobs == gluon.FwdKnobs()
    misaligned = tuple(t[..., :64] for t in make_qkv(1, 2, 2, 8, 8, 68, __import__("torch").float16, "cpu"))
    fallback = dispatcher.for_call(BASE, H100, "fwd", misaligned)
    assert fallback.knobs.family == "tl" and fallback.knobs.loads == "pointer" and fallback.source == "default"
    assert "Gluon's TMA needs 16-byte aligned" in fallback.reason


def test_a_gpu_without_records_runs_defaults_with_one_notice(tuned_db, monkeypatch):
    """A GPU no database tuned (an L40S here) gets the heuristic default, and one notice naming `autoflash tune`
    per process and direction; a GPU with records gets none."""
    monkeypatch.setattr(dispatch, "_noticed", set())
    l40s = Gpu("l40s", "NVIDIA L40S", (8, 9), 142, 101376, 65536)
    d = Dispatcher([tuned_db])
    with pytest.warns(UserWarning, match=r"no tuned forward kernels for NVIDIA L40S .*autoflash tune") as seen:
        assert d.choice(BASE, l40s).source == "default"
        assert d.choice(dataclasses.replace(BASE, batch=2), l40s).source == "default"
    assert sum("no tuned" in str(w.message) for w in seen) == 1
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d.choice(dataclasses.replace(BASE, batch=2), H100)


@pytest.mark.parametrize("name, multiprocessors, family", [
    ("NVIDIA H100 80GB HBM3", 132, "h100"), ("NVIDIA H100 PCIe", 114, "h100-pcie"), ("NVIDIA H100 NVL", 132, "h100-nvl"),
    ("NVIDIA H800", 132, "h800"), ("NVIDIA H200", 132, "h200"), ("NVIDIA GH200 480GB", 132, "gh200"),
    ("NVIDIA A100-SXM4-80GB", 108, "a100"), ("NVIDIA A100 80GB PCIe", 108, "a100-pcie"),
    ("NVIDIA H100 80GB HBM3", 114, "h100-114sm"), ("Tesla T4", 40, "tesla-t4"),
])
def test_gpu_families_tell_apart_what_changes_the_winners(name, multiprocessors, family):
    from autoflash.gpu import family_of
    assert family_of(name, multiprocessors) == family


def test_variant_records_count_under_their_own_kernels_fingerprint(tmp_path):
    """A window problem's records were measured on kernels with the window's code: dispatch reads those recorded
    under the window's fingerprint, not one recorded under the plain kernels' (its window code was not counted)."""
    url = f"sqlite:///{tmp_path / 'user.db'}"
    store = Store(url)
    window = BASE.with_variants(window_size=(256, 0))
    window_fingerprint = codegen.template_fingerprint("tl", "fwd", window.gates())
    assert window_fingerprint != codegen.template_fingerprint("tl", "fwd")
    record(store, H100, window, FAST, 1.0)  # under the plain fingerprint: not this problem's kernels
    record(store, H100, window, NEAR, 2.0, fingerprint=window_fingerprint)
    record(store, H100, BASE, ELSEWHERE, 0.5)
    store.close()
    found = {(r.problem, r.knobs) for r in dispatch.read_records(url, "h100")}
    assert found == {(window, NEAR), (BASE, ELSEWHERE)}


def test_an_untuned_backward_on_hopper_runs_gluons_default_and_tls_where_gluon_refuses(tmp_path):
    """Nothing tuned (an H200 here): the backward's default is the Gluon family's (families.DEFAULT_ORDER), and a
    deterministic call, which the Gluon backward refuses (dQ by atomics), gets the next family's default."""
    import warnings

    import torch

    from autoflash import families
    from autoflash.families import gluon

    h200 = Gpu("h200", "NVIDIA H200", (9, 0), 132, 232448, 65536)
    d = Dispatcher([f"sqlite:///{tmp_path / 'empty.db'}"])
    tensors = make_qkv(1, 2, 2, 8, 8, 64, torch.float16, "cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the untuned GPU's notice)
        plain = d.for_call(BASE, h200, "bwd", tensors)
        deterministic = d.for_call(BASE, h200, "bwd", tensors, deterministic=True)
    assert plain.source == "default" and plain.knobs == gluon.default_knobs(BASE, h200, "bwd")
    assert deterministic.source == "default" and deterministic.knobs.family == "tl"
    assert deterministic.knobs.dq == "separate" and "Gluon backward adds dQ with atomics" in deterministic.reason
    assert families.default_knobs(BASE, h200, "fwd").family == "gluon"  # from 512 queries
    assert families.default_knobs(dataclasses.replace(BASE, seqlen_q=257), h200, "fwd").family == "tl"  # below
    assert families.default_knobs(BASE, KNOWN_A100, "bwd").family == "tl"  # no Gluon off Hopper
    for direction in families.DIRECTIONS:
        assert sorted(families.DEFAULT_ORDER[direction]) == sorted(f.name for f in families.implementing(direction))
    assert sorted(families.SHORT_FWD_ORDER) == sorted(families.DEFAULT_ORDER["fwd"])
