"""Launcher of the Gluon backward (templates/gluon/attn_bwd.py.jinja): host tensor descriptors, grids, one compiled
launch per kernel and call signature. Needs only torch and triton. (The forward's launcher is launch.py: this file
counts for the backward's template fingerprint alone.)"""

import torch
import triton
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

columns = None  # the module of templates/common/launch_columns.py (column_tiles), set by the loader
tma = None  # the module of templates/common/launch_tma.py (copies_over), set by the loader

GL_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}
DELTA_ROWS = 64  # query rows of one `_attn_bwd_delta` program


def _check(q, k, v, out, dout, dq, dk, dv, lse, dlse):
    """ValueError (the caller falls back to another family) for what the kernels cannot read or write."""
    tensors = dict(q=q, k=k, v=v, out=out, dout=dout, dq=dq, dk=dk, dv=dv)
    if q.dtype not in GL_DTYPES or any(t.dtype != q.dtype for t in tensors.values()):
        raise ValueError("the Gluon backward takes fp16 or bf16 q, k, v, out, dout, dq, dk, dv of one dtype; got "
                         + ", ".join(f"{name} {t.dtype}" for name, t in tensors.items()))
    for name, t in tensors.items():
        if t.stride(-1) != 1 or t.data_ptr() % 16 or any(s * t.element_size() % 16 for s in t.stride()[:-1]):
            raise ValueError(f"TMA needs 16-byte aligned {name} with unit last stride and 16-byte strides; got "
                             f"strides {t.stride()}: pass contiguous tensors")
    if min(q.shape[2], k.shape[2]) == 0:
        raise ValueError(f"TMA descriptors need non-empty sequences; got seqlen_q {q.shape[2]}, seqlen_k {k.shape[2]}")
    for name, t in (("lse", lse), ("dlse", dlse)):
        if t is not None and (t.dtype != torch.float32 or not t.is_contiguous() or t.shape != q.shape[:3]):
            raise ValueError(f"{name} must be a contiguous fp32 (batch, heads_q, seqlen_q) tensor; got {t.dtype} "
                             f"{tuple(t.shape)}")


def _dq_share(block_m, block_d, warpgroups, block_d2=0):
    """(rows, columns) of dQ's (block_m, block_d) tile that each consumer warpgroup adds: 64-column slices (from
    every key of the block) where the head dim has one a warpgroup, else 64-row slices where the step has them
    (wgmma operands start at whole 128-byte swizzle rows), else all of it from the warpgroup's own keys (twice
    the TMA reduce-adds, no wait for the other warpgroup's dS). With a second column tile (block_d2): the first
    warpgroup's, every row of the first tile (the second's: of the second tile)."""
    if block_d2:
        return block_m, block_d
    if block_d % (64 * warpgroups) == 0:
        return block_m, block_d // warpgroups
    if block_m % (64 * warpgroups) == 0:
        return block_m // warpgroups, block_d
    return block_m, block_d


def _block_n(block_d, warpgroups, block_d2=0):
    """Keys of one program: 64 a consumer warpgroup, or 64 in all where they split dK's and dV's columns (past
    head dim 128, or a column tile each: block_d2)."""
    return 64 * warpgroups if block_d <= 128 and not block_d2 else 64


def _dkv_columns(block_d, warpgroups, block_d2=0, split_keys=False):
    """Columns of dK and dV each consumer warpgroup owns: all of them for its own 64 keys up to head dim 128;
    past it (dK and dV of 64 keys do not fit a warpgroup's registers) the warpgroups share the program's 64 keys
    and split the columns, or (split_keys) split the keys and own all columns; with a second column tile
    (block_d2), the first warpgroup's: the first tile (the second's: the second tile)."""
    return block_d if block_d <= 128 or block_d2 or split_keys else block_d // warpgroups


