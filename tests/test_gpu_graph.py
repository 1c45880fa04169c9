"""autoflash.attention inside CUDA graph capture (GPU only)."""

import pytest
import torch

import autoflash
from helpers import assert_matches_reference, make_qkv

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("given_out", [False, True], ids=["allocated", "out="])
@pytest.mark.parametrize("head_dim", [64, 128, 80])
def test_attention_replays_in_a_cuda_graph(head_dim, given_out):
    q, k, v = make_qkv(2, 4, 2, 300, 300, head_dim, torch.float16, "cuda", seed=1)
    static_out = torch.full_like(q, float("nan")) if given_out else None
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and dispatch before capture
        autoflash.attention(q, k, v, causal=True, out=static_out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = autoflash.attention(q, k, v, causal=True, out=static_out)
    assert out is static_out or not given_out
    fresh = make_qkv(2, 4, 2, 300, 300, head_dim, torch.float16, "cuda", seed=2)
    for buffer, value in zip((q, k, v), fresh):
        buffer.copy_(value)
    graph.replay()
    torch.cuda.synchronize()
    assert_matches_reference(out, None, q, k, v, True)
