"""The Redis session store: append-only log, running token totals, summaries.

All writes of compaction state go through ``commit_summary`` (one Lua
compare-and-swap on the session's version); history edits bump the version
so that every in-flight compaction loses its swap. The store is bound to one
tenant at construction: a caller cannot name another tenant's keys.

Every Redis failure surfaces as :class:`StoreUnavailable` within the socket
timeouts configured in :class:`StoreConfig`, never as a hang.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from importlib import resources
from typing import Any, TypeVar

import redis
from redis.commands.core import Script

from shared.config import StoreConfig
from shared.errors import InvalidInput, LimitExceeded, StoreUnavailable
from shared.keys import DEFAULT_TENANT, SessionKeys, validate_tenant
from shared.messages import Message, validate_messages
from shared.records import (
    CheapDecision,
    CommitResult,
    SessionState,
    SummaryRecord,
    ViewData,
)
from shared.tokens import DEFAULT_COUNTER, TokenCounter

T = TypeVar("T")
_REDIS_FAILURES = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                   redis.exceptions.BusyLoadingError)


def _load_lua(name: str) -> str:
    return resources.files("shared").joinpath("lua", name).read_text(encoding="utf-8")


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _pairs(flat: Sequence[Any]) -> dict[str, str]:
    return {_s(flat[i]): _s(flat[i + 1]) for i in range(0, len(flat), 2)}


@contextmanager
def redis_errors(what: str) -> Iterator[None]:
    """Turn connection trouble into the typed StoreUnavailable."""
    try:
        yield
    except _REDIS_FAILURES as exc:
        raise StoreUnavailable(f"redis unavailable during {what}: {exc}") from exc


def connect(url: str, config: StoreConfig | None = None) -> redis.Redis:
    """A client with bounded socket timeouts (no call can hang)."""
    cfg = config or StoreConfig()
    return redis.Redis.from_url(
        url,
        socket_timeout=cfg.socket_timeout,
        socket_connect_timeout=cfg.connect_timeout,
        retry_on_timeout=False,
        health_check_interval=30,
    )


class SessionStore:
    """Sessions of one tenant in Redis (standalone or Cluster; fakeredis for tests)."""

    def __init__(self, client: Any, config: StoreConfig | None = None, *,
                 tenant: str = DEFAULT_TENANT, counter: TokenCounter | None = None) -> None:
        self.redis = client
        self.config = config or StoreConfig()
        self.tenant = validate_tenant(tenant)
        self.counter = counter or DEFAULT_COUNTER
        self._scripts: dict[str, Script] = {
            name: client.register_script(_load_lua(f"{name}.lua"))
            for name in ("append", "commit_summary", "truncate", "rewind", "view", "lease")
        }

    def keys(self, session_id: str) -> SessionKeys:
        return SessionKeys.for_session(self.config.key_prefix, self.tenant, session_id)

    def for_tenant(self, tenant: str) -> SessionStore:
        """The same connection, bound to another tenant (for operators, not agents)."""
        return SessionStore(self.redis, self.config, tenant=tenant, counter=self.counter)

    def _run(self, what: str, fn: Callable[[], T]) -> T:
        with redis_errors(what):
            return fn()

    @property
    def _ttl(self) -> int:
        return self.config.ttl_seconds or 0

    # -- the log ---------------------------------------------------------------
    def encode(self, session_id: str, messages: Iterable[Any]) -> list[tuple[str, int]]:
        """Validate and encode messages; nothing is written when any of them is bad."""
        items = validate_messages(messages)
        if len(items) > self.config.max_messages_per_call:
            raise LimitExceeded(
                f"{len(items)} messages in one call; the limit is "
                f"{self.config.max_messages_per_call}", field="messages")
        out: list[tuple[str, int]] = []
        for i, message in enumerate(items):
            try:
                raw = message.to_json()
            except (ValueError, RecursionError) as exc:  # lone surrogates, absurd nesting
                raise InvalidInput(f"cannot be stored as JSON: {str(exc)[:200]}",
                                   field=f"messages[{i}]", index=i) from None
            size = len(raw.encode("utf-8"))
            if size > self.config.max_message_bytes:
                raise LimitExceeded(
                    f"{size} bytes; the limit is {self.config.max_message_bytes} bytes per message",
                    field=f"messages[{i}]", index=i)
            out.append((raw, self.counter.message(message)))
        return out

    def append(self, session_id: str, messages: Iterable[Any]) -> int:
        """Append atomically (all or nothing); returns the new length of the log."""
        return self.append_encoded(session_id, self.encode(session_id, messages))[0]

    def append_encoded(self, session_id: str,
                       encoded: Sequence[tuple[str, int]]) -> tuple[int, int, int, int]:
        """Append pre-encoded messages; returns (length, watermark, version, tokens before)."""
        k = self.keys(session_id)
        args: list[Any] = [self.config.max_messages_per_session, self._ttl, len(encoded)]
        for raw, tokens in encoded:
            args.extend((raw, tokens))
        keys = [k.log, k.cum, k.state, k.summaries, k.summary_index, k.cheap]
        try:
            result = self._run("append", lambda: self._scripts["append"](keys=keys, args=args))
        except redis.exceptions.ResponseError as exc:
            if str(exc).startswith("SESSION_FULL"):
                raise LimitExceeded(
                    f"session {session_id!r} would exceed "
                    f"{self.config.max_messages_per_session} messages", field="messages") from None
            raise
        length, watermark, version, before = (int(x) for x in result)
        return length, watermark, version, before

    def length(self, session_id: str) -> int:
        return int(self._run("length", lambda: self.redis.llen(self.keys(session_id).log)))

    def messages(self, session_id: str, start: int = 0, end: int | None = None) -> list[Message]:
        """Messages ``[start, end)`` of the raw log."""
        stop = -1 if end is None else end - 1
        if end is not None and end <= start:
            return []
        raw = self._run("read", lambda: self.redis.lrange(self.keys(session_id).log, start, stop))
        return [Message.model_validate_json(r) for r in raw]

    def range_tokens(self, session_id: str, start: int, end: int) -> int:
        """Estimated tokens of messages ``[start, end)``: two lookups, any history length."""
        if end <= start:
            return 0
        k = self.keys(session_id)

        def read() -> list[Any]:
            pipe = self.redis.pipeline(transaction=False)
            pipe.lindex(k.cum, end - 1)
            pipe.lindex(k.cum, start - 1) if start > 0 else pipe.echo("0")
            return list(pipe.execute())

        hi, lo = self._run("range_tokens", read)
        return int(hi or 0) - int(lo or 0)

    # -- state and summaries ----------------------------------------------------
    def state(self, session_id: str) -> SessionState:
        raw = self._run("state", lambda: self.redis.hgetall(self.keys(session_id).state))
        return SessionState.from_hash({_s(a): _s(b) for a, b in raw.items()})

    def update_state(self, session_id: str, **fields: Any) -> None:
        """Figures that are not compaction state (request figures, calibration, anchor)."""
        clean = {k: ("" if v is None else v) for k, v in fields.items()}
        if clean:
            self._run("update_state",
                      lambda: self.redis.hset(self.keys(session_id).state, mapping=clean))

    def load_view(self, session_id: str) -> ViewData:
        """One atomic read of everything prepare() needs."""
        k = self.keys(session_id)
        keys = [k.state, k.log, k.cum, k.summaries, k.cheap, k.pending]
        raw = self._run("view", lambda: self._scripts["view"](keys=keys, args=[]))
        state_flat, messages, before, total, length, summary, cheap_flat, pending = raw
        cheap = {int(f): CheapDecision.model_validate_json(v)
                 for f, v in _pairs(cheap_flat).items()}
        return ViewData(
            state=SessionState.from_hash(_pairs(state_flat)),
            raw_messages=[_s(m) for m in messages],
            tokens_before_watermark=int(before),
            tokens_total=int(total),
            length=int(length),
            summary=SummaryRecord.model_validate_json(summary) if summary else None,
            cheap=cheap,
            pending=bool(pending),
        )

    def commit_summary(self, session_id: str, record: SummaryRecord,
                       expected_version: int) -> CommitResult:
        """The one compare-and-swap writer. A stale writer gets ``ok=False``."""
        k = self.keys(session_id)
        keys = [k.state, k.summaries, k.summary_index, k.log, k.cheap, k.cum]
        args: list[str | int] = [expected_version, record.watermark, record.model_dump_json(),
                                 record.tokens, record.kind, self.config.summary_retention,
                                 self._ttl]
        raw = self._run("commit_summary",
                        lambda: self._scripts["commit_summary"](keys=keys, args=args))
        if _s(raw[0]) == "ok":
            return CommitResult(ok=True, version=int(raw[1]), watermark=int(raw[2]))
        return CommitResult(ok=False, reason=_s(raw[1]),
                            version=int(raw[2]), watermark=int(raw[3]))

    def summary(self, session_id: str, watermark: int) -> SummaryRecord | None:
        raw = self._run("summary",
                        lambda: self.redis.hget(self.keys(session_id).summaries, watermark))
        return SummaryRecord.model_validate_json(raw) if raw else None

    def summaries(self, session_id: str) -> list[SummaryRecord]:
        """Every kept summary, oldest watermark first."""
        k = self.keys(session_id)
        raw = self._run("summaries", lambda: self.redis.hgetall(k.summaries))
        records = [SummaryRecord.model_validate_json(v) for v in raw.values()]
        return sorted(records, key=lambda r: r.watermark)

    def truncate_after(self, session_id: str, index: int) -> SessionState:
        """A history edit: drop positions ``>= index``, bump the version, fall back.

        The summary becomes the newest one whose watermark is ``<= index``.
        This is the only operation that removes messages from the log: the
        user changed history; compaction itself never deletes.
        """
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise InvalidInput("must be a non-negative integer", field="index")
        k = self.keys(session_id)
        keys = [k.log, k.cum, k.state, k.summaries, k.summary_index, k.cheap]
        try:
            self._run("truncate_after",
                      lambda: self._scripts["truncate"](keys=keys, args=[index, self._ttl]))
        except redis.exceptions.ResponseError as exc:
            if str(exc).startswith("INDEX_OUT_OF_RANGE"):
                length = str(exc).split()[-1]
                raise InvalidInput(f"{index} is past the end of the log ({length} messages)",
                                   field="index") from None
            raise
        return self.state(session_id)

    def rewind(self, session_id: str, watermark: int) -> SessionState:
        """Make the kept summary at ``watermark`` current (0: no summary)."""
        if not isinstance(watermark, int) or isinstance(watermark, bool) or watermark < 0:
            raise InvalidInput("must be a non-negative integer", field="watermark")
        k = self.keys(session_id)
        try:
            self._run("rewind", lambda: self._scripts["rewind"](
                keys=[k.state, k.summaries, k.cheap], args=[watermark]))
        except redis.exceptions.ResponseError as exc:
            if str(exc).startswith("NO_SUMMARY"):
                raise InvalidInput(f"no kept summary at watermark {watermark}",
                                   field="watermark") from None
            raise
        return self.state(session_id)

    # -- cheap-stage decisions ---------------------------------------------------
    def record_cheap(self, session_id: str, decisions: Iterable[CheapDecision]) -> int:
        """Record decisions once (first writer wins), so the view's prefix stays stable."""
        k = self.keys(session_id)
        items = list(decisions)
        if not items:
            return 0

        def write() -> int:
            pipe = self.redis.pipeline(transaction=True)
            for d in items:
                pipe.hsetnx(k.cheap, d.index, d.model_dump_json())
            if self._ttl:
                pipe.expire(k.cheap, self._ttl)
            return sum(1 for r in pipe.execute()[: len(items)] if r)

        return self._run("record_cheap", write)

    # -- worker coordination -----------------------------------------------------
    def mark_pending(self, session_id: str) -> bool:
        """Set the pending flag if absent; True means the caller should enqueue a job."""
        k = self.keys(session_id)
        return bool(self._run("mark_pending", lambda: self.redis.set(
            k.pending, "1", nx=True, ex=self.config.pending_ttl_seconds)))

    def clear_pending(self, session_id: str) -> None:
        self._run("clear_pending", lambda: self.redis.delete(self.keys(session_id).pending))

    def is_pending(self, session_id: str) -> bool:
        return bool(self._run("is_pending",
                              lambda: self.redis.exists(self.keys(session_id).pending)))

    def acquire_lease(self, session_id: str, ttl_seconds: float | None = None) -> str | None:
        """A random owner token when the lease was free, else None."""
        token = secrets.token_hex(16)
        ttl_ms = int((ttl_seconds or self.config.lease_ttl_seconds) * 1000)
        ok = self._run("acquire_lease", lambda: self.redis.set(
            self.keys(session_id).lease, token, nx=True, px=ttl_ms))
        return token if ok else None

    def extend_lease(self, session_id: str, token: str, ttl_seconds: float | None = None) -> bool:
        ttl_ms = int((ttl_seconds or self.config.lease_ttl_seconds) * 1000)
        return bool(self._run("extend_lease", lambda: self._scripts["lease"](
            keys=[self.keys(session_id).lease], args=[token, "extend", ttl_ms])))

    def release_lease(self, session_id: str, token: str) -> bool:
        """Release only if the caller still owns it (an expired lease may have moved on)."""
        return bool(self._run("release_lease", lambda: self._scripts["lease"](
            keys=[self.keys(session_id).lease], args=[token, "release", 0])))

    def mark_dirty(self, session_id: str, request: str = "") -> None:
        """Ask the lease holder to run once more; ``request`` (one line) rides along.

        Requests accumulate (APPEND) until the holder takes them, so two busy
        callers never overwrite each other's parameters.
        """
        if not isinstance(request, str) or "\n" in request:
            raise InvalidInput("must be a string of one line", field="request")
        k = self.keys(session_id)

        def write() -> None:
            pipe = self.redis.pipeline(transaction=True)
            pipe.append(k.dirty, "\n" + request)
            pipe.expire(k.dirty, self.config.lease_ttl_seconds)
            pipe.execute()

        self._run("mark_dirty", write)

    def take_dirty(self, session_id: str) -> bool:
        """Read and clear the dirty flag in one step."""
        return self.take_dirty_requests(session_id) is not None

    def take_dirty_requests(self, session_id: str) -> list[str] | None:
        """Read and clear the dirty flag in one step: None when it was not set, else
        the non-empty requests left with it, oldest first."""
        raw = self._run("take_dirty", lambda: self.redis.getdel(self.keys(session_id).dirty))
        return None if raw is None else [line for line in _s(raw).split("\n") if line]

    def delete_session(self, session_id: str) -> None:
        """Remove every key of a session (explicit user request only)."""
        k = self.keys(session_id)
        self._run("delete", lambda: self.redis.delete(
            *k.data_keys(), k.pending, k.lease, k.dirty))


__all__ = ["SessionStore", "connect", "redis_errors"]
