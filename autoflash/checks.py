"""The checks of `attention`'s arguments, needing only torch: autoflash.attention runs them, and exported
packages carry a copy (`_checks.py`), so that both refuse the same inputs with the same one-line errors."""

import hashlib
import math
import numbers

import torch

MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def checked(q, k, v):
    """Validate q, k, v and return them with unit last stride."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, heads, seqlen, head_dim), got shape {tuple(t.shape)}; "
                             "for (batch, seqlen, heads, head_dim) tensors pass t.transpose(1, 2)")
        if t.dtype not in DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; autoflash supports float16, bfloat16 and float32")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}: cast them with .to()")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if q.shape[0] != k.shape[0] or k.shape[0] != v.shape[0]:
        raise ValueError(f"batch sizes differ: q {q.shape[0]}, k {k.shape[0]}, v {v.shape[0]}")
    if not q.shape[3] == k.shape[3] == v.shape[3]:
        raise ValueError(f"head dims differ: q {q.shape[3]}, k {k.shape[3]}, v {v.shape[3]}")
    if k.shape[1:3] != v.shape[1:3]:
        raise ValueError(f"k and v must have the same heads and length, got k {tuple(k.shape)}, v {tuple(v.shape)}")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(f"heads_q ({q.shape[1]}) must be a multiple of heads_kv ({k.shape[1]}) for GQA/MQA")
    if k.shape[2] == 0:
        raise ValueError("k and v hold no keys (seqlen_k = 0): attention needs at least one")
    if not MIN_HEAD_DIM <= q.shape[3] <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim {q.shape[3]} is outside the supported {MIN_HEAD_DIM}..{MAX_HEAD_DIM}")
    return tuple(t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))


def check_flags(**flags) -> None:
    """Each of `flags` (causal, return_lse, deterministic) is a bool."""
    for name, flag in flags.items():
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {_shown(flag)}")


def _shown(value) -> str:
    """`value` in an error message: its repr where that is short and one line, else its type."""
    text = repr(value)
    return text if len(text) <= 60 and "\n" not in text else f"a {type(value).__name__}"


def scale_of(softmax_scale, head_dim: int) -> float:
    """The scale of the scores: `softmax_scale` (any positive real number), default 1 / sqrt(head_dim)."""
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    # Any real number (numpy scalars included), but not a bool, a string or a tensor.
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real):
        raise TypeError(f"softmax_scale must be a number or None, got {type(softmax_scale).__name__}")
    try:
        scale = float(softmax_scale)
    except OverflowError:  # an int too large for a float
        scale = math.inf
    if not (math.isfinite(scale) and scale > 0):
        # The kernels mask scores to -inf before scaling them: a scale of 0 or below would turn masks into nan or +inf.
        raise ValueError(f"softmax_scale must be positive and finite, got {softmax_scale}")
    return scale


def addresses(q, k, v, out) -> tuple:
    """The data pointers of q, k, v (and out), read once per call: for the key's alignment and out's overlap check."""
    if out is None:
        return q.data_ptr(), k.data_ptr(), v.data_ptr()
    return q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr()


def checked_out(out, q):
    """`out` if it is a valid output for q (shape, dtype, device, layout), else the error that says why."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor or None, got {type(out).__name__}")
    if out.shape != q.shape:
        raise ValueError(f"out must be shaped like q, {tuple(q.shape)}, got {tuple(out.shape)}")
    if out.dtype != q.dtype or out.device != q.device:
        raise TypeError(f"out must have q's dtype and device ({q.dtype} on {q.device}), "
                        f"got {out.dtype} on {out.device}")
    if out.stride(-1) != 1:
        raise ValueError(f"out must have last stride 1, got strides {out.stride()}: pass a contiguous tensor "
                         "or a .transpose(1, 2) view of one")
    if overlaps_itself(out):
        raise ValueError(f"out has elements that share memory (shape {tuple(out.shape)}, strides {out.stride()}; "
                         "an expanded view?): pass a tensor of its own, such as torch.empty_like(q)")
    return out


