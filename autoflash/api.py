"""The public entry point: `attention(q, k, v, causal=..., softmax_scale=..., return_lse=..., out=...)`.

jit kernels (rendered from templates/<family>/) -> their plans (`forward_plan`, `backward_plan` of a
`codegen.Variant`, from the family's launcher: compiled once, then started directly, autoflash/launch.py)
-> `_Attention`, an autograd.Function -> `attention`, which checks inputs and chooses the variants
(autoflash/dispatch.py) once per call signature. `attention_forward` and `attention_backward` run the same plans
outside autograd: they are the kernels of the custom ops that torch.compile traces
(autoflash/integrations/torch_ops.py) and of SDPA's flash ops (autoflash/integrations/sdpa.py)."""

from typing import Callable, NamedTuple

import torch

from autoflash import checks, codegen, gpu as gpus, graphs
from autoflash.dispatch import Dispatcher
from autoflash.mask_mod import MaskMod, as_mask_mod
from autoflash.score_mod import ScoreMod, as_score_mod
from autoflash.problem import Problem


# The variant arguments' defaults: a call that leaves them is plain, known by identity on the hot path. (softcap's
# is None, not flash-attn's 0.0, which means the same: torch.compile traces a float default as a symbolic float,
# and a custom op's float argument then makes it trace the graph twice.)
_NO_WINDOW, _NO_SOFTCAP = (-1, -1), None


