"""What a worker process does with one variant: compile it, check it against the reference, time it.

A `Bench` lives in a worker process and holds one problem's inputs. It never raises for a bad
variant: every outcome comes back as an `Outcome` with one of the database's statuses.
"""

import importlib
import math
import traceback
from dataclasses import dataclass

import torch
from torch.nn.attention.bias import causal_lower_right
from torch.nn.functional import scaled_dot_product_attention

from autoflash.knobs import FwdKnobs
from autoflash.problem import Problem
from autoflash.reference import TOLERANCE, attention_reference, relative_error
from autoflash.tune.timing import input_sets, median_ms


@dataclass(frozen=True)
class Outcome:
    status: str  # one of autoflash.db.models.STATUSES
    median_ms: float | None = None
    error: str | None = None
    fatal: bool = False  # the worker's CUDA context is broken: it must be replaced


def load_function(path: str):
    """'package.module:function' -> the function (how a test swaps in a faulty kernel loader)."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def classify(error: BaseException) -> Outcome:
    text = "".join(traceback.format_exception_only(type(error), error)).strip()[-2000:]
    lowered = text.lower()
    if "cuda error" in lowered or "illegal" in lowered or "device-side assert" in lowered:
        return Outcome("crashed", error=text, fatal=True)
    if "outofresources" in type(error).__name__.lower() or "out of resource" in lowered:
        return Outcome("out_of_resources", error=text)
    return Outcome("compile_error", error=text)


class Bench:
    """One problem's inputs on one device; compiles, checks and times variants for it."""

    def __init__(self, problem: Problem, device: torch.device, loader: str, measure: bool):
        self.problem, self.device, self.load = problem, device, load_function(loader)
        self.scale = 1.0 / math.sqrt(problem.head_dim)
        p = problem
        bytes_per_set = p.element_size * p.head_dim * p.batch * (p.heads_q * p.seqlen_q * 2 + p.heads_kv * p.seqlen_k * 2)
        self.sets = [self._inputs(seed) for seed in range(input_sets(bytes_per_set, device) if measure else 1)]
        q = self.sets[0][0]
        self.out = torch.empty_like(q)
        self.lse = torch.empty(q.shape[:3], dtype=torch.float32, device=device)
        self.reference = self._reference() if measure else None

    def _inputs(self, seed: int):
        p = self.problem
        gen = torch.Generator(device=self.device).manual_seed(seed)
        q = torch.randn(p.batch, p.heads_q, p.seqlen_q, p.head_dim, generator=gen, device=self.device,
                        dtype=p.torch_dtype)
        k, v = (torch.randn(p.batch, p.heads_kv, p.seqlen_k, p.head_dim, generator=gen, device=self.device,
                            dtype=p.torch_dtype) for _ in range(2))
        return q, k, v

    def _samples(self):
        """(batch, head) slices checked against the fp64 reference: the first and the last."""
        p = self.problem
        return sorted({(0, 0), (p.batch - 1, p.heads_q - 1)})

    def _reference(self):
        q, k, v = self.sets[0]
        group = self.problem.heads_q // self.problem.heads_kv
        refs = {}
        for b, h in self._samples():
            refs[b, h] = attention_reference(q[b:b + 1, h:h + 1], k[b:b + 1, h // group:h // group + 1],
                                             v[b:b + 1, h // group:h // group + 1], self.problem.causal, self.scale)
        return refs

    def compile(self, knobs: FwdKnobs) -> Outcome:
        """Render, compile and run once: Triton's disk cache then serves the measuring process."""
        try:
            q, k, v = self.sets[0]
            self.load(knobs).forward(q, k, v, self.out, self.lse, self.scale, self.problem.causal)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            return Outcome("ok")
        except Exception as e:
            return classify(e)

    def measure(self, knobs: FwdKnobs) -> Outcome:
        try:
            forward = self.load(knobs).forward
            q, k, v = self.sets[0]
            self.out.fill_(float("nan"))
            self.lse.fill_(float("nan"))
            forward(q, k, v, self.out, self.lse, self.scale, self.problem.causal)
            wrong = self._check()
            if wrong:
                return Outcome("wrong_result", error=wrong)
            # Timed as checked, with the log-sum-exp (training needs it): the kernel compiled once.
            causal, scale, out, lse = self.problem.causal, self.scale, self.out, self.lse
            ms = median_ms(lambda i: forward(*self.sets[i], out, lse, scale, causal), len(self.sets), self.device)
            return Outcome("ok", median_ms=ms)
        except Exception as e:
            return classify(e)

    def _check(self) -> str | None:
        if torch.isnan(self.out).any():
            return "output holds NaN (unwritten elements or broken arithmetic)"
        tolerance = TOLERANCE[self.problem.torch_dtype]
        for (b, h), (ref_out, ref_lse) in self.reference.items():
            err = relative_error(self.out[b, h], ref_out[0, 0])
            if not err < tolerance:
                return f"output (batch {b}, head {h}) relative error {err:.2e} > {tolerance:.0e}"
            lse = self.lse[b, h].double()
            finite = torch.isfinite(ref_lse[0, 0])
            if not torch.equal(torch.isfinite(lse), finite) or \
                    not ((lse - ref_lse[0, 0])[finite].abs() <= 1e-2 + 1e-3 * ref_lse[0, 0][finite].abs()).all():
                return f"log-sum-exp (batch {b}, head {h}) disagrees with the reference"
        return None

    def sdpa_ms(self) -> float:
        """torch's scaled_dot_product_attention (its own backend choice) on the same inputs."""
        p = self.problem
        gqa = p.heads_q != p.heads_kv
        if p.causal and p.seqlen_q != p.seqlen_k:  # is_causal aligns top-left; ours is bottom-right
            mask = dict(attn_mask=causal_lower_right(p.seqlen_q, p.seqlen_k))
        else:
            mask = dict(is_causal=p.causal)
        return median_ms(lambda i: scaled_dot_product_attention(*self.sets[i], enable_gqa=gqa, **mask),
                         len(self.sets), self.device)
