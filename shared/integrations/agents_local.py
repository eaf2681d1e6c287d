"""What a process keeps of an Agents SDK session for a Redis outage.

The runner reads a session once per run and saves what the run adds; both go
to Redis. To keep a run going while Redis is down, the process keeps (here,
no SDK and no I/O of its own) the session's messages as it last saw them (the
view of its last read, then what its runs saved since) and the batches Redis
missed, each with the request id it was first sent with. They are appended in
order, before anything newer, once Redis answers: an append that landed
although its reply was lost carries the same id and is not stored twice.

One copy per (guard, tenant, session id) in a process (:func:`copy_of`): an app
that builds a ``GuardedSession`` per request finds the copy the previous
request left, and the session objects of one session save through one lock, so
their batches reach the log in the order they were made. Across processes
nothing orders them: a missed batch saved after the log grew past what it saw
is still appended (the user's turn and the billed answer are not thrown away;
a batch that never gets saved would be worse than one out of place) and the
misplacement is logged as an ERROR naming the session.

A log found shorter than the copy knew (Redis restarted without persistence,
or restored an older snapshot) is reported; an empty one is re-seeded from the
copy (:meth:`LocalHistory.seen`, :meth:`LocalHistory.flush`), unless Redis has
been up since the copy last found the log whole: then the session was deleted
(by another process, or by its TTL), and the copy is forgotten instead.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from shared.core.errors import StoreUnavailable
from shared.core.messages import Message
from shared.core.turns import leading_system_count

log = logging.getLogger("shared.integrations.agents_sdk")
KEEP = 1000
"""Messages a session keeps in-process by default (its last view and what was added)."""
SESSIONS = 256
"""Sessions a guard keeps copies of in a process (the least recently used go first)."""

Append = Callable[[list[Message], str], int]
"""Saves a batch with a request id; the log's length after it (``record_turn``)."""
Length = Callable[[], int]
"""The log's length now (one round trip)."""
Restarted = Callable[[float], bool]
"""Whether Redis restarted within the last so many seconds (True when it cannot tell)."""


def _cannot_tell(seconds: float) -> bool:
    return True

__all__ = ["KEEP", "SESSIONS", "LocalHistory", "copy_of"]


@dataclass(slots=True)
class _Batch:
    request_id: str
    messages: list[Message]
    reseed: bool = False  # the copy itself, for a log Redis lost: not a new message


def _call_ids(messages: Iterable[Message]) -> set[str]:
    return {call.id for m in messages for call in m.tool_calls}


def _without_results(messages: list[Message], calls: set[str]) -> list[Message]:
    """``messages`` less the tool results answering ``calls`` (calls no longer kept)."""
    if not calls:
        return messages
    return [m for m in messages if not (m.role == "tool" and m.tool_call_id in calls)]


