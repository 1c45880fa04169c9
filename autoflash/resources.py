"""Find the data folders that ship with autoflash, in a checkout and in an installed wheel alike.

The wheel carries `templates/` and `tuning_db/` inside the package (see pyproject.toml);
a source checkout keeps them at the project root.
"""

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