def attention(q, k, v, *, causal=False, softmax_scale=None, window_size=_NO_WINDOW, softcap=_NO_SOFTCAP,
              alibi_slopes=None, mask_mod=None, score_mod=None, return_lse=False, deterministic=False, out=None):
    """Scaled dot-product attention, softmax(q kᵀ · softmax_scale) v, by a generated FlashAttention kernel.

    Differentiable: when q, k or v requires grad, the forward keeps the log-sum-exp (not the
    probabilities) and the backward kernels recompute P from it (FlashAttention-2).

    Args:
        q: (batch, heads_q, seqlen_q, head_dim), as in torch's scaled_dot_product_attention.
        k, v: (batch, heads_kv, seqlen_k, head_dim); heads_q must be a multiple of heads_kv
            (GQA/MQA: query head h reads KV head h // (heads_q // heads_kv); K/V are not repeated).
            Any strides work as long as the last one is 1, so (batch, seqlen, heads, head_dim) tensors
            can be passed as `.transpose(1, 2)` views without a copy. A tensor whose last stride is
            not 1 is copied to a contiguous one first.
            dtype float16, bfloat16 or float32 (all three the same); head_dim 16..256, any value.
        causal: mask keys after the query, aligned bottom-right as in FlashAttention-2: query i sees
            key j when j <= i + seqlen_k - seqlen_q. With seqlen_q > seqlen_k the first
            seqlen_q - seqlen_k queries see no key: their output is 0 and their lse is -inf.
        softmax_scale: scale of the scores, positive; default 1 / sqrt(head_dim).
        window_size: (left, right), flash-attn's sliding window: query i sees key j when
            i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right; -1 leaves that side
            unbounded (default (-1, -1): no window). causal=True sets right to 0. Key blocks outside the
            window are skipped: a window of w keys costs about w / seqlen_k of full attention. A query that
            sees no key gets output 0 and lse -inf.
        softcap: flash-attn's logit softcapping (Gemma 2): the scaled scores s become softcap·tanh(s / softcap)
            before the softmax; None (default) or 0.0 leaves them as they are. Must be finite and >= 0.
        alibi_slopes: flash-attn's ALiBi: a float32 tensor of shape (heads_q,) or (batch, heads_q) on q's
            device; adds -slope·|i + seqlen_k - seqlen_q - j| to the scores (after the softcap). The slopes
            are data: no gradient flows to them.
        mask_mod: FlexAttention's mask_mod, a function mod(b, h, q_idx, kv_idx) -> bool that says which pairs
            attend (beside causal masking, which applies too), or autoflash.MaskMod(mod, *tensors) for a mod that
            reads tensors, passed as its parameters after kv_idx (1-D int32/int64 on q's device, e.g. each token's
            document id): autoflash/mask_mod.py says what a mod may hold. Its source is rendered into the kernels;
            key blocks it masks whole are skipped and those it leaves whole run without a mask (a block table
            computed on the device once per captures and again when torch sees them change in place; inside your
            own CUDA graph at every replay: captures rewritten in place by a kernel of your own must come in new
            tensors). Not with window_size (write the window into the mod), nor under torch.compile.
        score_mod: FlexAttention's score_mod, a function mod(score, b, h, q_idx, kv_idx) -> score applied to
            every scaled score (natural units, after softcap and ALiBi, before the masks), or
            autoflash.ScoreMod(mod, *tensors) for a mod that reads tensors (1-D int32/int64/float32 on q's
            device, e.g. a slope per head): autoflash/score_mod.py says what a mod may hold. Rendered into the
            kernels with its derivative, which autoflash takes from its source for the backward; no gradient
            flows to its tensors. Combines with every other argument; not under torch.compile.
        return_lse: also return the log-sum-exp of the scaled scores (differentiable too).
        deterministic: the backward computes dQ in its own pass instead of with atomics, so that
            gradients are bitwise the same on every run.
        out: optional (batch, heads_q, seqlen_q, head_dim) tensor of q's dtype and device, last stride 1,
            that the output is written into and returned (no allocation: buffers reused across calls,
            static outputs in CUDA graphs). It must not share memory with q, k or v (their byte ranges
            may not intersect), nor with itself (no expanded views), and must not require grad. Not
            differentiable: with out given, q, k and v must not require grad (or call under torch.no_grad()).

    Returns:
        out, shaped and laid out like q (or the given out); with return_lse, (out, lse) where lse is
        float32 (batch, heads_q, seqlen_q), natural log.
    """
    if torch.compiler.is_compiling():
        return _traced(q, k, v, causal, softmax_scale, return_lse, deterministic, out,
                       _Variants(window_size, softcap, alibi_slopes, mask_mod, score_mod))
    variants = PLAIN if window_size is _NO_WINDOW and softcap is _NO_SOFTCAP and alibi_slopes is None \
        and mask_mod is None and score_mod is None \
        else _Variants(window_size, softcap, alibi_slopes, as_mask_mod(mask_mod), as_score_mod(score_mod))
    plan, addresses = _cached_plan(q, k, v, out, causal, softmax_scale, return_lse, deterministic, variants)
    return plan.run(q, k, v, out, addresses, variants.tensors())


class _Variants(NamedTuple):
    """attention's variant arguments as the caller passed them (checked when a plan is made)."""
    window_size: tuple = _NO_WINDOW
    softcap: float | None = _NO_SOFTCAP
    alibi_slopes: torch.Tensor | None = None
    mask_mod: MaskMod | None = None
    score_mod: ScoreMod | None = None

    def tensors(self) -> tuple:
        """The per-call tensors the kernels read (their order in the launcher's `variant`): ALiBi's slopes, the
        score_mod's captures, the mask_mod's."""
        slopes = () if self.alibi_slopes is None else (self.alibi_slopes,)
        if self.score_mod is None and self.mask_mod is None:  # every plain call: no generator on the hot path
            return slopes
        return (*slopes, *(t for mod in (self.score_mod, self.mask_mod) if mod is not None for t in mod.captures))

    def with_tensors(self, tensors) -> "_Variants":
        """These variants with a call's tensors (in `tensors()`'s order)."""
        slopes = tensors[:1] if self.alibi_slopes is not None else ()
        scored = len(slopes) + (0 if self.score_mod is None else len(self.score_mod.captures))
        score_mod = self.score_mod and self.score_mod.with_captures(tensors[len(slopes):scored])
        mask_mod = self.mask_mod and self.mask_mod.with_captures(tensors[scored:])
        return self._replace(alibi_slopes=slopes[0] if slopes else None, mask_mod=mask_mod, score_mod=score_mod)

    def key(self) -> tuple:
        slopes = self.alibi_slopes
        return (self.window_size.__class__, self.window_size, self.softcap.__class__, self.softcap,
                None if slopes is None else (slopes.shape, slopes.stride(), slopes.dtype, slopes.get_device(),
                                             slopes.data_ptr() & 15),
                *(None if mod is None else (mod.rendered, *((t.shape, t.dtype, t.get_device(), t.data_ptr() & 15)
                                                            for t in mod.captures))
                  for mod in (self.mask_mod, self.score_mod)))


