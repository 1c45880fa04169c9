"""Packed variable-length attention against its dense baselines (issue 17's acceptance shape by default):

    python benchmarks/varlen.py [--sequences 16] [--lengths 128,8192] [--draw uniform|log] [--heads 32/8]
                                [--out results.jsonl] [--profile]

16 sequences of lengths uniform in [128, 8192] (issue 17's ~64k tokens; --draw log: log-uniform, ~24k tokens of
mostly short sequences, the harder case), d128, GQA 4:1, causal, bf16. Timed, forward and forward +
backward: autoflash.attention_varlen on the packed batch; plain SDPA (its default backends) on the batch padded to
the longest sequence (masked per sequence: only the useful rows count); autoflash.attention on a dense batch of
equal-length sequences holding the same total tokens, (batch, heads, seq, d) and as (batch, seq, heads, d)
views. TFLOP/s count the useful FLOPs of each (causal: the visible half), so all are comparable. --profile adds each
case's GPU time per kernel (torch.profiler, per call), to tell kernel time from the gaps between kernels."""

import argparse
import datetime
import sys

import torch
import triton

import autoflash
from autoflash.problem import Problem
from forced_knobs import changes_of, forced_knobs, label
from kvcache_decode import lengths_of
from profiling import kernel_times
from results_file import append_row


def uniform_lengths(batch, low, high, seed):
    """batch sequence lengths uniform over [low, high]."""
    return torch.randint(low, high + 1, (batch,), generator=torch.Generator().manual_seed(seed)).tolist()


def useful_flops(lengths, heads, head_dim, causal):
    return sum(Problem(1, heads, heads, n, n, head_dim, causal, "bfloat16").fwd_flops() for n in lengths)


def step(fn, backward):
    """fn, or fn and the backward of its output."""
    if not backward:
        return fn

    def both():
        out = fn()
        out.backward(torch.ones_like(out))
    return both


def timed(fn, backward):
    return triton.testing.do_bench(step(fn, backward), warmup=10, rep=100, grad_to_none=None)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--lengths", default="128,8192")
    parser.add_argument("--draw", choices=("uniform", "log"), default="uniform",
                        help="lengths uniform in the range (issue 17's), or log-uniform (more short sequences)")
    parser.add_argument("--heads", default="32/8")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--full", action="store_true", help="no causal mask")
    parser.add_argument("--knobs", default="[{}]",
                        help='knob changes to sweep (forward, or the backward\'s with "direction": "bwd"), JSON: '
                             '\'[{}, {"num_warps": 8}, {"family": "gluon", "default": true, "direction": "bwd"}]\'')
    parser.add_argument("--out")
    parser.add_argument("--profile", action="store_true", help="each case's kernels' GPU time per call too")
    args = parser.parse_args(argv)
    heads_q, heads_kv = map(int, args.heads.split("/"))
    low, high = (list(map(int, args.lengths.split(","))) * 2)[:2]
    lengths = (uniform_lengths if args.draw == "uniform" else lengths_of)(args.sequences, low, high, seed=1)
    causal, d, dtype = not args.full, args.head_dim, torch.bfloat16
    total = sum(lengths)
    gen = torch.Generator(device="cuda").manual_seed(0)

    def leaf(*shape):
        return torch.randn(*shape, device="cuda", dtype=dtype, generator=gen).requires_grad_()
    q, k, v = leaf(total, heads_q, d), leaf(total, heads_kv, d), leaf(total, heads_kv, d)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    longest = max(lengths)
    padded = [leaf(args.sequences, h, longest, d) for h in (heads_q, heads_kv, heads_kv)]
    keep = torch.arange(longest, device="cuda")[None, :] < torch.tensor(lengths, device="cuda")[:, None]
    mask = keep[:, None, None, :]  # (batch, 1, 1, keys): each sequence's own keys
    if causal:
        mask = mask & torch.ones(longest, longest, device="cuda", dtype=torch.bool).tril()
    dense_batch = max(1, total // longest)
    dense = [leaf(dense_batch, h, longest, d) for h in (heads_q, heads_kv, heads_kv)]
    # the same as (batch, seq, heads, d) views: rows heads x d apart, as the packed tensors' (NOTES 62: layout alone)
    strided = [leaf(dense_batch, longest, h, d).transpose(1, 2) for h in (heads_q, heads_kv, heads_kv)]
    flops = {"varlen": useful_flops(lengths, heads_q, d, causal), "sdpa padded": useful_flops(lengths, heads_q, d, causal),
             "dense autoflash": useful_flops([longest] * dense_batch, heads_q, d, causal)}
    flops["dense bshd"] = flops["dense autoflash"]  # (the same problem in another layout)
    cases = {
        "varlen": lambda: autoflash.attention_varlen(q, k, v, cu, cu, longest, longest, causal=causal),
        "sdpa padded": lambda: torch.nn.functional.scaled_dot_product_attention(*padded, attn_mask=mask,
                                                                                enable_gqa=heads_q != heads_kv),
        "dense autoflash": lambda: autoflash.attention(*dense, causal=causal),
        "dense bshd": lambda: autoflash.attention(*strided, causal=causal),
    }
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    print(f"lengths {sorted(lengths)} (total {total}); dense batch {dense_batch} x {longest}")
    runs = [(name, fn, change) for change in changes_of(args.knobs) for name, fn in cases.items()
            if name == "varlen" or not change]  # the baselines once
    for direction in ("fwd", "fwd+bwd"):
        for name, fn, change in runs:
            ran = {}  # the knobs dispatch ran, by direction (none for SDPA)
            with forced_knobs(change, ran):
                ms = timed(fn, direction != "fwd")
            work = flops[name] * (1 if direction == "fwd" else 3.5)
            line = dict(case=label(name, change), direction=direction, ms=ms, tflops=work / ms / 1e9, lengths=lengths,
                        draw=args.draw, heads=args.heads, head_dim=d, causal=causal, knobs=ran,
                        gpu=torch.cuda.get_device_name(), time=stamp)
            print(f"{direction:8s} {line['case']:16s} {ms:8.3f} ms  {line['tflops']:6.1f} TFLOP/s  {ran.get('fwd', '')}")
            if args.profile:
                with forced_knobs(change):
                    line["kernels_ms"] = kernel_times(step(fn, direction != "fwd"))
                print(f"{'':8s} kernels {sum(line['kernels_ms'].values()):.3f} ms: " + ", ".join(
                    f"{name[:60]} {t:.3f}" for name, t in list(line["kernels_ms"].items())[:6]))
            append_row(args.out, line)


if __name__ == "__main__":
    sys.exit(main())
