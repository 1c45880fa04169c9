"""Ring attention over 2 and 4 processes against the fp64 reference on the gathered sequence: forward and gradients,
full and causal (zig-zag), GQA, a ring of one; its errors. Without a GPU the ranks are CPU processes over gloo,
running the kernels in Triton's interpreter; with 2 GPUs (the `gpu` test), one process per GPU over NCCL."""

import datetime
import importlib.util
import tempfile
from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# Spawned ranks import this module, and so conftest, before autoflash: it sets TRITON_INTERPRET without a GPU.
from conftest import HAS_GPU
from autoflash import distributed
from autoflash.distributed import gather_sequence, ring_attention, shard_sequence
from autoflash.reference import (GRAD_TOLERANCE, TOLERANCE, attention_backward_reference, attention_reference,
                                 relative_error)

# (batch, heads_q, heads_kv, total seqlen, head_dim, dtype, causal): small, since the interpreter is slow; odd
# shards (15 tokens a rank, zig-zag chunks of 5) among them.
TWO_RANKS = [(2, 2, 2, 30, 16, torch.float32, False), (1, 4, 2, 32, 16, torch.float32, True),
             (1, 4, 2, 48, 16, torch.float16, True)]
FOUR_RANKS = [(1, 4, 2, 40, 16, torch.float32, True), (1, 2, 2, 28, 16, torch.float16, False)]  # fp16: merged in fp32


def spawn(world_size: int, check, *args, backend="gloo"):
    """Run check(*args) on `world_size` fresh processes joined in one process group; raise what any raised."""
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(_rank_main, args=(world_size, backend, folder, check, args), nprocs=world_size, join=True)


def _rank_main(rank, world_size, backend, folder, check, args):
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=120))  # a hung ring fails instead of waiting forever
    try:
        check(*args)
    finally:
        dist.destroy_process_group()


def check_against_reference(cases, device="cpu", group=None):
    for batch, heads_q, heads_kv, seqlen, head_dim, dtype, causal in cases:
        gen = torch.Generator().manual_seed(seqlen)  # the same full tensors on every rank
        q, dout = (torch.randn(batch, heads_q, seqlen, head_dim, generator=gen).to(device, dtype) for _ in range(2))
        k, v = (torch.randn(batch, heads_kv, seqlen, head_dim, generator=gen).to(device, dtype) for _ in range(2))
        shards = [shard_sequence(t, causal=causal, group=group).requires_grad_() for t in (q, k, v)]
        out = ring_attention(*shards, group=group, causal=causal)
        out.backward(shard_sequence(dout, causal=causal, group=group))

        what = f"{dtype} causal={causal} heads {heads_q}:{heads_kv} seqlen {seqlen} rank {dist.get_rank()}"
        ref_out, _ = attention_reference(q, k, v, causal)
        err = relative_error(gather_sequence(out, causal=causal, group=group), ref_out)
        assert err < TOLERANCE[dtype], f"out: relative error {err:.1e} ({what})"
        for name, shard, ref in zip(("dq", "dk", "dv"), shards, attention_backward_reference(q, k, v, dout, causal)):
            err = relative_error(gather_sequence(shard.grad, causal=causal, group=group), ref)
            assert err < GRAD_TOLERANCE[dtype], f"{name}: relative error {err:.1e} ({what})"


def check_two_ranks(cases, device):
    check_against_reference(cases, device)
    alone = [dist.new_group([rank]) for rank in range(dist.get_world_size())]  # rings of one rank each
    check_against_reference([(1, 4, 2, 32, 16, torch.bfloat16, True)], device, group=alone[dist.get_rank()])
    check_transfers_overlap_kernels(device)
    check_errors(device)


def check_transfers_overlap_kernels(device):
    """On 2 ranks each pass posts the next transfer before a step's kernel and waits for it after: the forward
    sends K/V; the backward K/V, and dK/dV after each step's kernel (the last transfer takes them home)."""
    events = []
    post = dist.batch_isend_irecv

    class Logged:
        def __init__(self, request):
            self.request = request

        def wait(self):
            if events[-1] != "wait":  # one wait() for the send and the receive of a transfer
                events.append("wait")
            return self.request.wait()

    def posted(ops):
        events.append("post")
        return [Logged(request) for request in post(ops)]

    def logged(name, run):
        def call(*args, **kwargs):
            events.append(name)
            return run(*args, **kwargs)
        return call

    with mock.patch.object(distributed.dist, "batch_isend_irecv", posted), \
            mock.patch.object(distributed, "attention", logged("fwd", distributed.attention)), \
            mock.patch.object(distributed, "attention_backward", logged("bwd", distributed.attention_backward)):
        q = torch.randn(1, 2, 8, 16, device=device, requires_grad=True)
        out = ring_attention(q, q, q)
        forward = list(events)
        out.backward(torch.ones_like(out))
    assert forward == ["post", "fwd", "wait", "fwd"], forward
    assert events[4:] == ["post", "bwd", "post", "wait", "bwd", "wait", "post", "wait"], events[4:]


