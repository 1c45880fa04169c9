"""One attention problem: the shape key that tuning, the database and dispatch share."""

import math
from dataclasses import dataclass

import torch

BWD_FLOP_RATIO = 2.5
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
# Attention variants (what is computed, beside the shapes). Each is a Jinja gate of the templates: its code is
# rendered only for problems that use it (`{% if WINDOW %}...{% endif %}`), and a template fingerprint counts
# only the gates its problems use (codegen.template_fingerprint), so a plain problem's kernels, fingerprint and
# tuned records do not change when a variant is added.
VARIANTS = ("WINDOW", "SOFTCAP", "ALIBI", "VARLEN", "PAGED")


@dataclass(frozen=True)
class Problem:
    """Shapes of q (batch, heads_q, seqlen_q, head_dim) and k, v (batch, heads_kv, seqlen_k, head_dim)."""

    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    causal: bool
    dtype: str  # a key of DTYPES
    # Names of VARIANTS it uses. VARLEN: packed sequences (autoflash.attention_varlen, and the KV-cache entry point):
    # batch counts the sequences, seqlen_q and seqlen_k are the longest ones. PAGED: keys on pages of a cache.
    variants: frozenset[str] = frozenset()

    @classmethod
    def from_tensors(cls, q: torch.Tensor, k: torch.Tensor, causal: bool) -> "Problem":
        batch, heads_q, seqlen_q, head_dim = q.shape
        return cls(batch, heads_q, k.shape[1], seqlen_q, k.shape[2], head_dim, bool(causal),
                   str(q.dtype).removeprefix("torch."))

    def validate(self) -> "Problem":
        """This problem, if its fields are well formed (as one read from a file or a database must be); else a
        ValueError naming the field."""
        for name in ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"field '{name}' must be a positive integer, got {value!r}")
        if self.heads_q % self.heads_kv:
            raise ValueError(f"field 'heads_kv' ({self.heads_kv}) must divide heads_q ({self.heads_q})")
        if type(self.causal) is not bool:
            raise ValueError(f"field 'causal' must be true or false, got {self.causal!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"field 'dtype' must be one of {list(DTYPES)}, got {self.dtype!r}")
        return self

    def key(self) -> str:
        """A stable name, e.g. 'b4-hq32-hkv8-sq2048-sk2048-d128-causal-bfloat16'."""
        return (f"b{self.batch}-hq{self.heads_q}-hkv{self.heads_kv}-sq{self.seqlen_q}-sk{self.seqlen_k}"
                f"-d{self.head_dim}-{'causal' if self.causal else 'full'}-{self.dtype}"
                + "".join(f"-{name.lower()}" for name in sorted(self.variants)))

    def label(self) -> str:
        """Short form for tables: 'b4 h32/8 s2048 d128 causal bf16'."""
        heads = f"{self.heads_q}" if self.heads_q == self.heads_kv else f"{self.heads_q}/{self.heads_kv}"
        lengths = f"{self.seqlen_q}" if self.seqlen_q == self.seqlen_k else f"{self.seqlen_q}/{self.seqlen_k}"
        dtype = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}[self.dtype]
        return f"b{self.batch} h{heads} s{lengths} d{self.head_dim}{' causal' if self.causal else ''} {dtype}"

    def distance(self, other: "Problem") -> float | None:
        """Log-scale distance to a problem of the same kind (dtype, head dim, causal flag, GQA ratio): lengths
        and batch x heads compared in log2; None for a problem of another kind."""
        kind = (self.dtype, self.head_dim, self.causal, self.heads_q // self.heads_kv)
        if kind != (other.dtype, other.head_dim, other.causal, other.heads_q // other.heads_kv):
            return None
        return sum(abs(math.log2(x) - math.log2(y)) for x, y in (
            (self.seqlen_q, other.seqlen_q), (self.seqlen_k, other.seqlen_k),
            (self.batch * self.heads_q, other.batch * other.heads_q)))

    def tensor_bytes(self, direction: str = "fwd") -> int:
        """Bytes of one call's tensors: q, k, v, out and the fp32 lse; the backward adds dout, dq, dk, dv."""
        q = self.batch * self.heads_q * self.seqlen_q * self.head_dim
        kv = self.batch * self.heads_kv * self.seqlen_k * self.head_dim
        return (2 * q + 2 * kv) * (2 if direction == "bwd" else 1) * self.element_size \
            + 4 * self.batch * self.heads_q * self.seqlen_q

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def element_size(self) -> int:
        return self.torch_dtype.itemsize

    def random_inputs(self, device: torch.device, seed: int, with_dout: bool = False) -> tuple:
        """Fresh normal (q, k, v), and dout with `with_dout`, from a generator seeded with `seed`."""
        gen = torch.Generator(device=device).manual_seed(seed)

        def normal(heads, seqlen):
            return torch.randn(self.batch, heads, seqlen, self.head_dim, generator=gen, device=device,
                               dtype=self.torch_dtype)
        q = normal(self.heads_q, self.seqlen_q)
        k, v = normal(self.heads_kv, self.seqlen_k), normal(self.heads_kv, self.seqlen_k)
        return (q, k, v, torch.randn(q.shape, generator=gen, device=device, dtype=self.torch_dtype)) if with_dout \
            else (q, k, v)

    def visible_pairs(self) -> int:
        """(query, key) pairs that attend, per (batch, head): bottom-right causal or full."""
        if not self.causal:
            return self.seqlen_q * self.seqlen_k
        offset = self.seqlen_k - self.seqlen_q  # row i sees keys j <= i + offset
        return sum(max(0, min(self.seqlen_k, i + offset + 1)) for i in range(self.seqlen_q))

    def flops(self, direction: str = "fwd") -> float:
        """FLOPs of one pass: the backward counts 2.5 x the forward (five matmuls to the forward's two)."""
        return self.fwd_flops() * (BWD_FLOP_RATIO if direction == "bwd" else 1.0)

    def fwd_flops(self) -> float:
        """FlashAttention-paper count: 4·b·h·sq·sk·d for full attention, the visible half for causal.

        The paper counts causal as half of full; we count the pairs that really attend,
        which equals that for seqlen_q == seqlen_k up to the diagonal.
        """
        if not self.causal:
            return 4.0 * self.batch * self.heads_q * self.seqlen_q * self.seqlen_k * self.head_dim
        if self.seqlen_q == self.seqlen_k:
            return 2.0 * self.batch * self.heads_q * self.seqlen_q * self.seqlen_k * self.head_dim
        return 4.0 * self.batch * self.heads_q * self.visible_pairs() * self.head_dim
