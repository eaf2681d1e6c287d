"""The recall index of a session in Redis: built by workers, queried by the guard.

Workers index a range after they compact it (:func:`index_compacted`, after a
successful commit: in its own lowest-priority job by default, or inside the
compaction job; ``COMPACTION_RECALL_INDEX``), incrementally: messages
``[hwm, watermark)`` where ``hwm`` is the indexed high-water mark. The guard
only queries (:func:`recall`, and :func:`recall_async` over redis.asyncio); a
query reads and scores the newest unindexed messages below the watermark
itself (:data:`shared.store.recall_query.TAIL_SCAN_MESSAGES`).
Every key starts with ``<prefix>:rx:{<tenant>:<session>}`` (``<rx>`` below): the
session's hash tag, but outside the prefix a guard's change feed watches, so that
an index batch's writes are pushed to no guard (an index written before 2026-11-28
lived under the session's own keys, ``<prefix>:{<tenant>:<session>}:rx:*``: dropped
when the session's new index starts, :func:`index_compacted`):

- ``<rx>:meta`` hash: ``hwm``, ``next_pid``, ``n_docs``, ``total_len``,
  ``gen`` (the log generation it describes: a history edit bumps the state's),
  ``analyzer`` (:data:`~shared.core.recall.ANALYZER_VERSION` of the terms; absent: 1);
- ``<rx>:terms`` string: every term of the index, each followed by a newline
  (appended by the batch that creates the term's key); an index written before it
  has a ``<rx>:df`` hash (term -> passages holding it) instead, read only to
  expire and drop it;
- ``<rx>:doc`` hash: passage id -> ``index:start:end:crc:length``;
- ``<rx>:mp`` list: first passage id of each indexed message;
- ``<rx>:t:<term>`` strings: packed postings, 12 bytes each
  (passage id, message index: u32; term frequency, passage length: u16),
  appended, so the newest postings are the string's tail; a term's passage
  count (BM25's df) is the string's length over 12.

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

import inspect
import secrets
import struct
import time
import weakref
from collections import defaultdict
from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shared.core.messages import Message
from shared.core.recall import (
    ANALYZER_VERSION,
    analyze,
    checksum,
    split_passages,
)
from shared.store.commands import drive, drive_async
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
"""Messages read and analyzed at a time; each script call holds fewer (:data:`BATCH_TERMS`)."""
BATCH_TERMS = 64
"""Term keys one index script call appends to at most. Its time inside Redis grows with
them (~5 us each: 500 messages of real turns, 1.4-3k terms, held Redis 20-80 ms in one
call, every guard waiting behind it), so a batch's postings go in calls of this many
terms (p50 ~0.4 ms, p99 < 1 ms a call, scripts/bench_redis_blocking.py), each term once
a batch, then its docs (:func:`_add_batch`)."""
BATCH_DOCS = 128
"""Passages whose docs one index script call writes, about (whole messages: one with more
goes alone); with their messages' entries in the message map, ~2 us a passage."""
CUT_PASSAGES = 64
"""Passage ids one call of an edit's cut looks at, at most (one HMGET and one HDEL of
them, ~4-8 us an id from Lua: 128 took 1.0 ms p50 a call at 100k messages, 256 1.4 ms
at 10k)."""
MAX_CANDIDATES = 64
MAX_MESSAGES_PER_CALL = 20_000
"""Messages one index call reads at most (the next job goes on from there)."""
STALE_REBUILD = 1000
"""Forgotten passages tolerated before a rebuild, at least (else: as many as live ones)."""
_ANALYZER = str(ANALYZER_VERSION)


@dataclass(frozen=True, slots=True)
class RecallKeys:
    meta: str
    df: str
    """An older index's term counts (read only to expire and drop them)."""
    terms: str
    queued: str
    """Set while an index job of the session is queued (workers coalesce on it)."""
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
    return _keys_at(k.recall + ":", k.state, k.log)


def legacy_recall_keys(store: SessionStore | AsyncSessionStore,
                       session_id: str) -> RecallKeys:
    """Where an index written before 2026-11-28 lives: under the session's own keys,
    which every guard's change feed watches (each term write was pushed to every guard
    of the tenant). Read only to drop it."""
    k = store.keys(session_id)
    return _keys_at(k.state.removesuffix("state") + "rx:", k.state, k.log)


