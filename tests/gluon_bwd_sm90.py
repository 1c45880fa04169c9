"""Render the Gluon backward and compile it for sm_90 without a GPU (as gluon_sm90.py does the forward; runs under
the GPU machine's triton too: `python tests/gluon_bwd_sm90.py` prints one line per variant)."""

import json
import sys
import tempfile

import triton
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.runtime.jit import MockTensor

from gluon_sm90 import _TorchDtype, compile_kernel, descriptor, load, ptxas_report

from autoflash.resources import launcher

TEMPLATE = "gluon/attn_bwd.py.jinja"


def _launcher():
    """templates/gluon/launch_bwd.py, whose rules (column tiles, dQ's split) the kernel's arguments follow."""
    return launcher("gluon", "bwd")


def compile_bwd_sm90(module, knobs: dict, head_dim: int, dtype: str = "float16", causal: bool = False, variants=(),
                     mask_mod: str = ""):
    """The module's `attn_bwd` (rendered with the `variants` gates, and `mask_mod` as gluon_sm90.render's) compiled
    for sm_90 (triton's CompiledKernel)."""
    captures = 1 if mask_mod == "documents" else 0
    row = 2 * (16 + 1)  # (the block table's row: 1000 queries in up to 16 blocks)
    launch, wg, shape = _launcher(), knobs["warpgroups"], [2, 4, 1000, head_dim]
    block_d, block_d2 = launch._column_tiles(knobs, head_dim)  # (as the launcher splits)
    tiles = []
    for width in (block_d, block_d2) if block_d2 else (block_d,):  # (the second column tile's seven again)
        q, kv = (descriptor(rows, head_dim, dtype, width) for rows in (knobs["block_m"],
                                                                       launch._block_n(width, wg, block_d2)))
        split = knobs["group_splits"] * knobs["query_splits"] > 1  # (then fp32 sums)
        dkv = descriptor(64 // wg if knobs["split_keys"] else 64, head_dim, "float32" if split else dtype,
                         columns=launch._dkv_columns(width, wg, block_d2, knobs["split_keys"]))
        dq_block = [1, 1, *launch._dq_share(knobs["block_m"], width, wg, block_d2)]
        dq = TensorDescriptor(MockTensor(_TorchDtype("float32"), shape), shape,
                              [4 * 1000 * head_dim, 1000 * head_dim, head_dim, 1], dq_block,
                              gl.NVMMASharedLayout.get_default_for(dq_block, gl.float32))
        tiles += [q, kv, kv, q, dkv, dkv, dq]
    rows = TensorDescriptor(MockTensor(_TorchDtype("float32"), [8, 1000]), [8, 1000], [1000, 1],
                            [1, knobs["block_m"]], gl.NVMMASharedLayout.get_default_for([1, knobs["block_m"]],
                                                                                         gl.float32))
    if "VARLEN" in variants:  # lse and delta by plain loads over the packed rows
        rows = MockTensor(_TorchDtype("float32"), [8 * 1000])
    slopes = (MockTensor(_TorchDtype("float32"), [4]),) if "ALIBI" in variants else ()
    args = (*tiles, rows, rows, *slopes,  # q, k, v, do, dk, dv, dq (a column tile's); lse, delta; ALiBi's slopes
            *((*(MockTensor(_TorchDtype("int32"), [1000]) for _ in range(captures)),  # the captures, the block table
               MockTensor(_TorchDtype("int32"), [4 * 16 * row])) if mask_mod else ()),
            0.1, 4, 2, 1000, 1000,  # scale, heads_q, heads_kv, seqlens
            *((100, 0 if causal else 30) if "WINDOW" in variants else ()), *((30.0,) if "SOFTCAP" in variants else ()),
            *((0,) if "ALIBI" in variants else ()),  # window_left, window_right; softcap; ALiBi's batch stride
            *((*(MockTensor(_TorchDtype("int32"), [8]) for _ in range(3)),  # cu_seqlens_q, cu_seqlens_k, table
               *(MockTensor(_TorchDtype(dtype), [2 * 1000 * head_dim]) for _ in range(2)),  # dk, dv
               1000, head_dim, 2 * head_dim, head_dim, 2 * head_dim, head_dim)  # lse/delta, dk, dv strides; head_dim
              if "VARLEN" in variants else ()),
            *((0, 16 * row, row, *(1000 for _ in range(captures))) if mask_mod else ()))  # table strides, lengths
    options = dict(BLOCK_D=block_d, IS_CAUSAL=causal, num_warps=4)
    return compile_kernel(module.attn_bwd, args, options)