def overlaps_itself(t) -> bool:
    """Whether two elements of `t` may share memory: sorted by stride, each dimension's stride must step past
    everything the smaller ones reach (exact for every layout torch makes by views, transposes and slicing)."""
    reach = 0
    for stride, size in sorted((s, n) for s, n in zip(t.stride(), t.shape) if n > 1):
        if stride <= reach:
            return True
        reach += (size - 1) * stride
    return False


def byte_span(t) -> int:
    """Bytes from t's first element to just past its last (strides are never negative in torch)."""
    return (sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1) * t.element_size() if t.numel() else 0


def out_checker(q, k, v, out):
    """check(q, k, v, out, addresses), run by every call into `out` of one signature: it refuses an out that
    requires grad, or shares bytes with q, k or v (the kernel would overwrite what it still reads), and a call
    that needs gradients. The byte spans follow from the signature's shapes and strides: per call, the check
    compares the call's pointers (read once for the key too) with a few integer operations."""
    q_span, k_span, v_span, out_span = (byte_span(t) for t in (q, k, v, out))

    def check(q, k, v, out, addresses):
        if out.requires_grad:
            raise ValueError("out requires grad, and attention writes into it in place: pass a tensor that does "
                             "not, such as torch.empty_like(q)")
        q_at, k_at, v_at, start = addresses
        end = start + out_span  # [start, end) meets [t_at, t_at + span) when start - span < t_at < end
        if start - q_span < q_at < end or start - k_span < k_at < end or start - v_span < v_at < end:
            name = "q" if start - q_span < q_at < end else "k" if start - k_span < k_at < end else "v"
            raise ValueError(f"out overlaps {name} in memory, and the kernel would overwrite {name} while reading "
                             "it: pass a separate output tensor, such as torch.empty_like(q)")
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            raise RuntimeError("attention(..., out=...) is not differentiable, and q, k or v requires grad: "
                               "leave out=None, or call under torch.no_grad()")
    return check


def checked_window(window_size) -> tuple[int, int]:
    """flash-attn's window_size: (left, right) integers, each -1 (unbounded) or at least 0."""
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2 or \
            any(isinstance(w, bool) or not isinstance(w, numbers.Integral) for w in window_size):
        raise TypeError(f"window_size must be a pair of integers (left, right), -1 for unbounded, got "
                        f"{_shown(window_size)}")
    left, right = (int(w) for w in window_size)
    if left < -1 or right < -1:
        raise ValueError(f"window_size {(left, right)}: each side must be -1 (unbounded) or a number of keys >= 0")
    return left, right


def checked_softcap(softcap) -> float:
    """flash-attn's softcap: a finite number >= 0; None or 0: off (0.0)."""
    if softcap is None:
        return 0.0
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap must be a number (0.0: off), got {_shown(softcap)}")
    cap = float(softcap)
    if not 0 <= cap < math.inf:  # (nan fails too)
        raise ValueError(f"softcap must be finite and >= 0 (0.0: off), got {softcap}")
    return cap


def checked_slopes(alibi_slopes, q):
    """flash-attn's alibi_slopes for q: None, or a float32 tensor of shape (heads_q,) or (batch, heads_q) on q's
    device with last stride 1."""
    if alibi_slopes is None:
        return None
    if not isinstance(alibi_slopes, torch.Tensor):
        raise TypeError(f"alibi_slopes must be a torch.Tensor or None, got {type(alibi_slopes).__name__}")
    batch, heads_q = q.shape[:2]
    if tuple(alibi_slopes.shape) not in ((heads_q,), (batch, heads_q)):
        raise ValueError(f"alibi_slopes must have shape ({heads_q},) or ({batch}, {heads_q}) (heads_q, or batch x "
                         f"heads_q), got {tuple(alibi_slopes.shape)}")
    if alibi_slopes.dtype != torch.float32 or alibi_slopes.device != q.device:
        raise TypeError(f"alibi_slopes must be float32 on q's device ({q.device}), got {alibi_slopes.dtype} on "
                        f"{alibi_slopes.device}: pass alibi_slopes.to(q.device, torch.float32)")
    if alibi_slopes.stride(-1) != 1:
        raise ValueError(f"alibi_slopes must have last stride 1, got strides {alibi_slopes.stride()}: pass "
                         "alibi_slopes.contiguous()")
    return alibi_slopes


