"""The `gluon` family's heuristic defaults (`default_knobs`), a neighbour's tuned knobs fitted to a problem
(`fit`), and what a call's tensors allow (`for_call`)."""

import math
from dataclasses import replace

from autoflash.families.gluon.knobs import BwdKnobs, FwdKnobs
from autoflash.families.gluon.limits import bwd_programs, column_tiles, split_pays, splits_unevenly, violations
from autoflash.gpu import Gpu, tma_aligned
from autoflash.knobs import head_dim_pad
from autoflash.problem import Problem


def default_knobs(problem: Problem, gpu: Gpu, direction: str = "fwd") -> FwdKnobs | BwdKnobs | None:
    """The measured best of the H100 FA grid (benchmarks/NOTES.md, G3-G6): 2 consumers of 64 rows,
    128-key blocks, overlap, two Q tiles where they fit, a persistent grid; under causal masking its programs
    claim tiles from a counter (the tiles' work is unequal: G6, +2% geomean over the grid's causal cells against
    G5's rule of one program per tile from 2k queries); 3 consumers (FA3's 192-row tile) for d64 from 2k queries
    without causal masking, from 8k with it; head dims past 128 take 64-key blocks, one Q tile and stage O in Q; a
    mask_mod's tiles claim from the counter too (the block table leaves their work unequal, as causal masking
    does); where tile_overlap runs (full attention, static grid, two consumers) the next tile's first block goes
    under this tile's last P V (NOTES G9: d128 full +1-6%); where the padded tile is past 64 columns and
    head_dim_split drops a quarter of them (72, 80, 96, 160, 192), two column tiles, 128-key blocks to 160 columns,
    no tile_overlap (NOTES G16: +4-40%; G17); to head dim 64 (16, 32, 64: no padded columns) and 512 tokens
    (causal: 1024), three programs an SM of one consumer each (NOTES 147, 150, 151); a mask_mod's tiles never of three
    consumers (192 rows straddle its blocks: NOTES 158). None where the family cannot
    run the problem. The backward (every untuned backward's default where it runs: autoflash.families.default_order):
    two consumer warpgroups, 64-row steps, two ring slots (NOTES G-bwd3, G-bwd6); past head dim 128 the
    warpgroups' own 32 keys (split_keys), over two column tiles where head_dim_split pays (NOTES 131), else over
    the padded tile with one ring slot (NOTES 117),
    where it is not rendered two column tiles alone, else 32-row steps; under GQA with
    causal masking (no window) from 2k queries a KV head's query heads split over 4 programs at head dim 64, 2 past
    it (NOTES
    G-bwd13: GQA 8:1 causal 4k 0.80-0.83x plain SDPA -> 0.89-0.93x; the retuned records: causal 2k-32k 1.0-1.14x
    unsplit, full 0.94-1.02x, decode 0.32-0.70x: NOTES 59); groups of 16 or more from 512 queries, 8 programs past
    head dim 64 (NOTES 98), and at head dim 64 from 1k to 8k queries 8 with three ring slots (NOTES 102). Splits
    balance the causal band's unequal programs; a window's are equal (window 4096 at 32k: 481 TFLOP/s unsplit,
    454-475 split, NOTES 59). To head dim 64 the two warpgroups take turns adding dQ (dq_turns: 11 of the fp16
    grid's 12 d64 cells +3.5-10%, NOTES G-bwd20); full attention to head dim 128, and causal to 64, issues dV's
    wgmma after dS^T's store (dv_late: the fp16 grid's 6 d128 full cells +2-18%, NOTES G-bwd21; beside dq_turns on
    the d64 cells from 2k +1.9%, NOTES 68), and a window's too (window 4096 at 32k +3%); a mask_mod's at padded head
    dim 128 issues dV's wgmma late and adds dQ through the writer warp (8 documents in 16k: 1.07x -> 1.27-1.32x
    FlexAttention, NOTES 158)."""
    d = head_dim_pad(problem.head_dim)
    if direction == "bwd":
        # A KV head that serves 16 query heads or more (MQA, GQA 16:1) runs few programs unsplit at any length: its
        # group splits from 512 queries, over 8 programs past head dim 64 (the tuned MQA 32/1 records: 8 won all 16
        # causal problems past d64 on both GPUs, the default's 2 ran 0.70-0.96 of it, unsplit 0.47-0.94; NOTES 98)
        wide = problem.group >= 16
        split = problem.causal and problem.window == (-1, -1) and problem.seqlen_q >= (512 if wide else 2048)
        group = problem.group if split else 1
        # (dq_turns has run on the GPU for dense problems and the fixed variants, not packed or masked ones yet)
        turns = d <= 64 and not problem.gates() & {"VARLEN", "MASK_MOD"}
        # (dv_late measured faster past head dim 64 on full attention and a window's band of equal programs, causal
        # cells -4 to +3%, NOTES G-bwd21; window 4096 at 32k d128 +3%, NOTES 158; to 64 beside dq_turns, causal or
        # not, +1.9%, NOTES 68)
        late = (d <= 64 or not problem.causal or problem.window != (-1, -1)) and d <= 128 and not problem.gates() & {
            "VARLEN", "MASK_MOD"}
        # At head dim 64 a wide group runs 8 programs with three ring slots from 1k to 8k queries (the tuned d64
        # MQA and 16:1 records there: that variant won 7 of 7, 2-14% over 4 programs; 4 won at 512 and 32k; NOTES 102)
        eight = split and wide and d <= 64 and 1024 <= problem.seqlen_q <= 8192
        # A mask_mod's backward at padded head dim 128 issues dV late and hands dQ to the writer warp (8 documents in
        # 16k: 409 -> 501 TFLOP/s, 1.07x -> 1.32x FlexAttention; causal +15%; prefix-LM 489 -> 505; one document
        # 449 -> 528, plain full attention's 531; at head dim 64 -2.5% to +1%, left as it was; NOTES 158)
        masked = "MASK_MOD" in problem.gates() and d == 128
        splits, uneven = _group_splits(group, 8 if eight else 4 if d <= 64 else 8 if wide else 2)
        unsplit = BwdKnobs(block_m=64 if d <= 128 else 32, group_splits=splits, uneven_groups=uneven,
                           num_buffers=3 if eight else 2, dq_turns=turns, dv_late=(late or masked) and not eight,
                           dq_writer=masked)
        # Past head dim 128 the warpgroups split the keys, 32 each with all their columns, in 64-row steps: over two
        # column tiles with two ring slots where the column split pays (160, 192: 1.08-1.22x the column split alone
        # on the H200, NOTES 131), else over the padded tile with one slot (200-256 columns: 1.06-1.21x the 32-row
        # steps, NOTES 117). Where split_keys is not rendered (packed sequences, mask_mods, ALiBi) the column split
        # alone in 64-row steps (NOTES G-bwd23), else 32-row steps.
        columns = replace(unsplit, block_m=64, head_dim_split=True)
        if d > 128 and split_pays(problem):
            wide = [replace(columns, split_keys=True), columns]
        elif d > 128:
            wide = [replace(unsplit, block_m=64, num_buffers=1, split_keys=True)]
        else:
            wide = []
        candidates = tuple(occupied(k, problem, gpu) for k in (
            *(c for k in wide for c in (k, replace(k, group_splits=1, uneven_groups=False))), unsplit,
            replace(unsplit, group_splits=1, uneven_groups=False),
            replace(unsplit, group_splits=1, uneven_groups=False, dq_turns=False, dv_late=False, dq_writer=False)))
    else:
        # (not under a mask_mod: 192-row tiles straddle its blocks; 8 documents in 16k at d64 ran 344 -> 418 TFLOP/s
        # with two consumers, causal 0.68 -> 0.43 ms, NOTES 158)
        three = d <= 64 and problem.seqlen_q >= (8192 if problem.causal else 2048) and not problem.mask_mod
        split = split_pays(problem)
        columns = sum(column_tiles(FwdKnobs(head_dim_split=split), problem))
        knobs = FwdKnobs(block_n=128 if columns <= (160 if split else 128) else 64, consumers=3 if three else 2,
                         consumer_regs=160 if three else 240, dynamic=problem.causal or bool(problem.mask_mod),
                         stage_o_in_q=d > 128, q_buffers=2 if d <= 128 else 1, head_dim_split=split,
                         tile_overlap=not split)
        # Short attention to head dim 64: three programs an SM of one consumer each, 64-key blocks, a static grid
        # (NOTES 150, H200: 0.78-0.88x plain SDPA with two consumers -> 0.95-1.40x full to 512 keys, 0.84x -> 0.96x
        # causal at 1024; two programs an SM ran 0.88-1.22x, 147.; not measured past these lengths). Not where the
        # head dim leaves padded columns (40, 48): there two consumers won 8 of 11 problems, three an SM all 39 at 32
        # and 64 (NOTES 151).
        short = d <= 64 and problem.head_dim == d and not problem.gates() and max(
            problem.seqlen_q, problem.seqlen_k) <= (1024 if problem.causal else 512)
        threes = FwdKnobs(consumers=1, programs_per_sm=3, q_buffers=2, block_n=64)
        candidates = ((threes,) if short else ()) + (
            knobs, replace(knobs, tile_overlap=False), replace(knobs, q_buffers=1, tile_overlap=False),
            replace(knobs, block_n=64, q_buffers=1, tile_overlap=False))
    return next((k for k in candidates if not violations(k, problem, gpu)), None)


