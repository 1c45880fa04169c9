"""Packed problems (attention_varlen's VARLEN, attention_with_kvcache's PAGED) are tuned and dispatched like dense
ones: problems files, the trials' lengths, the searched space, dispatch's preference, and end to end under Triton's
interpreter."""

import re
from dataclasses import replace

import pytest
import torch
from click.testing import CliRunner

import autoflash
from autoflash import codegen, dispatch, families, varlen
from autoflash.cli import main
from autoflash.dispatch import Dispatcher, Record
from autoflash.families.tl.knobs import FwdKnobs
from autoflash.gpu import INTERPRETER, KNOWN
from autoflash.problem import Problem
from autoflash.shapes import ShapesError, load_problems
from autoflash.db.store import Store
from autoflash.tune.search import valid_points
from autoflash.tune.tuner import searched_space
from conftest import DEVICE

VARLEN, PAGED = frozenset({"VARLEN"}), frozenset({"VARLEN", "PAGED"})
H100 = KNOWN["h100"]


def problems(tmp_path, entries: str) -> list[Problem]:
    path = tmp_path / "shapes.yaml"
    path.write_text(f"problems:\n{entries}")
    return load_problems(path)


def test_problems_file_takes_varlen_and_kvcache_entries(tmp_path):
    packed, dense_cache, pages16, pages256 = problems(
        tmp_path, "  - {batch: 16, heads_q: 32, heads_kv: 8, seqlen_q: 8192, head_dim: 128, causal: true, varlen: true}\n"
                  "  - {batch: 32, heads_q: 64, heads_kv: 8, seqlen_q: 1, seqlen_k: 32768, head_dim: 128,"
                  " kvcache: {page_size: [0, 16, 256]}}\n")
    assert packed == Problem(16, 32, 8, 8192, 8192, 128, True, "float16", VARLEN)
    assert dense_cache == Problem(32, 64, 8, 1, 32768, 128, False, "float16", VARLEN)
    assert (pages16.variants, pages16.page_size, pages256.page_size) == (PAGED, 16, 256)
    assert pages16.key() == "b32-hq64-hkv8-sq1-sk32768-d128-full-float16-paged-varlen-page16"
    assert pages16.with_stored_variants(pages16.stored_variants()).validate() == pages16
    assert problems(tmp_path, "  - {batch: 2, heads_q: 2, seqlen_q: 1, seqlen_k: 64, head_dim: 16, kvcache: {}}\n") \
        == [Problem(2, 2, 2, 1, 64, 16, False, "float16", VARLEN)]


@pytest.mark.parametrize("entry, message", [
    ("seqlen_q: 40, varlen: true", "write 64, not 40"),
    ("seqlen_q: 64, varlen: 1", "field 'varlen' must be true or false"),
    ("seqlen_q: 64, kvcache: {page_size: -16}", "field 'kvcache' must be {page_size: N}"),
    ("seqlen_q: 64, kvcache: {pages: 16}", "field 'kvcache' must be {page_size: N}"),
    ("seqlen_q: 64, kvcache: 16", "field 'kvcache' must be {page_size: N}"),
    ("seqlen_q: 64, varlen: true, window_size: [8, 0]", "take no window_size, softcap or alibi"),
    ("seqlen_q: 64, kvcache: {page_size: 16}, softcap: 30", "take no window_size, softcap or alibi"),
])
def test_malformed_packed_entries_are_refused_with_the_field(tmp_path, entry, message):
    with pytest.raises(ShapesError, match=r"problems\[0\].*" + message.replace("{", r"\{").replace("[", r"\[")):
        problems(tmp_path, f"  - {{batch: 2, heads_q: 2, head_dim: 16, {entry}}}\n")


