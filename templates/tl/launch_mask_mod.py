"""Launchers of the `tl` family's kernels for problems with a mask_mod (MASK_MOD: kernels rendered with the user's
mod, autoflash/mask_mod.py): the fixed variants' plans (`fixed`, templates/common/launch_window_softcap_alibi.py), each
call's variant tensors followed by the mask's block tables. Needs only torch and triton.

A block table lists, per (batch entry, head, block of rows), the blocks of the other axis that the rows' tiles
see: the partial ones (some pairs attend: masked by the mod, the bounds and causal masking), then the full ones
(every pair of the whole tile attends: no mask); the kernels skip the rest. The kernel `_mask_mod_states`
evaluates the mod once per tile into a dense table of states {0 skip, 1 partial, 2 full}, (batch, heads, query
blocks, key blocks) with a batch or head dimension of 1 where the mod reads neither b nor h; torch turns each row
into one int32 row [partial count, partial blocks..., full count, full blocks...] (FlexAttention's kv_num_blocks,
kv_indices, full_kv_num_blocks, full_kv_indices), 8 bytes a tile. The forward and the dQ pass list key blocks per
query block; the dK/dV programs list query blocks per key block (the table transposed). A plan keeps the tables
of the last captures it saw, holding the tensors: a new tensor, or one changed in place (its version), gets new
tables, computed on the device before the call's kernels; a call captured into a CUDA graph computes them in the
graph, at every replay.

`variant["mask"]`: the rendered mod's dict(per_batch, per_head, captures); its captures are the last `captures`
of the variant tensors.
"""

import torch
import triton

base = None  # the module of templates/tl/launch.py, set by the loader

# A table's tensor parameter -> its stride parameters (batch entry, head, row).
_STRIDES = {"Mask_rows": ("stride_rows_b", "stride_rows_h", "stride_rows_m"),
            "Mask_cols": ("stride_cols_b", "stride_cols_h", "stride_cols_n")}


def forward_plan(kernels, knobs, q, k, v, out, lse, softmax_scale, causal, compile, variant, fixed, tile_m=None):
    """`forward(q, k, v, out, lse, *variant tensors)`: the fixed variants' forward plan with the mask's table, a row
    per tile_m query rows (block_m unless given: the Gluon forward's tile is its consumers' rows together)."""
    tables = _Tables(kernels, variant, q, k, causal, [("Mask_rows", tile_m or knobs["block_m"], knobs["block_n"])],
                     compile)
    plan = fixed.forward_plan(kernels, knobs, q, k, v, out, lse, softmax_scale, causal, compile, tables.variant)

    def forward(q, k, v, out, lse, *tensors):
        plan(q, k, v, out, lse, *tensors, *tables.of(tensors))
    return forward


def backward_plan(kernels, knobs, q, k, v, out, lse, dout, dq, dk, dv, softmax_scale, causal, dlse, compile, variant,
                  fixed, layouts=None):
    """`backward(q, k, v, out, lse, dout, dq, dk, dv, dlse, *variant tensors)`: the fixed variants' backward plan
    with the mask's tables: the dK/dV programs' (block_m query rows by block_n keys, by key block) and the dQ
    pass's (block_n query rows by block_m keys; none where dQ is added atomically); or those of `layouts` (the
    Gluon backward's: its programs' key blocks alone)."""
    if layouts is None:
        block_m, block_n = knobs["block_m"], knobs["block_n"]
        layouts = [("Mask_cols", block_m, block_n)] + ([("Mask_rows", block_n, block_m)] if knobs["dq"] != "atomic"
                                                       else [])
    tables = _Tables(kernels, variant, q, k, causal, layouts, compile)
    plan = fixed.backward_plan(kernels, knobs, q, k, v, out, lse, dout, dq, dk, dv, softmax_scale, causal, dlse,
                               compile, tables.variant)

    def backward(q, k, v, out, lse, dout, dq, dk, dv, dlse, *tensors):
        plan(q, k, v, out, lse, dout, dq, dk, dv, dlse, *tensors, *tables.of(tensors))
    return backward


