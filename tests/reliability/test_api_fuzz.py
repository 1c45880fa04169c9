"""autoflash.attention under Hypothesis: random shapes (GQA ratios, sequence lengths from 1, odd head dims), layouts
((B,H,S,D), (B,S,H,D) views, sliced and non-unit-last-stride views), dtypes, causal and scale match the fp64
reference with poisoned outputs; arguments outside the supported range are always a one-line ValueError or
TypeError, never a crash or a wrong result. Derandomized and small, so that CI is repeatable and quick."""

import math

import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import autoflash
from conftest import DEVICE
from helpers import assert_matches_reference, poisoned_outputs

FUZZ = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
LAYOUTS = ("bhsd", "bshd", "sliced", "last stride 2")
HEAD_DIMS = (16, 24, 32, 40, 56, 64, 72, 96, 128)


def tensor(gen, batch, heads, seqlen, head_dim, dtype, layout):
    """A (batch, heads, seqlen, head_dim) tensor of normal values laid out as `layout` says."""
    def randn(*shape):
        return torch.randn(shape, generator=gen).to(dtype=dtype, device=DEVICE)
    if layout == "bshd":
        return randn(batch, seqlen, heads, head_dim).transpose(1, 2)
    if layout == "sliced":  # every other row of a longer sequence, a head dim cut from a wider one
        return randn(batch, heads, 2 * seqlen, head_dim + 8)[:, :, ::2, 3:3 + head_dim]
    if layout == "last stride 2":  # copied by attention
        return randn(batch, heads, seqlen, 2 * head_dim)[..., ::2]
    return randn(batch, heads, seqlen, head_dim)


@st.composite
def problems(draw):
    heads_kv = draw(st.integers(1, 2))
    return dict(batch=draw(st.integers(1, 2)), heads_kv=heads_kv, heads_q=heads_kv * draw(st.sampled_from((1, 2, 3))),
                seqlen_q=draw(st.one_of(st.just(1), st.integers(1, 70))),
                seqlen_k=draw(st.one_of(st.just(1), st.integers(1, 70))),
                head_dim=draw(st.sampled_from(HEAD_DIMS)),
                dtype=draw(st.sampled_from((torch.float16, torch.float32, torch.bfloat16))),
                layouts=draw(st.tuples(*[st.sampled_from(LAYOUTS)] * 4)),
                causal=draw(st.booleans()),
                softmax_scale=draw(st.one_of(st.none(), st.floats(0.01, 2.0))),
                with_out=draw(st.booleans()), seed=draw(st.integers(0, 2 ** 16)))


@FUZZ
@given(problems())
def test_supported_calls_match_the_reference(p):
    gen = torch.Generator().manual_seed(p["seed"])
    shapes = ((p["heads_q"], p["seqlen_q"]), (p["heads_kv"], p["seqlen_k"]), (p["heads_kv"], p["seqlen_k"]))
    q, k, v = (tensor(gen, p["batch"], heads, seqlen, p["head_dim"], p["dtype"], layout)
               for (heads, seqlen), layout in zip(shapes, p["layouts"]))
    out = None
    if p["with_out"]:
        out = tensor(gen, p["batch"], p["heads_q"], p["seqlen_q"], p["head_dim"], p["dtype"],
                     "bshd" if p["layouts"][3] == "bshd" else "bhsd").fill_(math.nan)  # poisoned
    result, lse = autoflash.attention(q, k, v, causal=p["causal"], softmax_scale=p["softmax_scale"], return_lse=True,
                                      out=out)
    assert out is None or result is out
    assert result.shape == q.shape and result.dtype == q.dtype and lse.shape == q.shape[:3]
    assert_matches_reference(result, lse, q, k, v, p["causal"], p["softmax_scale"])
    if out is None:  # a fresh output, and no lse: the same values
        poison, _ = poisoned_outputs(q)
        again = autoflash.attention(q, k, v, causal=p["causal"], softmax_scale=p["softmax_scale"])
        assert torch.equal(again, result) and not torch.equal(poison, again)


