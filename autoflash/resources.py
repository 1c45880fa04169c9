"""Find the data folders that ship with autoflash, in a checkout and in an installed wheel alike, and load the
families' launchers from there.

The wheel carries `templates/` and `tuning_db/` inside the package (see pyproject.toml);
a source checkout keeps them at the project root.
"""

import importlib.util
import re
import sys
from functools import lru_cache
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
# A launcher global set by the loader to another family's launcher part: `tables`, the `tl` family's tile tables of
# packed sequences; `masks`, its mask_mod block tables; `columns`, templates/common/launch_columns.py (the column
# tiles of a head dim, every family's); `tma`, templates/common/launch_tma.py (a plan's host TMA descriptors
# copied over each call's tensors).
BORROWED = {"tables": ("tl", "varlen"), "masks": ("tl", "mask_mod"), "columns": ("common", "columns"),
            "tma": ("common", "tma")}


def data_dir(name: str) -> Path:
    """Path of the shipped folder `name` ("templates" or "tuning_db")."""
    for candidate in (_PACKAGE / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"autoflash cannot find its '{name}' folder (looked in {_PACKAGE} and {_PACKAGE.parent}); "
        "reinstall the package: the wheel must carry it"
    )


def launcher_path(family: str, part: str = "", templates: Path | None = None) -> Path:
    """A launcher of `family`, plain Python that needs only torch and triton: templates/<family>/launch_<part>.py
    where the family has one (`part`: a direction, "bwd", or a variant's name in lower case, "varlen": its edits
    then leave the fingerprints of the family's other kernels alone), else templates/common/launch_<part>.py
    where every family shares one (the fixed variants' plans), else templates/<family>/launch.py."""
    templates = templates or data_dir("templates")
    for path in (templates / family / f"launch_{part}.py", templates / "common" / f"launch_{part}.py"):
        if part and path.is_file():
            return path
    return templates / family / "launch.py"


@lru_cache(maxsize=None)
def launcher(family: str, part: str = ""):
    """The imported module of `launcher_path(family, part)` (once per process and family). Its globals the loader
    sets: `base`, where declared, the family's launch.py module (to build on its helpers); `base_bwd` the family's
    backward launcher (launch_bwd.py where the family has one); a name of BORROWED that launcher."""
    path = launcher_path(family, part)
    name = f"autoflash_{family}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    if hasattr(module, "base"):
        module.base = launcher(family)
    if hasattr(module, "base_bwd"):
        module.base_bwd = launcher(family, "bwd")
    for name, (other, other_part) in BORROWED.items():
        if hasattr(module, name):
            setattr(module, name, launcher(other, other_part))
    return module


@lru_cache(maxsize=None)
def launcher_tiles(family: str, part: str, function: str, head_dim: int, **knobs) -> tuple[int, ...]:
    """Widths of the column tiles a head dim spans, as a launcher splits it (`function(knobs, head_dim)` of the
    launcher (family, part): every family's forward, ("common", "columns", "column_tiles"),
    templates/common/launch_columns.py), zero widths dropped; once per argument: the tuner asks for every point of a
    search space."""
    return tuple(w for w in getattr(launcher(family, part), function)(knobs, head_dim) if w)


def borrowed(source: str) -> list[tuple[str, str]]:
    """(family, part) of each launcher that a launcher's `source` builds on from another family: the BORROWED
    globals it declares."""
    return [BORROWED[name] for name in BORROWED if re.search(rf"^{name} = None\b", source, re.M)]


def borrowed_launchers(source: str, templates: Path) -> list[Path]:
    """The files under `templates` that a launcher's `source` builds on from another family (`borrowed`'s
    launchers and their launch.py), for the template fingerprint."""
    return [path for other, part in borrowed(source)
            for path in (launcher_path(other, part, templates), launcher_path(other, "", templates))]
