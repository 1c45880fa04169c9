"""bfloat16 is correct under Triton's interpreter too (its tl.dot on bfloat16 is wrong: attention computes in float32
there), forward, lse and gradients; and the tuner refuses bfloat16 problems there up front."""

import pytest
import torch
from click.testing import CliRunner

import autoflash
from autoflash.cli import main
from conftest import DEVICE
from helpers import assert_gradients_match, assert_matches_reference, make_qkv, poisoned_outputs

SIZES = [(1, 1, 40), (7, 7, 64), (123, 77, 40), (123, 123, 64)]  # seqlen_q, seqlen_k, head_dim


@pytest.mark.parametrize("seqlen_q, seqlen_k, head_dim", SIZES)
@pytest.mark.parametrize("causal", [False, True])
def test_forward_and_lse(seqlen_q, seqlen_k, head_dim, causal):
    q, k, v = make_qkv(1, 4, 2, seqlen_q, seqlen_k, head_dim, torch.bfloat16, DEVICE, seed=seqlen_q + head_dim)
    out, lse = autoflash.attention(q, k, v, causal=causal, return_lse=True)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32 and out.stride() == q.stride()
    assert_matches_reference(out, lse, q, k, v, causal)


@pytest.mark.parametrize("seqlen_q, seqlen_k, head_dim", SIZES)
def test_into_out(seqlen_q, seqlen_k, head_dim):
    q, k, v = make_qkv(2, 2, 2, seqlen_q, seqlen_k, head_dim, torch.bfloat16, DEVICE, transposed=True, seed=5)
    given, _ = poisoned_outputs(q)
    for return_lse in (False, True):
        given.fill_(float("nan"))
        result = autoflash.attention(q, k, v, causal=True, return_lse=return_lse, out=given)
        out, lse = result if return_lse else (result, None)
        assert out is given
        assert_matches_reference(given, lse, q, k, v, True)


@pytest.mark.parametrize("seqlen_q, seqlen_k, head_dim", SIZES)
def test_gradients(seqlen_q, seqlen_k, head_dim):
    q, k, v = make_qkv(1, 4, 2, seqlen_q, seqlen_k, head_dim, torch.bfloat16, DEVICE, seed=seqlen_k)
    grads = assert_gradients_match(q, k, v, causal=True, with_lse=True)
    assert all(g.dtype == torch.bfloat16 for g in grads)


def test_tuner_refuses_bfloat16_in_the_interpreter(tmp_path):
    shapes = tmp_path / "bf16.yaml"
    shapes.write_text("problems:\n  - {batch: 1, heads_q: 1, seqlen_q: 16, head_dim: 16, dtype: [float16, bfloat16]}\n")
    db = tmp_path / "never.db"
    result = CliRunner().invoke(main, ["tune", "--interpret", "--shapes", str(shapes), "--db", f"sqlite:///{db}"])
    assert result.exit_code != 0 and "bfloat16" in result.output and "interpreter" in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and not db.exists()