def _column_tiles(knobs, head_dim):
    """The main kernel's column tiles (`columns.column_tiles`), the second at least 64 columns with split_keys:
    there its dK^T and dV^T are wgmma's M (NOTES 118)."""
    block_d, block_d2 = columns.column_tiles(knobs, head_dim)
    return block_d, max(block_d2, 64) if knobs.get("split_keys") and block_d2 else block_d2


def _layout(block, dtype):
    return gl.NVMMASharedLayout.get_default_for(block, dtype)


def _descriptor_maker(examples, block_m, block_d, warpgroups, block_d2=0, split_keys=False):
    """`make(q, k, v, dout, dk, dv, dq_sum, lse2, delta)`: TMA descriptors over tensors shaped, strided and aligned
    as `examples`, the plan's nine: q, dout in blocks of (1, 1, block_m, block_d); k, v of (1, 1, the program's
    keys (`_block_n`), block_d); dk, dv (q's dtype, or fp32 sums) of a warpgroup's (1, 1, its keys: 64, or with
    split_keys past 128 columns 64 / warpgroups, `_dkv_columns`); the fp32 dq_sum of a warpgroup's share of dQ
    (`_dq_share`); lse2 and delta (`_rows`) of (1, block_m). Rows past seqlen and columns past head_dim read as 0
    and are never written. With a second column tile (block_d2), the first seven again in blocks block_d2 wide (the
    kernel reads them from column block_d) before lse2 and delta: sixteen. Each is built (and checked) once here; a
    call gets copies over its own tensors (`tma.copies_over`; NOTES G-bwd11, G-bwd14). (The examples may stop after
    dq_sum: packed sequences read lse2 and delta without.)"""
    q = examples[0]
    tiles = [block_d, block_d2] if block_d2 else [block_d]
    blocks = []
    for width in tiles:
        dkv, keys = _dkv_columns(width, warpgroups, block_d2, split_keys), _block_n(width, warpgroups, block_d2)
        own = 64 // warpgroups if split_keys and (width > 128 or block_d2) else 64
        blocks.append([[1, 1, block_m, width], [1, 1, keys, width], [1, 1, keys, width], [1, 1, block_m, width],
                       [1, 1, own, dkv], [1, 1, own, dkv], [1, 1, *_dq_share(block_m, width, warpgroups, block_d2)]])
    blocks = [block for tile in blocks for block in tile] + [[1, block_m], [1, block_m]]
    examples = (*examples[:7] * len(tiles), *examples[7:])

    def built(t, block):
        shape = list(t.shape) if len(block) == 4 else [t.shape[0], q.shape[2]]  # (rows: their seqlen_q first)
        return TensorDescriptor(t, shape, list(t.stride()), block, _layout(block, GL_DTYPES.get(t.dtype, gl.float32)))
    over = tma.copies_over([built(t, block) for t, block in zip(examples, blocks)])
    return lambda *tensors: over(*tensors[:7] * len(tiles), *tensors[7:])


def _rows(q):
    """An fp32 (batch * heads_q, seqlen_q) buffer of one value per query row, its row stride a multiple of 4 (TMA
    wants 16-byte strides)."""
    batch, heads_q, seqlen_q, _ = q.shape
    return torch.empty(batch * heads_q, triton.cdiv(seqlen_q, 4) * 4, dtype=torch.float32, device=q.device)


def _sums(*grads):
    """fp32 buffers to add gradients into, each laid out as its gradient (empty_like keeps a dense tensor's
    strides): copying a sum into a (batch, seq, heads, dim) or packed view is then one contiguous pass, not a
    strided one (NOTES 65)."""
    return [torch.empty_like(t, dtype=torch.float32) for t in grads]


