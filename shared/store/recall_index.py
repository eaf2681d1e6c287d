"""The recall index of a session in Redis: built by workers, queried by the guard.

Workers index a range when they compact it (:func:`index_compacted`, called
after a successful commit, in the same job), incrementally: messages
``[hwm, watermark)`` where ``hwm`` is the indexed high-water mark. The guard
only queries (:func:`recall`, and :func:`recall_async` over redis.asyncio).
Every key shares the session's hash tag:

- ``<base>:rx:meta`` hash: ``hwm``, ``next_pid``, ``n_docs``, ``total_len``,
  ``gen`` (the log generation it describes: a history edit bumps the state's);
- ``<base>:rx:df`` hash: term -> passages holding it (also the term list);
- ``<base>:rx:doc`` hash: passage id -> ``index:start:end:crc:length``;
- ``<base>:rx:mp`` list: first passage id of each indexed message;
- ``<base>:rx:t:<term>`` strings: packed postings, 12 bytes each
  (passage id, message index: u32; term frequency, passage length: u16),
  appended, so the newest postings are the string's tail.

The index keeps offsets, not copies: a hit's text is cut again from the
message in the log, and returned only if that message's CRC-32 is the one
indexed. So nothing past a history edit is ever returned, even before
:func:`forget_after` (the edit hook) has run. A query reads at most
:data:`QUERY_POSTINGS` postings, shared out rarest term first (a common term,
whose IDF is low anyway, is scored on its newest postings): a query costs
about the same at 10k and 100k messages.

A query is written once, sans-I/O (:func:`recall_steps`): a generator that
yields what to send (one script call, then pipelines of reads verifying the
best candidates) and receives the replies. :func:`recall` sends them with
redis-py, :func:`recall_async` with redis.asyncio; the ranking, the checksum
check and every error are the same code.
"""

from __future__ import annotations

import math
import secrets
import struct
import time
import weakref
from collections import defaultdict
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shared.core.errors import InvalidInput, SessionNotFound
from shared.core.messages import Message
from shared.core.recall import (
    DEFAULT_LIMIT,
    RecallHit,
    RecallQuery,
    analyze,
    best_per_message,
    bm25,
    checksum,
    parse_tool_arguments,
    passage_text,
    render_hits,
    split_passages,
    validate_query,
)
from shared.store.sessions import _load_lua, _s, redis_errors

if TYPE_CHECKING:
    from redis.commands.core import Script

    from shared.store.aio import AsyncSessionStore
    from shared.store.sessions import SessionStore

POSTING = struct.Struct("<IIHH")
QUERY_POSTINGS = 2048
"""Postings one query reads at most, rarest terms first (a common term: its newest)."""
TERM_POSTINGS = 64
"""Postings read per term at least, whatever the budget (the newest)."""
BATCH_MESSAGES = 500
"""Messages per index script call: bounds how long one call holds Redis."""
MAX_CANDIDATES = 64
MAX_MESSAGES_PER_CALL = 20_000
"""Messages one index call reads at most (the next job goes on from there)."""
STALE_REBUILD = 1000
"""Forgotten passages tolerated before a rebuild, at least (else: as many as live ones)."""


@dataclass(frozen=True, slots=True)
class RecallKeys:
    meta: str
    df: str
    doc: str
    mp: str
    state: str
    log: str
    term_prefix: str

    def term(self, term: str) -> str:
        return self.term_prefix + term


def recall_keys(store: SessionStore | AsyncSessionStore, session_id: str) -> RecallKeys:
    """The index keys of a session (validated ids, the store's tenant, its hash tag)."""
    k = store.keys(session_id)
    base = k.state.removesuffix(":state")
    return RecallKeys(meta=f"{base}:rx:meta", df=f"{base}:rx:df", doc=f"{base}:rx:doc",
                      mp=f"{base}:rx:mp", state=k.state, log=k.log, term_prefix=f"{base}:rx:t:")


_SCRIPTS: weakref.WeakKeyDictionary[Any, dict[str, Script]] = weakref.WeakKeyDictionary()


