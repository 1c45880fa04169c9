"""Dump the Gluon forward's TTGIR, PTX and SASS for sm_90 without a GPU (tests/gluon_sm90.py's render and
compile), specialised on the scalars the launchers pass for benchmarks/varlen.py --lengths 2048,2048 (16 causal
sequences of 2048, GQA 32/8, d128): `python benchmarks/fwd_asm_dump.py OUTDIR '[[knob changes, variants, name], ...]'`
writes OUTDIR/<name>.{ttgir,ptx,sass,json}. Dense: (16, 32, 2048, 128) as launch.py's forward_plan passes it
(run_heads 96); VARLEN: (1, 32, 32768, 128) views of packed (tokens, heads, d) tensors as launch_varlen.py's.
Knob changes apply to tests/gluon_sm90.py's DEFAULT: '[[{"q_buffers": 2, "dynamic": true}, [], "dense"],
[{"q_buffers": 2, "dynamic": true}, ["VARLEN"], "varlen"]]' are the Gluon default (NOTES 62, V5). Registers and
spills: ptxas -v (the most any partition uses). Needs triton (3.6 or 3.9) and jinja2; PYTHONPATH at the repo."""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import gluon_sm90  # noqa: E402
import triton  # noqa: E402
from triton.backends.nvidia.compiler import get_ptxas  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402
from triton.runtime.jit import MockTensor  # noqa: E402

T = gluon_sm90._TorchDtype
BATCH, HQ, HKV, S, D = 16, 32, 8, 2048, 128


def desc(shape, strides, rows):
    block = [1, 1, rows, D]
    layout = gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16)
    return TensorDescriptor(MockTensor(T("bfloat16"), shape), shape, strides, block, layout)


def args(knobs, varlen):
    tile_m = knobs["block_m"] * knobs["consumers"]
    if varlen:
        total = BATCH * S
        q = ([1, HQ, total, D], [total * HQ * D, D, HQ * D, 1])
        kv = ([1, HKV, total, D], [total * HKV * D, D, HKV * D, 1])
    else:
        q = ([BATCH, HQ, S, D], [HQ * S * D, S * D, D, 1])
        kv = ([BATCH, HKV, S, D], [HKV * S * D, S * D, D, 1])
    descs = (desc(*q, knobs["block_m"]), desc(*kv, knobs["block_n"]), desc(*kv, knobs["block_n"]),
             desc(*q, knobs["block_m"]))
    lse, counter = MockTensor(T("float32"), [BATCH * HQ * S]), MockTensor(T("int32"), [1])
    if varlen:
        entries = triton.cdiv(BATCH * S, tile_m) + BATCH
        return (*descs, lse, counter, 0.088, HQ, HQ // HKV, BATCH * S, BATCH * S, entries, entries * HQ, 1,
                *(MockTensor(T("int32"), [2 * entries]) for _ in range(4)), MockTensor(T("bfloat16"), [BATCH * S * HQ * D]),
                D, HQ * D, D)
    tiles_m = triton.cdiv(S, tile_m)
    run_heads = min(BATCH * HQ, max(1, (24 << 20) // (2 * S * D * 2 * HKV // HQ)))
    return (*descs, lse, counter, 0.088, HQ, HQ // HKV, S, S, tiles_m, tiles_m * BATCH * HQ, run_heads)


out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
for knobs, variants, name in json.loads(sys.argv[2]):
    knobs = gluon_sm90.DEFAULT | knobs
    with tempfile.TemporaryDirectory() as tmp:
        module = gluon_sm90.load(knobs, tmp, variants=variants)
        compiled = gluon_sm90.compile_kernel(module.attn_fwd, args(knobs, "VARLEN" in variants),
                                             dict(BLOCK_D=D, IS_CAUSAL=True, RETURN_LSE=True, num_warps=4))
    (out / f"{name}.ttgir").write_text(compiled.asm["ttgir"])
    (out / f"{name}.ptx").write_text(compiled.asm["ptx"])
    cubin = out / f"{name}.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    nvdisasm = Path(get_ptxas(90).path).with_name("nvdisasm")
    sass = subprocess.run([str(nvdisasm), "-c", "-gi", str(cubin)], capture_output=True, text=True).stdout
    (out / f"{name}.sass").write_text(sass)
    row = dict(name=name, shared=compiled.metadata.shared, triton=triton.__version__,
               **gluon_sm90.ptxas_report(compiled))
    (out / f"{name}.json").write_text(json.dumps(row))
    print(json.dumps(row), flush=True)
