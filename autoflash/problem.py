"""One attention problem: the shape key that tuning, the database and dispatch share."""

import math
import zlib
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from autoflash.checks import canonical_window

BWD_FLOP_RATIO = 2.5
TILE_ROWS = 64  # the fewest query rows a kernel tile takes: a problem with fewer a head is decode-like (`_kind`)
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
# Attention variants (what is computed, beside the shapes). Each is a Jinja gate of the templates: its code is
# rendered only for problems that use it (`{% if WINDOW %}...{% endif %}`), and a template fingerprint counts
# only the gates its problems use (codegen.template_fingerprint), so a plain problem's kernels, fingerprint and
# tuned records do not change when a variant is added.
VARIANTS = ("WINDOW", "SOFTCAP", "ALIBI", "VARLEN", "PAGED", "MASK_MOD", "SCORE_MOD")
# The fields of a plain problem (the shapes, the causal flag, the dtype); the variant fields follow them.
PLAIN_FIELDS = ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim", "causal", "dtype")


def length_bucket(length: int) -> int:
    """A packed problem's longest sequence as its key holds it: rounded up to a power of two."""
    return 1 << max(0, length - 1).bit_length()


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
    # batch counts the sequences, seqlen_q and seqlen_k are the longest ones, rounded up to powers of two
    # (`length_bucket`: one tuned record serves every batch of that bucket). PAGED: keys on pages of a cache
    # (page_size tokens a page), seqlen_k the cache's capacity per sequence.
    variants: frozenset[str] = frozenset()
    # Variants (flash-attn's meanings). window: (left, right) keys either side of the bottom-right diagonal, -1
    # unbounded, in the canonical form `with_variants` gives (the causal flag carries a right bound of 0). The
    # window changes the work, so its sizes are part of the problem; the softcap value and the ALiBi slopes are
    # data of each call (one tuned kernel serves every value): only whether they are used is.
    window: tuple[int, int] = (-1, -1)
    softcap: bool = False
    alibi: bool = False
    # A user-written mask (MASK_MOD, autoflash/mask_mod.py): the fingerprint of its source and its captures' dtypes
    # and ranks (MaskMod.fingerprint), "" for none. The mask changes the work, so each mod is a problem of its own.
    mask_mod: str = ""
    page_size: int = 0  # PAGED: tokens a page of the KV cache; 0 otherwise
    # A user-written score transform (SCORE_MOD, autoflash/score_mod.py): its fingerprint (ScoreMod.fingerprint), ""
    # for none. Its code changes the kernels (their speed too), so each mod is a problem of its own.
    score_mod: str = ""
    # The mods themselves (autoflash.MaskMod, ScoreMod), where the problem travels to a tuner's worker processes,
    # which compile, check and time its variants with them (`with_mods`); not part of its identity (the fingerprints
    # above are), never stored.
    mods: tuple = field(default=(), compare=False, repr=False)

    @classmethod
    def from_tensors(cls, q: torch.Tensor, k: torch.Tensor, causal: bool, window_size=(-1, -1), softcap=False,
                     alibi=False, mask_mod: str = "", score_mod: str = "") -> "Problem":
        batch, heads_q, seqlen_q, head_dim = q.shape
        return cls(batch, heads_q, k.shape[1], seqlen_q, k.shape[2], head_dim, bool(causal),
                   str(q.dtype).removeprefix("torch.")).with_variants(window_size, bool(softcap), bool(alibi),
                                                                      mask_mod, score_mod)

    def with_variants(self, window_size=(-1, -1), softcap: bool = False, alibi: bool = False,
                      mask_mod: str = "", score_mod: str = "") -> "Problem":
        """This problem with flash-attn's window_size (left, right) in canonical form (`checks.canonical_window`:
        a window that masks nothing is none, so such a call is a plain problem with its tuned records), softcap,
        alibi and a mask_mod's and a score_mod's fingerprints."""
        causal, window = canonical_window(self.causal, window_size, self.seqlen_q, self.seqlen_k)
        return replace(self, causal=causal, window=window, softcap=softcap, alibi=alibi, mask_mod=mask_mod,
                       score_mod=score_mod)

    def with_mods(self, *mods) -> "Problem":
        """This problem carrying `mods` (None for none), each the one its fingerprint field names."""
        mods = tuple(m for m in mods if m is not None)
        named = {self.mask_mod, self.score_mod} - {""}
        if {m.fingerprint() for m in mods} != named:
            raise ValueError(f"{self.label()} names the mods {sorted(named)}, given {[m.title for m in mods]}")
        return replace(self, mods=mods)

    def gates(self) -> frozenset[str]:
        """The variants this problem uses, as names of VARIANTS: the Jinja gates its kernels are rendered with
        (`variants`, and WINDOW, SOFTCAP, ALIBI, MASK_MOD, SCORE_MOD where the fields say)."""
        used = {"WINDOW": self.window != (-1, -1), "SOFTCAP": self.softcap, "ALIBI": self.alibi,
                "MASK_MOD": bool(self.mask_mod), "SCORE_MOD": bool(self.score_mod)}
        return self.variants | frozenset(name for name, on in used.items() if on)

    def bounds(self) -> tuple[int | None, int | None]:
        """(lowest, highest) offset j - (i + seqlen_k - seqlen_q) of a key j that query i sees; None: unbounded."""
        left, right = self.window
        return (None if left == -1 else -left), (0 if self.causal else None if right == -1 else right)

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
        if type(self.window) is not tuple or len(self.window) != 2 or \
                any(type(w) is not int or w < -1 for w in self.window):
            raise ValueError(f"field 'window' must be two integers >= -1 (left, right; -1: unbounded), "
                             f"got {self.window!r}")
        if type(self.mask_mod) is not str or self.mask_mod and (len(self.mask_mod) != 16 or self.window != (-1, -1)):
            raise ValueError(f"field 'mask_mod' must be a mod's 16-character fingerprint or '' (and a mod takes no "
                             f"window), got {self.mask_mod!r}")
        if type(self.variants) is not frozenset or not self.variants <= {"VARLEN", "PAGED"} or \
                "PAGED" in self.variants and "VARLEN" not in self.variants:
            raise ValueError(f"field 'variants' must be none, VARLEN, or VARLEN and PAGED, got {self.variants!r}")
        if type(self.page_size) is not int or (self.page_size > 0) != ("PAGED" in self.variants) or \
                self.page_size < 0:
            raise ValueError(f"field 'page_size' must be a positive integer for a PAGED problem and 0 otherwise, "
                             f"got {self.page_size!r}")
        if self.variants:
            for name in ("seqlen_q", "seqlen_k"):
                if length_bucket(getattr(self, name)) != getattr(self, name):
                    raise ValueError(f"field '{name}' of a packed problem is the longest sequence rounded up to a "
                                     f"power of two, as dispatch keys calls: write {length_bucket(getattr(self, name))}"
                                     f", not {getattr(self, name)}")
        if type(self.score_mod) is not str or self.score_mod and len(self.score_mod) != 16:
            raise ValueError(f"field 'score_mod' must be a mod's 16-character fingerprint or '', got "
                             f"{self.score_mod!r}")
        if self.with_variants(self.window, self.softcap, self.alibi, self.mask_mod, self.score_mod) != self:
            raise ValueError(f"field 'window' {self.window} is not in canonical form: build the problem with "
                             "with_variants()")
        for name in ("softcap", "alibi"):
            if type(getattr(self, name)) is not bool:
                raise ValueError(f"field '{name}' must be true or false, got {getattr(self, name)!r}")
        return self

    def key(self) -> str:
        """A stable name, e.g. 'b4-hq32-hkv8-sq2048-sk2048-d128-causal-bfloat16'; variants add their parts
        ('-varlen', '-paged', '-wl4096' for a window of 4096 keys to the left, '-wr16', '-softcap', '-alibi',
        '-mask' and the mod's fingerprint, '-score' and a score_mod's, '-page16' for pages of 16 tokens), plain
        problems none."""
        return (f"b{self.batch}-hq{self.heads_q}-hkv{self.heads_kv}-sq{self.seqlen_q}-sk{self.seqlen_k}"
                f"-d{self.head_dim}-{'causal' if self.causal else 'full'}-{self.dtype}"
                + "".join(f"-{part}" for part in self._variant_parts()))

    def _variant_parts(self) -> list[str]:
        left, right = self.window
        return [name.lower() for name in sorted(self.variants)] + [
            part for part, used in ((f"wl{left}", left != -1), (f"wr{right}", right != -1), ("softcap", self.softcap),
                                    ("alibi", self.alibi), (f"mask{self.mask_mod}", self.mask_mod),
                                    (f"score{self.score_mod}", self.score_mod),
                                    (f"page{self.page_size}", self.page_size)) if used]

    def stored_variants(self) -> dict:
        """The variant fields that differ from a plain problem's, as stored in a database ({} for plain)."""
        return {name: value for name, value, plain in (("variants", sorted(self.variants), []),
                                                       ("window", list(self.window), [-1, -1]),
                                                       ("softcap", self.softcap, False),
                                                       ("alibi", self.alibi, False),
                                                       ("mask_mod", self.mask_mod, ""),
                                                       ("score_mod", self.score_mod, ""),
                                                       ("page_size", self.page_size, 0)) if value != plain}

    def with_stored_variants(self, stored) -> "Problem":
        """This problem with the variant fields `stored_variants()` gave (read back from a database: validate it)."""
        if not isinstance(stored, dict) or set(stored) - {"variants", "window", "softcap", "alibi", "mask_mod",
                                                          "score_mod", "page_size"}:
            raise ValueError(f"field 'variants' must map variants, window, softcap, alibi, mask_mod, score_mod, "
                             f"page_size, got "
                             f"{str(stored)[:80]!r}: "
                             "this record may come from another autoflash version")
        window, names = stored.get("window", (-1, -1)), stored.get("variants", [])
        return replace(self, variants=frozenset(names) if isinstance(names, list) else names,
                       window=tuple(window) if isinstance(window, list) else window,
                       softcap=stored.get("softcap", False), alibi=stored.get("alibi", False),
                       mask_mod=stored.get("mask_mod", ""), score_mod=stored.get("score_mod", ""),
                       page_size=stored.get("page_size", 0))

    def label(self) -> str:
        """Short form for tables: 'b4 h32/8 s2048 d128 causal bf16'."""
        heads = f"{self.heads_q}" if self.heads_q == self.heads_kv else f"{self.heads_q}/{self.heads_kv}"
        lengths = f"{self.seqlen_q}" if self.seqlen_q == self.seqlen_k else f"{self.seqlen_q}/{self.seqlen_k}"
        dtype = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}[self.dtype]
        return (f"b{self.batch} h{heads} s{lengths} d{self.head_dim}{' causal' if self.causal else ''} {dtype}"
                + "".join(f" {part}" for part in self._variant_parts()))

    def distance(self, other: "Problem", direction: str = "fwd") -> float | None:
        """Log-scale distance to a problem of the same kind (`_kind`): lengths, batch x heads, page sizes (where
        both have pages) and, in the forward, GQA ratios (twice) compared in log2; None for a problem of another kind.
        Packed and paged problems are of the kind of the dense ones (dispatch prefers those with its own variants:
        dispatch.choose)."""
        if self._kind(direction) != other._kind(direction):
            return None
        steps = sum(abs(math.log2(x) - math.log2(y)) for x, y in (
            (self.seqlen_q, other.seqlen_q), (self.seqlen_k, other.seqlen_k),
            (self.batch * self.heads_q, other.batch * other.heads_q),
            *([(self.page_size, other.page_size)] if self.page_size and other.page_size else [])))
        if direction == "fwd":  # two steps a doubling: another ratio's winner only where none of this ratio is near
            steps += 2 * abs(math.log2(self.group) - math.log2(other.group))
        return steps

    def _kind(self, direction: str = "fwd") -> tuple:
        """What a tuned neighbour shares: dtype, head dim, causal flag, whether a head's query rows fill a query
        tile (fewer, decode and speculative chunks, run other shapes of kernel: query heads packed into a tile, keys
        split; a decode winner ran a 1000-token causal prefill at 0.66x plain SDPA, NOTES 74), window, softcap,
        alibi, mods (packed sequences and pages aside: `variants`); in the backward, the GQA ratio too. (A forward
        winner carries across ratios, at two steps of distance a doubling; the backward's, whose programs sum dK and
        dV over a group's query heads, did not: left out by kind on both GPUs' records, NOTES 92.)"""
        return (self.dtype, self.head_dim, self.causal, self.group if direction == "bwd" else None,
                self.seqlen_q < TILE_ROWS, self.window, self.softcap, self.alibi, self.mask_mod, self.score_mod)

    def tensor_bytes(self, direction: str = "fwd") -> int:
        """Bytes of one call's tensors: q, k, v, out and the fp32 lse; the backward adds dout, dq, dk, dv."""
        q = self.batch * self.heads_q * self.seqlen_q * self.head_dim
        kv = self.batch * self.heads_kv * self.seqlen_k * self.head_dim
        return (2 * q + 2 * kv) * (2 if direction == "bwd" else 1) * self.element_size \
            + 4 * self.batch * self.heads_q * self.seqlen_q

    def kv_bytes(self) -> int:
        """Bytes of K and V a forward reads at least once: what bounds a decode (packed: the sequences run)."""
        keys = sum(self.sequence_lengths()[1]) if "VARLEN" in self.variants else self.batch * self.seqlen_k
        return 2 * keys * self.heads_kv * self.head_dim * self.element_size

    def sequence_lengths(self) -> tuple[list[int], list[int]]:
        """The query and key lengths of the sequences a packed (VARLEN) problem is tuned on, fixed by the problem
        alone: sequence 0 holds seqlen_k keys, every other one a length drawn log-uniform in
        [ceil(seqlen_k / 16), seqlen_k] (numpy's default_rng seeded by the CRC-32 of 'batch-seqlen_q-seqlen_k', so
        problems that differ in heads, dtype or page size alone see the same lengths); a
        sequence of n keys has min(seqlen_q, n x ceil(seqlen_q / seqlen_k)) queries: all of them for self-attention
        (seqlen_q == seqlen_k), seqlen_q for decode and chunked prefill over a long cache."""
        rng = np.random.default_rng(zlib.crc32(f"{self.batch}-{self.seqlen_q}-{self.seqlen_k}".encode()))
        low = -(-self.seqlen_k // 16)
        drawn = np.exp(rng.uniform(math.log(low), math.log(self.seqlen_k), self.batch - 1)).round().astype(int)
        keys = [self.seqlen_k, *np.clip(drawn, low, self.seqlen_k).tolist()]
        per_key = -(-self.seqlen_q // self.seqlen_k)
        return [min(self.seqlen_q, n * per_key) for n in keys], keys

    @property
    def group(self) -> int:
        """Query heads a KV head serves (the GQA ratio; 1 for MHA)."""
        return self.heads_q // self.heads_kv

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
        """(query, key) pairs that attend, per (batch, head): full, or bottom-right causal and windowed."""
        low, high = self.bounds()
        if low is None and high is None:
            return self.seqlen_q * self.seqlen_k
        offset = self.seqlen_k - self.seqlen_q  # row i sees keys i + offset + low <= j <= i + offset + high
        first = (lambda i: 0) if low is None else (lambda i: max(0, i + offset + low))
        end = (lambda i: self.seqlen_k) if high is None else (lambda i: min(self.seqlen_k, i + offset + high + 1))
        return sum(max(0, end(i) - first(i)) for i in range(self.seqlen_q))

    def flops(self, direction: str = "fwd") -> float:
        """FLOPs of one pass: the backward counts 2.5 x the forward (five matmuls to the forward's two). Under a
        mask_mod, whose pairs depend on its captures' data (not in the problem), the pairs without it: a bound."""
        return self.fwd_flops() * (BWD_FLOP_RATIO if direction == "bwd" else 1.0)

    def tflops(self, direction: str, ms: float | None) -> float | None:
        """TFLOP/s of a pass of `ms` milliseconds, as reports show it; None where unknown (no time, or a mask_mod's
        pairs: `flops`; a database's trial rows keep `flops`' bound, which its readers require)."""
        return self.flops(direction) / ms * 1e-9 if ms and not self.mask_mod else None

    def fwd_flops(self) -> float:
        """FlashAttention-paper count: 4·b·h·sq·sk·d for full attention, the visible half for causal.

        The paper counts causal as half of full; we count the pairs that really attend,
        which equals that for seqlen_q == seqlen_k up to the diagonal. A window counts the pairs it sees. A packed
        problem (VARLEN, PAGED too) counts the sequences its trials run (`sequence_lengths`), each as its own.
        """
        if "VARLEN" in self.variants:
            return sum(replace(self, batch=1, seqlen_q=q, seqlen_k=k, variants=frozenset(), page_size=0).fwd_flops()
                       for q, k in zip(*self.sequence_lengths()) if q and k)
        if self.window != (-1, -1):
            return 4.0 * self.batch * self.heads_q * self.visible_pairs() * self.head_dim
        if not self.causal:
            return 4.0 * self.batch * self.heads_q * self.seqlen_q * self.seqlen_k * self.head_dim
        if self.seqlen_q == self.seqlen_k:
            return 2.0 * self.batch * self.heads_q * self.seqlen_q * self.seqlen_k * self.head_dim
        return 4.0 * self.batch * self.heads_q * self.visible_pairs() * self.head_dim
