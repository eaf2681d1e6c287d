"""Celery tasks, thin like web views. Stable names (documented in the README):

- ``compaction.maybe_summarize(session_id, tenant="default")``: enqueued by
  the guard after each turn (coalesced); compacts only when due.
- ``compaction.compact(session_id, keep_recent=None, force=False,
  tenant="default")``: a manual ``/compact``.

Delivery is at least once (acks_late): every job is idempotent. A
per-session lease (owner token with expiry, released only by its owner)
keeps two workers from summarizing one session at once; a job that finds
the lease taken leaves a "dirty" flag, and the owner runs once more
before releasing. LLM failures retry with exponential backoff and jitter
(Celery autoretry); the last attempt falls back to the offline summarizer
so the session still makes progress.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery import Task

from shared.enqueue import TASK_COMPACT, TASK_MAYBE_SUMMARIZE
from shared.errors import SummarizerError
from workers.app import app
from workers.compactor import JobOutcome
from workers.runtime import get_runtime
from workers.settings import Settings

log = logging.getLogger("compaction.tasks")
MAX_DIRTY_RERUNS = 3


def _settings() -> Settings:
    settings: Settings = app.conf.compaction_settings
    return settings


def run_job(task: Task, session_id: str, tenant: str, *, force: bool,
            keep_recent: int | None, manual: bool = False) -> dict[str, Any]:
    """Lease, compact (LLM, or offline on the last attempt), rerun if dirty, release."""
    settings = _settings()
    runtime = get_runtime(settings)
    store = runtime.store.for_tenant(tenant)
    store.keys(session_id)  # validates tenant and session id before anything else
    store.clear_pending(session_id)
    token = store.acquire_lease(session_id)
    if token is None:
        store.mark_dirty(session_id)
        return {"session_id": session_id, "status": "busy",
                "reason": "another worker holds the lease; it will run once more"}
    compactor = runtime.compactor(tenant)
    retries = task.request.retries or 0
    last_attempt = retries >= (task.max_retries or 0)
    deadline = time.monotonic() + settings.task_soft_time_limit
    try:
        outcome = _compact_once(compactor.run, session_id, force, keep_recent,
                                last_attempt, deadline, manual)
        for _ in range(MAX_DIRTY_RERUNS):
            if not store.take_dirty(session_id):
                break
            store.extend_lease(session_id, token)
            outcome = _compact_once(compactor.run, session_id, False, None,
                                    last_attempt, deadline, False)
        result = outcome.as_dict()
        result["attempt"] = retries + 1
        return result
    finally:
        store.release_lease(session_id, token)


def _compact_once(run: Any, session_id: str, force: bool, keep_recent: int | None,
                  last_attempt: bool, deadline: float, manual: bool) -> JobOutcome:
    try:
        outcome: JobOutcome = run(session_id, force=force, keep_recent=keep_recent,
                                  deadline=deadline, manual=manual)
        return outcome
    except SummarizerError as exc:
        if not last_attempt:
            log.warning("summarizer failed for %s, will retry: %s", session_id, exc)
            raise
        log.warning("summarizer failed for %s on the last attempt, using the offline "
                    "summarizer: %s", session_id, exc)
        fallback: JobOutcome = run(session_id, force=force, keep_recent=keep_recent,
                                   use_llm=False, manual=manual)
        fallback.stages.insert(0, "fallback_after_llm_failure")
        return fallback


_RETRY = {
    "autoretry_for": (SummarizerError,),
    "retry_backoff": 2,
    "retry_backoff_max": _settings().retry_backoff_max,
    "retry_jitter": True,
    "max_retries": _settings().max_retries,
}


@app.task(name=TASK_MAYBE_SUMMARIZE, bind=True, **_RETRY)
def maybe_summarize(self: Task, session_id: str, tenant: str = "default") -> dict[str, Any]:
    """Compact the session if the budget formula says it is due."""
    return run_job(self, session_id, tenant, force=False, keep_recent=None)


@app.task(name=TASK_COMPACT, bind=True, **_RETRY)
def compact(self: Task, session_id: str, keep_recent: int | None = None, force: bool = False,
            tenant: str = "default") -> dict[str, Any]:
    """Manual /compact: runs below the trigger; ``force`` also when it frees little."""
    return run_job(self, session_id, tenant, force=force, keep_recent=keep_recent, manual=True)


__all__ = ["compact", "maybe_summarize", "run_job"]
