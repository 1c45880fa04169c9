"""`F.scaled_dot_product_attention` on autoflash: `install()` makes autoflash SDPA's flash attention, through
PyTorch's registry of flash attention implementations (torch >= 2.11, `torch.nn.attention`, as its own FA3 and FA4
providers do): it re-registers the CUDA kernels of the aten ops `_scaled_dot_product_flash_attention` and
`_scaled_dot_product_flash_attention_backward`, which SDPA calls when it picks its flash backend (and
torch.compile's graphs of SDPA too). Whatever autoflash refuses (dropout, a debug mask, causal with
seqlen_q != seqlen_k, whose mask SDPA aligns top-left and autoflash bottom-right, or any input autoflash's checks
refuse) runs PyTorch's own kernel, the one registered before install. `uninstall()` puts PyTorch's kernels back.
Nothing happens on import.
"""

import logging

import torch

from autoflash import api

NAME = "autoflash"
FORWARD, BACKWARD = "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_flash_attention_backward"
logger = logging.getLogger(__name__)


def install() -> None:
    """Make autoflash SDPA's flash attention (forward and backward) until `uninstall()`; replaces an active
    FA3 or FA4. SDPA still picks its backend itself: autoflash runs when it picks flash attention."""
    attention = _attention_registry()
    attention.register_flash_attention_impl(NAME, register_fn=lambda: _register("CUDA"))
    attention.activate_flash_attention_impl(NAME)


def uninstall() -> None:
    """Give SDPA back PyTorch's own flash attention kernels (nothing to do unless autoflash is installed)."""
    attention = _attention_registry()
    if attention.current_flash_attention_impl() == NAME:
        attention.restore_flash_attention_impl()


def _attention_registry():
    import torch.nn.attention as attention
    if not hasattr(attention, "register_flash_attention_impl"):
        raise RuntimeError(f"autoflash's SDPA install needs torch >= 2.11 (its flash attention registry); "
                           f"this is torch {torch.__version__}: upgrade torch, or call autoflash.attention directly")
    return attention


class _Handle:
    """What the registry keeps while autoflash is active: `remove()` unregisters its kernels."""

    def __init__(self, library: torch.library.Library):
        self.library = library

    def remove(self) -> None:
        self.library._destroy()


def _register(dispatch_key: str) -> _Handle:
    """Register autoflash as the `dispatch_key` kernels of SDPA's two flash ops, falling back on those there now."""
    library = torch.library.Library("aten", "IMPL", dispatch_key)
    library.impl(FORWARD.removeprefix("aten::"), sdpa_flash_forward(_stock(FORWARD, dispatch_key)), dispatch_key,
                 with_keyset=True)
    library.impl(BACKWARD.removeprefix("aten::"), sdpa_flash_backward(_stock(BACKWARD, dispatch_key)), dispatch_key,
                 with_keyset=True)
    return _Handle(library)


def _stock(op: str, dispatch_key: str):
    """call(keyset, *args, **kwargs) of the kernel registered now (PyTorch's own, after the registry's restore)."""
    try:
        kernel = torch.library.get_kernel(op, dispatch_key)
    except RuntimeError:  # this build has none (a CPU build): the call fails as it would without autoflash
        def missing(keyset, *args, **kwargs):
            raise NotImplementedError(f"{op} has no {dispatch_key} kernel in this torch build, and autoflash "
                                      "refused the call")
        return missing
    return kernel.call_boxed


def _refusal(query, key, value, dropout_p, is_causal, return_debug_mask):
    """Why autoflash does not run this SDPA flash call, or None."""
    if dropout_p != 0.0:
        return f"dropout_p={dropout_p} (autoflash has no dropout)"
    if return_debug_mask:
        return "return_debug_mask=True"
    if is_causal and query.shape[2] != key.shape[2]:
        return "is_causal with seqlen_q != seqlen_k (SDPA's causal mask is top-left aligned, autoflash's bottom-right)"
    if any(t.stride(-1) != 1 for t in (query, key, value)):
        return "a last stride other than 1"
    return None


def sdpa_flash_forward(stock):
    """The kernel of aten::_scaled_dot_product_flash_attention: autoflash, or `stock` for what autoflash refuses."""
    def forward(keyset, query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
        why = _refusal(query, key, value, dropout_p, is_causal, return_debug_mask)
        if why is None:
            try:
                out, lse = api.attention_forward(query, key, value, is_causal, scale,
                                                 torch.are_deterministic_algorithms_enabled())
            except (TypeError, ValueError) as refused:
                why = str(refused)
        if why is not None:
            logger.debug("SDPA flash forward runs PyTorch's kernel: %s", why)
            return stock(keyset, query, key, value, dropout_p, is_causal, return_debug_mask, scale=scale)
        # Seed and offset of dropout, never read without dropout: left uninitialised, like the debug mask.
        seed = torch.empty(2, dtype=torch.uint64, device=query.device)
        offset = torch.empty((), dtype=torch.uint64, device=query.device)
        debug_mask = torch.empty(0, dtype=query.dtype, device=query.device)
        return out, lse, None, None, query.shape[2], key.shape[2], seed, offset, debug_mask
    return forward


def sdpa_flash_backward(stock):
    """The kernel of aten::_scaled_dot_product_flash_attention_backward: autoflash, or `stock` for what it refuses."""
    def backward(keyset, grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                 is_causal, philox_seed, philox_offset, *, scale=None):
        why = _refusal(query, key, value, dropout_p, is_causal, False)
        if why is None:
            try:
                return api.attention_backward(grad_out, query, key, value, out, logsumexp, None, is_causal, scale,
                                              torch.are_deterministic_algorithms_enabled())
            except (TypeError, ValueError) as refused:
                why = str(refused)
        logger.debug("SDPA flash backward runs PyTorch's kernel: %s", why)
        return stock(keyset, grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
                     dropout_p, is_causal, philox_seed, philox_offset, scale=scale)
    return backward
