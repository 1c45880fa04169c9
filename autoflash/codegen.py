"""Render a kernel variant from its family's Jinja2 template, cache the source as a real file, import it, and
pair it with the family's launcher.

Triton reads a kernel's source from its file, so every variant is written under a key that names
its family's template fingerprint, the knobs and the versions, then imported from there. Rendering is
deterministic: the same knobs and templates give the same bytes.
"""

import hashlib
import importlib.util
import itertools
import os
import re
import sys
import tempfile
import threading
from functools import lru_cache
from pathlib import Path

import jinja2
import triton

from autoflash import families
from autoflash._version import __version__
from autoflash.knobs import Knobs
from autoflash.launch import compile_launch
from autoflash.mask_mod import Rendered
from autoflash.problem import VARIANTS
from autoflash.resources import borrowed_launchers, data_dir, launcher

_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(data_dir("templates")),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)

# The launcher parts (templates/<family>/launch_<part>.py) of the fixed variants' plans (window, softcap, ALiBi)
# and of a mask_mod's, which builds on them.
FIXED_VARIANTS, MASK_MOD = "window_softcap_alibi", "mask_mod"


@lru_cache(maxsize=None)
def template_fingerprint(family: str, direction: str = "fwd", variants: frozenset[str] = frozenset()) -> str:
    """Hash of what one family's `direction` kernels come from, for problems using `variants` (names of
    problem.VARIANTS): every file of templates/common/ and of templates/<family>/ (its launchers included) but
    those named for another direction or an unused variant (attn_bwd.py.jinja counts for the backward alone,
    launch_varlen.py for VARLEN problems alone, _mask_mod.py.jinja for MASK_MOD ones); templates as parsed,
    with the blocks gated on a variant not in `variants` cut out (`_ungated`). So adding a variant's code to the
    templates leaves a plain problem's fingerprint, and its tuned records, as they were. Records and cached
    kernels of other template text are never used."""
    unused = frozenset(VARIANTS) - variants
    others = [d for d in families.DIRECTIONS if d != direction]
    root = data_dir("templates")

    def counts(path: Path) -> bool:
        # (a file named for variants, launch_window_softcap_alibi.py, counts for problems using one of them)
        named = {name for name in VARIANTS if re.search(rf"(^|_){name.lower()}[_.]", path.name)}
        if path.name == f"launch_{FIXED_VARIANTS}.py":
            named.add("MASK_MOD")  # (launch_mask_mod.py builds on it)
        return path.is_file() and not any(f"_{d}." in path.name for d in others) and not (named and named <= unused)

    # The family's files, then what they take from another family's folder: templates they include and
    # launchers the loader hands theirs (BORROWED), each once.
    todo, seen = sorted([*(root / "common").iterdir(), *(root / family).iterdir()]), set()
    digest = hashlib.sha256()
    while todo:
        path = todo.pop(0)
        if path in seen or not counts(path):
            continue
        seen.add(path)
        content = path.read_bytes()
        if path.name.endswith(".jinja"):
            text = _ungated(content.decode(), unused)
            content = text.encode()
            todo += [root / name for name in _INCLUDE.findall(text)]
        elif path.suffix == ".py":
            todo += borrowed_launchers(content.decode(), root)
        digest.update(f"{path.parent.name}/{path.name}".encode() + b"\0" + content + b"\0")
    return digest.hexdigest()[:16]


_INCLUDE = re.compile(r'\{%-?\s*include\s+"([^"]+)"')


# A tag alone on its line with that line's indentation, else the tag alone; the newline after it (trim_blocks).
_TAG = re.compile(r"(?:^[ \t]*)?\{%-?\s*(if|elif|else|endif)\b\s*(not\s+)?(\w*)([^%]*?)-?%\}\n?", re.M)


def _ungated(text: str, unused: frozenset[str]) -> str:
    """Template `text` as a problem without the `unused` variants sees it: each `{% if NAME %}...{% else %}...
    {% endif %}` on one of them replaced by its else part, each `{% if not NAME %}` block by its body. A tag alone
    on its line goes with its line, as trim_blocks and lstrip_blocks render it: text without gates is returned
    unchanged, so its fingerprint does not move when a gated block is added. One pass over the tags."""
    out, pos = [], 0
    frames = []  # per open if: [gated, this branch kept] (a plain if's branches are all kept)

    def shown():
        return all(kept for _, kept in frames)

    for tag in _TAG.finditer(text):
        kind, negated, name, rest = tag[1], bool(tag[2]), tag[3], tag[4]
        if shown():
            out.append(text[pos:tag.start()])
        pos = tag.end()
        if kind == "if":
            gated = name in unused
            if gated and rest.strip():
                raise ValueError(f"a variant gate tests one name: {tag[0].strip()} (nest the blocks)")
            if not gated and shown():
                out.append(tag[0])
            frames.append([gated, negated if gated else True])
        elif not frames:
            raise ValueError(f"{tag[0].strip()} without an if")
        elif frames[-1][0] and kind == "elif":
            raise ValueError(f"a variant gate takes no elif: {tag[0].strip()} (nest the blocks)")
        elif frames[-1][0] and kind == "else":
            frames[-1][1] = not frames[-1][1]
        elif kind == "endif":
            gated, _ = frames.pop()
            if not gated and shown():
                out.append(tag[0])
        elif shown():
            out.append(tag[0])
    if any(gated for gated, _ in frames):
        raise ValueError("no endif for a variant gate")
    if shown():
        out.append(text[pos:])
    return "".join(out)


