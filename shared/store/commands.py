"""The store's hot-path commands, sans-I/O: what to send, and what a reply means.

:class:`shared.store.sessions.SessionStore` (redis-py) and
:class:`shared.store.aio.AsyncSessionStore` (redis.asyncio) send the same
scripts with the same keys and arguments and read the replies with the same
parsers; only the client call differs. Nothing here touches a socket.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import json
import secrets
from collections.abc import (
    Awaitable,
    Callable,
    Generator,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from shared.core.callids import Claims, disambiguate
from shared.core.config import StoreConfig
from shared.core.errors import InvalidInput, LimitExceeded, SessionDamaged, SlotMoved
from shared.core.messages import Message, validate_messages
from shared.core.records import (
    AppendResult,
    CheapDecision,
    CommitResult,
    InlineJob,
    RawView,
    SessionState,
    SummaryRecord,
    ViewCursor,
)
from shared.core.tokens import TokenCounter
from shared.core.viewcache import KnownCounts
from shared.store.cancelled import cancel_mark, raise_swallowed
from shared.store.keys import SessionKeys, validate_request_id

T = TypeVar("T")
S = TypeVar("S")  # a step of a sans-I/O generator: what to send


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def json_pairs(raw: bytes | str) -> dict[str, str]:
    """A flat HGETALL reply the script encoded with cjson (``{}`` when empty on real Redis)."""
    flat = json.loads(raw)
    if not isinstance(flat, list):
        return {}
    it = iter(flat)
    return dict(zip(it, it, strict=True))


def ids_key(keys: SessionKeys) -> str:
    """The session's tool-call id map (same hash tag as its other keys)."""
    return keys.log[: -len(":log")] + ":ids"


@dataclass(frozen=True, slots=True)
class Command(Generic[T]):
    """One script call: name, keys, arguments, and how to read its reply."""

    script: str
    keys: list[str]
    args: list[Any]
    parse: Callable[[Any], T]
    what: str = ""


class EncodedBatch(list[tuple[bytes, int]]):
    """Messages validated and encoded for one append: (JSON, tokens) per message.

    Also keeps the decoded messages and the id claims the append script
    checks, so that an append whose ids collide can be renamed and re-sent.
    """

    messages: list[Message]
    claims: Claims
    unique: list[Message]  # the messages as encoded (ids made unique), row for row
    slots: list[dict[str, Any]]  # wire forms its caller already made, by index (opaque here)
    slots_for: Sequence[Message]  # the message each slot was made for, by index

    @classmethod
    def build(cls, rows: Iterable[tuple[bytes, int]], messages: list[Message],
              claims: Claims, unique: list[Message] | None = None) -> EncodedBatch:
        batch = cls(rows)
        batch.messages, batch.claims = messages, claims
        batch.unique = unique if unique is not None else messages
        batch.slots, batch.slots_for = [], messages
        return batch


