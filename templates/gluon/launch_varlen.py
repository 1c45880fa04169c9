"""Launchers of the Gluon forward and backward over packed sequences (the VARLEN variant of
templates/gluon/attn_fwd.py.jinja and attn_bwd.py.jinja): the dense launchers' descriptors (`base`,
templates/gluon/launch.py; `base_bwd`, launch_bwd.py) over (1, heads, total rows, head_dim) views, and the `tl`
family's tables of (sequence, block) pairs (`tables`, templates/tl/launch_varlen.py), the blocks with the most
work first. All set by the loader (autoflash.resources.launcher). A file of its own, named for its variant, so the
fingerprint of plain problems' kernels does not count it. Needs only torch, triton and numpy.
"""

import torch
import triton

base = None  # the module of templates/gluon/launch.py
base_bwd = None  # the module of templates/gluon/launch_bwd.py
tables = None  # the module of templates/tl/launch_varlen.py

VARLEN_ARGS = ("Cu_seqlens_q", "Starts_k", "Seqlens_k", "Tiles", "Out")  # a call's own, after the descriptors
BWD_VARLEN_ARGS = ("Cu_seqlens_q", "Cu_seqlens_k", "Tiles", "DK", "DV")  # the backward's, after lse2 and delta


def varlen_forward_plan(kernels, knobs, q, k, v, out, lse, cu_seqlens_q, starts_k, seqlens_k, softmax_scale, causal,
                        compile, pages=None):
    """`forward(q, k, v, out, lse, cu_seqlens_q, starts_k, seqlens_k, block_table, host)` over packed sequences, as
    the `tl` family's `varlen_forward_plan` (the same arguments and layouts: q, out (1, heads_q, total_q, head_dim)
    and k, v (1, heads_kv, rows, head_dim) views of packed tensors, lse fp32 (1, heads_q, total_q) or None). In a
    run of run_heads heads, tile t is entry t // run_heads of the table, a head of the run each; Q, K, V come by TMA
    from the sequence's first rows (a tile's rows past its sequence read the next one's, never kept), O leaves
    from registers masked to the sequence's rows. No paged cache (`pages`), no key splits."""
    if pages is not None:
        raise ValueError("the Gluon forward reads no paged KV cache: the tl family does")
    base._check(q, k, v, out, lse)
    _, heads_q, total_q, head_dim = q.shape
    heads_kv = k.shape[1]
    batch = cu_seqlens_q.numel() - 1
    block_d, block_d2 = base.columns.column_tiles(knobs, head_dim)
    tile_m = knobs["block_m"] * knobs["consumers"]
    entries = triton.cdiv(total_q, tile_m) + batch  # bounds the (sequence, query tile) pairs before the lengths
    tiles = entries * heads_q
    descriptors = base._descriptor_maker(q, k, v, out, knobs["block_m"], knobs["block_n"], block_d, block_d2)
    grid = base.program_grid(knobs, tiles, q.device)
    counter = base._counter_maker(q, knobs["dynamic"])
    if seqlens_k is None:  # only the layouts count here: the kernel is specialised on them
        seqlens_k = torch.empty(batch, dtype=torch.int32, device=q.device)
    table = torch.empty(2, entries, dtype=torch.int32, device=q.device)
    # Under causal masking, runs of as many whole KV groups as the K and V of every packed row fit the dense
    # launcher's L2 share (at least one group); without it, every head of a table entry together.
    group, rows_k = heads_q // heads_kv, k.shape[2]
    run_heads = min(group * max(base.L2_BYTES_PER_RUN // (2 * (block_d + block_d2) * q.element_size()) // rows_k, 1),
                    heads_q) if causal else heads_q
    per_call = (*descriptors(q, k, v, out), q if lse is None else lse, counter())
    args = (*per_call, softmax_scale, heads_q, group, total_q, rows_k, entries, tiles, run_heads, cu_seqlens_q,
            starts_k, seqlens_k, table, out, out.stride(1), out.stride(2), head_dim)
    options = dict(BLOCK_D=block_d, **(dict(BLOCK_D2=block_d2) if block_d2 else {}), IS_CAUSAL=bool(causal),
                   RETURN_LSE=lse is not None, **base.launch_options(knobs))
    launch = compile(kernels.attn_fwd, grid, args, options, len(per_call), VARLEN_ARGS)

    device_table = tables.device_tiles(compile, cu_seqlens_q, seqlens_k, 1, tile_m, causal, entries)

    def forward(q, k, v, out, lse, cu_seqlens_q, starts_k, seqlens_k, block_table=None, host=None):
        if host is None:
            table = device_table(cu_seqlens_q, seqlens_k)
        else:
            seqlens_k, table = tables.to_device(
                (host[1], tables.host_tiles(*host, 1, tile_m, causal, entries)), cu_seqlens_q.device)
        launch(*descriptors(q, k, v, out), q if lse is None else lse, counter(), cu_seqlens_q, starts_k, seqlens_k,
               table, out)
    return forward


def varlen_backward_plan(kernels, knobs, q, k, v, out, lse, dout, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
                         softmax_scale, causal, dlse, compile):
    """`backward(q, k, v, out, lse, dout, dq, dk, dv, dlse, cu_seqlens_q, cu_seqlens_k, host)` over packed
    sequences, as the `tl` family's `varlen_backward_plan` (the same arguments and layouts: q, out, dout, dq (1,
    heads_q, total_q, head_dim) and k, v, dk, dv (1, heads_kv, total_k, head_dim) views of packed tensors; lse,
    dlse fp32 (1, heads_q, total_q)). The delta kernel runs as the dense one over the packed rows (one batch of
    total_q); program t of the main one runs entry t // (heads_kv x group_splits) of the table of (sequence, key
    block) pairs that tl's dK/dV programs run (the most query rows first), its heads as dense. Q, dO, K, V come
    by TMA from the sequences' first rows, lse and delta by plain loads; dK and dV leave from registers masked
    to the sequence (or, split groups, are added into fp32 sums), dQ is added into its fp32 buffer by TMA, rows
    past a sequence adding exact zeros. Writes dq, dk, dv."""
    base_bwd._check(q, k, v, out, dout, dq, dk, dv, lse, dlse)
    _, heads_q, total_q, head_dim = q.shape
    heads_kv, total_k = k.shape[1], k.shape[2]
    batch = cu_seqlens_q.numel() - 1
    block_d = max(16, triton.next_power_of_2(head_dim))  # (the delta kernel's, masked to head_dim)
    tile_d, tile_d2 = base.columns.column_tiles(knobs, head_dim)  # (the main kernel's column tiles)
    block_n = base_bwd._block_n(tile_d, knobs["warpgroups"], tile_d2)
    splits = knobs["group_splits"]
    entries = triton.cdiv(total_k, block_n) + batch  # bounds the (sequence, key block) pairs before the lengths
    rows = base_bwd._rows(q)  # (example tensors: each call allocates its own)
    dq_sum, = base_bwd._sums(dq)  # (zeroed by the delta kernel)
    dkv_sum = base_bwd._sums(dk, dv) if splits > 1 else (dk, dv)
    descriptors = base_bwd._descriptor_maker((q, k, v, dout, *dkv_sum, dq_sum), knobs["block_m"], tile_d,
                                             knobs["warpgroups"], tile_d2)  # (lse2 and delta have none)
    delta_launch = compile(
        kernels._attn_bwd_delta, (triton.cdiv(total_q, base_bwd.DELTA_ROWS), heads_q),
        (out, dout, lse, lse if dlse is None else dlse, rows, rows, dq_sum, *out.stride()[:3], *dout.stride()[:3],
         rows.stride(0), heads_q, total_q),
        dict(HEAD_DIM=head_dim, BLOCK_D=block_d, HAS_DLSE=dlse is not None, ROWS=base_bwd.DELTA_ROWS), 7)
    table = torch.empty(2, entries, dtype=torch.int32, device=q.device)
    main_launch = compile(
        kernels.attn_bwd, (entries * heads_kv * splits,),
        (*descriptors(q, k, v, dout, *dkv_sum, dq_sum), rows, rows, softmax_scale, heads_q, heads_kv, total_q,
         total_k, cu_seqlens_q, cu_seqlens_k, table, dk, dv, rows.stride(0), *dk.stride()[1:3], *dv.stride()[1:3],
         head_dim),
        dict(BLOCK_D=tile_d, IS_CAUSAL=bool(causal), num_warps=4), 16 if tile_d2 else 9, BWD_VARLEN_ARGS)

    device_table = tables.device_tiles(compile, cu_seqlens_k, cu_seqlens_q, 1, block_n, False, entries,
                                       keys_are_offsets=True)

    def backward(q, k, v, out, lse, dout, dq, dk, dv, dlse, cu_seqlens_q, cu_seqlens_k, host=None):
        lse2, delta = base_bwd._rows(q), base_bwd._rows(q)
        dq_sum, = base_bwd._sums(dq)
        delta_launch(out, dout, lse, lse if dlse is None else dlse, lse2, delta, dq_sum)
        if host is None:
            table = device_table(cu_seqlens_k, cu_seqlens_q)
        else:
            table, = tables.to_device([tables.host_tiles(host[1], host[0], 1, block_n, False, entries)],
                                      cu_seqlens_q.device)
        dkv = (dk, dv) if splits == 1 else [t.zero_() for t in base_bwd._sums(dk, dv)]
        main_launch(*descriptors(q, k, v, dout, *dkv, dq_sum), lse2, delta, cu_seqlens_q, cu_seqlens_k, table, dk, dv)
        if splits > 1:
            dk.copy_(dkv[0])
            dv.copy_(dkv[1])
        dq.copy_(dq_sum)
    return backward
