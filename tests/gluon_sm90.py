"""Render the Gluon forward and compile it for sm_90 without a GPU (needs only triton and jinja2, so it runs
under the GPU machine's triton too: `python tests/gluon_sm90.py` prints one line per variant)."""

import hashlib
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import jinja2
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import make_backend
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.runtime.jit import MockTensor, create_function_from_signature

from autoflash.mask_mod import render as render_mod
from autoflash.problem import VARIANTS  # the plain problem: every variant gate off
from autoflash.resources import launcher

TEMPLATES = Path(__file__).resolve().parents[1] / "templates"
SM90 = GPUTarget("cuda", 90, 32)


def same_document(b, h, q_idx, kv_idx, document_id):
    return document_id[q_idx] == document_id[kv_idx]


def prefix_lm(b, h, q_idx, kv_idx):
    return (kv_idx < 16) | (kv_idx <= q_idx)


# The masks of MASK_MOD cases, by the name a case gives after its variants (issue 16's document and prefix-LM masks).
MASK_MODS = {"documents": same_document, "prefix-lm": prefix_lm}


def render(knobs: dict, template: str = "gluon/attn_fwd.py.jinja", variants=(), mask_mod: str = "") -> str:
    """The template rendered with these knobs and `variants` gates on; MASK_MOD with MASK_MODS[mask_mod]."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    mod = render_mod(MASK_MODS[mask_mod]) if mask_mod else None
    return env.get_template(template).render(
        TEMPLATE=template, KNOBS_JSON=str(knobs), FINGERPRINT="test", AUTOFLASH_VERSION="test",
        TRITON_VERSION=triton.__version__, EXTRA_HEADER=(), **{name: name in variants for name in VARIANTS},
        **(dict(MASK_MOD_SOURCE=mod.source, MASK_MOD_CAPTURES=mod.captures) if mod else {}),
        **{name.upper(): value for name, value in knobs.items()})


def load(knobs: dict, directory: str, template: str = "gluon/attn_fwd.py.jinja", variants=(), mask_mod: str = ""):
    """The rendered module (with the `variants` gates on, `mask_mod` as `render`'s), written to `directory` (Triton
    reads a kernel's source from its file)."""
    key = hashlib.sha256(json.dumps([knobs, template, sorted(variants), mask_mod],
                                    sort_keys=True).encode()).hexdigest()[:16]
    path = Path(directory) / f"gluon_{key}.py"
    path.write_text(render(knobs, template, variants, mask_mod))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _TorchDtype:
    """What MockTensor needs of a torch dtype (torch is not needed to compile)."""

    is_floating_point = True

    def __init__(self, name):
        self.name = name

    def __str__(self):
        return f"torch.{self.name}"

    # Triton caches per dtype object: equal by name, so that a new object at a freed one's address is not taken
    # for it (a bf16 descriptor compiled as an fp16 one).
    def __eq__(self, other):
        return isinstance(other, _TorchDtype) and other.name == self.name

    def __hash__(self):
        return hash(self.name)

    __repr__ = __str__


def compile_sm90(module, knobs: dict, head_dim: int, dtype: str = "float16", causal: bool = False,
                 return_lse: bool = True, variants=(), mask_mod: str = ""):
    """The module's `attn_fwd` (rendered with the `variants` gates, and `mask_mod`) compiled for sm_90 (triton's
    CompiledKernel: metadata.shared, asm['ptx'], ...)."""
    captures = 1 if mask_mod == "documents" else 0
    block_d, block_d2 = launcher("common", "columns").column_tiles(knobs, head_dim)  # (as the launcher splits)
    args = (*(descriptor(rows, head_dim - first, dtype, width) for first, width in ((0, block_d), (block_d, block_d2))
              if width for rows in (knobs["block_m"], knobs["block_n"], knobs["block_n"], knobs["block_m"])),
            MockTensor(_TorchDtype("float32"), [2 * 4 * 1000]),
            MockTensor(_TorchDtype("int32"), [1]),  # the tile counter
            *((MockTensor(_TorchDtype("float32"), [4]),) if "ALIBI" in variants else ()),  # ALiBi's slopes
            *((*(MockTensor(_TorchDtype("int32"), [1000]) for _ in range(captures)),  # the captures, the block table
               MockTensor(_TorchDtype("int32"), [2 * 4 * 8 * 2 * 9])) if mask_mod else ()),
            0.1, 4, 2, 1000, 1000, 8, 64, 3,  # scale, heads_q, group, seqlens, tiles_m, tiles, run_heads
            *((100, 0 if causal else 30) if "WINDOW" in variants else ()), *((30.0,) if "SOFTCAP" in variants else ()),
            *((0,) if "ALIBI" in variants else ()),  # window_left, window_right; softcap; ALiBi's batch stride
            *((*(MockTensor(_TorchDtype("int32"), [8]) for _ in range(4)),  # cu_seqlens_q, starts_k, seqlens_k, table
               MockTensor(_TorchDtype(dtype), [4 * 1000 * head_dim]), head_dim, 4 * head_dim, head_dim)
              if "VARLEN" in variants else ()),  # out, its head and row strides, head_dim
            *((0, 8 * 2 * 9, 2 * 9, *(1000 for _ in range(captures))) if mask_mod else ()))  # table strides, lengths
    options = dict(BLOCK_D=block_d, **(dict(BLOCK_D2=block_d2) if block_d2 else {}), IS_CAUSAL=causal,
                   RETURN_LSE=return_lse, **launcher("gluon").launch_options(knobs))
    return compile_kernel(module.attn_fwd, args, options)


def descriptor(rows: int, head_dim: int, dtype: str, columns: int | None = None):
    """A TMA descriptor of blocks (1, 1, rows, columns: head_dim padded unless given) over a mock (2, 4, 1000,
    head_dim) tensor."""
    block_d = columns or max(16, triton.next_power_of_2(head_dim))
    shape, strides = [2, 4, 1000, head_dim], [4 * 1000 * head_dim, 1000 * head_dim, head_dim, 1]
    block = [1, 1, rows, block_d]
    layout = gl.NVMMASharedLayout.get_default_for(block, getattr(gl, dtype))
    return TensorDescriptor(MockTensor(_TorchDtype(dtype), shape), shape, strides, block, layout)


def compile_kernel(kernel, args, options: dict):
    """`kernel` compiled for sm_90 with these args (mock tensors, descriptors, numbers) and options."""
    backend = make_backend(SM90)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, other = binder(*args, **options)
    packed, signature, constexprs, attrs = kernel._pack_args(backend, options, bound, specialization, other)
    return triton.compile(GluonASTSource(kernel, signature, constexprs, attrs), target=SM90,
                          options=packed.__dict__)


def ptxas_report(compiled) -> dict:
    """ptxas's -v report of the compiled kernel's PTX for sm_90a: {'registers': .., 'spill_stores': ..,
    'spill_loads': ..} (triton keeps no spill count without a GPU)."""
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "kernel.ptx"
        ptx.write_text(compiled.asm["ptx"])
        run = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", str(ptx), "-o", str(Path(tmp) / "k.cubin")],
                             capture_output=True, text=True, check=True)
    text = run.stdout + run.stderr
    return dict(registers=int(re.search(r"Used (\d+) registers", text).group(1)),
                spill_stores=int(re.search(r"(\d+) bytes spill stores", text).group(1)),
                spill_loads=int(re.search(r"(\d+) bytes spill loads", text).group(1)))