def encode(messages: Iterable[Any], config: StoreConfig, counter: TokenCounter, *,
           known: Mapping[str, str] | None = None, nonce: str | None = None,
           validated: list[Message] | None = None,
           reuse: Mapping[int, tuple[bytes, int]] | None = None,
           renamed: tuple[list[Message], Claims] | None = None) -> EncodedBatch:
    """Validate, make call ids unique (:mod:`shared.core.callids`), encode, count.

    ``reuse``: rows already made for some of the messages (by object id), e.g. by an
    earlier attempt whose ids collided (only the messages renamed since are encoded
    and counted again) or by the prepares of the turn being recorded (their size is
    checked all the same). ``renamed``: the messages with unique ids and their claims,
    made already (a pending turn's renaming, :func:`shared.core.renamed.adopted`)."""
    items = validated if validated is not None else validate_messages(messages)
    if len(items) > config.max_messages_per_call:
        raise LimitExceeded(
            f"{len(items)} messages in one call; the limit is "
            f"{config.max_messages_per_call}", field="messages")
    unique, claims = (renamed if renamed is not None and len(renamed[0]) == len(items)
                      else disambiguate(items, nonce or secrets.token_hex(3), known))
    rows: list[tuple[bytes, int]] = []
    for i, message in enumerate(unique):
        found = reuse.get(id(message)) if reuse else None
        if found is not None:
            raw = found[0]
        else:
            try:
                raw = message.to_json_bytes()
            except (ValueError, RecursionError) as exc:  # lone surrogates, absurd nesting
                raise InvalidInput(f"cannot be stored as JSON: {str(exc)[:200]}",
                                   field=f"messages[{i}]", index=i) from None
        size = len(raw)
        if size > config.max_message_bytes:
            raise LimitExceeded(
                f"{size} bytes; the limit is {config.max_message_bytes} bytes per message",
                field=f"messages[{i}]", index=i)
        # counted as given: a renamed copy differs in its ids alone, and the provider is
        # sent the given ids (wire_ids); the caller may know the given message's count
        rows.append(found if found is not None else (raw, counter.message(items[i])))
    return EncodedBatch.build(rows, items, claims, unique)


@dataclass(frozen=True, slots=True)
class AppendOptions:
    request_id: str | None = None
    mark_pending: bool = False
    with_state: bool = False
    state_fields: Mapping[str, Any] | None = None
    fields_version: int | None = None
    job: InlineJob | None = None  # pushed by the script if it sets the pending flag


def append_command(k: SessionKeys, config: StoreConfig, encoded: Sequence[tuple[str | bytes, int]],
                   opts: AppendOptions, *, idempotency_keep: int,
                   idempotency_ttl: int) -> Command[AppendResult]:
    if opts.request_id is not None:
        validate_request_id(opts.request_id)
    fields = [(name, "" if value is None else value)
              for name, value in (opts.state_fields or {}).items()]
    if fields and opts.fields_version is None:
        raise InvalidInput("state fields need the version they were computed for",
                           field="fields_version")
    request = "" if opts.request_id is None else f"{opts.request_id} {batch_digest(encoded)}"
    args: list[Any] = [config.max_messages_per_session, config.ttl_seconds or 0,
                       secrets.token_hex(8), request, idempotency_keep,
                       idempotency_ttl, pending_arg(config) if opts.mark_pending else 0,
                       1 if opts.with_state else 0,
                       "" if opts.fields_version is None else opts.fields_version, len(fields)]
    for name, value in fields:
        args.extend((name, value))
    args.append(len(encoded))
    for raw, tokens in encoded:
        args.extend((raw, tokens))
    claims = encoded.claims if isinstance(encoded, EncodedBatch) else Claims()
    for pairs in (claims.calls, claims.results):
        args.append(len(pairs))
        for provider, stored in pairs:
            args.extend((provider, stored))
    args.append("" if claims.at_length is None else claims.at_length)
    keys = [k.log, k.cum, k.state, k.requests, k.request_order, k.pending,
            k.summaries, k.summary_index, k.cheap, ids_key(k)]
    if opts.job is not None and opts.mark_pending:
        keys.append(opts.job.key)
        args.extend((opts.job.db, opts.job.store_db, opts.job.message))
    return Command("append", keys, args, functools.partial(parse_append, batch=encoded),
                   "append")


def pending_arg(config: StoreConfig) -> str:
    """append.lua's ARGV[7] when it may set the pending flag: its TTL and its stale age."""
    return f"{config.pending_ttl_seconds} {config.pending_stale_after}"


MARK_REARMED = 3
"""pending.lua's and append.lua's ``marked`` at or above this: a stale flag was re-armed
(1 and 3: the caller publishes the job, 2 and 4: the script pushed it, 0: a job is
pending)."""


def rearmed(marked: int | bool) -> bool:
    """Whether a flag setter's reply (``marked``, or a store's ``mark_pending``) re-armed a
    stale flag: the job is published again (a bool, as stand-in stores return, never)."""
    return int(marked) >= MARK_REARMED


