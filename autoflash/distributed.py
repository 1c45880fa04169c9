"""Ring attention (context parallelism): attention over a sequence sharded across the ranks of a process group.

Each rank keeps its query shard; the key/value shards travel around the ring (rank r sends to r + 1 and receives
from r - 1, `torch.distributed.batch_isend_irecv`), the next step's transfer posted before the current step's
kernel so that it overlaps; K and V go as two messages of one batch, not copied into one. Each step is one
`autoflash.attention(..., return_lse=True)` call, dispatched like any other problem (seqlen_q = a local shard,
seqlen_k = one peer's shard), and its output is folded into the running result through the log-sum-exp, in fp32
and rounded once: at 2 ranks straight into step 0's output, at more into an fp32 copy of it. The backward runs
autoflash's backward kernels per step with the merged output and lse (so P and rowsum(dO * O) are the full
attention's, FlashAttention-2's backward), sends the dK/dV of each K/V shard around the ring with it (accumulated
in fp32) and home at the end. The same code runs on NCCL (GPUs; call torch.cuda.set_device first) and gloo (CPU
tensors under TRITON_INTERPRET=1).

Layouts (dim 2 is the sequence; `shard_sequence` and `gather_sequence` convert):
- full (causal=False): N equal chunks, rank r holds chunk r.
- causal: zig-zag over 2N chunks of C tokens: rank r holds chunks r and 2N-1-r, concatenated (2C local tokens).
  Every rank then has the same causal work at every step. At step s rank r holds the K/V of rank j = (r - s) mod N:
  - j == r (step 0): chunk r sees chunk r on the diagonal and not chunk 2N-1-r; chunk 2N-1-r sees chunk r in
    full and itself on the diagonal: one causal call of the 2C local queries on the 2C local keys.
  - j < r: both query chunks see key chunk j in full and neither sees chunk 2N-1-j (it lies after both):
    a full call of the 2C queries on the first C keys.
  - j > r: query chunk r sees neither key chunk (both lie after it); chunk 2N-1-r sees both in full:
    a full call of the last C queries on the 2C keys.
"""

import weakref
import zlib

import torch
import torch.distributed as dist

from autoflash import checks, gpu as gpus
from autoflash.api import attention, attention_backward

__all__ = ["ring_attention", "shard_sequence", "gather_sequence"]

_ALL = slice(None)


def ring_attention(q, k, v, *, group=None, causal=False, softmax_scale=None):
    """Attention of this rank's query shard over the whole sequence, whose shards the ranks of `group` hold.

    Call it on every rank of the group with the same shapes and arguments. Differentiable: gradients flow to
    this rank's q, k and v shards.

    Args:
        q: (batch, heads_q, local_seqlen, head_dim), this rank's shard in the layout `shard_sequence` gives for
            `causal` (for causal, local_seqlen is even: two chunks).
        k, v: (batch, heads_kv, local_seqlen, head_dim); heads_q a multiple of heads_kv (GQA: only the KV heads
            travel). dtype, head_dim and strides as `autoflash.attention` takes them.
        group: the process group whose ranks hold the shards, in rank order; default the whole world.
        causal: causal attention over the global sequence (the zig-zag layout); else full attention.
        softmax_scale: scale of the scores; default 1 / sqrt(head_dim).

    Returns:
        out, (batch, heads_q, local_seqlen, head_dim) in q's dtype: this rank's rows of the global attention.

    The first call on a group checks that every rank passes the same shapes, dtype, causal and softmax_scale (one
    all_gather of a few numbers); later calls on that group trust them.
    """
    ring = _Ring(group)
    _check_shards(q, k, v, causal)
    scale = checks.scale_of(softmax_scale, q.shape[-1])
    if ring.group not in _agreed_groups:
        _check_agreement(ring, q, k, causal, scale)
        _agreed_groups.add(ring.group)
    if q.dtype == torch.bfloat16 and gpus.interpreting():  # the interpreter's bf16 tl.dot is wrong: as api.py does
        return ring_attention(q.float(), k.float(), v.float(), group=group, causal=causal,
                              softmax_scale=scale).to(torch.bfloat16)
    q = q if q.stride(-1) == 1 else q.contiguous()  # the backward kernels take rows of unit stride
    return _RingAttention.apply(q, k, v, ring, causal, scale)


def shard_sequence(x, *, causal, group=None):
    """This rank's shard of a full (batch, heads, seqlen, head_dim) tensor, in the layout `ring_attention` takes
    for `causal`: chunk r of N (full), or chunks r and 2N-1-r of 2N concatenated (causal). Differentiable."""
    ring = _Ring(group)
    chunks = _layout_chunks(ring.size, causal)
    if x.dim() != 4 or x.shape[2] % chunks:
        raise ValueError(f"shard_sequence takes (batch, heads, seqlen, head_dim) with seqlen a multiple of {chunks} "
                         f"({'2 x ' if causal else ''}world size {ring.size}), got shape {tuple(x.shape)}: pad the "
                         "sequence")
    pieces = x.chunk(chunks, dim=2)
    if not causal:
        return pieces[ring.rank].contiguous()
    return torch.cat((pieces[ring.rank], pieces[chunks - 1 - ring.rank]), dim=2)


