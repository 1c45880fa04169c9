"""Decode read bandwidth over a KV cache: autoflash.attention_with_kvcache on a paged cache (page sizes 16 and
256) and a dense one, beside autoflash.attention on the same keys as a dense (batch, heads, seqlen, dim) batch and
SDPA (flash-attn-free baselines): on the dense (batch, heads, seqlen, dim) views where the lengths are equal,
else one call per sequence on its keys.

    python benchmarks/kvcache_decode.py [--batch 32] [--heads 64/8] [--lengths 1024,32768] [--graph] [--profile]
                                        [--out F]

--graph times calls replayed from a CUDA graph of several (as serving engines run decode steps; `autoflash bench
--graph`'s timing): the GPU's time alone, without the Python that launches each; without it, each call as a user's
code makes it (one set of inputs: a decode's K and V are far larger than L2). --profile adds each case's GPU time
per kernel (the key splits' kernel and their combine apart), of graph replays with --graph, else of plain calls.

Bandwidth counts the K and V bytes each call must read (every sequence's cache_seqlens keys): sum(lengths) x
heads_kv x head_dim x 2 x bytes."""

import argparse
import datetime
import sys

import torch
import triton

import autoflash
from autoflash.reference import sdpa_attention
from autoflash.tune.timing import captured, median_ms
from forced_knobs import changes_of, forced_knobs, label
from profiling import kernel_times
from results_file import append_row


def lengths_of(batch, low, high, seed):
    """batch cache lengths spread log-uniformly over [low, high]."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.exp(torch.empty(batch).uniform_(0, 1, generator=gen) * (torch.log(torch.tensor(high / low))))
            * low).long().clamp(low, high).tolist()


def paged_cache(k_dense, v_dense, lengths, page_size, seed):
    """The dense caches on pages in random order, and the block table."""
    batch, capacity = k_dense.shape[:2]
    per_sequence = triton.cdiv(capacity, page_size)
    order = torch.randperm(batch * per_sequence, generator=torch.Generator().manual_seed(seed)).to(k_dense.device)
    caches = []
    for dense in (k_dense, v_dense):
        pages = torch.empty(batch * per_sequence, page_size, *dense.shape[2:], dtype=dense.dtype, device=dense.device)
        padded = torch.nn.functional.pad(dense, (0, 0, 0, 0, 0, per_sequence * page_size - capacity))
        pages[order] = padded.reshape(batch * per_sequence, page_size, *dense.shape[2:])
        caches.append(pages)
    return (*caches, order.view(batch, per_sequence).to(torch.int32))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--heads", default="64/8", help="query heads / KV heads")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--lengths", default="1024,32768", help="cache lengths: low,high (log-uniform) or one")
    parser.add_argument("--page-sizes", default="16,256")
    parser.add_argument("--knobs", default="[{}]",
                        help='forward knob changes to sweep, JSON: \'[{}, {"kv_splits": 8}]\'')
    parser.add_argument("--graph", action="store_true",
                        help="time calls replayed from CUDA graphs of several (GPU time only)")
    parser.add_argument("--profile", action="store_true", help="each case's kernels' GPU time per call too")
    parser.add_argument("--out", help="append a JSON line per measurement to this file")
    args = parser.parse_args(argv)
    heads_q, heads_kv = map(int, args.heads.split("/"))
    low, high = (list(map(int, args.lengths.split(","))) * 2)[:2]
    lengths = lengths_of(args.batch, low, high, seed=0)
    dtype, device, d = torch.bfloat16, "cuda", args.head_dim
    gen = torch.Generator(device=device).manual_seed(0)
    k_dense, v_dense = (torch.randn(args.batch, max(lengths), heads_kv, d, device=device, dtype=dtype, generator=gen)
                        for _ in range(2))
    q = torch.randn(args.batch, 1, heads_q, d, device=device, dtype=dtype, generator=gen)
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32, device=device)
    kv_bytes = sum(lengths) * heads_kv * d * 2 * k_dense.element_size()
    cases = {"kvcache dense": lambda: autoflash.attention_with_kvcache(q, k_dense, v_dense, cache_seqlens=cache_seqlens)}
    for page_size in map(int, args.page_sizes.split(",")):
        k_pages, v_pages, table = paged_cache(k_dense, v_dense, lengths, page_size, seed=page_size)
        cases[f"kvcache paged {page_size}"] = (lambda k_pages=k_pages, v_pages=v_pages, table=table:
                                               autoflash.attention_with_kvcache(q, k_pages, v_pages,
                                                                                cache_seqlens=cache_seqlens,
                                                                                block_table=table))
    if low == high:  # equal lengths: the dense entry points on the same keys as (batch, heads, seqlen, dim) views
        dense = (q.transpose(1, 2), k_dense.transpose(1, 2), v_dense.transpose(1, 2))
        cases["attention dense"] = lambda: autoflash.attention(*dense)
        cases["sdpa dense"] = lambda: sdpa_attention(*dense)
    else:  # SDPA on the cache gathered to dense tensors, one sequence at a time (its own length)
        cases["sdpa per sequence"] = lambda: [sdpa_attention(q[b:b + 1].transpose(1, 2), k_dense[b:b + 1, :n].transpose(1, 2),
                                                             v_dense[b:b + 1, :n].transpose(1, 2))
                                              for b, n in enumerate(lengths)]
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    runs = [(name, fn, change) for change in changes_of(args.knobs) for name, fn in cases.items()
            if name.startswith("kvcache") or not change]  # the baselines once
    for name, fn, change in runs:
        with forced_knobs(change):
            ms = median_ms(lambda _: fn(), 1, q.device, warmup_ms=50, rep_ms=300, graph=args.graph)
        name = label(name, change)
        line = dict(case=name, batch=args.batch, heads=args.heads, head_dim=d, lengths=[low, high],
                    kv_bytes=kv_bytes, ms=ms, tb_per_s=kv_bytes / ms / 1e9, graph=args.graph,
                    gpu=torch.cuda.get_device_name(), time=stamp)
        print(f"{name:22s} {ms * 1e3:9.1f} us  {line['tb_per_s']:.2f} TB/s")
        if args.profile:  # (with --graph, of graph replays back to back: the load the timing saw)
            with forced_knobs(change):
                line["kernels_ms"] = kernel_times(captured(lambda _: fn(), 1, 1).replay if args.graph else fn)
            print(f"{'':22s} kernels {sum(line['kernels_ms'].values()) * 1e3:.1f} us: " + ", ".join(
                f"{kernel[:50]} {t * 1e3:.1f}" for kernel, t in list(line["kernels_ms"].items())[:4]))
        append_row(args.out, line)


if __name__ == "__main__":
    sys.exit(main())
