"""The turn in progress, per session: what a tool chain's calls need not redo.

Between two recorded turns an agent calls ``prepare`` once per model call,
each time with the turn so far as ``pending``. Each message of it is
validated and counted once (compared with what the last call passed), keeps
its wire forms, and the turn's tool-pair scan resumes where the last call
left it: a call costs what its new messages cost, not the whole turn.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from shared.core.errors import InvalidInput
from shared.core.messages import Message, validate_messages
from shared.core.pairs import PairScan
from shared.core.tokens import TokenCounter

PENDING_KEEP = 1024  # sessions whose pending turn is remembered (validated, counted)


class PendingTurns:
    """The pending turn of up to :data:`PENDING_KEEP` sessions (LRU); thread-safe."""

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self._lock = threading.Lock()
        self._pending: OrderedDict[str, list[tuple[Any, Message, int, dict[str, Any]]]] = (
            OrderedDict())
        self._scans: OrderedDict[str, tuple[PairScan, tuple[Message, ...], PairScan]] = (
            OrderedDict())

    def rows(self, session_id: str, raw: Sequence[Message | Mapping[str, Any]],
             ) -> tuple[list[Message], list[int]]:
        """The pending messages, validated and counted; a tool chain's prepares re-use
        what an earlier prepare of the same turn already did (compared by value), the
        messages' wire forms included (:meth:`request`)."""
        if not isinstance(raw, (list, tuple)):
            items = validate_messages(raw, prefix="pending")
            return items, [self.counter.message(m) for m in items]
        if not raw:
            return [], []
        with self._lock:
            known = self._pending.get(session_id) or []
        reuse = 0
        for (old, _, _, _), item in zip(known, raw, strict=False):
            if old is not item and old != item:
                break
            reuse += 1
        try:
            fresh = validate_messages(raw[reuse:], prefix="pending") if reuse < len(raw) else []
        except InvalidInput:
            if not reuse:
                raise
            validate_messages(raw, prefix="pending")  # the error, named by its place in raw
            raise
        rows = known[:reuse] + [(copy.deepcopy(item) if isinstance(item, Mapping) else item, m,
                                 self.counter.message(m), {})
                                for item, m in zip(raw[reuse:], fresh, strict=True)]
        with self._lock:
            self._pending[session_id] = rows
            self._pending.move_to_end(session_id)
            while len(self._pending) > PENDING_KEEP:
                self._pending.popitem(last=False)
        return [r[1] for r in rows], [r[2] for r in rows]

    def known_scan(self, session_id: str, scan: PairScan | None,
                    extra: list[Message]) -> tuple[PairScan, int] | None:
        """Where the pair scan of this pending turn can resume: the state an earlier call
        left after the same first messages, from the same stored view's scan."""
        with self._lock:
            known = self._scans.get(session_id)
        if known is None or scan is None or known[0] is not scan:
            return None
        seen = known[1]
        if len(seen) > len(extra) or any(a is not b for a, b in zip(seen, extra,
                                                                     strict=False)):
            return None
        return known[2], len(seen)

    def scanned(self, session_id: str, extra: Sequence[Message], scan: PairScan | None,
                base: PairScan) -> None:
        """Keep the pending turn's scan (``scan``, from ``base``) for the next call."""
        with self._lock:
            if scan is None or not extra:
                self._scans.pop(session_id, None)
                return
            self._scans[session_id] = (base, tuple(extra), scan)
            self._scans.move_to_end(session_id)
            while len(self._scans) > PENDING_KEEP:
                self._scans.popitem(last=False)

    def wire(self, session_id: str, extra: list[Message]) -> list[dict[str, Any]]:
        """The wire-form slots of the pending messages when ``extra`` is the turn
        :meth:`pending` last returned for the session (else none: converted afresh)."""
        with self._lock:
            rows = self._pending.get(session_id)
        if not rows or len(rows) != len(extra) or any(
                r[1] is not m for r, m in zip(rows, extra, strict=True)):
            return []
        return [r[3] for r in rows]

    def forget(self, session_id: str) -> None:
        """The turn was recorded: the next call starts a new one."""
        with self._lock:
            self._pending.pop(session_id, None)
            self._scans.pop(session_id, None)


__all__ = ["PENDING_KEEP", "PendingTurns"]