def canonical_window(causal: bool, window_size, seqlen_q: int, seqlen_k: int) -> tuple[bool, tuple[int, int]]:
    """(causal, window) of the same mask in one form: a side whose bound reaches every key is unbounded (-1);
    causal masking sets the right bound to 0, which the causal flag carries (window right -1); a right bound of 0
    alone is causal masking. So equal masks give equal problems, and a window that masks nothing is none."""
    left, right = window_size
    if left >= seqlen_k - 1:
        left = -1
    if right >= seqlen_q - 1 or causal:
        right = -1
    if right == 0:
        causal, right = True, -1
    return causal, (left, right)


def variant_args(causal: bool, window: tuple[int, int], seqlen_q: int, seqlen_k: int, softcap: float,
                 alibi_slopes, mask_mod=None, score_mod=None) -> dict | None:
    """The `variant` of the fixed variants' plans (templates/common/launch_window_softcap_alibi.py) for a call with a
    canonical window (`canonical_window`), softcap (0.0: off) and alibi_slopes (or None), and of a mask_mod's
    (launch_mask_mod.py: its captures and "mask", what the mod reads) with an autoflash.MaskMod, and of a score_mod's
    (its captures and their lengths) with an autoflash.ScoreMod; None for a plain call. An unbounded window side is passed as seqlen_q + seqlen_k keys (past every key), the right side as 0
    under causal masking."""
    args, tensors = {}, {}
    if window != (-1, -1):
        unbounded = seqlen_q + seqlen_k
        left, right = window
        args.update(window_left=unbounded if left == -1 else left,
                    window_right=0 if causal else unbounded if right == -1 else right)
    if softcap:
        args["softcap"] = softcap
    if alibi_slopes is not None:
        tensors = {"Alibi": alibi_slopes}
        args["stride_alibi_b"] = 0 if alibi_slopes.dim() == 1 else alibi_slopes.stride(0)
    if score_mod is not None:  # (before a mask_mod's captures: launch_mask_mod.py takes those last)
        tensors.update((f"ScoreCapture{i}", t) for i, t in enumerate(score_mod.captures))
        args.update((f"score_capture_len{i}", t.numel()) for i, t in enumerate(score_mod.captures))
    if mask_mod is not None:
        tensors.update((f"Capture{i}", t) for i, t in enumerate(mask_mod.captures))
        reads = mask_mod.rendered
        return dict(tensors=tensors, args=args, mask=dict(per_batch=reads.per_batch, per_head=reads.per_head,
                                                          captures=reads.captures))
    return dict(tensors=tensors, args=args) if args else None


def check_mask_mod(mask_mod, window: tuple[int, int], q) -> None:
    """A mask_mod (an autoflash.MaskMod) runs without a window (the mod can hold one), its captures on q's
    device."""
    if window != (-1, -1):
        raise ValueError(f"{mask_mod.title} with window_size {window}: write the window into the mod, "
                         "e.g. (kv_idx <= q_idx + right) & (kv_idx >= q_idx - left), and leave window_size")
    check_captures(mask_mod, q)


def check_captures(mod, q) -> None:
    """A mod's (autoflash.MaskMod, ScoreMod) captures are on q's device."""
    for i, t in enumerate(mod.captures):
        if t.device != q.device:
            raise ValueError(f"{mod.title}: capture {i} is on {t.device}, q on {q.device}: "
                             "pass it .to(q.device)")


def mod_fingerprint(source: str, captures) -> str:
    """A mod's identity in a problem (autoflash.MaskMod's and ScoreMod's `fingerprint`, and an exported package's
    mods'): its rendered `source` and its captures' dtypes and ranks, not their data."""
    kinds = ",".join(f"{t.dtype}/{t.dim()}" for t in captures)
    return hashlib.sha256(f"{source}\0{kinds}".encode()).hexdigest()[:16]
