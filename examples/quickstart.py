"""Run autoflash once and check it against the float64 reference.

On a GPU: python examples/quickstart.py
On a CPU (Triton's interpreter, small sizes): TRITON_INTERPRET=1 python examples/quickstart.py
"""

import torch

import autoflash
from autoflash.reference import attention_reference

device = "cuda" if torch.cuda.is_available() else "cpu"
batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim = (2, 8, 2, 1000, 1000, 96) if device == "cuda" \
    else (1, 4, 2, 100, 123, 80)
q = torch.randn(batch, heads_q, seqlen_q, head_dim, device=device, dtype=torch.float16)
k = torch.randn(batch, heads_kv, seqlen_k, head_dim, device=device, dtype=torch.float16)
v = torch.randn_like(k)

out, lse = autoflash.attention(q, k, v, causal=True, return_lse=True)
ref_out, ref_lse = attention_reference(q, k, v, causal=True)
error = ((out.double() - ref_out).norm() / ref_out.norm()).item()
print(f"autoflash.attention on {device}: out {tuple(out.shape)} {out.dtype}, "
      f"relative error vs float64 reference {error:.1e}")
assert error < 2e-3, "autoflash disagrees with the reference"