@lru_cache(maxsize=None)
def every_current_fingerprint(direction: str = "fwd") -> frozenset[tuple[str, str]]:
    """(family, fingerprint) of every family's current `direction` kernels, for every set of variants: a record
    under one is current where it is its problem's (`is_current`)."""
    return frozenset((f.name, template_fingerprint(f.name, direction, frozenset(used)))
                     for f in families.implementing(direction)
                     for n in range(len(VARIANTS) + 1) for used in itertools.combinations(VARIANTS, n))


def is_current(fingerprint: str, family: str, direction: str, variants: frozenset[str]) -> bool:
    """Whether a record under `fingerprint` was measured on the kernels `family` renders now for a problem using
    `variants` (a window problem's record under the plain kernels' fingerprint is not)."""
    return fingerprint == template_fingerprint(family, direction, variants)


def current_fingerprints(direction: str = "fwd", variants: frozenset[str] = frozenset()) -> dict[str, str]:
    """The fingerprint of every family with `direction` kernels: the records dispatch and the tuner may use
    for problems using `variants`."""
    return {f.name: template_fingerprint(f.name, direction, variants) for f in families.implementing(direction)}


def template_name(knobs: Knobs) -> str:
    return f"{knobs.family}/attn_{knobs.DIRECTION}.py.jinja"


def render_template(name: str, **context) -> str:
    """Render `templates/<name>` with the versions in its context."""
    return _env.get_template(name).render(AUTOFLASH_VERSION=__version__, TRITON_VERSION=triton.__version__,
                                          **context)


def render(knobs: Knobs, extra_header: tuple[str, ...] = (), variants: frozenset[str] = frozenset(),
           mask_mod: Rendered | None = None, score_mod: Rendered | None = None) -> str:
    """Python source of the variant's kernels for problems using `variants` (its family's launcher starts them:
    `Variant`). Each name of problem.VARIANTS is a template gate, true where used; MASK_MOD problems' kernels
    hold their `mask_mod` (autoflash/mask_mod.py), SCORE_MOD problems' their `score_mod` (autoflash/score_mod.py)."""
    fingerprint = template_fingerprint(knobs.family, knobs.DIRECTION, variants)
    gates = {name: name in variants for name in VARIANTS}
    context = {}
    for gate, mod in (("MASK_MOD", mask_mod), ("SCORE_MOD", score_mod)):
        if (gate in variants) != (mod is not None):
            raise ValueError(f"a {gate} problem's kernels are rendered with its {gate.lower()}, and only theirs: pass "
                             "the mod (a tuning database holds its fingerprint, not its function)")
        if mod is not None:
            context.update({f"{gate}_SOURCE": mod.source, f"{gate}_CAPTURES": mod.captures,
                            f"{gate}_UNIT_GRAD": mod.unit_grad})
    return render_template(template_name(knobs), TEMPLATE=template_name(knobs), FINGERPRINT=fingerprint,
                           KNOBS_JSON=knobs.to_json(), EXTRA_HEADER=extra_header, **gates, **context,
                           **knobs.template_context())


def kernel_key(knobs: Knobs, variants: frozenset[str] = frozenset(), mask_mod: Rendered | None = None,
               score_mod: Rendered | None = None) -> str:
    parts = (knobs.DIRECTION, template_fingerprint(knobs.family, knobs.DIRECTION, variants), knobs.to_json(),
             __version__, triton.__version__)
    text = "|".join((*parts, *(mod.source for mod in (mask_mod, score_mod) if mod is not None)))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


