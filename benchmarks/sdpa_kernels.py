"""Which kernels plain `scaled_dot_product_attention` launches on a problems file's forward, beside each backend it
can be forced to and autoflash as dispatched: GPU time per kernel (torch.profiler), to tell what plain SDPA runs
where it beats all its forced backends (NOTES 145: b64 h12 s197 d64 fp16).

    python benchmarks/sdpa_kernels.py examples/holdout_low.yaml --out $OUT/sdpa_kernels.jsonl
"""

import argparse
import json
import sys

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

import autoflash
from autoflash.reference import sdpa_attention
from autoflash.shapes import load_problems
from profiling import kernel_times

BACKENDS = {"plain": None, "cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shapes")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    with open(args.out, "a") as out:
        for problem in load_problems(args.shapes):
            q, k, v = problem.random_inputs("cuda", 0)
            line = {"problem": problem.key(), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "triton": triton.__version__, "command": " ".join(sys.argv)}
            for name, backend in BACKENDS.items():
                try:
                    if backend is None:
                        times = kernel_times(lambda: sdpa_attention(q, k, v, problem.causal))
                    else:
                        with sdpa_kernel([backend]):
                            times = kernel_times(lambda: sdpa_attention(q, k, v, problem.causal))
                except RuntimeError as e:  # a backend that refuses the problem
                    times = {"refused": str(e).splitlines()[0][:200]}
                line[name] = times
            line["autoflash"] = kernel_times(lambda: autoflash.attention(q, k, v, causal=problem.causal))
            print(json.dumps(line), file=out, flush=True)
            print(problem.key(), {name: line[name] for name in (*BACKENDS, "autoflash")})


if __name__ == "__main__":
    main()
