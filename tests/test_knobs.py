"""The knob declarations and the families' validity functions."""

import dataclasses

import pytest

from autoflash.families import check, fa1, knobs_from_json, not_worth_timing, violations
from autoflash.families.tl.defaults import default_knobs  # tl's own (Hopper's forward tries Gluon's first)
from autoflash.families.tl.knobs import BwdKnobs, FwdKnobs
from autoflash.families.tl.limits import column_tiles, grid_y, programs, shared_memory_bytes
from autoflash.gpu import INTERPRETER, Gpu
from autoflash.knobs import InvalidKnobs
from autoflash.problem import Problem
from autoflash.resources import launcher

PROBLEM = Problem(batch=1, heads_q=8, heads_kv=8, seqlen_q=4096, seqlen_k=4096, head_dim=128, causal=False,
                  dtype="float16")
A100 = Gpu("a100", "NVIDIA A100", (8, 0), 108, 166912, 65536)
H100 = Gpu("h100", "NVIDIA H100", (9, 0), 132, 232448, 65536)


@pytest.mark.parametrize("cls", [FwdKnobs, BwdKnobs, fa1.FwdKnobs], ids=str)
def test_every_knob_declares_choices_and_doc(cls):
    space, choices = cls.search_space(), cls.choices()
    assert set(space) == set(choices) == {f.name for f in dataclasses.fields(cls)}
    for name in choices:
        assert getattr(cls(), name) in space[name] and set(space[name]) <= set(choices[name])
        assert cls.docs()[name]


def test_json_round_trip_names_the_family():
    for knobs in (fa1.FwdKnobs(block_m=32, exp="exp", causal_split=False), FwdKnobs(block_m=32, loads="tma"),
                  BwdKnobs(dq="atomic")):
        assert knobs_from_json(knobs.DIRECTION, knobs.to_json()) == knobs
    assert FwdKnobs(block_m=32).template_context()["BLOCK_M"] == 32
    assert fa1.FwdKnobs(causal_split=False).template_context()["CAUSAL_SPLIT"] is False


def test_records_of_the_single_template_folder_read_as_their_family():
    """Before families had folders, a record named a loop order: fa2 is the tl family, fa1 its own."""
    old = '{"block_m": 64, "block_n": 64, "causal_split": true, "exp": "exp2", "head_dim_split": false, "kv_splits": 1, ' \
          '"loads": "tma", "loop_order": %s, "num_stages": 2, "num_warps": 4, "pack_gqa": false, "schedule": "in_order"}'
    assert knobs_from_json("fwd", old % '"fa2"') == FwdKnobs(block_m=64, block_n=64, loads="tma")
    assert knobs_from_json("fwd", (old % '"fa1"').replace('"tma"', '"pointer"')) == fa1.FwdKnobs(block_m=64)
    assert knobs_from_json("bwd", BwdKnobs().to_json().replace('"family": "tl", ', "")) == BwdKnobs()


def test_values_outside_the_choices_are_refused():
    with pytest.raises(ValueError, match="block_m=48"):
        FwdKnobs(block_m=48)
    with pytest.raises(ValueError, match="block_m=64.0"):
        FwdKnobs(block_m=64.0)  # equal to a choice, of another type: a tampered record
    with pytest.raises(ValueError, match="unknown knobs"):
        FwdKnobs.from_json('{"block_m": 64, "swizzle": 2}')
    with pytest.raises(ValueError, match="no kernel family 'cuda'"):
        knobs_from_json("fwd", '{"family": "cuda", "block_m": 64}')
    with pytest.raises(ValueError, match="no kernel family 'fa1' with bwd"):
        knobs_from_json("bwd", fa1.FwdKnobs().to_json())