def check_errors(device):
    rank = dist.get_rank()
    x = torch.randn(1, 2, 12, 16, device=device)
    with pytest.raises(ValueError, match="multiple of 4"):
        shard_sequence(x[:, :, :10], causal=True)
    with pytest.raises(ValueError, match="local_seqlen 3"):
        ring_attention(x[:, :, :3], x[:, :, :3], x[:, :, :3], causal=True)
    with pytest.raises(TypeError, match="one dtype"):
        ring_attention(x, x.half(), x.half())
    with pytest.raises(ValueError, match="softmax_scale must be positive"):
        ring_attention(x, x, x, softmax_scale=0)
    # Ranks that pass different shapes: found at the group's first call, on every rank.
    pair = dist.new_group([0, 1])
    mine = x[:, :, :8 + 2 * rank]
    with pytest.raises(ValueError, match=r"disagree: rank \d has q \(1, 2, (8|10), 16\)"):
        ring_attention(mine, mine, mine, group=pair)


@pytest.mark.skipif(HAS_GPU, reason="CPU ranks under the interpreter; with GPUs, test_two_gpus_nccl")
def test_two_ranks_and_errors():
    spawn(2, check_two_ranks, TWO_RANKS, "cpu")


@pytest.mark.skipif(HAS_GPU, reason="CPU ranks under the interpreter; with GPUs, test_two_gpus_nccl")
def test_four_ranks():
    spawn(4, check_against_reference, FOUR_RANKS)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_merge_rounds_once(dtype):
    """_merge of two key blocks' (out, lse) gives their fp64 merge rounded once to out's dtype (the ring's output at
    2 ranks, step 0's own, is merged into in q's dtype): equal but for near-ties, which the fp32 sum may round the
    other way."""
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 3, n, 24, generator=gen, dtype=torch.float64) for n in (37, 50, 50))
    (out_a, lse_a), (out_b, lse_b) = (attention_reference(q, k[:, :, keys], v[:, :, keys])
                                      for keys in (slice(0, 21), slice(21, None)))
    out, lse, block_out, block_lse = out_a.to(dtype), lse_a.float(), out_b.to(dtype), lse_b.float()
    # the fp64 merge of exactly what _merge is given
    merged_lse = torch.logaddexp(lse.double(), block_lse.double())
    expected = (out.double() * (lse.double() - merged_lse).exp().unsqueeze(-1)
                + block_out.double() * (block_lse.double() - merged_lse).exp().unsqueeze(-1))
    distributed._merge(out, lse, block_out, block_lse)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert (lse.double() - merged_lse).abs().max() < 1e-5
    if dtype == torch.float32:
        assert relative_error(out, expected) < 1e-6
    else:  # one rounding: equal but for near-ties (two roundings, e.g. out * keep in out's dtype: ~25% differ)
        assert (out != expected.to(dtype)).float().mean() < 0.01
        assert relative_error(out, expected) < torch.finfo(dtype).eps
    assert relative_error(expected, attention_reference(q, k, v)[0]) < TOLERANCE[dtype]  # the blocks make the whole


def test_load_balancing_off_restores_torchs_switch(monkeypatch):
    """benchmarks/ring_attention.py finds context_parallel's load-balancing switch in this torch and puts it back."""
    benchmarks = Path(__file__).resolve().parents[1] / "benchmarks"
    monkeypatch.syspath_prepend(str(benchmarks))  # (its helpers' folder, sys.path[0] when run as a script)
    spec = importlib.util.spec_from_file_location("ring_attention_benchmark", benchmarks / "ring_attention.py")
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    options = benchmark.context_parallel_options()
    before = options.enable_load_balance
    for setting in (True, False):
        options.enable_load_balance = setting
        with pytest.raises(KeyError), benchmark.load_balancing_off():
            assert options.enable_load_balance is False
            raise KeyError("an error inside the block")
        assert options.enable_load_balance is setting
    options.enable_load_balance = before


def test_needs_an_initialised_group():
    x = torch.randn(1, 2, 8, 16)
    with pytest.raises(RuntimeError, match="init_process_group"):
        ring_attention(x, x, x)
    with pytest.raises(RuntimeError, match="init_process_group"):
        shard_sequence(x, causal=False)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_gpus_nccl():
    cases = [(1, 8, 8, 2048, 128, torch.float16, False), (1, 8, 2, 2048, 128, torch.bfloat16, True),
             (2, 4, 4, 1000, 80, torch.float16, True)]
    spawn(2, check_two_ranks, cases, "cuda", backend="nccl")
