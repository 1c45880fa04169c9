"""An L2 model of the Gluon forward's tile order, dense and packed (NOTES V5): the K/V block reads of every tile,
in the time order a persistent grid of 132 programs claiming tiles from the counter gives them (a tile takes
TILE_US + its key blocks x BLOCK_US), with each tile's Q (read at its start) and O (written at its end) streaming
through the same LRU of 32 KB lines (a K or V block, a consumer pair's Q or O tile); prints the DRAM bytes of K
and V (their misses) for L2 sizes 25/40/50 MB. No GPU, no triton: numpy and the `tl` family's tile table.

    python benchmarks/varlen_l2_model.py                      # 16 x 2048 (--lengths 2048,2048) and the defaults
"""
import collections
import heapq
import importlib.util
from pathlib import Path

import numpy as np

HQ, HKV, TM, BN, SMS = 32, 8, 128, 128, 132
G = HQ // HKV
BLOCK_US, TILE_US, EMPTY_US = 1.88, 0.5, 1.5
L2_BYTES_PER_RUN = 24 << 20
spec = importlib.util.spec_from_file_location(
    "tl_launch_varlen", Path(__file__).resolve().parents[1] / "templates/tl/launch_varlen.py")
tl_varlen = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tl_varlen)


def blocks(i, n):
    """(key blocks of query tile i of a causal sequence of n tokens): `_tile_blocks`' total."""
    return -(-min((i + 1) * TM, n) // BN)


def dense_order(n, batch):
    tiles_m = -(-n // TM)
    tiles = tiles_m * batch * HQ
    run_heads = min(batch * HQ, max(1, L2_BYTES_PER_RUN // (2 * n * 128 * 2 * HKV // HQ)))
    for t in range(tiles):
        first = t // (run_heads * tiles_m) * run_heads
        within = t % (run_heads * tiles_m)
        heads = min(run_heads, tiles // tiles_m - first)
        bh = first + within % heads
        yield bh // HQ, bh % HQ, tiles_m - 1 - within // heads


def varlen_order(lengths, run_heads):
    lengths = np.array(lengths)
    entries = -(-lengths.sum() // TM) + len(lengths)
    seq, index = tl_varlen.host_tiles(lengths, lengths, 1, TM, True, entries)
    for t in range(entries * HQ):
        first = t // (run_heads * entries) * run_heads
        within = t % (run_heads * entries)
        heads = min(run_heads, HQ - first)
        e = within // heads
        yield None if seq[e] < 0 else (int(seq[e]), first + within % heads, int(index[e]))


def simulate(order, lengths, cap_mb):
    free = [(0.0, p) for p in range(SMS)]
    reads = []
    for number, tile in enumerate(order):
        t0, p = heapq.heappop(free)
        if tile is None:
            heapq.heappush(free, (t0 + EMPTY_US, p))
            continue
        s, h, i = tile
        n = blocks(i, lengths[s])
        reads.append((t0, ("Q", number)))
        reads += [(t0 + TILE_US + j * BLOCK_US, (s, h // G, j, kv)) for j in range(n) for kv in "KV"]
        reads.append((t0 + TILE_US + n * BLOCK_US, ("O", number)))
        heapq.heappush(free, (t0 + TILE_US + n * BLOCK_US, p))
    reads.sort(key=lambda r: r[0])
    lru, cap, miss = collections.OrderedDict(), int(cap_mb * 1024 // 32), 0
    for _, key in reads:
        if key in lru:
            lru.move_to_end(key)
        else:
            miss += key[0] not in ("Q", "O")
            lru[key] = 1
            if len(lru) > cap:
                lru.popitem(last=False)
    return sum(key[0] not in ("Q", "O") for _, key in reads) // 2, miss


def runs(lengths):
    """`_varlen_runs` (branch varlen-fwd-fix1): query heads a run under causal masking."""
    groups = max(L2_BYTES_PER_RUN // (4 * 128) // sum(lengths), 1)
    return min(G * groups, HQ)


if __name__ == "__main__":
    cases = [("16 x 2048", [2048] * 16),
             ("defaults", [144, 408, 455, 667, 684, 793, 849, 879, 1134, 1367, 1822, 2188, 2717, 2949, 2989, 3563])]
    for name, lengths in cases:
        orders = [("packed, heads_q a run (main)", lambda: varlen_order(lengths, HQ)),
                  (f"packed, runs of {runs(lengths)} heads (fix1)", lambda: varlen_order(lengths, runs(lengths)))]
        if len(set(lengths)) == 1:
            orders.insert(0, ("dense, runs of heads", lambda: dense_order(lengths[0], len(lengths))))
        for label, order in orders:
            for cap in (25, 40, 50):
                n, miss = simulate(order(), lengths, cap)
                print(f"{name:10s} {label:32s} L2 {cap} MB: {n} K/V block reads, "
                      f"{miss * 32 / 1024:.0f} MB of K/V from DRAM")
