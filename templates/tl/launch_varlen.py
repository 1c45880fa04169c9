"""Launchers of the `tl` family's kernels over packed sequences (the VARLEN variant; PAGED where keys sit on
pages of a KV cache): plain Python, the variant's knobs passed in as data, like launch.py, whose helpers they use
(`base`, set by the loader, autoflash.resources.launcher, once this module has run). A file of its own, named for its variant, so the
fingerprint of plain problems' kernels does not count it (codegen.template_fingerprint). Needs only torch,
triton and numpy.
"""

import numpy as np
import torch
import triton
import triton.language as tl

base = None  # the module of templates/tl/launch.py, set by the loader


TABLE_ENTRIES, TABLE_SEQUENCES = 128, 64  # the table kernels' entries a program, sequences a step


@triton.jit
def _ranks(keys, entry, other_keys, other):
    """How many of the `other` entries go before each entry: those that see more keys, or as many and come
    earlier (a stable sort, most keys first)."""
    before = (other_keys[None, :] > keys[:, None]) | ((other_keys[None, :] == keys[:, None]) &
                                                      (other[None, :] < entry[:, None]))
    return tl.sum(before.to(tl.int32), 1)


@triton.jit
def _tile_keys(Cu_seqlens_q, Keys, Out, batch, count, ROWS_PER_TOKEN: tl.constexpr, BLOCK: tl.constexpr,
               IS_CAUSAL: tl.constexpr, KEYS_ARE_OFFSETS: tl.constexpr, ONE_PROGRAM: tl.constexpr,
               ENTRIES: tl.constexpr, SEQUENCES: tl.constexpr):
    """Entry e of the table in table order: the keys its block sees (-1 past the last block), its sequence (-1
    past), its block within the sequence (past the last block: e less the last sequence's first entry, as
    `host_tiles`), into Out[0..2, e] for `_tile_order`; or, ONE_PROGRAM (the whole table in this program), the
    table itself into Out[0..1]."""
    entry = tl.program_id(0) * ENTRIES + tl.arange(0, ENTRIES)
    # the entry's sequence: how many sequences' blocks end at or before it; its first entry: the largest such end
    # among the sequences before the last (padding entries count from the last sequence's first entry)
    seq = tl.zeros([ENTRIES], tl.int32)
    first = tl.zeros([ENTRIES], tl.int32)
    ends_before = tl.zeros([], tl.int32)
    for s0 in range(0, batch, SEQUENCES):
        s = s0 + tl.arange(0, SEQUENCES)
        rows = tl.load(Cu_seqlens_q + s + 1, mask=s < batch, other=0) - tl.load(Cu_seqlens_q + s, mask=s < batch,
                                                                                other=0)
        blocks = (rows * ROWS_PER_TOKEN + BLOCK - 1) // BLOCK
        ends = ends_before + tl.cumsum(blocks, 0)
        passed = (ends[None, :] <= entry[:, None]) & (s < batch)[None, :]
        seq += tl.sum(passed.to(tl.int32), 1)
        first = tl.maximum(first, tl.max(tl.where(passed & (s < batch - 1)[None, :], ends[None, :], 0), 1))
        ends_before += tl.sum(blocks, 0)
    valid = seq < batch
    seq = tl.minimum(seq, batch - 1)
    index = entry - first
    rows = tl.load(Cu_seqlens_q + seq + 1) - tl.load(Cu_seqlens_q + seq)
    if KEYS_ARE_OFFSETS:
        keys = tl.load(Keys + seq + 1) - tl.load(Keys + seq)
    else:
        keys = tl.load(Keys + seq)
    if IS_CAUSAL:  # the block's last row sees the keys up to its position + seqlen_k - seqlen_q
        last = tl.minimum((index + 1) * BLOCK, rows * ROWS_PER_TOKEN) // ROWS_PER_TOKEN
        keys = tl.minimum(tl.maximum(last + keys - rows, 0), keys)
    inside = entry < count
    keys, seq = tl.where(valid, keys, -1), tl.where(valid, seq, -1)
    if ONE_PROGRAM:
        keys = tl.where(inside, keys, -2)  # (-2: after every entry, padding too)
        rank = _ranks(keys, entry, keys, entry)
        tl.store(Out + rank, seq, mask=inside)
        tl.store(Out + count + rank, index, mask=inside)
    else:
        tl.store(Out + entry, keys, mask=inside)
        tl.store(Out + count + entry, seq, mask=inside)
        tl.store(Out + 2 * count + entry, index, mask=inside)