def pushed(marked: int | bool) -> bool:
    """Whether the script pushed the job it was given along with setting the flag."""
    return int(marked) in (2, MARK_REARMED + 1)


def batch_digest(encoded: Sequence[tuple[str | bytes, int]]) -> str:
    """What a request id's record keeps of its batch, so that a reuse of the id for
    another turn is told from a retry. Of the messages as given: a retry renames its
    call ids otherwise (they are in the session by then), and is still the same turn."""
    rows: Iterable[str | bytes] = (raw for raw, _ in encoded)
    if isinstance(encoded, EncodedBatch) and len(encoded.messages) == len(encoded.unique) \
            == len(encoded):
        rows = (raw if unique is given else given.to_json_bytes()
                for given, unique, (raw, _) in zip(encoded.messages, encoded.unique, encoded,
                                                   strict=True))
    digest = hashlib.blake2b(digest_size=16)
    for raw in rows:
        data = raw.encode() if isinstance(raw, str) else raw
        digest.update(b"%d:" % len(data))
        digest.update(data)
    return digest.hexdigest()


def request_conflict(error: Exception) -> InvalidInput | None:
    """The typed error for a ``REQUEST_CONFLICT`` reply (the id's first append had other
    messages), else None."""
    text = str(error)
    if not text.startswith("REQUEST_CONFLICT"):
        return None
    return InvalidInput("was used for a different turn (its first append made the log "
                        f"{text.split()[-1]} messages long); a retry must send the same "
                        "messages, a new turn needs a new request id", field="request_id")


def session_damaged(error: Exception) -> SessionDamaged | None:
    """The typed error for a ``SESSION_DAMAGED`` reply (view.lua, append.lua: some of the
    session's keys were evicted or deleted), else None."""
    text = str(error)
    if not text.startswith("SESSION_DAMAGED "):
        return None
    key, log_length, totals_length, watermark = text.split()[1:5]
    return SessionDamaged(key, log_length=int(log_length), totals_length=int(totals_length),
                          watermark=int(watermark))


def reset_damaged_command(k: SessionKeys) -> Command[bool]:
    """``reset_damaged.lua``: the session's keys removed if it is damaged (True), else
    nothing written (False)."""
    rest = [key for key in k.all_keys() if key not in (k.log, k.cum, k.state)]
    return Command("reset_damaged", [k.log, k.cum, k.state, *rest, ids_key(k)], [],
                   lambda raw: bool(int(raw)), "reset damaged session")


def parse_append(result: Any, batch: Sequence[tuple[str | bytes, int]] = ()) -> AppendResult:
    length, watermark, version, before, duplicate, marked, state = result[:7]
    state_raw = json_pairs(state) if state else None
    return AppendResult(
        length=int(length), watermark=int(watermark), version=int(version),
        tokens_before=int(before), duplicate=bool(duplicate), marked=bool(marked),
        published=pushed(marked), republished=rearmed(marked),
        state=SessionState.from_hash(state_raw) if state_raw is not None else None,
        state_raw=state_raw, batch=batch,
        pending=bool(result[7]) if len(result) > 7 else None,
        tail_before=_s(result[8]) if len(result) > 8 else None)


def id_conflict(error: Exception) -> dict[str, str] | None:
    """The session's id mapping from an ``ID_CONFLICT`` reply, else None."""
    text = str(error)
    if not text.startswith("ID_CONFLICT "):
        return None
    raw = json.loads(text[len("ID_CONFLICT "):])
    return {p: s for p, s in raw.items() if isinstance(s, str)} if isinstance(raw, dict) else {}


