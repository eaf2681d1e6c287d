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
the feed's push always comes first. So the view is vouched for by both
(:func:`vouch`, :class:`OwnMark`): the feed saw exactly one push for the session
around the append (its own pass) and neither connection reports a write since.
The feed's rules keep this connection honest too: drained before every check,
trusted within :data:`~shared.store.changes.VERIFY_SECONDS` of an answer on it
(else a ``PING`` first), a new epoch on every (re)connection, flush or failure.
A probe (:func:`probe_steps`, when the first connection opens) checks the
behaviour all this rests on, on the server at hand; where it does not hold, or
tracking is unavailable (fakeredis, Cluster), or another thread is using the
connection, the append goes through the store and the next call reads, as before.

:class:`OwnWrites` is the blocking shell (the sync guard), :class:`AsyncOwnWrites`
the asyncio one; both keep their state in :class:`OwnState`.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from importlib import resources
from typing import Any, NamedTuple, TypeVar

from shared.core.errors import StoreUnavailable
from shared.store.changes import IO_TIMEOUT, RETRY_SECONDS, VERIFY_SECONDS, _Seen, feed_kwargs

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
    connection's pushes may reach it just after the writer's reply; but the feed's
    reach it before (:mod:`shared.store.changes`). So: exactly one feed push named the
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
        if self.seen.changed.get(base, -1) > before:
            return None
        return OwnMark(self.seen.epoch, self.seen.seq)

    def unchanged(self, base: str, mark: OwnMark) -> bool:
        return mark.epoch == self.seen.epoch and self.seen.changed.get(base, -1) <= mark.seq


def _is_reply_error(exc: BaseException) -> bool:
    """Redis answered with an error (the script's own, e.g. ``ID_CONFLICT``): the
    connection is fine and the caller handles it."""
    import redis

    return isinstance(exc, redis.ResponseError)


@functools.cache
def lua_source(name: str) -> str:
    """The text of one of the store's scripts (``shared/store/lua/<name>.lua``)."""
    return resources.files("shared.store").joinpath("lua", f"{name}.lua").read_text(
        encoding="utf-8")


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


