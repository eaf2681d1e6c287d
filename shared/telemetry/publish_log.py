"""Log lines of failed job publishes: the first of an outage, then one a minute, not one a turn.

While the broker is down every turn of every session asks for a job again
(its pending flag is cleared after the failure so that the next turn
retries), so one warning per failure is one warning per turn: thousands a
minute on a busy agent, the same line each time. The failures are all
counted (``compaction_enqueue_total{outcome="failed"}``); the log says when
the outage began, how it goes on (at most once per :data:`REPEAT_SECONDS`,
with the count since the last line) and when a publish gets through again.
"""

from __future__ import annotations

import logging
import threading
import time

REPEAT_SECONDS = 60.0
log = logging.getLogger("shared.enqueue")


class PublishFailureLog:
    """The state of one process's publishes: failing since when, how many unlogged."""

    def __init__(self, repeat_seconds: float = REPEAT_SECONDS) -> None:
        self.repeat_seconds = repeat_seconds
        self._lock = threading.Lock()
        self._failing = 0  # failures since the last success
        self._unlogged = 0  # failures since the last line
        self._last_line = 0.0

    def failed(self, session_id: str, exc: BaseException) -> None:
        """A publish failed: logged if it is the first since a success, or a minute passed."""
        now = time.monotonic()
        with self._lock:
            self._failing += 1
            self._unlogged += 1
            first = self._failing == 1
            if not first and now - self._last_line < self.repeat_seconds:
                return
            unlogged, total = self._unlogged, self._failing
            self._unlogged, self._last_line = 0, now
        if first:
            log.warning("enqueue failed for session %s: %s (sessions compact by truncation "
                        "only until a publish gets through; further failures are counted in "
                        "compaction_enqueue_total{outcome=\"failed\"} and logged once every "
                        "%g s)", session_id, exc, self.repeat_seconds, extra={
                            "session_id": session_id, "failed_publishes": total})
        else:
            log.warning("enqueue still failing: %d failed publishes since the last line, %d "
                        "since the outage began; latest for session %s: %s", unlogged, total,
                        session_id, exc, extra={"session_id": session_id,
                                                "failed_publishes": total})

    def published(self) -> None:
        """A publish got through: ends an outage (logged once) if one was going on."""
        if not self._failing:  # the common case, without the lock
            return
        with self._lock:
            total, self._failing, self._unlogged = self._failing, 0, 0
        if total:
            log.warning("enqueue works again after %d failed publishes", total,
                        extra={"failed_publishes": total})


def log_republished(session_id: str) -> None:
    """A job published again for a pending flag that stood past its stale age with no
    worker claiming it (``StoreConfig.pending_stale_after``): one line per re-publish, at
    most one per session per stale period. Many of them mean jobs are being lost, or the
    queue waits that long (``compaction_enqueue_total{outcome="republished"}``)."""
    log.warning("session %s: its pending flag stood past its stale age with no worker "
                "claiming the job (lost, or queued that long): job published again",
                session_id, extra={"session_id": session_id})


publish_failures = PublishFailureLog()
"""This process's: a broker outage is the process's, whatever guard or session met it."""


__all__ = ["REPEAT_SECONDS", "PublishFailureLog", "log_republished", "publish_failures"]