def _client(store: Any) -> Any:
    """The Redis client of ``store``; a tenant handle hides it from callers, not from
    the store layer (:func:`shared.store.tenancy.backing_store`)."""
    from shared.store.tenancy import backing_store  # tenancy imports the store modules

    return backing_store(store).redis


def _script(store: SessionStore, name: str) -> Script:
    """Registered once per client (scripts are bound to the client, not the tenant)."""
    return _registered(_client(store), name)  # type: ignore[no-any-return]


def _registered(client: Any, name: str) -> Any:
    """The script ``name`` registered on ``client`` (redis-py or redis.asyncio), once."""
    scripts = _SCRIPTS.setdefault(client, {})
    script = scripts.get(name)
    if script is None:
        script = scripts[name] = client.register_script(_load_lua(f"{name}.lua"))
    return script


def _int(value: Any, default: int = 0) -> int:
    return default if value is None or value == b"" or value == "" else int(value)


# -- indexing ----------------------------------------------------------------------------
@dataclass(slots=True)
class IndexReport:
    """What one indexing call did."""

    session_id: str
    start: int = 0
    end: int = 0
    messages: int = 0
    passages: int = 0
    terms: int = 0
    rebuilt: bool = False
    conflict: str = ""
    ms: float = 0.0


def index_compacted(store: SessionStore, session_id: str, end: int | None = None, *,
                    max_messages: int | None = None) -> IndexReport:
    """Index messages ``[hwm, end)`` (default: up to the current watermark).

    At most ``max_messages`` per call (default :data:`MAX_MESSAGES_PER_CALL`):
    a rebuild of a long session is spread over the next jobs instead of
    holding one job for a minute.

    Called by workers after a successful commit. Idempotent and safe
    against concurrency: each batch is one compare-and-swap on the
    high-water mark and the log generation; a loser stops (the winner
    indexed the same messages). When the log was edited and the edit hook
    did not run, the index is rebuilt from scratch.
    """
    started = time.perf_counter()
    k = recall_keys(store, session_id)
    report = IndexReport(session_id)
    with redis_errors("recall index"):
        meta, state, length = _read_heads(store, k)
        gen = _s(state[0]) if state[0] is not None else "0"
        unreconciled = meta.get("hwm") is not None and meta.get("gen", "0") != gen
        # Forgotten passages leave postings behind; once they outnumber the live
        # ones, a rebuild costs less than carrying them in every query.
        littered = _int(meta.get("stale")) > max(_int(meta.get("n_docs")), STALE_REBUILD)
        if unreconciled or littered:
            drop_index(store, session_id)
            meta, report.rebuilt = {}, True
        hwm = _int(meta.get("hwm"))
        budget = MAX_MESSAGES_PER_CALL if max_messages is None else max_messages
        target = min(length, _int(state[1]) if end is None else end, hwm + budget)
        report.start = report.end = hwm
        # A new index starts its passage ids at a random base: postings left by an
        # expired or dropped index can never name a new passage.
        next_pid = (_int(meta["next_pid"]) if meta.get("next_pid") is not None
                    else secrets.randbelow(1 << 30))
        expected_pid = meta.get("next_pid") or ""
        while hwm < target:
            stop = min(target, hwm + BATCH_MESSAGES)
            raw = _client(store).lrange(k.log, hwm, stop - 1)
            if not raw:
                break  # the log was cut under us
            added = _add_batch(store, k, raw, hwm, gen, next_pid, expected_pid)
            if isinstance(added, str):
                report.conflict = added
                break
            report.messages += len(raw)
            report.passages += added[0]
            report.terms += added[1]
            next_pid += added[0]
            expected_pid = str(next_pid)
            hwm += len(raw)
            report.end = hwm
        if report.messages and store.config.ttl_seconds:
            _refresh_ttl(store, k, store.config.ttl_seconds)
    report.ms = round((time.perf_counter() - started) * 1000, 3)
    return report


def _refresh_ttl(store: SessionStore, k: RecallKeys, ttl: int) -> None:
    """Every term key expires with the rest of the index, not only the ones this
    batch touched (a term seen only early on would otherwise expire first)."""
    terms = [_s(t) for t in _client(store).hkeys(k.df)]
    pipe = _client(store).pipeline(transaction=False)
    for term in terms:
        pipe.expire(k.term(term), ttl)
    for key in (k.meta, k.df, k.doc, k.mp):
        pipe.expire(key, ttl)
    pipe.execute()