@pytest.mark.parametrize("knobs, gpu, problem, reason", [
    (FwdKnobs(), H100, dataclasses.replace(PROBLEM, batch=16384, seqlen_q=1), "grid's y axis"),
    (BwdKnobs(block_n=16, block_m=16, num_warps=2), H100, dataclasses.replace(PROBLEM, batch=8192), "grid's y axis"),
    (FwdKnobs(loads="tma"), A100, PROBLEM, "compute capability 9.0"),
    (FwdKnobs(loads="tma_host"), A100, PROBLEM, "compute capability 9.0"),
    (FwdKnobs(loads="tma_host"), H100, dataclasses.replace(PROBLEM, head_dim=36), "16-byte rows"),
    (FwdKnobs(loads="tma"), H100, dataclasses.replace(PROBLEM, head_dim=36), "16-byte rows"),
    (FwdKnobs(block_m=16, block_n=16, num_warps=8), H100, PROBLEM, "too small for 8 warps"),
    (FwdKnobs(block_m=128), H100, dataclasses.replace(PROBLEM, seqlen_q=7), "exceeds the 7 query rows"),
    (FwdKnobs(block_m=64, pack_gqa=True), H100, dataclasses.replace(PROBLEM, heads_kv=2, seqlen_q=7),
     "exceeds the 28 query rows"),
    (FwdKnobs(loads="tma", pack_gqa=True), H100, dataclasses.replace(PROBLEM, heads_kv=2), "pointer loads only"),
    (fa1.FwdKnobs(block_m=16, block_n=16, num_warps=8), H100, PROBLEM, "too small for 8 warps"),
    (fa1.FwdKnobs(block_m=128, block_n=128, num_stages=3), H100, dataclasses.replace(PROBLEM, head_dim=256),
     "shared memory"),
    (FwdKnobs(head_dim_split=True), H100, dataclasses.replace(PROBLEM, head_dim=16), "below tl.dot's 16"),
    (FwdKnobs(block_n=256, num_stages=5), H100, PROBLEM, "shared memory"),
    (FwdKnobs(block_m=256, block_n=128, num_warps=4), H100, PROBLEM, "registers"),
])
def test_violations(knobs, gpu, problem, reason):
    assert any(reason in why for why in violations(knobs, problem, gpu))
    with pytest.raises(InvalidKnobs):
        check(knobs, problem, gpu)


def test_good_variants_pass():
    assert violations(FwdKnobs(block_m=128, block_n=128, num_warps=8, num_stages=3, loads="tma"), PROBLEM, H100) == []
    assert violations(FwdKnobs(block_m=16, block_n=16, num_warps=2), dataclasses.replace(PROBLEM, seqlen_q=1),
                      INTERPRETER) == []


def test_fit_moves_a_huge_batch_to_the_grids_x_axis():
    decode = dataclasses.replace(PROBLEM, batch=16384, seqlen_q=1)
    knobs = default_knobs(decode, H100)
    assert knobs.schedule == "longest_first" and not violations(knobs, decode, H100)


def test_tuner_skips_tiles_far_below_the_problem():
    assert not_worth_timing(FwdKnobs(block_m=32, block_n=64, num_warps=2), PROBLEM, H100)
    assert not_worth_timing(FwdKnobs(block_m=64, block_n=64, num_warps=8), PROBLEM, H100)
    assert not not_worth_timing(FwdKnobs(block_m=128, block_n=64, num_warps=8), PROBLEM, H100)
    decode = dataclasses.replace(PROBLEM, seqlen_q=1)
    assert not not_worth_timing(FwdKnobs(block_m=16, block_n=64, num_warps=4), decode, H100)
    assert not_worth_timing(FwdKnobs(schedule="longest_first"), PROBLEM, H100), "order matters only under causal masking"
    assert not not_worth_timing(FwdKnobs(schedule="longest_first"), dataclasses.replace(PROBLEM, causal=True), H100)


def test_key_splits_only_where_sms_would_idle():
    decode = dataclasses.replace(PROBLEM, seqlen_q=1)
    assert not not_worth_timing(FwdKnobs(block_m=16, block_n=64, num_warps=4, kv_splits=16), decode, H100)
    busy = dataclasses.replace(PROBLEM, batch=8)  # 8 x 8 heads x 32 query blocks
    assert not_worth_timing(FwdKnobs(kv_splits=2), busy, H100)
    short = dataclasses.replace(decode, seqlen_k=100)  # two key blocks of 64
    assert not_worth_timing(FwdKnobs(block_m=16, block_n=64, num_warps=4, kv_splits=2), short, H100)
    assert not violations(FwdKnobs(block_m=16, num_warps=2, kv_splits=16), decode, H100)


