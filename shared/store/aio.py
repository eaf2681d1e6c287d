"""The session store over redis.asyncio: the same scripts, commands and parsers.

:class:`AsyncSessionStore` sends what :mod:`shared.store.commands` builds and
reads the replies with its parsers, exactly like
:class:`shared.store.sessions.SessionStore`; only the client call is awaited.
It offers what the async guard needs (the hot path: read the view, append a
turn, record decisions, commit a truncation, the pending flag, state) and what an
async agent does to its own sessions (history edits: :meth:`~AsyncSessionStore.truncate_after`,
:meth:`~AsyncSessionStore.rewind`, :meth:`~AsyncSessionStore.delete_session`), through
the same sans-I/O steps as the sync store;
workers and operators keep the sync store.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import redis
import redis.asyncio

from shared.core.config import StoreConfig
from shared.core.errors import InvalidInput, StoreUnavailable
from shared.core.messages import Message
from shared.core.records import (
    AppendResult,
    CheapDecision,
    CommitResult,
    HistoryEdit,
    InlineJob,
    RawView,
    SessionState,
    SummaryRecord,
    ViewCursor,
)
from shared.core.tokens import DEFAULT_COUNTER, TokenCounter
from shared.store import commands
from shared.store.cancelled import cancel_mark, raise_swallowed
from shared.store.commands import EncodedBatch, T
from shared.store.damage import Mended, mend_steps
from shared.store.edits import rewind_steps, truncate_steps
from shared.store.keys import DEFAULT_TENANT, SessionKeys, validate_tenant
from shared.store.pools import AsyncFairConnectionPool
from shared.store.sessions import (
    IDEMPOTENCY_KEEP,
    IDEMPOTENCY_TTL_SECONDS,
    SCRIPTS,
    _load_lua,
    append_refusal,
    driver_info,
    redis_errors,
)

log = logging.getLogger("shared.store")


MAX_CONNECTIONS = 100
"""connect_async's default pool size: calls beyond it wait for a connection."""


def connect_async(url: str, config: StoreConfig | None = None, *,
                  max_connections: int = MAX_CONNECTIONS,
                  pool_timeout: float | None = None) -> redis.asyncio.Redis:
    """An asyncio client with the same bounded timeouts and no silent retries.

    Its pool holds at most ``max_connections``; a call beyond them waits for one to be
    released, first come first served (redis-py's default pool failed it at once: an
    async server with more calls in flight lost them). The wait is bounded by Redis's
    silence, not by its length: a waiting call fails (StoreUnavailable) once no
    connection has come back from an answered call for ``pool_timeout`` seconds, by
    default the store's connect and socket timeouts (what the call holding a connection
    may take); while Redis answers, a burst of any size waits its turn
    (:mod:`shared.store.pools`). A ``redis+sentinel://`` URL (``rediss+sentinel://`` over TLS)
    gives a client of the primary that Sentinel names
    (:func:`shared.store.sentinel.connect_sentinel_async`)."""
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    _check_positive("max_connections", max_connections)
    cfg = config or StoreConfig()
    if url.lower().startswith(("redis+sentinel://", "rediss+sentinel://")):
        from shared.store.sentinel import connect_sentinel_async

        return connect_sentinel_async(url, cfg, max_connections=max_connections,
                                      pool_timeout=pool_timeout)
    wait = cfg.connect_timeout + cfg.socket_timeout if pool_timeout is None else pool_timeout
    pool = AsyncFairConnectionPool.from_url(
        url, max_connections=max_connections, timeout=wait,
        socket_timeout=cfg.socket_timeout, socket_connect_timeout=cfg.connect_timeout,
        retry=Retry(NoBackoff(), 0), health_check_interval=30,
        driver_info=driver_info())
    return redis.asyncio.Redis.from_pool(pool)


