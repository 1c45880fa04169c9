"""Render a kernel variant from its Jinja2 template, cache the source as a real file, import it.

Triton reads a kernel's source from its file, so every variant is written under a key that names
the template fingerprint, the knobs and the versions, then imported from there. Rendering is
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

import autoflash
from autoflash.knobs import Knobs
from autoflash.resources import data_dir

_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(data_dir("templates")),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)


@lru_cache(maxsize=None)
def template_fingerprint(direction: str = "fwd") -> str:
    """Hash of the templates one direction's kernels are rendered from (the shared `_*.jinja` parts
    and `attn_<direction>_*.jinja`; export/ holds none): records from other template text are never used."""
    digest = hashlib.sha256()
    for path in sorted(data_dir("templates").glob("*.jinja")):
        if path.name.startswith(("_", f"attn_{direction}")):
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def render_template(name: str, direction: str = "fwd", **context) -> str:
    """Render `templates/<name>` with the versions and the fingerprint in its context."""
    return _env.get_template(name).render(FINGERPRINT=template_fingerprint(direction),
                                          AUTOFLASH_VERSION=autoflash.__version__, TRITON_VERSION=triton.__version__,
                                          **context)


def render(knobs: Knobs, extra_header: tuple[str, ...] = ()) -> str:
    """Python source of the variant: its kernels and their launcher, `forward(q, k, v, out, lse,
    softmax_scale, causal)` or `backward(q, k, v, out, lse, dout, dq, dk, dv, softmax_scale, causal, dlse)`."""
    return render_template(knobs.template, knobs.DIRECTION, TEMPLATE=knobs.template, KNOBS_JSON=knobs.to_json(),
                           EXTRA_HEADER=extra_header, **knobs.template_context())


def kernel_key(knobs: Knobs) -> str:
    text = "|".join((knobs.DIRECTION, template_fingerprint(knobs.DIRECTION), knobs.to_json(), autoflash.__version__,
                     triton.__version__))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def cache_dir() -> Path:
    """Where rendered kernels are written: $AUTOFLASH_CACHE_DIR, else ~/.cache/autoflash/kernels."""
    if os.environ.get("AUTOFLASH_CACHE_DIR"):
        return Path(os.environ["AUTOFLASH_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "autoflash" / "kernels"


_modules: dict[str, object] = {}
_lock = threading.Lock()


def load(knobs: Knobs):
    """The imported module of a variant (rendered and written on first use, once per process)."""
    key = kernel_key(knobs)
    module = _modules.get(key)
    if module is not None:
        return module
    with _lock:
        if key not in _modules:
            _modules[key] = _import(key, _write(key, render(knobs)))
        return _modules[key]


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
