"""Where tuning databases are, standard library only: --db / $AUTOFLASH_DB, the default file, and the one rule
that turns a plain file path into a SQLite URL (and back).

A database is named by a URL (`sqlite:////abs/path.db`, `postgresql+psycopg://user@host/db`) or by a SQLite file
path. A path may hold any character: `?`, `#` and `%` are percent-escaped in its URL, and `sqlite_path`
unescapes them again, so `/tmp/a?b/t.db` is that file and never `/tmp/a` with a query.
"""

import os
import re
from pathlib import Path
from urllib.parse import quote, unquote

DB_ENV = "AUTOFLASH_DB"

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_SQLITE = re.compile(r"sqlite(\+\w+)?://")


def as_url(db: str | os.PathLike) -> str:
    """A URL as given; a file path (relative ones from the working directory) as its escaped sqlite:/// URL."""
    db = os.fspath(db)
    if _SCHEME.match(db):
        return db
    return "sqlite:///" + quote(str(Path(db).resolve()), safe="/")


def sqlite_path(url: str) -> str | None:
    """The file of a SQLite URL (percent-escapes undone; ":memory:" for `sqlite://`), None for other databases.
    A query string (`?timeout=5`) is not part of the path."""
    scheme = _SQLITE.match(url)
    if scheme is None:
        return None
    rest = url[scheme.end():]
    if not rest.startswith("/"):
        return ":memory:"
    return unquote(rest[1:].split("?", 1)[0]) or ":memory:"


_configured: str | None = None  # autoflash.configure(db=...)


def configure_user_db(db: str | os.PathLike | None) -> None:
    """Make `db` (a URL or a file path; None: back to the environment's) this process's user database."""
    global _configured
    _configured = None if db is None else as_url(db)


def default_url() -> str:
    """The database `configure_user_db` named, else $AUTOFLASH_DB (a URL or a file path), else SQLite at
    $XDG_DATA_HOME/autoflash/tuning.db (~/.local/share/autoflash/tuning.db)."""
    if _configured:
        return _configured
    if os.environ.get(DB_ENV):
        return as_url(os.environ[DB_ENV])
    return as_url(Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "autoflash" /
                  "tuning.db")


def user_url() -> str | None:
    """The user's database if there is one: $AUTOFLASH_DB, else the configured one or the default SQLite file when it
    exists (the first tuning on first use creates it)."""
    url = default_url()
    path = sqlite_path(url)
    if os.environ.get(DB_ENV) and not _configured or path is None or Path(path).exists():
        return url
    return None