PLAIN = _Variants()


def attention_forward(q, k, v, causal, softmax_scale, deterministic, window_size=_NO_WINDOW, softcap=_NO_SOFTCAP,
                      alibi_slopes=None, mask_mod=None, score_mod=None):
    """(out, lse) of `attention(q, k, v, causal=..., softmax_scale=..., return_lse=True, deterministic=...,
    window_size=..., softcap=..., alibi_slopes=..., mask_mod=..., score_mod=...)`, never recorded by autograd; q, k,
    v must have last stride 1 (as `_checked` leaves them)."""
    variants = _Variants(window_size, softcap, alibi_slopes, as_mask_mod(mask_mod), as_score_mod(score_mod))
    plan = _cached_plan(q, k, v, None, causal, softmax_scale, True, deterministic, variants)[0]
    return plan.forward(q, k, v, variants.tensors())


def attention_backward(dout, q, k, v, out, lse, dlse, causal, softmax_scale, deterministic, window_size=_NO_WINDOW,
                       softcap=_NO_SOFTCAP, alibi_slopes=None, mask_mod=None, score_mod=None):
    """(dq, dk, dv) of the call `attention_forward(q, k, v, causal, softmax_scale, deterministic, ...)` that
    returned out and lse, given dout and dlse (None: lse was not used); dq, dk, dv are laid out like q, k, v. out
    and lse may also be another attention's over more keys that these are part of (ring attention's merged ones)."""
    variants = _Variants(window_size, softcap, alibi_slopes, as_mask_mod(mask_mod), as_score_mod(score_mod))
    plan = _cached_plan(q, k, v, None, causal, softmax_scale, True, deterministic, variants)[0]
    return plan.backward(q, k, v, out, lse, dout, dlse, variants.tensors())


class _Plan(NamedTuple):
    """What one call signature runs: `run(q, k, v, out, addresses, extra)` is attention's call (addresses as
    `checks.addresses` gives them, extra the call's variant tensors: `_Variants.tensors`); `forward(q, k, v, extra)
    -> (out, lse)` and `backward(q, k, v, out, lse, dout, dlse, extra) -> (dq, dk, dv)` run outside autograd, on
    q, k, v of last stride 1."""
    run: Callable
    forward: Callable
    backward: Callable


# The hot path: a call whose shapes, strides, dtypes, devices, alignment and arguments were seen
# before runs its plan (checked inputs, chosen kernels, scale) without checking or choosing again.
_plans: dict = {}
_MAX_PLANS = 4096


def _cached_plan(q, k, v, out, causal, softmax_scale, return_lse, deterministic,
                 variants: _Variants = PLAIN) -> tuple[_Plan, tuple]:
    """The plan of this call signature, made at its first call, and the call's addresses."""
    try:
        addresses = checks.addresses(q, k, v, out)
        key = _call_key(q, k, v, out, addresses, causal, softmax_scale, return_lse, deterministic)
        if variants is not PLAIN:
            key += variants.key()
        plan = _plans.get(key)
    except (AttributeError, TypeError):  # not tensors, or an unhashable argument: _plan raises what is wrong
        key, plan = None, None
    if plan is None:
        plan = _plan(q, k, v, out, causal, softmax_scale, return_lse, deterministic, variants)
        if key is not None:
            if len(_plans) >= _MAX_PLANS:
                _plans.clear()
            _plans[key] = plan
    return plan, addresses