@triton.jit
def _tile_order(Scratch, Tiles, count, ENTRIES: tl.constexpr):
    """Each entry of `_tile_keys` to its rank among all of them, compared ENTRIES x ENTRIES at a time."""
    entry = tl.program_id(0) * ENTRIES + tl.arange(0, ENTRIES)
    inside = entry < count
    keys = tl.load(Scratch + entry, mask=inside, other=-2)
    rank = tl.zeros([ENTRIES], tl.int32)
    for o0 in range(0, count, ENTRIES):
        other = o0 + tl.arange(0, ENTRIES)
        rank += _ranks(keys, entry, tl.load(Scratch + other, mask=other < count, other=-2), other)
    tl.store(Tiles + rank, tl.load(Scratch + count + entry, mask=inside), mask=inside)
    tl.store(Tiles + count + rank, tl.load(Scratch + 2 * count + entry, mask=inside), mask=inside)


def device_tiles(compile, cu_seqlens_q, keys, rows_per_token, block, causal, count, keys_are_offsets=False):
    """`tiles(cu_seqlens_q, keys)`: `host_tiles`' table (the same entries in the same order) built on the device by
    small kernels compiled now, no synchronisation: what calls use while a CUDA graph is captured (the lengths
    cannot come to the host then). One kernel where one program holds the table (decode), else two.
    cu_seqlens_q: int32 (batch + 1,) offsets of the query rows; keys: int32, the keys of each sequence (batch,), or
    with keys_are_offsets their (batch + 1,) offsets. `compile`: the plans' (autoflash.launch.compile_launch)."""
    batch, one_program = cu_seqlens_q.numel() - 1, count <= TABLE_ENTRIES
    scratch = torch.empty(2 if one_program else 3, count, dtype=torch.int32, device=cu_seqlens_q.device)
    grid = (triton.cdiv(count, TABLE_ENTRIES),)
    keys_launch = compile(
        _tile_keys, grid, (cu_seqlens_q, keys, scratch, batch, count),
        dict(ROWS_PER_TOKEN=rows_per_token, BLOCK=block, IS_CAUSAL=bool(causal), KEYS_ARE_OFFSETS=keys_are_offsets,
             ONE_PROGRAM=one_program, ENTRIES=TABLE_ENTRIES, SEQUENCES=TABLE_SEQUENCES, num_warps=4), 3)
    order_launch = None if one_program else compile(_tile_order, grid, (scratch, scratch[:2].clone(), count),
                                                    dict(ENTRIES=TABLE_ENTRIES, num_warps=4), 2)

    def tiles(cu_seqlens_q, keys):
        table = torch.empty(2, count, dtype=torch.int32, device=cu_seqlens_q.device)
        if one_program:
            keys_launch(cu_seqlens_q, keys, table)
            return table
        scratch = torch.empty(3, count, dtype=torch.int32, device=cu_seqlens_q.device)
        keys_launch(cu_seqlens_q, keys, scratch)
        order_launch(scratch, table)
        return table
    return tiles


def host_tiles(lengths_q, seqlens_k, rows_per_token, block, causal, count):
    """int32 (2, count): the (sequence, query block) pairs of a packed batch, sequences in the first row and
    blocks in the second, the block that sees the most keys first (under causal masking a sequence's last
    blocks; without, the longest sequences'; ties in table order), then padding (sequence -1) up to `count`, a
    bound known before the lengths are (the grid is sized on the host). From the lengths on the host (int64 numpy
    arrays: the query rows and the keys of each sequence; at least one sequence): a numpy array, no device work.
    `rows_per_token`: query rows a token adds (the group size with pack_gqa, else 1); `block`: rows a block."""
    entry = np.arange(count)
    blocks = (lengths_q * rows_per_token + block - 1) // block
    ends = blocks.cumsum(0)
    seq = np.searchsorted(ends, entry, side="right")
    valid = seq < lengths_q.shape[0]
    seq = seq.clip(max=lengths_q.shape[0] - 1)
    index = entry - (ends[seq] - blocks[seq])
    keys = seqlens_k[seq]
    if causal:  # the block's last row sees the keys up to its position + seqlen_k - seqlen_q
        last = np.minimum((index + 1) * block, lengths_q[seq] * rows_per_token) // rows_per_token
        keys = np.minimum((last + keys - lengths_q[seq]).clip(min=0), keys)
    order = np.argsort(-np.where(valid, keys, -1), stable=True)  # the most keys first, ties in table order
    return np.stack((np.where(valid, seq, -1)[order], index[order])).astype(np.int32)