class OwnWrites:
    """The sync shell: one connection, used by one thread at a time (others fall back)."""

    def __init__(self, connection_kwargs: Mapping[str, Any], *,
                 connection_class: str = "Connection", probe_key: str = "") -> None:
        self._kwargs = feed_kwargs(connection_kwargs, short=False)  # an append may take a while
        self._class = connection_class
        self._probe_key = probe_key
        self._lock = threading.Lock()
        self._conn: Any = None
        self.state = OwnState()
        self._loaded: set[str] = set()
        self.closed = False
        _OWN.add(self)

    def run(self, base: str, script: str, keys: list[str], args: list[Any],
            ) -> tuple[Any, OwnMark | None] | None:
        """Run one script on the connection: (its reply, the mark vouching for what it
        wrote), or None when the connection is busy or unavailable (use the store).
        Redis's errors (``ResponseError``) are raised; a connection failure raises too,
        after turning the connection off for a while."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if not self._ready():
                return None
            before = self.state.seen.seq
            try:
                reply = self._eval(script, keys, args)
                self._drain()
            except Exception as exc:
                if _is_reply_error(exc):
                    raise
                self._fail(exc)
                raise StoreUnavailable(f"redis unavailable during {script}: {exc}") from exc
            self.state.answered()
            return reply, self.state.mark_after(base, before)
        finally:
            self._lock.release()

    def warm_up(self) -> bool:
        """Connect (and probe the server) now, best effort: not in the first append."""
        with self._lock:
            return self._ready()

    def unchanged(self, base: str, mark: OwnMark) -> bool:
        """True when no write by anyone else touched session ``base`` since ``mark``."""
        if not self._lock.acquire(blocking=False):
            return False  # another thread is on the connection: read instead
        try:
            return self._ready() and self.state.unchanged(base, mark)
        finally:
            self._lock.release()

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self._drop()

    # -- the connection (under the lock) ------------------------------------------------
    def _ready(self) -> bool:
        if self.closed:
            return False
        if self._conn is None and not (self.state.may_connect(time.monotonic())
                                       and self._connect()):
            return False
        try:
            self._drain()
            if self.state.needs_ping():  # briefly: a slow answer only costs the shortcut
                self._conn.send_command("PING")
                self._conn.read_response(timeout=IO_TIMEOUT)
                self.state.answered()
        except Exception as exc:
            self._fail(exc)
            return False
        return True

    def _drain(self) -> None:
        while self._conn.can_read(0):
            self._conn.read_response(push_request=True, timeout=0)

    def _eval(self, script: str, keys: list[str], args: list[Any]) -> Any:
        import redis

        source = lua_source(script)
        sha = script_sha(source)
        if sha not in self._loaded:
            self._conn.send_command("SCRIPT", "LOAD", source)
            self._conn.read_response()
            self._loaded.add(sha)
        try:
            self._conn.send_command("EVALSHA", sha, len(keys), *keys, *args)
            return self._conn.read_response()
        except redis.exceptions.NoScriptError:  # the server's script cache was flushed
            self._loaded.discard(sha)
            return self._eval(script, keys, args)

    def _connect(self) -> bool:
        try:
            conn = self._new()
            conn.connect()
            conn._parser.set_invalidation_push_handler(self.state.seen.invalidated)
            conn.send_command(*TRACKING)
            conn.read_response()
            if self.state.usable is None:
                self.state.usable = self._probe(conn)
                if not self.state.usable:
                    conn.disconnect()
                    return False
        except Exception as exc:
            self._fail(exc)
            return False
        self._conn = conn
        self._loaded.clear()
        self.state.connected()
        return True

    def _new(self) -> Any:
        import redis
        from redis.driver_info import DriverInfo

        cls = {"Connection": redis.Connection, "SSLConnection": redis.SSLConnection,
               "UnixDomainSocketConnection": redis.UnixDomainSocketConnection}[self._class]
        return cls(**{"driver_info": DriverInfo(lib_version=redis.__version__), **self._kwargs},
                   protocol=3)

    def _probe(self, conn: Any) -> bool:
        key = f"{self._probe_key}own-probe:{os.getpid()}:{id(self)}"
        other = self._new()
        pushes: list[Any] = []
        conn._parser.set_invalidation_push_handler(pushes.append)
        try:
            other.connect()
            for command, who in probe_steps(key):
                on = conn if who == "own" else other
                on.send_command(*command)
                on.read_response()
            conn.send_command("PING")  # pushes sent before the PONG are read first
            conn.read_response()
        finally:
            other.disconnect()
            conn._parser.set_invalidation_push_handler(self.state.seen.invalidated)
        ok = probe_verdict(pushes, key)
        if not ok:
            log.info("own-writes tracking does not behave as needed on this server (%r): "
                     "the guard reads after its appends", pushes)
        return ok

    def _fail(self, exc: BaseException) -> None:
        self.state.failed(exc)
        self._drop()

    def _forked(self) -> None:
        self._lock = threading.Lock()
        self._conn = None  # the parent's socket: neither read nor closed here
        self.state.seen.forget()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        self.state.seen.forget()
        if conn is not None:
            try:
                conn.disconnect()
            except Exception:  # already broken
                log.debug("closing the own-writes connection failed", exc_info=True)


def probe_verdict(pushes: list[Any], key: str) -> bool:
    """Exactly the pushes the probe expects: the other client's SET (its DEL follows an
    invalidation, after which the key is no longer tracked: nothing more)."""
    keys = [item[1] for item in pushes if isinstance(item, (list, tuple)) and len(item) > 1]
    names = [[k.decode() if isinstance(k, bytes) else k for k in (ks or [])] for ks in keys]
    return names == [[key]]


class AsyncOwnWrites:
    """The asyncio shell: one connection of the event loop that opened it."""

    def __init__(self, connection_kwargs: Mapping[str, Any], *,
                 connection_class: str = "Connection", probe_key: str = "") -> None:
        self._kwargs = feed_kwargs(connection_kwargs, short=False)  # an append may take a while
        self._class = connection_class
        self._probe_key = probe_key
        self._busy = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conn: Any = None
        self.state = OwnState()
        self._loaded: set[str] = set()
        self.closed = False

    async def run(self, base: str, script: str, keys: list[str],
                  args: list[Any]) -> tuple[Any, OwnMark | None] | None:
        """See :meth:`OwnWrites.run`."""
        if not self._acquire():
            return None
        try:
            if not await self._ready():
                return None
            before = self.state.seen.seq
            try:
                reply = await self._eval(script, keys, args)
                await self._drain()
            except Exception as exc:
                if _is_reply_error(exc):
                    raise
                await self._fail(exc)
                raise StoreUnavailable(f"redis unavailable during {script}: {exc}") from exc
            self.state.answered()
            return reply, self.state.mark_after(base, before)
        finally:
            self._busy = False

    async def warm_up(self) -> bool:
        """See :meth:`OwnWrites.warm_up`."""
        if not self._acquire():
            return False
        try:
            return await self._ready()
        finally:
            self._busy = False

    async def unchanged(self, base: str, mark: OwnMark) -> bool:
        if not self._acquire():
            return False
        try:
            return await self._ready() and self.state.unchanged(base, mark)
        finally:
            self._busy = False

    async def aclose(self) -> None:
        self.closed = True
        await self._drop()

    def close(self) -> None:
        """Stop using the connection (closed with its event loop, or when collected)."""
        self.closed = True
        self._conn = None
        self.state.seen.forget()

    def _acquire(self) -> bool:
        """Take the connection without waiting (False: another task is on it). No await
        between the test and the set: atomic on the event loop."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            # a connection of another loop is unusable here (and not closable from it)
            self._loop, self._busy, self._conn = loop, False, None
            self.state.seen.forget()
        if self._busy:
            return False
        self._busy = True
        return True

    async def _ready(self) -> bool:
        if self.closed:
            return False
        if self._conn is None and not (self.state.may_connect(time.monotonic())
                                       and await self._connect()):
            return False
        try:
            await self._drain()
            if self.state.needs_ping():
                await self._conn.send_command("PING")
                await self._conn.read_response(timeout=IO_TIMEOUT)
                self.state.answered()
        except Exception as exc:
            await self._fail(exc)
            return False
        return True

    async def _drain(self) -> None:
        # bytes that reached the socket are in the stream only once the loop has polled
        # it: two passes of the loop make sure it has, since this call began
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        while await self._conn.can_read():
            await self._conn.read_response(push_request=True)

    async def _eval(self, script: str, keys: list[str], args: list[Any]) -> Any:
        import redis

        source = lua_source(script)
        sha = script_sha(source)
        if sha not in self._loaded:
            await self._conn.send_command("SCRIPT", "LOAD", source)
            await self._conn.read_response()
            self._loaded.add(sha)
        try:
            await self._conn.send_command("EVALSHA", sha, len(keys), *keys, *args)
            return await self._conn.read_response()
        except redis.exceptions.NoScriptError:
            self._loaded.discard(sha)
            return await self._eval(script, keys, args)

    async def _connect(self) -> bool:
        seen = self.state.seen

        async def pushed(push: Any) -> None:
            seen.invalidated(push)

        try:
            conn = self._new()
            await conn.connect()
            conn._parser.set_invalidation_push_handler(pushed)
            await conn.send_command(*TRACKING)
            await conn.read_response()
            if self.state.usable is None:
                self.state.usable = await self._probe(conn, pushed)
                if not self.state.usable:
                    await conn.disconnect()
                    return False
        except Exception as exc:
            await self._fail(exc)
            return False
        self._conn = conn
        self._loaded.clear()
        self.state.connected()
        return True

    def _new(self) -> Any:
        import redis.asyncio
        from redis.driver_info import DriverInfo

        cls = {"Connection": redis.asyncio.Connection,
               "SSLConnection": redis.asyncio.SSLConnection,
               "UnixDomainSocketConnection": redis.asyncio.UnixDomainSocketConnection,
               }[self._class]
        return cls(**{"driver_info": DriverInfo(lib_version=redis.__version__), **self._kwargs},
                   protocol=3)

    async def _probe(self, conn: Any, handler: Callable[[Any], Any]) -> bool:
        key = f"{self._probe_key}own-probe:{os.getpid()}:{id(self)}"
        other = self._new()
        pushes: list[Any] = []

        async def collect(push: Any) -> None:
            pushes.append(push)

        conn._parser.set_invalidation_push_handler(collect)
        try:
            await other.connect()
            for command, who in probe_steps(key):
                on = conn if who == "own" else other
                await on.send_command(*command)
                await on.read_response()
            await conn.send_command("PING")
            await conn.read_response()
        finally:
            await other.disconnect()
            conn._parser.set_invalidation_push_handler(handler)
        return probe_verdict(pushes, key)

    async def _fail(self, exc: BaseException) -> None:
        self.state.failed(exc)
        await self._drop()

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        self.state.seen.forget()
        if conn is not None:
            try:
                await conn.disconnect()
            except Exception:
                log.debug("closing the own-writes connection failed", exc_info=True)


_OWN: weakref.WeakSet[OwnWrites] = weakref.WeakSet()


def _after_fork() -> None:
    for own in list(_OWN):
        own._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


__all__ = ["IO_TIMEOUT", "AsyncOwnWrites", "OwnMark", "OwnState", "OwnWrites", "is_async_client",
           "own_writes_for",
           "probe_steps", "probe_verdict", "script_sha", "vouch"]


def is_async_client(client: Any) -> bool:
    return type(client).__module__.startswith("redis.asyncio")


def own_writes_for(client: Any, probe_key: str) -> OwnWrites | AsyncOwnWrites | None:
    """The own-writes connection for ``client``'s server (a blocking one for redis-py's
    ``Redis``, an asyncio one for ``redis.asyncio.Redis``), or None where tracking cannot
    work (the same cases as :func:`shared.store.changes.feed_for`)."""
    from shared.store.changes import tracking_pool

    found = tracking_pool(client)
    if found is None:
        return None
    kwargs, name = found
    if is_async_client(client):
        return AsyncOwnWrites(kwargs, connection_class=name, probe_key=probe_key)
    return OwnWrites(kwargs, connection_class=name, probe_key=probe_key)