def _traced(q, k, v, causal, softmax_scale, return_lse, deterministic, out, variants: _Variants):
    """attention as torch.compile traces it: one custom op, autoflash::attention_forward, whose autograd
    formula is autoflash::attention_backward (autoflash/integrations/torch_ops.py registers both)."""
    if out is not None:
        raise ValueError("attention(..., out=...) is not supported under torch.compile: leave out=None "
                         "(the compiled graph allocates and reuses its own buffers)")
    for name in ("mask_mod", "score_mod"):
        if getattr(variants, name) is not None:
            raise ValueError(f"attention(..., {name}=...) is not supported under torch.compile yet: call it outside "
                             "the compiled region (torch.compiler.disable)")
    q, k, v = _checked(q, k, v)
    out, lse = torch.ops.autoflash.attention_forward(q, k, v, causal, softmax_scale, deterministic,
                                                     *checks.checked_window(variants.window_size),
                                                     checks.checked_softcap(variants.softcap),
                                                     checks.checked_slopes(variants.alibi_slopes, q))
    return (out, lse) if return_lse else out


def _call_key(q, k, v, out, addresses, causal, softmax_scale, return_lse, deterministic) -> tuple:
    # get_device() (an int) is cheaper than .device; a CPU tensor gives -1. Each tensor's 16-byte alignment
    # is its own entry: the compiled kernel a plan launches is specialised on it.
    key = (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype, v.dtype,
           q.get_device(), k.get_device(), v.get_device(), addresses[0] & 15, addresses[1] & 15, addresses[2] & 15,
           causal.__class__, causal, softmax_scale.__class__, softmax_scale, return_lse.__class__, return_lse,
           deterministic.__class__, deterministic)
    if out is None:
        return key
    return key + (out.shape, out.stride(), out.dtype, out.get_device(), addresses[3] & 15)


