"""Render the Gluon backward and compile it for sm_90 without a GPU (as gluon_sm90.py does the forward; runs under
the GPU machine's triton too: `python tests/gluon_bwd_sm90.py` prints one line per variant)."""

import json
import sys
import tempfile

import triton
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.runtime.jit import MockTensor

from gluon_sm90 import _TorchDtype, compile_kernel, descriptor, load, ptxas_report

TEMPLATE = "gluon/attn_bwd.py.jinja"


def compile_bwd_sm90(module, knobs: dict, head_dim: int, dtype: str = "float16", causal: bool = False):
    """The module's `attn_bwd` compiled for sm_90 (triton's CompiledKernel)."""
    q, kv, dkv = (descriptor(rows, head_dim, dtype) for rows in (knobs["block_m"], 64 * knobs["warpgroups"], 64))
    fp32 = MockTensor(_TorchDtype("float32"), [2 * 4 * 1000 * head_dim])
    rows = TensorDescriptor(MockTensor(_TorchDtype("float32"), [8, 1000]), [8, 1000], [1000, 1],
                            [1, knobs["block_m"]], gl.NVMMASharedLayout.get_default_for([1, knobs["block_m"]],
                                                                                         gl.float32))
    args = (q, kv, kv, q, dkv, dkv, rows, rows, fp32,  # q, k, v, do, dk, dv; lse, delta, dq
            0.1, 4 * 1000 * head_dim, 1000 * head_dim, head_dim,  # scale, dq's strides
            4, 2, 1000, 1000)  # heads_q, heads_kv, seqlens
    options = dict(HEAD_DIM=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)), IS_CAUSAL=causal,
                   num_warps=4)
    return compile_kernel(module.attn_bwd, args, options)


DEFAULT = dict(block_m=64, num_buffers=2, warpgroups=2)  # the family's default past head dim 64
D64 = dict(block_m=128)  # and to 64
# (knob changes, head_dim, dtype, causal)
CASES = [({}, 128, "float16", False),
         ({}, 128, "bfloat16", True),
         ({}, 96, "float16", True),
         (D64, 64, "float16", False),
         (D64, 64, "bfloat16", True),
         (dict(num_buffers=3), 128, "float16", True),
         (dict(warpgroups=1), 64, "bfloat16", False),
         (dict(warpgroups=1), 32, "float16", True)]


def report(cases) -> list[dict]:
    """Compile each case; what its compiled kernel says: shared memory, ptxas's registers and spills, wgmma
    instructions in the PTX."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for change, head_dim, dtype, causal in cases:
            knobs = DEFAULT | change
            compiled = compile_bwd_sm90(load(knobs, tmp, TEMPLATE), knobs, head_dim, dtype, causal)
            ptx = compiled.asm["ptx"]
            rows.append(dict(shared=compiled.metadata.shared, wgmma=ptx.count("wgmma.mma_async"),
                             **ptxas_report(compiled)))
    return rows


if __name__ == "__main__":
    # Without arguments the cases above; else a JSON list of cases. One JSON line per case.
    for row in report(json.loads(sys.argv[1]) if len(sys.argv) > 1 else CASES):
        print(json.dumps(dict(row, triton=triton.__version__)), flush=True)
