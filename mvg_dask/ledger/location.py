"""Where a ledger lives: a SQLite path, a ``sqlite:///`` URL, a ``postgresql://`` URL, or
``memory://name`` (in this process's memory: notebooks and tests).

Passwords never travel in a URL: :func:`check_location` refuses one (set ``PGPASSWORD``, use a
libpq passfile, or give a password file), and every message that names a ledger goes through
:func:`redact` first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qsl, urlsplit

from mvg_dask.errors import LedgerError

Backend = Literal["sqlite", "postgresql", "memory"]

_PG_SCHEMES = ("postgresql://", "postgres://")
_SQLITE_SCHEME = "sqlite:///"
_MEMORY_SCHEME = "memory://"
_MEMORY_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# user:password@ in the authority of any URL
_USERINFO_RE = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:@/?#]*):[^@/?#]*@")
# password=... in a URL query or a key=value conninfo string
_PARAM_RE = re.compile(r"(?P<key>\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^&\s]*)", re.IGNORECASE)


def redact(text: str) -> str:
    """Hide every password in ``text`` (URL userinfo and ``password=`` parameters).

    Parameters
    ----------
    text : str
        A URL, a conninfo string or a message that may contain either.

    Returns
    -------
    str
        ``text`` with each password replaced by ``***``.

    Examples
    --------
    >>> redact("postgresql://ledger:s3cret@db:5432/ledger?password=x&sslmode=require")
    'postgresql://ledger:***@db:5432/ledger?password=***&sslmode=require'
    """
    text = _USERINFO_RE.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)
    return _PARAM_RE.sub(lambda m: f"{m['key']}***", text)


@dataclass(frozen=True)
class LedgerLocation:
    """A parsed ledger location.

    Attributes
    ----------
    backend : {"sqlite", "postgresql", "memory"}
        The database.
    target : str
        The SQLite file path, the PostgreSQL URL (without a password), or the in-memory
        ledger's name.
    """

    backend: Backend
    target: str

    def display(self) -> str:
        """The location for messages (redacted)."""
        return redact(self.target)


def parse_location(location: str | Path) -> LedgerLocation:
    """Parse a ledger path or URL and refuse passwords inside it.

    Parameters
    ----------
    location : str or Path
        ``postgresql://...`` / ``postgres://...`` (a libpq URI, unix-socket hosts included),
        ``sqlite:///relative.sqlite`` or ``sqlite:////absolute.sqlite``, ``memory://name`` (an
        in-memory ledger of this process), or a plain file path (SQLite).

    Returns
    -------
    LedgerLocation
        The backend and its target.

    Raises
    ------
    LedgerError
        For another scheme, an empty SQLite path, or a password in the URL.
    """
    text = str(location)
    if text.startswith(_PG_SCHEMES):
        check_no_password(text)
        return LedgerLocation("postgresql", text)
    if text.startswith(_SQLITE_SCHEME):
        path = text[len(_SQLITE_SCHEME) :]
        if not path:
            raise LedgerError("ledger url sqlite:/// names no file: use sqlite:///path/to/ledger")
        return LedgerLocation("sqlite", path)
    if text.startswith(_MEMORY_SCHEME):
        name = text[len(_MEMORY_SCHEME) :]
        if not _MEMORY_NAME_RE.fullmatch(name):
            raise LedgerError(
                f"ledger url {text!r}: name the in-memory ledger with 1-128 letters, digits, "
                "'.', '_' or '-' (memory://name)"
            )
        return LedgerLocation("memory", name)
    if "://" in text or text.startswith("sqlite:"):
        raise LedgerError(
            f"ledger {redact(text)!r}: unknown scheme; use postgresql://..., sqlite:///path, "
            "memory://name or a file path"
        )
    if not text:
        raise LedgerError("ledger: empty path")
    return LedgerLocation("sqlite", text)


def check_no_password(url: str) -> None:
    """Refuse a PostgreSQL URL that carries a password.

    Raises
    ------
    LedgerError
        Naming the redacted URL and where a password may come from instead.
    """
    parts = urlsplit(url)
    has_password = False
    try:
        has_password = parts.password is not None
    except ValueError:  # an unparsable port: libpq reports it later
        has_password = ":" in parts.netloc.rpartition("@")[0]
    if any(k.lower() == "password" for k, _ in parse_qsl(parts.query, keep_blank_values=True)):
        has_password = True
    if has_password:
        raise LedgerError(
            f"ledger url {redact(url)}: the URL carries a password; remove it and set PGPASSWORD, "
            "use a libpq passfile (PGPASSFILE or ~/.pgpass, or ?passfile=...) or "
            "ledger.password_file"
        )


def sqlite_url(path: str | Path) -> str:
    """The ``sqlite:///`` URL of a file path (absolute paths give ``sqlite:////...``)."""
    return _SQLITE_SCHEME + str(path)