def _plan(q, k, v, out, causal, softmax_scale, return_lse, deterministic, variants: _Variants) -> _Plan:
    """Check the inputs and compile the forward kernel once (the backward's at the first backward);
    return what runs every such call."""
    q_checked, k_checked, v_checked = _checked(q, k, v)
    copies = tuple(t.stride(-1) != 1 for t in (q, k, v))
    needs_copy = any(copies)
    checks.check_flags(causal=causal, return_lse=return_lse, deterministic=deterministic)
    window = checks.checked_window(variants.window_size)
    softcap = checks.checked_softcap(variants.softcap)
    slopes = checks.checked_slopes(variants.alibi_slopes, q)
    mod, score_mod = variants.mask_mod, variants.score_mod
    if mod is not None:
        checks.check_mask_mod(mod, window, q)
    if score_mod is not None:
        checks.check_captures(score_mod, q)
    check_out = None if out is None else checks.out_checker(q, k, v, checks.checked_out(out, q_checked))
    scale = checks.scale_of(softmax_scale, q.shape[-1])
    if q.dtype == torch.bfloat16 and gpus.interpreting():
        return _in_float32(check_out, causal, softmax_scale, return_lse, deterministic, variants)
    forward = training_forward = _no_launch
    launch_backward = None
    if q.numel():
        problem = Problem.from_tensors(q_checked, k_checked, causal, window, softcap > 0, slopes is not None,
                                       "" if mod is None else mod.fingerprint(),
                                       "" if score_mod is None else score_mod.fingerprint()
                                       ).with_mods(mod, score_mod)  # (tuning on first use times them)
        gpu = gpus.current(q.device)
        # The window's right bound of 0 is causal masking: problem.causal says whether the kernels mask so.
        mask, gates = problem.causal, problem.gates()
        rendered = (mod and mod.rendered, score_mod and score_mod.rendered)
        variant_args = checks.variant_args(mask, problem.window, problem.seqlen_q, problem.seqlen_k, softcap, slopes,
                                           mod, score_mod)
        # The plan is compiled for the strides and alignment of this call's output (and lse): each call's are the same.
        out_like = torch.empty_like(q_checked) if out is None else out
        lse_like = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device) if return_lse else None
        tensors = (q_checked, k_checked, v_checked, out_like)
        variant = codegen.load(_chosen(problem, gpu, "fwd", tensors).knobs, gates, *rendered)

        def replayed(plan, direction, buffer_bytes):  # (small passes, whose host time is longer than their GPU time,
            # replay CUDA graphs: autoflash/graphs.py)
            return graphs.replayed(plan, direction, problem.flops(direction), buffer_bytes) if q.is_cuda else plan
        forward = replayed(variant.forward_plan(q_checked, k_checked, v_checked, out_like, lse_like, scale, mask,
                                                variant=variant_args), "fwd", 0)
        training_forward = forward if return_lse else _built_at_first_call(
            lambda q, k, v, out, lse, *extra: replayed(variant.forward_plan(q, k, v, out, lse, scale, mask,
                                                                            variant=variant_args), "fwd", 0))
        launch_backward = _built_at_first_call(lambda *args: _backward_launcher(
            codegen.load(_chosen(problem, gpu, "bwd", tensors, deterministic).knobs, gates, *rendered), scale, mask,
            variant_args, replayed=lambda plan: replayed(plan, "bwd", 3 * q.numel() * q.element_size())))

    def forward_with_lse(q, k, v, extra=()):
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
        training_forward(q, k, v, out, lse, *extra)
        return out, lse

    def backward(q, k, v, out, lse, dout, dlse, extra=()):
        if launch_backward is None:  # no query rows: nothing flows back
            return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dout = torch.zeros_like(out) if dout is None else dout
        dlse = None if dlse is None else dlse.contiguous()
        launch_backward(q, k, v, out, lse.contiguous(), dout, dq, dk, dv, dlse, *extra)
        return dq, dk, dv

    def run(q, k, v, out, addresses, extra=()):
        if out is not None:
            check_out(q, k, v, out, addresses)
        if needs_copy:
            q, k, v = (t.contiguous() if copy else t for t, copy in zip((q, k, v), copies))
        if out is None:
            if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
                out, lse = _Attention.apply(q, k, v, plan, *extra)
                return (out, lse) if return_lse else out
            out = torch.empty_like(q)
        if return_lse:
            lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
            forward(q, k, v, out, lse, *extra)
            return out, lse
        forward(q, k, v, out, None, *extra)
        return out
    plan = _Plan(run, forward_with_lse, backward)
    return plan


def _tma_readable(t: torch.Tensor) -> bool:
    """Whether TMA can read t as it is (a unit last stride, 16-byte aligned strides and address): else the backward
    reads its contiguous copy. For out and dout, what the backward reads besides q, k, v (which dispatch checked),
    laid out as every family's kernels take them (the Gluon backward loads O and dO by TMA)."""
    return t.stride(-1) == 1 and gpus.tma_aligned(t)


def _chosen(problem: Problem, gpu: gpus.Gpu, direction: str, tensors, deterministic: bool = False):
    """DISPATCHER.for_call, once `problem` is tuned on first use where that is on (autoflash/tune/on_miss.py): the
    forward of a differentiable call with its backward, which will follow."""
    from autoflash.tune import on_miss  # at a call signature's first call only: never on the hot path

    differentiable = torch.is_grad_enabled() and any(t.requires_grad for t in tensors[:3])
    on_miss.settle(DISPATCHER, problem, gpu, ("fwd", "bwd") if direction == "fwd" and differentiable else (direction,))
    return DISPATCHER.for_call(problem, gpu, direction, tensors, deterministic)