class LocalHistory:
    """A session's messages as this process knows them, and the batches Redis missed.

    ``keep`` bounds both: the copy keeps its leading system messages (the summary)
    and the newest others; missed batches beyond it are dropped oldest first, with an
    error logged (they cannot be saved any more), and with them the tool results
    answering a call they held (never saved without their call). ``length`` and
    ``version``: the log's as this process last read or wrote them.
    """

    def __init__(self, session_id: str, keep: int = KEEP) -> None:
        self.session_id, self.keep = session_id, max(1, keep)
        self.pinned: list[Message] = []  # the log's leading system messages, last read
        self._saved: list[Message] = []  # the last view after them (summary first), then saves
        self._missed: list[_Batch] = []
        self.length = self.version = 0
        self.confirmed = time.monotonic()  # when the log was last found as long as known
        self.lock = threading.RLock()  # held by a read or a save of the session, I/O included
        self.touched = time.monotonic()

    # -- the copy ------------------------------------------------------------------------
    def seen(self, pinned: list[Message], body: list[Message], length: int,
             version: int, restarted: Restarted = _cannot_tell) -> bool:
        """A view read from Redis: its pinned messages and the rest (summary first), of a
        log ``length`` long at ``version``; the lists become the copy's own. True: the log
        is gone (empty, this process knew messages and no edit since, Redis restarted
        since: ``restarted``), the copy is kept and its re-seed waits for :meth:`flush`.

        A shorter log (not empty) at a version no newer than the copy's is logged as an
        ERROR (an older snapshot restored: the log and the copy cannot be merged without
        positions) and taken as it is; a newer version is an edit in another process.
        """
        with self.lock:
            if length < self.length and version <= self.version:
                if length > 0:
                    log.error("session %s: the log holds %d messages, this process knew %d "
                              "(Redis lost data, or restored an older snapshot); the view of "
                              "what it holds replaces this process's copy", self.session_id,
                              length, self.length)
                elif self._reseed(restarted):
                    return True
                # (empty, not re-seeded: the session was deleted; the empty log is taken)
            self.pinned, self._saved = pinned, body
            self.length, self.version = length, version
            self.confirmed = time.monotonic()
            self._bound()
            return False

    def _reseed(self, restarted: Restarted) -> bool:
        """Queue the copy as the log's first batch: the pinned messages, the summary the
        view began with as a system message after them (no log message holds it: it joins
        the pinned head, kept whole, never summarized again), then the rest. Not when
        Redis has been up since the copy last found the log whole (the session was
        deleted: the copy is forgotten, what Redis missed is kept for the new log)."""
        if not restarted(time.monotonic() - self.confirmed):
            log.warning("session %s: the session was deleted (Redis did not restart since "
                        "this process last read it): this process's copy is forgotten",
                        self.session_id)
            self.pinned, self._saved = [], []
            self.length = self.version = 0
            return False
        saved = list(self._saved)
        head = leading_system_count(saved)
        for n in range(head, len(saved)):  # a summary that led as a user message
            if saved[n].metadata.get("compaction") != "summary":
                break
            head = n + 1
        summary = "\n\n".join(m.text() for m in saved[:head] if m.text())
        batch = [*self.pinned, *([Message(role="system", content=summary)] if summary else []),
                 *saved[head:]]
        if not batch:
            return False
        log.error("session %s: the log is gone although this process knew %d messages "
                  "(Redis restarted without persistence, or the session was deleted "
                  "elsewhere); it is re-seeded from this process's copy: %d messages (the "
                  "last view read and what was saved since; a summary as a system message)",
                  self.session_id, self.length, len(batch))
        self._missed.insert(0, _Batch(secrets.token_hex(12), batch, reseed=True))
        self.length = self.version = 0
        return True

    def messages(self) -> list[Message]:
        """The copy after the pinned messages, unsaved ones included (what a degraded view
        is built from)."""
        with self.lock:
            self._bound()
            return [*self._saved, *(m for b in self._missed if not b.reseed
                                    for m in b.messages)]

    def _bound(self) -> None:
        excess = len(self._saved) + self.unsaved - self.keep
        if excess > 0:
            head = min(leading_system_count(self._saved), self.keep // 2)
            cut = self._saved[head:head + excess]
            del self._saved[head:head + excess]
            self._saved = _without_results(self._saved, _call_ids(cut))

    def popped(self, last: Message, rest: Sequence[Message], length: int,
               version: int) -> None:
        """The log's last message was popped (``rest``: the items of it put back), leaving
        it ``length`` long at ``version``."""
        with self.lock:
            if self._saved and self._saved[-1] == last:
                self._saved[-1:] = list(rest)
            self.length, self.version = length, version

    def cleared(self) -> None:
        """The session was deleted: nothing known, nothing to save."""
        with self.lock:
            self.pinned, self._saved, self._missed = [], [], []
            self.length = self.version = 0

    # -- what Redis missed -----------------------------------------------------------------
    @property
    def unsaved(self) -> int:
        """Messages waiting to be saved (a re-seed of the copy not counted)."""
        with self.lock:
            return sum(len(b.messages) for b in self._missed if not b.reseed)

    def waiting(self) -> int:
        """:attr:`unsaved` without the lock (a save may hold it during I/O): a snapshot."""
        return sum(len(b.messages) for b in list(self._missed) if not b.reseed)

    def record(self, messages: list[Message], append: Append, length: Length,
               restarted: Restarted = _cannot_tell) -> bool:
        """Save the missed batches, then ``messages`` (``append(batch, request_id)``), in
        order; False when Redis did not answer (``messages`` then wait, after the others,
        and ``append``'s :class:`StoreUnavailable` is not raised)."""
        with self.lock:
            request_id = secrets.token_hex(12)
            try:
                self.flush(append, length, restarted)
                known = self.length
                self.length = append(messages, request_id)
            except StoreUnavailable:
                self._missed.append(_Batch(request_id, messages))
                self._drop_excess()
                self._bound()
                return False
            if self.length - len(messages) < known:
                log.error("session %s: the log held %d messages before this save, this "
                          "process knew %d (Redis lost data, or another process edited the "
                          "session); the save is kept",
                          self.session_id, self.length - len(messages), known)
            self._saved.extend(messages)
            self.confirmed = time.monotonic()
            if len(self._saved) > self.keep + self.keep // 4:  # trimmed now and then
                self._bound()
            return True

    def flush(self, append: Append, length: Length, restarted: Restarted = _cannot_tell) -> int:
        """Save the missed batches, oldest first, each with its first request id; how
        many messages were saved. A failure raises (:class:`StoreUnavailable`) and
        keeps what is left.

        The log's length is read first: shorter than known and empty, the copy is
        re-seeded before the batches (shorter, not empty: logged); a batch stored
        after messages it did not see (saved by another process meanwhile) is logged.
        """
        with self.lock:
            if not self._missed:
                return 0
            current = length()
            if current < self.length and not self._missed[0].reseed:
                if current > 0:
                    log.error("session %s: the log holds %d messages, this process knew %d "
                              "(Redis lost data, or another process edited it); the %d "
                              "messages it missed are saved after what it holds",
                              self.session_id, current, self.length, self.unsaved)
                    self.length = current
                elif not self._reseed(restarted):  # deleted: the batches start a new log
                    self.length = 0
            saw, saved = self.length, 0  # saw: the log the oldest batch was made after
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
                if not batch.reseed:
                    self._saved.extend(batch.messages)
                    saved += len(batch.messages)
            self.length, self.confirmed = current, time.monotonic()
            self._bound()
            if saved:
                log.info("session %s: saved %d messages Redis had missed", self.session_id,
                         saved)
            return saved

    def _drop_excess(self) -> None:
        dropped: set[str] = set()
        while self.unsaved > self.keep:
            oldest = next((b for b in self._missed if not b.reseed), None)
            if oldest is None or oldest is self._missed[-1]:
                break  # the newest batch is kept whole, however long
            self._missed.remove(oldest)
            dropped |= _call_ids(oldest.messages)
            log.error("session %s: Redis has been down for more than %d unsaved messages; "
                      "the oldest %d are dropped and will not be saved", self.session_id,
                      self.keep, len(oldest.messages))
        if dropped:  # a result whose call is gone would be an orphan in the log
            before = self.unsaved
            for batch in self._missed:
                batch.messages = _without_results(batch.messages, dropped)
            self._missed = [b for b in self._missed if b.messages]
            if before > self.unsaved:
                log.error("session %s: %d tool results answering calls dropped with them are "
                          "dropped too", self.session_id, before - self.unsaved)


# -- one copy per session in a process ---------------------------------------------------------
class _Copies:
    """One guard's copies, the least recently used first; bounded to ``sessions``."""

    def __init__(self, sessions: int) -> None:
        self.sessions = sessions
        self._copies: OrderedDict[tuple[str, str], LocalHistory] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, tenant: str, session_id: str, keep: int, ttl: float) -> LocalHistory:
        now = time.monotonic()
        with self._lock:
            key = (tenant, session_id)
            found = self._copies.get(key)
            if found is not None and ttl and now - found.touched > ttl:
                # Redis forgot the session by now too (its TTL): no re-seed from this copy
                self._forget(key, found, "it was idle for longer than the session's TTL")
                found = None
            if found is None:
                found = self._copies[key] = LocalHistory(session_id, keep)
                while len(self._copies) > self.sessions:
                    # the least recently used with nothing unsaved, else the least recently
                    # used (read without the copies' locks: one may be held during I/O)
                    others = [k for k in self._copies if k != key]
                    old = next((k for k in others if not self._copies[k].waiting()), others[0])
                    self._forget(old, self._copies[old], f"more than {self.sessions} "
                                 "sessions are kept in this process")
            self._copies.move_to_end(key)
            found.touched = now
            return found

    def _forget(self, key: tuple[str, str], copy: LocalHistory, why: str) -> None:
        del self._copies[key]
        if copy.waiting():
            log.error("session %s: %d messages Redis missed are dropped and will not be "
                      "saved: %s", copy.session_id, copy.waiting(), why)


_COPIES: weakref.WeakKeyDictionary[object, _Copies] = weakref.WeakKeyDictionary()
_COPIES_LOCK = threading.Lock()


def copy_of(guard: object, tenant: str, session_id: str, keep: int = KEEP,
            ttl: float = 0) -> LocalHistory:
    """The process's copy of a session of ``guard``'s store (made on first use; gone with
    the guard). ``keep`` applies to a copy made now; ``ttl``: seconds the store keeps an
    idle session (0: forever), after which its copy is not used either."""
    with _COPIES_LOCK:
        copies = _COPIES.get(guard)
        if copies is None:
            copies = _COPIES[guard] = _Copies(SESSIONS)
    return copies.get(tenant, session_id, keep, ttl)
