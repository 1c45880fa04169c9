"""64-bit offsets: tensors over 2^31 elements give right results (GPU only: ~17 GB each)."""

import pytest
import torch

import autoflash
from helpers import assert_matches_reference

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("transposed", [False, True], ids=["bhsd", "bshd"])
def test_tensors_over_2_31_elements(transposed):
    # bhsd: 2 x 8200 x 1024 x 128 = 2.15e9 elements, the last heads start past 2^31.
    # bshd: 1 x 2048 x 8200 x 128 stored (batch, seqlen, heads, dim): the last rows of every head do.
    shape = (1, 2048, 8200, 128) if transposed else (2, 8200, 1024, 128)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.float16, generator=gen) for _ in range(3))
    if transposed:
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    assert q.numel() > 2 ** 31
    out, lse = autoflash.attention(q, k, v, causal=True, return_lse=True)
    for b, heads in ((0, slice(0, 2)), (-1, slice(-2, None))):
        assert_matches_reference(out[b:, heads][:1], lse[b:, heads][:1], q[b:, heads][:1], k[b:, heads][:1],
                                 v[b:, heads][:1], causal=True)