def _group_splits(group: int, wanted: int) -> tuple[int, bool]:
    """(group_splits, uneven_groups) of the backward's default: `wanted` programs a KV head's group where they
    divide it, else as many as divide it, else (a group prime to `wanted`: MQA 71:1, GQA 7:1) the most of 2, 4, 8
    up to `wanted` below the group, unevenly (NOTES 74.(c): 71:1 unsplit ran 64 programs on 132 SMs, 0.34x)."""
    even = math.gcd(group, wanted)
    uneven = max((s for s in (2, 4, 8) if s <= wanted and splits_unevenly(group, s)), default=1)
    return (even, False) if even > 1 or uneven == 1 else (uneven, True)



def occupied(knobs: BwdKnobs, problem: Problem, gpu: Gpu) -> BwdKnobs:
    """A borrowed or default backward variant with query_splits fitted to `problem` (NOTES 107): where its programs
    fill at most half the SMs, each key block's steps over the most programs that stay within one wave, four steps
    a program at least (b2 h8 s4096/77 d40: 16 programs of 64 steps, 8 splits: its kernels' GPU time 2.66x
    shorter on an H100; b2 h8 s256/77 d160's 32 programs of 4 steps ran 5% slower in two); else none (a
    neighbour's splits answered its own programs)."""
    if problem.gates() & {"VARLEN", "MASK_MOD"}:
        return replace(knobs, query_splits=1)
    programs, steps = bwd_programs(knobs, problem)
    return replace(knobs, query_splits=max(s for s in BwdKnobs.choices()["query_splits"]
                                           if s == 1 or (s * programs <= gpu.multiprocessors and 4 * s <= steps)))


