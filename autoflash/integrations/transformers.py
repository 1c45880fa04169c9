"""Hugging Face transformers (5.x) models on autoflash: `attn_implementation=register()`.

    from autoflash.integrations import transformers as autoflash_hf
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation=autoflash_hf.register())

The name is "autofa", not "autoflash": transformers reads every implementation name that contains "flash" as a
FlashAttention request (`is_flash_attention_requested` in transformers/utils/generic.py) and sends it to its own
flash-attn/hub-kernel path instead of `AttentionInterface`; names containing "sdpa" or "flex_attention", or a "/"
(a hub kernel), are routed elsewhere too.

What runs where, call by call:
- autoflash: causal (bottom-right aligned, which is what a KV cache during `generate()` needs: the new queries
  are the last ones) or full attention, with GQA/MQA K/V read in place, the model's `scaling`, and a sliding
  window that reaches back past the first key (the sequence so far is no longer than the window).
- SDPA (transformers' `sdpa` function, with one warning): any mask that is not plain causal — padding,
  packed sequences, a sliding window shorter than the sequence, a static cache's empty slots, a custom 4-D
  mask — until autoflash computes masks and windows (issues 16 and 17).
- a ValueError: attention-logit softcapping (Gemma-2; issue 16) and dropout (training with
  `attention_dropout > 0`), which autoflash does not compute; transformers' `sdpa` refuses softcapping too.
"""

import warnings

import torch

from autoflash.api import attention

try:
    import transformers
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, fast_all, prepare_padding_mask, sdpa_mask
except ImportError as error:
    raise ImportError(f"autoflash.integrations.transformers needs transformers 5 ({error}): "
                      "pip install 'autoflash[hf]'") from error
if transformers.__version__.split(".")[0] != "5":
    raise ImportError(f"autoflash.integrations.transformers needs transformers 5, found {transformers.__version__}: "
                      "pip install 'autoflash[hf]'")

NAME = "autofa"

FALLBACK_WARNING = (
    "autoflash: attention with a mask other than plain causal (padding, packed sequences, a sliding window shorter "
    "than the sequence, a static cache's empty slots, a custom mask), a positional bias or a paged cache runs on "
    "transformers' sdpa attention, until autoflash computes masks and windows (issues 16 and 17)")
_warned_of_fallback = False


def register() -> str:
    """Register autoflash's attention and mask functions with transformers under NAME and return NAME, for
    `from_pretrained(..., attn_implementation=NAME)`, `from_config(...)` or `model.set_attn_implementation(NAME)`.
    Registering again is harmless."""
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, causal_mask_or_none)
    return NAME


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      is_causal: bool | None = None, softcap: float | None = None, **kwargs):
    """transformers' attention function: query (batch, heads, seqlen_q, head_dim), key and value
    (batch, heads_kv, seqlen_k, head_dim) -> ((batch, seqlen_q, heads, head_dim) output, None). attention_mask is
    None when causal_mask_or_none found the mask plain (causal or full, per `is_causal`): autoflash runs, with the
    model's attention-logit softcapping (Gemma-2's softcap) if any."""
    if dropout:
        raise ValueError(f"autoflash has no attention dropout (dropout={dropout}): call model.eval(), or set "
                         "config.attention_dropout = 0.0 to train")
    if attention_mask is not None or kwargs.get("position_bias") is not None or kwargs.get("cache") is not None:
        global _warned_of_fallback
        if not _warned_of_fallback:
            _warned_of_fallback = True
            warnings.warn(FALLBACK_WARNING, stacklevel=2)
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    out = attention(query, key, value, causal=bool(causal), softmax_scale=scaling, softcap=softcap)
    # out is laid out like query, which transformers makes as a (batch, seqlen, heads, head_dim) view: no copy then.
    return out.transpose(1, 2).contiguous(), None


def causal_mask_or_none(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset: int = 0,
                        attention_mask: torch.Tensor | None = None, local_size: int | None = None,
                        allow_is_causal_skip: bool = True, **kwargs) -> torch.Tensor | None:
    """transformers' mask function: None when the mask is causal as autoflash aligns it (bottom-right), else the
    boolean (batch, 1, q_length, kv_length) mask of transformers' `sdpa_mask`.

    transformers' own `sdpa_mask` also returns None for an empty static cache's prefill, where the keys run past
    the queries and only SDPA's top-left alignment is right: here None means the keys end where the queries end
    (absolute positions kv_offset + kv_length == q_offset + q_length), no key is padding, and a sliding window or
    chunk (local_size) covers every position so far."""
    if allow_is_causal_skip:
        # q_offset is a tensor only for static caches, whose empty slots run past the queries (and reading it syncs)
        keys_end_with_queries = not isinstance(q_offset, torch.Tensor) and kv_offset + kv_length == q_offset + q_length
        window_covers_all = local_size is None or kv_offset + kv_length <= local_size
        if keys_end_with_queries and window_covers_all:
            padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
            if padding is None or fast_all(padding[:, kv_offset:kv_offset + kv_length]):
                return None
    return sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset, attention_mask=attention_mask,
                     local_size=local_size, allow_is_causal_skip=False, **kwargs)