DEFAULT = dict(block_m=64, block_n=128, num_buffers=2, q_buffers=1, consumers=2, pingpong=False, overlap=True,
               programs_per_sm=1, consumer_regs=240, producer_regs=24, persistent=True, dynamic=False,
               stage_o_in_q=False, tile_overlap=False, head_dim_split=False, consumer_keys=False)
# (knob changes, head_dim, dtype, causal, return_lse[, variants[, a MASK_MODS name]])
CASES = [({}, 128, "float16", False, True),
         (dict(q_buffers=2, dynamic=True), 128, "float16", True, True),
         (dict(consumers=3, consumer_regs=160, block_n=64, q_buffers=2), 64, "bfloat16", True, True),
         (dict(consumers=1, overlap=False, persistent=False), 80, "float16", True, False),
         (dict(block_n=64, stage_o_in_q=True), 256, "bfloat16", False, True),
         (dict(pingpong=True, stage_o_in_q=True, num_buffers=3), 128, "float16", True, False),
         # two programs an SM (one consumer each, launched with 128 registers a thread): persistent, two Q tiles,
         # a program per tile, two column tiles
         (dict(consumers=1, programs_per_sm=2), 64, "float16", False, True),
         (dict(consumers=1, programs_per_sm=2, q_buffers=2), 64, "bfloat16", True, True),
         (dict(consumers=1, programs_per_sm=2, block_n=64, persistent=False), 128, "float16", True, False),
         (dict(consumers=1, programs_per_sm=2, block_n=64, head_dim_split=True), 96, "bfloat16", False, True),
         # three (80 registers a thread at launch: 64-key blocks at head dim 64)
         (dict(consumers=1, programs_per_sm=3, block_n=64), 64, "float16", False, True),
         (dict(consumers=1, programs_per_sm=3, block_n=64, q_buffers=2), 64, "bfloat16", True, True),
         # sliding window, softcapping and ALiBi, each and together; with and without the softmax/PV overlap
         ({}, 128, "bfloat16", True, True, ["WINDOW"]),
         (dict(overlap=False, consumers=1, persistent=False), 128, "float16", False, True, ["WINDOW"]),
         ({}, 128, "bfloat16", True, True, ["SOFTCAP"]),
         ({}, 128, "bfloat16", False, True, ["ALIBI"]),
         (dict(block_n=64, stage_o_in_q=True), 256, "bfloat16", True, True, ["WINDOW", "SOFTCAP", "ALIBI"]),
         # packed sequences: the tile table, O stored from registers (also through Q's tile's release)
         (dict(q_buffers=2, dynamic=True), 128, "bfloat16", True, True, ["VARLEN"]),
         (dict(block_n=64, stage_o_in_q=True), 256, "float16", False, False, ["VARLEN"]),
         (dict(consumers=3, consumer_regs=160, block_n=64), 64, "float16", False, True, ["VARLEN"]),
         # mask_mods (the document mask from a captured tensor, prefix-LM): key blocks from the mask's block table
         (dict(q_buffers=2), 128, "bfloat16", False, True, ["MASK_MOD"], "documents"),
         (dict(q_buffers=2, dynamic=True), 128, "bfloat16", True, True, ["MASK_MOD"], "documents"),
         (dict(q_buffers=2), 64, "bfloat16", False, True, ["MASK_MOD"], "documents"),
         (dict(q_buffers=2, dynamic=True), 64, "bfloat16", True, True, ["MASK_MOD"], "prefix-lm"),
         (dict(block_n=64, stage_o_in_q=True), 256, "bfloat16", False, True, ["MASK_MOD"], "documents"),
         (dict(block_n=64, stage_o_in_q=True, dynamic=True), 256, "bfloat16", True, True, ["MASK_MOD"], "prefix-lm"),
         (dict(q_buffers=2), 128, "bfloat16", False, True, ["MASK_MOD"], "prefix-lm"),
         (dict(consumers=1, overlap=False, persistent=False), 128, "float16", True, False, ["MASK_MOD"], "documents"),
         # tile_overlap: the next tile's block 0 under this tile's last P V (two Q tiles, persistent; full attention,
         # a static grid, two consumers: what violations() allows, NOTES G9)
         (dict(q_buffers=2, tile_overlap=True), 128, "float16", False, True),
         (dict(q_buffers=2, tile_overlap=True), 64, "bfloat16", False, True),
         (dict(q_buffers=2, pingpong=True, stage_o_in_q=True, tile_overlap=True), 128, "bfloat16", False, False),
         # head_dim_split: 160 as 128 + 32 columns, 192 as 128 + 64, 96 as 64 + 32, 80 as 64 + 16, 40 as 32 + 16;
         # with and without the overlap, ping-pong, O in Q, the fixed variants and a mask_mod
         (dict(head_dim_split=True, block_n=64, stage_o_in_q=True), 160, "bfloat16", False, True),
         (dict(head_dim_split=True, block_n=64, stage_o_in_q=True, dynamic=True), 192, "bfloat16", True, True),
         (dict(head_dim_split=True, block_n=64), 192, "float16", False, True),
         (dict(head_dim_split=True, q_buffers=2, dynamic=True), 96, "bfloat16", True, True),
         (dict(head_dim_split=True, consumers=1, overlap=False, persistent=False), 80, "float16", True, False),
         (dict(head_dim_split=True, consumers=3, consumer_regs=160, block_n=64, q_buffers=2), 40, "bfloat16", True,
          True),
         (dict(head_dim_split=True, pingpong=True, block_n=64, stage_o_in_q=True), 160, "bfloat16", True, False),
         (dict(head_dim_split=True, block_n=64, stage_o_in_q=True), 160, "bfloat16", True, True,
          ["WINDOW", "SOFTCAP", "ALIBI"]),
         (dict(head_dim_split=True, block_n=64, stage_o_in_q=True), 192, "bfloat16", True, True, ["MASK_MOD"],
          "documents"),
         (dict(head_dim_split=True, q_buffers=2, dynamic=True), 96, "bfloat16", True, True, ["VARLEN"]),
         (dict(head_dim_split=True, block_n=64, stage_o_in_q=True), 160, "float16", False, False, ["VARLEN"]),
         # each consumer to its own rows' diagonal (NOTES 120): 64- and 128-key blocks, three consumers, two column
         # tiles, softcap and ALiBi
         (dict(consumer_keys=True, block_n=64, num_buffers=3, dynamic=True), 128, "float16", True, True),
         (dict(consumer_keys=True, q_buffers=2, dynamic=True), 128, "bfloat16", True, True),
         (dict(consumer_keys=True, consumers=3, consumer_regs=160, block_n=64, q_buffers=2, dynamic=True), 64,
          "bfloat16", True, True),
         (dict(consumer_keys=True, block_n=64, dynamic=True, overlap=False), 64, "float16", True, False),
         (dict(consumer_keys=True, head_dim_split=True, block_n=64, stage_o_in_q=True, dynamic=True), 160, "bfloat16",
          True, True, ["SOFTCAP", "ALIBI"])]


def report(cases) -> list[dict]:
    """Compile each case; what its compiled kernel says: shared memory, ptxas's registers and spills, wgmma
    and setmaxnreg instructions in the PTX."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for change, head_dim, dtype, causal, return_lse, *more in cases:
            knobs, (variants, mask_mod) = DEFAULT | change, [*more, *((), "")[len(more):]]
            compiled = compile_sm90(load(knobs, tmp, variants=variants, mask_mod=mask_mod), knobs, head_dim, dtype,
                                    causal, return_lse, variants, mask_mod)
            ptx = compiled.asm["ptx"]
            rows.append(dict(shared=compiled.metadata.shared, wgmma=ptx.count("wgmma.mma_async"),
                             setmaxnreg=ptx.count("setmaxnreg"), **ptxas_report(compiled)))
    return rows


if __name__ == "__main__":
    # Without arguments the cases above; else a JSON list of cases. One JSON line per case.
    for row in report(json.loads(sys.argv[1]) if len(sys.argv) > 1 else CASES):
        print(json.dumps(dict(row, triton=triton.__version__)), flush=True)
