"""Packed variable-length batches: `attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, ...)`, in the layout
and with the meanings of flash-attn's `flash_attn_varlen_func`.

A batch of sequences of different lengths is packed without padding: q (total_q, heads_q, head_dim) holds every
sequence's query rows one after the other, sequence s the rows [cu_seqlens_q[s], cu_seqlens_q[s + 1]); k and v
alike with cu_seqlens_k. The kernels are the `tl` family's (on Hopper the Gluon family's), rendered with the
VARLEN gate: each program runs one (sequence, query tile) of a table the launcher builds per call
(templates/tl/launch_varlen.py, `host_tiles`; the backward's dK/dV programs, (sequence, key block)), the tiles
with the most work first, so short sequences take no padded tiles. The table is built on the host
from the lengths that the check of cu_seqlens brings there (one synchronisation the first time a pair of offsets
tensors is seen, none after while torch sees no write to them), and comes over in one copy; while a CUDA graph is
captured (no check, no values on the host) two small kernels build it on the device (`device_tiles`).

Dispatch: a call is the Problem (batch = sequences, seqlen_q/seqlen_k = max_seqlen_q/max_seqlen_k rounded up to
powers of two, variants {"VARLEN"}), tuned like a dense one (`autoflash tune` on a problems file with
`varlen: true`: autoflash/shapes.py, the trials autoflash/tune/packed.py). Dispatch takes the exact problem's
record, else the nearest tuned packed problem's, else the nearest dense problem's winner (dispatch.choose), fitted
to the varlen kernel (the table's order; pointer loads, or tma where the keys are not on pages), else the default.
"""

import weakref
from typing import Callable, NamedTuple

import numpy as np
import torch

from autoflash import checks, codegen, gpu as gpus
from autoflash.api import DISPATCHER
from autoflash.problem import Problem, length_bucket


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                     softmax_scale=None, return_lse=False, out=None):
    """Attention over packed sequences of different lengths, softmax(q kᵀ · softmax_scale) v per sequence.

    Differentiable in q, k and v (the backward recomputes P from the log-sum-exp, as `autoflash.attention`).

    Args:
        q: (total_q, heads_q, head_dim), the query rows of every sequence one after the other.
        k, v: (total_k, heads_kv, head_dim); heads_q a multiple of heads_kv (GQA/MQA). Last stride 1.
            dtype float16, bfloat16 or float32 (all three the same); head_dim 16..256.
        cu_seqlens_q, cu_seqlens_k: int32 (batch + 1,) on q's device: sequence s holds the rows
            [cu_seqlens_q[s], cu_seqlens_q[s + 1]) of q and [cu_seqlens_k[s], cu_seqlens_k[s + 1]) of k and v.
            Non-decreasing from 0 to total_q (total_k); empty sequences are allowed.
        max_seqlen_q, max_seqlen_k: the longest sequence's lengths (at least those: they choose the kernel).
        causal: per sequence, aligned bottom-right as in flash-attn: query i of a sequence sees key j when
            j <= i + seqlen_k - seqlen_q (its own lengths). Rows that see no key give 0 and lse -inf.
        softmax_scale: scale of the scores, positive; default 1 / sqrt(head_dim).
        return_lse: also return the log-sum-exp, float32 (heads_q, total_q) as flash-attn's varlen returns it.
        out: optional (total_q, heads_q, head_dim) tensor of q's dtype and device, last stride 1, written and
            returned (not differentiable: q, k, v must not require grad).

    Returns:
        out (total_q, heads_q, head_dim); with return_lse, (out, lse).

    The values of cu_seqlens are checked on the host (one synchronisation), and the kernels' tile tables built
    there from them, except while a CUDA graph is being captured (no check; the tables built on the device). They
    are read once for the same two tensors while torch sees no in-place write to them (its version counter): a
    model's layers sharing one batch's offsets synchronise once. Offsets rewritten outside torch (by a kernel of
    your own, in place) must come in new tensors.
    """
    q, k, v, host = _checked(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, return_lse, out)
    scale = checks.scale_of(softmax_scale, q.shape[-1])
    if out is not None or not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
        out = torch.empty_like(q) if out is None else out
        lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device) if return_lse else None
        _varlen_forward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
                        host)
        return (out, lse) if return_lse else out
    out, lse = _VarlenAttention.apply(q, k, v, cu_seqlens_q, cu_seqlens_k,
                                      _Call(max_seqlen_q, max_seqlen_k, causal, scale), host)
    return (out, lse) if return_lse else out


