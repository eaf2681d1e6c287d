"""What a history edit gives back in the session's tool-call id map, found with bounded
reads outside the edit's script.

An edit (``truncate.lua``) removes calls; a provider id that the map points at one of
them goes back to the newest earlier call of that id, or is freed
(:mod:`shared.core.callids`). The script once looked for those calls itself: it read
the removed range and, for every removed call still mapped, the whole log before the
edit (inside Lua, which copies every string): 37 s on a 10k-message session, 230 ms on
1k, with every guard's call to Redis waiting. Here the removed range, then the log
before it newest first (only as far as the calls looked for are found), are read
in chunks of :data:`READ_CHUNK` messages, each a plain LRANGE of a fraction of a
millisecond. The script gets the result with the epoch, log generation and length it
was read at, and refuses it if the log moved meanwhile (``LOG_MOVED``: read again).

The reads and the script are sans-I/O steps (:mod:`shared.store.commands`):
:func:`truncate_steps` is the whole edit, which the sync store and the asyncio store
each drive with their own client.
"""

from __future__ import annotations

import json
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from redis.exceptions import ResponseError

from shared.core.errors import InvalidInput, StoreUnavailable
from shared.core.records import SessionState
from shared.store.commands import Batch, Command, Step, ids_key
from shared.store.keys import SessionKeys

T = TypeVar("T")
EDIT_ATTEMPTS = 8  # an edit reads the log again when an append landed meanwhile
READ_CHUNK = 500
"""Messages one LRANGE of an edit's reads takes (~0.3 ms inside Redis at 1.2 kB each)."""
_CALLS = b'"tool_calls"'


def stored_calls(raw: bytes, only: bytes | None = None) -> list[tuple[str, str]]:
    """(provider id, stored id) of each tool call of one stored message, in order;
    none when ``only`` is given and not in its JSON (a cheap filter)."""
    if _CALLS not in raw or (only is not None and only not in raw):
        return []
    try:
        message = json.loads(raw)
    except ValueError:
        return []
    if not isinstance(message, dict) or not isinstance(message.get("tool_calls"), list):
        return []
    meta = message.get("metadata")
    wire = meta.get("wire_ids") if isinstance(meta, dict) else None
    found = []
    for call in message["tool_calls"]:
        stored = call.get("id") if isinstance(call, dict) else None
        if not isinstance(stored, str):
            continue
        provider = wire.get(stored, stored) if isinstance(wire, dict) else stored
        if isinstance(provider, str):
            found.append((provider, stored))
    return found


@dataclass(frozen=True, slots=True)
class LogAt:
    """The log an edit's reads describe: its epoch, generation and length."""

    epoch: str
    gen: str
    length: int


Reads = Generator[Step, Any, T]


def _read(*call: Any) -> Batch[Any]:
    """One plain command as a step (its keys are the session's: one slot)."""
    return Batch([call], lambda replies: replies[0], "truncate_after")


def read_log_at(state_key: str, log_key: str) -> Reads[LogAt]:
    (epoch, gen), length = yield Batch([("HMGET", state_key, "epoch", "gen"),
                                        ("LLEN", log_key)], list, "truncate_after")
    return LogAt(_text(epoch, ""), _text(gen, "0"), int(length))


def _text(value: Any, default: str) -> str:
    if value is None:
        return default
    return value.decode() if isinstance(value, bytes) else str(value)


def _bounds(start: int, end: int, backwards: bool = False) -> Iterator[tuple[int, int]]:
    """``[start, end)`` in ranges of :data:`READ_CHUNK`, from the end if ``backwards``."""
    bounds = [(a, min(a + READ_CHUNK, end)) for a in range(start, end, READ_CHUNK)]
    return reversed(bounds) if backwards else iter(bounds)


@dataclass(slots=True)
class EarlierCalls:
    """Newest earlier call of each provider id looked for, kept across an edit's
    attempts: the log before the edit is the same while epoch and generation hold."""

    at: tuple[str, str, int] | None = None
    found: dict[str, str | None] = field(default_factory=dict)

    def lookup(self, log_key: str, log: LogAt, index: int,
               providers: set[str]) -> Reads[dict[str, str | None]]:
        if self.at != (log.epoch, log.gen, index):
            self.at, self.found = (log.epoch, log.gen, index), {}
        wanted = {p for p in providers if p not in self.found}
        for a, b in _bounds(0, index, backwards=True) if wanted else ():
            chunk: list[bytes] = yield _read("LRANGE", log_key, a, b - 1)
            for raw in reversed(chunk):
                if _CALLS not in raw:
                    continue
                for provider, stored in reversed(stored_calls(raw)):
                    if provider in wanted:
                        self.found[provider] = stored
                        wanted.discard(provider)
                if not wanted:
                    break
            if not wanted:
                break
        for provider in wanted:
            self.found[provider] = None
        return {p: self.found[p] for p in providers}