def renamed_after(error: Exception, encoded: Sequence[tuple[str | bytes, int]], config: StoreConfig,
                  counter: TokenCounter) -> EncodedBatch | None:
    """The batch renamed against the session's id mapping an ``ID_CONFLICT`` reply
    carried; None when ``error`` is another error. A request id reused for another
    turn raises :class:`InvalidInput` (:func:`request_conflict`): both stores send every
    error reply of the append here first."""
    conflict = request_conflict(error)
    if conflict is not None:
        raise conflict from None
    known = id_conflict(error)
    if known is None or not isinstance(encoded, EncodedBatch):
        return None
    reuse = {id(message): row for message, row in zip(encoded.unique, encoded, strict=True)}
    if len(encoded.messages) == len(encoded):
        # renamed, a message differs in its ids alone and is counted as given (encode):
        # its first attempt's count stands (~14 us a tool result not counted again)
        counter = KnownCounts(counter, {id(message): tokens for message, (_, tokens)
                                        in zip(encoded.messages, encoded, strict=True)})
    renamed = encode((), config, counter, known=known, validated=encoded.messages, reuse=reuse)
    renamed.slots, renamed.slots_for = encoded.slots, encoded.slots_for  # by index
    return renamed


APPEND_ATTEMPTS = 3  # ids renamed against the session's mapping at most twice


BULK_MESSAGES = 256
"""A view read of more messages than this takes them with a plain LRANGE, not in the
script: Lua copies each string in and out (~4.6 us a 1.2 kB message over a plain
LRANGE, measured: 10k messages 63 ms in the script, 17 ms outside), while the second
round trip costs ~0.1 ms locally and ~0.5 ms across a network: the copy costs more from
~100 messages on. 256 keeps every ordinary incremental read (a turn's few messages)
at one round trip, and sends a cold or post-summary read the cheap way."""
BULK_TOKENS = 64_000
"""The same by size: a range of more tokens than this (~256 kB of JSON at ~4 bytes a
token; the store's running totals are known in the script, bytes are not) is read
outside the script too, however few messages carry it."""


@dataclass(frozen=True, slots=True)
class Batch(Generic[T]):
    """Plain commands sent as one MULTI/EXEC (keys of one session: one slot), and how
    to read the list of their replies."""

    calls: list[tuple[Any, ...]]
    parse: Callable[[list[Any]], T]
    what: str = ""


@dataclass(frozen=True, slots=True)
class DeferredView:
    """A view read whose messages (and totals) the script left to plain reads:
    ``view`` is complete but for them."""

    view: RawView
    with_counts: bool


Step = Command[Any] | Batch[Any]
ViewSteps = Generator[Step, Any, RawView]


def view_command(k: SessionKeys, since: ViewCursor | None, with_counts: bool = False,
                 bulk: tuple[int, int] | None = None) -> Command[RawView | DeferredView]:
    """The view script; ``bulk`` = (messages, tokens): a larger range is deferred
    (:func:`view_steps` completes it), None: the script returns everything itself."""
    keys = [k.state, k.log, k.cum, k.summaries, k.cheap, k.pending]
    args: list[Any] = (["", 0, 0, 0, 0, 0] if since is None else
                       [since.epoch, since.gen, since.version, since.start, since.end,
                        since.total])
    args.append("1" if with_counts else "0")
    args.append("" if since is None else since.cheap_gen)
    args.extend(("", "") if since is None else (since.tail, since.digest))
    args.extend(("", "") if bulk is None else bulk)

    def parse(raw: Any) -> RawView | DeferredView:
        view = parse_view(raw)
        return DeferredView(view, with_counts) if len(raw) > 13 and int(raw[13]) else view

    return Command("view", keys, args, parse, "view")


def parse_view(raw: Any) -> RawView:
    (state, messages, before, total, length, summary, cheap, pending, start, incremental,
     included, totals, cheap_included) = raw[:13]
    return RawView(
        state_raw=json_pairs(state), messages=list(messages), start=int(start),
        tokens_before_watermark=int(before), tokens_total=int(total), length=int(length),
        summary_json=summary or None, summary_included=bool(included),
        cheap_raw={int(f): v for f, v in json_pairs(cheap).items()} if cheap else {},
        cheap_included=bool(cheap_included),
        pending=bool(pending), incremental=bool(incremental),
        totals=[int(t) for t in totals])


