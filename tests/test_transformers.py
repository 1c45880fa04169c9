"""Hugging Face transformers models on autoflash (autoflash/integrations/transformers.py): tiny randomly initialised
Llama, Mistral, Qwen2 and Gemma-2 models (no downloads) give the logits and greedy tokens of
attn_implementation="sdpa", with autoflash's kernel counted where it must run and SDPA where a mask needs it.
On the CPU in float32 (Triton's interpreter); the `gpu` tests run the same models in bfloat16."""

import importlib
import sys

import pytest
import torch

from conftest import DEVICE

transformers = pytest.importorskip("transformers", minversion="5",
                                   reason="needs transformers 5: pip install -e '.[hf]'")

from transformers import (AutoModel, AutoModelForCausalLM, BertConfig, Gemma2Config, LlamaConfig,  # noqa: E402
                          MistralConfig, Qwen2Config)
from transformers.utils.generic import is_flash_attention_requested  # noqa: E402

from autoflash.integrations import transformers as autoflash_hf  # noqa: E402

VOCAB, LAYERS, NEW_TOKENS = 96, 2, 3
SIZES = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=LAYERS,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)
CONFIGS = {  # GQA everywhere (4 query heads, 2 KV heads)
    "llama": lambda: LlamaConfig(**SIZES, head_dim=16),
    "mistral": lambda: MistralConfig(**SIZES, head_dim=32),  # sliding_window 4096: longer than any sequence here
    "qwen2": lambda: Qwen2Config(**SIZES),  # head_dim 16 (hidden / heads), biased q, k, v projections
    # Gemma-2 without its attention softcapping, a window of 4 tokens on its sliding layers (the first of each
    # pair) and query_pre_attn_scalar 64: a scale of 1/8, not 1/sqrt(head_dim).
    "gemma2": lambda: Gemma2Config(**SIZES, head_dim=32, attn_logit_softcapping=None, sliding_window=4,
                                   query_pre_attn_scalar=64),
    # and with its default softcapping (50), which autoflash computes (softcap=)
    "gemma2_softcap": lambda: Gemma2Config(**SIZES, head_dim=32, sliding_window=4, query_pre_attn_scalar=64),
}
# Which layers autoflash runs on an unpadded prompt of PROMPT tokens and the steps after it: all but Gemma-2's
# sliding layers, whose window (4) is shorter than the sequence, and which SDPA runs with the window's mask.
AUTOFLASH_LAYERS = {"llama": LAYERS, "mistral": LAYERS, "qwen2": LAYERS, "gemma2": LAYERS // 2,
                    "gemma2_softcap": LAYERS // 2}
PROMPT = 7
# transformers 5 refuses sdpa for Gemma-2 (its default softcapping): eager is its reference.
REFERENCE = {"gemma2": "eager", "gemma2_softcap": "eager"}


def models(name, dtype=torch.float32):
    """The same randomly initialised model twice: on transformers' attention (REFERENCE) and on autoflash's."""
    torch.manual_seed(0)  # a config of its own each: a model reads its attention implementation from its config
    reference = AutoModelForCausalLM.from_config(CONFIGS[name](), attn_implementation=REFERENCE.get(name, "sdpa"),
                                                 dtype=dtype)
    reference = reference.to(DEVICE).eval()
    model = AutoModelForCausalLM.from_config(CONFIGS[name](), attn_implementation=autoflash_hf.register(), dtype=dtype)
    model.load_state_dict(reference.state_dict())
    return reference, model.to(DEVICE).eval()


def prompts(batch=2, length=PROMPT):
    return torch.randint(1, VOCAB, (batch, length), generator=torch.Generator().manual_seed(1)).to(DEVICE)


@pytest.fixture
def autoflash_calls(monkeypatch):
    """(seqlen_q, seqlen_k, heads_q, heads_kv, causal) of each autoflash.attention call the integration makes;
    a fresh warning state."""
    calls = []

    def counted(q, k, v, **kwargs):
        calls.append((q.shape[2], k.shape[2], q.shape[1], k.shape[1], kwargs["causal"]))
        return attention(q, k, v, **kwargs)
    attention = autoflash_hf.attention
    monkeypatch.setattr(autoflash_hf, "attention", counted)
    monkeypatch.setattr(autoflash_hf, "_warned_of_fallback", False)
    return calls


def assert_greedy_within(reference, tokens, expected, atol):
    """tokens (from the model under test) equal expected (the reference's greedy tokens), or first differ where
    the reference's logits tie within atol: the token taken there is within atol of the reference's best."""
    assert tokens.shape == expected.shape, f"generated {tuple(tokens.shape)}, the reference {tuple(expected.shape)}"
    if torch.equal(tokens, expected):
        return
    batch, step = (tokens != expected).nonzero()[0].tolist()
    with torch.no_grad():
        logits = reference(tokens[batch:batch + 1, :step]).logits[0, -1].float()
    gap = (logits.max() - logits[tokens[batch, step]]).item()
    assert gap <= atol, f"sequence {batch} takes token {tokens[batch, step].item()} at {step}, {gap} below the best"


def check_matches_sdpa(name, calls, dtype, atol):
    reference, model = models(name, dtype)
    ids = prompts()
    layers = AUTOFLASH_LAYERS[name]
    with torch.no_grad():
        expected, logits = reference(ids).logits, model(ids).logits
    torch.testing.assert_close(logits, expected, atol=atol, rtol=0)
    assert calls == [(PROMPT, PROMPT, 4, 2, True)] * layers  # GQA: K/V with their 2 heads, not repeated
    calls.clear()
    generate = dict(attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                    do_sample=False)
    tokens, expected_tokens = model.generate(ids, **generate), reference.generate(ids, **generate)
    assert_greedy_within(reference, tokens, expected_tokens, atol)
    # The prompt, then one query a step against the cache: seqlen_q 1, seqlen_k growing (bottom-right causal).
    assert calls == [(PROMPT, PROMPT, 4, 2, True)] * layers + [
        (1, PROMPT + step, 4, 2, True) for step in range(1, NEW_TOKENS) for _ in range(layers)]
    assert autoflash_hf._warned_of_fallback == (layers < LAYERS)  # Gemma-2's sliding layers ran on SDPA


FALLBACK_WARNED = pytest.mark.filterwarnings("ignore:autoflash. attention with a mask:UserWarning")


@FALLBACK_WARNED
@pytest.mark.parametrize("name", CONFIGS)
def test_models_match_sdpa(name, autoflash_calls):
    check_matches_sdpa(name, autoflash_calls, torch.float32, atol=1e-4)


@pytest.mark.gpu
@FALLBACK_WARNED
@pytest.mark.parametrize("name", CONFIGS)
def test_models_match_sdpa_bf16_on_gpu(name, autoflash_calls):
    check_matches_sdpa(name, autoflash_calls, torch.bfloat16, atol=3e-2)


def test_name_reaches_attention_interface():
    """transformers sends every name containing "flash" to its FlashAttention path: NAME avoids it."""
    assert is_flash_attention_requested(requested_attention_implementation="autoflash")
    assert autoflash_hf.register() == autoflash_hf.register() == autoflash_hf.NAME
    assert not is_flash_attention_requested(requested_attention_implementation=autoflash_hf.NAME)
    _, model = models("llama")
    assert model.config._attn_implementation == autoflash_hf.NAME


def test_chunked_prefill_against_the_cache_is_bottom_right_causal(autoflash_calls):
    """A second chunk of 3 queries against the 4 cached keys and its own 3: seqlen_q 3, seqlen_k 7."""
    reference, model = models("llama")
    ids = prompts()
    with torch.no_grad():
        expected = reference(ids).logits[:, 4:]
        cache = model(ids[:, :4], use_cache=True).past_key_values
        logits = model(ids[:, 4:], past_key_values=cache).logits
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=0)
    assert autoflash_calls == [(4, 4, 4, 2, True)] * LAYERS + [(3, 7, 4, 2, True)] * LAYERS


