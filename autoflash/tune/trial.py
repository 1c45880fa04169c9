"""What a worker process does with one variant: compile it, check it against the reference, time it.

A `Bench` lives in a worker process and holds one problem's inputs. It never raises for a bad
variant: every outcome comes back as an `Outcome` with one of the database's statuses.
"""

import importlib
import math
import traceback
from dataclasses import dataclass

import torch

from autoflash import checks, codegen, gpu as gpus
from autoflash.families import default_knobs
from autoflash.knobs import Knobs
from autoflash.problem import Problem
from autoflash.reference import (GRAD_TOLERANCE, TOLERANCE, attention_backward_reference, attention_reference,
                                 relative_error, sdpa_attention)
from autoflash.tune.timing import backward_ms, input_sets, median_ms


# What a variant problem is timed and checked with: a softcap of Gemma 2's attention, ALiBi's slopes for its heads.
TUNING_SOFTCAP = 50.0
# Calls shorter than this are timed within replays of a CUDA graph, the GPU's time alone: called one after another
# they wait on the host's launches, more so beside the compile workers (NOTES 112: a 45-us kernel timed 66 us),
# so their order would be the host's. The product replays such passes from graphs too (autoflash/graphs.py).
GRAPH_BELOW_MS = 0.2


def alibi_slopes(heads: int, device) -> torch.Tensor:
    """ALiBi's slopes (Press et al.): the geometric sequence 2^(-8 i / heads), i = 1..heads."""
    return torch.tensor([2.0 ** (-8.0 * i / heads) for i in range(1, heads + 1)], dtype=torch.float32, device=device)


def variant_kwargs(problem: Problem, device) -> dict:
    """autoflash.attention's variant arguments for timing `problem` (window_size, softcap, alibi_slopes)."""
    return dict(window_size=problem.window, softcap=TUNING_SOFTCAP if problem.softcap else 0.0,
                alibi_slopes=alibi_slopes(problem.heads_q, device) if problem.alibi else None)


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
    if "outofresources" in type(error).__name__.lower() or isinstance(error, MemoryError) or \
            any(s in lowered for s in ("out of resource", "out of memory", "can't allocate memory")):
        return Outcome("out_of_resources", error=text)  # shared memory, registers, or the memory there is
    return Outcome("compile_error", error=text)


def _mods(problem: Problem, device: torch.device) -> tuple:
    """(mask_mod, score_mod) that `problem` names (None for none), from the mods it carries (Problem.with_mods),
    their captures on `device`."""
    carried = {mod.fingerprint(): mod for mod in problem.mods}
    found = []
    for kind, fingerprint in (("mask_mod", problem.mask_mod), ("score_mod", problem.score_mod)):
        if fingerprint and fingerprint not in carried:
            raise ValueError(f"{problem.label()}: its {kind} {fingerprint} did not come with it: a mod's problem is "
                             "tuned with the mod (Problem.with_mods; autoflash.configure(tune='on-miss') passes the "
                             "call's), a problems file cannot name one")
        mod = carried.get(fingerprint) if fingerprint else None
        found.append(mod and mod.with_captures([t.to(device) for t in mod.captures]))
    return tuple(found)


