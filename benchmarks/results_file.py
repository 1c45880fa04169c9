"""One JSON line per measurement, appended as it comes (a run cut short keeps what it measured).

Every row names what produced it: the torch and triton versions and the command line (a row's own keys win)."""

import json
import shlex
import sys


def _provenance() -> dict:
    import torch
    import triton

    return {"torch": torch.__version__, "triton": triton.__version__,
            "command": shlex.join(["python", *sys.argv])}


def append_row(path: str | None, row: dict) -> None:
    """Append `row`, with its provenance, to the JSON-lines file at `path` (nothing when path is None)."""
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(_provenance() | row) + "\n")