def _keys_at(start: str, state: str, log: str) -> RecallKeys:
    return RecallKeys(meta=f"{start}meta", df=f"{start}df", terms=f"{start}terms",
                      queued=f"{start}queued", doc=f"{start}doc", mp=f"{start}mp",
                      state=state, log=log, term_prefix=f"{start}t:")


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


def send_step(client: Any, step: ScriptCall | PipelineCall) -> Any:
    """Send ``step`` with ``client``: its reply (redis-py), or an awaitable of it
    (redis.asyncio: the script's call and ``execute`` are coroutines there)."""
    if isinstance(step, ScriptCall):
        return _registered(client, step.script)(keys=step.keys, args=step.args)
    pipe = client.pipeline(transaction=False)
    if inspect.iscoroutinefunction(pipe.execute):
        return _queued_in_order(pipe, step.commands)
    for method, args in step.commands:
        getattr(pipe, method)(*args)
    return pipe.execute()


async def _queued_in_order(pipe: Any, calls: list[tuple[str, tuple[Any, ...]]]) -> Any:
    """An asyncio pipeline's replies. redis.asyncio's cluster pipeline queues some
    commands (``UNLINK``) in a coroutine: left unawaited, nothing was queued, and an async
    ``delete_session`` on a Cluster left the session's whole recall index behind."""
    for method, args in calls:
        queued = getattr(pipe, method)(*args)
        if inspect.iscoroutine(queued):  # not the pipeline itself, awaitable too
            await queued
    return await pipe.execute()


def _int(value: Any, default: int = 0) -> int:
    return default if value is None or value == b"" or value == "" else int(value)


def _float(value: Any) -> float:
    return 0.0 if value is None or value == b"" or value == "" else float(value)


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
    left: int = 0
    """Messages past ``end`` this call was asked to index but did not (its bound)."""
    ms: float = 0.0