def _varlen_forward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, host):
    """packed_forward over keys at cu_seqlens_k: seqlens_k from the host values where there are some."""
    seqlens_k = None if host is not None else cu_seqlens_k[1:] - cu_seqlens_k[:-1]
    packed_forward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k[:-1], seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                   scale, host=host)


class _Call(NamedTuple):
    max_seqlen_q: int
    max_seqlen_k: int
    causal: bool
    scale: float


def packed(t):
    """A packed (tokens, heads, head_dim) tensor as the kernels' (1, heads, tokens, head_dim) view."""
    return t.permute(1, 0, 2).unsqueeze(0)


def problem_of(q, k, batch, max_seqlen_q, max_seqlen_k, causal, page_size=0) -> Problem:
    """The dispatch key of a packed call: sequences, longest lengths rounded up to powers of two (`length_bucket`),
    heads, head dim; with page_size, keys on pages of that many tokens (PAGED)."""
    return Problem(max(batch, 1), q.shape[1], k.shape[-2], length_bucket(max_seqlen_q), length_bucket(max_seqlen_k),
                   q.shape[-1], causal, str(q.dtype).removeprefix("torch."),
                   frozenset({"VARLEN", "PAGED"} if page_size else {"VARLEN"}), page_size=page_size)


# One launch per call signature (every tensor's layout and 16-byte alignment, which the compiled kernels are
# specialised on; the lengths' bounds; the flags), made at its first call.
_plans: dict = {}
_MAX_PLANS = 1024


def _layout(t):
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16)


def _cached(key, make) -> Callable:
    plan = _plans.get(key)
    if plan is None:
        if len(_plans) >= _MAX_PLANS:
            _plans.clear()
        plan = _plans[key] = make()
    return plan


def packed_forward(q, k, v, out, lse, cu_seqlens_q, starts_k, seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
                   pages=None, host=None):
    """Write out (and lse, (heads_q, total_q), unless None) of packed q (total_q, heads_q, head_dim): sequence s
    has the query rows [cu_seqlens_q[s], cu_seqlens_q[s + 1]) and seqlens_k[s] keys from row starts_k[s] of k, v
    ((rows, heads_kv, head_dim)); or with pages = (block_table, page_size, page stride of k, of v), keys on the pages
    that block_table[s] lists, k and v then the (page_size, heads_kv, head_dim) views of the caches' page 0 (the
    kernel steps from there by the page strides). host: None, or the sequences' lengths of queries and keys on
    the host (int64 numpy arrays, `host_lengths`): the tile table is built from them, and seqlens_k may be None."""
    if q.shape[0] == 0 or cu_seqlens_q.numel() < 2:
        if lse is not None:
            lse.fill_(float("-inf"))
        return
    key = ("fwd", _layout(q), _layout(k), _layout(v), _layout(out), _layout(lse), _layout(cu_seqlens_q),
           _layout(starts_k), _layout(seqlens_k), max_seqlen_q, max_seqlen_k, causal, scale, None if pages is None else (_layout(pages[0]), *pages[1:]))

    def make():
        problem = problem_of(q, k, cu_seqlens_q.numel() - 1, max_seqlen_q, max_seqlen_k, causal,
                             0 if pages is None else pages[1])
        views = tuple(packed(t) for t in (q, k, v, out))
        knobs = DISPATCHER.for_call(problem, gpus.current(q.device), "fwd", views).knobs
        return codegen.load(knobs, problem.variants).varlen_forward_plan(
            *views, None if lse is None else lse.unsqueeze(0), cu_seqlens_q, starts_k, seqlens_k, scale, causal,
            pages)
    _cached(key, make)(packed(q), packed(k), packed(v), packed(out), None if lse is None else lse.unsqueeze(0),
                       cu_seqlens_q, starts_k, seqlens_k, None if pages is None else pages[0], host)