def gather_sequence(x_local, *, causal, group=None):
    """The full (batch, heads, seqlen, head_dim) tensor on every rank, from each rank's shard in the layout of
    `causal` (the inverse of `shard_sequence`). Not differentiable: the result is detached."""
    ring = _Ring(group)
    if x_local.dim() != 4 or (causal and x_local.shape[2] % 2):
        raise ValueError("gather_sequence takes (batch, heads, local_seqlen, head_dim) shards, local_seqlen even for "
                         f"the causal layout, got shape {tuple(x_local.shape)}")
    x_local = x_local.detach().contiguous()
    shards = [torch.empty_like(x_local) for _ in range(ring.size)]
    dist.all_gather(shards, x_local, group=ring.group)
    if not causal:
        return torch.cat(shards, dim=2)
    halves = [shard.chunk(2, dim=2) for shard in shards]  # rank r: chunks r and 2N-1-r
    return torch.cat([first for first, _ in halves] + [second for _, second in reversed(halves)], dim=2)


class _Ring:
    """This process's place in the ring of `group` (default the world): K/V shards go from each rank to the next."""

    def __init__(self, group):
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("autoflash.distributed needs an initialised process group: call "
                               "torch.distributed.init_process_group('nccl') (GPUs) or ('gloo') (CPU) in every "
                               "process first, e.g. under torchrun")
        self.group = dist.group.WORLD if group is None else group
        self.rank, self.size = dist.get_rank(self.group), dist.get_world_size(self.group)
        if self.rank < 0:
            raise ValueError("this process is not a member of `group`: call it on the group's ranks only")
        self.next = dist.get_global_rank(self.group, (self.rank + 1) % self.size)
        self.previous = dist.get_global_rank(self.group, (self.rank - 1) % self.size)

    def source(self, step: int) -> int:
        """The rank whose K/V shard this rank holds at `step` (0: its own)."""
        return (self.rank - step) % self.size

    def pass_on(self, tensors):
        """Post, in one batch, the sends of `tensors` (a tuple of contiguous tensors) to the next rank and the
        receives of the previous rank's, shaped alike, into new buffers; return wait() -> the received tuple. A ring
        of one passes `tensors` to itself."""
        if self.size == 1:
            return lambda: tensors
        received = tuple(torch.empty_like(t) for t in tensors)
        # one tag a message: gloo matches them by tag (NCCL in order)
        requests = dist.batch_isend_irecv(
            [dist.P2POp(dist.isend, t, self.next, self.group, tag=tag) for tag, t in enumerate(tensors)]
            + [dist.P2POp(dist.irecv, r, self.previous, self.group, tag=tag) for tag, r in enumerate(received)])

        def wait():
            for request in requests:
                request.wait()
            return received
        return wait


# Groups whose ranks were found to agree on shapes and arguments (at their first ring_attention call).
_agreed_groups = weakref.WeakSet()


def _layout_chunks(world_size: int, causal: bool) -> int:
    return 2 * world_size if causal else world_size


def _check_shards(q, k, v, causal):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor (batch, heads, local_seqlen, head_dim), got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    if not (q.dtype == k.dtype == v.dtype and q.device == k.device == v.device):
        raise TypeError(f"q, k, v must share one dtype and device, got {q.dtype} on {q.device}, {k.dtype} on "
                        f"{k.device}, {v.dtype} on {v.device}")
    if k.shape != v.shape or q.shape[2] != k.shape[2]:
        raise ValueError(f"q, k, v shards must hold the same tokens (k and v one shape), got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}: shard each with shard_sequence")
    if causal and q.shape[2] % 2:
        raise ValueError(f"causal ring attention takes zig-zag shards of two equal chunks, got local_seqlen "
                         f"{q.shape[2]}: shard_sequence(x, causal=True) of a sequence divisible by 2 x world size")


def _check_agreement(ring, q, k, causal, scale):
    """Raise on every rank if the ranks disagree on shapes, dtype, causal or the scale."""
    mine = torch.tensor([*q.shape, *k.shape, zlib.crc32(str(q.dtype).encode()), causal, scale],
                        dtype=torch.float64, device=q.device)
    everyone = [torch.empty_like(mine) for _ in range(ring.size)]
    dist.all_gather(everyone, mine, group=ring.group)
    differing = [rank for rank, theirs in enumerate(everyone) if not torch.equal(theirs, mine)]
    if differing:
        raise ValueError(f"ring_attention's ranks disagree: rank {ring.rank} has q {tuple(q.shape)}, k "
                         f"{tuple(k.shape)}, {q.dtype}, causal={causal}, softmax_scale={scale}, but ranks "
                         f"{differing} do not: every rank must pass shards of one shape and the same arguments")