def test_encoder_runs_full_attention(autoflash_calls):
    """BERT's self-attention is not causal: autoflash runs it with causal=False (no mask without padding)."""
    config = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=LAYERS,
                  num_attention_heads=4, max_position_embeddings=64)
    torch.manual_seed(0)
    reference = AutoModel.from_config(BertConfig(**config), attn_implementation="sdpa").to(DEVICE).eval()
    model = AutoModel.from_config(BertConfig(**config), attn_implementation=autoflash_hf.register())
    model.load_state_dict(reference.state_dict())
    ids = prompts()
    with torch.no_grad():
        expected, out = reference(ids).last_hidden_state, model.to(DEVICE).eval()(ids).last_hidden_state
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=0)
    assert autoflash_calls == [(PROMPT, PROMPT, 4, 4, False)] * LAYERS


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_padding_and_static_cache_run_on_sdpa_with_one_warning(cache, autoflash_calls):
    """Left padding, or a static cache's empty slots after the keys, is a mask autoflash does not compute yet:
    those calls run transformers' sdpa attention, with one warning for the whole generation."""
    reference, model = models("llama")
    ids = prompts()
    mask = torch.ones_like(ids)
    if cache == "dynamic":
        mask[0, :3] = 0
    generate = dict(attention_mask=mask, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                    cache_implementation=cache)
    with pytest.warns(UserWarning) as warned:
        tokens = model.generate(ids, **generate)
    assert [str(w.message) for w in warned if "autoflash" in str(w.message)] == [autoflash_hf.FALLBACK_WARNING]
    assert torch.equal(tokens, reference.generate(ids, **generate))
    assert autoflash_calls == []


