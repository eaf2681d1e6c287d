"""What a process keeps of an Agents SDK session for a Redis outage.

The runner reads a session once per run and saves what the run adds; both go
to Redis. To keep a run going while Redis is down, the process keeps (here,
no SDK and no I/O of its own) the session's messages as it last saw them (the
view of its last read, then what its runs saved since) and the batches Redis
missed, each with the request id it was first sent with. They are appended in
order, before anything newer, once Redis answers. An append that landed
although its reply was lost is not stored twice while the store remembers its
request id (``idempotency_ttl``, an hour by default, and the session's last
``idempotency_keep`` ids); a batch older than that is compared with the log's
tail first (one read) and skipped when it is already there.

One copy per (guard, tenant, session id) in a process (:func:`copy_of`): an app
that builds a ``GuardedSession`` per request finds the copy the previous
request left, and the session objects of one session save through one lock, so
their batches reach the log in the order they were made. Across processes
nothing orders them: a missed batch saved after the log grew past what this
process knew of it is still appended (the user's turn and the billed answer
are not thrown away) and the misplacement is logged as an ERROR naming the
session. A copy that never knew the log's length (no read or save of it yet)
reports no misplacement: its batch is simply appended.

A log found shorter than the copy knew (Redis restarted without persistence,
or the session was deleted or edited elsewhere) is never written back from the
copy: a deleted session must stay deleted. It is logged as one ERROR, the
copy's old history is dropped, and what Redis missed of this process's runs is
saved after what the log holds.

Memory: a copy holds at most ``limit`` tokens (the model's window: more than a
degraded view could send is of no use), and a guard's copies together at most
:data:`TOKENS`, the least recently used copies with nothing unsaved forgotten
first.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from shared.core.errors import StoreUnavailable
from shared.core.messages import Message
from shared.core.tokens import DEFAULT_COUNTER
from shared.core.turns import leading_system_count

log = logging.getLogger("shared.integrations.agents_sdk")
KEEP = 1000
"""Messages a session keeps in-process by default (its last view and what was added)."""
SESSIONS = 256
"""Sessions a guard keeps copies of in a process (the least recently used go first)."""
TOKENS = 4_000_000
"""Tokens a guard's copies hold together in a process: about 16 MB of text (some 4 bytes
a token), a few times that as Python objects."""
LIMIT = 128_000
"""Tokens one copy holds by default (``GuardedSession`` passes its model's window)."""
IDS_TTL = 3600.0
"""Seconds the store remembers a request id by default (``idempotency_ttl``)."""

Append = Callable[[list[Message], str], int]
"""Saves a batch with a request id; the log's length after it (``record_turn``)."""
Length = Callable[[], int]
"""The log's length now (one round trip)."""
Read = Callable[[int, int], list[Message]]
"""The log's messages ``[start, end)`` (one round trip)."""
Count = Callable[[Message], int]
"""A message's tokens (the guard's counter)."""

__all__ = ["KEEP", "LIMIT", "SESSIONS", "TOKENS", "LocalHistory", "copy_of"]


@dataclass(slots=True)
class _Batch:
    request_id: str
    messages: list[Message]
    tokens: int
    made: float = field(default_factory=time.monotonic)  # when first sent


def _call_ids(messages: Iterable[Message]) -> set[str]:
    return {call.id for m in messages for call in m.tool_calls}


def _without_results(messages: list[Message], calls: set[str]) -> list[Message]:
    """``messages`` less the tool results answering ``calls`` (calls no longer kept)."""
    if not calls:
        return messages
    return [m for m in messages if not (m.role == "tool" and m.tool_call_id in calls)]


def _same(stored: Sequence[Message], batch: Sequence[Message]) -> bool:
    """Whether the log's ``stored`` messages are ``batch`` (metadata aside: the store may
    add to it)."""
    return len(stored) == len(batch) and all(
        a.model_dump(exclude={"metadata"}) == b.model_dump(exclude={"metadata"})
        for a, b in zip(stored, batch, strict=True))


class LocalHistory:
    """A session's messages as this process knows them, and the batches Redis missed.

    ``keep`` messages and ``limit`` tokens (``count`` counts them) bound both: the copy
    keeps its leading system messages (the summary) and the newest others; missed
    batches beyond them are dropped oldest first, with an error logged (they cannot be
    saved any more), and with them the tool results answering a call they held (never
    saved without their call). ``length`` and ``version``: the log's as this process
    last read or wrote them (``known``: whether it did). ``ids_ttl``: seconds the store
    remembers a request id (an older missed batch is compared with the log first).
    """

    def __init__(self, session_id: str, keep: int = KEEP, limit: int = LIMIT,
                 count: Count = DEFAULT_COUNTER.message, ids_ttl: float = IDS_TTL) -> None:
        self.session_id, self.keep, self.limit = session_id, max(1, keep), max(1, limit)
        self.count, self.ids_ttl = count, ids_ttl
        self.pinned: list[Message] = []  # the log's leading system messages, last read
        self._saved: list[Message] = []  # the last view after them (summary first), then saves
        self._saved_tokens = 0  # estimated
        self._missed: list[_Batch] = []
        self.length = self.version = 0
        self.known = False
        self.lock = threading.RLock()  # held by a read or a save of the session, I/O included
        self.touched = time.monotonic()

    @property
    def tokens(self) -> int:
        """The copy's tokens, unsaved ones included (estimated; read without the lock)."""
        return self._saved_tokens + sum(b.tokens for b in list(self._missed))

    # -- the copy ------------------------------------------------------------------------
    def seen(self, pinned: list[Message], body: list[Message], length: int,
             version: int, tokens: int) -> bool:
        """A view read from Redis: its pinned messages and the rest (summary first), about
        ``tokens`` in all, of a log ``length`` long at ``version``; the lists become the
        copy's own. True when the log lost messages this process knew (logged; a shorter
        log at a newer version is an edit in another process, not reported)."""
        with self.lock:
            lost = length < self.length and version <= self.version
            if lost:
                self._lost(length)
            self.pinned, self._saved, self._saved_tokens = pinned, body, tokens
            self.length, self.version, self.known = length, version, True
            self._bound()
            return lost

    def _lost(self, length: int) -> None:
        """The log holds ``length`` messages, fewer than this process knew: logged once,
        and the copy's old history dropped (never written back: the session may have
        been deleted on purpose)."""
        log.error("Redis lost %d messages of session %s: history before the outage is gone "
                  "(the log holds %d; Redis without persistence loses its data on a "
                  "restart; or the session was deleted or edited elsewhere); this "
                  "process's copy is dropped, not written back", self.length - length,
                  self.session_id, length)
        self.pinned, self._saved, self._saved_tokens = [], [], 0
        self.length = length

    def messages(self) -> list[Message]:
        """The copy after the pinned messages, unsaved ones included (what a degraded view
        is built from)."""
        with self.lock:
            self._bound()
            return [*self._saved, *(m for b in self._missed for m in b.messages)]

    def _bound(self) -> None:
        """Trim the oldest saved messages after the summary when the copy is over ``keep``
        or ``limit``, to three quarters of it (trimmed now and then, not on every save)."""
        unsaved = sum(len(b.messages) for b in self._missed)
        tokens = self.tokens
        if len(self._saved) + unsaved <= self.keep and tokens <= self.limit:
            return
        head = min(leading_system_count(self._saved), self.keep // 2)
        excess = len(self._saved) + unsaved - self.keep * 3 // 4
        over = tokens - self.limit * 3 // 4
        end = head
        while end < len(self._saved) and (excess > 0 or over > 0):
            cost = self.count(self._saved[end])
            over, excess, end = over - cost, excess - 1, end + 1
            self._saved_tokens -= cost
        cut = self._saved[head:end]
        del self._saved[head:end]
        self._saved = _without_results(self._saved, _call_ids(cut))
        if len(self._saved) <= head:
            self._saved_tokens = sum(self.count(m) for m in self._saved)
        self._saved_tokens = max(0, self._saved_tokens)

    def _keep_saved(self, messages: list[Message], tokens: int) -> None:
        self._saved.extend(messages)
        self._saved_tokens += tokens

    def popped(self, last: Message, rest: Sequence[Message], length: int,
               version: int) -> None:
        """The log's last message was popped (``rest``: the items of it put back), leaving
        it ``length`` long at ``version``."""
        with self.lock:
            if self._saved and self._saved[-1] == last:
                self._saved[-1:] = list(rest)
            self.length, self.version, self.known = length, version, True

    def cleared(self) -> None:
        """The session was deleted: nothing known, nothing to save."""
        with self.lock:
            self.pinned, self._saved, self._missed, self._saved_tokens = [], [], [], 0
            self.length = self.version = 0
            self.known = True

    # -- what Redis missed -----------------------------------------------------------------
    @property
    def unsaved(self) -> int:
        """Messages waiting to be saved."""
        with self.lock:
            return self.waiting()

    def waiting(self) -> int:
        """:attr:`unsaved` without the lock (a save may hold it during I/O): a snapshot."""
        return sum(len(b.messages) for b in list(self._missed))

    def record(self, messages: list[Message], append: Append, length: Length,
               read: Read | None = None) -> bool:
        """Save the missed batches, then ``messages`` (``append(batch, request_id)``), in
        order; False when Redis did not answer (``messages`` then wait, after the others,
        and ``append``'s :class:`StoreUnavailable` is not raised)."""
        with self.lock:
            request_id = secrets.token_hex(12)
            tokens = sum(self.count(m) for m in messages)
            try:
                self.flush(append, length, read)
                known = self.length if self.known else 0
                after = append(messages, request_id)
            except StoreUnavailable:
                self._missed.append(_Batch(request_id, messages, tokens))
                self._drop_excess()
                self._bound()
                return False
            if after - len(messages) < known:  # found by this save: logged, dropped
                self._lost(after - len(messages))
            self.length, self.known = after, True
            self._keep_saved(messages, tokens)
            self._bound()
            return True

    def flush(self, append: Append, length: Length, read: Read | None = None) -> int:
        """Save the missed batches, oldest first, each with its first request id; how
        many messages were saved. A failure raises (:class:`StoreUnavailable`) and
        keeps what is left.

        The log's length is read first: shorter than known, the loss is logged and the
        copy's old history dropped. A batch stored after messages this process did not
        know of (saved by another process meanwhile) is logged. The oldest batch, when
        older than the store remembers request ids, is compared with the log's tail
        (``read``) and skipped when it is already there (an append whose reply was lost).
        """
        with self.lock:
            if not self._missed:
                return 0
            current = length()
            if self.known and current < self.length:
                self._lost(current)
            saw = self.length if self.known else current  # the log the oldest batch followed
            first, saved = self._missed[0], 0
            if read is not None and time.monotonic() - first.made > self.ids_ttl \
                    and current >= len(first.messages) \
                    and _same(read(current - len(first.messages), current), first.messages):
                log.warning("session %s: %d messages Redis had missed were in the log "
                            "already (an append whose reply was lost): not saved again",
                            self.session_id, len(first.messages))
                self._missed.pop(0)
                self._keep_saved(first.messages, first.tokens)
                saw = current
            while self._missed:
                batch = self._missed[0]
                after = append(batch.messages, batch.request_id)
                if after > current:  # stored now (not a retry of one that had landed)
                    at = after - len(batch.messages)
                    if at > saw:
                        log.error("session %s: %d messages Redis had missed are saved after "
                                  "%d newer ones another process saved meanwhile: the log "
                                  "holds them out of order", self.session_id,
                                  len(batch.messages), at - saw)
                    current = after
                saw = after
                self._missed.pop(0)
                self._keep_saved(batch.messages, batch.tokens)
                saved += len(batch.messages)
            self.length, self.known = current, True
            self._bound()
            if saved:
                log.info("session %s: saved %d messages Redis had missed", self.session_id,
                         saved)
            return saved

    def _drop_excess(self) -> None:
        dropped: set[str] = set()
        while self.waiting() > self.keep or sum(b.tokens for b in self._missed) > self.limit:
            oldest = self._missed[0]
            if oldest is self._missed[-1]:
                break  # the newest batch is kept whole, however long
            self._missed.pop(0)
            dropped |= _call_ids(oldest.messages)
            log.error("session %s: Redis has been down for more than %d unsaved messages or "
                      "%d tokens; the oldest %d are dropped and will not be saved",
                      self.session_id, self.keep, self.limit, len(oldest.messages))
        if dropped:  # a result whose call is gone would be an orphan in the log
            before = self.waiting()
            for batch in self._missed:
                kept = _without_results(batch.messages, dropped)
                if len(kept) < len(batch.messages):
                    batch.messages, batch.tokens = kept, sum(self.count(m) for m in kept)
            self._missed = [b for b in self._missed if b.messages]
            if before > self.waiting():
                log.error("session %s: %d tool results answering calls dropped with them are "
                          "dropped too", self.session_id, before - self.waiting())


# -- one copy per session in a process ---------------------------------------------------------
class _Copies:
    """One guard's copies, the least recently used first; bounded to ``sessions`` and
    ``tokens`` (a BoundedLRU does not fit: a copy's size changes after it is put, and
    copies holding unsaved items go last)."""

    def __init__(self, sessions: int, tokens: int) -> None:
        self.sessions, self.max_tokens = sessions, tokens
        self._copies: OrderedDict[tuple[str, str], LocalHistory] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, tenant: str, session_id: str, make: Callable[[], LocalHistory],
            ttl: float) -> LocalHistory:
        now = time.monotonic()
        with self._lock:
            key = (tenant, session_id)
            found = self._copies.get(key)
            if found is not None and ttl and now - found.touched > ttl:
                # Redis forgot the session by now too (its TTL)
                self._forget(key, found, "it was idle for longer than the session's TTL")
                found = None
            if found is None:
                found = self._copies[key] = make()
            self._copies.move_to_end(key)
            found.touched = now
            # (the copies' sizes read without their locks: one may be held during I/O)
            while len(self._copies) > 1 and (
                    len(self._copies) > self.sessions
                    or sum(c.tokens for c in self._copies.values()) > self.max_tokens):
                others = [k for k in self._copies if k != key]
                old = next((k for k in others if not self._copies[k].waiting()), others[0])
                self._forget(old, self._copies[old], f"more than {self.sessions} sessions "
                             f"or {self.max_tokens} tokens are kept in this process")
            return found

    def _forget(self, key: tuple[str, str], copy: LocalHistory, why: str) -> None:
        del self._copies[key]
        if copy.waiting():
            log.error("session %s: %d messages Redis missed are dropped and will not be "
                      "saved: %s", copy.session_id, copy.waiting(), why)


_COPIES: weakref.WeakKeyDictionary[object, _Copies] = weakref.WeakKeyDictionary()
_COPIES_LOCK = threading.Lock()


def copy_of(guard: object, tenant: str, session_id: str, keep: int = KEEP,
            ttl: float = 0, *, limit: int = LIMIT, count: Count = DEFAULT_COUNTER.message,
            ids_ttl: float = IDS_TTL) -> LocalHistory:
    """The process's copy of a session of ``guard``'s store (made on first use; gone with
    the guard). ``keep``, ``limit``, ``count`` and ``ids_ttl`` (see
    :class:`LocalHistory`) apply to a copy made now; ``ttl``: seconds the store keeps an
    idle session (0: forever), after which its copy is not used either."""
    with _COPIES_LOCK:
        copies = _COPIES.get(guard)
        if copies is None:
            copies = _COPIES[guard] = _Copies(SESSIONS, TOKENS)
    return copies.get(tenant, session_id,
                      lambda: LocalHistory(session_id, keep, limit, count, ids_ttl), ttl)