def packed_backward(q, k, v, out, lse, dout, dlse, cu_seqlens_q, cu_seqlens_k, call: _Call, host):
    """(dq, dk, dv) of `attention_varlen`'s packed forward that returned out and lse; host: as packed_forward's."""
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if q.shape[0] == 0 or k.shape[0] == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    dout = dout if dout.stride(-1) == 1 else dout.contiguous()
    key = ("bwd", _layout(q), _layout(k), _layout(v), _layout(out), _layout(dout), _layout(dlse),
           _layout(cu_seqlens_q), _layout(cu_seqlens_k), call)

    def make():
        problem = problem_of(q, k, cu_seqlens_q.numel() - 1, call.max_seqlen_q, call.max_seqlen_k, call.causal)
        views = tuple(packed(t) for t in (q, k, v, out))
        knobs = DISPATCHER.for_call(problem, gpus.current(q.device), "bwd", views).knobs
        return codegen.load(knobs, problem.variants).varlen_backward_plan(
            *views, lse.unsqueeze(0), packed(dout), packed(dq), packed(dk), packed(dv), cu_seqlens_q, cu_seqlens_k,
            call.scale, call.causal, None if dlse is None else dlse.unsqueeze(0))
    _cached(key, make)(packed(q), packed(k), packed(v), packed(out), lse.unsqueeze(0), packed(dout), packed(dq),
                       packed(dk), packed(dv), None if dlse is None else dlse.unsqueeze(0), cu_seqlens_q, cu_seqlens_k,
                       host)
    return dq, dk, dv


class _VarlenAttention(torch.autograd.Function):
    """attention_varlen's forward and backward; saves q, k, v, out, lse, the cu_seqlens and their host values."""

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, call, host):
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device)
        _varlen_forward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, call.max_seqlen_q, call.max_seqlen_k,
                        call.causal, call.scale, host)
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
        ctx.call, ctx.host = call, host
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
        dout = torch.zeros_like(out) if dout is None else dout
        dlse = None if dlse is None else dlse.contiguous()
        return *packed_backward(q, k, v, out, lse, dout, dlse, cu_seqlens_q, cu_seqlens_k, ctx.call, ctx.host), \
            None, None, None, None


def check_offsets(name, cu_seqlens, device) -> None:
    """cu_seqlens well formed: an int32 1-D contiguous tensor on `device` (its values: `host_lengths`)."""
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1 \
            or cu_seqlens.numel() < 1:
        got = f"{cu_seqlens.dtype} of shape {tuple(cu_seqlens.shape)}" if isinstance(cu_seqlens, torch.Tensor) \
            else type(cu_seqlens).__name__
        raise TypeError(f"{name} must be an int32 tensor of shape (batch + 1,), got {got}: "
                        f"pass torch.tensor(offsets, dtype=torch.int32, device=q.device)")
    if cu_seqlens.device != device:
        raise ValueError(f"{name} is on {cu_seqlens.device}, q on {device}: move it with .to(q.device)")
    if cu_seqlens.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous, got stride {cu_seqlens.stride(0)}: pass {name}.contiguous()")