@pytest.mark.parametrize("q_length, kv_length, q_offset, kv_offset, padded, local_size, plain", [
    (5, 5, 0, 0, False, None, True),  # prefill
    (1, 6, 5, 0, False, None, True),  # a decoding step
    (3, 7, 4, 0, False, None, True),  # a chunk against the cache
    (5, 5, 0, 0, True, None, False),  # padding
    (5, 8, 0, 0, False, None, False),  # an empty static cache: keys past the queries
    (5, 5, 0, 0, False, 5, True),  # a window that reaches back to the first key
    (5, 5, 0, 0, False, 4, False),  # a window shorter than the sequence
    (1, 4, 5, 2, False, 4, False),  # a sliding cache past its window (exact as causal, but a chunk would not be)
])
def test_mask_is_none_exactly_when_plain_bottom_right_causal(q_length, kv_length, q_offset, kv_offset, padded,
                                                             local_size, plain):
    padding = torch.ones(2, kv_offset + kv_length, dtype=torch.bool)
    padding[1, 0] = not padded
    mask = autoflash_hf.causal_mask_or_none(batch_size=2, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                                            kv_offset=kv_offset, attention_mask=padding, local_size=local_size)
    assert (mask is None) == plain
    if not plain:
        assert mask.shape == (2, 1, q_length, kv_length) and mask.dtype == torch.bool


def test_mask_is_materialised_when_transformers_allows_no_skip():
    """Packed sequences and masks overlaid by the model (images, blocks) come with allow_is_causal_skip=False."""
    mask = autoflash_hf.causal_mask_or_none(batch_size=1, q_length=5, kv_length=5, allow_is_causal_skip=False)
    assert mask.shape == (1, 1, 5, 5) and torch.equal(mask[0, 0], torch.ones(5, 5, dtype=torch.bool).tril())


def test_dropout_is_refused_and_training_without_it_matches_sdpa(autoflash_calls):
    reference, model = models("llama")
    ids = prompts()
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.1  # what config.attention_dropout = 0.1 gives
    with pytest.raises(ValueError, match=r"no attention dropout \(dropout=0.1\): call model.eval\(\)"):
        model.train()(ids)
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.0
    for m in (reference, model):
        m.train()(ids, labels=ids).loss.backward()
    assert autoflash_calls == [(PROMPT, PROMPT, 4, 2, True)] * LAYERS
    for (name, expected), got in zip(reference.named_parameters(), model.parameters()):
        torch.testing.assert_close(got.grad, expected.grad, atol=1e-4, rtol=1e-3, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("installed", [None, "4.57.1"])
def test_without_transformers_5_the_import_names_the_extra(installed, monkeypatch):
    if installed is None:
        monkeypatch.setitem(sys.modules, "transformers", None)
    else:
        # transformers may put a new module object in sys.modules after loading a model: patch the current one
        monkeypatch.setattr(sys.modules["transformers"], "__version__", installed)
    monkeypatch.delitem(sys.modules, "autoflash.integrations.transformers")
    with pytest.raises(ImportError, match=r"needs transformers 5.*: pip install 'autoflash\[hf\]'"):
        importlib.import_module("autoflash.integrations.transformers")
