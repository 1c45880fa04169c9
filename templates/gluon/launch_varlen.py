"""Launcher of the Gluon forward over packed sequences (the VARLEN variant of templates/gluon/attn_fwd.py.jinja):
the dense launcher's descriptors (`base`, templates/gluon/launch.py) over (1, heads, total rows, head_dim) views,
and the `tl` family's table of (sequence, query tile) pairs (`tables`, templates/tl/launch_varlen.py), the tiles
that see the most keys first. Both set by the loader (autoflash.resources.launcher). A file of its own, named for
its variant, so the fingerprint of plain problems' kernels does not count it. Needs only torch, triton and numpy.
"""

import torch
import triton

base = None  # the module of templates/gluon/launch.py
tables = None  # the module of templates/tl/launch_varlen.py

VARLEN_ARGS = ("Cu_seqlens_q", "Starts_k", "Seqlens_k", "Tiles", "Out")  # a call's own, after the descriptors


def varlen_forward_plan(kernels, knobs, q, k, v, out, lse, cu_seqlens_q, starts_k, seqlens_k, softmax_scale, causal,
                        compile, pages=None):
    """`forward(q, k, v, out, lse, cu_seqlens_q, starts_k, seqlens_k, block_table, host)` over packed sequences, as
    the `tl` family's `varlen_forward_plan` (the same arguments and layouts: q, out (1, heads_q, total_q, head_dim)
    and k, v (1, heads_kv, rows, head_dim) views of packed tensors, lse fp32 (1, heads_q, total_q) or None). Tile
    t is entry t // heads_q of the table, head t % heads_q; Q, K, V come by TMA from the sequence's first rows (a
    tile's rows past its sequence read the next one's, never kept), O leaves from registers masked to the
    sequence's rows. No paged cache (`pages`), no key splits."""
    if pages is not None:
        raise ValueError("the Gluon forward reads no paged KV cache: the tl family does")
    base._check(q, k, v, out, lse)
    _, heads_q, total_q, head_dim = q.shape
    heads_kv = k.shape[1]
    batch = cu_seqlens_q.numel() - 1
    block_d = max(16, triton.next_power_of_2(head_dim))
    tile_m = knobs["block_m"] * knobs["consumers"]
    entries = triton.cdiv(total_q, tile_m) + batch  # bounds the (sequence, query tile) pairs before the lengths
    tiles = entries * heads_q
    descriptors = base._descriptor_maker(q, k, v, out, knobs["block_m"], knobs["block_n"], block_d)
    if knobs["persistent"]:  # one program per SM walks the tiles
        grid = (min(tiles, torch.cuda.get_device_properties(q.device).multi_processor_count),)
    else:
        grid = (tiles,)
    counter = base._counter_maker(q, knobs["dynamic"])
    if seqlens_k is None:  # only the layouts count here: the kernel is specialised on them
        seqlens_k = torch.empty(batch, dtype=torch.int32, device=q.device)
    table = torch.empty(2, entries, dtype=torch.int32, device=q.device)
    args = (*descriptors(q, k, v, out), q if lse is None else lse, counter(), softmax_scale, heads_q,
            heads_q // heads_kv, total_q, k.shape[2], entries, tiles, 1, cu_seqlens_q, starts_k, seqlens_k, table,
            out, out.stride(1), out.stride(2), head_dim)
    options = dict(BLOCK_D=block_d, IS_CAUSAL=bool(causal), RETURN_LSE=lse is not None, num_warps=4)
    launch = compile(kernels.attn_fwd, grid, args, options, 6, VARLEN_ARGS)

    def forward(q, k, v, out, lse, cu_seqlens_q, starts_k, seqlens_k, block_table=None, host=None):
        if host is None:
            table = tables.varlen_tiles(cu_seqlens_q, seqlens_k, 1, tile_m, causal, entries)
        else:
            seqlens_k, table = tables.to_device(
                (host[1], tables.host_tiles(*host, 1, tile_m, causal, entries)), cu_seqlens_q.device)
        launch(*descriptors(q, k, v, out), q if lse is None else lse, counter(), cu_seqlens_q, starts_k, seqlens_k,
               table, out)
    return forward