def test_sequence_lengths_follow_the_documented_distribution():
    prefill, decode = Problem(16, 4, 4, 8192, 8192, 64, True, "float16", VARLEN), \
        Problem(32, 8, 1, 1, 32768, 64, False, "float16", PAGED, page_size=16)
    queries, keys = prefill.sequence_lengths()
    assert queries == keys and keys[0] == 8192 and all(512 <= n <= 8192 for n in keys) and len(set(keys)) > 8
    assert keys == prefill.sequence_lengths()[1], "fixed by the problem alone"
    queries, keys = decode.sequence_lengths()
    assert queries == [1] * 32 and keys[0] == 32768 and min(keys) >= 2048
    assert keys == replace(decode, page_size=256).sequence_lengths()[1], "page sizes compare on the same lengths"


def test_searched_space_of_packed_problems_holds_only_valid_variants():
    tl = families.FAMILIES["tl"]
    for problem, loads, splits in (
            (Problem(16, 32, 8, 8192, 8192, 128, True, "bfloat16", VARLEN), ["pointer", "tma"], [1]),
            (Problem(32, 64, 8, 1, 32768, 128, False, "bfloat16", PAGED, page_size=16), ["pointer"], [1, 2, 4, 8, 16])):
        is_valid, space = searched_space(tl, problem, H100)
        assert (space["loads"], space["schedule"], space["kv_splits"]) == (loads, ["in_order"], splits)
        points = valid_points(space, is_valid)
        assert points and not any(families.violations(FwdKnobs(**p), problem, H100) for p in points)
    paged = Problem(2, 2, 1, 1, 64, 16, False, "float16", PAGED, page_size=16)
    _, space = searched_space(tl, paged, H100, "bwd")
    assert not all(space.values()), "a paged cache has no backward to tune"


def test_dispatch_prefers_tuned_packed_problems_over_nearer_dense_ones():
    call = Problem(8, 4, 4, 1024, 1024, 64, True, "float16", VARLEN)
    dense, packed = FwdKnobs(block_m=64), FwdKnobs(block_m=32)
    records = [Record(replace(call, variants=frozenset()), dense, 1.0, 1.0),
               Record(replace(call, batch=64, seqlen_q=4096, seqlen_k=4096), packed, 1.0, 1.0)]
    choice = dispatch.choose(call, INTERPRETER, [("dense.db", records[:1]), ("packed.db", records[1:])])
    assert choice.knobs == packed and "nearest tuned problem (log2 distance 7.00)" in choice.reason
    choice = dispatch.choose(call, INTERPRETER, [("dense.db", records[:1])])
    assert choice.knobs == dense and "nearest tuned dense problem" in choice.reason
    paged = Problem(8, 4, 4, 1, 1024, 64, False, "float16", PAGED, page_size=16)
    pages = [Record(replace(paged, page_size=size), FwdKnobs(block_n=size), 1.0, 1.0) for size in (256, 32)]
    assert dispatch.choose(paged, INTERPRETER, [("pages.db", pages)]).knobs.block_n == 32


def test_dispatch_never_gives_a_dense_problem_packed_knobs():
    dense = Problem(1, 4, 4, 4096, 4096, 64, True, "float16")
    packed = Record(replace(dense, batch=8, variants=VARLEN), FwdKnobs(block_m=32), 1.0, 1.0)
    choice = dispatch.choose(dense, INTERPRETER, [("packed.db", [packed])])
    assert choice.tuned is None and "nothing comparable tuned" in choice.reason
    assert choice.knobs == families.default_knobs(dense, INTERPRETER, "fwd")


