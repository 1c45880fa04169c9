"""NOTES G9 on the GPU: where tile_overlap's wrong outputs are (benchmarks/g9_hyp.sh runs it after the hypotheses).

For each case the Gluon forward (this tree's template; violations() is not asked, so main's refused tile_overlap
cases run) is launched twice on the same inputs: whether the two outputs are bitwise equal (a race, or not), the
relative error of out and lse, and per block of 64 rows (a tile's consumer): how many are wrong, by the tile's
position in its program (0: the program's first, with no cross-tile step before it; static grids only), by query
tile, by consumer, by key blocks of the tile and of the one before it; and which simple fault each wrong block of
rows matches (key block 0 dropped, counted twice or not causally masked; the tile's last block dropped; the
previous tile's Q; the previous tile's output; zeros). One JSON line per case, then a readable summary.

    python benchmarks/g9_diag.py [--cases NAME,...] [--out FILE]
"""

import argparse
import json
import math
import sys
import time

import torch

from autoflash import codegen
from autoflash.families.gluon.knobs import FwdKnobs

TO = dict(q_buffers=2, tile_overlap=True)
C3 = dict(consumers=3, consumer_regs=160, block_n=64)
# name: (knobs, head_dim, causal, seqlen_q, seqlen_k); batch x heads as test_tile_overlap's (4 x 16 to 1000 queries,
# else 2 x 8), GQA 4:1, bf16 causal, fp16 full
CASES = {
    "to_causal_static_d128": (dict(TO), 128, True, 1000, 1000),
    "to_full_dynamic_d128": (dict(TO, dynamic=True), 128, False, 1000, 1000),
    "to_c3_causal_123": (dict(TO, **C3, dynamic=True), 64, True, 123, 123),  # (one tile a program; failed once)
    "ctrl_c3_causal_123": (dict(q_buffers=2, **C3, dynamic=True), 64, True, 123, 123),  # (never run on a GPU)
    "to_full_static_d128": (dict(TO), 128, False, 1000, 1000),  # (passed on the H100: the diagnosis' own check)
    "to_causal_dynamic_d64": (dict(TO, dynamic=True), 64, True, 1000, 1000),
    "to_c3_full_1000": (dict(TO, **C3, dynamic=True), 64, False, 1000, 1000),
    "ctrl_c3_causal_1000": (dict(q_buffers=2, **C3, dynamic=True), 64, True, 1000, 1000),
}
WRONG = {torch.float16: 4e-3, torch.bfloat16: 3e-2}  # per block of rows, relative


def make_qkv(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, dtype, seed):
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def one(heads, seqlen):
        return torch.randn((batch, heads, seqlen, head_dim), generator=gen, dtype=torch.float32).to(dtype).cuda()
    return one(heads_q, seqlen_q), one(heads_kv, seqlen_k), one(heads_kv, seqlen_k)


def mask(seqlen_q, seqlen_k, causal, device):
    rows = torch.arange(seqlen_q, device=device)[:, None]
    keys = torch.arange(seqlen_k, device=device)[None, :]
    return keys <= rows + seqlen_k - seqlen_q if causal else torch.ones(seqlen_q, seqlen_k, dtype=torch.bool,
                                                                        device=device)


def attend(q, k, v, visible, scale, weight=None):
    """fp64 attention of rows q (n, d) over k, v (s, d) where `visible` (n, s); weight (n, s) multiplies p."""
    s = (q.double() @ k.double().T) * scale
    s = s.masked_fill(~visible, -math.inf)
    m = s.max(-1, keepdim=True).values.clamp(min=-1e300)
    p = torch.exp(s - m)
    if weight is not None:
        p = p * weight
    l = p.sum(-1, keepdim=True)
    out = (p @ v.double()) / l.clamp(min=1e-300)
    return out, (m + torch.log(l)).squeeze(-1)