def backward_plan(kernels, knobs, q, k, v, out, lse, dout, dq, dk, dv, softmax_scale, causal, dlse, compile=None):
    """`backward(q, k, v, out, lse, dout, dq, dk, dv, dlse)` for every call shaped like this one (shapes, strides,
    dtypes, 16-byte alignment, dlse given or None). `kernels`: the rendered module; `knobs`: the dict it was
    rendered from; `compile(kernel, grid, args, options, tensor_count)`: autoflash's compile_launch, or None for
    Triton's per-call launch. q, out, dout, dq: (batch, heads_q, seqlen_q, head_dim); k, v, dk, dv: (batch,
    heads_kv, seqlen_k, head_dim); lse (the forward's) and dlse (the gradient of the returned lse, or None): fp32
    (batch, heads_q, seqlen_q), contiguous. Writes dq, dk, dv; dQ is summed with atomics (not bitwise
    repeatable; so are dK and dV where knobs["group_splits"] or knobs["query_splits"] is past 1: the programs sharing
    a KV head or a key block add theirs into fp32 sums)."""
    _check(q, k, v, out, dout, dq, dk, dv, lse, dlse)
    batch, heads_q, seqlen_q, head_dim = q.shape
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    block_d = max(16, triton.next_power_of_2(head_dim))  # (the delta kernel's, masked to head_dim)
    tile_d, tile_d2 = _column_tiles(knobs, head_dim)
    splits = knobs["group_splits"] * knobs["query_splits"]  # programs adding into one key block's dK and dV
    rows = _rows(q)  # (example tensors: each call allocates its own)
    dq_sum, = _sums(dq)  # (zeroed by the delta kernel)
    dkv_sum = _sums(dk, dv) if splits > 1 else (dk, dv)
    descriptors = _descriptor_maker((q, k, v, dout, *dkv_sum, dq_sum, rows, rows), knobs["block_m"], tile_d,
                                    knobs["warpgroups"], tile_d2, knobs["split_keys"])
    delta_args = (out, dout, lse, lse if dlse is None else dlse, rows, rows, dq_sum, *out.stride()[:3],
                  *dout.stride()[:3], rows.stride(0), heads_q, seqlen_q)
    delta_options = dict(HEAD_DIM=head_dim, BLOCK_D=block_d, HAS_DLSE=dlse is not None, ROWS=DELTA_ROWS)
    delta_grid = (triton.cdiv(seqlen_q, DELTA_ROWS), batch * heads_q)
    main_args = (*descriptors(q, k, v, dout, *dkv_sum, dq_sum, rows, rows), softmax_scale, heads_q, heads_kv,
                 seqlen_q, seqlen_k)
    main_tensors = len(main_args) - 5  # (the descriptors: 9, or 16 with two column tiles)
    main_options = dict(BLOCK_D=tile_d, IS_CAUSAL=bool(causal), num_warps=4)
    main_grid = (triton.cdiv(seqlen_k, _block_n(tile_d, knobs["warpgroups"], tile_d2)) * knobs["query_splits"],
                 batch * heads_kv * knobs["group_splits"])
    if compile is None:
        def delta_launch(*tensors):
            kernels._attn_bwd_delta[delta_grid](*tensors, *delta_args[7:], **delta_options)

        def main_launch(*tensors):
            kernels.attn_bwd[main_grid](*tensors, *main_args[main_tensors:], **main_options)
    else:
        delta_launch = compile(kernels._attn_bwd_delta, delta_grid, delta_args, delta_options, 7)
        main_launch = compile(kernels.attn_bwd, main_grid, main_args, main_options, main_tensors)

    def backward(q, k, v, out, lse, dout, dq, dk, dv, dlse):
        lse2, delta = _rows(q), _rows(q)
        dq_sum, = _sums(dq)
        delta_launch(out, dout, lse, lse if dlse is None else dlse, lse2, delta, dq_sum)
        if splits == 1:
            main_launch(*descriptors(q, k, v, dout, dk, dv, dq_sum, lse2, delta))
        else:
            dkv_sum = [t.zero_() for t in _sums(dk, dv)]
            main_launch(*descriptors(q, k, v, dout, *dkv_sum, dq_sum, lse2, delta))
            dk.copy_(dkv_sum[0])
            dv.copy_(dkv_sum[1])
        dq.copy_(dq_sum)
    return backward
