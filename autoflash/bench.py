"""autoflash beside PyTorch SDPA's backends, timed in one run on the same inputs.

TFLOP/s use the FlashAttention-paper count (causal = half of full for square problems).
"""

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right
from torch.nn.functional import scaled_dot_product_attention

import autoflash
from autoflash.problem import Problem
from autoflash.tune.timing import input_sets, median_ms

SDPA_BACKENDS = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
                 "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION}


def _inputs(p: Problem, device, seed: int):
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(p.batch, p.heads_q, p.seqlen_q, p.head_dim, device=device, dtype=p.torch_dtype, generator=gen)
    k, v = (torch.randn(p.batch, p.heads_kv, p.seqlen_k, p.head_dim, device=device, dtype=p.torch_dtype,
                        generator=gen) for _ in range(2))
    return q, k, v


def _sdpa(backend, p: Problem):
    mask = dict(attn_mask=causal_lower_right(p.seqlen_q, p.seqlen_k)) if p.causal and p.seqlen_q != p.seqlen_k \
        else dict(is_causal=p.causal)

    def run(q, k, v):
        with sdpa_kernel(backend):
            return scaled_dot_product_attention(q, k, v, enable_gqa=p.heads_q != p.heads_kv, **mask)
    return run


def bench_problem(p: Problem, device: torch.device) -> list[dict]:
    """One row per implementation: backend, ms and TFLOP/s, or the error that stopped it."""
    per_set = p.element_size * p.head_dim * p.batch * 2 * (p.heads_q * p.seqlen_q + p.heads_kv * p.seqlen_k)
    sets = [_inputs(p, device, seed) for seed in range(input_sets(per_set, device))]
    implementations = {"autoflash": lambda q, k, v: autoflash.attention(q, k, v, causal=p.causal)}
    implementations.update({name: _sdpa(backend, p) for name, backend in SDPA_BACKENDS.items()})
    rows = []
    for name, fn in implementations.items():
        try:
            ms = median_ms(lambda i: fn(*sets[i]), len(sets), device)
            rows.append(dict(backend=name, ms=ms, tflops=p.fwd_flops() / ms * 1e-9))
        except Exception as e:  # a backend that refuses the shape is recorded, not fatal
            rows.append(dict(backend=name, error=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"))
    q, k, _ = sets[0]
    rows[0]["explain"] = autoflash.explain(q, k, sets[0][2], causal=p.causal)
    return rows


def plot(results: list[tuple[Problem, list[dict]]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["backend"] for r in results[0][1]]
    fig, ax = plt.subplots(figsize=(max(8, len(results) * 0.7), 5))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        values = [next((r.get("tflops", 0) for r in rows if r["backend"] == name), 0) for _, rows in results]
        ax.bar([x + i * width for x in range(len(results))], values, width, label=name)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(results))])
    ax.set_xticklabels([p.label() for p, _ in results], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("TFLOP/s (forward)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