def index_compacted(store: SessionStore, session_id: str, end: int | None = None, *,
                    max_messages: int | None = None) -> IndexReport:
    """Index messages ``[hwm, end)`` (default: up to the current watermark).

    At most ``max_messages`` per call (default :data:`MAX_MESSAGES_PER_CALL`):
    a rebuild of a long session is spread over the next jobs instead of
    holding one job for a minute.

    Called by workers after a successful commit (``workers.tasks.index_recall``,
    off the compaction job). Idempotent and safe against concurrency: each
    batch is one compare-and-swap on the high-water mark and the log
    generation; a loser stops (the winner indexed the same messages). When the
    log was edited and the edit hook did not run, the index is rebuilt from
    scratch.
    """
    started = time.perf_counter()
    k = recall_keys(store, session_id)
    report = IndexReport(session_id)
    with redis_errors("recall index"):
        meta, state, length, has_terms = _read_heads(store, k)
        gen = _s(state[0]) if state[0] is not None else "0"
        unreconciled = meta.get("hwm") is not None and meta.get("gen", "0") != gen
        # Forgotten passages leave postings behind; once they outnumber the live
        # ones, a rebuild costs less than carrying them in every query.
        littered = _int(meta.get("stale")) > max(_int(meta.get("n_docs")), STALE_REBUILD)
        # Term keys outlive the rest of an index by design (see _refresh_ttl): a new
        # index must not append to an expired one's postings.
        leftover = meta.get("hwm") is None and has_terms
        # Terms an older analyzer wrote are ones a query no longer produces (and miss
        # ones it does): the whole index is written again.
        outdated = meta.get("hwm") is not None and meta.get("analyzer", "1") != _ANALYZER
        if unreconciled or littered or leftover or outdated:
            drop_index(store, session_id)
            meta, report.rebuilt = {}, unreconciled or littered or outdated
        elif meta.get("hwm") is None and _client(store).exists(legacy_recall_keys(
                store, session_id).meta):
            _drop(store, legacy_recall_keys(store, session_id))  # the session's old index
            report.rebuilt = True
        hwm = _int(meta.get("hwm"))
        budget = MAX_MESSAGES_PER_CALL if max_messages is None else max_messages
        wanted = min(length, _int(state[1]) if end is None else end)
        target = min(wanted, hwm + budget)
        report.start = report.end = hwm
        # A new index starts its passage ids at a random base: postings left by an
        # expired or dropped index can never name a new passage.
        next_pid = (_int(meta["next_pid"]) if meta.get("next_pid") is not None
                    else secrets.randbelow(1 << 30))
        expected_pid = expected_at_start = meta.get("next_pid") or ""
        started_new = not expected_at_start and target > hwm
        if started_new:
            # a new index is marked before its first batch: a call that dies after it, or
            # a second job meanwhile, continues it instead of taking it for an old one
            # (one that never runs leaves a field the next drops); with the session's TTL,
            # which the batch would set: a mark whose batch never ran had none, and
            # outlived the session it marked
            _mark_new(store, k)
        while hwm < target:
            stop = min(target, hwm + BATCH_MESSAGES)
            raw = _client(store).lrange(k.log, hwm, stop - 1)
            if not raw:
                break  # the log was cut under us
            added = _add_batch(store, k, raw, hwm, gen, next_pid, expected_pid)
            report.messages += added.messages
            report.passages += added.passages
            report.terms += added.terms
            next_pid, expected_pid = added.next_pid, added.expected
            hwm += added.messages
            report.end = hwm
            if added.conflict:
                report.conflict = added.conflict
                break
        report.left = 0 if report.conflict else max(0, wanted - report.end)
        ttl = store.config.ttl_seconds
        if report.messages and ttl:
            if not expected_at_start:  # a new index: this call created every term key
                _client(store).hset(k.meta, "ttl_at", f"{time.time():.3f}")
            elif time.time() - _float(meta.get("ttl_at")) >= ttl / 2:
                _refresh_ttl(store, k, ttl)
        if (report.messages or started_new) and not _client(store).exists(k.state):
            # Deleted while this ran: the delete's own drop came before one of our
            # writes (the meta fields above), or it would find the state still here.
            drop_index(store, session_id)
    report.ms = round((time.perf_counter() - started) * 1000, 3)
    return report


def _mark_new(store: SessionStore, k: RecallKeys) -> None:
    """The analyzer of a new index, in its meta, with the session's TTL where it has one."""
    pipe = _client(store).pipeline(transaction=False)  # one key: fine on a Cluster too
    pipe.hset(k.meta, "analyzer", _ANALYZER)
    if store.config.ttl_seconds:
        pipe.expire(k.meta, store.config.ttl_seconds)
    pipe.execute()


def _refresh_ttl(store: SessionStore, k: RecallKeys, ttl: int) -> None:
    """Every term key gets twice the index's TTL, at least every ``ttl / 2`` seconds.

    A batch sets the TTL of meta, docs and message map (``ttl``) and of the
    term keys it creates (``2 * ttl``), not of the term keys it appends to:
    one EXPIRE per term per batch cost as much Redis time as the postings.
    This refresh keeps every term key alive at least as long as the meta key
    (a call at ``t`` after a refresh at ``F >= t - ttl / 2`` leaves the meta
    until ``t + ttl`` and every term until ``F + 2 * ttl`` or later), so no
    term of a live index expires first; once the index expires, its term keys
    go within ``2 * ttl`` (a new index drops them first: ``leftover``).
    """
    keys = [*(k.term(t) for t in _terms(store, k)), k.terms, k.df]
    for i in range(0, len(keys), 1000):
        pipe = _client(store).pipeline(transaction=False)
        for key in keys[i:i + 1000]:
            pipe.expire(key, 2 * ttl)
        pipe.execute()
    _client(store).hset(k.meta, "ttl_at", f"{time.time():.3f}")


def _terms_steps(k: RecallKeys) -> Generator[PipelineCall, Any, list[str]]:
    """Every term of the index: the term list, and an older index's count hash."""
    listed, counted = yield PipelineCall([("get", (k.terms,)), ("hkeys", (k.df,))])
    terms = _s(listed).split("\n")[:-1] if listed else []
    return terms + [_s(t) for t in counted]


