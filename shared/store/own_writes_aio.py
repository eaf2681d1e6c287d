"""The own-writes connection over asyncio (the async guard): see
:mod:`shared.store.own_writes`."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from shared.core.errors import StoreUnavailable
from shared.store import own_writes
from shared.store.changes import CHANGED, IO_TIMEOUT, Locate, feed_kwargs
from shared.store.commands import Command
from shared.store.own_writes import (
    TRACKING,
    OwnMark,
    OwnState,
    is_pong,
    is_readonly,
    is_reply_error,
    lua_source,
    probe_steps,
    script_sha,
)

log = logging.getLogger("shared.store.own_writes")


class AsyncOwnWrites:
    """The asyncio shell: one connection of the event loop that opened it."""

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
                if is_reply_error(exc):
                    raise
                await self._fail(exc)
                if is_readonly(exc):  # nothing written: the store's pool has the primary
                    return None
                raise StoreUnavailable(f"redis unavailable during {script}: {exc}") from exc
            self.state.answered()
            return reply, self.state.mark_after(base, before)
        finally:
            self._busy = False

    async def run_many(self, base: str, steps: Sequence[Command[Any] | tuple[Any, ...]],
                       ) -> tuple[list[Any], OwnMark | None] | None:
        """See :meth:`shared.store.own_writes_sync.OwnWrites.run_many`."""
        if not self._acquire():
            return None
        try:
            if not await self._ready():
                return None
            before = self.state.seen.seq
            try:
                packed = []
                for step in steps:
                    if isinstance(step, Command):
                        sha = await self._load(step.script)
                        packed.append(("EVALSHA", sha, len(step.keys), *step.keys, *step.args))
                    else:
                        packed.append(step)
                await self._conn.send_packed_command(self._conn.pack_commands(packed))
                replies: list[Any] = []
                for _ in packed:
                    try:
                        replies.append(await self._conn.read_response())
                    except Exception as exc:
                        if not is_reply_error(exc):
                            raise
                        replies.append(exc)
                await self._drain()
            except Exception as exc:
                await self._fail(exc)
                if is_readonly(exc):  # nothing written: the store's pool has the primary
                    return None
                raise StoreUnavailable(f"redis unavailable during a guard's writes: {exc}") \
                    from exc
            self.state.answered()
            return replies, self.state.mark_after(base, before)
        finally:
            self._busy = False

    async def _load(self, script: str) -> str:
        source = lua_source(script)
        sha = script_sha(source)
        if sha not in self._loaded:
            await self._conn.send_command("SCRIPT", "LOAD", source)
            await self._conn.read_response()
            self._loaded.add(sha)
        return sha

    async def warm_up(self) -> bool:
        """See :meth:`OwnWrites.warm_up`."""
        if not self._acquire():
            return False
        try:
            return await self._ready()
        finally:
            self._busy = False

    async def since(self, base: str, mark: OwnMark) -> int:
        """As :meth:`shared.store.own_writes_sync.OwnWrites.since`."""
        if not self._acquire():
            return CHANGED
        try:
            return self.state.since(base, mark) if await self._ready() else CHANGED
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
        moved = own_writes.primary_moved(self._locate, self._address)
        if moved is None:
            return False
        if isinstance(moved, tuple) and self._conn is not None:
            log.info("own-writes connection: the primary moved to %s:%s", *moved)
            await self._drop()
        if self._conn is not None and not self._conn.is_connected:
            # closed by redis-py when a call on it was cancelled (a failure is dropped
            # by _fail): replaced now, not taken for an outage (logged, backed off)
            await self._drop()
        if self._conn is None and not (self.state.may_connect(time.monotonic())
                                       and await self._connect()):
            return False
        try:
            await self._drain()
            if self.state.needs_ping():  # briefly: a slow answer only costs the shortcut
                await self._conn.send_command("PING")
                if not is_pong(await self._conn.read_response(timeout=IO_TIMEOUT)):
                    raise TimeoutError(f"no PONG within {IO_TIMEOUT} s")
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

        conn = None
        target = own_writes.aim(self._locate)  # on Sentinel: the primary named now
        if target is None:
            return False
        self._target = target
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
        except BaseException as exc:
            # not ours yet, so no one else closes it: left open (a cancelled probe, a
            # failed one) until the garbage collector got to it
            if conn is not None:
                await conn.disconnect(nowait=True)
            if not isinstance(exc, Exception):
                raise  # cancelled: not the server's failure
            await self._fail(exc)
            return False
        self._conn = conn
        self._address = own_writes.target_address(self._target)
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
        return cls(**{"driver_info": DriverInfo(lib_version=redis.__version__), **self._kwargs,
                      **self._target}, protocol=3)

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
        return own_writes.probe_verdict(pushes, key)

    async def _fail(self, exc: BaseException) -> None:
        self.state.failed(exc)
        await self._drop()

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        self._address = None
        self.state.seen.forget()
        if conn is not None:
            try:
                await conn.disconnect()
            except Exception:
                log.debug("closing the own-writes connection failed", exc_info=True)


__all__ = ["AsyncOwnWrites"]
