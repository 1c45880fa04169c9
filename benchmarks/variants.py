"""Issue 16's variants beside plain attention and FlexAttention, one GPU: forward and backward times of
autoflash.attention (its database's kernel for the problem, else the heuristic default), of FlexAttention
(torch.compile'd, the same variant as score_mod / block mask) and, for the plain cases, of plain SDPA (no backend
forced), all in one run; TFLOP/s count only the pairs that attend (`Problem.flops`; the mask_mod cases count the
pairs their mask keeps, from the mask itself). A line of JSON per case. The mask_mod cases ("documents": 8
documents of equal length, "prefix-lm": a prefix of 1/8 of the tokens visible to all, causal after it) run one mod
in both: autoflash.MaskMod and FlexAttention's mask_mod with its create_block_mask (block mask time not counted,
nor autoflash's block table, built at the first call). The score_mod case ("causal score_mod softcap": the
softcap of 50 written as a score_mod) runs one function in both: autoflash.ScoreMod and FlexAttention's score_mod,
beside "causal softcap", autoflash's fixed variant.

    python benchmarks/variants.py --seqlen 32768 --heads 32/8 --head-dim 128 --out variants.jsonl
"""

import argparse
import functools
import json
import shlex

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from triton.testing import do_bench

import autoflash
from autoflash.problem import BWD_FLOP_RATIO, Problem
from autoflash.tune.trial import TUNING_SOFTCAP, variant_kwargs
from forced_knobs import changes_of, forced_knobs, label
from results_file import append_row

CASES = {  # name -> (causal, the problem's variant fields: Problem.with_variants)
    "causal": (True, dict()),
    "causal window 4096": (True, dict(window_size=(4096, -1))),
    "causal softcap": (True, dict(softcap=True)),
    "causal alibi": (True, dict(alibi=True)),
    "full": (False, dict()),
    "full softcap": (False, dict(softcap=True)),
    "documents": (False, dict(mask_mod="documents")),
    "causal documents": (True, dict(mask_mod="documents")),
    "prefix-lm": (False, dict(mask_mod="prefix-lm")),
    "causal score_mod softcap": (True, dict(score_mod="softcap")),
}


def same_document(b, h, q_idx, kv_idx, document_id):
    return document_id[q_idx] == document_id[kv_idx]


def prefix_lm(b, h, q_idx, kv_idx, prefix):
    return (kv_idx < prefix[0]) | (kv_idx <= q_idx)


def softcap(score, b, h, q_idx, kv_idx):
    return 50.0 * torch.tanh(score / 50.0)  # (TUNING_SOFTCAP, the fixed softcap cases' value)


