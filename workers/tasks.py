"""Celery tasks, thin like web views. Stable names (documented in the README):

- ``compaction.maybe_summarize(session_id, tenant="default")``: enqueued by
  the guard after each turn (coalesced); compacts only when due.
- ``compaction.compact(session_id, keep_recent=None, force=False,
  tenant="default")``: a manual ``/compact``.

Delivery is at least once (acks_late): every job is idempotent. A
per-session lease keeps two workers from summarizing one session at once;
the protocol (busy requests, renewal while working, commits fenced by the
lease token, hand-over after a failure) is :mod:`shared.store.lease`.

Retries: only a summarizer that may answer later (timeout, connection
error, 429, 5xx: ``SummarizerUnavailable``) is retried, with exponential
backoff and jitter (Celery autoretry); the last attempt falls back to the
offline summarizer so the session still makes progress. A failure that
would repeat (HTTP 400, 401, an empty reply, a refusal, a summary cut off at
its token cap) falls back at once.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from celery import Task

from shared.core.errors import SummarizerError, SummarizerUnavailable
from shared.enqueue import QUEUE, TASK_COMPACT, TASK_MAYBE_SUMMARIZE
from shared.store.lease import MAX_RERUN_ROUNDS, LeaseHolder, Request
from workers.app import app
from workers.compactor import JobOutcome
from workers.metrics import observed, record_outcome
from workers.runtime import get_runtime
from workers.settings import RETRY_BACKOFF_FACTOR, Settings

log = logging.getLogger("compaction.tasks")


def _settings() -> Settings:
    settings: Settings = app.conf.compaction_settings
    return settings


class JobFailed(Exception):
    """A job that failed for good (not retried), saying what became of the requests
    busy jobs had left for it (handed to a follow-up job, or recorded failed)."""


def run_job(task: Task, session_id: str, tenant: str, *, force: bool,
            keep_recent: int | None, manual: bool = False, handoff: int = 0) -> dict[str, Any]:
    """Lease, compact (LLM, or offline on the last attempt), run requests left, release.

    The protocol (claim, busy requests, the atomic last look, renewal, fenced
    commits, hand-over after a failure) is :mod:`shared.store.lease`; this is
    the Celery side: what one request runs, how a follow-up job is sent and
    which failures Celery retries.
    """
    settings = _settings()
    runtime = get_runtime(settings)
    compactor = runtime.compactor(tenant)
    store = compactor.store
    store.keys(session_id)  # validates tenant and session id before anything else
    request = Request(force=force, keep_recent=keep_recent, manual=manual)
    retries = task.request.retries or 0
    last_attempt = retries >= (task.max_retries or 0)
    deadline = time.monotonic() + settings.task_soft_time_limit

    def execute(request: Request, token: str) -> JobOutcome:
        return record_outcome(_compact_once(compactor.run, session_id, request,  # metrics
                                            last_attempt, deadline, token))

    def follow_up(countdown: float, handoff: int) -> None:
        kwargs: dict[str, Any] = {"tenant": tenant}
        if handoff:
            kwargs["handoff"] = handoff
        options: dict[str, Any] = {"countdown": countdown} if countdown else {}
        app.send_task(TASK_MAYBE_SUMMARIZE, args=[session_id], kwargs=kwargs, queue=QUEUE,
                      **options)

    def retried(exc: BaseException) -> bool:
        return isinstance(exc, SummarizerUnavailable) and not last_attempt

    holder = LeaseHolder(store, session_id, execute, follow_up, retried,
                         time_limit=settings.longest_job_seconds,
                         ttl_seconds=store.config.lease_ttl_seconds, handoff=handoff)
    try:
        ran = holder.run(request)
    except Exception as exc:
        if retried(exc) or not holder.failure.get("requests_waiting"):
            raise
        raise JobFailed(f"{type(exc).__name__}: {exc}; requests left for this job: "
                        f"{json.dumps(holder.failure, sort_keys=True)}"[:1000]) from exc
    if not ran:
        return {"session_id": session_id, "status": "busy",
                "reason": "another job holds the lease; it runs this request before "
                          "it ends", "request": request.encode()}
    # Short fields first: Celery's log line of the result is cut at 1,024 characters.
    result: dict[str, Any] = {"session_id": session_id, "status": "skipped",
                              "attempt": retries + 1, "reruns": holder.reruns,
                              "lease_renewals": holder.renewals}
    result.update(holder.outcome.as_dict() if holder.outcome is not None
                  else {"reason": "nothing left to run"})
    return result


def _compact_once(run: Callable[..., JobOutcome], session_id: str, request: Request,
                  last_attempt: bool, deadline: float, token: str) -> JobOutcome:
    """One request: LLM summary, or the offline summarizer when retrying cannot help;
    the commit is fenced with the lease ``token``."""
    args: dict[str, Any] = {"force": request.force, "keep_recent": request.keep_recent,
                            "manual": request.manual, "lease_token": token}
    try:
        return run(session_id, deadline=deadline, **args)
    except SummarizerError as exc:
        retryable = isinstance(exc, SummarizerUnavailable)
        if retryable and not last_attempt:
            log.warning("summarizer failed for %s, will retry: %s", session_id, exc)
            raise
        why = "last attempt" if retryable else f"not retryable, {type(exc).__name__}"
        log.warning("summarizer failed for %s, falling back to the offline summarizer "
                    "(%s): %s", session_id, why, exc)
        fallback = run(session_id, use_llm=False, **args)
        fallback.stages.insert(0, "fallback_after_llm_failure")
        fallback.reason = f"summarizer failed ({why}): {exc}"[:500]
        return fallback


_RETRY = {
    # Only what may succeed later is retried; the rest falls back at once (_compact_once).
    "autoretry_for": (SummarizerUnavailable,),
    "retry_backoff": RETRY_BACKOFF_FACTOR,
    "retry_backoff_max": _settings().retry_backoff_max,
    "retry_jitter": True,
    "max_retries": _settings().max_retries,
}


@app.task(name=TASK_MAYBE_SUMMARIZE, bind=True, **_RETRY)
def maybe_summarize(self: Task, session_id: str, tenant: str = "default",
                    handoff: int = 0) -> dict[str, Any]:
    """Compact the session if the budget formula says it is due (``handoff``: the
    follow-up jobs in a row after failed ones, see :mod:`shared.store.lease`)."""
    return observed(self, session_id, tenant,  # span, log ids, metrics (workers.metrics)
                    lambda: run_job(self, session_id, tenant, force=False, keep_recent=None,
                                    handoff=handoff))


@app.task(name=TASK_COMPACT, bind=True, **_RETRY)
def compact(self: Task, session_id: str, keep_recent: int | None = None, force: bool = False,
            tenant: str = "default") -> dict[str, Any]:
    """Manual /compact: runs below the trigger; ``force`` also when it frees little."""
    return observed(self, session_id, tenant,  # span, log ids, metrics (workers.metrics)
                    lambda: run_job(self, session_id, tenant, force=force,
                                    keep_recent=keep_recent, manual=True))


__all__ = ["MAX_RERUN_ROUNDS", "JobFailed", "Request", "compact", "maybe_summarize", "run_job"]