def test_packed_unequal_lengths_split_keys_up_to_sixteen_programs_an_sm():
    """KV-cache decode over caches of unequal lengths: 256 programs (32 sequences x 8 KV heads, query heads
    packed) get 8 splits (2048 programs on 132 SMs), where equal lengths (the dense problem) get none; a packed
    prefill, thousands of programs, none either."""
    decode = Problem(32, 64, 8, 1, 32768, 128, False, "bfloat16")
    packed = dataclasses.replace(decode, variants=frozenset({"VARLEN"}))
    assert default_knobs(packed, H100).kv_splits == 8
    assert default_knobs(decode, H100).kv_splits == 1
    assert not not_worth_timing(default_knobs(packed, H100), packed, H100)
    prefill = Problem(16, 32, 8, 3563, 3563, 128, True, "bfloat16", frozenset({"VARLEN"}))
    assert default_knobs(prefill, H100).kv_splits == 1
    assert not_worth_timing(dataclasses.replace(default_knobs(prefill, H100), kv_splits=2), prefill, H100)


def test_default_splits_keys_for_decode_only():
    decode = dataclasses.replace(PROBLEM, seqlen_q=1)
    assert default_knobs(decode, H100).kv_splits > 1
    assert default_knobs(PROBLEM, H100).kv_splits == 1  # 256 programs of 128 query rows fill the 132 SMs


def test_packed_heads_change_the_grid():
    gqa_decode = dataclasses.replace(PROBLEM, batch=2, heads_kv=2, seqlen_q=1)  # 4 query heads per KV head
    packed, unpacked = FwdKnobs(block_m=16, num_warps=2, pack_gqa=True), FwdKnobs(block_m=16, num_warps=2)
    assert (programs(packed, gqa_decode), grid_y(packed, gqa_decode)) == (4, 4)  # one 16-row tile per KV head
    assert (programs(unpacked, gqa_decode), grid_y(unpacked, gqa_decode)) == (16, 16)
    assert not_worth_timing(packed, dataclasses.replace(gqa_decode, heads_kv=8), H100), "no group: nothing to pack"
    assert not violations(packed, gqa_decode, H100)


def test_default_packs_query_heads_for_gqa_decode_only():
    gqa = dataclasses.replace(PROBLEM, heads_kv=2)
    decode = default_knobs(dataclasses.replace(gqa, seqlen_q=1), H100)
    assert decode.pack_gqa and decode.loads == "pointer" and decode.kv_splits > 1
    assert not default_knobs(gqa, H100).pack_gqa  # 4096 query rows per head fill their tiles
    assert not default_knobs(dataclasses.replace(PROBLEM, seqlen_q=1), H100).pack_gqa  # MHA: nothing to pack


@pytest.mark.parametrize("head_dim, tiles", [(40, (32, 16)), (80, (64, 16)), (96, (64, 32)), (72, (64, 16)),
                                             (160, (128, 32)), (200, (128, 128))])
def test_head_dim_split_tiles(head_dim, tiles):
    problem = dataclasses.replace(PROBLEM, head_dim=head_dim)
    split, padded = FwdKnobs(head_dim_split=True), FwdKnobs()
    assert column_tiles(split, problem) == tiles and sum(tiles) >= head_dim
    assert launcher("common", "columns").column_tiles(split.as_point(), head_dim) == tiles  # the launchers' one rule
    assert shared_memory_bytes(split, problem) * column_tiles(padded, problem)[0] == \
        shared_memory_bytes(padded, problem) * sum(tiles)  # the estimates follow the columns the tiles span


def test_tuner_skips_splits_that_save_no_columns():
    split = FwdKnobs(head_dim_split=True)
    for head_dim in (64, 112, 128):  # 32 + 32, 64 + 64, 64 + 64: as many columns as one padded tile
        assert any("no fewer" in why for why in not_worth_timing(split, dataclasses.replace(PROBLEM, head_dim=head_dim),
                                                                  H100))
    assert not not_worth_timing(split, dataclasses.replace(PROBLEM, head_dim=80), H100)


def test_default_splits_head_dims_between_powers_of_two():
    for head_dim, split in ((40, True), (80, True), (96, True), (64, False), (112, False), (128, False)):
        problem = dataclasses.replace(PROBLEM, head_dim=head_dim)
        assert default_knobs(problem, H100).head_dim_split is split, head_dim
        assert not violations(default_knobs(problem, H100), problem, H100)


