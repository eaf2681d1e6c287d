"""Recall queries over the index the workers build (:mod:`shared.store.recall_index`).

The query is written once, sans-I/O (:func:`recall_steps` yields what to send
and receives the replies); :func:`recall` drives it with redis-py and
:func:`recall_async` with redis.asyncio, so both guards run the same ranking,
checksum checks and errors.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shared.core.errors import InvalidInput, SessionNotFound
from shared.core.messages import Message
from shared.core.recall import (
    DEFAULT_LIMIT,
    RecallHit,
    RecallQuery,
    best_per_message,
    bm25,
    checksum,
    parse_tool_arguments,
    passage_text,
    render_hits,
    validate_query,
)
from shared.store.recall_index import (
    MAX_CANDIDATES,
    POSTING,
    QUERY_POSTINGS,
    TERM_POSTINGS,
    RecallKeys,
    _client,
    _int,
    _registered,
    recall_keys,
)
from shared.store.sessions import _s, redis_errors

if TYPE_CHECKING:
    from shared.store.aio import AsyncSessionStore
    from shared.store.sessions import SessionStore


@dataclass(frozen=True, slots=True)
class ScriptCall:
    """Send: one script call (its reply comes back as is)."""

    script: str
    keys: list[str]
    args: list[Any]


@dataclass(frozen=True, slots=True)
class PipelineCall:
    """Send: read commands in one pipeline, not a transaction (the list of replies comes
    back). Each is a client method name and its arguments."""

    commands: list[tuple[str, tuple[Any, ...]]]


RecallSteps = Generator[ScriptCall | PipelineCall, Any, list[RecallHit]]


def recall_steps(k: RecallKeys, q: RecallQuery, *, session_id: str,
                 tenant: str) -> RecallSteps:
    """A validated query, sans-I/O: yields what to send, receives each reply, returns
    the hits. :func:`recall` and :func:`recall_async` drive it."""
    keys = [k.meta, k.state, k.log, k.df, *(k.term(t) for t in q.terms)]
    raw = yield ScriptCall("recall_read", keys,
                           [QUERY_POSTINGS, TERM_POSTINGS, POSTING.size, *q.terms])
    hwm_raw, n_raw, total_raw, watermark, length, has_state, dfs, blobs = raw
    if not length and not int(has_state):
        raise SessionNotFound(f"no session {session_id!r} in tenant {tenant!r}")
    hi = min(_int(hwm_raw), int(length), q.end if q.end is not None else _int(watermark))
    lo = q.start or 0
    df = {t: _int(d) for t, d in zip(q.terms, dfs, strict=True) if d}
    if hi <= lo or not df:
        return []
    postings: Mapping[str, Any] = {
        term: POSTING.iter_unpack(blob[len(blob) % POSTING.size:])
        for term, blob in zip(q.terms, blobs, strict=True) if blob}
    n_docs = max(_int(n_raw), 1)
    scores = bm25(postings, df, n_docs=n_docs, avg_length=_int(total_raw) / n_docs,
                  start=lo, end=hi)
    ranked = best_per_message(scores, MAX_CANDIDATES)
    return (yield from _verified(k, ranked, q.limit))


def recall(store: SessionStore, session_id: str, query: str, *, limit: int = DEFAULT_LIMIT,
           start: int | None = None, end: int | None = None) -> list[RecallHit]:
    """The messages of ``[start, end)`` that best match ``query``, best first.

    ``end`` defaults to the current watermark (what was summarized away);
    messages past what workers indexed are not searched. One passage per
    message, at most ``limit``. Raises :class:`InvalidInput` (naming the
    field) for a bad query or range, :class:`SessionNotFound` for a session
    without a log.
    """
    q = validate_query(query, limit=limit, start=start, end=end)
    steps = recall_steps(recall_keys(store, session_id), q, session_id=session_id,
                         tenant=store.tenant)
    with redis_errors("recall"):
        try:
            step = next(steps)
            while True:
                step = steps.send(_send(_client(store), step))
        except StopIteration as done:
            return list(done.value)


async def recall_async(store: AsyncSessionStore, session_id: str, query: str, *,
                       limit: int = DEFAULT_LIMIT, start: int | None = None,
                       end: int | None = None) -> list[RecallHit]:
    """:func:`recall` over redis.asyncio (an :class:`~shared.store.aio.AsyncSessionStore`):
    the same steps, each reply awaited."""
    q = validate_query(query, limit=limit, start=start, end=end)
    steps = recall_steps(recall_keys(store, session_id), q, session_id=session_id,
                         tenant=store.tenant)
    with redis_errors("recall"):
        try:
            step = next(steps)
            while True:
                step = steps.send(await _send(_client(store), step))
        except StopIteration as done:
            return list(done.value)


def _send(client: Any, step: ScriptCall | PipelineCall) -> Any:
    """Send ``step`` with ``client``: its reply (redis-py), or an awaitable of it
    (redis.asyncio: the script's call and ``execute`` are coroutines there)."""
    if isinstance(step, ScriptCall):
        return _registered(client, step.script)(keys=step.keys, args=step.args)
    pipe = client.pipeline(transaction=False)
    for method, args in step.commands:
        getattr(pipe, method)(*args)
    return pipe.execute()


def answer_recall_call(store: SessionStore, session_id: str,
                     arguments: str | Mapping[str, Any]) -> str:
    """The result text of a model's ``recall`` tool call (its JSON arguments), ready to
    send back as the tool message; bad arguments come back as text the model can fix."""
    try:
        q = parse_tool_arguments(arguments)
    except InvalidInput as exc:
        return f"recall: invalid arguments: {exc}"
    return render_hits(recall(store, session_id, q.text, limit=q.limit, start=q.start,
                              end=q.end))


def _verified(k: RecallKeys, ranked: Sequence[tuple[int, float, int]],
              limit: int) -> Generator[PipelineCall, Any, list[RecallHit]]:
    """The best ``limit`` candidates whose message is still the one indexed."""
    hits: list[RecallHit] = []
    at = 0
    while len(hits) < limit and at < len(ranked):
        chunk = ranked[at:at + limit - len(hits)]  # most verify: read few messages
        at += len(chunk)
        docs, *raws = yield PipelineCall(
            [("hmget", (k.doc, *(pid for pid, _, _ in chunk))),
             *(("lindex", (k.log, index)) for _, _, index in chunk)])
        for (_, score, index), doc, raw in zip(chunk, docs, raws, strict=True):
            if doc is None or raw is None:
                continue  # forgotten by an edit, or the log is shorter now
            d_index, d_start, d_end, d_crc, _ = _s(doc).split(":")
            if int(d_index) != index or int(d_crc) != checksum(raw):
                continue  # the message at this index is not the one indexed
            message = Message.model_validate_json(raw)
            hits.append(RecallHit(index=index, role=message.role,
                                  text=passage_text(message, int(d_start), int(d_end)),
                                  score=round(score, 4) if math.isfinite(score) else 0.0))
            if len(hits) == limit:
                break
    return hits


__all__ = ["PipelineCall", "RecallSteps", "ScriptCall", "answer_recall_call", "recall",
           "recall_async", "recall_steps"]