def _read_heads(store: SessionStore, k: RecallKeys) -> tuple[dict[str, str], list[Any], int]:
    pipe = _client(store).pipeline(transaction=False)
    pipe.hgetall(k.meta)
    pipe.hmget(k.state, "gen", "watermark")
    pipe.llen(k.log)
    meta_raw, state, length = pipe.execute()
    return {_s(a): _s(b) for a, b in meta_raw.items()}, list(state), int(length)


def _add_batch(store: SessionStore, k: RecallKeys, raw: list[bytes], first: int, gen: str,
               next_pid: int, expected_pid: str) -> tuple[int, int] | str:
    firsts: list[int] = []
    docs: list[Any] = []
    postings: dict[str, bytearray] = defaultdict(bytearray)
    df: dict[str, int] = defaultdict(int)
    pid, total = next_pid, 0
    pack = POSTING.pack
    for offset, item in enumerate(raw):
        index = first + offset
        firsts.append(pid)
        crc = checksum(item)
        message = Message.model_validate_json(item)
        for passage in split_passages(index, message):
            analyzed = analyze(passage)
            docs.extend((pid, f"{index}:{passage.start}:{passage.end}:{crc}:{analyzed.length}"))
            total += analyzed.length
            for term, tf in analyzed.terms.items():
                postings[term] += pack(pid, index, tf, analyzed.length)
                df[term] += 1
            pid += 1
    keys = [k.meta, k.df, k.doc, k.mp, k.state]
    args: list[Any] = [first, first + len(raw), gen, expected_pid, pid, pid - next_pid, total,
                       store.config.ttl_seconds or 0, len(firsts), *firsts, len(docs) // 2, *docs]
    for term, data in postings.items():
        keys.append(k.term(term))
        args.extend((df[term], bytes(data)))
    result = _script(store, "recall_add")(keys=keys, args=args)
    if _s(result[0]) != "ok":
        return _s(result[1])
    return pid - next_pid, len(postings)


def forget_after(store: SessionStore, session_id: str, index: int) -> int:
    """The edit hook: forget indexed passages of messages ``>= index``; call it right
    after :meth:`SessionStore.truncate_after` (same session, same index).
    Returns the passages forgotten."""
    k = recall_keys(store, session_id)
    with redis_errors("recall forget"):
        removed, _ = _script(store, "recall_cut")(keys=[k.meta, k.doc, k.mp, k.state],
                                                   args=[index])
    return int(removed)


def drop_index(store: SessionStore, session_id: str) -> None:
    """Delete a session's whole index (also call it from ``delete_session``)."""
    k = recall_keys(store, session_id)
    with redis_errors("recall drop"):
        terms = [_s(t) for t in _client(store).hkeys(k.df)]
        # One key per command: a Cluster pipeline refuses multi-key DEL (same slot or not).
        keys = [*(k.term(t) for t in terms), k.meta, k.df, k.doc, k.mp]
        for i in range(0, len(keys), 1000):
            pipe = _client(store).pipeline(transaction=False)
            for key in keys[i:i + 1000]:
                pipe.delete(key)
            pipe.execute()


def index_stats(store: SessionStore, session_id: str) -> dict[str, int]:
    """High-water mark, passages, distinct terms and postings bytes of the index."""
    k = recall_keys(store, session_id)
    with redis_errors("recall stats"):
        pipe = _client(store).pipeline(transaction=False)
        pipe.hmget(k.meta, "hwm", "n_docs", "total_len")
        pipe.hlen(k.df)
        (hwm, n_docs, total), terms = pipe.execute()
    return {"indexed_until": _int(hwm), "passages": _int(n_docs), "terms": int(terms),
            "terms_total": _int(total)}


# -- querying ----------------------------------------------------------------------------
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


__all__ = ["IndexReport", "PipelineCall", "RecallKeys", "RecallSteps", "ScriptCall",
           "answer_recall_call", "drop_index", "forget_after", "index_compacted", "index_stats",
           "recall", "recall_async", "recall_keys", "recall_steps"]
