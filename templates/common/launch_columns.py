"""The column tiles a head dim spans, for every family's launchers and resource models (one rule: the `tl` and
`gluon` forwards split the head dim alike). Needs only triton."""

import triton


def column_tiles(knobs, head_dim):
    """Widths (BLOCK_D, BLOCK_D2) of the column tiles a row of q, k, v, out spans: one, the head dim padded to
    a power of two (BLOCK_D2 0: none); with head_dim_split, the largest power of two below head_dim and the
    rest padded to a power of two (at least 16, the least tl.dot and wgmma take)."""
    if not knobs.get("head_dim_split"):
        return max(16, triton.next_power_of_2(head_dim)), 0
    first = triton.next_power_of_2(head_dim) // 2
    return first, max(16, triton.next_power_of_2(head_dim - first))
