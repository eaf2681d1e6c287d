"""The ``redis+sentinel://`` URL: one string naming a Sentinel deployment's store.

URL form (one string, so that ``COMPACTION_REDIS_URL`` can name it)::

    redis+sentinel://[user:password@]host1:26379,host2:26379/<service>[/<db>]
        [?sentinel_username=...&sentinel_password=...&sentinel_events_seconds=15]
    rediss+sentinel://...same...[&ssl_ca_certs=...&ssl_certfile=...&ssl_keyfile=...]

The credentials before ``@`` are the data nodes' (primary and replicas); the Sentinels'
own, where they need any, are the ``sentinel_*`` options. A host without a port is on
26379. ``<service>`` is the name the Sentinels monitor (``sentinel monitor <service>
...``), ``<db>`` the database number (0 when absent). ``rediss+sentinel://`` reaches the
Sentinels and the data nodes over TLS, both with the ``ssl_*`` options a ``rediss://``
URL takes (:mod:`shared.store.tls`): hardened deployments run both on TLS ports, with
one CA.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from shared.core.errors import InvalidInput
from shared.store.sentinel_events import EVENTS_SECONDS
from shared.store.tls import is_tls_option, tls_options

SCHEME = "redis+sentinel"
TLS_SCHEME = "rediss+sentinel"
DEFAULT_SENTINEL_PORT = 26379
EVENTS_OPTION = "sentinel_events_seconds"
_OPTIONS = frozenset({"sentinel_username", "sentinel_password", EVENTS_OPTION})


def is_sentinel_url(url: str) -> bool:
    return url.lower().startswith((SCHEME + "://", TLS_SCHEME + "://"))


@dataclass(frozen=True)
class SentinelURL:
    """A parsed ``redis+sentinel://`` URL (see the module docstring)."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None
    tls: tuple[tuple[str, Any], ...] | None = None
    """The TLS keywords (``rediss+sentinel://``), None for plain TCP."""
    events_seconds: float = EVENTS_SECONDS
    """How long the pool's answer stays fresh while it hears every Sentinel's events
    (``sentinel_events_seconds``); 0: no subscription, a check every second as before."""

    def tls_kwargs(self) -> dict[str, Any]:
        """Connection keywords for TLS, the same for the Sentinels and the data nodes."""
        return {} if self.tls is None else {"ssl": True, **dict(self.tls)}


def parse_sentinel_url(url: str) -> SentinelURL:
    """The parts of ``url``; :class:`InvalidInput` (field ``url``) naming what is wrong."""
    def bad(why: str) -> InvalidInput:
        return InvalidInput(f"{why} (expected {SCHEME}:// or {TLS_SCHEME}://"
                            "[user:password@]host:port[,host:port...]/<service>[/<db>])",
                            field="url")

    if not is_sentinel_url(url):
        raise bad(f"the scheme must be {SCHEME}:// or {TLS_SCHEME}://")
    scheme, _, rest = url.partition("://")
    tls = scheme.lower() == TLS_SCHEME
    rest = rest.partition("#")[0]
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, at, hostlist = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    sentinels = []
    for host in hostlist.split(","):
        if not host:
            raise bad("a Sentinel address is empty")
        try:
            split = urlsplit("//" + host)
            port = split.port or DEFAULT_SENTINEL_PORT
        except ValueError as exc:
            raise bad(f"bad Sentinel address {host!r}: {exc}") from None
        if not split.hostname:
            raise bad(f"bad Sentinel address {host!r}")
        sentinels.append((split.hostname, port))
    parts = [unquote(p) for p in path.split("/")] if path else []
    if not parts or not parts[0]:
        raise bad("the URL names no service")
    if len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
        raise bad(f"the database must be a number, not {'/'.join(parts[1:])!r}")
    options = parse_qs(query, keep_blank_values=True, strict_parsing=False)
    given_tls = {name for name in options if is_tls_option(name)}
    unknown = set(options) - _OPTIONS - given_tls
    if unknown:
        raise bad(f"unknown option(s) {', '.join(sorted(unknown))}; known: "
                  f"{', '.join(sorted(_OPTIONS))} and, with {TLS_SCHEME}://, ssl_*")
    if given_tls and not tls:
        raise bad(f"{', '.join(sorted(given_tls))}: TLS options need the {TLS_SCHEME}:// "
                  "scheme")
    events = options.get(EVENTS_OPTION, [str(EVENTS_SECONDS)])[-1]
    try:
        events_seconds = float(events)
    except ValueError:
        events_seconds = -1.0
    if not 0 <= events_seconds <= 3600:
        raise bad(f"{EVENTS_OPTION} must be a number of seconds from 0 (off) to 3600, "
                  f"not {events!r}")
    return SentinelURL(
        sentinels=tuple(sentinels), service=parts[0],
        db=int(parts[1]) if len(parts) == 2 and parts[1] else 0,
        username=username, password=password,
        sentinel_username=options.get("sentinel_username", [None])[-1] or None,
        sentinel_password=options.get("sentinel_password", [None])[-1] or None,
        tls=tuple(sorted(tls_options(options).items())) if tls else None,
        events_seconds=events_seconds)


__all__ = ["DEFAULT_SENTINEL_PORT", "EVENTS_OPTION", "SCHEME", "TLS_SCHEME", "SentinelURL",
           "is_sentinel_url", "parse_sentinel_url"]