DEFAULT = dict(block_m=64, num_buffers=2, warpgroups=2, group_splits=1, query_splits=1, dq_writer=False,
               dq_turns=False, dv_late=False, uneven_groups=False, head_dim_split=False, split_keys=False)  # the default
# (knob changes, head_dim, dtype, causal): each way of splitting dQ (columns at d128, rows in 128-row steps at d32,
# each warpgroup's own keys at d64 and below in 64-row steps; one warpgroup), and past d128 the warpgroups on the
# same keys with dK's and dV's columns split (32-row steps, dQ^T); GQA groups split over programs
CASES = [({}, 128, "float16", False),
         ({}, 128, "bfloat16", True),
         ({}, 96, "float16", True),
         ({}, 64, "float16", False),
         ({}, 32, "bfloat16", True),
         (dict(block_m=128), 32, "bfloat16", True),
         (dict(num_buffers=3), 128, "float16", True),
         (dict(warpgroups=1), 128, "bfloat16", False),
         (dict(block_m=32), 256, "float16", True),
         (dict(block_m=32), 192, "bfloat16", False),
         # a KV head's query heads over two or four programs (the defaults under GQA), dK and dV added in fp32
         (dict(group_splits=2), 128, "bfloat16", True),
         (dict(group_splits=4), 64, "float16", False),
         (dict(group_splits=2, block_m=32), 256, "bfloat16", True),
         # groups that the splits do not divide (MQA 71:1, GQA 7:1): the last program of a group walks fewer heads
         (dict(group_splits=4, uneven_groups=True, dq_turns=True), 64, "bfloat16", True),
         (dict(group_splits=2, uneven_groups=True, dv_late=True), 128, "bfloat16", True),
         (dict(group_splits=2, uneven_groups=True), 128, "bfloat16", True, ["WINDOW"]),
         (dict(group_splits=2, uneven_groups=True), 128, "bfloat16", True, ["VARLEN"]),
         (dict(group_splits=2, uneven_groups=True), 64, "bfloat16", True, ["MASK_MOD"], "documents"),
         # sliding window, softcapping and ALiBi, each and together
         ({}, 128, "bfloat16", True, ["WINDOW"]),
         ({}, 64, "float16", False, ["SOFTCAP"]),
         ({}, 128, "bfloat16", False, ["ALIBI"]),
         ({}, 128, "bfloat16", True, ["SOFTCAP"]),
         (dict(block_m=32), 256, "bfloat16", True, ["WINDOW", "SOFTCAP", "ALIBI"]),
         # dQ's tiles added by a warp of their own, each way of splitting them
         (dict(dq_writer=True), 128, "bfloat16", True),
         (dict(dq_writer=True), 64, "float16", False),
         (dict(dq_writer=True, block_m=128), 32, "bfloat16", True),
         (dict(dq_writer=True, block_m=32), 256, "bfloat16", True, ["WINDOW"]),
         # the two warpgroups adding dQ's whole tile in turns (head dims to 64)
         (dict(dq_turns=True), 64, "float16", True),
         (dict(dq_turns=True, num_buffers=3), 64, "bfloat16", False),
         (dict(dq_turns=True, group_splits=4), 32, "float16", True),
         (dict(dq_turns=True), 64, "bfloat16", True, ["WINDOW", "SOFTCAP", "ALIBI"]),
         # dV's wgmma issued after dS^T is stored (FA3's order): each head dim's tiles, with the other dQ knobs
         (dict(dv_late=True), 128, "float16", False),
         (dict(dv_late=True), 128, "bfloat16", True),
         (dict(dv_late=True, dq_writer=True), 128, "float16", False),
         (dict(dv_late=True, dq_turns=True), 64, "float16", True),
         (dict(dv_late=True, block_m=32), 256, "bfloat16", True),
         (dict(dv_late=True), 128, "bfloat16", True, ["SOFTCAP"]),
         (dict(dv_late=True, group_splits=2), 128, "bfloat16", True, ["WINDOW"]),
         (dict(dv_late=True), 128, "bfloat16", True, ["VARLEN"]),
         (dict(dv_late=True), 128, "bfloat16", True, ["MASK_MOD"], "documents"),
         # the defaults of a mask_mod at d128 (causal: groups split from 2k) and of a window (NOTES 158)
         (dict(dv_late=True, dq_writer=True), 128, "bfloat16", False, ["MASK_MOD"], "documents"),
         (dict(dv_late=True, dq_writer=True, group_splits=2), 128, "bfloat16", True, ["MASK_MOD"], "prefix-lm"),
         (dict(dv_late=True, dq_writer=True), 128, "bfloat16", True, ["WINDOW"]),
         # packed sequences: the (sequence, key block) table, lse and delta by plain loads, dK and dV stored from
         # registers (or added in fp32 where the group is split), each head dim's tiles, the dQ writer
         ({}, 64, "bfloat16", False, ["VARLEN"]),
         ({}, 64, "bfloat16", True, ["VARLEN"]),
         ({}, 128, "bfloat16", False, ["VARLEN"]),
         ({}, 128, "bfloat16", True, ["VARLEN"]),
         (dict(block_m=32), 256, "bfloat16", False, ["VARLEN"]),
         (dict(block_m=32), 256, "bfloat16", True, ["VARLEN"]),
         (dict(group_splits=2), 128, "bfloat16", True, ["VARLEN"]),
         (dict(dq_writer=True, num_buffers=3), 64, "float16", True, ["VARLEN"]),
         (dict(dq_turns=True), 64, "bfloat16", True, ["VARLEN"]),
         # mask_mods (the document mask from a captured tensor, prefix-LM): query blocks from the mask's block table
         ({}, 64, "bfloat16", False, ["MASK_MOD"], "documents"),
         ({}, 64, "bfloat16", True, ["MASK_MOD"], "prefix-lm"),
         ({}, 128, "bfloat16", False, ["MASK_MOD"], "documents"),
         ({}, 128, "bfloat16", True, ["MASK_MOD"], "documents"),
         ({}, 128, "bfloat16", True, ["MASK_MOD"], "prefix-lm"),
         (dict(block_m=32), 256, "bfloat16", False, ["MASK_MOD"], "documents"),
         (dict(block_m=32), 256, "bfloat16", True, ["MASK_MOD"], "prefix-lm"),
         (dict(group_splits=2), 128, "bfloat16", True, ["MASK_MOD"], "documents"),
         (dict(dq_writer=True), 128, "bfloat16", True, ["MASK_MOD"], "documents"),
         (dict(dq_turns=True), 64, "bfloat16", True, ["MASK_MOD"], "documents"),
         # the head dim in two column tiles (160 = 128 + 32, 192 = 128 + 64, 144 = 128 + 16): both warpgroups on 64
         # keys, each one tile's dK, dV and dQ, in 64-row steps (32 where the second tile has 64 columns)
         (dict(head_dim_split=True), 160, "bfloat16", True),
         (dict(head_dim_split=True), 160, "float16", False),
         (dict(head_dim_split=True), 192, "bfloat16", True),
         (dict(head_dim_split=True, dv_late=True), 192, "float16", False),
         (dict(head_dim_split=True, block_m=32), 192, "bfloat16", True),
         (dict(head_dim_split=True, group_splits=2), 160, "bfloat16", True),
         (dict(head_dim_split=True, group_splits=2, uneven_groups=True), 192, "bfloat16", True),
         (dict(head_dim_split=True), 160, "bfloat16", True, ["VARLEN"]),
         (dict(head_dim_split=True, group_splits=2), 192, "bfloat16", False, ["VARLEN"]),
         (dict(head_dim_split=True), 144, "bfloat16", True, ["WINDOW", "SOFTCAP", "ALIBI"]),
         (dict(head_dim_split=True), 160, "bfloat16", True, ["MASK_MOD"], "documents"),
         # a key block's steps over several programs (query_splits: few key blocks, cross-attention over a short
         # context), dK and dV added in fp32: d40's default, each head dim's tiles, with split groups, the dQ writer
         (dict(query_splits=8, dq_turns=True, dv_late=True), 64, "float16", False),
         (dict(query_splits=4), 128, "bfloat16", True),
         (dict(query_splits=2, group_splits=2), 128, "bfloat16", True, ["WINDOW"]),
         (dict(query_splits=2, group_splits=2, uneven_groups=True), 64, "bfloat16", True),
         (dict(query_splits=4, block_m=32), 256, "bfloat16", False),
         (dict(query_splits=2, head_dim_split=True), 160, "bfloat16", True),
         (dict(query_splits=4, dq_writer=True), 128, "float16", False),
         # past head dim 128 the warpgroups on 32 keys each, every column (split_keys: one ring slot, 64-row steps),
         # alone, with split groups or steps (fp32 dK and dV added), under a window and softcapping
         (dict(split_keys=True, num_buffers=1), 256, "bfloat16", True),
         (dict(split_keys=True, num_buffers=1), 256, "float16", False),
         (dict(split_keys=True, num_buffers=1), 192, "bfloat16", True),
         (dict(split_keys=True, num_buffers=1, group_splits=2), 256, "bfloat16", True),
         (dict(split_keys=True, num_buffers=1, query_splits=2, group_splits=2, uneven_groups=True), 256, "bfloat16",
          False),
         (dict(split_keys=True, num_buffers=1), 256, "bfloat16", True, ["WINDOW", "SOFTCAP"]),
         # ... over two column tiles (128 + 64) to head dim 192 (NOTES 118): two ring slots fit
         (dict(split_keys=True, head_dim_split=True), 192, "bfloat16", True),
         (dict(split_keys=True, head_dim_split=True, num_buffers=1), 192, "float16", False),
         (dict(split_keys=True, head_dim_split=True), 160, "bfloat16", False),
         (dict(split_keys=True, head_dim_split=True, group_splits=2), 192, "bfloat16", True),
         (dict(split_keys=True, head_dim_split=True), 160, "bfloat16", True, ["WINDOW", "SOFTCAP"])]


def report(cases) -> list[dict]:
    """Compile each case; what its compiled kernel says: shared memory, ptxas's registers and spills, wgmma
    instructions in the PTX."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for change, head_dim, dtype, causal, *more in cases:
            knobs, (variants, mask_mod) = DEFAULT | change, [*more, *((), "")[len(more):]]
            compiled = compile_bwd_sm90(load(knobs, tmp, TEMPLATE, variants, mask_mod), knobs, head_dim, dtype, causal,
                                        variants, mask_mod)
            ptx = compiled.asm["ptx"]
            rows.append(dict(shared=compiled.metadata.shared, wgmma=ptx.count("wgmma.mma_async"),
                             **ptxas_report(compiled)))
    return rows


if __name__ == "__main__":
    # Without arguments the cases above; else a JSON list of cases. One JSON line per case.
    for row in report(json.loads(sys.argv[1]) if len(sys.argv) > 1 else CASES):
        print(json.dumps(dict(row, triton=triton.__version__)), flush=True)