def _in_float32(check_out, causal, softmax_scale, return_lse, deterministic, variants: _Variants) -> _Plan:
    """The plan for bfloat16 under Triton's interpreter, whose tl.dot on bfloat16 is wrong (Triton 3.9):
    attention of float32 copies, cast back to bfloat16 (lse stays float32). `run` is differentiable through
    the casts: gradients flow back as bfloat16. `out` is filled by a copy."""

    def run(q, k, v, out, addresses, extra=()):
        if out is not None:
            check_out(q, k, v, out, addresses)
        result = attention(q.float(), k.float(), v.float(), causal=causal, softmax_scale=softmax_scale,
                           **variants.with_tensors(extra)._asdict(), return_lse=return_lse,
                           deterministic=deterministic)
        result_out, lse = result if return_lse else (result, None)
        result_out = result_out.to(torch.bfloat16) if out is None else out.copy_(result_out)
        return (result_out, lse) if return_lse else result_out

    def forward(q, k, v, extra=()):
        out, lse = attention_forward(q.float(), k.float(), v.float(), causal, softmax_scale, deterministic,
                                     *variants.with_tensors(extra))
        return out.to(torch.bfloat16), lse

    def backward(q, k, v, out, lse, dout, dlse, extra=()):
        dout = None if dout is None else dout.float()
        grads = attention_backward(dout, q.float(), k.float(), v.float(), out.float(), lse, dlse, causal,
                                   softmax_scale, deterministic, *variants.with_tensors(extra))
        return tuple(g.to(torch.bfloat16) for g in grads)
    return _Plan(run, forward, backward)


def _no_launch(q, k, v, out, lse):
    """The forward of a call with no query rows: nothing to compute."""


def _built_at_first_call(build):
    """f(*args) = build(*args)(*args), with build run at the first call only: what a caller never uses
    (the backward, the forward that writes the lse for it) is never chosen or compiled."""
    built = []

    def f(*args):
        if not built:
            built.append(build(*args))
        return built[0](*args)
    return f


def _backward_launcher(variant: codegen.Variant, scale: float, causal: bool, variant_args: dict | None,
                       replayed: Callable = lambda plan: plan):
    """backward(q, k, v, out, lse, dout, dq, dk, dv, dlse, *extra) for one call signature of attention (its variant
    arguments `variant_args`, `checks.variant_args`; extra: the call's variant tensors): a plan for each
    layout of out (fresh from the forward, or a slice of a larger output: ring attention's steps) and of the
    incoming gradients (dout's strides, dtype and alignment; dlse's presence and alignment), made at its first
    call. q, k, v are laid out and aligned as the signature's; lse is contiguous; dq, dk, dv are fresh. An out or
    dout that TMA cannot read (out.sum()'s gradient is a broadcast; attention_backward's out may be a slice of a
    merged output: ring attention's) is copied contiguous first: which, the layout's key decides once. `replayed`:
    what a plan runs as where nothing is copied (a copy's address is new every call): graphs.replayed's."""
    plans = {}

    def backward(q, k, v, out, lse, dout, dq, dk, dv, dlse, *extra):
        key = (out.stride(), out.dtype, out.data_ptr() & 15, dout.stride(), dout.dtype, dout.data_ptr() & 15,
               None if dlse is None else dlse.data_ptr() & 15)
        copy_out, copy_dout, plan = plans.get(key) or (not _tma_readable(out), not _tma_readable(dout), None)
        out = out.contiguous() if copy_out else out
        dout = dout.contiguous() if copy_dout else dout
        if plan is None:
            plan = variant.backward_plan(q, k, v, out, lse, dout, dq, dk, dv, scale, causal, dlse, variant=variant_args)
            if not (copy_out or copy_dout):
                plan = replayed(plan)
            plans[key] = (copy_out, copy_dout, plan)
        plan(q, k, v, out, lse, dout, dq, dk, dv, dlse, *extra)
    return backward