BULK_CHUNK = 512
"""A deferred range longer than this is read in LRANGEs of this many messages, each its own
round trip, checked against the script's moment after the last: one LRANGE of a whole large
view held Redis 18-22 ms (5.3k messages of a 100k session, bench_redis_blocking.py
--audit), every guard waiting behind it; 500 messages take ~0.3-0.7 ms."""


def _checked(deferred: DeferredView, messages: list[Any], totals: list[Any], epoch: Any,
             gen: Any, at_end: Any) -> RawView | None:
    """The deferred view with its messages (and totals), if the log they were read from is
    the script's: same epoch and generation (append-only while both hold), same total at
    its length (a log replaced behind the generation, e.g. a restored backup); else None."""
    view = deferred.view
    if (epoch is None or _s(epoch) != view.epoch or int(gen or 0) != view.gen
            or at_end is None or int(at_end) != view.tokens_total
            or len(messages) != view.length - view.start):
        return None  # replaced (truncated, deleted, restored) since the script
    return dataclasses.replace(view, messages=list(messages), totals=[int(t) for t in totals])


def bulk_batch(k: SessionKeys, deferred: DeferredView) -> Batch[RawView | None]:
    """The deferred messages (and totals) with plain reads, plus what proves them those
    of the script's moment: the log is append-only while epoch and gen hold, so
    ``log[start:length]`` read later is the same; the total at ``length`` guards
    against a log replaced behind the generation (a restored backup)."""
    view = deferred.view
    last = view.length - 1
    calls: list[tuple[Any, ...]] = [("LRANGE", k.log, view.start, last)]
    if deferred.with_counts:
        calls.append(("LRANGE", k.cum, max(view.start - 1, 0), last))
    calls += [("HMGET", k.state, "epoch", "gen"), ("LINDEX", k.cum, last)]

    def parse(replies: list[Any]) -> RawView | None:
        messages, *rest = replies
        totals = rest.pop(0) if deferred.with_counts else []
        (epoch, gen), at_end = rest
        return _checked(deferred, messages, totals, epoch, gen, at_end)

    return Batch(calls, parse, "view")


def _replies(replies: list[Any]) -> list[Any]:
    return replies


def chunked_bulk_steps(k: SessionKeys,
                       deferred: DeferredView) -> Generator[Step, Any, RawView | None]:
    """:func:`bulk_batch` for a range longer than :data:`BULK_CHUNK`: one LRANGE (and one
    of the totals) per chunk, each its own step, so Redis serves others in between; the
    proof that they are the script's moment's comes after the last (a truncation or a
    deletion meanwhile moves the generation or the epoch for good)."""
    view = deferred.view
    last = view.length - 1
    messages: list[Any] = []
    totals: list[Any] = []
    for a in range(view.start, view.length, BULK_CHUNK):
        b = min(a + BULK_CHUNK, view.length) - 1
        calls: list[tuple[Any, ...]] = [("LRANGE", k.log, a, b)]
        if deferred.with_counts:
            calls.append(("LRANGE", k.cum, max(a - 1, 0) if a == view.start else a, b))
        replies = yield Batch(calls, _replies, "view")
        messages.extend(replies[0])
        if deferred.with_counts:
            totals.extend(replies[1])
    epoch_gen, at_end = yield Batch([("HMGET", k.state, "epoch", "gen"),
                                     ("LINDEX", k.cum, last)], _replies, "view")
    return _checked(deferred, messages, totals, epoch_gen[0], epoch_gen[1], at_end)


