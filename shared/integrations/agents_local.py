"""What a ``GuardedSession`` keeps in-process for a Redis outage.

The runner reads a session once per run and saves what the run adds; both go
to Redis. To keep a run going while Redis is down, the session keeps (here,
no SDK and no I/O) the session's messages as this process last saw them (the
view of its last read, then everything its runs added since: bounded, the
newest kept) and the batches Redis missed, each with the request id it was
first sent with. They are appended in order, before anything newer, once
Redis answers: an append that landed although its reply was lost carries the
same id and is not stored twice.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable, Sequence

from shared.core.errors import StoreUnavailable
from shared.core.messages import Message
from shared.core.turns import leading_system_count

log = logging.getLogger("shared.integrations.agents_sdk")
KEEP = 1000
"""Messages a session keeps in-process by default (its last view and what was added)."""

__all__ = ["KEEP", "LocalHistory"]


class LocalHistory:
    """A session's messages as this process knows them, and the batches Redis missed.

    ``keep`` bounds both: the copy keeps its leading system messages (the summary)
    and the newest others; missed batches beyond it are dropped oldest first, with an
    error logged (they cannot be saved any more).
    """

    def __init__(self, session_id: str, keep: int = KEEP) -> None:
        self.session_id, self.keep = session_id, max(1, keep)
        self.pinned: list[Message] = []  # the log's leading system messages, last read
        self._body: list[Message] = []
        self._missed: list[tuple[str, list[Message]]] = []
        self._lock = threading.RLock()

    # -- the copy ------------------------------------------------------------------------
    def seen(self, pinned: list[Message], body: list[Message]) -> None:
        """A view read from Redis: its pinned messages and the rest (summary first); the
        lists become the copy's own (the caller built them for this read)."""
        with self._lock:
            self.pinned, self._body = pinned, body
            self._bound()

    def added(self, messages: Sequence[Message]) -> None:
        """Messages a run added (saved or not)."""
        with self._lock:
            self._body.extend(messages)
            if len(self._body) > self.keep + self.keep // 4:  # trimmed now and then
                self._bound()

    def messages(self) -> list[Message]:
        """The copy after the pinned messages (what a degraded view is built from)."""
        with self._lock:
            self._bound()
            return list(self._body)

    def _bound(self) -> None:
        excess = len(self._body) - self.keep
        if excess > 0:
            head = min(leading_system_count(self._body), self.keep // 2)
            del self._body[head:head + excess]

    def popped(self, last: Message, rest: Sequence[Message]) -> None:
        """The log's last message was popped (``rest``: the items of it put back)."""
        with self._lock:
            if self._body and self._body[-1] == last:
                self._body[-1:] = list(rest)

    def cleared(self) -> None:
        """The session was deleted: nothing known, nothing to save."""
        with self._lock:
            self.pinned, self._body, self._missed = [], [], []

    # -- what Redis missed -----------------------------------------------------------------
    @property
    def unsaved(self) -> int:
        """Messages waiting to be saved."""
        with self._lock:
            return sum(len(batch) for _, batch in self._missed)

    def record(self, messages: list[Message], append: Callable[[list[Message], str], object],
               ) -> bool:
        """Save the missed batches, then ``messages`` (``append(batch, request_id)``), in
        order; False when Redis did not answer (``messages`` then wait, after the others,
        and ``append``'s :class:`StoreUnavailable` is not raised)."""
        with self._lock:
            request_id = secrets.token_hex(12)
            try:
                self.flush(append)
                append(messages, request_id)
            except StoreUnavailable:
                self._missed.append((request_id, messages))
                self._drop_excess()
                return False
            return True

    def flush(self, append: Callable[[list[Message], str], object]) -> int:
        """Save the missed batches, oldest first, each with its first request id; how
        many messages were saved. A failure raises (:class:`StoreUnavailable`) and
        keeps what is left."""
        with self._lock:
            saved = 0
            while self._missed:
                request_id, batch = self._missed[0]
                append(batch, request_id)
                self._missed.pop(0)
                saved += len(batch)
            if saved:
                log.info("session %s: saved %d messages Redis had missed", self.session_id,
                         saved)
            return saved

    def _drop_excess(self) -> None:
        while len(self._missed) > 1 and self.unsaved > self.keep:
            _, batch = self._missed.pop(0)
            log.error("session %s: Redis has been down for more than %d unsaved messages; "
                      "the oldest %d are dropped and will not be saved", self.session_id,
                      self.keep, len(batch))
