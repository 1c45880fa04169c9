"""One JSON line per measurement, appended as it comes (a run cut short keeps what it measured)."""

import json


def append_row(path: str | None, row: dict) -> None:
    """Append `row` to the JSON-lines file at `path` (nothing when path is None)."""
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")
