"""The guard's own appends, on a connection that tells its writes from everyone else's.

After ``record_turn`` the next ``prepare`` used to read the session again. The
change feed (:mod:`shared.store.changes`) watches in broadcast mode, where one
push carries every key written in one pass of Redis's event loop: a write by
another client in the same pass as the guard's own append is indistinguishable
from it. Here the append runs on a connection of the guard's own, with ``CLIENT
TRACKING ON NOLOOP`` in default mode:

- its own writes are not pushed to it (``NOLOOP``), and the append script ends
  by reading every key a view is made of, so they stay tracked for it after its
  own write (a write untracks a key for the writer too);
- anyone else's later write to one of them is pushed to it, one push per write
  (default mode does not merge), into the same buffer as the append's reply
  when it ran in the same pass;
- the append's reply holds everything a read just after it would return (the
  state hash, the log's length and tokens, the pending flag), so
  :func:`shared.core.appended.appended_read` extends the cached view exactly.

Default mode has a blind spot of its own: its push may reach this connection a
few microseconds after the writer got its reply (measured: 4 in 20,000), where
the feed's push is sent first (and arrives first but for a rarer late arrival:
:mod:`shared.store.changes`). So the view is vouched for by both
(:func:`vouch`, :class:`OwnMark`): the feed saw exactly one push for the session
around the append (its own pass) and neither connection reports a write since.
The feed's rules keep this connection honest too: drained before every check,
trusted within :data:`~shared.store.changes.VERIFY_SECONDS` of an answer on it
(else a ``PING`` first), a new epoch on every (re)connection, flush or failure.
A prepare's own writes (a truncation, cheap stages, figures, the job's flags) go the
same way: :meth:`~shared.store.own_writes_sync.OwnWrites.run_many` sends them and a
read of the view in one round trip, and that read is vouched for by the same rule.
A probe (:func:`probe_steps`, when the first connection opens) checks the
behaviour all this rests on, on the server at hand; where it does not hold, or
tracking is unavailable (fakeredis, Cluster), or another thread is using the
connection, the append goes through the store and the next call reads, as before.
On Sentinel the connection follows the primary (:func:`primary_moved`): it writes only
while the store's pool knows the primary afresh, to that server, and a ``READONLY``
answer (a primary demoted before the pool heard of it) is an outage of the connection,
not a script's error: the append goes through the store.

:class:`~shared.store.own_writes_sync.OwnWrites` is the blocking shell (the sync
guard), :class:`~shared.store.own_writes_aio.AsyncOwnWrites` the asyncio one; both
keep their state in :class:`OwnState`, here with the rest of what they share.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
from collections.abc import Mapping
from importlib import resources
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from shared.store.changes import NOTHING, RETRY_SECONDS, VERIFY_SECONDS, Locate, _Seen

if TYPE_CHECKING:
    from shared.store.own_writes_aio import AsyncOwnWrites
    from shared.store.own_writes_sync import OwnWrites

log = logging.getLogger("shared.store.own_writes")
T = TypeVar("T")

TRACKING = ("CLIENT", "TRACKING", "ON", "NOLOOP")


class OwnMark(NamedTuple):
    """What vouches for a view made from the guard's own append: this connection's epoch
    and push counter when the append's reply was read, and the change feed's mark
    (epoch, sequence number) taken then (:func:`vouch`)."""

    epoch: int
    seq: int
    feed: tuple[int, int] | None = None


def vouch(own: OwnMark | None, before: tuple[int, int, int] | None,
          after: tuple[int, int, int] | None) -> OwnMark | None:
    """The mark for a view made from an own append, given the change feed's tallies for
    the session taken just before sending it and just after its reply; None when they
    cannot vouch for it.

    Each connection covers the other's blind spot. The feed's push for the append's
    pass of the event loop merges any other client's write in that pass; but those are
    pushed to this connection, in the same reply buffer as the append's answer. This
    connection's pushes may reach it just after the writer's reply; the feed's are sent
    before it (:mod:`shared.store.changes`), and a late one makes the count fall short:
    no vouching. So: exactly one feed push named the
    session meanwhile (the append's own pass), none here; from then on, neither
    connection may report a write to it.
    """
    if own is None or before is None or after is None or before[0] != after[0]:
        return None
    if after[2] != before[2] + 1:  # another pass wrote to the session (or the push is late)
        return None
    return own._replace(feed=(after[0], after[1]))


class OwnState:
    """The sans-I/O part: what the pushes told, when the connection last answered, its
    failures. Both shells hold one and do only the I/O around it."""

    def __init__(self) -> None:
        self.seen = _Seen()
        self.verified = 0.0
        self.failures = 0
        self.retry_at = 0.0
        self.usable: bool | None = None  # the probe's verdict on this server (None: not yet)

    def may_connect(self, now: float) -> bool:
        return self.usable is not False and now >= self.retry_at

    def connected(self) -> None:
        self.seen.forget()  # nothing was tracked for this connection before now
        self.verified = time.monotonic()
        self.failures = 0

    def failed(self, exc: BaseException) -> None:
        if self.failures == 0:
            log.info("own-writes connection unavailable (%s): the guard reads after its "
                     "appends", exc)
        self.retry_at = time.monotonic() + RETRY_SECONDS[min(self.failures,
                                                             len(RETRY_SECONDS) - 1)]
        self.failures += 1
        self.seen.forget()

    def needs_ping(self) -> bool:
        return time.monotonic() - self.verified > VERIFY_SECONDS

    def answered(self) -> None:
        self.verified = time.monotonic()

    def mark_after(self, base: str, before: int) -> OwnMark | None:
        """The mark for a view made from an append sent at push counter ``before``: none
        when a push for the session arrived meanwhile (a write raced the append)."""
        if self.seen.since(base, self.seen.epoch, before) != NOTHING:
            return None
        return OwnMark(self.seen.epoch, self.seen.seq)

    def since(self, base: str, mark: OwnMark) -> int:
        """What the session saw since ``mark`` (:meth:`shared.store.changes._Seen.since`)."""
        return self.seen.since(base, mark.epoch, mark.seq)


def is_reply_error(exc: BaseException) -> bool:
    """Redis answered with an error (the script's own, e.g. ``ID_CONFLICT``): the
    connection is fine and the caller handles it. Not ``READONLY`` (:func:`is_readonly`)."""
    import redis

    return isinstance(exc, redis.ResponseError) and not is_readonly(exc)


def is_readonly(exc: BaseException) -> bool:
    """The server is a replica now (a primary demoted before the store's pool heard of it,
    on Sentinel): it wrote nothing, and the same writes through the store reach the
    primary. The connection is dropped and the caller falls back to the store."""
    import redis

    text = str(exc)
    return isinstance(exc, redis.exceptions.ReadOnlyError) or (
        isinstance(exc, redis.ResponseError)
        and (text.startswith("READONLY") or "-READONLY" in text))


def primary_moved(locate: Locate | None,
                  address: tuple[str, int] | None) -> tuple[str, int] | bool | None:
    """For a connection that follows a Sentinel primary (``locate``): None when the
    pool's answer is stale (nothing may be written on the connection now), the new
    address when the primary is no longer ``address`` (drop the connection), else False
    (also without ``locate``: one server, nothing moves)."""
    if locate is None:
        return False
    where = locate()
    if where is None:
        return None
    return where if address is not None and where != address else False


def aim(locate: Locate | None) -> dict[str, Any] | None:
    """The host and port a new connection opens to: on Sentinel the primary named now
    ({} on one server: the store's own arguments); None when the pool's answer is stale
    (no connection now: the append goes through the store)."""
    if locate is None:
        return {}
    where = locate()
    return None if where is None else {"host": where[0], "port": where[1]}


def target_address(target: Mapping[str, Any]) -> tuple[str, int] | None:
    """The address a connection opened with ``target`` (host and port) went to."""
    return (str(target["host"]), int(target["port"])) if target else None


def is_pong(reply: Any) -> bool:
    """A ``PING``'s answer. Anything else (None: redis.asyncio's read gave up waiting, the
    ``PONG`` still to come) leaves the connection a reply behind: it is dropped, never
    read on, or the next script would take that ``PONG`` as its reply."""
    return reply in (b"PONG", "PONG")


@functools.cache
@functools.cache
def lua_source(name: str) -> str:
    """The text of one of the store's scripts (``shared/store/lua/<name>.lua``), read once."""
    return resources.files("shared.store").joinpath("lua", f"{name}.lua").read_text(
        encoding="utf-8")


@functools.lru_cache(maxsize=64)
def script_sha(source: str) -> str:
    return hashlib.sha1(source.encode("utf-8")).hexdigest()  # Redis names scripts by SHA-1


PROBE_READ = "return redis.call('EXISTS', KEYS[1])"
PROBE_WRITE = "redis.call('SET', KEYS[1], ARGV[1]); return redis.call('EXISTS', KEYS[1])"


def probe_steps(key: str) -> list[tuple[tuple[Any, ...], str]]:
    """The probe, as (command, who sends it: "own" or "other") in order. After it, the
    own connection must have received exactly one invalidation, for ``key``, caused by
    the other client's write after its own scripted write: NOLOOP covers scripts, and a
    script's final read keeps the key tracked."""
    return [
        (("EVAL", PROBE_READ, 1, key), "own"),
        (("EVAL", PROBE_WRITE, 1, key, "own"), "own"),
        (("SET", key, "other"), "other"),
        (("DEL", key), "other"),
    ]


def probe_verdict(pushes: list[Any], key: str) -> bool:
    """Exactly the pushes the probe expects: the other client's SET (its DEL follows an
    invalidation, after which the key is no longer tracked: nothing more)."""
    keys = [item[1] for item in pushes if isinstance(item, (list, tuple)) and len(item) > 1]
    names = [[k.decode() if isinstance(k, bytes) else k for k in (ks or [])] for ks in keys]
    return names == [[key]]


def is_async_client(client: Any) -> bool:
    return type(client).__module__.startswith("redis.asyncio")


def own_writes_for(client: Any, probe_key: str) -> OwnWrites | AsyncOwnWrites | None:
    """The own-writes connection for ``client``'s server (a blocking one for redis-py's
    ``Redis``, an asyncio one for ``redis.asyncio.Redis``), or None where tracking cannot
    work (the same cases as :func:`shared.store.changes.feed_for`). On a Sentinel client,
    one that follows the primary as the change feed does (``locate``)."""
    from shared.store.changes import sentinel_target, tracking_pool
    from shared.store.own_writes_aio import AsyncOwnWrites
    from shared.store.own_writes_sync import OwnWrites

    found = sentinel_target(client) or tracking_pool(client)
    if found is None:
        return None
    kwargs, name, *locate = found
    where = locate[0] if locate else None
    if is_async_client(client):
        return AsyncOwnWrites(kwargs, connection_class=name, probe_key=probe_key,
                              locate=where)
    return OwnWrites(kwargs, connection_class=name, probe_key=probe_key, locate=where)


__all__ = ["TRACKING", "OwnMark", "OwnState", "is_async_client", "is_pong", "is_reply_error",
           "lua_source",
           "own_writes_for",
           "probe_steps", "probe_verdict", "script_sha", "vouch"]