@dataclass(slots=True)
class RemovedCalls:
    """The calls an edit removes (provider id -> stored ids), kept across its attempts:
    while epoch and generation hold the log only grew, so an attempt refused for an
    append (``LOG_MOVED``) reads only the messages appended since. Read whole again, an
    edit at 0 of a 10k-message session took ~90 ms an attempt and failed after
    ``EDIT_ATTEMPTS`` under an append every 50 ms."""

    at: tuple[str, str, int] | None = None
    upto: int = 0
    found: dict[str, set[str]] = field(default_factory=dict)

    def read(self, log_key: str, log: LogAt, index: int) -> Reads[dict[str, set[str]]]:
        if self.at != (log.epoch, log.gen, index) or log.length < self.upto:
            self.at, self.upto, self.found = (log.epoch, log.gen, index), index, {}
        for a, b in _bounds(max(index, self.upto), log.length):
            chunk: list[bytes] = yield _read("LRANGE", log_key, a, b - 1)
            for raw in chunk:
                for provider, stored in stored_calls(raw):
                    self.found.setdefault(provider, set()).add(stored)
        self.upto = max(self.upto, log.length)
        return self.found


def id_fixes(log_key: str, ids: str, log: LogAt, index: int, earlier: EarlierCalls,
             removed_calls: RemovedCalls | None = None) -> Reads[list[tuple[str, str, str]]]:
    """(provider id, stored id of a removed call the map points at, the newest earlier
    call's stored id or '') for an edit at ``index`` of ``log``."""
    removed = yield from (removed_calls or RemovedCalls()).read(log_key, log, index)
    if not removed:
        return []
    providers = list(removed)
    current: list[Any] = []
    for i in range(0, len(providers), READ_CHUNK):
        current.extend((yield _read("HMGET", ids, *providers[i:i + READ_CHUNK])))
    mapped = {}
    for provider, value in zip(providers, current, strict=True):
        stored = value.decode() if isinstance(value, bytes) else value
        if stored is not None and stored in removed[provider]:
            mapped[provider] = stored
    previous = yield from earlier.lookup(log_key, log, index, set(mapped))
    return [(p, s, previous[p] or "") for p, s in mapped.items()]


def truncate_steps(k: SessionKeys, session_id: str, index: int,
                   ttl: int) -> Reads[tuple[int, int, int, int]]:
    """A history edit at ``index`` (``truncate.lua``): the id map's fixes read, then the
    script, again while the log moved meanwhile. Returns the script's (version,
    watermark, length, log generation)."""
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise InvalidInput("must be a non-negative integer", field="index")
    ids = ids_key(k)
    keys = [k.log, k.cum, k.state, k.summaries, k.summary_index, k.cheap, ids,
            k.requests, k.request_order]
    earlier, removed = EarlierCalls(), RemovedCalls()
    for _ in range(EDIT_ATTEMPTS):
        log = yield from read_log_at(k.state, k.log)
        fixes = ([] if index > log.length
                 else (yield from id_fixes(k.log, ids, log, index, earlier, removed)))
        args: list[Any] = [index, ttl, log.epoch, log.gen, log.length, len(fixes)]
        for fix in fixes:
            args.extend(fix)
        try:
            raw = yield Command("truncate", keys, args, list, "truncate_after")
        except ResponseError as exc:
            if str(exc).startswith("INDEX_OUT_OF_RANGE"):
                known = str(exc).split()[-1]
                raise InvalidInput(f"{index} is past the end of the log ({known} messages)",
                                   field="index") from None
            if not str(exc).startswith("LOG_MOVED"):
                raise
            continue
        version, watermark, length, gen = (int(x) for x in raw)
        return version, watermark, length, gen
    raise StoreUnavailable(f"truncate_after on {session_id!r}: the log kept changing while "
                           f"the edit read it ({EDIT_ATTEMPTS} attempts)")


def rewind_steps(k: SessionKeys, watermark: int, ttl: int) -> Reads[SessionState]:
    """Make the kept summary at ``watermark`` current (``rewind.lua``); the state after."""
    if not isinstance(watermark, int) or isinstance(watermark, bool) or watermark < 0:
        raise InvalidInput("must be a non-negative integer", field="watermark")
    keys = [k.state, k.summaries, k.cheap, k.log, k.cum, k.summary_index]
    try:
        yield Command("rewind", keys, [watermark, ttl], lambda reply: reply, "rewind")
    except ResponseError as exc:
        if str(exc).startswith("NO_SUMMARY"):
            raise InvalidInput(f"no kept summary at watermark {watermark}",
                               field="watermark") from None
        raise
    raw: dict[Any, Any] = yield _read("HGETALL", k.state)
    return SessionState.from_hash({_text(a, ""): _text(b, "") for a, b in raw.items()})


__all__ = ["EDIT_ATTEMPTS", "READ_CHUNK", "EarlierCalls", "LogAt", "RemovedCalls", "id_fixes",
           "read_log_at", "rewind_steps", "stored_calls", "truncate_steps"]