def test_gluon_refuses_what_it_cannot_run():
    from autoflash.families import gluon

    causal = dataclasses.replace(PROBLEM, causal=True)
    assert not violations(gluon.FwdKnobs(q_buffers=2), causal, H100)
    assert any("two Q tiles" in why for why in violations(gluon.FwdKnobs(q_buffers=2, overlap=False), causal, H100))
    assert not violations(gluon.FwdKnobs(q_buffers=2, tile_overlap=True), PROBLEM, H100)
    assert any("tile_overlap" in why for why in violations(gluon.FwdKnobs(tile_overlap=True), PROBLEM, H100))
    # (wrong results on the H100, NOTES G9: causal, dynamic, three consumers)
    for knobs, problem in ((gluon.FwdKnobs(q_buffers=2, tile_overlap=True), causal),
                           (gluon.FwdKnobs(q_buffers=2, dynamic=True, tile_overlap=True), PROBLEM),
                           (gluon.FwdKnobs(q_buffers=2, consumers=3, consumer_regs=160, block_n=64, tile_overlap=True),
                            dataclasses.replace(PROBLEM, head_dim=64))):
        assert any("tile_overlap" in why and "G9" in why for why in violations(knobs, problem, H100)), knobs
    assert any("no interpreter" in why for why in violations(gluon.FwdKnobs(), PROBLEM, INTERPRETER))
    assert any("sm_90" in why for why in violations(gluon.FwdKnobs(), PROBLEM, A100))
    assert any("fp16 or bf16" in why for why in violations(gluon.FwdKnobs(), dataclasses.replace(PROBLEM, dtype="float32"),
                                                        H100))


@pytest.mark.parametrize("head_dim", [16, 32, 64, 80, 128, 256])
def test_gluon_dq_turns_only_where_each_warpgroup_adds_all_of_dq(head_dim):
    """dq_turns runs where the default has each of two warpgroups add dQ's whole tile from its own keys (head dims to
    64 in 64-row steps); not beside the dQ writer (it would wait for tiles no one hands it), nor with one warpgroup."""
    from autoflash.families import gluon

    problem = dataclasses.replace(PROBLEM, head_dim=head_dim, causal=True)
    block_m = 64 if head_dim <= 128 else 32
    turns = gluon.BwdKnobs(block_m=block_m, dq_turns=True)
    assert not violations(dataclasses.replace(turns, dq_turns=False), problem, H100)
    if head_dim <= 64:
        assert not violations(turns, problem, H100)
        assert not violations(dataclasses.replace(turns, group_splits=2), dataclasses.replace(problem, heads_kv=4),
                              H100)
    else:  # (the warpgroups split dQ's columns, or hold the same keys)
        assert any("dq_turns alternates" in why for why in violations(turns, problem, H100))
    refused = {"warpgroups": 1, "dq_writer": True, "block_m": 128}
    for name, value in refused.items():
        assert any("dq_turns" in why for why in violations(dataclasses.replace(turns, **{name: value}), problem, H100))


@pytest.mark.parametrize("head_dim", [16, 64, 128, 256])
def test_gluon_dv_late_runs_wherever_its_knobs_do(head_dim):
    """dv_late moves dV's wgmma after dS^T's store (NOTES G-bwd21): it adds no refusal of its own, and the default
    takes it where it was measured faster: full attention to head dim 128, causal to 64, not packed or masked."""
    from autoflash.families import gluon

    for causal, heads_kv in ((False, 8), (True, 2)):
        problem = dataclasses.replace(PROBLEM, head_dim=head_dim, causal=causal, heads_kv=heads_kv)
        default = gluon.default_knobs(problem, H100, "bwd")
        assert default is not None and default.dv_late == (head_dim <= 64 or head_dim <= 128 and not causal)
        packed = gluon.default_knobs(dataclasses.replace(problem, variants=frozenset({"VARLEN"})), H100, "bwd")
        assert packed is not None and not packed.dv_late
        default = dataclasses.replace(default, dv_late=False)
        if default.split_keys:  # (past head dim 192 the default's split_keys refuses dv_late: the 32-row steps)
            default = dataclasses.replace(default, split_keys=False, num_buffers=2, block_m=32)
        for knobs in (default, dataclasses.replace(default, dq_writer=True, dq_turns=False),
                      dataclasses.replace(default, warpgroups=1, group_splits=1, dq_turns=False)):
            assert violations(dataclasses.replace(knobs, dv_late=True), problem, H100) == violations(knobs, problem,
                                                                                                    H100)
    assert True in gluon.BwdKnobs.choices()["dv_late"]