class AsyncSessionStore:
    """Sessions of one tenant over redis.asyncio (the guard's operations)."""

    def __init__(self, client: Any, config: StoreConfig | None = None, *,
                 tenant: str = DEFAULT_TENANT, counter: TokenCounter | None = None,
                 idempotency_keep: int = IDEMPOTENCY_KEEP,
                 idempotency_ttl: int = IDEMPOTENCY_TTL_SECONDS) -> None:
        _check_positive("idempotency_keep", idempotency_keep)
        _check_positive("idempotency_ttl", idempotency_ttl)
        self.redis = client
        _warn_unless_waiting(client)
        self.config = config or StoreConfig()
        self.tenant = validate_tenant(tenant)
        self.counter = counter or DEFAULT_COUNTER
        self.idempotency_keep = idempotency_keep
        self.idempotency_ttl = idempotency_ttl
        self._scripts = {name: client.register_script(_load_lua(f"{name}.lua"))
                         for name in SCRIPTS}

    def keys(self, session_id: str) -> SessionKeys:
        return SessionKeys.for_session(self.config.key_prefix, self.tenant, session_id)

    async def warm_up(self) -> bool:
        """See :meth:`shared.store.sessions.SessionStore.warm_up`."""
        scripts = list(self._scripts.values())
        try:
            loaded = await self.redis.script_exists(*(s.sha for s in scripts))
            for script, found in zip(scripts, loaded, strict=True):
                if not found:
                    await self.redis.script_load(script.script)
        except Exception as exc:  # any failure here is the first call's to report
            log.debug("warm-up of the store's connection failed: %s", exc)
            return False
        return True

    async def _call(self, what: str, awaitable: Any) -> Any:
        """Every client call of the store: a cancellation that redis-py swallowed during
        it is raised after it (:mod:`shared.store.cancelled`), else the agent's cancelled
        task went on."""
        mark = cancel_mark()
        try:
            with redis_errors(what):
                return await awaitable
        finally:
            raise_swallowed(mark)

    async def execute(self, cmd: commands.Command[T]) -> T:
        script = self._scripts[cmd.script]
        return cmd.parse(await self._call(cmd.what, script(keys=cmd.keys, args=cmd.args)))

    # -- the log ---------------------------------------------------------------
    def encode(self, session_id: str, messages: Iterable[Any]) -> EncodedBatch:
        return commands.encode(messages, self.config, self.counter)

    async def append(self, session_id: str, messages: Iterable[Any], *,
                     request_id: str | None = None) -> int:
        result = await self.append_encoded(session_id, self.encode(session_id, messages),
                                           request_id=request_id)
        return result.length

    async def append_encoded(self, session_id: str, encoded: Sequence[tuple[str | bytes, int]], *,
                             request_id: str | None = None, mark_pending: bool = False,
                             with_state: bool = False,
                             state_fields: Mapping[str, Any] | None = None,
                             fields_version: int | None = None,
                             job: InlineJob | None = None,
                             run: Callable[[commands.Command[AppendResult]],
                                           Awaitable[AppendResult]] | None = None,
                             ) -> AppendResult:
        """See :meth:`shared.store.sessions.SessionStore.append_encoded`."""
        opts = commands.AppendOptions(request_id, mark_pending, with_state, state_fields,
                                      fields_version, job)
        for _ in range(commands.APPEND_ATTEMPTS):
            cmd = commands.append_command(self.keys(session_id), self.config, encoded, opts,
                                          idempotency_keep=self.idempotency_keep,
                                          idempotency_ttl=self.idempotency_ttl)
            try:
                return await (self.execute(cmd) if run is None else run(cmd))
            except redis.exceptions.ResponseError as exc:
                renamed = commands.renamed_after(exc, encoded, self.config, self.counter)
                if renamed is None:
                    raise append_refusal(exc, session_id, self.config) from None
                encoded = renamed
        raise StoreUnavailable(f"append to {session_id!r}: tool-call ids kept colliding")

    async def length(self, session_id: str) -> int:
        return int(await self._call("length", self.redis.llen(self.keys(session_id).log)))

    async def messages(self, session_id: str, start: int = 0,
                       end: int | None = None) -> list[Message]:
        if end is not None and end <= start:
            return []
        raw = await self._call("read", self.redis.lrange(
            self.keys(session_id).log, start, -1 if end is None else end - 1))
        return [Message.model_validate_json(r) for r in raw]

    # -- view, state, summaries -------------------------------------------------
    async def read_view(self, session_id: str, since: ViewCursor | None = None, *,
                        with_counts: bool = False) -> RawView:
        """See :meth:`shared.store.sessions.SessionStore.read_view` (same steps)."""
        return await commands.drive_async(
            commands.view_steps(self.keys(session_id), since, with_counts), self._send)

    async def _send(self, step: commands.Step) -> Any:
        """One step of a sans-I/O exchange: a script, or plain commands in one MULTI/EXEC."""
        if isinstance(step, commands.Command):
            return await self.execute(step)

        async def batch() -> list[Any]:
            async with self.redis.pipeline(transaction=True) as pipe:
                for call in step.calls:
                    pipe.execute_command(*call)
                return list(await pipe.execute())

        return step.parse(await self._call(step.what, batch()))

    async def state(self, session_id: str) -> SessionState:
        raw = await self._call("state", self.redis.hgetall(self.keys(session_id).state))
        return SessionState.from_hash({commands._s(a): commands._s(b) for a, b in raw.items()})

    async def update_state(self, session_id: str, **fields: Any) -> None:
        """See :meth:`shared.store.sessions.SessionStore.update_state`."""
        clean = commands.state_fields(fields)
        if not clean:
            return
        key, ttl = self.keys(session_id).state, self.config.ttl_seconds

        async def write() -> Any:
            pipe = self.redis.pipeline(transaction=False)
            pipe.hset(key, mapping=clean)
            if ttl:
                pipe.expire(key, ttl)
            return await pipe.execute()

        await self._call("update_state", write())

    async def clear_state_flags(self, session_id: str, *names: str) -> None:
        """See :meth:`shared.store.sessions.SessionStore.clear_state_flags` (an HDEL)."""
        await self._call("clear_state_flags",
                         self.redis.hdel(self.keys(session_id).state, *names))

    async def record_cheap(self, session_id: str, decisions: Iterable[CheapDecision],
                    expected_version: int | None = None) -> int:
        items = list(decisions)
        if not items:
            return 0
        return await self.execute(commands.cheap_command(self.keys(session_id), self.config,
                                                         items, expected_version))

    async def commit_summary(self, session_id: str, record: SummaryRecord,
                             expected_version: int) -> CommitResult:
        return await self.execute(commands.commit_command(self.keys(session_id), self.config,
                                                          record, expected_version))

    async def summaries(self, session_id: str) -> list[SummaryRecord]:
        raw = await self._call("summaries", self.redis.hgetall(self.keys(session_id).summaries))
        return sorted((SummaryRecord.model_validate_json(v) for v in raw.values()),
                      key=lambda r: r.watermark)

    # -- history edits -----------------------------------------------------------
    async def truncate_after(self, session_id: str, index: int) -> HistoryEdit:
        """See :meth:`shared.store.sessions.SessionStore.truncate_after`."""
        version, watermark, length, gen = await commands.drive_async(
            truncate_steps(self.keys(session_id), session_id, index, self.config.ttl_seconds or 0),
            self._send)
        from shared.store.recall_index import forget_after_async  # imports the store modules
        if gen:  # 0: no session, nothing was edited
            await forget_after_async(self, session_id, index, gen=gen)
        return HistoryEdit(version=version, watermark=watermark, length=length)

    async def rewind(self, session_id: str, watermark: int) -> SessionState:
        """See :meth:`shared.store.sessions.SessionStore.rewind`."""
        return await commands.drive_async(
            rewind_steps(self.keys(session_id), watermark, self.config.ttl_seconds or 0),
            self._send)

    async def reset_damaged(self, session_id: str) -> bool:
        """See :meth:`shared.store.sessions.SessionStore.reset_damaged`."""
        from shared.store.recall_index import drop_index_async  # imports the store modules
        if not await self.execute(commands.reset_damaged_command(self.keys(session_id))):
            return False
        await drop_index_async(self, session_id)
        return True

    async def mend_damaged(self, session_id: str) -> Mended:
        """See :meth:`shared.store.sessions.SessionStore.mend_damaged` (same steps)."""
        from shared.store.recall_index import drop_index_async  # imports the store modules
        done = await commands.drive_async(mend_steps(self.keys(session_id), self.counter),
                                          self._send)
        if done == "reset":
            await drop_index_async(self, session_id)
        return done

    async def delete_session(self, session_id: str) -> None:
        """See :meth:`shared.store.sessions.SessionStore.delete_session`.

        Finished even when the caller is cancelled midway (a client disconnecting, a
        timeout): the recall index's keys sit outside the session's, and one left behind
        without a session TTL would never go. The cancellation is raised once it is done.
        """
        k = self.keys(session_id)  # bad input is refused here, before anything runs
        done = asyncio.ensure_future(self._delete(session_id, k))
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            done.add_done_callback(_retrieved)  # its failure is the caller's no longer
            raise

    async def _delete(self, session_id: str, k: SessionKeys) -> None:
        from shared.store.recall_index import drop_index_async  # imports the store modules
        await self._call("delete", self.redis.unlink(*k.all_keys(), commands.ids_key(k)))
        await drop_index_async(self, session_id)

    # -- the pending flag ----------------------------------------------------------
    async def mark_pending(self, session_id: str) -> int:
        """See :meth:`shared.store.lease.LeaseOps.mark_pending` (a stale flag re-armed: 3)."""
        return await self.execute(commands.pending_command(self.keys(session_id), self.config))

    async def clear_pending(self, session_id: str) -> None:
        await self._call("clear_pending", self.redis.delete(self.keys(session_id).pending))

    async def is_pending(self, session_id: str) -> bool:
        return bool(await self._call("is_pending",
                                     self.redis.exists(self.keys(session_id).pending)))

    async def aclose(self) -> None:
        await self.redis.aclose()


