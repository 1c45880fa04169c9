"""attention_with_kvcache: decode and chunked prefill over dense and paged caches (pages in random order), with
and without appending new keys, against the fp64 reference per sequence."""

import pytest
import torch

import autoflash
from autoflash.reference import TOLERANCE, attention_reference, relative_error
from conftest import DEVICE


def normal(gen, *shape, dtype=torch.float16):
    return torch.randn(*shape, generator=gen).to(DEVICE, dtype)


def paged(caches, page_size, gen):
    """Dense caches (batch, seqlen_cache, heads, d) on pages of page_size in one random order (3 spare pages of
    nan), and the block table."""
    batch, seqlen_cache = caches[0].shape[:2]
    per_sequence = -(-seqlen_cache // page_size)
    order = torch.randperm(batch * per_sequence + 3, generator=gen)[:batch * per_sequence].to(DEVICE)
    result = []
    for dense in caches:
        padded = torch.zeros(batch, per_sequence * page_size, *dense.shape[2:], dtype=dense.dtype, device=DEVICE)
        padded[:, :seqlen_cache] = dense
        pages = torch.full((batch * per_sequence + 3, page_size, *dense.shape[2:]), float("nan"), dtype=dense.dtype,
                           device=DEVICE)
        pages[order] = padded.reshape(batch * per_sequence, page_size, *dense.shape[2:])
        result.append(pages)
    return (*result, order.view(batch, per_sequence).to(torch.int32))


def reference(q, k_cache, v_cache, lengths, causal):
    """Per sequence b: q[b] over the first lengths[b] keys of the dense caches; (out, lse (batch, heads, seqlen_q))."""
    outs, lses = [], []
    for b, n in enumerate(lengths):
        out, lse = attention_reference(*(t[b:b + 1, :m].transpose(1, 2) for t, m in
                                         ((q, q.shape[1]), (k_cache, n), (v_cache, n))), causal)
        outs.append(out.transpose(1, 2))
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


CASES = [  # batch, seqlen_q, heads_q, heads_kv, head_dim, cache lengths, page size (None: dense), new tokens, causal
    (3, 1, 8, 2, 64, [0, 17, 100], None, 0, False),
    (3, 1, 8, 2, 64, [1, 17, 100], 16, 0, False),
    (2, 5, 4, 4, 32, [40, 7], 16, 3, True),
    (2, 19, 4, 1, 32, [64, 30], 64, 19, True),
    (2, 4, 2, 1, 48, [10, 70], None, 4, True),
]


@pytest.mark.parametrize("batch, seqlen_q, heads_q, heads_kv, head_dim, lengths, page_size, new, causal", CASES)
def test_matches_reference(batch, seqlen_q, heads_q, heads_kv, head_dim, lengths, page_size, new, causal):
    gen = torch.Generator().manual_seed(5)
    seqlen_cache = max(lengths) + new + 5
    q = normal(gen, batch, seqlen_q, heads_q, head_dim)
    k_dense, v_dense = (normal(gen, batch, seqlen_cache, heads_kv, head_dim) for _ in range(2))
    k_new, v_new = (normal(gen, batch, new, heads_kv, head_dim) for _ in range(2)) if new else (None, None)
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    if page_size is None:
        k_cache, v_cache, block_table = k_dense.clone(), v_dense.clone(), None
    else:
        k_cache, v_cache, block_table = paged((k_dense, v_dense), page_size, gen)
    out, lse = autoflash.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens,
                                                block_table=block_table, k=k_new, v=v_new, causal=causal,
                                                return_lse=True)
    total = [n + new for n in lengths]
    if new:  # the reference's dense caches with the new keys written where the call writes them
        for b, n in enumerate(lengths):
            k_dense[b, n:n + new], v_dense[b, n:n + new] = k_new[b], v_new[b]
    ref, ref_lse = reference(q, k_dense, v_dense, total, causal)
    assert out.shape == q.shape and lse.shape == (batch, heads_q, seqlen_q)
    assert relative_error(out, ref) < TOLERANCE[torch.float16]
    seen = torch.isfinite(ref_lse)
    assert torch.equal(seen, torch.isfinite(lse)) and (lse[seen].double() - ref_lse[seen]).abs().max() < 1e-3
    if new:  # in place, in the right rows (and pages)
        written = k_cache if page_size is None else k_cache[block_table.long()].flatten(1, 2)
        assert torch.equal(written[1, lengths[1]:total[1]], k_new[1])