def good():
    return [torch.randn(1, 2, 8, 16, device=DEVICE), torch.randn(1, 1, 8, 16, device=DEVICE),
            torch.randn(1, 1, 8, 16, device=DEVICE)]


def bad_tensor(which, change):
    """good() with q, k or v (`which`) changed in one way that makes the call invalid."""
    tensors = good()
    t = tensors[which]
    tensors[which] = {
        "float64": lambda: t.double(), "int32": lambda: t.int(), "bool": lambda: t > 0, "complex": lambda: t.cfloat(),
        "3-D": lambda: t[0], "5-D": lambda: t[None], "list": lambda: t.tolist(), "batch 2": lambda: t.repeat(2, 1, 1, 1),
        "head dim 32": lambda: t.repeat(1, 1, 1, 2), "3 heads": lambda: t.repeat(1, 3, 1, 1)[:, :3],
        "no keys": lambda: t[:, :, :0], "no head dim": lambda: t[..., :0], "no heads": lambda: t[:, :0],
        "head dim 8": lambda: t[..., :8], "head dim 272": lambda: t.repeat(1, 1, 1, 17),
        "9 keys": lambda: t.repeat(1, 1, 2, 1)[:, :, :9],
    }[change]()
    if which == 0 and change in ("3 heads", "no heads", "no keys", "9 keys"):  # q's heads and length are free
        tensors[1] = tensors[1][:, :, :0] if change != "9 keys" else tensors[1][..., :8]
    return tensors


@FUZZ
@given(which=st.integers(0, 2), change=st.sampled_from(("float64", "int32", "bool", "complex", "3-D", "5-D", "list",
                                                         "batch 2", "head dim 32", "3 heads", "no keys", "no head dim",
                                                         "no heads", "head dim 8", "head dim 272", "9 keys")),
       causal=st.booleans())
def test_bad_tensors_are_one_line_errors(which, change, causal):
    q, k, v = bad_tensor(which, change)
    try:
        autoflash.attention(q, k, v, causal=causal)
    except (ValueError, TypeError) as e:
        assert "\n" not in str(e) and str(e), repr(e)
    else:
        raise AssertionError(f"{change} of {'qkv'[which]} was accepted")


@FUZZ
@given(argument=st.sampled_from(("softmax_scale", "causal", "return_lse", "deterministic", "out")),
       value=st.one_of(st.floats(allow_nan=True, allow_infinity=True).filter(lambda x: not (x > 0 and math.isfinite(x))),
                       st.integers(-3, 3), st.text(max_size=3), st.none(), st.just([1.0]),
                       st.just(torch.tensor(0.5)), st.just(torch.empty(1, 2, 8, 16, dtype=torch.float64)),
                       st.just(torch.empty(1, 2, 9, 16)), st.just(torch.empty(1, 1, 8, 16).expand(1, 2, 8, 16))))
def test_bad_arguments_are_one_line_errors(argument, value):
    valid = {"softmax_scale": lambda x: x is None, "out": lambda x: x is None,
             "causal": lambda x: False, "return_lse": lambda x: False, "deterministic": lambda x: False}
    if valid[argument](value) or (argument == "softmax_scale" and isinstance(value, int) and value > 0):
        return  # a valid value: nothing to refuse
    try:
        autoflash.attention(*good(), **{argument: value})
    except (ValueError, TypeError) as e:
        assert "\n" not in str(e) and str(e), repr(e)
    else:
        raise AssertionError(f"{argument}={value!r} was accepted")


@FUZZ
@given(batch=st.integers(0, 2), heads_q=st.sampled_from((0, 2)), seqlen_q=st.integers(0, 3))
def test_empty_queries_give_empty_outputs(batch, heads_q, seqlen_q):
    if batch * heads_q * seqlen_q:
        return
    q = torch.randn(batch, heads_q, seqlen_q, 16, device=DEVICE)
    k = v = torch.randn(batch, 1 if heads_q == 0 else 2, 5, 16, device=DEVICE)
    out, lse = autoflash.attention(q, k, v, return_lse=True)
    assert out.shape == q.shape and lse.shape == q.shape[:3]
