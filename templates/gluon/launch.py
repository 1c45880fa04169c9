"""Launcher of the Gluon forward (templates/gluon/attn_fwd.py.jinja): host tensor descriptors, grid, one
compiled launch per call signature. Needs only torch and triton."""

import torch
import triton
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

columns = None  # the module of templates/common/launch_columns.py (column_tiles), set by the loader
tma = None  # the module of templates/common/launch_tma.py (copies_over), set by the loader

GL_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}
# Under causal masking, tiles run longest first over runs of heads whose K and V fit this much of L2 (the
# H100's holds 50 MB); without it, each head's tiles together (they all do the same work).
L2_BYTES_PER_RUN = 24 << 20
REGISTERS_PER_SM = 65536  # Hopper's register file


def program_grid(knobs, tiles: int, device) -> tuple[int]:
    """One program per tile, or a persistent grid: programs_per_sm programs an SM walk the tiles."""
    if not knobs["persistent"]:
        return (tiles,)
    return (min(tiles, knobs["programs_per_sm"] * torch.cuda.get_device_properties(device).multi_processor_count),)


def launch_options(knobs) -> dict:
    """The launch's num_warps and, for more than one program an SM, each program's share of the SM's registers
    (maxnreg a thread, in the 8 a thread a warp is given them by; the consumer warpgroup gets it less the producer's
    by setmaxnreg)."""
    per_sm, threads = knobs["programs_per_sm"], 128 * (knobs["consumers"] + 1)  # the consumers and the producer
    return dict(num_warps=4, **(dict(maxnreg=REGISTERS_PER_SM // (per_sm * threads) // 8 * 8) if per_sm > 1 else {}))


def _check(q, k, v, out, lse):
    """ValueError (the caller falls back to another family) for what the kernel cannot read or write."""
    if q.dtype not in GL_DTYPES or not q.dtype == k.dtype == v.dtype == out.dtype:
        raise ValueError(f"the Gluon forward takes fp16 or bf16 q, k, v, out of one dtype; got {q.dtype}, "
                         f"{k.dtype}, {v.dtype}, {out.dtype}")
    for name, t in (("q", q), ("k", k), ("v", v), ("out", out)):
        if t.stride(-1) != 1 or t.data_ptr() % 16 or any(s * t.element_size() % 16 for s in t.stride()[:-1]):
            raise ValueError(f"TMA needs 16-byte aligned {name} with unit last stride and 16-byte strides; got "
                             f"strides {t.stride()}: pass contiguous tensors")
    if min(q.shape[2], k.shape[2]) == 0:
        raise ValueError(f"TMA descriptors need non-empty sequences; got seqlen_q {q.shape[2]}, seqlen_k {k.shape[2]}")
    if lse is not None and (lse.dtype != torch.float32 or not lse.is_contiguous()):
        raise ValueError("lse must be a contiguous fp32 (batch, heads_q, seqlen_q) tensor")


def _descriptor_maker(q, k, v, out, block_m, block_n, block_d, block_d2=0):
    """`make(q, k, v, out)`: TMA descriptors over (batch, heads, seqlen, head_dim) with each tensor's strides
    (any layout whose rows are 16-byte aligned), blocks of (1, 1, rows, block_d) for tensors shaped and
    strided like these; rows past seqlen and columns past head_dim read as 0 and are never written. With a second
    column tile (block_d2), then the same four over columns block_d.. (blocks of (1, 1, rows, block_d2)). Built
    (and checked) once here over these tensors; a call gets copies over its own (`tma.copies_over`)."""
    layout_of, made, firsts = {}, [], []
    for first, width in ((0, block_d), (block_d, block_d2)) if block_d2 else ((0, block_d),):
        for t, rows in ((q, block_m), (k, block_n), (v, block_n), (out, block_m)):
            block = [1, 1, rows, width]
            key = (rows, width, t.dtype)
            if key not in layout_of:
                layout_of[key] = gl.NVMMASharedLayout.get_default_for(block, GL_DTYPES[t.dtype])
            shape = [*t.shape[:3], t.shape[3] - first]
            made.append(TensorDescriptor(t[..., first:] if first else t, shape, list(t.stride()), block,
                                         layout_of[key]))
            firsts.append(first)
    over = tma.copies_over(made)

    def make(*tensors):
        return over(*(t[..., first:] if first else t for t, first in zip(tensors * (len(made) // 4), firsts)))
    return make


def _counter_maker(q, dynamic):
    """`counter()`: the int32 a DYNAMIC kernel claims tiles from, 0 before each launch (the kernel sets it back
    to 0 at its end), one per stream so that launches on different streams never share one; a fresh one while a
    CUDA graph is captured (the graph keeps it). `q` itself where the kernel does not read it."""
    if not dynamic:
        return lambda: q
    counters = {}

    def counter():
        if torch.cuda.is_current_stream_capturing():
            return torch.zeros(1, dtype=torch.int32, device=q.device)
        stream = torch.cuda.current_stream(q.device).stream_id
        if stream not in counters:
            counters[stream] = torch.zeros(1, dtype=torch.int32, device=q.device)
        return counters[stream]
    return counter


def forward_plan(kernels, knobs, q, k, v, out, lse, softmax_scale, causal, compile=None):
    """`forward(q, k, v, out, lse)` for every call shaped like this one (shapes, strides, dtypes, 16-byte
    alignment, lse given or None). `kernels`: the rendered module; `knobs`: the dict it was rendered from;
    `compile(kernel, grid, args, options, tensor_count)`: autoflash's compile_launch, or None for Triton's
    per-call launch. q, out: (batch, heads_q, seqlen_q, head_dim); k, v: (batch, heads_kv, seqlen_k, head_dim)."""
    _check(q, k, v, out, lse)
    batch, heads_q, seqlen_q, head_dim = q.shape
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    block_d, block_d2 = columns.column_tiles(knobs, head_dim)
    tile_m = knobs["block_m"] * knobs["consumers"]
    descriptors = _descriptor_maker(q, k, v, out, knobs["block_m"], knobs["block_n"], block_d, block_d2)
    tiles_m = triton.cdiv(seqlen_q, tile_m)
    tiles = tiles_m * batch * heads_q
    grid = program_grid(knobs, tiles, q.device)
    kv_bytes = 2 * seqlen_k * head_dim * q.element_size() * heads_kv // heads_q  # per query head
    run_heads = min(batch * heads_q, max(1, L2_BYTES_PER_RUN // kv_bytes)) if causal else 1
    counter = _counter_maker(q, knobs["dynamic"])
    per_call = (*descriptors(q, k, v, out), q if lse is None else lse, counter())
    args = (*per_call, softmax_scale, heads_q, heads_q // heads_kv, seqlen_q, seqlen_k, tiles_m, tiles, run_heads)
    options = dict(BLOCK_D=block_d, **(dict(BLOCK_D2=block_d2) if block_d2 else {}), IS_CAUSAL=bool(causal),
                   RETURN_LSE=lse is not None, **launch_options(knobs))
    tensor_count = len(per_call)
    if compile is None:
        def launch(*tensors):
            kernels.attn_fwd[grid](*tensors, *args[tensor_count:], **options)
    else:
        launch = compile(kernels.attn_fwd, grid, args, options, tensor_count)

    def forward(q, k, v, out, lse):
        launch(*descriptors(q, k, v, out), q if lse is None else lse, counter())
    return forward
