"""Compile the `tl` kernels with each attention variant's gate for Hopper on the CPU (no GPU): that they compile,
and ptxas's registers and spills beside the plain kernels' (what a variant costs before any timing). MASK_MOD
compiles a document mask (a captured tensor of document ids), its block table kernel included; SCORE_MOD a softcap
written as a score_mod (tanh, and its derivative in the backward).

    python benchmarks/variants_sm90.py > variants_sm90.log
    python benchmarks/variants_sm90.py SCORE_MOD SOFTCAP  # only these gates (and the plain kernels)
"""

import sys

import json

import torch

from autoflash import checks
from autoflash.codegen import FIXED_VARIANTS, MASK_MOD
from autoflash.families.tl.knobs import BwdKnobs, FwdKnobs
from autoflash.mask_mod import MaskMod
from autoflash.problem import Problem
from autoflash.score_mod import ScoreMod
from autoflash.resources import launcher
from tl_sm90 import rendered, sm90_compiler, summary_of

POINTS = [  # (direction, knobs, head_dim): the H100 defaults at d128 and d64, and the other ways of loading
    ("fwd", FwdKnobs(block_m=128, block_n=64, num_warps=4, num_stages=2, loads="tma_host"), 128),
    ("fwd", FwdKnobs(block_m=128, block_n=64, num_warps=8, num_stages=3), 64),
    ("fwd", FwdKnobs(block_m=128, block_n=64, num_warps=4, num_stages=2, loads="tma", kv_splits=4), 128),
    ("fwd", FwdKnobs(block_m=64, block_n=64, num_warps=4, num_stages=2, pack_gqa=True), 128),
    ("fwd", FwdKnobs(block_m=128, block_n=64, num_warps=4, num_stages=2, head_dim_split=True, loads="tma_host"), 80),
    ("bwd", BwdKnobs(block_m=64, block_n=128, num_warps=8, num_stages=2), 128),
    ("bwd", BwdKnobs(block_m=64, block_n=128, num_warps=8, num_stages=2, dq="atomic", causal_split=False), 64),
]
FIXED = ("WINDOW", "SOFTCAP", "ALIBI")
GATES = [frozenset()] + [frozenset({gate}) for gate in FIXED] + [frozenset(FIXED), frozenset({"MASK_MOD"}),
                                                                   frozenset({"SCORE_MOD"})]


def same_document(b, h, q_idx, kv_idx, document_id):
    return document_id[q_idx] == document_id[kv_idx]


def softcap(score, b, h, q_idx, kv_idx):
    return 50.0 * torch.tanh(score / 50.0)


def compile_variant(direction, knobs, head_dim, gates) -> dict:
    """Each kernel's summary for a causal bf16 problem of 4096 tokens, GQA 8/2, with the variants of `gates`."""
    b, hq, hkv, s = 1, 8, 2, 4096
    q = torch.empty(b, hq, s, head_dim, dtype=torch.bfloat16)
    k = torch.empty(b, hkv, s, head_dim, dtype=torch.bfloat16)
    mod = MaskMod(same_document, torch.zeros(s, dtype=torch.int32)) if "MASK_MOD" in gates else None
    score_mod = ScoreMod(softcap) if "SCORE_MOD" in gates else None
    problem = Problem.from_tensors(q, k, True, (1024, -1) if "WINDOW" in gates else (-1, -1), "SOFTCAP" in gates,
                                   "ALIBI" in gates, mod.fingerprint() if mod else "",
                                   score_mod.fingerprint() if score_mod else "")
    slopes = torch.empty(hq) if problem.alibi else None
    variant = checks.variant_args(problem.causal, problem.window, s, s, 50.0 if problem.softcap else 0.0, slopes,
                                  mod, score_mod)
    compiled = {}
    plans = launcher("tl", MASK_MOD if mod else FIXED_VARIANTS) if variant else launcher("tl")
    plan = plans.forward_plan if direction == "fwd" else plans.backward_plan
    tensors = (q, k, torch.empty_like(k), torch.empty_like(q), torch.empty(b, hq, s))
    if direction == "bwd":
        tensors += (torch.empty_like(q), torch.empty_like(q), torch.empty_like(k), torch.empty_like(k))
    flags = (0.1, problem.causal) + ((None,) if direction == "bwd" else ())
    plan(rendered(knobs, gates, mod and mod.rendered, score_mod and score_mod.rendered), knobs.as_point(), *tensors, *flags, sm90_compiler(compiled),
         *([variant] if variant else []), *([launcher("tl", FIXED_VARIANTS)] if mod else []))
    return {name: summary_of(kernel) for name, kernel in compiled.items()}


if __name__ == "__main__":
    chosen = [g for g in GATES if not g or g <= set(sys.argv[1:])] if sys.argv[1:] else GATES
    for direction, knobs, head_dim in POINTS:
        for gates in chosen:
            print(json.dumps(dict(direction=direction, head_dim=head_dim, knobs=knobs.to_json(), gates=sorted(gates),
                                  kernels=compile_variant(direction, knobs, head_dim, gates))), flush=True)
