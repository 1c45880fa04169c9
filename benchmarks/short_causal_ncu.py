"""One short causal forward cell (NOTES 63: kernel time, not host time) run a few times for Nsight Compute:
the Gluon default (gluon), the shipped record (record: `tl` at d64 512) or plain SDPA (sdpa), so `ncu` can compare their stall reasons.

    ncu --kernel-name regex:'attn_fwd|fprop' --launch-skip 3 --launch-count 1 --section SpeedOfLight \
        --section WarpStateStats --section SchedulerStats python benchmarks/short_causal_ncu.py gluon 512 64
"""

import sys

import torch

import autoflash
from autoflash.reference import sdpa_attention
from forced_knobs import forced_knobs


def main(which, seqlen, head_dim):
    seqlen, head_dim = int(seqlen), int(head_dim)
    batch, heads = 16384 // seqlen, 2048 // head_dim  # the FA grid's cell
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(batch, heads, seqlen, head_dim, device="cuda", dtype=torch.float16, generator=gen)
               for _ in range(3))
    change = {"family": "gluon", "default": True} if which == "gluon" else {}
    with forced_knobs(change):
        for _ in range(5):
            sdpa_attention(q, k, v, True) if which == "sdpa" else autoflash.attention(q, k, v, causal=True)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(*sys.argv[1:])