def to_device(arrays, device):
    """int32 numpy arrays on `device` by one copy (from pinned memory, not waited for, on a GPU), each starting
    16 bytes apart or more, as the kernels' pointer arguments are specialised on 16-byte alignment."""
    starts = np.cumsum([0] + [-(-a.size // 4) * 4 for a in arrays])
    staged = torch.empty(int(starts[-1]), dtype=torch.int32, pin_memory=device.type == "cuda")
    values = staged.numpy()
    for array, start in zip(arrays, starts):
        values[start:start + array.size] = array.ravel()
    moved = staged.to(device, non_blocking=True)
    return [moved[start:start + array.size].view(array.shape) for array, start in zip(arrays, starts)]


def varlen_forward_plan(kernels, knobs, q, k, v, out, lse, cu_seqlens_q, starts_k, seqlens_k, softmax_scale, causal,
                        compile, pages=None):
    """`forward(q, k, v, out, lse, cu_seqlens_q, starts_k, seqlens_k, block_table, host)` over packed sequences, for
    every call shaped like this one (the shapes, strides and dtypes of every argument but the lengths' values, 16-byte
    alignment, softmax_scale, causal, lse given or None). q, out: (1, heads_q, total_q, head_dim) views of
    packed (total_q, heads_q, head_dim) tensors; k, v: (1, heads_kv, rows, head_dim) views; each with unit last
    stride. Sequence s has the rows [cu_seqlens_q[s], cu_seqlens_q[s + 1]) of q and the seqlens_k[s] keys from row
    starts_k[s] of k and v (all int32 on q's device). lse: fp32 (1, heads_q, total_q) or None.
    pages: for a paged cache, (block_table (batch, max_pages) int32, page_size, page strides of k and v): row j of
    sequence s lies on page block_table[s, j // page_size] (k's first dim: pages) at row j % page_size (starts_k
    then holds zeros). The grid is (table entries x heads, 1, kv_splits): `host_tiles`.
    host: None, or the values of the lengths where the host holds them, int64 numpy arrays (the steps of
    cu_seqlens_q, seqlens_k): the table is then built on the host (`host_tiles`) and comes over with seqlens_k in
    one copy, no device work, and seqlens_k may be None (here and per call)."""
    _, heads_q, total_q, head_dim = q.shape
    heads_kv = k.shape[1]
    group = heads_q // heads_kv
    batch = cu_seqlens_q.numel() - 1
    block_m, block_n, kv_splits = knobs["block_m"], knobs["block_n"], knobs["kv_splits"]
    block_d, block_d2 = base.columns.column_tiles(knobs, head_dim)
    rows_per_token, heads = (group, heads_kv) if knobs["pack_gqa"] else (1, heads_q)
    count = triton.cdiv(total_q * rows_per_token, block_m) + batch
    if kv_splits > 1:
        head_dim_pad = kernels._head_dim_pad(head_dim)
        part_shape = (kv_splits, heads_q, total_q, head_dim_pad)
        main_out = torch.empty(part_shape, dtype=torch.float32, device=q.device)
        main_lse = torch.empty(part_shape[:3], dtype=torch.float32, device=q.device)
    else:
        main_out, main_lse = out, out if lse is None else lse
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *main_out.stride()[:3])
    unit = base._stride_unit(q.element_size(), strides)
    varlen = ("Cu_seqlens_q", "Starts_k", "Seqlens_k", "Tiles") + (("Pages",) if pages else ())
    paged = dict(stride_pages=pages[0].stride(0), PAGE_SIZE=pages[1], stride_kpage=pages[2],
                 stride_vpage=pages[3]) if pages else {}
    if seqlens_k is None:  # only the layouts count here: the kernels are specialised on them
        seqlens_k = torch.empty(batch, dtype=torch.int32, device=q.device)
    tiles = torch.empty(2, count, dtype=torch.int32, device=q.device)
    main = compile(
        kernels._attn_fwd, (count * heads, 1, kv_splits),
        (q, k, v, main_out, main_lse, softmax_scale, *[s // unit for s in strides], heads_q, group, total_q, k.shape[2]),
        dict(HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_D2=block_d2, IS_CAUSAL=causal,
             RETURN_LSE=kv_splits > 1 or lse is not None, INPUT_PRECISION=kernels._input_precision(q.dtype),
             STRIDE_UNIT=unit, BLOCK_M=block_m, BLOCK_N=block_n, KV_SPLITS=kv_splits,
             num_warps=knobs["num_warps"], num_stages=knobs["num_stages"], enable_fp_fusion=True, **paged,
             **dict(zip(varlen, (cu_seqlens_q, starts_k, seqlens_k, tiles, *(pages[:1] if pages else ()))))),
        5, varlen)

    device_table = device_tiles(compile, cu_seqlens_q, seqlens_k, rows_per_token, block_m, causal, count)

    def lengths(cu_seqlens_q, starts_k, seqlens_k, block_table, host):
        if host is None:
            tiles = device_table(cu_seqlens_q, seqlens_k)
        else:
            seqlens_k, tiles = to_device((host[1], host_tiles(*host, rows_per_token, block_m, causal, count)),
                                         cu_seqlens_q.device)
        return (cu_seqlens_q, starts_k, seqlens_k, tiles) + ((block_table,) if pages else ())

    if kv_splits == 1:
        def forward(q, k, v, out, lse, cu_seqlens_q, starts_k, seqlens_k, block_table=None, host=None):
            main(q, k, v, out, out if lse is None else lse,
                 *lengths(cu_seqlens_q, starts_k, seqlens_k, block_table, host))
        return forward

    # the splits' partial results merge as in the dense forward: over (1, heads_q, total_q) rows, 32 a program, or
    # fewer where that leaves an SM less than two programs (decode: one row a sequence, the batch in total_q)
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 1
    rows = 32
    while rows > 4 and triton.cdiv(total_q, rows) * heads_q < 2 * sms:
        rows //= 2
    combine = compile(
        kernels._attn_fwd_combine, (triton.cdiv(total_q, rows), heads_q),
        (main_out, main_out, out, out if lse is None else lse, *out.stride()[:3], heads_q, total_q),
        dict(HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, KV_SPLITS=kv_splits, RETURN_LSE=lse is not None,
             BLOCK_M=rows, num_warps=4, enable_fp_fusion=True),
        4)

    def forward(q, k, v, out, lse, cu_seqlens_q, starts_k, seqlens_k, block_table=None, host=None):
        part_out = torch.empty(part_shape, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(part_shape[:3], dtype=torch.float32, device=q.device)
        main(q, k, v, part_out, part_lse, *lengths(cu_seqlens_q, starts_k, seqlens_k, block_table, host))
        combine(part_out, part_lse, out, out if lse is None else lse)
    return forward


def varlen_backward_plan(kernels, knobs, q, k, v, out, lse, dout, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, softmax_scale,
                         causal, dlse, compile):
    """`backward(q, k, v, out, lse, dout, dq, dk, dv, dlse, cu_seqlens_q, cu_seqlens_k, host)` over packed sequences, for
    every call shaped like this one (as `backward_plan`, the lengths' values aside): q, out, dout, dq (1, heads_q,
    total_q, head_dim) and k, v, dk, dv (1, heads_kv, total_k, head_dim) views of packed tensors; lse, dlse fp32
    (1, heads_q, total_q). The dK/dV programs run a table of (sequence, key block) pairs, the dQ pass one of
    (sequence, query block) pairs (`host_tiles`). Writes dq, dk, dv. host: None, or the lengths of the
    sequences' queries and keys as int64 numpy arrays: both tables are then built on the host and come over in one
    copy."""
    _, heads_q, total_q, head_dim = q.shape
    heads_kv, total_k = k.shape[1], k.shape[2]
    batch = cu_seqlens_q.numel() - 1
    block_m, block_n, atomic_dq = knobs["block_m"], knobs["block_n"], knobs["dq"] == "atomic"
    head_dim_pad = kernels._head_dim_pad(head_dim)
    tile = dict(IS_CAUSAL=causal, CAUSAL_SPLIT=knobs["causal_split"], INPUT_PRECISION=kernels._input_precision(q.dtype),
                HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, num_warps=knobs["num_warps"],
                num_stages=knobs["num_stages"], enable_fp_fusion=True)
    varlen = ("Cu_seqlens_q", "Cu_seqlens_k", "Tiles")
    key_count, query_count = triton.cdiv(total_k, block_n) + batch, triton.cdiv(total_q, block_n) + batch

    key_table = device_tiles(compile, cu_seqlens_k, cu_seqlens_q, 1, block_n, False, key_count, keys_are_offsets=True)
    query_table = None if atomic_dq else device_tiles(compile, cu_seqlens_q, cu_seqlens_k, 1, block_n, causal,
                                                      query_count, keys_are_offsets=True)

    def tables(cu_seqlens_q, cu_seqlens_k, host):
        """The dK/dV programs' table (key blocks, the most query rows of their sequence first), then the dQ
        programs' unless dQ is atomic."""
        if host is None:
            return [key_table(cu_seqlens_k, cu_seqlens_q)] + ([] if atomic_dq else
                                                                [query_table(cu_seqlens_q, cu_seqlens_k)])
        lengths_q, lengths_k = host
        keys = host_tiles(lengths_k, lengths_q, 1, block_n, False, key_count)
        return to_device([keys] + ([] if atomic_dq else
                                   [host_tiles(lengths_q, lengths_k, 1, block_n, causal, query_count)]),
                         cu_seqlens_q.device)

    delta = torch.empty_like(lse)
    preprocess = compile(  # over (1, heads_q, total_q) rows, as the dense backward's
        kernels._attn_bwd_preprocess, (triton.cdiv(total_q, base._PREPROCESS_BLOCK), heads_q),
        (out, dout, lse if dlse is None else dlse, delta, *out.stride()[:3], *dout.stride()[:3], heads_q, total_q),
        dict(HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, HAS_DLSE=dlse is not None, BLOCK=base._PREPROCESS_BLOCK,
             enable_fp_fusion=True),
        4)
    dq_sum = torch.zeros(q.shape, dtype=torch.float32, device=q.device) if atomic_dq else dq
    lengths = (cu_seqlens_q, cu_seqlens_k)
    dkdv = compile(
        kernels._attn_bwd_dkdv, (key_count * heads_kv,),
        (q, k, v, dout, lse, delta, dq_sum, dk, dv, softmax_scale,
         *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *dout.stride()[:3], *dq_sum.stride()[:3],
         *dk.stride()[:3], *dv.stride()[:3], heads_q, heads_kv, heads_q // heads_kv, total_q, total_k),
        dict(tile, ATOMIC_DQ=atomic_dq, BLOCK_M=block_m, BLOCK_N=block_n,
             **dict(zip(varlen, (*lengths, torch.empty(2, key_count, dtype=torch.int32, device=q.device))))),
        9, varlen)
    dq_pass = None if atomic_dq else compile(
        kernels._attn_bwd_dq, (query_count * heads_q,),
        (q, k, v, dout, lse, delta, dq, softmax_scale,
         *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *dout.stride()[:3], *dq.stride()[:3],
         heads_q, heads_q // heads_kv, total_q, total_k),
        dict(tile, BLOCK_M=block_n, BLOCK_N=block_m,
             **dict(zip(varlen, (*lengths, torch.empty(2, query_count, dtype=torch.int32, device=q.device))))),
        7, varlen)

    def backward(q, k, v, out, lse, dout, dq, dk, dv, dlse, cu_seqlens_q, cu_seqlens_k, host=None):
        lengths = (cu_seqlens_q, cu_seqlens_k)
        delta = torch.empty_like(lse)
        preprocess(out, dout, lse if dlse is None else dlse, delta)
        key_tiles, *query_tiles = tables(*lengths, host)
        if atomic_dq:
            dq_sum = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
            dkdv(q, k, v, dout, lse, delta, dq_sum, dk, dv, *lengths, key_tiles)
            dq.copy_(dq_sum)
            return
        dkdv(q, k, v, dout, lse, delta, dq, dk, dv, *lengths, key_tiles)
        dq_pass(q, k, v, dout, lse, delta, dq, *lengths, *query_tiles)
    return backward
