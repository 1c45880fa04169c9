"""Render a kernel variant from its family's Jinja2 template, cache the source as a real file, import it, and
pair it with the family's launcher.

Triton reads a kernel's source from its file, so every variant is written under a key that names
its family's template fingerprint, the knobs and the versions, then imported from there. Rendering is
deterministic: the same knobs and templates give the same bytes.
"""

import hashlib
import importlib.util
import os
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
from autoflash.problem import VARIANTS
from autoflash.resources import data_dir, launcher

_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(data_dir("templates")),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)


@lru_cache(maxsize=None)
def template_fingerprint(family: str, direction: str = "fwd") -> str:
    """Hash of what one family's `direction` kernels come from: every file of templates/common/ and of
    templates/<family>/ (its launcher included) but those named for another direction (attn_bwd.py.jinja
    counts for the backward alone). Records and cached kernels of other template text are never used."""
    others = [d for d in families.DIRECTIONS if d != direction]
    root = data_dir("templates")
    digest = hashlib.sha256()
    for path in sorted([*(root / "common").iterdir(), *(root / family).iterdir()]):
        if path.is_file() and not any(f"_{d}." in path.name for d in others):
            digest.update(f"{path.parent.name}/{path.name}".encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def current_fingerprints(direction: str = "fwd") -> dict[str, str]:
    """The fingerprint of every family with `direction` kernels: the records dispatch and the tuner may use."""
    return {f.name: template_fingerprint(f.name, direction) for f in families.implementing(direction)}


def template_name(knobs: Knobs) -> str:
    return f"{knobs.family}/attn_{knobs.DIRECTION}.py.jinja"


def render_template(name: str, **context) -> str:
    """Render `templates/<name>` with the versions in its context."""
    return _env.get_template(name).render(AUTOFLASH_VERSION=__version__, TRITON_VERSION=triton.__version__,
                                          **context)


def render(knobs: Knobs, extra_header: tuple[str, ...] = (), gates: frozenset[str] = frozenset()) -> str:
    """Python source of the variant's kernels (its family's launcher starts them: `Variant`), with the code of
    the attention variants named in `gates` (`Problem.gates()`: each of VARIANTS is a Jinja gate, True or False)."""
    return render_template(template_name(knobs), TEMPLATE=template_name(knobs),
                           FINGERPRINT=template_fingerprint(knobs.family, knobs.DIRECTION),
                           KNOBS_JSON=knobs.to_json(), EXTRA_HEADER=extra_header, **knobs.template_context(),
                           **{gate: gate in gates for gate in VARIANTS})


def kernel_key(knobs: Knobs, gates: frozenset[str] = frozenset()) -> str:
    """Names the rendered source: a plain variant's key is the same as before variants existed."""
    parts = (knobs.DIRECTION, template_fingerprint(knobs.family, knobs.DIRECTION), knobs.to_json(), __version__,
             triton.__version__) + ((",".join(sorted(gates)),) if gates else ())
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]


class Variant:
    """A rendered variant: its kernels (`kernels`, the imported module) and its family's launcher, which gets
    the knobs as data. `forward_plan`/`backward_plan` compile for one call signature and return what launches
    every such call; `forward`/`backward` plan and launch once."""

    def __init__(self, knobs: Knobs, kernels):
        self.knobs, self.kernels, self.launcher = knobs, kernels, launcher(knobs.family)
        self._data = knobs.as_point()

    def forward_plan(self, q, k, v, out, lse, softmax_scale: float, causal: bool, compile=compile_launch,
                     variant=None):
        """forward(q, k, v, out, lse, *variant tensors) for every call shaped like this one (lse given or None
        alike); `variant`: the kernels' variant arguments (`checks.variant_args`), None for a plain call."""
        return self.launcher.forward_plan(self.kernels, self._data, q, k, v, out, lse, softmax_scale, causal, compile,
                                          variant=variant)

    def backward_plan(self, q, k, v, out, lse, dout, dq, dk, dv, softmax_scale: float, causal: bool, dlse,
                      compile=compile_launch, variant=None):
        """backward(q, k, v, out, lse, dout, dq, dk, dv, dlse, *variant tensors) for every call shaped like this
        one (dlse given or None alike)."""
        return self.launcher.backward_plan(self.kernels, self._data, q, k, v, out, lse, dout, dq, dk, dv,
                                           softmax_scale, causal, dlse, compile, variant=variant)

    def forward(self, q, k, v, out, lse, softmax_scale: float, causal: bool, variant=None) -> None:
        """Launch the forward once. q, out: (batch, heads_q, seqlen_q, head_dim); k, v: (batch, heads_kv, seqlen_k,
        head_dim), each with unit last stride; lse: fp32 (batch, heads_q, seqlen_q), contiguous, or None."""
        self.forward_plan(q, k, v, out, lse, softmax_scale, causal, variant=variant)(
            q, k, v, out, lse, *(variant or {}).get("tensors", ()))

    def backward(self, q, k, v, out, lse, dout, dq, dk, dv, softmax_scale: float, causal: bool, dlse=None,
                 variant=None) -> None:
        """Launch the backward once: writes dq, dk, dv (shaped like q, k, v) from the forward's out and lse."""
        self.backward_plan(q, k, v, out, lse, dout, dq, dk, dv, softmax_scale, causal, dlse, variant=variant)(
            q, k, v, out, lse, dout, dq, dk, dv, dlse, *(variant or {}).get("tensors", ()))


def cache_dir() -> Path:
    """Where rendered kernels are written: $AUTOFLASH_CACHE_DIR, else ~/.cache/autoflash/kernels."""
    if os.environ.get("AUTOFLASH_CACHE_DIR"):
        return Path(os.environ["AUTOFLASH_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "autoflash" / "kernels"


_variants: dict[str, Variant] = {}
_lock = threading.Lock()


def load(knobs: Knobs, gates: frozenset[str] = frozenset()) -> Variant:
    """The variant of `knobs`, its kernels rendered with `gates` (see `render`), written and imported on first use
    (once per process)."""
    key = kernel_key(knobs, gates)
    variant = _variants.get(key)
    if variant is not None:
        return variant
    with _lock:
        if key not in _variants:
            _variants[key] = Variant(knobs, _import(key, _write(key, render(knobs, gates=gates))))
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