class Variant:
    """A rendered variant: its kernels (`kernels`, the imported module) and its family's launcher, which gets
    the knobs as data. `forward_plan`/`backward_plan` compile for one call signature and return what launches
    every such call; `forward`/`backward` plan and launch once."""

    def __init__(self, knobs: Knobs, kernels):
        self.knobs, self.kernels, self.launcher = knobs, kernels, launcher(knobs.family, knobs.DIRECTION)
        self._data = knobs.as_point()

    def forward_plan(self, q, k, v, out, lse, softmax_scale: float, causal: bool, compile=compile_launch,
                     variant=None):
        """forward(q, k, v, out, lse, *variant tensors) for every call shaped like this one (lse given or None
        alike); `variant`: the kernels' variant arguments (`checks.variant_args`), None for a plain call."""
        if variant is None:
            return self.launcher.forward_plan(self.kernels, self._data, q, k, v, out, lse, softmax_scale, causal,
                                              compile)
        fixed = launcher(self.knobs.family, FIXED_VARIANTS)
        if "mask" in variant:
            return launcher(self.knobs.family, MASK_MOD).forward_plan(
                self.kernels, self._data, q, k, v, out, lse, softmax_scale, causal, compile, variant, fixed)
        return fixed.forward_plan(self.kernels, self._data, q, k, v, out, lse, softmax_scale, causal, compile, variant)

    def backward_plan(self, q, k, v, out, lse, dout, dq, dk, dv, softmax_scale: float, causal: bool, dlse,
                      compile=compile_launch, variant=None):
        """backward(q, k, v, out, lse, dout, dq, dk, dv, dlse, *variant tensors) for every call shaped like this
        one (dlse given or None alike)."""
        if variant is None:
            return self.launcher.backward_plan(self.kernels, self._data, q, k, v, out, lse, dout, dq, dk, dv,
                                               softmax_scale, causal, dlse, compile)
        fixed = launcher(self.knobs.family, FIXED_VARIANTS)
        if "mask" in variant:
            return launcher(self.knobs.family, MASK_MOD).backward_plan(
                self.kernels, self._data, q, k, v, out, lse, dout, dq, dk, dv, softmax_scale, causal, dlse, compile,
                variant, fixed)
        return fixed.backward_plan(self.kernels, self._data, q, k, v, out, lse, dout, dq, dk, dv, softmax_scale,
                                   causal, dlse, compile, variant)

    def varlen_forward_plan(self, q, k, v, out, lse, cu_seqlens_q, starts_k, seqlens_k, softmax_scale: float,
                            causal: bool, pages=None, compile=compile_launch):
        """forward(q, k, v, out, lse, cu_seqlens_q, starts_k, seqlens_k, block_table) over packed sequences (a
        VARLEN variant; PAGED with `pages`), for every call shaped like this one: the launcher's
        `varlen_forward_plan` says the layouts."""
        return launcher(self.knobs.family, "varlen").varlen_forward_plan(self.kernels, self._data, q, k, v, out, lse, cu_seqlens_q, starts_k,
                                                 seqlens_k, softmax_scale, causal, compile, pages)

    def varlen_backward_plan(self, q, k, v, out, lse, dout, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
                             softmax_scale: float, causal: bool, dlse, compile=compile_launch):
        """backward(q, k, v, out, lse, dout, dq, dk, dv, dlse, cu_seqlens_q, cu_seqlens_k) over packed sequences (a
        VARLEN variant), for every call shaped like this one: the launcher's `varlen_backward_plan`."""
        return launcher(self.knobs.family, "varlen").varlen_backward_plan(self.kernels, self._data, q, k, v, out, lse, dout, dq, dk, dv,
                                                  cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, dlse, compile)

    def forward(self, q, k, v, out, lse, softmax_scale: float, causal: bool, variant=None) -> None:
        """Launch the forward once. q, out: (batch, heads_q, seqlen_q, head_dim); k, v: (batch, heads_kv, seqlen_k,
        head_dim), each with unit last stride; lse: fp32 (batch, heads_q, seqlen_q), contiguous, or None."""
        self.forward_plan(q, k, v, out, lse, softmax_scale, causal, variant=variant)(
            q, k, v, out, lse, *(variant or {}).get("tensors", {}).values())

    def backward(self, q, k, v, out, lse, dout, dq, dk, dv, softmax_scale: float, causal: bool, dlse=None,
                 variant=None) -> None:
        """Launch the backward once: writes dq, dk, dv (shaped like q, k, v) from the forward's out and lse."""
        self.backward_plan(q, k, v, out, lse, dout, dq, dk, dv, softmax_scale, causal, dlse, variant=variant)(
            q, k, v, out, lse, dout, dq, dk, dv, dlse, *(variant or {}).get("tensors", {}).values())


def cache_dir() -> Path:
    """Where rendered kernels are written: $AUTOFLASH_CACHE_DIR, else ~/.cache/autoflash/kernels."""
    if os.environ.get("AUTOFLASH_CACHE_DIR"):
        return Path(os.environ["AUTOFLASH_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "autoflash" / "kernels"


_variants: dict[str, Variant] = {}
_lock = threading.Lock()


def load(knobs: Knobs, variants: frozenset[str] = frozenset(), mask_mod: Rendered | None = None,
         score_mod: Rendered | None = None) -> Variant:
    """The variant of `knobs` for problems using `variants` (and `mask_mod`, `score_mod`), its kernels rendered,
    written and imported on first use (once per process)."""
    key = kernel_key(knobs, variants, mask_mod, score_mod)
    variant = _variants.get(key)
    if variant is not None:
        return variant
    with _lock:
        if key not in _variants:
            source = render(knobs, variants=variants, mask_mod=mask_mod, score_mod=score_mod)
            _variants[key] = Variant(knobs, _import(key, _write(key, source)))
        return _variants[key]


def _write(key: str, source: str) -> Path:
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"attn_{key}.py"
    if not path.exists() or path.read_text() != source:
        # Write then rename: a process that dies midway leaves no half-written kernel behind.
        with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".tmp", delete=False) as tmp:
            tmp.write(source)
        os.replace(tmp.name, path)
    return path


def _import(key: str, path: Path):
    name = f"autoflash_kernels.attn_{key}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
