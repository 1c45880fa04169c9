"""Attention over a KV cache: `attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=..., ...)`, in the layout
and with the meanings of flash-attn's `flash_attn_with_kvcache` (decode and chunked prefill).

The cache is dense, (batch, seqlen_cache, heads_kv, head_dim), or paged, (num_pages, page_size, heads_kv,
head_dim) with a block table (batch, max_pages) of page indices in any order. New keys and values (k, v) are
written into the cache at cache_seqlens first, in place, as flash-attn does. The kernels are the varlen forward's
(autoflash/varlen.py): the batch's query rows packed, sequence b's keys the first cache_seqlens[b] (+ new) rows
of its cache line or pages; a paged cache adds the PAGED gate (a page-table load per key block). Split-KV and
GQA packing come with the dispatched knobs (kv_splits, pack_gqa), as on the dense decode path.

Dispatch key: the Problem (batch, heads, seqlen_q, seqlen_k = the cache's capacity per sequence, both rounded up to
powers of two, variants VARLEN, plus PAGED and the page size for a paged cache), tuned from a problems file's
`kvcache:` entries (autoflash/shapes.py); where nothing packed is tuned, the nearest dense winner fitted to it.
"""

import numpy as np
import torch

from autoflash import checks
from autoflash.varlen import checked_packed, packed_forward, read_once


def attention_with_kvcache(q, k_cache, v_cache, *, cache_seqlens, block_table=None, k=None, v=None, causal=False,
                           softmax_scale=None, return_lse=False):
    """Attention of q over the first cache_seqlens[b] keys of each sequence's cache (after appending k, v).

    Not differentiable (an inference entry point).

    Args:
        q: (batch, seqlen_q, heads_q, head_dim); seqlen_q 1 (decode) or more (chunked prefill, speculative steps).
        k_cache, v_cache: dense (batch, seqlen_cache, heads_kv, head_dim), or paged (num_pages, page_size,
            heads_kv, head_dim) with block_table. heads_q a multiple of heads_kv (GQA/MQA). Last stride 1.
        cache_seqlens: int32 (batch,) on q's device: the keys each sequence holds before this call.
        block_table: int32 (batch, max_pages): sequence b's key j lies on page block_table[b, j // page_size], row
            j % page_size (pages in any order). None: a dense cache.
        k, v: optional (batch, seqlen_new, heads_kv, head_dim), written into the caches at cache_seqlens[b]..
            (in place) before attending: sequence b then holds cache_seqlens[b] + seqlen_new keys.
        causal: aligned bottom-right to each sequence's keys (after the append): query i of seqlen_q sees key j
            when j <= i + seqlen_k - seqlen_q.
        softmax_scale: scale of the scores, positive; default 1 / sqrt(head_dim).
        return_lse: also return the log-sum-exp, float32 (batch, heads_q, seqlen_q).

    Returns:
        out (batch, seqlen_q, heads_q, head_dim); with return_lse, (out, lse).

    The values of cache_seqlens and block_table are checked on the host (one synchronisation; the kernels' tile
    table is then built there too) except while a CUDA graph is being captured; once for the same tensors while
    torch sees no in-place write to them (its version counter): a decode step's layers synchronise once. Lengths or
    a block table rewritten in place by a kernel of your own must come in new tensors.
    """
    batch, seqlen_q, heads_q, head_dim = _check_shapes(q, k_cache, v_cache, cache_seqlens, block_table, k, v)
    checks.check_flags(causal=causal, return_lse=return_lse)
    scale = checks.scale_of(softmax_scale, head_dim)
    new = 0 if k is None else k.shape[1]
    page_size = k_cache.shape[1]
    capacity = block_table.shape[1] * page_size if block_table is not None else k_cache.shape[1]
    lengths = _check_values(cache_seqlens, block_table, new, capacity, k_cache.shape[0])
    if k is not None:
        _append(k_cache, v_cache, k, v, cache_seqlens, block_table)
    # the sequences' query rows and keys on the host, the tile table built from them (else on the device)
    host = None if lengths is None else (np.full(batch, seqlen_q, dtype=np.int64), lengths)
    seqlens_k = None if host is not None else cache_seqlens + new if new else cache_seqlens
    packed_q = q.reshape(batch * seqlen_q, heads_q, head_dim)
    out = torch.empty(batch, seqlen_q, heads_q, head_dim, dtype=q.dtype, device=q.device)
    lse = torch.empty(heads_q, batch * seqlen_q, dtype=torch.float32, device=q.device) if return_lse else None
    if block_table is None:
        # sequence b's keys: the rows from b's cache line on, as a (rows, heads_kv, head_dim) view of the cache
        line = k_cache.stride(0) // k_cache.stride(1), v_cache.stride(0) // v_cache.stride(1)
        keys, values = (cache.as_strided(((batch - 1) * step + cache.shape[1], *cache.shape[2:]), cache.stride()[1:])
                        for cache, step in ((k_cache, line[0]), (v_cache, line[1])))
        packed_forward(packed_q, keys, values, out.view(packed_q.shape), lse,
                       *_offsets(batch, seqlen_q, line[0], q.device), seqlens_k, seqlen_q, capacity, causal, scale,
                       host=host)
    else:
        pages = (block_table, page_size, k_cache.stride(0), v_cache.stride(0))
        packed_forward(packed_q, k_cache[0], v_cache[0], out.view(packed_q.shape), lse,
                       *_offsets(batch, seqlen_q, 0, q.device), seqlens_k, seqlen_q, capacity, causal, scale, pages,
                       host)
    if return_lse:
        return out, lse.view(heads_q, batch, seqlen_q).transpose(0, 1)
    return out