class Bench:
    """One problem's inputs on one device, for one direction; compiles, checks and times variants.

    Forward variants run on (q, k, v) and are checked on out and lse. Backward variants run on
    (q, k, v, out, lse, dout), out and lse from the default forward kernel, and are checked on dq, dk, dv.
    """

    def __init__(self, problem: Problem, direction: str, device: torch.device, loader: str, measure: bool):
        self.problem, self.direction, self.device, self.load = problem, direction, device, load_function(loader)
        self.scale = 1.0 / math.sqrt(problem.head_dim)
        p = problem
        # The variants' call-time data, the same for every variant timed (the mods' captures in autoflash.attention's
        # order: ALiBi's slopes, the score_mod's, the mask_mod's).
        self.reference_variants = variant_kwargs(p, device)
        softcap, slopes = self.reference_variants["softcap"], self.reference_variants["alibi_slopes"]
        self.mask_mod, self.score_mod = _mods(p, device)
        mods = [("score_mod", self.score_mod), ("mask_mod", self.mask_mod)]
        self.rendered = {name: mod.rendered for name, mod in mods if mod is not None}
        self.variant = checks.variant_args(p.causal, p.window, p.seqlen_q, p.seqlen_k, softcap, slopes, self.mask_mod,
                                           self.score_mod)
        self.extra = (*(() if slopes is None else (slopes,)), *(t for _, mod in mods if mod is not None
                                                                 for t in mod.captures))
        self.sets = [self._inputs(seed) for seed in range(input_sets(self._set_bytes(), device) if measure else 1)]
        q, k, v = self.sets[0][:3]
        self.out = torch.empty_like(q)
        self.lse = torch.empty(q.shape[:3], dtype=torch.float32, device=device)
        self.grads = tuple(torch.empty_like(t) for t in (q, k, v))
        self.reference = self._reference() if measure else None

    def _set_bytes(self) -> int:
        """Bytes of one input set and its outputs."""
        p = self.problem
        q_bytes, kv_bytes = p.batch * p.heads_q * p.seqlen_q * p.head_dim, p.batch * p.heads_kv * p.seqlen_k * p.head_dim
        return p.element_size * (2 * q_bytes + 2 * kv_bytes) * (2 if self.direction == "bwd" else 1)

    def _rows(self, t: torch.Tensor, index: int, keys: bool = False) -> torch.Tensor:
        """Batch entry (here: sequence) `index` of t, (1, heads, rows, ...): of q, out, lse, dout, dq, or with
        `keys` of k, v, dk, dv."""
        return t[index:index + 1]

    def _inputs(self, seed: int):
        p = self.problem
        if self.direction == "fwd":
            return p.random_inputs(self.device, seed)
        q, k, v, dout = p.random_inputs(self.device, seed, with_dout=True)
        out, lse = torch.empty_like(q), torch.empty(q.shape[:3], dtype=torch.float32, device=self.device)
        forward = codegen.load(default_knobs(p, gpus.current(self.device)), p.gates(), **self.rendered).forward
        forward(q, k, v, out, lse, self.scale, p.causal, variant=self.variant)
        return q, k, v, out, lse, dout

    def _samples(self):
        """(batch, query head) slices checked against the fp64 reference: the first and the last."""
        p = self.problem
        return sorted({(0, 0), (p.batch - 1, p.heads_q - 1)})

    def _reference(self):
        """Per sample (b, h): the forward's (out, lse) of query head h, or the backward's (dq of head h,
        dk and dv of its KV head, from all the query heads of its group)."""
        q, k, v = self.sets[0][:3]
        group = self.problem.group
        slopes = self.reference_variants["alibi_slopes"]

        def of_head(b, head):  # the variant arguments of one query head of batch entry b
            return dict(self.reference_variants, alibi_slopes=None if slopes is None else slopes[head:head + 1],
                        **{name: mod.at(b, head) for name, mod in (("mask_mod", self.mask_mod),
                                                                   ("score_mod", self.score_mod)) if mod is not None})
        refs = {}
        for b, h in self._samples():
            hkv = h // group
            kv = (self._rows(k, b, keys=True)[:, hkv:hkv + 1], self._rows(v, b, keys=True)[:, hkv:hkv + 1])
            if self.direction == "fwd":
                refs[b, h] = tuple(t[0, 0] for t in attention_reference(self._rows(q, b)[:, h:h + 1], *kv,
                                                                        self.problem.causal, self.scale, **of_head(b, h)))
            else:  # one query head at a time (fp64 scores of a 32k x 32k head are 8.6 GB), dK and dV summed
                dout, dk, dv = self._rows(self.sets[0][5], b), 0.0, 0.0
                for head in range(hkv * group, (hkv + 1) * group):
                    dq_h, dk_h, dv_h = attention_backward_reference(
                        self._rows(q, b)[:, head:head + 1], *kv, dout[:, head:head + 1], self.problem.causal,
                        self.scale, **of_head(b, head))
                    dk, dv = dk + dk_h[0, 0], dv + dv_h[0, 0]
                    if head == h:
                        dq = dq_h[0, 0]
                refs[b, h] = (dq, dk, dv)
        return refs

    def _plan(self, variant: codegen.Variant):
        """launch(i): the variant on input set i (the forward with the log-sum-exp training needs), launched as
        autoflash.attention launches it: compiled once, then started directly (Triton's per-call binding would
        time the host on small problems)."""
        extra = self.extra
        if self.direction == "fwd":
            plan = variant.forward_plan(*self.sets[0], self.out, self.lse, self.scale, self.problem.causal,
                                        variant=self.variant)
            return lambda i: plan(*self.sets[i], self.out, self.lse, *extra)
        plan = variant.backward_plan(*self.sets[0], *self.grads, self.scale, self.problem.causal, None,
                                     variant=self.variant)
        return lambda i: plan(*self.sets[i], *self.grads, None, *extra)

    def _load(self, knobs: Knobs):
        """The variant of `knobs`, rendered with the problem's gates (a plain problem's loader takes knobs alone)."""
        gates = self.problem.gates()
        return self.load(knobs, gates, **self.rendered) if gates else self.load(knobs)

    def compile(self, knobs: Knobs) -> Outcome:
        """Render, compile and run once: Triton's disk cache then serves the measuring process."""
        try:
            self._plan(self._load(knobs))(0)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            return Outcome("ok")
        except Exception as e:
            return classify(e)

    def measure(self, knobs: Knobs) -> Outcome:
        try:
            launch = self._plan(self._load(knobs))
            for t in (self.out, self.lse, *self.grads):
                t.fill_(float("nan"))
            launch(0)
            wrong = self._check()
            if wrong:
                return Outcome("wrong_result", error=wrong)
            return Outcome("ok", median_ms=median_ms(launch, len(self.sets), self.device,  # timed as checked
                                                     graph_below_ms=GRAPH_BELOW_MS))
        except Exception as e:
            return classify(e)

    def _check(self) -> str | None:
        outputs = (self.out,) if self.direction == "fwd" else self.grads
        if any(torch.isnan(t).any() for t in outputs):
            return "output holds NaN (unwritten elements or broken arithmetic)"
        tolerance = TOLERANCE[self.problem.torch_dtype]
        group = self.problem.group
        for (b, h), ref in self.reference.items():
            if self.direction == "bwd":
                for name, grad, head, expected in zip(("dq", "dk", "dv"), self.grads, (h, h // group, h // group), ref):
                    err = relative_error(self._rows(grad, b, keys=name != "dq")[0, head], expected)
                    limit = GRAD_TOLERANCE[self.problem.torch_dtype]
                    if not err < limit:
                        return f"{name} (batch {b}, head {head}) relative error {err:.2e} > {limit:.0e}"
                continue
            ref_out, ref_lse = ref
            err = relative_error(self._rows(self.out, b)[0, h], ref_out)
            if not err < tolerance:
                return f"output (batch {b}, head {h}) relative error {err:.2e} > {tolerance:.0e}"
            lse = self._rows(self.lse, b)[0, h].double()
            finite = torch.isfinite(ref_lse)
            if not torch.equal(torch.isfinite(lse), finite) or \
                    not ((lse - ref_lse)[finite].abs() <= 1e-2 + 1e-3 * ref_lse[finite].abs()).all():
                return f"log-sum-exp (batch {b}, head {h}) disagrees with the reference"
        return None

    def sdpa_ms(self) -> float:
        """torch's scaled_dot_product_attention (its own backend choice) on the same inputs, this direction."""
        if self.problem.gates():
            raise ValueError(f"SDPA has no {', '.join(sorted(self.problem.gates()))}: no baseline")
        def sdpa(q, k, v):
            return sdpa_attention(q, k, v, self.problem.causal)
        if self.direction == "fwd":
            return median_ms(lambda i: sdpa(*self.sets[i]), len(self.sets), self.device, graph_below_ms=GRAPH_BELOW_MS)
        return backward_ms(sdpa, [(q, k, v, dout) for q, k, v, _, _, dout in self.sets], self.device,
                           graph_below_ms=GRAPH_BELOW_MS)
