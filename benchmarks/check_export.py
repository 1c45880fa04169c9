"""Run an exported package on the GPU, with autoflash blocked from import, against an fp64 reference.

    autoflash export --gpu h100 --shapes examples/headline.yaml --out /tmp/export/fa
    python benchmarks/check_export.py /tmp/export fa examples/headline.yaml
"""

import sys

sys.modules["autoflash"] = None  # the export must need only torch and triton

import importlib  # noqa: E402
import math  # noqa: E402

import torch  # noqa: E402
import yaml  # noqa: E402


def main(folder: str, package: str, shapes: str):
    sys.path.insert(0, folder)
    exported = importlib.import_module(package)
    for entry in yaml.safe_load(open(shapes))["problems"]:
        b, h, s, d, causal = entry["batch"], entry["heads_q"], entry["seqlen_q"], entry["head_dim"], entry.get("causal", False)
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16) for _ in range(3))
        out = exported.attention(q, k, v, causal=causal)
        heads = slice(0, 2)  # an fp64 reference of two heads
        scores = q[:, heads].double() @ k[:, heads].double().transpose(-1, -2) / math.sqrt(d)
        if causal:
            scores = scores.masked_fill(torch.ones(s, s, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
        ref = torch.softmax(scores, -1) @ v[:, heads].double()
        err = ((out[:, heads].double() - ref).norm() / ref.norm()).item()
        print(f"exported {package}: b{b} h{h} s{s} d{d} causal={causal}: relative error {err:.1e}")
        assert err < 2e-3


if __name__ == "__main__":
    main(*sys.argv[1:])