def _retrieved(task: asyncio.Future[None]) -> None:
    """A delete its caller stopped waiting for: a failure is logged, not lost."""
    if not task.cancelled() and task.exception() is not None:
        log.warning("a cancelled delete_session failed afterwards: %s", task.exception())


def _warn_unless_waiting(client: Any) -> None:
    """A client built with redis-py's own pool (``redis.asyncio.Redis.from_url``) fails a
    call beyond its connections at once: 1,000 agent tasks on one loop lost 4,599 of
    5,000 turns that way (``Too many connections``, ``scripts/bench_guard_concurrency.py``).
    Said once a process: which pool, and the connector whose calls wait their turn."""
    global _WARNED_POOL  # once a process, not once a store
    pool = getattr(client, "connection_pool", None)
    if _WARNED_POOL or type(pool) is not redis.asyncio.ConnectionPool:
        return
    _WARNED_POOL = True
    log.warning("the store's client has redis-py's own pool: a call beyond its %s "
                "connections fails at once (Too many connections) instead of waiting; build "
                "it with shared.store.aio.connect_async(url, config, max_connections=...)",
                pool.max_connections)


_WARNED_POOL = False


def _check_positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput("must be a positive integer", field=name)


__all__ = ["MAX_CONNECTIONS", "AsyncSessionStore", "connect_async"]