def _terms(store: SessionStore, k: RecallKeys) -> list[str]:
    client = _client(store)
    return drive(_terms_steps(k), lambda step: send_step(client, step))


def _read_heads(store: SessionStore,
                k: RecallKeys) -> tuple[dict[str, str], list[Any], int, bool]:
    pipe = _client(store).pipeline(transaction=False)
    pipe.hgetall(k.meta)
    pipe.hmget(k.state, "gen", "watermark")
    pipe.llen(k.log)
    pipe.exists(k.terms)
    pipe.exists(k.df)
    meta_raw, state, length, listed, counted = pipe.execute()
    return ({_s(a): _s(b) for a, b in meta_raw.items()}, list(state), int(length),
            bool(listed or counted))


@dataclass(frozen=True, slots=True)
class _Analyzed:
    """One message, analyzed: per passage its doc value (without its id), its length
    and its terms (term -> frequency); ``distinct``: the terms of all its passages."""

    index: int
    docs: list[str]
    lengths: list[int]
    terms: list[dict[str, int]]
    distinct: frozenset[str]


def _analyze_all(raw: list[bytes], first: int) -> list[_Analyzed]:
    out = []
    for offset, item in enumerate(raw):
        index = first + offset
        crc = checksum(item)
        docs, lengths, terms = [], [], []
        for passage in split_passages(index, Message.model_validate_json(item)):
            analyzed = analyze(passage)
            docs.append(f"{index}:{passage.start}:{passage.end}:{crc}:{analyzed.length}")
            lengths.append(analyzed.length)
            terms.append(dict(analyzed.terms))
        out.append(_Analyzed(index, docs, lengths, terms,
                             frozenset(t for passage in terms for t in passage)))
    return out


def _postings(messages: list[_Analyzed], base: int,
              only: frozenset[str] | None = None) -> dict[str, list[bytes]]:
    """Packed postings per term of ``messages`` whose passages are ids ``base, base+1,
    ...`` (only the terms in ``only``, when given)."""
    out: dict[str, list[bytes]] = defaultdict(list)
    pack, pid = POSTING.pack, base
    for message in messages:
        for length, terms in zip(message.lengths, message.terms, strict=True):
            for term, tf in terms.items():
                if only is None or term in only:
                    out[term].append(pack(pid, message.index, tf, length))
            pid += 1
    return out


@dataclass(slots=True)
class _Added:
    """What the calls for one batch wrote, and where the index stands after them."""

    first: int
    """The log position of the batch's first message."""
    next_pid: int
    expected: str
    messages: int = 0
    passages: int = 0
    terms: int = 0
    conflict: str = ""


def _add_batch(store: SessionStore, k: RecallKeys, raw: list[bytes], first: int, gen: str,
               next_pid: int, expected_pid: str) -> _Added:
    """Messages ``raw`` (log positions from ``first``) in bounded script calls: first
    their postings, each term of the batch in one call (at most :data:`BATCH_TERMS` term
    keys a call), then their docs in runs of whole messages (about :data:`BATCH_DOCS`
    passages a call), each moving the high-water mark past its messages.

    Every call is a compare-and-swap on the high-water mark, ``next_pid`` and the log
    generation. The first reserves the batch's passage ids (``next_pid`` moves past
    them), so a second indexer that read the index before it loses its own first call,
    and one that read it after reserves ids past these and wins: this one loses its next
    call (the first conflict stops it). Ids stay dense, as an edit's cut walks them.
    Postings go before their docs: a query skips a posting whose passage has no
    doc, so an indexer that dies between calls leaves postings nothing finds, and the
    next indexer takes those messages again under new ids (the orphans still count in
    their terms' document frequency until the index is rebuilt). A term's postings of the
    batch go in one APPEND, as before the calls were bounded: a common term costs one
    append a batch, not one a message."""
    added = _Added(first, next_pid, expected_pid)
    analyzed = _analyze_all(raw, first)
    base = added.next_pid
    reserved = base + sum(len(m.lengths) for m in analyzed)
    postings = _postings(analyzed, base)
    terms = list(postings)
    for at in range(0, len(terms), BATCH_TERMS):
        _call(store, k, gen, added, [], {t: postings[t] for t in terms[at:at + BATCH_TERMS]},
              final=False, new_pid=reserved)
        if added.conflict:
            return added
    pid = base
    for run in _doc_runs(analyzed, BATCH_DOCS):
        _call(store, k, gen, added, run, {}, final=True, base=pid, new_pid=reserved)
        if added.conflict:
            break
        pid += sum(len(m.lengths) for m in run)
    return added