def host_lengths(cu_seqlens_q, cu_seqlens_k, total_q, total_k, max_seqlen_q, max_seqlen_k):
    """The sequences' lengths of queries and of keys on the host (int64 numpy arrays), read in one
    synchronisation, their offsets checked: non-decreasing from 0 to total, no step above max_seqlen. None while
    a CUDA graph is being captured (nothing is checked then). Remembered for these two tensor objects while torch
    sees no write to them (`read_once`): the layers of a model that share one batch's offsets read them once."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return None
    return read_once((cu_seqlens_q, cu_seqlens_k), (total_q, total_k, max_seqlen_q, max_seqlen_k),
                     lambda: _read_lengths(cu_seqlens_q, cu_seqlens_k, total_q, total_k, max_seqlen_q, max_seqlen_k))


def _read_lengths(cu_seqlens_q, cu_seqlens_k, total_q, total_k, max_seqlen_q, max_seqlen_k):
    values = torch.cat((cu_seqlens_q, cu_seqlens_k)).cpu().numpy().astype(np.int64)
    offsets = values[:cu_seqlens_q.numel()], values[cu_seqlens_q.numel():]
    for name, cu_seqlens, total, max_seqlen in (("cu_seqlens_q", offsets[0], total_q, max_seqlen_q),
                                                ("cu_seqlens_k", offsets[1], total_k, max_seqlen_k)):
        first, last, steps = int(cu_seqlens[0]), int(cu_seqlens[-1]), np.diff(cu_seqlens)
        decreasing = bool((steps < 0).any())
        if first != 0 or last != total or decreasing:
            raise ValueError(f"{name} must rise (or stay) from 0 to {total}, the packed rows; got {first} .. {last}"
                             f"{' with decreasing steps' if decreasing else ''}: offsets are cumulative lengths")
        longest = int(steps.max()) if steps.size else 0
        if longest > max_seqlen:
            raise ValueError(f"a sequence of {name} holds {longest} rows, more than max_seqlen {max_seqlen}: pass "
                             "the longest length")
    lengths = np.diff(offsets[0]), np.diff(offsets[1])
    for array in lengths:
        array.flags.writeable = False  # shared by every call that remembers them
    return lengths


# What read_once read, by the identity of the offsets' tensors: (weak references to them, their state, the
# lengths). A tensor's state is torch's version counter (bumped by every in-place write torch makes, through any
# view) and its address; inference tensors have no counter and are read at every call.
_read: dict = {}
_MAX_READ = 16


def read_once(tensors, arguments, read):
    """read() once for these tensor objects while unchanged, with these other arguments; else read() again
    (host values that cost a synchronisation: the offsets here, a KV cache's lengths and block table)."""
    try:
        state = tuple((t._version, t.data_ptr()) for t in tensors) + tuple(arguments)
    except RuntimeError:  # an inference tensor: no version counter
        return read()
    key = tuple(map(id, tensors))
    hit = _read.get(key)
    if hit is not None and all(ref() is t for ref, t in zip(hit[0], tensors)) and hit[1] == state:
        return hit[2]
    value = read()
    if len(_read) >= _MAX_READ:
        _read.pop(next(iter(_read)))
    _read[key] = (tuple(map(weakref.ref, tensors)), state, value)
    return value


def checked_packed(q, k, v):
    """q, k, v checked as `autoflash.attention` checks its inputs (autoflash/checks.py), as 3-D packed
    (tokens, heads, head_dim) tensors that may hold no rows; returned with unit last stride."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if isinstance(t, torch.Tensor) and t.dim() != 3:
            raise ValueError(f"{name} must be 3-D (total_tokens, heads, head_dim), got shape {tuple(t.shape)}: "
                             "pack the sequences one after the other")
    # The checks see one row of each (they refuse empty keys, which packed sequences allow).
    checks.checked(*(t[:1].unsqueeze(0) if not isinstance(t, torch.Tensor) or t.shape[0]
                     else t.new_zeros((1, 1, *t.shape[1:])) for t in (q, k, v)))
    if q.device.type == "cpu" and not gpus.interpreting():
        raise ValueError("q, k, v are on the CPU: move them to a CUDA GPU, or set TRITON_INTERPRET=1 before "
                         "importing autoflash to run the kernels in Triton's (slow) interpreter")
    if q.dtype == torch.bfloat16 and gpus.interpreting():
        raise TypeError("Triton's interpreter computes bfloat16 products wrongly (Triton 3.9): pass float16 or "
                        "float32 tensors on the CPU, or run on a GPU")
    return tuple(t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))


def _checked(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, return_lse, out):
    q, k, v = checked_packed(q, k, v)
    checks.check_flags(causal=causal, return_lse=return_lse)
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise TypeError(f"{name} must be a non-negative int, got {value!r}")
    check_offsets("cu_seqlens_q", cu_seqlens_q, q.device)
    check_offsets("cu_seqlens_k", cu_seqlens_k, q.device)
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must have one entry per sequence plus one, got "
                         f"{cu_seqlens_q.numel()} and {cu_seqlens_k.numel()}")
    if out is not None:
        checks.checked_out(out, q)
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            raise RuntimeError("attention_varlen(..., out=...) is not differentiable, and q, k or v requires grad: "
                               "leave out=None, or call under torch.no_grad()")
    return q, k, v, host_lengths(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], max_seqlen_q, max_seqlen_k)