class _Tables:
    """The block tables of one plan (`layouts`: (tensor parameter, block_m query rows, block_n keys) each, by key
    block for Mask_cols) for a call's captures; `variant`: the plan's variant, the tables and their strides added.
    `_mask_mod_states` is compiled once per layout (`compile`, as launch.py's kernels)."""

    def __init__(self, kernels, variant, q, k, causal, layouts, compile):
        mask = variant["mask"]
        self.layouts, self.count, self.device = layouts, mask["captures"], q.device
        batch, heads = q.shape[0] if mask["per_batch"] else 1, q.shape[1] if mask["per_head"] else 1
        self.seen, self.tables = None, None
        tensors = variant["tensors"]
        captures = self._captures(tuple(tensors.values()))
        self.states = []  # per layout: (its shape, the compiled kernel that fills it)
        for _, block_m, block_n in layouts:
            shape = (batch, heads, triton.cdiv(q.shape[2], block_m), triton.cdiv(k.shape[2], block_n))
            states = torch.empty(shape, dtype=torch.int8, device=q.device)
            self.states.append((shape, compile(
                kernels._mask_mod_states, (shape[2], shape[3], batch * heads),
                (states, *captures, q.shape[2], k.shape[2], heads, *(t.numel() for t in captures)),
                dict(IS_CAUSAL=causal, BLOCK_M=block_m, BLOCK_N=block_n, ROWS=block_m & -block_m),
                1 + self.count)))
        tables = self.of(tuple(tensors.values()))
        args = dict(variant["args"])
        for (name, _, _), table in zip(layouts, tables):
            stride_b, stride_h, stride_row = table.stride()[:3]
            args.update(zip(_STRIDES[name], (stride_b * (batch > 1), stride_h * (heads > 1), stride_row)))
        args.update((f"capture_len{i}", t.numel()) for i, t in enumerate(self._captures(tuple(tensors.values()))))
        self.variant = dict(variant, tensors={**tensors, **{name: t for (name, _, _), t in zip(layouts, tables)}},
                            args=args)

    def _captures(self, tensors):
        return tensors[len(tensors) - self.count:]

    def of(self, tensors) -> list:
        """The tables for the captures among a call's variant tensors (those of the last call, where they are the
        same tensors, unchanged). A call captured into a CUDA graph makes them in the graph and keeps them not: a
        replay runs no Python to see the captures change, so each replay makes them from what they hold then."""
        captures = self._captures(tensors)
        if _in_capture(captures):
            return self._made(captures)
        seen = [(t, t._version) for t in captures]
        if self.seen is None or len(seen) != len(self.seen) or \
                any(t is not s or version != s_version for (t, version), (s, s_version) in zip(seen, self.seen)):
            self.tables, self.seen = self._made(captures), seen
        return self.tables

    def _made(self, captures) -> list:
        return [_lists(self.evaluated(i, captures), name == "Mask_cols") for i, (name, _, _) in enumerate(self.layouts)]

    def evaluated(self, layout: int, captures):
        """The states of the tiles of layouts[layout] for these captures."""
        shape, launch = self.states[layout]
        states = torch.empty(shape, dtype=torch.int8, device=self.device)
        launch(states, *captures)
        return states


def _in_capture(captures) -> bool:
    """Whether this call is being captured into a CUDA graph (a mod without captures has tables for good)."""
    return bool(captures) and captures[0].is_cuda and torch.cuda.is_current_stream_capturing()


def _lists(states, by_key_block: bool):
    """The rows of the table of `states` (batch, heads, query blocks, key blocks), per key block where
    `by_key_block`: int32 (batch, heads, rows, 2 * (blocks + 1)), each row its partial blocks' count and indices
    (ascending), then its full blocks' (the indices padded with the others')."""
    if by_key_block:
        states = states.transpose(2, 3)
    parts = []
    for state in (1, 2):
        hit = states == state
        parts += [hit.sum(-1, keepdim=True, dtype=torch.int32),
                  torch.argsort((~hit).to(torch.int8), dim=-1, stable=True).to(torch.int32)]
    return torch.cat(parts, -1)
