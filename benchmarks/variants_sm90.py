"""Compile the `tl` kernels with each attention variant's gate for Hopper on the CPU (no GPU): that they compile,
and ptxas's registers and spills beside the plain kernels' (what a variant costs before any timing).

    python benchmarks/variants_sm90.py > variants_sm90.log
"""

import json

import torch

from autoflash import checks
from autoflash.codegen import FIXED_VARIANTS
from autoflash.families.tl.knobs import BwdKnobs, FwdKnobs
from autoflash.problem import Problem
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
GATES = [frozenset()] + [frozenset({gate}) for gate in FIXED] + [frozenset(FIXED)]


def compile_variant(direction, knobs, head_dim, gates) -> dict:
    """Each kernel's summary for a causal bf16 problem of 4096 tokens, GQA 8/2, with the variants of `gates`."""
    b, hq, hkv, s = 1, 8, 2, 4096
    q = torch.empty(b, hq, s, head_dim, dtype=torch.bfloat16)
    k = torch.empty(b, hkv, s, head_dim, dtype=torch.bfloat16)
    problem = Problem.from_tensors(q, k, True, (1024, -1) if "WINDOW" in gates else (-1, -1), "SOFTCAP" in gates,
                                   "ALIBI" in gates)
    slopes = torch.empty(hq) if problem.alibi else None
    variant = checks.variant_args(problem.causal, problem.window, s, s, 50.0 if problem.softcap else 0.0, slopes)
    compiled = {}
    plans = launcher("tl", FIXED_VARIANTS) if variant else launcher("tl")
    plan = plans.forward_plan if direction == "fwd" else plans.backward_plan
    tensors = (q, k, torch.empty_like(k), torch.empty_like(q), torch.empty(b, hq, s))
    if direction == "bwd":
        tensors += (torch.empty_like(q), torch.empty_like(q), torch.empty_like(k), torch.empty_like(k))
    flags = (0.1, problem.causal) + ((None,) if direction == "bwd" else ())
    plan(rendered(knobs, gates), knobs.as_point(), *tensors, *flags, sm90_compiler(compiled),
         *([variant] if variant else []))
    return {name: summary_of(kernel) for name, kernel in compiled.items()}


if __name__ == "__main__":
    for direction, knobs, head_dim in POINTS:
        for gates in GATES:
            print(json.dumps(dict(direction=direction, head_dim=head_dim, knobs=knobs.to_json(), gates=sorted(gates),
                                  kernels=compile_variant(direction, knobs, head_dim, gates))), flush=True)
