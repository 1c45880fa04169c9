"""The knobs of the `tl` family (kernels in Triton's language, FlashAttention-2's loop order: a query tile
outer, key/value blocks inner, normalised once at the end): `FwdKnobs` and `BwdKnobs`."""

from dataclasses import dataclass
from typing import ClassVar

from autoflash.knobs import Knobs, family_knob, knob

FAMILY_DOC = "kernels in Triton's language (templates/tl), FlashAttention-2's loop order"


@dataclass(frozen=True)
class FwdKnobs(Knobs):
    DIRECTION: ClassVar[str] = "fwd"

    family: str = family_knob("tl", FAMILY_DOC)
    block_m: int = knob(128, (16, 32, 64, 128, 256), "query rows per tile")
    block_n: int = knob(64, (16, 32, 64, 128, 256), "key rows per tile")
    num_warps: int = knob(4, (2, 4, 8), "warps per program")
    num_stages: int = knob(2, (1, 2, 3, 4, 5), "software-pipelining depth of the key loop", searched=(2, 3, 4))
    exp: str = knob("exp2", ("exp2", "exp"), "exp2 with log2(e) folded into the scale, or exp")
    causal_split: bool = knob(True, (True, False),
                              "an unmasked loop over the key blocks every row sees whole, then a masked "
                              "loop over the causal band and the ragged tail; False masks every block")
    loads: str = knob("pointer", ("pointer", "tma", "tma_host"),
                      "how tiles move: pointer tensors with masks, or TMA tensor descriptors (Hopper on) that "
                      "each program builds on the device (tma) or the launcher builds on the host, one per "
                      "tensor and call (tma_host); block pointers are not offered: Triton removed them after 3.6")
    schedule: str = knob("in_order", ("in_order", "longest_first"),
                         "order of the query blocks: in_order walks each head's blocks from the first; "
                         "longest_first launches every head's last block first (under causal masking it "
                         "sees the most keys, so short blocks fill the tail). Not searched: it "
                         "lost on every causal grid problem on the H100 (benchmarks/NOTES.md, 10.); fit() "
                         "uses it where batch x heads exceeds the grid's y axis",
                         searched=("in_order",))
    kv_splits: int = knob(1, (1, 2, 4, 8, 16),
                          "programs that share one query tile's keys, each over a run of whole key blocks, "
                          "their partial results merged by a second kernel (flash-decoding): more programs "
                          "where batch x heads x query blocks leave SMs idle")
    pack_gqa: bool = knob(False, (False, True),
                          "GQA/MQA: the query heads that share a KV head are the rows of one tile, position-major "
                          "(row r: position r // group of the group's head r % group), so each K/V block is read "
                          "once for the group and a decode step fills the tile's rows (pointer loads)")
    head_dim_split: bool = knob(False, (False, True),
                                "the head dim as two column tiles, the largest power of two below it and one for "
                                "the rest, instead of one padded to a power of two: head dim 80 computes 64 + 16 "
                                "columns, not 128")


@dataclass(frozen=True)
class BwdKnobs(Knobs):
    """The backward's three kernels (preprocess, dK/dV, dQ) share one tile: a dK/dV program holds
    block_n keys and streams block_m query rows; the dQ pass holds block_n query rows and streams
    block_m keys (the same tile, transposed)."""
    DIRECTION: ClassVar[str] = "bwd"

    family: str = family_knob("tl", FAMILY_DOC)
    block_m: int = knob(64, (16, 32, 64, 128), "rows streamed per step: query rows in dK/dV, key rows in dQ")
    block_n: int = knob(128, (16, 32, 64, 128), "rows a program holds: key rows in dK/dV, query rows in dQ")
    num_warps: int = knob(8, (2, 4, 8), "warps per program")
    num_stages: int = knob(2, (1, 2, 3, 4, 5), "software-pipelining depth of the streamed loops",
                           searched=(1, 2, 3, 4))
    dq: str = knob("separate", ("separate", "atomic"),
                   "separate: dQ in its own pass (deterministic); atomic: the dK/dV programs add dS K into "
                   "an fp32 buffer with atomics (one pass fewer, not bitwise repeatable)")
    causal_split: bool = knob(True, (True, False),
                              "unmasked loops over the blocks that are whole and fully visible, masked loops "
                              "over the causal band and the ragged tails; False masks every block")
