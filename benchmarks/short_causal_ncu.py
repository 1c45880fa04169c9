"""One short causal forward cell (NOTES 63: kernel time, not host time) run a few times for Nsight Compute:
the Gluon default (gluon), what dispatch runs (record: the shipped record or its neighbour's) or plain SDPA (sdpa),
so `ncu` can compare their stall reasons. The FA grid's fp16 cell (batch x seqlen 16k, 2048 / head_dim heads) by
default; or `batch heads_q heads_kv dtype` after the head dim (NOTES 109: b32 h32/8 s128 d128 bf16).

    ncu --kernel-name regex:'attn_fwd|fprop' --launch-skip 3 --launch-count 1 --section SpeedOfLight \
        --section WarpStateStats --section SchedulerStats python benchmarks/short_causal_ncu.py gluon 512 64
    ... python benchmarks/short_causal_ncu.py record 128 128 32 32 8 bfloat16
"""

import sys

import torch

import autoflash
from autoflash.reference import sdpa_attention
from forced_knobs import forced_knobs


def main(which, seqlen, head_dim, batch=None, heads_q=None, heads_kv=None, dtype="float16"):
    seqlen, head_dim = int(seqlen), int(head_dim)
    batch = int(batch or 16384 // seqlen)  # (the FA grid's cell unless given)
    heads_q = int(heads_q or 2048 // head_dim)
    heads_kv = int(heads_kv or heads_q)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(batch, heads, seqlen, head_dim, device="cuda", dtype=getattr(torch, dtype), generator=gen)
               for heads in (heads_q, heads_kv, heads_kv))
    change = {"family": "gluon", "default": True} if which == "gluon" else {}
    with forced_knobs(change):
        for _ in range(5):
            sdpa_attention(q, k, v, True) if which == "sdpa" else autoflash.attention(q, k, v, causal=True)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(*sys.argv[1:])
