"""Find the data folders that ship with autoflash, in a checkout and in an installed wheel alike, and load the
families' launchers from there.

The wheel carries `templates/` and `tuning_db/` inside the package (see pyproject.toml);
a source checkout keeps them at the project root.
"""

import importlib.util
import sys
from functools import lru_cache
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """Path of the shipped folder `name` ("templates" or "tuning_db")."""
    for candidate in (_PACKAGE / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"autoflash cannot find its '{name}' folder (looked in {_PACKAGE} and {_PACKAGE.parent}); "
        "reinstall the package: the wheel must carry it"
    )


def launcher_path(family: str, part: str = "") -> Path:
    """templates/<family>/launch.py, the family's launchers, or launch_<part>.py, those of one variant (`part`: its
    name in lower case): plain Python that needs only torch and triton."""
    return data_dir("templates") / family / (f"launch_{part}.py" if part else "launch.py")


@lru_cache(maxsize=None)
def launcher(family: str, part: str = ""):
    """The imported launcher module of `family` (once per process); with `part`, that variant's, whose global
    `base` is then set to the family's launch.py module (it builds on its helpers)."""
    name = f"autoflash_launch_{family}" + (f"_{part}" if part else "")
    spec = importlib.util.spec_from_file_location(name, launcher_path(family, part))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    if part:
        module.base = launcher(family)
    return module