@pytest.mark.parametrize("knobs", [
    dict(block_m=16, block_n=32, num_warps=2, num_stages=1, pack_gqa=True, kv_splits=2),  # a block spans 2 pages
    dict(block_m=16, block_n=16, num_warps=2, num_stages=1, kv_splits=4),
])
@pytest.mark.parametrize("on_host", [True, False], ids=["host table", "device table"])
def test_paged_variants(knobs, on_host, monkeypatch):
    """Both tile tables: built on the host from the checked lengths, and on the device (as under CUDA graph
    capture, where nothing is checked)."""
    from test_varlen import force_knobs

    force_knobs(monkeypatch, "fwd", **knobs)
    if not on_host:
        monkeypatch.setattr(autoflash.kvcache, "_check_values", lambda *args: None)
    gen = torch.Generator().manual_seed(6)
    lengths = [90, 3, 0, 33]
    q = normal(gen, 4, 2, 8, 32)
    k_dense, v_dense = (normal(gen, 4, 96, 2, 32) for _ in range(2))
    k_cache, v_cache, block_table = paged((k_dense, v_dense), 16, gen)
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    out = autoflash.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens, block_table=block_table,
                                           causal=True)
    ref, _ = reference(q, k_dense, v_dense, lengths, True)
    assert relative_error(out, ref) < TOLERANCE[torch.float16]


def test_values_read_once_while_unchanged(monkeypatch):
    """A decode step's layers share cache_seqlens and the block table: their values come to the host once while
    torch sees no write to them; the next step's in-place increment is read again (results follow it), and so is
    a block table rewritten in place (a page out of range refused)."""
    reads, read = [], autoflash.kvcache._read_values
    monkeypatch.setattr(autoflash.kvcache, "_read_values", lambda *args: reads.append(args) or read(*args))
    gen = torch.Generator().manual_seed(8)
    lengths = [20, 47]
    q = normal(gen, 2, 1, 4, 32)
    k_dense, v_dense = (normal(gen, 2, 64, 2, 32) for _ in range(2))
    k_cache, v_cache, block_table = paged((k_dense, v_dense), 16, gen)
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)

    def call():
        return autoflash.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens,
                                                block_table=block_table)
    for _ in range(3):
        call()
    assert len(reads) == 1
    cache_seqlens += 1
    assert relative_error(call(), reference(q, k_dense, v_dense, [21, 48], False)[0]) < TOLERANCE[torch.float16]
    assert len(reads) == 2
    block_table[1, 0] = k_cache.shape[0]
    with pytest.raises(ValueError, match="pages outside"):
        call()


def test_bad_inputs_say_how_to_fix():
    gen = torch.Generator().manual_seed(7)
    q = normal(gen, 2, 1, 4, 32)
    k_dense, v_dense = (normal(gen, 2, 40, 2, 32) for _ in range(2))
    k_cache, v_cache, block_table = paged((k_dense, v_dense), 16, gen)
    lengths = torch.tensor([10, 40], dtype=torch.int32, device=DEVICE)

    def call(*caches, **kwargs):
        return autoflash.attention_with_kvcache(q, *(caches or (k_cache, v_cache)), **(
            dict(cache_seqlens=lengths, block_table=block_table) | kwargs))
    with pytest.raises(ValueError, match="block_table must be an int32 \\(batch=2, max_pages\\)"):
        call(block_table=block_table[:1])
    with pytest.raises(ValueError, match="more than the cache holds \\(48 per sequence\\)"):
        call(cache_seqlens=torch.tensor([10, 49], dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="more than the cache holds \\(40 per sequence\\)"):
        call(k_dense, v_dense, block_table=None, k=normal(gen, 2, 1, 2, 32), v=normal(gen, 2, 1, 2, 32))
    with pytest.raises(ValueError, match="pages outside 0..8"):
        call(block_table=block_table + 100)
    with pytest.raises(TypeError, match="cache_seqlens must be an int32 tensor of shape \\(2,\\)"):
        call(cache_seqlens=lengths.long())
    with pytest.raises(ValueError, match="pass both k and v"):
        call(k=normal(gen, 2, 1, 2, 32))
