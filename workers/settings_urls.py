"""Redis and broker URLs in settings: validated as their clients parse them,
given the file-supplied password, and redacted for error messages.

Apart from the Settings model because it is URL handling only (redis-py and
kombu's parsers), reused by the messages that must never show a password.
"""

from __future__ import annotations

import re
from urllib.parse import quote, urlsplit

from kombu.connection import Connection
from redis.connection import parse_url as parse_redis_url

REDIS_SCHEMES = ("redis", "rediss", "unix")
SENTINEL_SCHEME = "redis+sentinel"  # the store's Sentinel form: shared.store.sentinel
SENTINEL_TLS_SCHEME = "rediss+sentinel"  # the same over TLS

# Query options that carry a secret: redis-py's ``password``, a TLS client key's pass
# phrase (``ssl_password``), as a ``rediss://`` URL for client certificates may hold, and
# the Sentinels' own password of a ``redis+sentinel://`` URL (``sentinel_password``).
_SECRET_OPTIONS = re.compile(r"([?&](?:ssl_|sentinel_)?password=)[^&#]*")

__all__ = ["check_broker_url", "check_store_url", "redact_url", "with_password"]


def redact_url(url: str) -> str:
    """``url`` with its password and any ``password``/``ssl_password`` option replaced by
    ``***`` (every part of a failover list)."""
    parts = []
    for part in url.split(";"):
        try:
            password = urlsplit(part).password
        except ValueError:
            password = None
        if password:
            head, sep, tail = part.partition("://")
            userinfo, at, rest = tail.rpartition("@")
            user = userinfo.split(":", 1)[0]
            part = f"{head}{sep}{user}:***{at}{rest}"
        parts.append(_SECRET_OPTIONS.sub(r"\1***", part))
    return ";".join(parts)


def with_password(url: str, password: str) -> str:
    """``url`` with ``password`` added to every Redis URL of it that carries none.

    A URL's own credentials win, so a store on another instance can keep its
    password while the file supplies the one of the compose Redis.
    """
    parts = []
    for part in url.split(";"):
        head, sep, tail = part.partition("://")
        if sep and head.lower() in ("redis", "rediss", "unix", "sentinel", SENTINEL_SCHEME,
                                    SENTINEL_TLS_SCHEME):
            userinfo, at, rest = tail.rpartition("@")
            if not at:
                part = f"{head}://:{quote(password, safe='')}@{tail}"
            elif ":" not in userinfo:
                part = f"{head}://{userinfo}:{quote(password, safe='')}@{rest}"
        parts.append(part)
    return ";".join(parts)


def check_store_url(url: str) -> None:
    """Raise ValueError unless redis-py would connect with ``url`` (what ``connect`` parses;
    a ``redis+sentinel://`` or ``rediss+sentinel://`` URL as
    :func:`shared.store.sentinel.parse_sentinel_url` does)."""
    if url.startswith((SENTINEL_SCHEME + "://", SENTINEL_TLS_SCHEME + "://")):
        from shared.core.errors import InvalidInput
        from shared.store.sentinel import parse_sentinel_url

        try:
            parse_sentinel_url(url)
        except InvalidInput as exc:
            raise ValueError(str(exc).removeprefix(f"{exc.field}: ")) from None
        return
    split = urlsplit(url)
    if split.scheme not in REDIS_SCHEMES or not url.startswith(split.scheme + "://"):
        raise ValueError("the scheme must be one of redis://, rediss://, unix://, "
                         f"{SENTINEL_SCHEME}://, {SENTINEL_TLS_SCHEME}://")
    if "," in split.netloc:  # a Redis Cluster's nodes (COMPACTION_REDIS_CLUSTER checks that)
        from shared.core.errors import InvalidInput
        from shared.store.sessions import cluster_nodes

        try:
            first, others = cluster_nodes(url)
        except InvalidInput as exc:
            raise ValueError(str(exc).removeprefix(f"{exc.field}: ")) from None
        if any(not 0 < port < 65536 for _, port in others):
            raise ValueError("a cluster node's port is out of range")
        check_store_url(first)
        return
    split.port  # noqa: B018 - a port that is not a number in range raises ValueError
    if split.scheme == "unix":
        if not split.path:
            raise ValueError("the URL names no socket path")
        return
    _check_db(split.path)
    parse_redis_url(url)  # type: ignore[no-untyped-call]  # query options, as connect() does


def _check_db(path: str) -> None:
    db = path.strip("/")
    if db and not db.isdigit():
        raise ValueError(f"the database must be a number, not {db!r}")


def check_broker_url(url: str) -> None:
    """Raise ValueError unless kombu has a transport for ``url`` and its port is a port."""
    try:
        transport = Connection(url).transport_cls  # type: ignore[no-untyped-call]
    except KeyError as exc:
        raise ValueError(f"kombu has no broker transport for it ({exc.args[0]})") from None
    split = urlsplit(url)
    split.port  # noqa: B018 - a port that is not a number in range raises ValueError
    if transport in ("redis", "rediss") and not split.scheme.lower().endswith("+socket"):
        _check_db(split.path)