def grouped(knobs: BwdKnobs, problem: Problem, gpu: Gpu) -> BwdKnobs:
    """A borrowed backward whose programs fill fewer than four waves of the SMs, with its KV heads' query heads
    split over at least as many programs as the default's (causal GQA from 2k queries). A neighbour tuned with
    more programs says nothing of the split that balances this one's causal band: in the shipped databases' trials
    the default's split against none ran 1.11x / 1.18x (H100 / H200 medians; 23 of 23 faster) under four unsplit
    waves (NOTES 109: the held-out b1 h32/8 s4096 and b4 h28/4 s2048 d128 causal backwards 0.78x -> 0.90x and
    0.77x -> 0.87x plain SDPA on the H200). Four to eight waves ran 1.03x in the trials, but the one held-out row
    there, b2 h16/8 s4096 d256 causal, ran 7% slower split on the H200 (NOTES 111): not floored until an A/B says."""
    default = default_knobs(problem, gpu, "bwd")
    if (default is None or default.group_splits <= knobs.group_splits
            or bwd_programs(knobs, problem)[0] >= 4 * gpu.multiprocessors):
        return knobs
    return replace(knobs, group_splits=default.group_splits, uneven_groups=default.uneven_groups)


def fit(knobs: FwdKnobs | BwdKnobs, problem: Problem, gpu: Gpu) -> FwdKnobs | BwdKnobs | None:
    """Tuned knobs of a neighbouring problem if they run this one, a backward's with its query heads' split
    (`grouped`, where that runs too) and its query steps' (`occupied`) fitted to this one's programs; else this
    family's default for it (None where the family cannot run it: dispatch then takes the default variant)."""
    candidates = (knobs,)
    if knobs.DIRECTION == "bwd":
        candidates = (occupied(grouped(knobs, problem, gpu), problem, gpu), occupied(knobs, problem, gpu))
    return next((k for k in candidates if not violations(k, problem, gpu)),
                None) or default_knobs(problem, gpu, knobs.DIRECTION)


def for_call(knobs: FwdKnobs | BwdKnobs, *, tensors, deterministic: bool) -> tuple[FwdKnobs | BwdKnobs | None, str]:
    """TMA reads and writes every tensor: None (dispatch takes the default variant) where one of q, k, v, out is
    not 16-byte aligned, its address or a stride; and for a deterministic backward (the Gluon backward adds dQ
    with atomics; the `tl` family's separate dQ pass is deterministic)."""
    if knobs.DIRECTION == "bwd" and deterministic:
        return None, "deterministic=True: the Gluon backward adds dQ with atomics"
    if tma_aligned(*tensors):
        return knobs, ""
    return None, "Gluon's TMA needs 16-byte aligned tensors and strides"
