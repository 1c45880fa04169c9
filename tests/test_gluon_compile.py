"""The Gluon family without a GPU: its forward and backward compile for sm_90 (shared memory within the H100's, no
register spills), its knobs refuse what it cannot run, its launchers refuse tensors TMA cannot read; the backward's
delta kernel (plain Triton) runs in the interpreter."""

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autoflash import codegen
from autoflash.families.gluon.defaults import default_knobs, fit, for_call
from autoflash.families.gluon.knobs import BwdKnobs, FwdKnobs
from autoflash.families.gluon.limits import (bwd_shared_memory_bytes, bwd_tiles, column_tiles, shared_memory_bytes,
                                             violations)
from autoflash.gpu import KNOWN
from autoflash.launch import compile_launch
from autoflash.problem import VARIANTS, Problem
from autoflash.resources import launcher

sys.path.insert(0, str(Path(__file__).parent))
import gluon_bwd_sm90  # noqa: E402
import gluon_sm90  # noqa: E402

H100 = KNOWN["h100"]


def _report(script):
    """The script's report of its CASES, compiled in a process of its own: under TRITON_INTERPRET=1 (set by
    conftest without a GPU) Triton's library functions are interpreted ones, which no compile can call."""
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, script.__file__], env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    return [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def compiled():
    return _report(gluon_sm90)


@pytest.fixture(scope="module")
def compiled_bwd():
    return _report(gluon_bwd_sm90)


def _assert_fits(row, knobs, problem, shared_estimate, spill_bytes=0):
    """A compiled variant the knobs allow: shared memory within the estimate and the H100's, register spills
    within `spill_bytes`."""
    assert violations(knobs, problem, H100) == []
    assert row["shared"] <= shared_estimate <= H100.shared_memory_per_block
    assert row["spill_stores"] <= spill_bytes and row["spill_loads"] <= spill_bytes, row


def _case_problem(head_dim, dtype, causal, variants) -> Problem:
    """The problem a compile case (gluon_sm90.CASES, gluon_bwd_sm90.CASES) stands for: 2 x 8/2 heads, 1000 tokens."""
    problem = Problem(2, 8, 2, 1000, 1000, head_dim, causal, dtype).with_variants(
        window_size=(100, 0 if causal else 30) if "WINDOW" in variants else (-1, -1), softcap="SOFTCAP" in variants,
        alibi="ALIBI" in variants, mask_mod="0123456789abcdef" if "MASK_MOD" in variants else "")
    if "VARLEN" in variants:  # packed sequences (the kernel's shapes are a dense problem's)
        problem = dataclasses.replace(problem, variants=frozenset({"VARLEN"}))
    return problem


@pytest.mark.parametrize("index", range(len(gluon_sm90.CASES)))
def test_compiles_for_sm90(compiled, index):
    change, head_dim, dtype, causal, _, *variants = gluon_sm90.CASES[index]
    knobs = FwdKnobs(**gluon_sm90.DEFAULT | change)
    variants = set(variants[0] if variants else ())
    problem = _case_problem(head_dim, dtype, causal, variants)
    row = compiled[index]
    # (the window's extra loop and the variants' arguments cost a few loop scalars: 24-36 B stored under triton 3.6,
    # NOTES G7; the document mask's reads of its capture up to 116 B stored, 156 loaded, NOTES G8)
    spill_bytes = 160 if "MASK_MOD" in variants else 128 if variants else 0
    _assert_fits(row, knobs, problem, shared_memory_bytes(knobs, problem), spill_bytes)
    assert row["setmaxnreg"] > 0 and row["wgmma"] > 0, row  # registers moved between partitions; async wgmma
    if knobs.programs_per_sm > 1:  # launched with its share of the SM's registers: that many programs fit
        maxnreg = launcher("gluon").launch_options(dataclasses.asdict(knobs))["maxnreg"]
        assert row["registers"] <= maxnreg and maxnreg * 128 * (knobs.consumers + 1) * knobs.programs_per_sm <= 65536


def _problem(head_dim=128, dtype="float16", causal=False, seqlen=4096):
    return Problem(2, 16, 4, seqlen, seqlen, head_dim, causal, dtype)


def _cross(head_dim=40, seqlen_q=4096, batch=2):
    """Cross-attention over a short context (Stable Diffusion's 77 text tokens): one key block a head."""
    return Problem(batch, 8, 8, seqlen_q, 77, head_dim, False, "float16")


@pytest.mark.parametrize("knobs, problem, gpu, reason", [
    (FwdKnobs(), _problem(), KNOWN["a100"], "needs sm_90"),
    (FwdKnobs(), _problem(dtype="float32"), H100, "fp16 or bf16"),
    (FwdKnobs(), _problem(head_dim=36), H100, "16-byte rows"),
    (FwdKnobs(), _problem(head_dim=512), H100, "outside 16..256"),
    (FwdKnobs(consumers=3, pingpong=True, consumer_regs=160), _problem(64), H100, "ping-pong alternates two"),
    (FwdKnobs(num_buffers=3), _problem(), H100, "shared memory"),
    (FwdKnobs(consumers=3, consumer_regs=160), _problem(), H100, "registers a thread"),
    (FwdKnobs(programs_per_sm=2), _problem(64), H100, "one consumer warpgroup each"),
    (FwdKnobs(consumers=1, programs_per_sm=2), _problem(), H100, "to each of 2 programs an SM"),
    (FwdKnobs(consumers=1, programs_per_sm=3), _problem(64), H100, "it gets 136"),
    (FwdKnobs(consumers=1, programs_per_sm=3, block_n=64), _problem(128), H100, "it gets 136"),
    (FwdKnobs(consumers=1, programs_per_sm=2, dynamic=True), _problem(64), H100, "left outputs unwritten"),
    (FwdKnobs(consumers=1, programs_per_sm=2), _cross(64).with_variants(softcap=True), H100, "plain problems only"),
    (FwdKnobs(consumers=3), _problem(64), H100, "exceed the SM's"),
    (FwdKnobs(persistent=False, dynamic=True), _problem(), H100, "needs a persistent grid"),
    (FwdKnobs(tile_overlap=True), _problem(), H100, "tile_overlap needs a persistent grid, two Q tiles"),
    (FwdKnobs(tile_overlap=True, q_buffers=2, persistent=False), _problem(), H100, "tile_overlap needs"),
    (FwdKnobs(tile_overlap=True, q_buffers=2), _problem().with_variants(window_size=(256, 0)), H100,
     "tile_overlap is rendered for plain problems, not WINDOW"),
    (FwdKnobs(tile_overlap=True, q_buffers=2, block_n=64, stage_o_in_q=True), _problem(256), H100, "shared memory"),
    (FwdKnobs(tile_overlap=True, q_buffers=2), _problem(causal=True), H100, "under causal masking (NOTES G9)"),
    (FwdKnobs(tile_overlap=True, q_buffers=2, dynamic=True), _problem(), H100, "claimed from the counter"),
    (FwdKnobs(tile_overlap=True, q_buffers=2, consumers=3, consumer_regs=160, block_n=64), _problem(64), H100,
     "two consumers only"),
    (FwdKnobs(head_dim_split=True), _problem(128), H100, "column tiles 64 + 64 are no fewer than one tile of 128"),
    (FwdKnobs(head_dim_split=True, block_n=64, stage_o_in_q=True), _problem(256), H100, "128 + 128"),
    (FwdKnobs(head_dim_split=True, tile_overlap=True, q_buffers=2), _problem(96), H100,
     "head_dim_split is not rendered with tile_overlap"),
    (FwdKnobs(head_dim_split=True, block_n=128), _problem(192), H100, "shared memory"),
    (FwdKnobs(consumer_keys=True), _problem(128), H100, "causal problems only"),
    (FwdKnobs(consumer_keys=True, pingpong=True), _problem(128, causal=True), H100, "without ping-pong"),
    (FwdKnobs(consumer_keys=True, consumers=1), _problem(128, causal=True), H100, "two or three consumers"),
    (FwdKnobs(consumer_keys=True), _problem(128, causal=True).with_variants(window_size=(256, 0)), H100, "not WINDOW"),
])
def test_violations(knobs, problem, gpu, reason):
    assert any(reason in why for why in violations(knobs, problem, gpu)), violations(knobs, problem, gpu)


@pytest.mark.parametrize("head_dim", [16, 40, 64, 72, 80, 96, 112, 128, 160, 192, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_default_is_valid(head_dim, causal, dtype):
    for seqlen in (1, 197, 256, 1000, 4096, 16384):
        problem = _problem(head_dim, dtype, causal, seqlen)
        knobs = default_knobs(problem, H100)
        assert knobs is not None and violations(knobs, problem, H100) == []
        # Short attention to head dim 64 without padded columns: three programs an SM of one consumer, 64-key blocks,
        # a static grid (NOTES 150, 151). Else causal tiles of unequal work: persistent programs claim them longest
        # first from a counter.
        short = head_dim in (16, 64) and seqlen <= (1024 if causal else 512)
        assert (knobs.consumers, knobs.programs_per_sm) == ((1, 3) if short else (knobs.consumers, 1))
        assert knobs.persistent and knobs.dynamic == (causal and not short)
        assert knobs.q_buffers == (1 if head_dim > 128 else 2)  # two Q tiles where shared memory holds them
        # Two column tiles where the padded one is past 64 columns and they drop a quarter of it (NOTES G16, G17);
        # 128-key blocks to 160 columns.
        assert knobs.head_dim_split == (head_dim in (72, 80, 96, 160, 192))
        assert knobs.block_n == (64 if head_dim in (192, 256) or short else 128)
    assert default_knobs(_problem(head_dim, dtype, causal), KNOWN["a100"]) is None


@pytest.mark.parametrize("head_dim, tiles", [(40, (32, 16)), (80, (64, 16)), (96, (64, 32)), (160, (128, 32)),
                                              (192, (128, 64))])
def test_head_dim_split_fits_where_padding_does_not(head_dim, tiles):
    """Where the split pays, its two column tiles span fewer columns than one padded tile: it runs where the padded
    tile runs, in less shared memory."""
    problem = _problem(head_dim, "bfloat16")
    split, padded = FwdKnobs(head_dim_split=True, block_n=64, stage_o_in_q=True), FwdKnobs(block_n=64,
                                                                                             stage_o_in_q=True)
    assert column_tiles(split, problem) == tiles and violations(split, problem, H100) == []
    assert shared_memory_bytes(split, problem) < shared_memory_bytes(padded, problem)


def test_launcher_refuses_what_tma_cannot_read():
    gluon = launcher("gluon")
    q = torch.empty(1, 2, 10, 68, dtype=torch.float16)[..., :64]  # rows of 136 bytes: not a multiple of 16
    k = torch.empty(1, 2, 10, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="16-byte"):
        gluon.forward_plan(None, dict(gluon_sm90.DEFAULT), q, k, k, k, None, 0.125, False)
    with pytest.raises(ValueError, match="fp16 or bf16"):
        gluon.forward_plan(None, dict(gluon_sm90.DEFAULT), k.float(), k.float(), k.float(), k.float(), None,
                           0.125, False)
    bshd = torch.empty(1, 10, 2, 64, dtype=torch.float16).transpose(1, 2)  # (B,S,H,D) memory: TMA reads it
    gluon._check(bshd, bshd, bshd, bshd, None)


# -- the backward --

@pytest.mark.parametrize("index", range(len(gluon_bwd_sm90.CASES)))
def test_backward_compiles_for_sm90(compiled_bwd, index):
    change, head_dim, dtype, causal, *variants = gluon_bwd_sm90.CASES[index]
    knobs = BwdKnobs(**gluon_bwd_sm90.DEFAULT | change)
    variants = set(variants[0] if variants else ())
    problem = _case_problem(head_dim, dtype, causal, variants)
    if knobs.uneven_groups:  # a group its splits do not divide: GQA 7:1
        problem = dataclasses.replace(problem, heads_q=14)
    row = compiled_bwd[index]
    # At d128 S^T, dP^T, P^T's copy, dK and dV take ~232 of a consumer's 240 registers: a few loop scalars
    # spill (132 B under triton 3.6; NOTES G-bwd3), reloaded once a step; softcapping's tanh, live from S^T to
    # dS^T, 352 B more (NOTES G-bwd15); a mask_mod's walk of its block table's lists, 40-88 B under triton 3.9,
    # 332-336 B beside the dQ writer's slots (NOTES G-bwd19). The head dim in two column tiles gives the first
    # warpgroup a d128 warpgroup's dK and dV in 64-row steps: d128's figures (NOTES G-bwd23).
    softcap = "SOFTCAP" in variants and (head_dim <= 128 or knobs.head_dim_split)
    spill = 512 if softcap else 384 if "MASK_MOD" in variants else 256
    _assert_fits(row, knobs, problem, bwd_shared_memory_bytes(knobs, problem), spill_bytes=spill)
    assert row["wgmma"] >= 5, row  # S^T, dP^T, dV, dK, dQ: asynchronous wgmma each


@pytest.mark.parametrize("head_dim", [16, 32, 40, 64, 80, 128, 192, 256])
@pytest.mark.parametrize("block_m", BwdKnobs.choices()["block_m"])
@pytest.mark.parametrize("warpgroups", BwdKnobs.choices()["warpgroups"])
@pytest.mark.parametrize("split_keys", [False, True])
def test_backward_tiles_are_the_launchers(head_dim, block_m, warpgroups, split_keys):
    block_d, launch = max(16, 1 << (head_dim - 1).bit_length()), launcher("gluon", "bwd")
    assert bwd_tiles(BwdKnobs(block_m=block_m, warpgroups=warpgroups, split_keys=split_keys), head_dim) == (
        launch._block_n(block_d, warpgroups), launch._dkv_columns(block_d, warpgroups, split_keys=split_keys),
        *launch._dq_share(block_m, block_d, warpgroups))


def test_backward_cases_cover_the_defaults():
    for head_dim in (64, 128):
        default = default_knobs(_problem(head_dim), H100, "bwd").as_point()
        assert any(gluon_bwd_sm90.DEFAULT | change == {k: v for k, v in default.items() if k != "family"}
                   and case_dim == head_dim for change, case_dim, *_ in gluon_bwd_sm90.CASES)


@pytest.mark.parametrize("knobs, problem, gpu, reason", [
    (BwdKnobs(), _problem(), KNOWN["a100"], "needs sm_90"),
    (BwdKnobs(), _problem(dtype="float32"), H100, "fp16 or bf16"),
    (BwdKnobs(), _problem(head_dim=8), H100, "head dims 16..256"),
    (BwdKnobs(), _problem(head_dim=320), H100, "head dims 16..256"),
    (BwdKnobs(), _problem(head_dim=256), H100, "shared memory"),
    (BwdKnobs(block_m=32), _problem(head_dim=128), H100, "32-row steps"),
    (BwdKnobs(block_m=32, warpgroups=1), _problem(head_dim=256), H100, "registers"),
    (BwdKnobs(block_m=128), _problem(head_dim=64), H100, "registers"),
    (BwdKnobs(block_m=128, num_buffers=3), _problem(), H100, "shared memory"),
    (BwdKnobs(), Problem(4096, 32, 8, 128, 128, 128, False, "float16"), H100, "grid's y axis"),
    (BwdKnobs(head_dim_split=True), _problem(head_dim=128), H100, "64 + 64 are no fewer than one tile of 128"),
    (BwdKnobs(head_dim_split=True, block_m=32), _problem(head_dim=256), H100, "128 + 128"),
    (BwdKnobs(head_dim_split=True), _problem(head_dim=96), H100, "rendered past head dim 128"),
    (BwdKnobs(head_dim_split=True, warpgroups=1), _problem(head_dim=160), H100, "two warpgroups one column tile"),
    (BwdKnobs(head_dim_split=True, dq_writer=True), _problem(head_dim=160), H100, "no dQ writer"),
    (BwdKnobs(head_dim_split=True, block_m=32), _problem(head_dim=160), H100, "64 rows of the second tile, it has 32"),
    (BwdKnobs(head_dim_split=True, block_m=32, group_splits=2), _problem(head_dim=192), H100, "128 rows"),
    (BwdKnobs(head_dim_split=True, num_buffers=3), _problem(head_dim=192), H100, "shared memory"),
    (BwdKnobs(query_splits=2), _problem(), H100, "256 programs (key blocks x batch x KV heads x group_splits) fill"),
    (BwdKnobs(query_splits=2, warpgroups=1), _cross(), H100, "two warpgroups' buffers"),
    (BwdKnobs(query_splits=16), _cross(seqlen_q=500), H100, "over a key block's 8 steps leaves programs without one"),
    (BwdKnobs(query_splits=2), dataclasses.replace(_cross(), variants=frozenset({"VARLEN"})), H100, "own lists"),
    (BwdKnobs(num_buffers=1), _problem(), H100, "one ring slot leaves the producer no lead"),
    (BwdKnobs(split_keys=True, num_buffers=1), _problem(head_dim=128), H100, "rendered past head dim 128"),
    (BwdKnobs(split_keys=True, num_buffers=2), _problem(head_dim=256), H100, "shared memory"),
    (BwdKnobs(split_keys=True, num_buffers=1, block_m=32), _problem(head_dim=256), H100, "64-row steps"),
    (BwdKnobs(split_keys=True, num_buffers=1, warpgroups=1), _problem(head_dim=256), H100, "two warpgroups"),
    (BwdKnobs(split_keys=True, num_buffers=1, dv_late=True), _problem(head_dim=256), H100, "no dq_writer, dq_"),
    (BwdKnobs(split_keys=True, head_dim_split=True), _problem(head_dim=256), H100, "no fewer than one tile"),
    (BwdKnobs(split_keys=True, num_buffers=1), _problem(head_dim=256).with_variants(alibi=True), H100, "not ALIBI"),
])
def test_backward_violations(knobs, problem, gpu, reason):
    assert any(reason in why for why in violations(knobs, problem, gpu)), violations(knobs, problem, gpu)


@pytest.mark.parametrize("head_dim", [40, 64, 80, 96, 128, 160, 192, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_backward_default_is_valid(head_dim, causal, dtype):
    for seqlen in (1, 1000, 16384):
        problem = _problem(head_dim, dtype, causal, seqlen)
        knobs = default_knobs(problem, H100, "bwd")
        assert isinstance(knobs, BwdKnobs) and violations(knobs, problem, H100) == []
    assert default_knobs(_problem(head_dim), KNOWN["a100"], "bwd") is None
    assert default_knobs(_problem(320), H100, "bwd") is None  # the tl family's


def test_backward_default_splits_the_steps_where_programs_fill_half_the_sms_at_most():
    """16 programs (one key block x 2 x 8 heads) take 8 splits each (128 of 132 SMs), 32 at head dim 256 (two key
    blocks) 4; a program walks four steps at least (500 queries: 8 steps, 2 splits); 256 programs none (NOTES
    107)."""
    splits = {(d, q, b): default_knobs(_cross(d, q, b), H100, "bwd").query_splits
              for d, q, b in ((40, 4096, 2), (128, 4096, 2), (256, 4096, 2), (40, 500, 2), (40, 4096, 32))}
    assert splits == {(40, 4096, 2): 8, (128, 4096, 2): 8, (256, 4096, 2): 4, (40, 500, 2): 2, (40, 4096, 32): 1}
    assert default_knobs(_problem(), H100, "bwd").query_splits == 1


@pytest.mark.parametrize("head_dim", [72, 80, 96, 128, 144, 160, 192, 200, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_default_splits_the_head_dim_past_128_where_it_pays(head_dim, causal):
    """Past head dim 128 where the two column tiles drop a quarter of the padded one's columns (144, 160, 192: the
    forward's rule) in 64-row steps, which the padded tile's shared memory does not hold (NOTES G-bwd23); not at
    72-96 (the backward's split is rendered past 128), 200 (128 + 128) or 256; GQA groups split as unsplit."""
    for problem in (_problem(head_dim, causal=causal), Problem(2, 16, 4, 4096, 4096, head_dim, causal, "bfloat16")):
        knobs = default_knobs(problem, H100, "bwd")
        split = head_dim in (144, 160, 192)
        assert knobs.head_dim_split == split and violations(knobs, problem, H100) == []
        if split:
            assert knobs.block_m == 64 and knobs.group_splits == (2 if causal and problem.seqlen_q >= 2048 else 1)
            padded = dataclasses.replace(knobs, head_dim_split=False)
            assert bwd_shared_memory_bytes(knobs, problem) < bwd_shared_memory_bytes(padded, problem)
            assert any("shared memory" in why for why in violations(padded, problem, H100))
    packed = dataclasses.replace(_problem(160), variants=frozenset({"VARLEN"}))
    assert default_knobs(packed, H100, "bwd").head_dim_split


def test_backward_render_without_the_split_is_the_base_commits(tmp_path):
    """head_dim_split, query_splits and split_keys off, the backward renders byte for byte as before them (G-bwd22's
    commit, 88bf1c5): 60 random knob points x the gate sets (plain, window, softcap + ALiBi, all three, packed, a
    mask_mod), so its records re-key (benchmarks/rekey_records.py) instead of being tuned again. The header's knobs
    line aside."""
    import random
    import shutil

    import jinja2

    root = codegen.data_dir("templates")
    shutil.copytree(root, tmp_path, dirs_exist_ok=True)
    try:
        base = subprocess.run(["git", "show", "88bf1c5:templates/gluon/attn_bwd.py.jinja"], cwd=root.parent,
                              check=True, capture_output=True, text=True).stdout
    except (subprocess.CalledProcessError, FileNotFoundError):
        pytest.skip("needs the git history of a source checkout")
    (tmp_path / "gluon" / "attn_bwd.py.jinja").write_text(base)
    options = dict(undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    envs = [jinja2.Environment(loader=jinja2.FileSystemLoader(path), **options) for path in (tmp_path, root)]
    space = {k: v for k, v in BwdKnobs.choices().items()
             if k not in ("family", "head_dim_split", "query_splits", "split_keys")}
    rng = random.Random(5)
    for _ in range(60):
        context = BwdKnobs(**{k: rng.choice(v) for k, v in space.items()}).template_context()
        for gates in ((), ("WINDOW",), ("SOFTCAP", "ALIBI"), ("WINDOW", "SOFTCAP", "ALIBI"), ("VARLEN",),
                      ("MASK_MOD",)):
            common = dict(TEMPLATE="t", FINGERPRINT="f", AUTOFLASH_VERSION="v", TRITON_VERSION="t", EXTRA_HEADER=(),
                          KNOBS_JSON="k", MASK_MOD_SOURCE="def _mask_mod(b, h, q, k):\n    return q >= k\n",
                          MASK_MOD_CAPTURES=1, **{name: name in gates for name in VARIANTS}, **context)
            before, now = (env.get_template("gluon/attn_bwd.py.jinja").render(**common) for env in envs)
            assert now == before, (context, gates)


def test_backward_split_plan_reads_each_column_tile_by_descriptors_of_its_own():
    """The split plan's sixteen descriptors: q, k, v, dO, dK, dV and dQ's fp32 sum in the first tile's blocks (128
    columns), the same seven over the same tensors in the second's (32 columns, read from column 128 by the
    kernel), then lse2 and delta; 64 keys a program; BLOCK_D the first tile's, the delta kernel's the padded."""
    from autoflash import codegen

    q, k = torch.empty(2, 4, 100, 160, dtype=torch.bfloat16), torch.empty(2, 2, 90, 160, dtype=torch.bfloat16)
    lse, compiled = torch.empty(2, 4, 100), {}

    def compile(kernel, grid, args, options, tensor_count):
        compiled[kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__] = (grid, args, options,
                                                                                      tensor_count)
        return lambda *tensors: None
    knobs = BwdKnobs(head_dim_split=True)
    codegen.load(knobs).backward_plan(q, k, k, q, lse, q, q, k, k, 0.125, False, None, compile=compile)
    grid, args, options, tensor_count = compiled["attn_bwd"]
    assert tensor_count == 16 and options["BLOCK_D"] == 128 and grid == (2, 2 * 2)  # (90 keys: two blocks of 64)
    assert compiled["_attn_bwd_delta"][2]["BLOCK_D"] == 256
    first, second = args[:7], args[7:14]
    for one, two, rows in zip(first, second, (64, 64, 64, 64, 64, 64, 64)):
        assert one.base is two.base and list(one.shape) == list(two.shape) == list(one.base.shape)
        assert list(one.block_shape) == [1, 1, rows, 128] and list(two.block_shape) == [1, 1, rows, 32]
    assert [d.layout.element_bitwidth for d in args[4:7]] == [16, 16, 32]
    assert list(args[14].block_shape) == [1, 64]


def test_backward_refuses_deterministic_calls():
    q = torch.empty(1, 2, 10, 64, dtype=torch.float16)
    assert for_call(BwdKnobs(), tensors=(q, q, q), deterministic=False) == (BwdKnobs(), "")
    knobs, why = for_call(BwdKnobs(), tensors=(q, q, q), deterministic=True)
    assert knobs is None and "atomics" in why
    assert for_call(FwdKnobs(), tensors=(q, q, q), deterministic=True) == (FwdKnobs(), "")


def test_backward_launcher_refuses_what_tma_cannot_read():
    gluon = launcher("gluon", "bwd")
    assert gluon is not launcher("gluon") and gluon.backward_plan and not hasattr(gluon, "forward_plan")
    k = torch.empty(1, 2, 10, 64, dtype=torch.float16)
    lse = torch.empty(1, 2, 10)
    q = torch.empty(1, 2, 10, 68, dtype=torch.float16)[..., :64]  # rows of 136 bytes: not a multiple of 16
    with pytest.raises(ValueError, match="16-byte"):
        gluon.backward_plan(None, BwdKnobs().as_point(), q, k, k, k, lse, k, k, k, k, 0.125, False, None)
    with pytest.raises(ValueError, match="fp16 or bf16"):
        gluon.backward_plan(None, BwdKnobs().as_point(), k, k, k, k, lse, k, k.float(), k, k, 0.125, False, None)
    with pytest.raises(ValueError, match="lse must be"):
        gluon.backward_plan(None, BwdKnobs().as_point(), k, k, k, k, lse.double(), k, k, k, k, 0.125, False, None)


@pytest.mark.parametrize("group_splits", [1, 2])
def test_backward_descriptors_per_call(group_splits):
    """A plan's nine descriptors are built once over its example tensors; each call's are copies over the call's
    tensors, the examples' untouched (dK and dV over fp32 sums where the group is split)."""
    make_plan_descriptors = launcher("gluon", "bwd")._descriptor_maker
    q, k = torch.empty(2, 8, 100, 128, dtype=torch.bfloat16), torch.empty(2, 2, 100, 128, dtype=torch.bfloat16)
    rows = torch.empty(16, 100, dtype=torch.float32)
    dkv = tuple(torch.empty(k.shape, dtype=torch.float32) for _ in range(2)) if group_splits > 1 else (k, k)
    examples = (q, k, k, q, *dkv, torch.empty(q.shape, dtype=torch.float32), rows, rows)
    make = make_plan_descriptors(examples, 64, 128, 2)
    first, second = make(*examples), make(*(t.clone() for t in examples))
    for example, a, b in zip(examples, first, second):
        assert a.base is example and b.base is not example and b.base.shape == example.shape
        assert (a.shape, a.strides, a.block_shape, a.layout) == (b.shape, b.strides, b.block_shape, b.layout)
    assert [d.layout.element_bitwidth for d in first[4:7]] == [16 if group_splits == 1 else 32] * 2 + [32]
    assert first[7].shape == [16, 100] and first[4].block_shape == [1, 1, 64, 128]


@pytest.mark.parametrize("head_dim", [128, 160])  # 160: two column tiles, the second over columns 128..
def test_forward_descriptors_per_call(head_dim, monkeypatch):
    """A forward plan's descriptors are built once over its example tensors; each call's are copies over the call's
    tensors (the second column tile's over their columns past the first tile), made without TensorDescriptor's
    checks, the examples' untouched."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    make_plan_descriptors = launcher("gluon")._descriptor_maker
    q, k = torch.empty(2, 8, 100, head_dim, dtype=torch.bfloat16), torch.empty(2, 2, 90, head_dim, dtype=torch.bfloat16)
    tiles = (128, 32) if head_dim == 160 else (128, 0)
    make = make_plan_descriptors(q, k, k, q, 64, 128, *tiles)
    examples, calls = (q, k, k, q), tuple(t.clone() for t in (q, k, k, q))
    built = TensorDescriptor.__init__
    monkeypatch.setattr(TensorDescriptor, "__init__", lambda *a, **kw: pytest.fail("a descriptor built per call"))
    first, second = make(*examples), make(*calls)
    monkeypatch.setattr(TensorDescriptor, "__init__", built)
    assert len(first) == len(second) == (8 if head_dim == 160 else 4)
    for i, (a, b) in enumerate(zip(first, second)):
        column = 0 if i < 4 else 128
        assert a.base.data_ptr() == examples[i % 4].data_ptr() + 2 * column
        assert b.base.data_ptr() == calls[i % 4].data_ptr() + 2 * column
        assert (a.shape, a.strides, a.block_shape, a.layout) == (b.shape, b.strides, b.block_shape, b.layout)
        fresh = type(a)(b.base, b.shape, b.strides, b.block_shape, b.layout)  # as built with its checks
        assert {**vars(fresh), "base": None} == {**vars(b), "base": None}
    assert first[0].block_shape == [1, 1, 64, 128] and first[1].block_shape == [1, 1, 128, 128]
    if head_dim == 160:
        assert first[4].shape == [2, 8, 100, 32] and first[5].block_shape == [1, 1, 128, 32]


def test_backward_variant_arguments_reach_the_kernel():
    """The fixed variants' launcher (templates/common/launch_window_softcap_alibi.py) on the Gluon backward's plan:
    the slopes after the nine descriptors, the window, softcap and the slopes' stride by name; the delta kernel as
    it is. (No GPU: the plan is built with a `compile` that records what it is given.)"""
    from autoflash import checks, codegen
    from autoflash.problem import Problem

    q, k = torch.empty(2, 4, 100, 64, dtype=torch.bfloat16), torch.empty(2, 2, 90, 64, dtype=torch.bfloat16)
    lse, slopes = torch.empty(2, 4, 100), torch.rand(4)
    problem = Problem.from_tensors(q, k, True, (30, -1), True, True)
    variant = checks.variant_args(problem.causal, problem.window, 100, 90, 20.0, slopes)
    compiled = {}

    def compile(kernel, grid, args, options, tensor_count):
        compiled[kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__] = (kernel, args, options,
                                                                                      tensor_count)
        return lambda *tensors: None
    kernels = codegen.load(BwdKnobs(), problem.gates())
    plan = kernels.backward_plan(q, k, k, q, lse, q, q, k, k, 0.125, problem.causal, None, compile=compile,
                                 variant=variant)
    plan(q, k, k, q, lse, q, q, k, k, None, slopes)
    kernel, args, options, tensor_count = compiled["attn_bwd"]
    named = dict(zip(kernel.arg_names, args)) | options
    assert tensor_count == 10 and named["Alibi"] is slopes and kernel.arg_names.index("Alibi") == 9
    assert (named["window_left"], named["window_right"], named["softcap"], named["stride_alibi_b"]) == (30, 0, 20.0, 0)
    assert set(kernel.arg_names) <= set(named), set(kernel.arg_names) - set(named)
    assert compiled["_attn_bwd_delta"][3] == 7  # (no variant parameter: launched as the plain plan has it)


def test_forward_variant_arguments_reach_the_kernel():
    """The fixed variants' launcher on the Gluon forward's plan: the slopes after its six tensors (descriptors,
    lse, the tile counter), the window, softcap and the slopes' stride by name."""
    from autoflash import checks, codegen
    from autoflash.problem import Problem

    q, k = torch.empty(2, 4, 100, 64, dtype=torch.bfloat16), torch.empty(2, 2, 90, 64, dtype=torch.bfloat16)
    lse, slopes = torch.empty(2, 4, 100), torch.rand(2, 4)
    problem = Problem.from_tensors(q, k, False, (30, 10), True, True)
    variant = checks.variant_args(problem.causal, problem.window, 100, 90, 20.0, slopes)
    compiled = []

    def compile(kernel, grid, args, options, tensor_count):
        compiled.append((kernel, args, options, tensor_count))
        return lambda *tensors: None
    knobs = FwdKnobs(persistent=False)  # (a persistent grid asks the GPU its SM count)
    plan = codegen.load(knobs, problem.gates()).forward_plan(q, k, k, q, lse, 0.125, problem.causal, compile=compile,
                                                              variant=variant)
    plan(q, k, k, q, lse, slopes)
    (kernel, args, options, tensor_count), = compiled
    named = dict(zip(kernel.arg_names, args)) | options
    assert tensor_count == 7 and named["Alibi"] is slopes and kernel.arg_names.index("Alibi") == 6
    assert (named["window_left"], named["window_right"], named["softcap"], named["stride_alibi_b"]) == (30, 10, 20.0, 4)
    assert set(kernel.arg_names) <= set(named), set(kernel.arg_names) - set(named)


@pytest.mark.parametrize("head_dim, tiles", [(160, (128, 32)), (80, (64, 16))])
def test_head_dim_split_plan_reads_each_column_tile_by_a_descriptor_of_its_own(head_dim, tiles):
    """The split plan's descriptors: the four tensors' first column tiles, then the same four from the first tile's
    width on (their own columns, blocks of the second width: TMA reads past head_dim as 0), lse and the counter per
    call; BLOCK_D2 among the options."""
    from autoflash import codegen

    q, k = torch.empty(2, 4, 100, head_dim, dtype=torch.bfloat16), torch.empty(2, 2, 90, head_dim, dtype=torch.bfloat16)
    lse, compiled = torch.empty(2, 4, 100), []

    def compile(kernel, grid, args, options, tensor_count):
        compiled.append((kernel, args, options, tensor_count))
        return lambda *tensors: compiled.append(tensors)
    knobs = FwdKnobs(head_dim_split=True, persistent=False)
    plan = codegen.load(knobs).forward_plan(q, k, k, q, lse, 0.125, False, compile=compile)
    plan(q, k, k, q, lse)
    (kernel, args, options, tensor_count), per_call = compiled
    assert tensor_count == 10 and len(per_call) == 10 and per_call[8] is lse
    assert (options["BLOCK_D"], options["BLOCK_D2"]) == tiles
    first, second = per_call[:4], per_call[4:8]
    for one, two, t, rows in zip(first, second, (q, k, k, q), (64, 128, 128, 64)):
        assert one.base.data_ptr() == t.data_ptr() and list(one.shape) == list(t.shape)
        assert two.base.data_ptr() == t.data_ptr() + tiles[0] * t.element_size()
        assert list(two.shape) == [*t.shape[:3], head_dim - tiles[0]] and list(two.strides) == list(t.stride())
        assert (list(one.block_shape), list(two.block_shape)) == ([1, 1, rows, tiles[0]], [1, 1, rows, tiles[1]])
    names = kernel.arg_names
    assert names[:9] == ["q_desc", "k_desc", "v_desc", "o_desc", "q_desc2", "k_desc2", "v_desc2", "o_desc2", "lse_ptr"]


def test_mask_mod_arguments_and_block_table_reach_the_forward():
    """A mask_mod on the Gluon forward's plan (templates/gluon/launch_mask_mod.py on tl's table builder): the
    slopes, the mod's capture and the block table after the six tensors, the table's strides and the capture's
    length by name; the table (built in the interpreter) has a row per tile of block_m x consumers query rows."""
    from autoflash import checks
    from autoflash.launch import compile_launch
    from autoflash.mask_mod import MaskMod
    from test_mask_mod import brute_force_states, documents, same_document

    q, k = torch.empty(2, 4, 300, 64, dtype=torch.bfloat16), torch.empty(2, 2, 290, 64, dtype=torch.bfloat16)
    lse, slopes = torch.empty(2, 4, 300), torch.rand(4)
    mod = MaskMod(same_document, documents(100, 1, 150, 49))
    problem = Problem.from_tensors(q, k, True, alibi=True, mask_mod=mod.fingerprint())
    variant = checks.variant_args(True, (-1, -1), 300, 290, 0.0, slopes, mod)
    compiled = []

    def compile(kernel, grid, args, options, tensor_count):
        if "States" in kernel.arg_names:  # the block table's kernel runs
            return compile_launch(kernel, grid, args, options, tensor_count)
        compiled.append((kernel, args, options, tensor_count))
        return lambda *tensors: None
    knobs = FwdKnobs(persistent=False)
    plan = codegen.load(knobs, problem.gates(), mod.rendered).forward_plan(q, k, k, q, lse, 0.125, True,
                                                                            compile=compile, variant=variant)
    plan(q, k, k, q, lse, slopes, *mod.captures)
    (kernel, args, options, tensor_count), = compiled
    named = dict(zip(kernel.arg_names, args)) | options
    assert tensor_count == 9 and kernel.arg_names[6:9] == ["Alibi", "Capture0", "Mask_rows"]
    assert named["Capture0"] is mod.captures[0] and named["capture_len0"] == 300
    table, states = named["Mask_rows"], brute_force_states(mod, 1, 1, 300, 290, 128, 128, True)
    assert table.shape == (1, 1, 3, 2 * (3 + 1)) and named["stride_rows_m"] == 8
    assert torch.equal(table[..., 0], (states == 1).sum(-1).int()) and torch.equal(table[..., 4],
                                                                                   (states == 2).sum(-1).int())
    assert set(kernel.arg_names) <= set(named), set(kernel.arg_names) - set(named)


def documents_by_head(b, h, q_idx, kv_idx, document_id):
    return (document_id[q_idx] == document_id[kv_idx]) & (kv_idx <= q_idx + 50 * h)


@pytest.mark.parametrize("head_dim, knobs", [(64, BwdKnobs()), (256, BwdKnobs(block_m=32, dq_writer=True))], ids=str)
def test_mask_mod_arguments_and_block_table_reach_the_backward(head_dim, knobs):
    """A mask_mod on the Gluon backward's plan (templates/gluon/launch_mask_mod.py on tl's table builder): the
    slopes, the mod's capture and the transposed block table after the nine descriptors, the table's strides and
    the capture's length by name, the delta kernel as it is; the table (built in the interpreter) has a row per
    (query head: the mod reads h, key block of the program's keys, 128 up to head dim 128, else 64) listing its
    block_m-row query blocks."""
    from autoflash import checks
    from autoflash.launch import compile_launch
    from autoflash.mask_mod import MaskMod
    from test_mask_mod import brute_force_states, documents

    q = torch.empty(2, 4, 300, head_dim, dtype=torch.bfloat16)
    k = torch.empty(2, 2, 290, head_dim, dtype=torch.bfloat16)
    lse, slopes = torch.empty(2, 4, 300), torch.rand(4)
    mod = MaskMod(documents_by_head, documents(100, 1, 150, 49))
    problem = Problem.from_tensors(q, k, True, alibi=True, mask_mod=mod.fingerprint())
    variant = checks.variant_args(True, (-1, -1), 300, 290, 0.0, slopes, mod)
    compiled = {}

    def compile(kernel, grid, args, options, tensor_count):
        if "States" in kernel.arg_names:  # the block table's kernel runs
            return compile_launch(kernel, grid, args, options, tensor_count)
        compiled[kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__] = (kernel, args, options,
                                                                                      tensor_count)
        return lambda *tensors: None
    plan = codegen.load(knobs, problem.gates(), mod.rendered).backward_plan(
        q, k, k, q, lse, q, q, k, k, 0.125, True, None, compile=compile, variant=variant)
    plan(q, k, k, q, lse, q, q, k, k, None, slopes, *mod.captures)
    kernel, args, options, tensor_count = compiled["attn_bwd"]
    named = dict(zip(kernel.arg_names, args)) | options
    assert tensor_count == 12 and kernel.arg_names[9:12] == ["Alibi", "Capture0", "Mask_cols"]
    assert named["Capture0"] is mod.captures[0] and named["capture_len0"] == 300
    block_n = 128 if head_dim <= 128 else 64
    query_blocks, key_blocks = -(-300 // knobs.block_m), -(-290 // block_n)
    table, half = named["Mask_cols"], query_blocks + 1
    states = brute_force_states(mod, 1, 4, 300, 290, knobs.block_m, block_n, True)
    assert table.shape == (1, 4, key_blocks, 2 * half)
    assert (named["stride_cols_b"], named["stride_cols_h"], named["stride_cols_n"]) == (0, key_blocks * 2 * half,
                                                                                         2 * half)
    assert torch.equal(table[..., 0], (states == 1).sum(-2).int())
    assert torch.equal(table[..., half], (states == 2).sum(-2).int())
    assert set(kernel.arg_names) <= set(named), set(kernel.arg_names) - set(named)
    assert compiled["_attn_bwd_delta"][3] == 7  # (no variant parameter: launched as the plain plan has it)


def test_backward_delta_kernel():
    """delta = rowsum(dO * O) - dlse and lse in log2 units (0 where -inf), dQ's fp32 buffer zeroed, in Triton's
    interpreter."""
    batch, heads, seqlen, head_dim = 2, 3, 77, 40
    gen = torch.Generator().manual_seed(0)
    out, dout = (torch.randn(batch, seqlen, heads, head_dim, generator=gen).to(torch.float16).transpose(1, 2)
                 for _ in range(2))
    lse, dlse = (torch.randn(batch, heads, seqlen, generator=gen) for _ in range(2))
    lse[0, 1, :5] = -math.inf
    # the outputs are (batch * heads, seqlen) rows padded to a multiple of 4 (TMA's 16-byte strides)
    lse2, delta = (torch.full((batch * heads, 80), math.nan) for _ in range(2))
    dq = torch.full((batch, heads, seqlen, head_dim), math.nan)
    kernels = codegen.load(BwdKnobs()).kernels
    kernels._attn_bwd_delta[(2, batch * heads)](out, dout, lse, dlse, lse2, delta, dq, *out.stride()[:3],
                                                *dout.stride()[:3], lse2.stride(0), heads, seqlen,
                                                HEAD_DIM=head_dim, BLOCK_D=64, HAS_DLSE=True, ROWS=64)
    torch.testing.assert_close(delta[:, :seqlen].view(lse.shape), (out.float() * dout.float()).sum(-1) - dlse)
    torch.testing.assert_close(lse2[:, :seqlen].view(lse.shape),
                               torch.where(lse == -math.inf, 0.0, lse * math.log2(math.e)))
    assert lse2[:, seqlen:].isnan().all() and delta[:, seqlen:].isnan().all(), "the padding is not written"
    assert (dq == 0).all()


def test_backward_default_splits_groups_only_for_long_causal_attention():
    """GQA's query heads split over programs where the causal band leaves programs unequal (2k queries and
    more, no window): decode ran 0.32-0.70x and full attention 0.94-1.02x split (NOTES 59)."""
    causal = Problem(1, 32, 4, 4096, 4096, 128, True, "bfloat16")
    assert default_knobs(causal, H100, "bwd").group_splits == 2
    assert default_knobs(dataclasses.replace(causal, head_dim=64), H100, "bwd").group_splits == 4
    for unsplit in (dataclasses.replace(causal, causal=False), dataclasses.replace(causal, seqlen_q=1),
                    causal.with_variants(window_size=(1024, 0)), dataclasses.replace(causal, heads_kv=32)):
        assert default_knobs(unsplit, H100, "bwd").group_splits == 1, unsplit


def test_backward_default_splits_wide_groups_from_512_queries_over_8_programs_past_head_dim_64():
    """A KV head serving 16 query heads or more (MQA, GQA 16:1) splits its group from 512 queries under causal
    masking, over 8 programs past head dim 64 and 4 to it (the tuned MQA 32/1 records, NOTES 98; at head dim 64 8
    with three ring slots from 1k to 8k queries, NOTES 102); narrower groups
    keep 2k queries and 2 programs past d64."""
    mqa = Problem(64, 32, 1, 512, 512, 128, True, "bfloat16")
    assert default_knobs(mqa, H100, "bwd").group_splits == 8
    assert default_knobs(dataclasses.replace(mqa, head_dim=64), H100, "bwd").group_splits == 4
    for seqlen, splits, buffers in ((1024, 8, 3), (8192, 8, 3), (16384, 4, 2)):  # d64 from 1k to 8k: 8 (NOTES 102)
        knobs = default_knobs(dataclasses.replace(mqa, head_dim=64, seqlen_q=seqlen, seqlen_k=seqlen), H100, "bwd")
        assert (knobs.group_splits, knobs.num_buffers) == (splits, buffers), seqlen
    full = dataclasses.replace(mqa, head_dim=64, seqlen_q=2048, seqlen_k=2048, causal=False)  # (unsplit: as before)
    assert default_knobs(full, H100, "bwd") == default_knobs(dataclasses.replace(full, heads_q=1), H100, "bwd")
    assert default_knobs(dataclasses.replace(mqa, heads_q=16), H100, "bwd").group_splits == 8  # 16:1
    for unsplit in (dataclasses.replace(mqa, seqlen_q=256, seqlen_k=256), dataclasses.replace(mqa, heads_kv=4),
                    dataclasses.replace(mqa, causal=False)):  # short, 8:1 under 2k queries, full
        assert default_knobs(unsplit, H100, "bwd").group_splits == 1, unsplit
    assert default_knobs(Problem(4, 32, 4, 4096, 4096, 128, True, "bfloat16"), H100, "bwd").group_splits == 2


def test_backward_default_splits_groups_the_splits_do_not_divide_unevenly():
    """MQA 71:1 (Falcon-7B) and GQA 7:1 (Qwen2-7B) under causal masking from 2k queries: a prime group split over
    the programs wanted, ceil(group / splits) heads each, the last fewer, none empty (NOTES 74.(c): unsplit, 71:1
    ran 64 programs on 132 SMs at 0.34x plain SDPA)."""
    mqa = Problem(4, 71, 1, 2048, 2048, 64, True, "bfloat16")
    for problem, splits in ((mqa, 8), (dataclasses.replace(mqa, head_dim=128), 8), (Problem(4, 28, 4, 2048, 2048, 128,
                                                                                            True, "bfloat16"), 2),
                            (dataclasses.replace(mqa, heads_q=5), 2), (dataclasses.replace(mqa, heads_q=9), 2)):
        knobs = default_knobs(problem, H100, "bwd")
        assert (knobs.group_splits, knobs.uneven_groups) == (splits, True), problem
        assert violations(knobs, problem, H100) == []
    for problem in (dataclasses.replace(mqa, heads_q=8), dataclasses.replace(mqa, causal=False)):  # even, unsplit
        assert not default_knobs(problem, H100, "bwd").uneven_groups
    assert any("does not divide" in why for why in violations(BwdKnobs(group_splits=4), mqa, H100))
    empty = dataclasses.replace(mqa, heads_q=5)  # 5 heads over 4 programs of 2: the fourth would walk none
    assert any("at least one" in why for why in violations(BwdKnobs(group_splits=4, uneven_groups=True), empty, H100))
    even = dataclasses.replace(mqa, heads_q=8)
    assert any("even split" in why for why in violations(BwdKnobs(group_splits=4, uneven_groups=True), even, H100))


def test_packed_sequences_run_in_both_directions():
    """VARLEN: the Gluon forward's and backward's gates (their launcher on the dense ones' descriptors and tl's tile
    tables); paged caches and packed sequences with another variant stay in tl."""
    packed = dataclasses.replace(_problem(causal=True), variants=frozenset({"VARLEN"}))
    for direction in ("fwd", "bwd"):
        knobs = default_knobs(packed, H100, direction)
        assert knobs is not None and violations(knobs, packed, H100) == []
    # (the dense full default runs tile_overlap, which packed problems refuse: fit() falls back to their default)
    assert fit(default_knobs(_problem(), H100), packed, H100) == default_knobs(packed, H100)
    paged = dataclasses.replace(packed, variants=frozenset({"VARLEN", "PAGED"}), page_size=16)
    assert any("paged" in why for why in violations(default_knobs(_problem(), H100), paged, H100))
    windowed = packed.with_variants(window_size=(128, 0))
    for knobs in (FwdKnobs(), BwdKnobs(group_splits=2, dq_writer=True)):
        assert any("without other variants" in why for why in violations(knobs, windowed, H100))
        assert violations(knobs, packed, H100) == []
    many = dataclasses.replace(packed, batch=8192)  # (the delta kernel's y axis: heads_q alone when packed)
    assert violations(BwdKnobs(), many, H100) == []
    assert any("grid's y axis" in why for why in violations(BwdKnobs(), dataclasses.replace(many, variants=frozenset()),
                                                             H100))
    module = launcher("gluon", "varlen")
    assert module.base is launcher("gluon") and module.tables is launcher("tl", "varlen")
    assert module.base_bwd is launcher("gluon", "bwd")


@pytest.mark.parametrize("group_splits", [1, 2])
@pytest.mark.parametrize("on_host", [True, False], ids=["host_table", "device_table"])
def test_backward_varlen_arguments_reach_the_kernel(group_splits, on_host):
    """The packed backward's plan (templates/gluon/launch_varlen.py): seven descriptors over the packed views (dK
    and dV over fp32 sums where the group is split), lse2 and delta as pointers, then by name each call's
    offsets, (sequence, key block) table and dK, dV; a 1-D grid of table entries x KV heads x splits; the delta
    kernel over the packed rows as one batch. (No GPU: `compile` records what it is given.)"""
    from autoflash.varlen import packed

    lengths_q, lengths_k = [100, 0, 7, 300], [90, 5, 0, 300]
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(sum(lengths_q), 8, 64, generator=gen).bfloat16()
    k = torch.randn(sum(lengths_k), 2, 64, generator=gen).bfloat16()
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32)
                  for n in (lengths_q, lengths_k))
    lse = torch.empty(1, 8, q.shape[0])
    compiled, launched = {}, {}

    def compile(kernel, grid, args, options, tensor_count, per_call=()):
        name = kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__
        if name in ("_tile_keys", "_tile_order"):  # the device's table kernels (`tl`'s, they run interpreted)
            return compile_launch(kernel, grid, args, options, tensor_count, per_call)
        compiled[name] = (kernel, grid, args, options, tensor_count, per_call)

        def launch(*tensors):
            launched[name] = tensors
        return launch
    knobs = BwdKnobs(group_splits=group_splits)
    views = [packed(t) for t in (q, k, k, q, q, q, k, k)]  # q, k, v, out, dout, dq, dk, dv
    plan = codegen.load(knobs, frozenset({"VARLEN"})).varlen_backward_plan(
        *views[:4], lse, *views[4:], cu_q, cu_k, 0.125, True, None, compile=compile)
    host = (torch.tensor(lengths_q).numpy(), torch.tensor(lengths_k).numpy()) if on_host else None
    plan(*views[:4], lse, *views[4:], None, cu_q, cu_k, host)
    kernel, grid, args, options, tensor_count, per_call = compiled["attn_bwd"]
    named = dict(zip(kernel.arg_names, args)) | options
    assert set(kernel.arg_names) <= set(named), set(kernel.arg_names) - set(named)
    entries = -(-sum(lengths_k) // 128) + len(lengths_q)  # 128 keys a program (two warpgroups of 64)
    assert tensor_count == 9 and grid == (entries * 2 * group_splits,) and named["IS_CAUSAL"]
    assert (named["seqlen_q"], named["seqlen_k"], named["head_dim"]) == (q.shape[0], k.shape[0], 64)
    assert (named["stride_dkh"], named["stride_dkm"]) == (64, 2 * 64)
    assert [d.layout.element_bitwidth for d in args[4:7]] == [16 if group_splits == 1 else 32] * 2 + [32]
    assert per_call == ("Cu_seqlens_q", "Cu_seqlens_k", "Tiles", "DK", "DV")
    descriptors, (lse2, delta), (offsets_q, offsets_k, table, dk, dv) = (launched["attn_bwd"][:7],
                                                                         launched["attn_bwd"][7:9],
                                                                         launched["attn_bwd"][9:])
    assert offsets_q is cu_q and offsets_k is cu_k and dk is views[6] and dv is views[7]
    assert descriptors[0].base is views[0] and descriptors[0].shape == [1, 8, q.shape[0], 64]
    assert table.shape == (2, entries) and table.dtype == torch.int32
    sequences, blocks = table.tolist()
    # key blocks of 128 (none for the sequence without keys), the most query rows first, then padding
    assert list(zip(sequences, blocks))[:5] == [(3, 0), (3, 1), (3, 2), (0, 0), (1, 0)] and sequences[5:] == [-1] * 3
    assert lse2.shape == delta.shape == (8, 408) and named["stride_rows"] == 408  # (407 rows, 16-byte strides)
    _, delta_grid, _, delta_options, delta_count, _ = compiled["_attn_bwd_delta"]
    assert delta_count == 7 and delta_grid == (-(-q.shape[0] // 64), 8) and delta_options["HEAD_DIM"] == 64
