"""Recall queries over the index the workers build (:mod:`shared.store.recall_index`).

The query is written once, sans-I/O (:func:`recall_steps` yields what to send
and receives the replies); :func:`recall` drives it with redis-py and
:func:`recall_async` with redis.asyncio, so both guards run the same ranking,
checksum checks and errors.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from shared.core.errors import InvalidInput, SessionNotFound
from shared.core.messages import Message
from shared.core.recall import (
    DEFAULT_LIMIT,
    Passage,
    RecallHit,
    RecallQuery,
    analyze,
    best_per_message,
    bm25,
    checksum,
    parse_tool_arguments,
    passage_text,
    render_hits,
    search_text,
    split_passages,
    validate_query,
)
from shared.store.commands import drive, drive_async
from shared.store.recall_index import (
    MAX_CANDIDATES,
    POSTING,
    QUERY_POSTINGS,
    TERM_POSTINGS,
    PipelineCall,
    RecallKeys,
    ScriptCall,
    _client,
    _int,
    recall_keys,
    send_step,
)
from shared.store.sessions import _s, redis_errors

if TYPE_CHECKING:
    from shared.store.aio import AsyncSessionStore
    from shared.store.sessions import SessionStore


TAIL_SCAN_MESSAGES = 2000
"""The most unindexed messages below the watermark a query reads and scores itself,
the newest first. What the summary's notice names but the index has not reached (its
job still queued, a guard truncation, ``COMPACTION_RECALL_INDEX=off``) is searched
here. Cost, measured on 2,000 unindexed messages of ``transcripts.dev.jsonl`` (1.9 MB,
no index; 10 probe queries, each its best of 3, on a loaded machine): 26-69 ms a query,
p50 ~40 ms (500 messages: p50 ~16 ms); the old 64-message bound was ~8 ms. A tool call
waits that long only while the index job is behind; past the bound the oldest
unindexed messages wait for it (the newest are what a model most likely asks about)."""
TAIL_SCAN_BYTES = 4 << 20
"""...and about this many bytes of them at most (checked after each chunk: crossed by
one chunk at most), so a backlog of huge tool outputs stops the scan early."""
TAIL_CHUNK = 250
"""Messages per read of the unindexed range (newest chunk first)."""


_TERMS_PER_CHAR = 1 / 6
"""Terms per character when none was analyzed (about one word per 6 characters)."""


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
    # Only what was summarized away is searched: ``end`` past the watermark (after a
    # rewind, say) is cut to it, so nothing back in the live view is returned.
    watermark_at = min(int(length), _int(watermark))
    top = min(watermark_at, q.end) if q.end is not None else watermark_at
    hi = min(_int(hwm_raw), top)
    lo = q.start or 0
    df = {t: _int(d) for t, d in zip(q.terms, dfs, strict=True) if d}
    postings: dict[str, list[Any]] = {
        term: list(POSTING.iter_unpack(blob[len(blob) % POSTING.size:]))
        for term, blob in zip(q.terms, blobs, strict=True) if blob}
    n_docs, total = _int(n_raw), float(_int(total_raw))
    # What was summarized away but not indexed yet is read here, newest first within
    # TAIL_SCAN_MESSAGES / TAIL_SCAN_BYTES, analyzed as the indexer does and scored with
    # the index as one collection.
    tail_lo, tail_hi = max(lo, _int(hwm_raw)), top
    chunks: list[tuple[int, list[bytes]]] = []
    scan_lo, read = tail_hi, 0
    while (scan_lo > tail_lo and tail_hi - scan_lo < TAIL_SCAN_MESSAGES
           and read < TAIL_SCAN_BYTES):
        first = max(tail_lo, scan_lo - TAIL_CHUNK, tail_hi - TAIL_SCAN_MESSAGES)
        raws = (yield PipelineCall([("lrange", (k.log, first, scan_lo - 1))]))[0]
        if len(raws) != scan_lo - first:
            break  # the log was cut under us: its indexes moved
        chunks.append((first, raws))
        read += sum(map(len, raws))
        scan_lo = first
    tail_postings: dict[str, list[Any]] = {}
    tail: dict[int, tuple[Message, Passage]] = {}
    if chunks:
        tail, added, terms = _tail_passages(chunks, q.terms, tail_postings,
                                            total / n_docs if n_docs else None)
        n_docs += added
        total += terms
        for term, found in tail_postings.items():
            df[term] = df.get(term, 0) + len(found)
    df = {t: d for t, d in df.items() if d}
    if not df or (hi <= lo and not tail):
        return []
    n_docs = max(n_docs, 1)
    # Indexed postings at or past ``hi`` are a rewind's or an edit's leftovers: the
    # range they name is the tail's (scanned) or past the watermark (not searched).
    # A weak term (one character) scores, but makes no hit alone (RecallQuery.required).
    scores = bm25(postings, df, n_docs=n_docs, avg_length=total / n_docs, start=lo, end=hi,
                  required=q.required)
    scores.update(bm25(tail_postings, df, n_docs=n_docs, avg_length=total / n_docs,
                       start=lo, end=tail_hi, required=q.required))
    ranked = best_per_message(scores, MAX_CANDIDATES)
    return (yield from _verified(k, ranked, q.limit, tail))


def _tail_passages(chunks: Sequence[tuple[int, Sequence[bytes]]], terms: Sequence[str],
                   postings: dict[str, list[Any]], average: float | None,
                   ) -> tuple[dict[int, tuple[Message, Passage]], int, float]:
    """Passages of the unindexed messages (each chunk: its first index, its raw
    messages), analyzed as the indexer does, their postings for ``terms`` added to
    ``postings`` under negative passage ids.

    Only passages whose lowercased text (:func:`search_text`: tool calls' JSON escapes
    decoded, as the indexer reads it) holds a query term are analyzed (every term is
    a lowercased piece of a word); the others count as passages of ``average`` length
    (the index's), or without an index of the analyzed ones' terms per character.
    Returns the matching passages by id, and the passages and terms the scan adds."""
    wanted = set(terms)
    passages: dict[int, tuple[Message, Passage]] = {}
    n_passages, n_terms = 0, 0.0
    skipped_chars, analyzed_chars, analyzed_terms = 0, 0, 0
    for start, raws in chunks:
        for offset, raw in enumerate(raws):
            message = Message.model_validate_json(raw)
            for passage in split_passages(start + offset, message):
                n_passages += 1
                low = search_text(passage).lower()
                if not any(term in low for term in wanted):
                    if average is not None:
                        n_terms += average
                    else:
                        skipped_chars += len(low)
                    continue
                analyzed = analyze(passage)
                n_terms += analyzed.length
                analyzed_chars += len(low)
                analyzed_terms += analyzed.length
                pid = -n_passages
                for term in wanted.intersection(analyzed.terms):
                    postings.setdefault(term, []).append(
                        (pid, passage.index, analyzed.terms[term], analyzed.length))
                    passages[pid] = (message, passage)
    if skipped_chars:  # no index: estimate the skipped passages' length in terms
        n_terms += skipped_chars * (analyzed_terms / analyzed_chars if analyzed_chars
                                    else _TERMS_PER_CHAR)
    return passages, n_passages, n_terms


def recall(store: SessionStore, session_id: str, query: str, *, limit: int = DEFAULT_LIMIT,
           start: int | None = None, end: int | None = None) -> list[RecallHit]:
    """The messages of ``[start, end)`` that best match ``query``, best first.

    Only the compacted range is searched: ``end`` defaults to the current
    watermark and is cut to it (a rewind puts messages back in the view).
    What workers have not indexed yet is read and scored here, the newest
    :data:`TAIL_SCAN_MESSAGES` (:data:`TAIL_SCAN_BYTES`) of it at most. One passage per
    message, at most ``limit``. Raises :class:`InvalidInput` (naming the
    field) for a bad query or range, :class:`SessionNotFound` for a session
    without a log.
    """
    q = validate_query(query, limit=limit, start=start, end=end)
    steps = recall_steps(recall_keys(store, session_id), q, session_id=session_id,
                         tenant=store.tenant)
    client = _client(store)
    with redis_errors("recall"):
        return drive(steps, lambda step: send_step(client, step))


async def recall_async(store: AsyncSessionStore, session_id: str, query: str, *,
                       limit: int = DEFAULT_LIMIT, start: int | None = None,
                       end: int | None = None) -> list[RecallHit]:
    """:func:`recall` over redis.asyncio (an :class:`~shared.store.aio.AsyncSessionStore`):
    the same steps, each reply awaited."""
    q = validate_query(query, limit=limit, start=start, end=end)
    steps = recall_steps(recall_keys(store, session_id), q, session_id=session_id,
                         tenant=store.tenant)
    client = _client(store)
    with redis_errors("recall"):
        return await drive_async(steps, lambda step: send_step(client, step))


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


def _verified(k: RecallKeys, ranked: Sequence[tuple[int, float, int]], limit: int,
              tail: Mapping[int, tuple[Message, Passage]] | None = None,
              ) -> Generator[PipelineCall, Any, list[RecallHit]]:
    """The best ``limit`` candidates whose message is still the one indexed (a passage of
    the unindexed ``tail`` was read just now: it needs no check)."""
    hits: list[RecallHit] = []
    at = 0
    while len(hits) < limit and at < len(ranked):
        if ranked[at][0] < 0 and tail:
            message, passage = tail[ranked[at][0]]
            score = ranked[at][1]
            hits.append(RecallHit(index=passage.index, role=message.role, text=passage.text,
                                  score=round(score, 4) if math.isfinite(score) else 0.0))
            at += 1
            continue
        chunk: list[tuple[int, float, int]] = []  # most verify: read few messages
        while at < len(ranked) and ranked[at][0] >= 0 and len(chunk) < limit - len(hits):
            chunk.append(ranked[at])
            at += 1
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


__all__ = ["TAIL_SCAN_BYTES", "TAIL_SCAN_MESSAGES", "PipelineCall", "RecallSteps", "ScriptCall",
           "answer_recall_call", "recall", "recall_async", "recall_steps"]