def test_tuned_varlen_and_kvcache_problems_are_shown_and_dispatched(tmp_path, monkeypatch):
    shapes = tmp_path / "packed.yaml"
    shapes.write_text("problems:\n"
                      "  - {batch: 3, heads_q: 2, heads_kv: 1, seqlen_q: 32, head_dim: 16, causal: true, varlen: true}\n"
                      "  - {batch: 3, heads_q: 2, heads_kv: 1, seqlen_q: 1, seqlen_k: 64, head_dim: 16,"
                      " kvcache: {page_size: 16}}\n")
    url = f"sqlite:///{tmp_path / 'packed.db'}"
    result = CliRunner().invoke(main, ["tune", "--interpret", "--shapes", str(shapes), "--trials", "2", "--db", url,
                                       "--seed", "0", "--mode", "both"])
    assert result.exit_code == 0, result.output
    shown = CliRunner().invoke(main, ["show", "--db", url])
    assert shown.exit_code == 0, shown.output
    assert "b3 h2/1 s32 d16 causal fp16 varlen" in shown.output
    assert re.search(r"b3 h2/1 s1/64 d16 fp16 paged varlen page16\s+fwd", shown.output)
    assert re.search(r"b3 h2/1 s32 d16 causal fp16 varlen\s+bwd", shown.output)
    assert not re.search(r"page16\s+bwd", shown.output), "a KV cache has no backward to tune"

    chosen = []
    dispatcher = Dispatcher([url])
    real = dispatcher.for_call
    monkeypatch.setattr(dispatcher, "for_call", lambda *args: chosen.append(real(*args)) or chosen[-1])
    monkeypatch.setattr(varlen, "DISPATCHER", dispatcher)
    monkeypatch.setattr(varlen, "_plans", {})
    gen = torch.Generator().manual_seed(3)
    lengths = [30, 7, 19]  # the longest rounds up to the tuned 32
    q, k, v = (torch.randn(sum(lengths), heads, 16, generator=gen).to(DEVICE, torch.float16) for heads in (2, 1, 1))
    cu = torch.tensor([0, 30, 37, 56], dtype=torch.int32, device=DEVICE)
    autoflash.attention_varlen(q, k, v, cu, cu, 30, 30, causal=True)
    pages = torch.randperm(12, generator=gen).view(3, 4).to(DEVICE, torch.int32)
    k_cache, v_cache = (torch.randn(12, 16, 1, 16, generator=gen).to(DEVICE, torch.float16) for _ in range(2))
    autoflash.attention_with_kvcache(torch.randn(3, 1, 2, 16, generator=gen).to(DEVICE, torch.float16), k_cache,
                                     v_cache, cache_seqlens=torch.tensor([50, 3, 64], dtype=torch.int32, device=DEVICE),
                                     block_table=pages)
    assert [c.source for c in chosen] == [url, url] and all("exact problem tuned" in c.reason for c in chosen)
    assert [c.tuned.problem.key() for c in chosen] == [
        "b3-hq2-hkv1-sq32-sk32-d16-causal-float16-varlen", "b3-hq2-hkv1-sq1-sk64-d16-full-float16-paged-varlen-page16"]
    for c in chosen:  # filed under the templates of the variants' gates, as the window problems are
        fingerprint = codegen.template_fingerprint("tl", "fwd", c.tuned.problem.gates())
        assert [b.problem for b in Store(url).best("interpreter", fingerprint)] == [c.tuned.problem]


def test_rates_of_packed_problems_count_the_sequences_the_trials_run():
    """A packed problem's FLOPs and K/V bytes are those of the lengths its trials pack (a causal square per
    sequence, a decode row over each cache), not of the dense batch its key names."""
    packed = Problem(16, 32, 8, 8192, 8192, 128, True, "bfloat16", VARLEN)
    lengths_q, lengths_k = packed.sequence_lengths()
    per_sequence = [2.0 * 32 * q * k * 128 for q, k in zip(lengths_q, lengths_k)]  # causal, q == k: half of 4·h·q·k·d
    assert packed.flops() == pytest.approx(sum(per_sequence))
    assert packed.flops() < 0.5 * replace(packed, variants=frozenset()).flops(), "log-uniform lengths: far below"
    decode = Problem(32, 64, 8, 1, 32768, 128, False, "bfloat16", PAGED, page_size=16)
    keys = sum(decode.sequence_lengths()[1])
    assert decode.kv_bytes() == 2 * keys * 8 * 128 * 2 and decode.flops() == pytest.approx(4.0 * 64 * keys * 128)
    assert replace(decode, variants=frozenset(), page_size=0).kv_bytes() == 2 * 32 * 32768 * 8 * 128 * 2