# (cu_seqlens_q, starts_k) by (batch, seqlen_q, line, device): made outside graph capture and never dropped, since
# a captured graph goes on reading the ones it was captured with (a few hundred bytes each, one a shape)
_OFFSETS: dict = {}


def _offsets(batch, seqlen_q, line, device):
    """int32 (cu_seqlens_q, starts_k) of the packed call: sequence b's queries from row b * seqlen_q, its keys
    from row b * line of the cache's view (0: a paged cache's, whose rows the block table places). Made once and
    kept where no CUDA graph is being captured (what a captured call makes lives in the graph's memory), so a
    decode step's layers and replays run no kernel for them."""
    key = (batch, seqlen_q, line, device)
    if key in _OFFSETS:
        return _OFFSETS[key]
    rows = torch.arange(batch + 1, dtype=torch.int32, device=device)
    offsets = rows * seqlen_q, rows[:-1] * line
    if not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()):
        _OFFSETS[key] = offsets
    return offsets


def _append(k_cache, v_cache, k, v, cache_seqlens, block_table):
    """Write k, v (batch, seqlen_new, heads_kv, head_dim) into the caches at positions cache_seqlens[b].., on the
    device (no synchronisation)."""
    positions = cache_seqlens[:, None].long() + torch.arange(k.shape[1], device=k.device)
    if block_table is None:
        where = (torch.arange(k.shape[0], device=k.device)[:, None], positions)
    else:
        page_size = k_cache.shape[1]
        where = (block_table.gather(1, positions // page_size).long(), positions % page_size)
    k_cache[where] = k
    v_cache[where] = v


def _check_shapes(q, k_cache, v_cache, cache_seqlens, block_table, k, v):
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 4-D tensor (q: batch, seqlen_q, heads, head_dim; a cache: batch, "
                             f"seqlen_cache, heads_kv, head_dim or num_pages, page_size, heads_kv, head_dim), got {got}")
    checked_packed(q[0], k_cache[0], v_cache[0])  # dtypes, devices, head dims, GQA, strides
    if any(t.stride(-1) != 1 for t in (k_cache, v_cache)):
        raise ValueError("k_cache and v_cache must have last stride 1 (attention reads them in place): pass "
                         "contiguous caches")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have one shape, got {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")
    batch = q.shape[0]
    if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.dtype != torch.int32 \
            or cache_seqlens.shape != (batch,) or cache_seqlens.device != q.device:
        got = f"{cache_seqlens.dtype} {tuple(cache_seqlens.shape)} on {cache_seqlens.device}" \
            if isinstance(cache_seqlens, torch.Tensor) else type(cache_seqlens).__name__
        raise TypeError(f"cache_seqlens must be an int32 tensor of shape ({batch},) on {q.device}, got {got}: "
                        "pass torch.tensor(lengths, dtype=torch.int32, device=q.device)")
    if block_table is None:
        if k_cache.shape[0] != batch:
            raise ValueError(f"a dense cache holds one line per sequence: k_cache has {k_cache.shape[0]}, q "
                             f"{batch} (a paged cache needs block_table)")
        if k_cache.stride(0) % k_cache.stride(1) or v_cache.stride(0) % v_cache.stride(1):
            raise ValueError(f"a dense cache's batch stride must be a multiple of its sequence stride, got "
                             f"{k_cache.stride()}: pass a contiguous cache")
    elif not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32 or block_table.dim() != 2 \
            or block_table.shape[0] != batch or block_table.device != q.device or block_table.stride(1) != 1:
        got = f"{block_table.dtype} {tuple(block_table.shape)} on {block_table.device}" \
            if isinstance(block_table, torch.Tensor) else type(block_table).__name__
        raise ValueError(f"block_table must be an int32 (batch={batch}, max_pages) tensor on {q.device} with last "
                         f"stride 1, got {got}")
    if (k is None) != (v is None):
        raise ValueError("pass both k and v to append, or neither")
    if k is not None:
        shape = (batch, k.shape[1] if k.dim() == 4 else -1, *k_cache.shape[2:])
        for name, t in (("k", k), ("v", v)):
            if t.dim() != 4 or t.shape != shape or t.dtype != q.dtype or t.device != q.device:
                raise ValueError(f"{name} must be (batch, seqlen_new, heads_kv, head_dim) = {shape} of {q.dtype} on "
                                 f"{q.device}, got {tuple(t.shape)} {t.dtype} on {t.device}")
    return q.shape


def _check_values(cache_seqlens, block_table, new, capacity, num_pages):
    """Each sequence's keys after the append, cache_seqlens + new, on the host (an int64 numpy array), checked
    within the cache's capacity, and the block table's used entries valid pages: one synchronisation, none again
    for the same tensors while torch sees no write to them (`read_once`: the layers of a decode step share them).
    None while a CUDA graph is captured (nothing is checked then)."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return None
    return read_once((cache_seqlens,) if block_table is None else (cache_seqlens, block_table),
                     (new, capacity, num_pages),
                     lambda: _read_values(cache_seqlens, block_table, new, capacity, num_pages))


def _read_values(cache_seqlens, block_table, new, capacity, num_pages):
    lengths = cache_seqlens + new
    values = [lengths.to(torch.int64)]
    if block_table is not None:
        page_size = capacity // block_table.shape[1]
        used = torch.arange(block_table.shape[1], device=block_table.device) < (lengths[:, None] + page_size - 1) \
            // page_size
        values.append((((block_table < 0) | (block_table >= num_pages)) & used).sum().view(1))
    values = torch.cat(values).cpu().numpy()
    lengths, bad_pages = values[:cache_seqlens.numel()], values[cache_seqlens.numel():].tolist()
    shortest, longest = (int(lengths.min()), int(lengths.max())) if lengths.size else (0, 0)
    if shortest - new < 0:
        raise ValueError(f"cache_seqlens must be >= 0, got {shortest - new}")
    if longest > capacity:
        raise ValueError(f"a sequence needs {longest} keys (cache_seqlens + {new} new), more than the cache holds "
                         f"({capacity} per sequence): grow the cache{' or the block table' if block_table is not None else ''}")
    if bad_pages and bad_pages[0]:
        raise ValueError(f"block_table lists {bad_pages[0]} pages outside 0..{num_pages - 1} among those the "
                         "sequences use: every used entry must index k_cache's first dimension")
    lengths.flags.writeable = False  # shared by every call that remembers them
    return lengths