def view_steps(k: SessionKeys, since: ViewCursor | None, with_counts: bool = False,
               bulk: bool = True) -> ViewSteps:
    """One consistent view read as steps for a shell to send (:func:`drive`): the script;
    for a range above :data:`BULK_MESSAGES` / :data:`BULK_TOKENS` (``bulk``), then its
    messages with plain reads (in chunks past :data:`BULK_CHUNK`); if those prove replaced
    since, or a cluster refused them (:class:`SlotMoved`), the script again, returning
    everything itself (atomic on its own)."""
    limits = (BULK_MESSAGES, BULK_TOKENS) if bulk else None  # read now: tests lower them
    reply = yield view_command(k, since, with_counts, limits)
    if isinstance(reply, RawView):
        return reply
    try:
        if reply.view.length - reply.view.start > BULK_CHUNK:
            done = yield from chunked_bulk_steps(k, reply)
        else:
            done = yield bulk_batch(k, reply)
    except SlotMoved:  # a cluster slot began moving after the script: its keys may be
        done = None    # split between two nodes, where only a script waits it out
    if isinstance(done, RawView):
        return done
    whole = yield view_command(k, since, with_counts, None)
    assert isinstance(whole, RawView)  # no limit: never deferred
    return whole


def drive(steps: Generator[S, Any, T], send: Callable[[S], Any]) -> T:
    """Run sans-I/O steps with a blocking ``send`` (the sync store; recall queries). A
    step that fails is thrown into the steps, which may handle it (an edit reads again
    when the log moved) or let it out."""
    reply: Any = None
    error: Exception | None = None
    while True:
        try:
            step = steps.send(reply) if error is None else steps.throw(error)
        except StopIteration as done:
            return cast(T, done.value)
        try:
            reply, error = send(step), None
        except Exception as exc:
            reply, error = None, exc


async def drive_async(steps: Generator[S, Any, T],
                      send: Callable[[S], Awaitable[Any]], *, off_loop: bool = False) -> T:
    """:func:`drive` with an awaited ``send`` (the asyncio store). A cancellation of the
    task that redis-py swallowed during a step is raised after it
    (:mod:`shared.store.cancelled`). ``off_loop``: each reply is handed to ``steps`` on a
    worker thread (a recall query parses and scores up to 4 MB between two replies: on
    the event loop, every other request waited ~0.5 s; a thread hop is ~0.1 ms)."""
    reply: Any = None
    error: Exception | None = None
    first = True
    while True:
        if off_loop and not first and error is None:
            ended, found = await asyncio.to_thread(_advanced, steps, reply)
            if ended:
                return cast(T, found)
            step = found
        else:
            try:
                step = steps.send(reply) if error is None else steps.throw(error)
            except StopIteration as done:
                return cast(T, done.value)
        first = False
        mark = cancel_mark()
        try:
            reply, error = await send(step), None
        except Exception as exc:
            reply, error = None, exc
        raise_swallowed(mark)


def _advanced(steps: Generator[Any, Any, Any], reply: Any) -> tuple[bool, Any]:
    """``steps`` sent ``reply``: (False, its next step) or (True, its result) (a
    StopIteration cannot cross a thread's future)."""
    try:
        return False, steps.send(reply)
    except StopIteration as done:
        return True, done.value


def cheap_command(k: SessionKeys, config: StoreConfig, decisions: Sequence[CheapDecision],
                  expected_version: int | None = None) -> Command[int]:
    """Record decisions; with ``expected_version``, only if the session is still at it
    (-1 otherwise: an edit or a summary moved the indexes the decisions point at)."""
    args: list[Any] = [config.ttl_seconds or 0,
                       "" if expected_version is None else expected_version]
    for d in decisions:
        args.extend((d.index, d.model_dump_json()))
    return Command("cheap", [k.cheap, k.state], args, int, "record_cheap")