def _doc_runs(messages: list[_Analyzed], cap: int) -> list[list[_Analyzed]]:
    """Consecutive messages in runs of at most ``cap`` passages (a message with more is
    a run of its own)."""
    runs: list[list[_Analyzed]] = []
    run: list[_Analyzed] = []
    held = 0
    for message in messages:
        if run and held + len(message.lengths) > cap:
            runs.append(run)
            run, held = [], 0
        run.append(message)
        held += len(message.lengths)
    if run:
        runs.append(run)
    return runs


def _call(store: SessionStore, k: RecallKeys, gen: str, added: _Added, run: list[_Analyzed],
          postings: dict[str, list[bytes]], *, final: bool, base: int | None = None,
          new_pid: int | None = None) -> None:
    """One ``recall_add.lua`` call: postings, and with ``final`` the docs of ``run``
    (passage ids from ``base``, default ``next_pid``), moving the high-water mark past
    it. ``new_pid``: ``next_pid`` after the call (default: past the run's passages)."""
    hwm = added.first + added.messages
    pid = added.next_pid if base is None else base
    firsts: list[int] = []
    docs: list[Any] = []
    total = 0
    for message in run if final else []:
        firsts.append(pid)
        for doc, length in zip(message.docs, message.lengths, strict=True):
            docs.extend((pid, doc))
            total += length
            pid += 1
    passages = len(docs) // 2
    after = new_pid if new_pid is not None else pid
    ttl = store.config.ttl_seconds or 0
    keys = [k.meta, k.terms, k.doc, k.mp, k.state, *map(k.term, postings)]
    blob = b"".join(b"".join(p) for p in postings.values())
    counts = " ".join(str(len(p)) for p in postings.values())
    args: list[Any] = [hwm, hwm + len(firsts), gen, POSTING.size, added.expected, after,
                       passages, total, ttl, 2 * ttl, len(firsts), *firsts, passages, *docs,
                       blob, counts]
    result = _script(store, "recall_add")(keys=keys, args=args)
    if _s(result[0]) != "ok":
        added.conflict = _s(result[1])
        return
    added.messages += len(firsts)
    added.passages += passages
    added.terms += len(postings)
    added.next_pid, added.expected = after, str(after)


def forget_steps(k: RecallKeys, index: int,
                 gen: int | None = None) -> Generator[ScriptCall, Any, int]:
    """Forget indexed passages of messages ``>= index`` (:func:`forget_after`), in calls
    of :data:`CUT_PASSAGES` passage ids each (``recall_cut.lua``): an edit far back in a
    long session forgets thousands. Returns the passages forgotten."""
    removed = 0
    while True:
        count, _, done = yield ScriptCall("recall_cut", [k.meta, k.doc, k.mp, k.state],
                                          [index, CUT_PASSAGES, "" if gen is None else gen])
        removed += int(count)
        if int(done):
            return removed


def forget_after(store: SessionStore, session_id: str, index: int,
                 gen: int | None = None) -> int:
    """The edit hook: forget indexed passages of messages ``>= index``; call it right
    after :meth:`SessionStore.truncate_after` (same session, same index), with ``gen``
    the log generation that edit created (default: the session's now, which a later
    edit may have moved: the index is then left for the indexer to rebuild).
    Returns the passages forgotten."""
    client = _client(store)
    with redis_errors("recall forget"):
        return drive(forget_steps(recall_keys(store, session_id), index, gen),
                     lambda step: send_step(client, step))