def _step_blocks(rank: int, source: int, half: int, causal: bool):
    """(query rows, key rows, causal) of the call at the step where `rank` holds the K/V shard of rank `source`
    (the module docstring works them out); `half` = C, the tokens of one zig-zag chunk."""
    if not causal:
        return _ALL, _ALL, False
    if source == rank:
        return _ALL, _ALL, True
    if source < rank:
        return _ALL, slice(0, half), False
    return slice(half, None), _ALL, False


class _RingAttention(torch.autograd.Function):
    """The ring's forward (merged through the lse) and backward (dK/dV travelling home); saves q, k, v, out, lse."""

    @staticmethod
    def forward(ctx, q, k, v, ring, causal, scale):
        out, lse = _ring_forward(q, k, v, ring, causal, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.causal, ctx.scale = ring, causal, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _ring_backward(q, k, v, out, lse, dout, ctx.ring, ctx.causal, ctx.scale)
        return dq, dk, dv, None, None, None


def _ring_forward(q, k, v, ring, causal, scale):
    """(out in q's dtype, lse fp32) of this rank's queries over every rank's keys."""
    kv = (k.contiguous(), v.contiguous())  # NCCL sends contiguous tensors (a no-op for shard_sequence's)
    for step in range(ring.size):
        if step + 1 < ring.size:
            incoming = ring.pass_on(kv)
        rows, keys, step_causal = _step_blocks(ring.rank, ring.source(step), q.shape[2] // 2, causal)
        block_out, block_lse = attention(q[:, :, rows], kv[0][:, :, keys], kv[1][:, :, keys], causal=step_causal,
                                         softmax_scale=scale, return_lse=True)
        if step == 0:
            # Step 0 (the shard's own keys) covers every row, and every row sees a key there (causal: its own), so
            # lse is finite from here on: the steps after it add keys to rows, never a row's first. One merge to
            # come (2 ranks) goes straight into this output; more accumulate in fp32, rounded once at the end.
            out, lse = block_out if ring.size <= 2 else block_out.float(), block_lse
        else:
            _merge(out[:, :, rows], lse[:, :, rows], block_out, block_lse)
        if step + 1 < ring.size:
            kv = incoming()
    return out.to(q.dtype), lse


def _merge(out, lse, block_out, block_lse):
    """Fold one step's attention (block_out, block_lse) over more keys into the running (out, lse), in place:
    lse' = log(e^lse + e^block_lse) and out' = e^(lse - lse') out + e^(block_lse - lse') block_out, where
    e^(lse - lse') = sigmoid(lse - block_lse). The sum is taken in fp32 and rounded once to out's dtype (two passes
    over out). lse must be finite (a row's first keys are not merged)."""
    gap = lse - block_lse
    keep, new = torch.sigmoid(gap).unsqueeze(-1), torch.sigmoid(-gap).unsqueeze(-1)
    torch.addcmul(out * keep, block_out, new, out=out)  # out * keep: fp32, whatever out's dtype
    lse.sub_(torch.nn.functional.logsigmoid(gap))


def _ring_backward(q, k, v, out, lse, dout, ring, causal, scale):
    """(dq, dk, dv) of this rank's shards. Each step's backward uses the merged out and lse (the full attention's P
    and rowsum(dO * O)); the dK/dV of a K/V shard accumulate in fp32 as they follow it around the ring and home."""
    dout = dout if dout.stride(-1) == 1 else dout.contiguous()
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    kv = (k.contiguous(), v.contiguous())
    for step in range(ring.size):
        if step + 1 < ring.size:
            incoming = ring.pass_on(kv)
        rows, keys, step_causal = _step_blocks(ring.rank, ring.source(step), q.shape[2] // 2, causal)
        # autoflash's dispatched backward kernels with the merged out and lse (autograd through the step's forward
        # would use the step's own)
        block_dq, block_dk, block_dv = attention_backward(
            dout[:, :, rows], q[:, :, rows], kv[0][:, :, keys], kv[1][:, :, keys], out[:, :, rows], lse[:, :, rows],
            None, step_causal, scale, False)
        dq[:, :, rows] += block_dq
        # The dK/dV of the shard in hand, as far as the ranks before this one got: zeros at step 0 (our own shard).
        dk, dv = ([torch.zeros(t.shape, dtype=torch.float32, device=q.device) for t in kv] if step == 0
                  else incoming_dkv())
        dk[:, :, keys] += block_dk
        dv[:, :, keys] += block_dv
        incoming_dkv = ring.pass_on((dk, dv))
        if step + 1 < ring.size:
            kv = incoming()
    dk, dv = incoming_dkv()  # our own shard's, back from the last rank that held it
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)

