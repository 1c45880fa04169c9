"""Where the Gluon backward's time goes: its kernel timed with pieces removed from the rendered source (the
results are wrong: timing only; NOTES G-bwd3/4). On the GPU, from the checkout:
    python benchmarks/gluon_bwd_pieces.py
"""
import torch

import autoflash
from autoflash.codegen import Variant, _import, _write, render
from autoflash.families.gluon.knobs import BwdKnobs
from autoflash.problem import Problem
from autoflash.tune.timing import median_ms

# A piece's removal: (text of the rendered kernel, its replacement).
EDITS = {
    "base": [],
    "noreduce": [("        _tma_add(dq_desc", "        if seqlen_q < 0:\n            _tma_add(dq_desc")],
    "nosync": [("        mbarrier.wait(ds_ready.index(t % 2), t // 2 & 1)\n", "")],
}
PROBLEMS = [(1, 16, 16384, 128, False, BwdKnobs()), (4, 16, 4096, 128, True, BwdKnobs()),
            (8, 16, 2048, 128, False, BwdKnobs()), (2, 32, 8192, 64, False, BwdKnobs())]


def main():
    """One line a problem: TFLOP/s of the kernel as rendered, then without each piece of EDITS."""
    for b, h, s, d, causal, knobs in PROBLEMS:
        problem = Problem(b, h, h, s, s, d, causal, "float16")
        q, k, v, dout = problem.random_inputs(torch.device("cuda"), 0, with_dout=True)
        out, lse = autoflash.attention(q, k, v, causal=causal, return_lse=True)
        grads = tuple(torch.empty_like(t) for t in (q, k, v))
        line = []
        for name, edits in EDITS.items():
            src = render(knobs)
            for a, c in edits:
                assert a in src, (name, a)
                src = src.replace(a, c)
            key = f"exp_{name}_{abs(hash(src)) % 10**8}"
            var = Variant(knobs, _import(key, _write(key, src)))
            plan = var.backward_plan(q, k, v, out, lse, dout, *grads, d ** -0.5, causal, None)
            ms = median_ms(lambda i: plan(q, k, v, out, lse, dout, *grads, None), 1, torch.device("cuda"))
            line.append(f"{name} {problem.flops('bwd') / ms * 1e-9:.0f}")
        print(f"b{b} h{h} s{s} d{d} {'causal' if causal else 'full'}: " + " | ".join(line), flush=True)


if __name__ == "__main__":
    main()