def pending_command(k: SessionKeys, config: StoreConfig,
                    job: InlineJob | None = None) -> Command[int]:
    """Set the pending flag if absent, or re-arm it when it stood past the config's
    :attr:`~shared.core.config.StoreConfig.pending_stale_after` unclaimed, and push
    ``job`` with it (``pending.lua``): 0 a job is pending, 1 set (the caller publishes),
    2 set and pushed; 3 and 4 the same for a re-armed flag (:func:`rearmed`)."""
    keys = [k.pending]
    args: list[Any] = [config.pending_ttl_seconds, config.pending_stale_after]
    if job is not None:
        keys.append(job.key)
        args.extend((job.db, job.store_db, job.message))
    return Command("pending", keys, args, int, "mark_pending")


def flag_stale(left_ms: int, config: StoreConfig) -> bool:
    """Whether a pending flag with ``left_ms`` of its TTL left (``PTTL``) stood past the
    config's :attr:`~shared.core.config.StoreConfig.pending_stale_after` with no worker
    claiming its job: its age is its TTL minus what is left, the rule ``append.lua``,
    ``pending.lua`` and ``rearm_lost.lua`` apply. Never with a stale age of 0, nor for a
    flag that is absent (-2) or has no expiry (-1): its age cannot be told. The workers'
    sweep reads ``PTTL`` in bulk with it and runs :func:`rearm_lost_command` (the same
    rule, atomic, with the lease) only on the flags it passes."""
    stale, ttl = config.pending_stale_after, config.pending_ttl_seconds
    return stale > 0 and left_ms >= 0 and ttl * 1000 - left_ms >= stale * 1000


def rearm_lost_command(k: SessionKeys, config: StoreConfig) -> Command[bool]:
    """Re-arm a pending flag that stood past the stale age while no worker holds the
    session's lease (``rearm_lost.lua``): True when this call did, and its caller
    publishes the job again; False (nothing changed) for a flag that is gone, young (an
    append or another sweeper re-armed it), without expiry, or a held lease."""
    return Command("rearm_lost", [k.pending, k.lease],
                   [config.pending_ttl_seconds, config.pending_stale_after],
                   lambda raw: bool(int(raw)), "rearm_lost")


def commit_command(k: SessionKeys, config: StoreConfig, record: SummaryRecord,
                   expected_version: int, token: str = "") -> Command[CommitResult]:
    """The one compare-and-swap writer; a non-empty ``token`` fences it by the lease."""
    keys = [k.state, k.summaries, k.summary_index, k.log, k.cheap, k.cum, k.lease]
    args: list[Any] = [expected_version, record.watermark, record.model_dump_json(),
                       record.tokens, record.kind, config.summary_retention,
                       config.ttl_seconds or 0, token]
    return Command("commit_summary", keys, args, parse_commit, "commit_summary")


def parse_commit(raw: Any) -> CommitResult:
    if _s(raw[0]) == "ok":
        return CommitResult(ok=True, version=int(raw[1]), watermark=int(raw[2]))
    return CommitResult(ok=False, reason=_s(raw[1]),
                        version=int(raw[2]), watermark=int(raw[3]))


def state_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    return {k: ("" if v is None else v) for k, v in fields.items()}


__all__ = [
    "BULK_CHUNK",
    "BULK_MESSAGES",
    "BULK_TOKENS",
    "MARK_REARMED",
    "AppendOptions",
    "Batch",
    "Command",
    "DeferredView",
    "EncodedBatch",
    "append_command",
    "batch_digest",
    "bulk_batch",
    "cheap_command",
    "chunked_bulk_steps",
    "commit_command",
    "drive",
    "drive_async",
    "encode",
    "flag_stale",
    "id_conflict",
    "ids_key",
    "json_pairs",
    "parse_append",
    "parse_commit",
    "parse_view",
    "pending_arg",
    "pending_command",
    "pushed",
    "rearm_lost_command",
    "rearmed",
    "renamed_after",
    "request_conflict",
    "reset_damaged_command",
    "session_damaged",
    "state_fields",
    "view_command",
    "view_steps",
]