async def forget_after_async(store: AsyncSessionStore, session_id: str, index: int,
                             gen: int | None = None) -> int:
    """:func:`forget_after` over redis.asyncio: the same steps, each reply awaited."""
    client = _client(store)
    with redis_errors("recall forget"):
        return await drive_async(forget_steps(recall_keys(store, session_id), index, gen),
                                 lambda step: send_step(client, step))


def _drop_steps(k: RecallKeys) -> Generator[PipelineCall, Any, None]:
    """Delete one index. One key per command: a Cluster pipeline refuses multi-key
    commands (same slot or not). UNLINK: the docs hash and the message map of a long
    session are freed off the main thread."""
    terms = yield from _terms_steps(k)
    keys = [*(k.term(t) for t in terms), k.meta, k.terms, k.df, k.doc, k.mp, k.queued]
    for i in range(0, len(keys), 1000):
        yield PipelineCall([("unlink", (key,)) for key in keys[i:i + 1000]])


def drop_steps(k: RecallKeys, legacy: RecallKeys) -> Generator[PipelineCall, Any, None]:
    """Delete an index (``k``) and the one an older version wrote (``legacy``), if any."""
    yield from _drop_steps(k)
    found = yield PipelineCall([("exists", (key,)) for key in (legacy.meta, legacy.terms,
                                                                legacy.df)])
    if any(found):
        yield from _drop_steps(legacy)


def _drop(store: SessionStore, k: RecallKeys) -> None:
    client = _client(store)
    drive(_drop_steps(k), lambda step: send_step(client, step))


def drop_index(store: SessionStore, session_id: str) -> None:
    """Delete a session's whole index (also call it from ``delete_session``), and an
    index an older version wrote for it (:func:`legacy_recall_keys`)."""
    client = _client(store)
    with redis_errors("recall drop"):
        drive(drop_steps(recall_keys(store, session_id), legacy_recall_keys(store, session_id)),
              lambda step: send_step(client, step))


async def drop_index_async(store: AsyncSessionStore, session_id: str) -> None:
    """:func:`drop_index` over redis.asyncio: the same steps, each reply awaited."""
    client = _client(store)
    with redis_errors("recall drop"):
        await drive_async(drop_steps(recall_keys(store, session_id),
                                     legacy_recall_keys(store, session_id)),
                          lambda step: send_step(client, step))


def claim_index_job(store: SessionStore, session_id: str, ttl_seconds: int) -> bool:
    """True when the caller should publish an index job: none is queued for the session.

    Coalescing, like the guard's pending flag: a compaction committed while
    an index job waits is covered by it (the job indexes up to the watermark
    it finds). The flag expires after ``ttl_seconds``, so a lost message
    delays the session's indexing, never stops it."""
    k = recall_keys(store, session_id)
    with redis_errors("recall index request"):
        return bool(_client(store).set(k.queued, "1", nx=True, ex=ttl_seconds))


def release_index_job(store: SessionStore, session_id: str) -> None:
    """The index job started (or its publish failed): the next commit asks again."""
    k = recall_keys(store, session_id)
    with redis_errors("recall index request"):
        _client(store).delete(k.queued)


def index_stats(store: SessionStore, session_id: str) -> dict[str, int]:
    """High-water mark, passages, distinct terms and postings bytes of the index."""
    k = recall_keys(store, session_id)
    with redis_errors("recall stats"):
        pipe = _client(store).pipeline(transaction=False)
        pipe.hmget(k.meta, "hwm", "n_docs", "total_len", "n_terms")
        pipe.hlen(k.df)
        (hwm, n_docs, total, n_terms), counted = pipe.execute()
    return {"indexed_until": _int(hwm), "passages": _int(n_docs),
            "terms": _int(n_terms) + int(counted),
            "terms_total": _int(total)}


__all__ = [
    "IndexReport",
    "PipelineCall",
    "RecallKeys",
    "ScriptCall",
    "claim_index_job",
    "drop_index",
    "drop_index_async",
    "drop_steps",
    "forget_after",
    "forget_after_async",
    "forget_steps",
    "index_compacted",
    "index_stats",
    "legacy_recall_keys",
    "recall_keys",
    "release_index_job",
    "send_step",
]
