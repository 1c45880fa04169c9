"""Trials of packed problems (VARLEN; PAGED): the inputs of autoflash.attention_varlen and
autoflash.attention_with_kvcache, timed through the varlen launcher's plans.

The sequences' lengths are the problem's own (`Problem.sequence_lengths`), the same for every variant and input
set. Query rows and keys are packed as attention_varlen packs them, (tokens, heads, head_dim); a PAGED problem's
keys and values are moved onto the pages of a cache (page_size rows each, in one shuffled order, as a serving
engine's allocator leaves them) that a block table lists per sequence. A dense-cache problem (VARLEN alone) is
timed on packed keys: the kernel is the same, only the stride between sequences differs. Checked as the dense
trials are (trial.Bench), on the first and last (sequence, query head) against the fp64 reference; sequence 0 is
the longest.
"""

import numpy as np
import torch

from autoflash import codegen, gpu as gpus
from autoflash.families import default_knobs
from autoflash.tune.trial import Bench


class PackedBench(Bench):
    """A Bench whose batch entries are packed sequences of `Problem.sequence_lengths`. Input sets are
    (q, k, v) as the kernels' (1, heads, tokens, head_dim) views, with (out, lse, dout) for the backward."""

    def __init__(self, problem, direction, device, loader, measure):
        lengths_q, lengths_k = problem.sequence_lengths()
        self.host = (np.array(lengths_q, dtype=np.int64), np.array(lengths_k, dtype=np.int64))
        self.offsets = [np.concatenate(([0], np.cumsum(lengths))).tolist() for lengths in self.host]
        self.cu_q, self.cu_k = (torch.tensor(o, dtype=torch.int32, device=device) for o in self.offsets)
        self.seqlens_k = torch.tensor(lengths_k, dtype=torch.int32, device=device)
        # each sequence's first key: its row of packed k, v, or (pages) row 0 of its first page
        self.starts_k = torch.zeros_like(self.seqlens_k) if problem.page_size else self.cu_k[:-1]
        self.pages = []  # per input set of a PAGED problem: (k, v page-0 views, block table, page strides)
        super().__init__(problem, direction, device, loader, measure)

    def _set_bytes(self) -> int:
        p, (total_q, total_k) = self.problem, (self.offsets[0][-1], self.offsets[1][-1])
        pool = 2 * p.batch * -(-p.seqlen_k // p.page_size) * p.page_size if p.page_size else 0
        size = p.element_size * p.head_dim * (2 * p.heads_q * total_q + 2 * p.heads_kv * (total_k + pool))
        return size * (2 if self.direction == "bwd" else 1)

    def _rows(self, t, index, keys=False):
        offsets = self.offsets[1 if keys else 0]
        return t[:, :, offsets[index]:offsets[index + 1]]

    def _inputs(self, seed: int):
        p = self.problem
        gen = torch.Generator(device=self.device).manual_seed(seed)

        def normal(tokens, heads):  # packed (tokens, heads, head_dim), as the kernels' view
            return torch.randn(tokens, heads, p.head_dim, generator=gen, device=self.device,
                               dtype=p.torch_dtype).permute(1, 0, 2).unsqueeze(0)
        total_q, total_k = self.offsets[0][-1], self.offsets[1][-1]
        q, k, v = normal(total_q, p.heads_q), normal(total_k, p.heads_kv), normal(total_k, p.heads_kv)
        if p.page_size:
            self.pages.append(self._paged(k, v, seed))
        if self.direction == "fwd":
            return q, k, v
        dout = normal(total_q, p.heads_q)
        out, lse = torch.empty_like(q), torch.empty(q.shape[:3], dtype=torch.float32, device=self.device)
        forward = codegen.load(default_knobs(p, gpus.current(self.device)), p.gates())
        lengths = (self.cu_q, self.starts_k, self.seqlens_k)
        forward.varlen_forward_plan(q, k, v, out, lse, *lengths, self.scale, p.causal)(q, k, v, out, lse, *lengths,
                                                                                       None, self.host)
        return q, k, v, out, lse, dout

    def _paged(self, k, v, seed: int):
        """k and v's rows on the pages of two caches (batch x pages_per_sequence pages in an order shuffled by
        `seed`): the caches' page-0 views (1, heads_kv, page_size, head_dim), the block table, the caches' page
        strides."""
        p = self.problem
        per_sequence = -(-p.seqlen_k // p.page_size)
        order = torch.randperm(p.batch * per_sequence, generator=torch.Generator().manual_seed(seed))
        block_table = order.view(p.batch, per_sequence).to(self.device, torch.int32)
        sequence = torch.repeat_interleave(torch.arange(p.batch, device=self.device), self.seqlens_k.long())
        position = torch.arange(sequence.numel(), device=self.device) - self.cu_k[sequence].long()
        page, row = block_table[sequence, position // p.page_size].long(), position % p.page_size
        caches = []
        for t in (k, v):
            cache = torch.zeros(p.batch * per_sequence, p.page_size, p.heads_kv, p.head_dim, dtype=t.dtype,
                                device=self.device)
            cache[page, row] = t[0].transpose(0, 1)
            caches.append(cache)
        return (*(c[0].permute(1, 0, 2).unsqueeze(0) for c in caches), block_table, tuple(c.stride(0) for c in caches))

    def _plan(self, variant: codegen.Variant):
        """launch(i): the variant on input set i through the varlen launcher's plan, with the lengths on the host
        as attention_varlen passes them outside CUDA graphs."""
        p, lengths = self.problem, (self.cu_q, self.starts_k, self.seqlens_k)
        if self.direction == "fwd":
            def keys(i):  # (k, v, block_table, page strides)
                return self.pages[i] if p.page_size else (*self.sets[i][1:3], None, None)
            k, v, block_table, strides = keys(0)
            plan = variant.varlen_forward_plan(self.sets[0][0], k, v, self.out, self.lse, *lengths, self.scale,
                                               p.causal, (block_table, p.page_size, *strides) if p.page_size else None)
            return lambda i: plan(self.sets[i][0], *keys(i)[:2], self.out, self.lse, *lengths, keys(i)[2], self.host)
        plan = variant.varlen_backward_plan(*self.sets[0], *self.grads, self.cu_q, self.cu_k, self.scale, p.causal,
                                            None)
        return lambda i: plan(*self.sets[i], *self.grads, None, self.cu_q, self.cu_k, self.host)
