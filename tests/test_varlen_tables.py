"""attention_varlen's tile tables: built on the host from the checked lengths, they equal the device builder's
(and a plain-Python statement of the table); a varlen call dispatches few torch ops, the tables coming over in one
copy instead of being built by ~20 small device ops after the check's synchronisation."""

import collections
import os
import subprocess
import sys
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

import autoflash
from autoflash.launch import compile_launch
from autoflash.resources import launcher
from conftest import DEVICE

LENGTH = st.sampled_from([0, 1, 7, 123, 1000]) | st.integers(0, 300)


def stated_table(lengths_q, lengths_k, rows_per_token, block, causal, count):
    """The table as its docstring states it, in plain Python: every (sequence, block), the blocks that see the
    most keys first (ties in sequence, then block order), then padding entries (-1, entry - the last sequence's
    first entry) up to count."""
    entries, first = [], 0
    for seq, (length, keys) in enumerate(zip(lengths_q, lengths_k)):
        rows, first = length * rows_per_token, len(entries)
        for block_index in range(-(-rows // block)):
            last = min((block_index + 1) * block, rows) // rows_per_token
            seen = min(max(last + keys - length, 0), keys) if causal else keys
            entries.append((seen, seq, block_index))
    pairs = [(seq, index) for _, seq, index in sorted(entries, key=lambda entry: -entry[0])]
    pairs += [(-1, entry - first) for entry in range(len(entries), count)]
    return [list(column) for column in zip(*pairs)]


@settings(max_examples=200, deadline=None)
@given(lengths_q=st.lists(LENGTH, min_size=1, max_size=10), data=st.data(),
       rows_per_token=st.sampled_from([1, 2, 4, 3]), block=st.sampled_from([16, 32, 64, 128]), causal=st.booleans())
def test_host_table_is_the_device_table(lengths_q, data, rows_per_token, block, causal):
    """The device's table (keys given as lengths or as offsets) is the host's and the stated one, entry for entry;
    the scratch the kernels read is poisoned first, the table's padding entries count too."""
    lengths_k = data.draw(st.lists(LENGTH, min_size=len(lengths_q), max_size=len(lengths_q)), label="lengths_k")
    offsets = data.draw(st.booleans(), label="keys as offsets")
    tl = launcher("tl", "varlen")
    count = -(-sum(lengths_q) * rows_per_token // block) + len(lengths_q)  # the plans' bound
    count += data.draw(st.integers(0, 200), label="extra entries")  # more than a kernel program's 128 too
    cu_seqlens_q = torch.tensor([0, *np.cumsum(lengths_q)], dtype=torch.int32, device=DEVICE)
    keys = torch.tensor([0, *np.cumsum(lengths_k)] if offsets else lengths_k, dtype=torch.int32, device=DEVICE)
    empty = torch.empty
    with mock.patch.object(torch, "empty", lambda *size, **kwargs: empty(*size, **kwargs).fill_(-7)):
        tiles = tl.device_tiles(compile_launch, cu_seqlens_q, keys, rows_per_token, block, causal, count, offsets)
        on_device = tiles(cu_seqlens_q, keys)
    on_host = tl.host_tiles(np.array(lengths_q), np.array(lengths_k), rows_per_token, block, causal, count)
    assert on_host.dtype == np.int32 and on_device.dtype == torch.int32
    assert on_device.cpu().tolist() == on_host.tolist() == stated_table(lengths_q, lengths_k, rows_per_token,
                                                                         block, causal, count)


@pytest.mark.parametrize("causal", [False, True])
def test_device_table_of_many_sequences(causal):
    """Past one chunk of the sequences (64) and one program's entries (128): 150 sequences, some empty, GQA rows."""
    gen = np.random.default_rng(0)
    lengths_q, lengths_k = gen.integers(0, 300, 150), gen.integers(0, 3000, 150)
    lengths_q[::7] = 0
    count = -(-int(lengths_q.sum()) * 4 // 64) + 150
    cu_seqlens_q = torch.tensor([0, *np.cumsum(lengths_q)], dtype=torch.int32, device=DEVICE)
    keys = torch.tensor(lengths_k, dtype=torch.int32, device=DEVICE)
    tl = launcher("tl", "varlen")
    on_device = tl.device_tiles(compile_launch, cu_seqlens_q, keys, 4, 64, causal, count)(cu_seqlens_q, keys)
    assert on_device.cpu().tolist() == tl.host_tiles(lengths_q, lengths_k, 4, 64, causal, count).tolist()


# Both table kernels compiled for sm_90 (Triton compiles for it without a GPU), causal or not, keys as lengths or
# as offsets, the table in one program or two kernels: what the interpreter runs, a GPU's compiler may refuse.
COMPILE_FOR_SM90 = """
import itertools
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from autoflash.resources import launcher
tl = launcher("tl", "varlen")
pointers = {"Cu_seqlens_q": "*i32", "Keys": "*i32", "Out": "*i32", "batch": "i32", "count": "i32"}
for causal, offsets, one_program in itertools.product((False, True), repeat=3):
    constexprs = dict(ROWS_PER_TOKEN=8, BLOCK=16, IS_CAUSAL=causal, KEYS_ARE_OFFSETS=offsets,
                      ONE_PROGRAM=one_program, ENTRIES=tl.TABLE_ENTRIES, SEQUENCES=tl.TABLE_SEQUENCES)
    triton.compile(ASTSource(tl._tile_keys, pointers | dict.fromkeys(constexprs, "constexpr"), constexprs),
                   target=GPUTarget("cuda", 90, 32))
triton.compile(ASTSource(tl._tile_order, {"Scratch": "*i32", "Tiles": "*i32", "count": "i32", "ENTRIES": "constexpr"},
                         {"ENTRIES": tl.TABLE_ENTRIES}), target=GPUTarget("cuda", 90, 32))
"""


def test_table_kernels_compile_for_sm90():
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", COMPILE_FOR_SM90], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]


def test_one_copy_keeps_each_array_aligned():
    arrays = [np.arange(5, dtype=np.int32), np.arange(6, dtype=np.int32).reshape(2, 3) - 3,
              np.array([7], dtype=np.int32)]
    moved = launcher("tl", "varlen").to_device(arrays, torch.device(DEVICE))
    for array, tensor in zip(arrays, moved):
        assert tensor.device.type == DEVICE and tensor.dtype == torch.int32 and tensor.is_contiguous()
        assert tensor.data_ptr() % 16 == 0 and tensor.cpu().tolist() == array.tolist()


class OpCount(TorchDispatchMode):
    """The torch ops dispatched while active, but those Triton's interpreter runs (the kernels' own work)."""

    def __init__(self):
        super().__init__()
        self.ops, self.paused = collections.Counter(), False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused:
            self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture
def count_ops(monkeypatch):
    """count_ops(fn): the Counter of torch ops that fn() dispatches."""
    from triton.runtime.interpreter import GridExecutor

    counter, interpret = OpCount(), GridExecutor.__call__

    def uncounted(self, *args, **kwargs):
        counter.paused = True
        try:
            return interpret(self, *args, **kwargs)
        finally:
            counter.paused = False
    monkeypatch.setattr(GridExecutor, "__call__", uncounted)

    def count(fn):
        counter.ops = collections.Counter()
        with counter:
            fn()
        return counter.ops
    return count


TABLE_OPS = {"aten.sort", "aten.searchsorted", "aten.index", "aten.cumsum", "aten.where", "aten.sub"}


@pytest.mark.parametrize("causal", [True, False])
def test_a_call_dispatches_few_ops(causal, count_ops):
    """Measured on the CPU before the host tables: 76 ops a forward under no_grad (65 not causal), 84 (73) with
    autograd, 100 (89) its backward (the engine's ops included); after: 24, 28 and 33 either way. A GPU adds
    the copies: the lengths to the host, the tables to the device."""
    lengths = [0, 1, 7, 123, 40]
    cu_seqlens = torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int32, device=DEVICE)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(sum(lengths), heads, 32, generator=gen).to(DEVICE).requires_grad_() for heads in (4, 2, 2))

    def forward():
        return autoflash.attention_varlen(q, k, v, cu_seqlens, cu_seqlens, 123, 123, causal=causal)
    forward().sum().backward()  # plans made, kernels compiled
    with torch.no_grad():
        forward()
        plain = count_ops(forward)
    out = []
    differentiable = count_ops(lambda: out.append(forward()))
    backward = count_ops(lambda: out[0].backward(torch.ones_like(out[0])))
    assert sum(plain.values()) <= 32 and sum(differentiable.values()) <= 36 and sum(backward.values()) <= 40, \
        (plain, differentiable, backward)
    assert not TABLE_OPS & (plain.keys() | differentiable.keys() | backward.keys()), "tables built by torch ops"
