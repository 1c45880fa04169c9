"""NaN in k reaches out and lse of every query that sees it, as in SDPA (the lse was -inf: the epilogue took a
NaN row sum for a row that saw no key); queries that do not see it stay finite."""

import pytest
import torch

import autoflash
from autoflash.families.tl.knobs import FwdKnobs
from autoflash import codegen
from helpers import make_qkv

from conftest import DEVICE


@pytest.mark.parametrize("causal", [False, True])
def test_nan_key_gives_nan_out_and_lse_where_seen(causal):
    q, k, v = make_qkv(1, 2, 2, 7, 7, 16, torch.float32, DEVICE)
    k[0, 1, 3, 5] = float("nan")
    out, lse = autoflash.attention(q, k, v, causal=causal, return_lse=True)
    sees = torch.arange(7, device=out.device) >= 3 if causal else torch.ones(7, dtype=torch.bool, device=out.device)
    assert torch.isnan(lse[0, 1, sees]).all() and torch.isnan(out[0, 1, sees]).all()
    assert torch.isfinite(lse[0, 1, ~sees]).all() and torch.isfinite(out[0, 1, ~sees]).all()
    assert torch.isfinite(lse[0, 0]).all() and torch.isfinite(out[0, 0]).all()  # the other head


def test_nan_key_through_key_splits():
    """The split-KV combine keeps a NaN partial result NaN (and a split that saw no key out of the sum)."""
    q, k, v = make_qkv(1, 1, 1, 5, 64, 16, torch.float32, DEVICE)
    k[0, 0, 40, 0] = float("nan")
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    knobs = FwdKnobs(block_m=16, block_n=16, num_warps=4, num_stages=1, kv_splits=4)
    codegen.load(knobs).forward(q, k, v, out, lse, 0.25, False)
    assert torch.isnan(lse).all() and torch.isnan(out).all()