class _Attention(torch.autograd.Function):
    """Forward and backward of one call signature's plan; saves q, k, v, out, lse and the call's variant tensors
    (ALiBi's slopes: no gradient)."""

    @staticmethod
    def forward(ctx, q, k, v, plan, *extra):
        out, lse = plan.forward(q, k, v, extra)
        ctx.save_for_backward(q, k, v, out, lse, *extra)
        ctx.plan = plan
        ctx.set_materialize_grads(False)  # an unused output's gradient arrives as None, not zeros
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, *extra = ctx.saved_tensors
        return *ctx.plan.backward(q, k, v, out, lse, dout, dlse, tuple(extra)), None, *(None for _ in extra)


DISPATCHER = Dispatcher()


def explain(q, k, v, *, causal=False, deterministic=False, window_size=_NO_WINDOW, softcap=_NO_SOFTCAP,
            alibi_slopes=None, mask_mod=None, score_mod=None) -> str:
    """Which forward and backward variants `attention(q, k, v, causal=causal, ...)` runs, where they come
    from and why. Lines of the backward start with 'bwd', those of the forward with 'fwd'."""
    from autoflash.tune import on_miss

    q, k, v = _checked(q, k, v)
    slopes = checks.checked_slopes(alibi_slopes, q)
    mods = (as_mask_mod(mask_mod), as_score_mod(score_mod))
    problem = Problem.from_tensors(q, k, causal, checks.checked_window(window_size),
                                   checks.checked_softcap(softcap) > 0, slopes is not None,
                                   *("" if mod is None else mod.fingerprint() for mod in mods))
    gpu = gpus.current(q.device)
    lines = [f"problem:     {problem.label()} ({problem.key()})", f"gpu:         {gpu.name} (family {gpu.family})"]
    for direction in ("fwd", "bwd"):
        choice = DISPATCHER.for_call(problem, gpu, direction, (q, k, v), deterministic)
        lines += [f"{direction} source:  {choice.source}", f"{direction} why:     {choice.reason}"]
        if choice.tuned:
            rate = choice.tuned.problem.tflops(direction, choice.tuned.median_ms)
            lines.append(f"{direction} tuned:   {choice.tuned.problem.label()} at {choice.tuned.median_ms:.4f} ms"
                         + (f", {rate:.1f} TFLOP/s" if rate else ""))
        if not choice.tuned or choice.tuned.problem != problem:
            why = DISPATCHER.why_untuned(problem, gpu, direction)
            if why:
                running = "the default" if choice.tuned is None else "the nearest tuned problem's variant"
                lines.append(f"{direction} tuned:   {why}; running {running}")
        if on_miss_note := on_miss.outcome(DISPATCHER, problem, gpu, direction):
            lines.append(f"{direction} on-miss: {on_miss_note}")
        lines.append(f"{direction} knobs:   {choice.knobs.to_json()}")
    return "\n".join(lines)


def _checked(q, k, v):
    """Validate q, k, v (autoflash/checks.py) and where they run; return them with unit last stride."""
    q, k, v = checks.checked(q, k, v)
    if q.device.type == "cpu" and not gpus.interpreting():
        raise ValueError("q, k, v are on the CPU: move them to a CUDA GPU, or set TRITON_INTERPRET=1 before "
                         "importing autoflash to run the kernels in Triton's (slow) interpreter")
    if gpus.interpreting() and not gpus.triton_interprets():
        raise RuntimeError("TRITON_INTERPRET=1 was set after Triton was imported (import autoflash imports it), and "
                           "Triton reads it at import: set it before, in the shell (TRITON_INTERPRET=1 python ...) "
                           "or with os.environ at the top of the script, before any import of autoflash or triton")
    return q, k, v
