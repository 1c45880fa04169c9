"""The knobs of the `gluon` family (templates/gluon: the forward in FlashAttention-3's shape and a FlashAttention-2/3
backward, written in Triton's Gluon dialect for Hopper); what they cannot run is limits.py's, the heuristic defaults
and the fitting of a neighbour's knobs defaults.py's."""

from dataclasses import dataclass
from typing import ClassVar

from autoflash.knobs import Knobs, family_knob, knob

FAMILY_DOC = ("FlashAttention-3's shape in Gluon (templates/gluon), Hopper only: a TMA producer warp and "
              "consumer warpgroups with registers split between them, asynchronous wgmma")
BWD_DOC = ("FlashAttention-3's backward in Gluon (templates/gluon), Hopper only: a TMA producer warp, consumer "
           "warpgroups of 64 keys, asynchronous wgmma, dQ added by TMA reduce-add")


@dataclass(frozen=True)
class FwdKnobs(Knobs):
    DIRECTION: ClassVar[str] = "fwd"

    family: str = family_knob("gluon", FAMILY_DOC)
    block_m: int = knob(64, (64,), "query rows of one consumer warpgroup (one wgmma row block)")
    block_n: int = knob(128, (64, 128), "key rows of one K/V block")
    num_buffers: int = knob(2, (2, 3), "slots of the K/V ring in shared memory")
    q_buffers: int = knob(1, (1, 2), "Q tiles of each consumer: with 2 the next tile's Q loads under this whole "
                                      "tile (a persistent grid's), with 1 once this one's last Q K^T is done")
    consumers: int = knob(2, (1, 2, 3), "consumer warpgroups; a program's tile has consumers x block_m query rows")
    overlap: bool = knob(True, (True, False),
                         "each block's Q K^T and softmax under the last block's P V (intra-warpgroup overlap); "
                         "False: Q K^T, softmax, P V one after the other")
    pingpong: bool = knob(False, (False, True),
                          "two consumers take turns issuing their wgmmas (mbarriers), so one's softmax runs under "
                          "the other's matrix work")
    persistent: bool = knob(True, (True, False),
                            "one program per SM walks the tiles (the next tile's loads under this one's "
                            "epilogue); False: one program per tile")
    programs_per_sm: int = knob(1, (1, 2, 3),
                                "programs resident on an SM at once: 2 or 3 give each that share of the SM's "
                                "registers (launched with 128 or 80 a thread: one consumer warpgroup beside the "
                                "producer) and shared memory, so one program's loads, softmax and epilogue run under "
                                "another's wgmmas (short sequences); a persistent grid has that many programs an SM")
    dynamic: bool = knob(False, (False, True),
                         "(persistent) each program takes its next tile from a global counter as it finishes one, "
                         "so unequal causal tiles go longest first to whichever SM is free; False: every "
                         "num_programs-th tile")
    stage_o_in_q: bool = knob(False, (False, True),
                              "O leaves through the consumer's Q tile (saves its shared memory; the next Q waits "
                              "for the store) instead of a tile of its own")
    tile_overlap: bool = knob(False, (False, True),
                              "(persistent, two Q tiles, overlap) the next tile's first Q K^T and softmax run under "
                              "this tile's last P V, before its epilogue (plain problems)")
    head_dim_split: bool = knob(False, (False, True),
                                "the head dim as two column tiles, the largest power of two below it and one for "
                                "the rest, instead of one padded to a power of two: head dim 160 computes 128 + 32 "
                                "columns, not 256 (two wgmmas for Q K^T and for P V, two O accumulators)")
    consumer_keys: bool = knob(False, (False, True),
                               "(causal) each consumer computes the key blocks to its own last row's diagonal, not "
                               "the tile's: blocks past it the producer releases for it, and a last block whose "
                               "second half it never sees it computes half of (two consumers: the first skips the "
                               "diagonal's second 64-key block, or half of a 128-key one; NOTES 120, 132)")
    consumer_regs: int = knob(240, (240, 232, 160), "registers per thread of each consumer warpgroup but the first")
    producer_regs: int = knob(24, (24, 32, 40), "registers per thread of the producer warp('s warpgroup)")


@dataclass(frozen=True)
class BwdKnobs(Knobs):
    """templates/gluon/attn_bwd.py.jinja: a producer warp loads a program's 64 x warpgroups keys (K, V) once and
    streams block_m query rows of every query head that reads them through a ring of Q/dO tiles; each consumer
    warpgroup owns 64 of the keys (their dK, dV)."""
    DIRECTION: ClassVar[str] = "bwd"

    family: str = family_knob("gluon", BWD_DOC)
    block_m: int = knob(64, (32, 64, 128), "query rows of one step (the N of S^T = K Q^T's wgmma)")
    warpgroups: int = knob(2, (1, 2), "consumer warpgroups of a program, 64 keys each (past head dim 128: the "
                                      "program's 64 keys, half of dK's and dV's columns each)")
    num_buffers: int = knob(2, (2, 3, 1), "slots of the Q/dO/lse/delta ring: the next steps' tiles load under this "
                                          "one (1: split_keys only, where a second does not fit)")
    group_splits: int = knob(1, (1, 2, 4, 8), "programs sharing a KV head's group of query heads (GQA), each walking "
                                              "group / group_splits of them and adding its dK, dV into fp32 sums "
                                              "(TMA reduce-add); 1: one program sums the group in registers")
    query_splits: int = knob(1, (1, 2, 4, 8, 16), "programs sharing a key block's steps (query head, query block "
                                                  "pairs, in the order one program walks them), each walking an "
                                                  "equal run of them and adding its dK, dV into fp32 sums (TMA "
                                                  "reduce-add): more programs where key blocks x heads leave SMs "
                                                  "idle (cross-attention over a short context)")
    dq_writer: bool = knob(False, (False, True), "a 1-warp partition adds dQ's tiles by TMA from two shared slots a "
                                                 "consumer (the consumers hand them over by mbarrier); else each "
                                                 "consumer adds its own tile, waiting for the last one's reduce")
    dq_turns: bool = knob(False, (False, True), "(head dims to 64, two warpgroups) the warpgroups take turns, step by "
                                                "step, adding dQ's whole tile from both warpgroups' dS^T: one TMA "
                                                "reduce-add a step, not one from each warpgroup's own keys")
    dv_late: bool = knob(False, (False, True), "dV += P^T dO issued after dS^T is computed and stored (FA3's order), "
                                               "not between P^T and dS^T: fewer registers live at once")
    uneven_groups: bool = knob(False, (False, True), "(group_splits not dividing the group: MQA 71:1, GQA 7:1) each "
                                                     "program walks ceil(group / group_splits) query heads, the "
                                                     "last of a group fewer")
    head_dim_split: bool = knob(False, (False, True),
                                "(past head dim 128) the head dim as two column tiles, the largest power of two below "
                                "it and one for the rest, instead of one padded to a power of two: 160 computes 128 + "
                                "32 columns, not 256 (S^T and dP^T two chained wgmmas each; each warpgroup owns one "
                                "tile's dK, dV and dQ)")
    split_keys: bool = knob(False, (False, True),
                            "(past head dim 128, two warpgroups) the warpgroups split the program's 64 keys, 32 each "
                            "with all of their dK and dV columns, instead of splitting the columns: S = Q K^T and dP "
                            "= dO V^T over a warpgroup's own keys (no product computed twice), dV^T += dO^T P and dK^T "
                            "+= Q^T dS with the operands swapped, 64-row steps, one ring slot (NOTES 114)")