def launcher_facts(knobs, batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, element_size, causal):
    """The launcher's tile order (templates/gluon/launch.py, attn_fwd's _tile): tile -> (b*h, query tile)."""
    tile_m = knobs.block_m * knobs.consumers
    tiles_m = -(-seqlen_q // tile_m)
    tiles = tiles_m * batch * heads_q
    programs = min(tiles, torch.cuda.get_device_properties(0).multi_processor_count)
    kv_bytes = 2 * seqlen_k * head_dim * element_size * heads_kv // heads_q
    run_heads = min(batch * heads_q, max(1, (24 << 20) // kv_bytes)) if causal else 1

    def tile(t):
        first = t // (run_heads * tiles_m) * run_heads
        within = t % (run_heads * tiles_m)
        heads = min(run_heads, tiles // tiles_m - first)
        return first + within % heads, tiles_m - 1 - within // heads
    return tile_m, tiles, programs, tile


def key_blocks(start, end, seqlen_q, seqlen_k, block_n, causal):
    n_end = min(max(end + seqlen_k - seqlen_q, 0), seqlen_k) if causal else seqlen_k
    return -(-n_end // block_n)


def run_case(name, knobs_dict, head_dim, causal, seqlen_q, seqlen_k):
    knobs = FwdKnobs(**knobs_dict)
    batch, heads = (4, 16) if seqlen_q <= 1000 else (2, 8)
    heads_kv = heads // 4
    dtype = torch.bfloat16 if causal else torch.float16
    q, k, v = make_qkv(batch, heads, heads_kv, seqlen_q, seqlen_k, head_dim, dtype, seqlen_q)
    scale = head_dim ** -0.5
    t0 = time.time()
    outs = []
    forward = None
    for _ in range(2):
        out = torch.full_like(q, float("nan"))
        lse = torch.full(q.shape[:3], float("nan"), dtype=torch.float32, device=q.device)
        if forward is None:
            forward = codegen.load(knobs).forward_plan(q, k, v, out, lse, scale, causal)
        forward(q, k, v, out, lse)
        torch.cuda.synchronize()
        outs.append((out, lse))
    (out, lse), (out2, lse2) = outs
    row = dict(case=name, knobs=knobs_dict, head_dim=head_dim, causal=causal, seqlen=[seqlen_q, seqlen_k],
               seconds=round(time.time() - t0, 1), nan=bool(torch.isnan(out).any()),
               same_twice=bool(torch.equal(out, out2) and torch.equal(torch.nan_to_num(lse), torch.nan_to_num(lse2))))
    tile_m, tiles, programs, tile = launcher_facts(knobs, batch, heads, heads_kv, seqlen_q, seqlen_k, head_dim,
                                                   q.element_size(), causal)
    static = not knobs.dynamic
    visible = mask(seqlen_q, seqlen_k, causal, q.device)
    bn = knobs.block_n
    num = den = lnum = lden = 0.0
    ref_out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    ref_lse = torch.empty(q.shape[:3], dtype=torch.float64, device=q.device)
    for b in range(batch):
        for h in range(heads):
            o, s = attend(q[b, h], k[b, h // 4], v[b, h // 4], visible, scale)
            ref_out[b, h], ref_lse[b, h] = o, s
    err = ((out.double() - ref_out).norm() / ref_out.norm()).item()
    finite = torch.isfinite(ref_lse)
    lse_err = ((lse.double() - ref_lse)[finite].abs().max()).item() if finite.any() else 0.0
    row.update(rel_error=round(err, 4), lse_max_abs_error=round(lse_err, 4))
    # per block of 64 rows: wrong or not, and which fault it matches
    counts = {}
    matches = {}
    wrong_rows = []
    previous = {t: (t - programs if t >= programs else None) for t in range(tiles)} if static else {}
    for t in range(tiles):
        bh, m = tile(t)
        b, h = divmod(bh, heads)
        start = m * tile_m
        blocks = key_blocks(start, start + tile_m, seqlen_q, seqlen_k, bn, causal)
        position = (t // programs) if static else (0 if t < programs else -1)
        prev = previous.get(t)
        prev_blocks = None
        if prev is not None:
            pbh, pm = tile(prev)
            prev_blocks = key_blocks(pm * tile_m, pm * tile_m + tile_m, seqlen_q, seqlen_k, bn, causal)
        for cid in range(knobs.consumers):
            r0, r1 = start + cid * 64, min(start + cid * 64 + 64, seqlen_q)
            if r0 >= r1:
                continue
            ref = ref_out[b, h, r0:r1]
            got = out[b, h, r0:r1].double()
            e = ((got - ref).norm() / ref.norm().clamp(min=1e-30)).item()
            bad = e > WRONG[dtype]
            for name_, value in (("position", position), ("query_tile", m), ("consumer", cid), ("blocks", blocks),
                                 ("prev_blocks", prev_blocks)):
                c = counts.setdefault(name_, {}).setdefault(str(value), [0, 0])
                c[0] += bad
                c[1] += 1
            if not bad:
                continue
            lse_bad = bool(((lse[b, h, r0:r1].double() - ref_lse[b, h, r0:r1]).abs() > 0.05).any())
            if len(wrong_rows) < 12:
                wrong_rows.append(dict(tile=t, bh=bh, query_tile=m, consumer=cid, blocks=blocks,
                                       prev_tile=prev, prev_blocks=prev_blocks, error=round(e, 3), lse_wrong=lse_bad))
            # candidate faults
            vis = visible[r0:r1]
            qq, kk, vv = q[b, h, r0:r1], k[b, h // 4], v[b, h // 4]
            keys = torch.arange(seqlen_k, device=q.device)[None, :]
            cands = {}
            cands["block0_dropped"] = attend(qq, kk, vv, vis & (keys >= bn), scale)[0]
            w = torch.where(keys < bn, 2.0, 1.0).double().expand(r1 - r0, -1)
            cands["block0_twice"] = attend(qq, kk, vv, vis, scale, w)[0]
            cands["block0_unmasked"] = attend(qq, kk, vv, vis | ((keys < bn) & (keys < seqlen_k)), scale)[0]
            cands["last_dropped"] = attend(qq, kk, vv, vis & (keys < (blocks - 1) * bn), scale)[0]
            cands["zero"] = torch.zeros_like(ref)
            if prev is not None:
                pbh, pm = tile(prev)
                pb, ph = divmod(pbh, heads)
                pr0 = pm * tile_m + cid * 64
                pr1 = min(pr0 + (r1 - r0), seqlen_q)
                if pr1 - pr0 == r1 - r0:
                    cands["q_prev_tile"] = attend(q[pb, ph, pr0:pr1], kk, vv, vis, scale)[0]
                    cands["out_prev_tile"] = ref_out[pb, ph, pr0:pr1]
            best = min(cands, key=lambda c: (got - cands[c]).norm().item())
            fit = ((got - cands[best]).norm() / ref.norm().clamp(min=1e-30)).item()
            label = best if fit < 0.5 * e else "none"
            matches[label] = matches.get(label, 0) + 1
            matches.setdefault("lse_wrong", 0)
            matches["lse_wrong"] += lse_bad
    row.update(tiles=tiles, programs=programs, wrong_by=counts, fault_matches=matches, examples=wrong_rows)
    return row


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    sink = open(args.out, "a") if args.out else None
    for name in args.cases.split(","):
        try:
            row = run_case(name, *CASES[name])
        except Exception as e:  # (a case that cannot compile or crashes: say so, go on)
            row = dict(case=name, error=f"{type(e).__name__}: {e}"[:500])
        line = json.dumps(row)
        if sink:
            sink.write(line + "\n")
            sink.flush()
        if "error" in row:
            print(f"{name}: ERROR {row['error']}", flush=True)
            continue
        wrong = {k_: {v_: c for v_, c in d.items() if c[0]} for k_, d in row["wrong_by"].items()}
        print(f"{name}: rel_error {row['rel_error']} lse_max_abs {row['lse_max_abs_error']} nan {row['nan']} "
              f"same_twice {row['same_twice']} ({row['seconds']} s)", flush=True)
        total_bad = sum(c[0] for c in row["wrong_by"].get("consumer", {}).values())
        total = sum(c[1] for c in row["wrong_by"].get("consumer", {}).values())
        print(f"    wrong blocks of rows {total_bad}/{total}; by position {wrong.get('position')}; by consumer "
              f"{wrong.get('consumer')}; by blocks {wrong.get('blocks')}; by prev_blocks {wrong.get('prev_blocks')}; "
              f"by query tile {wrong.get('query_tile')}", flush=True)
        print(f"    fault matches {row['fault_matches']}; e.g. {row['examples'][:3]}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
