"""The own-writes connection, blocking (the sync guard): see :mod:`shared.store.own_writes`."""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from shared.core.errors import StoreUnavailable
from shared.store import own_writes
from shared.store.changes import CHANGED, IO_TIMEOUT, Locate, feed_kwargs
from shared.store.commands import Command
from shared.store.own_writes import (
    TRACKING,
    OwnMark,
    OwnState,
    is_readonly,
    is_reply_error,
    lua_source,
    probe_steps,
    script_sha,
)
from shared.store.pushes import Pushes

log = logging.getLogger("shared.store.own_writes")


class OwnWrites:
    """The sync shell: one connection, used by one thread at a time (others fall back)."""

    def __init__(self, connection_kwargs: Mapping[str, Any], *,
                 connection_class: str = "Connection", probe_key: str = "",
                 locate: Locate | None = None) -> None:
        self._kwargs = feed_kwargs(connection_kwargs, short=False)  # an append may take a while
        # On Sentinel: the primary the store's pool writes to while its answer is fresh
        # (:func:`shared.store.changes.sentinel_target`). The connection writes only there:
        # a moved primary drops it, a stale answer sends the append through the store.
        self._locate = locate
        self._address: tuple[str, int] | None = None
        self._target: dict[str, Any] = {}
        self._class = connection_class
        self._probe_key = probe_key
        self._lock = threading.Lock()
        self._conn: Any = None
        self._pushes: Pushes | None = None
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
                if is_reply_error(exc):
                    raise
                self._fail(exc)
                if is_readonly(exc):  # nothing written: the store's pool has the primary
                    return None
                raise StoreUnavailable(f"redis unavailable during {script}: {exc}") from exc
            self.state.answered()
            return reply, self.state.mark_after(base, before)
        finally:
            self._lock.release()

    def run_many(self, base: str, steps: Sequence[Command[Any] | tuple[Any, ...]],
                 ) -> tuple[list[Any], OwnMark | None] | None:
        """Several commands in one round trip (a script as its :class:`Command`, a plain
        one as a tuple), in order: their raw replies (an error reply as its exception),
        and the mark; None when the connection is busy or unavailable."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if not self._ready():
                return None
            before = self.state.seen.seq
            try:
                packed = []
                for step in steps:
                    if isinstance(step, Command):
                        sha = self._load(step.script)
                        packed.append(("EVALSHA", sha, len(step.keys), *step.keys, *step.args))
                    else:
                        packed.append(step)
                self._conn.send_packed_command(self._conn.pack_commands(packed))
                replies: list[Any] = []
                for _ in packed:
                    try:
                        replies.append(self._conn.read_response())
                    except Exception as exc:
                        if not is_reply_error(exc):
                            raise
                        replies.append(exc)
                self._drain()
            except Exception as exc:
                self._fail(exc)
                if is_readonly(exc):  # nothing written: the store's pool has the primary
                    return None
                raise StoreUnavailable(f"redis unavailable during a guard's writes: {exc}") \
                    from exc
            self.state.answered()
            return replies, self.state.mark_after(base, before)
        finally:
            self._lock.release()

    def _load(self, script: str) -> str:
        """The script's SHA, loaded on this connection's server first if not yet."""
        source = lua_source(script)
        sha = script_sha(source)
        if sha not in self._loaded:
            self._conn.send_command("SCRIPT", "LOAD", source)
            self._conn.read_response()
            self._loaded.add(sha)
        return sha

    def warm_up(self) -> bool:
        """Connect (and probe the server) now, best effort: not in the first append."""
        with self._lock:
            return self._ready()

    def since(self, base: str, mark: OwnMark) -> int:
        """What writes by anyone else did to session ``base`` since ``mark``
        (:data:`~shared.store.changes.NOTHING`, ``FLAG`` or ``CHANGED``)."""
        if not self._lock.acquire(blocking=False):
            return CHANGED  # another thread is on the connection: read instead
        try:
            return self.state.since(base, mark) if self._ready() else CHANGED
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
        moved = own_writes.primary_moved(self._locate, self._address)
        if moved is None:
            return False
        if isinstance(moved, tuple) and self._conn is not None:
            log.info("own-writes connection: the primary moved to %s:%s", *moved)
            self._drop()
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
        assert self._pushes is not None
        self._pushes.drain()

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
        target = own_writes.aim(self._locate)  # on Sentinel: the primary named now
        if target is None:
            return False
        self._target = target
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
        self._address = own_writes.target_address(self._target)
        self._pushes = Pushes(conn, tls=self._class == "SSLConnection")
        self._loaded.clear()
        self.state.connected()
        return True

    def _new(self) -> Any:
        import redis
        from redis.driver_info import DriverInfo

        cls = {"Connection": redis.Connection, "SSLConnection": redis.SSLConnection,
               "UnixDomainSocketConnection": redis.UnixDomainSocketConnection}[self._class]
        return cls(**{"driver_info": DriverInfo(lib_version=redis.__version__), **self._kwargs,
                      **self._target}, protocol=3)

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
        ok = own_writes.probe_verdict(pushes, key)
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
        self._pushes = None
        self.state.seen.forget()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        self._address = None
        self._pushes = None
        self.state.seen.forget()
        if conn is not None:
            try:
                conn.disconnect()
            except Exception:  # already broken
                log.debug("closing the own-writes connection failed", exc_info=True)


_OWN: weakref.WeakSet[OwnWrites] = weakref.WeakSet()


def _after_fork() -> None:
    for own in list(_OWN):
        own._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


__all__ = ["OwnWrites"]
