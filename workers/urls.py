"""Small helpers for the Redis/broker URLs the settings carry (no I/O).

Used by the CLI, the harness and the scripts: printing a URL without its
password, and pointing a ``redis://`` URL at another database.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from workers.settings_urls import redact_url  # one redaction for settings, CLI and harness


def with_db(url: str, db: int) -> str:
    """``url`` pointing at database ``db``; its query is kept (a ``rediss://`` URL's CA and
    client certificate options are the other database's too), its fragment dropped."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, ""))


def db_number(url: str) -> int:
    """The database number of a ``redis://`` URL (0 when absent)."""
    path = urlsplit(url).path.strip("/")
    return int(path) if path.isdigit() else 0


__all__ = ["db_number", "redact_url", "with_db"]