def mask_mods(seqlen: int, device, documents: int = 8) -> dict:
    """The cases' mods: `documents` documents of seqlen / documents tokens; a prefix of seqlen / 8 tokens."""
    document_id = torch.arange(seqlen, device=device, dtype=torch.int32) // -(-seqlen // documents)
    prefix = torch.tensor([seqlen // 8], device=device, dtype=torch.int32)
    return {"documents": autoflash.MaskMod(same_document, document_id),
            "prefix-lm": autoflash.MaskMod(prefix_lm, prefix)}


def flex_mask_call(mod, causal: bool, problem: Problem, device):
    """FlexAttention with `mod` (an autoflash.MaskMod: the same function and tensors) and causal masking."""
    def mask_mod(b, h, i, j):
        seen = mod.fn(b, h, i, j, *mod.captures)
        return seen & (j <= i) if causal else seen
    block_mask = create_block_mask(mask_mod, None, None, problem.seqlen_q, problem.seqlen_k, device=device)
    return lambda q, k, v: _flex(q, k, v, block_mask=block_mask, enable_gqa=problem.heads_q != problem.heads_kv)

def _flex_score_call(score_mod, causal: bool, problem: Problem, device):
    """FlexAttention with `score_mod` (the function autoflash.ScoreMod renders) and causal masking."""
    block_mask = create_block_mask(lambda b, h, i, j: j <= i, None, None, problem.seqlen_q, problem.seqlen_k,
                                   device=device) if causal else None
    return lambda q, k, v: _flex(q, k, v, score_mod=score_mod, block_mask=block_mask,
                                 enable_gqa=problem.heads_q != problem.heads_kv)


torch._dynamo.config.recompile_limit = 64  # one compile per case and grad mode: past the default 8, dynamo would
_flex = torch.compile(flex_attention, dynamic=False)  # fall back to eager flex_attention, which holds all scores


def flex_call(problem: Problem, kwargs: dict, device):
    """FlexAttention computing `problem`'s attention: (q, k, v) -> out."""
    lowest, highest = problem.bounds()  # of j - (i + offset): the keys a query sees
    offset = problem.seqlen_k - problem.seqlen_q  # bottom-right aligned, as flash-attn and autoflash

    def mask_mod(b, h, i, j):
        seen = j >= 0
        if lowest is not None:
            seen = seen & (j - i - offset >= lowest)
        if highest is not None:
            seen = seen & (j - i - offset <= highest)
        return seen

    slopes = kwargs["alibi_slopes"]

    def score_mod(score, b, h, i, j):
        if problem.softcap:
            score = TUNING_SOFTCAP * torch.tanh(score / TUNING_SOFTCAP)
        if slopes is not None:
            score = score - slopes[h] * (i + offset - j).abs()
        return score

    masked = lowest is not None or highest is not None
    block_mask = create_block_mask(mask_mod, None, None, problem.seqlen_q, problem.seqlen_k, device=device) \
        if masked else None
    plain = not (problem.softcap or slopes is not None)
    return lambda q, k, v: _flex(q, k, v, score_mod=None if plain else score_mod, block_mask=block_mask,
                                 enable_gqa=problem.heads_q != problem.heads_kv)


def timed(fn, q, k, v, dout):
    """(forward ms, backward ms) of fn(q, k, v)."""
    fwd_ms = do_bench(lambda: fn(q, k, v))
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    both_ms = do_bench(lambda: fn(qg, kg, vg).backward(dout), grad_to_none=[qg, kg, vg])
    return fwd_ms, both_ms - fwd_ms


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqlen", type=int, default=32768)
    parser.add_argument("--heads", default="32/8")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--documents", type=int, default=8,
                        help="documents in the mask_mod cases' document mask (1: every pair attends, through the mask)")
    parser.add_argument("--cases", help="comma-separated names of CASES to run (default: all)")
    parser.add_argument("--knobs", default="[{}]",
                        help="JSON list of knob changes to time autoflash under, e.g. '[{}, {\"num_warps\": 8}]' "
                             "({} : the dispatched knobs; a change applies to the forward, or with \"direction\": "
                             "\"bwd\" to the backward: benchmarks/forced_knobs.py)")
    parser.add_argument("--tune-budget", type=float, default=0.0,
                        help="tune each autoflash case on first use with this budget in seconds a direction (into "
                             "the user database, AUTOFLASH_DB: mods included) before it is timed; 0: as dispatched")
    parser.add_argument("--out", help="append a JSON line per measurement to this file")
    args = parser.parse_args()
    if args.tune_budget:
        autoflash.configure(tune="on-miss", budget_s=args.tune_budget)
    heads_q, heads_kv = (int(h) for h in args.heads.split("/"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(args.batch, heads_q, args.seqlen, args.head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(args.batch, heads_kv, args.seqlen, args.head_dim, device="cuda", dtype=torch.bfloat16,
                        generator=gen) for _ in range(2))
    dout = torch.randn_like(q)
    meta = dict(gpu=torch.cuda.get_device_name(),
                command="python benchmarks/variants.py " + " ".join(f"--{n.replace('_', '-')} {shlex.quote(str(a))}"
                                                                    for n, a in vars(args).items() if n != "out"))
    mods = mask_mods(args.seqlen, q.device, args.documents)
    for name, (causal, fields) in CASES.items():
        if args.cases and name not in args.cases.split(","):
            continue
        mod = mods.get(fields.get("mask_mod"))
        fixed = {n: f for n, f in fields.items() if n not in ("mask_mod", "score_mod")}
        problem = Problem.from_tensors(q, k, causal).with_variants(**fixed)
        kwargs = dict(variant_kwargs(problem, q.device), causal=causal)
        flex = flex_call(problem, kwargs, q.device)
        if mod is not None:
            kwargs, flex = dict(causal=causal, mask_mod=mod), flex_mask_call(mod, causal, problem, q.device)
            problem = problem.with_variants(mask_mod=mod.fingerprint())
            pairs = mod.mask(1, 1, args.seqlen, args.seqlen, q.device)[0, 0]
            flops = 4.0 * args.batch * heads_q * args.head_dim * int((pairs.tril() if causal else pairs).sum())
        elif "score_mod" in fields:
            score_mod = autoflash.ScoreMod(softcap)
            kwargs, problem = dict(causal=causal, score_mod=score_mod), problem.with_variants(
                score_mod=score_mod.fingerprint())
            flex = _flex_score_call(softcap, causal, problem, q.device)
            flops = problem.flops("fwd")
        else:
            flops = problem.flops("fwd")
        call = functools.partial(autoflash.attention, **kwargs)
        impls = {label("autoflash", change): (call, change) for change in changes_of(args.knobs)}
        impls["flex"] = flex, {}
        if not (problem.gates() or fields):
            impls["sdpa"] = (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                            enable_gqa=True), {})
        for impl, (fn, change) in impls.items():
            try:
                with forced_knobs(change):
                    if args.tune_budget and impl.startswith("autoflash"):  # (the first call tunes: not timed)
                        fn(*(t.detach().requires_grad_() for t in (q, k, v))).backward(dout)
                    fwd_ms, bwd_ms = timed(fn, q, k, v, dout)
            except Exception as error:  # one backend's failure is recorded, the others still run
                row = dict(case=name, impl=impl, error=f"{type(error).__name__}: {str(error)[:300]}")
            else:
                row = dict(case=name, impl=impl, problem=problem.key(), fwd_ms=round(fwd_ms, 4),
                           bwd_ms=round(bwd_ms, 4), fwd_tflops=round(flops / fwd_ms * 1e-9, 1),
                           bwd_tflops=round(BWD_FLOP_RATIO * flops / bwd_ms * 1e-9, 1))
            print(json.dumps(row), flush=True)
            append_row(args.out, dict(row, **meta))


if __name__ == "__main__":
    main()
