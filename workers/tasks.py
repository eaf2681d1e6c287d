"""Celery tasks, thin like web views. Stable names (documented in the README):

- ``compaction.maybe_summarize(session_id, tenant="default")``: enqueued by
  the guard after each turn (coalesced); compacts only when due.
- ``compaction.compact(session_id, keep_recent=None, force=False,
  tenant="default")``: a manual ``/compact``.
- ``compaction.index_recall(session_id, tenant="default")``: published by a
  job that compacted (``COMPACTION_RECALL_INDEX=task``, the default), at the
  lowest priority of the same queue, at most one queued per session; indexes
  what was summarized away for recall (:mod:`shared.store.recall_index`).

Recall indexing left the compaction job: it cost the job more CPU than the
rest of it (BENCHMARKS.md, "Worker throughput"). An index job is taken only
when no compaction waits (Redis transport priorities), one covers every
compaction of its session committed while it waited, a failure to publish
or to index is logged and never fails the compaction, and the next one
catches up (the index is incremental from its high-water mark).

Queues: a job's follow-up and index jobs go back to the queue the job came
from (:func:`reply_route`, as Celery's own retries do), so a publisher's
``CeleryEnqueuer(app, queue=...)`` and a worker started with ``-Q`` that
queue keep all of a session's jobs there; eager jobs use ``compaction``.

Delivery is at least once (acks_late): every job is idempotent. A
per-session lease keeps two workers from summarizing one session at once;
the protocol (busy requests, renewal while working, commits fenced by the
lease token, hand-over after a failure) is :mod:`shared.store.lease`.

Retries: only a summarizer that may answer later (timeout, connection
error, 429, 5xx: ``SummarizerUnavailable``) is retried, with exponential
backoff and jitter (Celery autoretry); the last attempt falls back to the
offline summarizer so the session still makes progress. When the provider
said how long to wait (``Retry-After`` / ``retry-after-ms`` on a 429 or 503,
Google's ``RetryInfo``), the countdown is at least that wait, with Celery's
jittered backoff on top so that sessions told the same wait do not come back
at the same second (:func:`retry_countdown`; a wait exactly as long as a retry
may take is that bound); a
wait longer than a retry may take (:func:`longest_wait`:
``COMPACTION_RETRY_BACKOFF_MAX``, and the room the visibility timeout leaves
beside the lease) falls back to the offline summarizer at once, as the last
attempt does, saying so. A stated wait holds every worker,
not only the job told (:mod:`workers.summarizer.cooldown`): it is recorded in
Redis for the provider, and a job that finds the provider cooling down makes
no call and takes the same path with the wait left. A failure that
would repeat (HTTP 400, 401, an empty reply, a refusal, a summary cut off at
its token cap) falls back at once. A failure after some chunks of a long
range were folded commits those first (:mod:`workers.compactor`): the retry
or the fallback starts where they ended.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from celery import Task
from celery.utils.time import get_exponential_backoff_interval

from shared.core.errors import StoreUnavailable, SummarizerError, SummarizerUnavailable
from shared.enqueue import QUEUE, TASK_COMPACT, TASK_MAYBE_SUMMARIZE
from shared.store.lease import MAX_RERUN_ROUNDS, LeaseHolder, Request
from shared.store.recall_index import claim_index_job, index_compacted, release_index_job
from shared.store.sessions import SessionStore
from shared.telemetry.logs import log_context
from workers.app import app
from workers.compactor import JobOutcome
from workers.metrics import observed, record_outcome
from workers.runtime import get_runtime
from workers.settings import RECALL_INDEX_TASK, RETRY_BACKOFF_FACTOR, Settings
from workers.summarizer.cooldown import COOLDOWN_CLASS
from workers.summarizer.failures import failure_of, retry_after_of

log = logging.getLogger("compaction.tasks")


def _settings() -> Settings:
    settings: Settings = app.conf.compaction_settings
    return settings


def longest_wait(settings: Settings) -> float:
    """The longest countdown a retry may take: ``COMPACTION_RETRY_BACKOFF_MAX``, and less
    than the visibility timeout leaves beside the lease (a retry's message stays
    unacknowledged for its countdown and then its run: any longer and Redis delivers it
    again while it waits)."""
    return float(max(0, min(settings.retry_backoff_max,
                            settings.visibility_timeout - settings.lease_seconds)))


def retry_countdown(retries: int, retry_after: float | None, settings: Settings) -> float:
    """Seconds before retry number ``retries + 1``: Celery's exponential backoff with full
    jitter (what ``autoretry_for`` computes), or, when the provider asked for a wait, a
    uniform draw over the backoff's span (``2 << retries`` s, capped) above that wait,
    cut at :func:`longest_wait`.

    Never sooner than the stated wait, never later than the bound: the jitter above a
    wait is drawn within the room the bound leaves (not clamped onto the bound, where
    sessions told the same wait came back together). A wait as long as the bound leaves
    no room: the bound itself. Coming back earlier, spread below it, would meet the
    shared cooldown, make no call and spend a retry (the last one: the offline summary).
    """
    if retry_after is None:
        return float(get_exponential_backoff_interval(
            factor=RETRY_BACKOFF_FACTOR, retries=retries, maximum=settings.retry_backoff_max,
            full_jitter=True))
    longest = longest_wait(settings)
    spread = float(min(settings.retry_backoff_max,
                       RETRY_BACKOFF_FACTOR * 2 ** min(max(retries, 0), 32), longest))
    wait = max(0.0, retry_after)
    if wait < longest:
        return random.uniform(wait, min(longest, wait + spread))
    return longest


def _retrying(task: Task, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``run()``; a summarizer failure whose provider asked for a wait is retried after it
    (``task.retry``: Celery's retry, counted against ``max_retries``); any other
    ``SummarizerUnavailable`` goes to the task's ``autoretry_for`` backoff."""
    try:
        return run()
    except SummarizerUnavailable as exc:
        wait = retry_after_of(exc)
        if wait is None:
            raise
        countdown = retry_countdown(task.request.retries or 0, wait, _settings())
        failure = failure_of(exc)
        why = ("the provider cools down" if failure and failure.error_class == COOLDOWN_CLASS
               else "the summarizer asked to wait")
        log.info("retrying in %.1f s: %s %.1f s", countdown, why, wait)
        raise task.retry(exc=exc, countdown=countdown) from exc


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
    route = reply_route(task.request.delivery_info)

    def execute(request: Request, token: str) -> JobOutcome:
        outcome = record_outcome(_compact_once(compactor.run, session_id, request,  # metrics
                                               last_attempt, deadline, token,
                                               longest_wait(settings)))
        if outcome.status == "compacted" and settings.recall_index == "task":
            request_index(store, session_id, tenant, eager=bool(task.request.is_eager),
                          route=route)
        return outcome

    def follow_up(countdown: float, handoff: int) -> None:
        kwargs: dict[str, Any] = {"tenant": tenant}
        if handoff:
            kwargs["handoff"] = handoff
        options: dict[str, Any] = {"countdown": countdown} if countdown else {}
        options.update(route or {"queue": QUEUE})
        app.send_task(TASK_MAYBE_SUMMARIZE, args=[session_id], kwargs=kwargs, **options)

    def retried(exc: BaseException) -> bool:
        return isinstance(exc, SummarizerUnavailable) and not last_attempt

    holder = LeaseHolder(store, session_id, execute, follow_up, retried,
                         time_limit=settings.longest_job_seconds,
                         ttl_seconds=store.config.lease_ttl_seconds, handoff=handoff)
    try:
        ran = holder.run(request)
    except Exception as exc:
        if isinstance(exc, StoreUnavailable) and not holder.claimed and not last_attempt:
            # Redis did not answer the claim for seconds (lease.CLAIM_RETRY_DELAYS):
            # nothing was taken, and the pending flag this job should have cleared stands,
            # so no turn publishes another job until it goes stale. Celery brings it back.
            countdown = retry_countdown(retries, None, settings)
            log.warning("claim of %s failed (%s); retrying in %.1f s", session_id, exc,
                        countdown)
            raise task.retry(exc=exc, countdown=countdown) from exc
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
                  last_attempt: bool, deadline: float, token: str,
                  longest: float = float("inf")) -> JobOutcome:
    """One request: LLM summary, or the offline summarizer when retrying cannot help (not
    retryable, the last attempt, or a wait asked by the provider longer than ``longest``,
    the longest countdown a retry may take); the commit is fenced with the lease ``token``."""
    args: dict[str, Any] = {"force": request.force, "keep_recent": request.keep_recent,
                            "manual": request.manual, "lease_token": token}
    try:
        return run(session_id, deadline=deadline, **args)
    except SummarizerError as exc:
        retryable = isinstance(exc, SummarizerUnavailable)
        wait = retry_after_of(exc) if retryable else None
        too_long = wait is not None and wait > longest
        if retryable and not last_attempt and not too_long:
            log.warning("summarizer failed for %s, will retry: %s", session_id, exc)
            raise
        why = ("last attempt" if retryable and not too_long else
               f"the provider asks to wait {wait:g} s, longer than a retry may wait "
               f"({longest:g} s: COMPACTION_RETRY_BACKOFF_MAX, visibility timeout)"
               if too_long else f"not retryable, {type(exc).__name__}")
        log.warning("summarizer failed for %s, falling back to the offline summarizer "
                    "(%s): %s", session_id, why, exc)
        # refused, not unreachable: the summary is marked, merged onto, not rebuilt
        # (workers.compactor.FALLBACK_STAGE)
        return run(session_id, use_llm=False, llm_failed=not retryable,
                   fallback_reason=f"summarizer failed ({why}): {exc}", **args)


def reply_route(delivery_info: Mapping[str, Any] | None) -> dict[str, Any]:
    """Publish options sending a job where the job being run came from (empty: the
    app's routes, the ``compaction`` queue, e.g. for an eager job).

    As Celery's ``Task.retry`` does (``signature_from_request``): a message sent
    through the anonymous exchange (every publisher here: a direct queue, by
    name) carries its queue as routing key; another exchange keeps its key.
    """
    info = delivery_info or {}
    exchange, routing_key = info.get("exchange"), info.get("routing_key")
    if not isinstance(routing_key, str) or not routing_key:
        return {}
    if not exchange:
        return {"queue": routing_key}
    return {"exchange": exchange, "routing_key": routing_key}


def request_index(store: SessionStore, session_id: str, tenant: str, *,
                  eager: bool = False, route: Mapping[str, Any] | None = None) -> None:
    """After a commit: publish an index job unless one is queued for the session.

    ``eager`` (the task applied in-process, ``compaction compact --wait``):
    index now, as Celery runs an eager task's follow-ups. ``route``: where it
    goes (:func:`reply_route`; the lowest priority comes from the app's routes).
    Never raises: a range left unindexed is indexed by the next index job.
    """
    try:
        if eager:
            index_compacted(store, session_id)
        elif claim_index_job(store, session_id, store.config.pending_ttl_seconds):
            try:  # routed at the lowest priority of the queue (workers.app)
                index_recall.apply_async(args=[session_id], kwargs={"tenant": tenant},
                                         **(route or {}))
            except Exception:
                release_index_job(store, session_id)
                raise
    except Exception:
        log.warning("recall indexing of %s could not be requested", session_id, exc_info=True)


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
    return _retrying(self, lambda: observed(  # span, log ids, metrics (workers.metrics)
        self, session_id, tenant, lambda: run_job(self, session_id, tenant, force=False,
                                                  keep_recent=None, handoff=handoff)))


@app.task(name=TASK_COMPACT, bind=True, **_RETRY)
def compact(self: Task, session_id: str, keep_recent: int | None = None, force: bool = False,
            tenant: str = "default") -> dict[str, Any]:
    """Manual /compact: runs below the trigger; ``force`` also when it frees little."""
    return _retrying(self, lambda: observed(  # span, log ids, metrics (workers.metrics)
        self, session_id, tenant, lambda: run_job(self, session_id, tenant, force=force,
                                                  keep_recent=keep_recent, manual=True)))


@app.task(name=RECALL_INDEX_TASK, bind=True, autoretry_for=(StoreUnavailable,),
          retry_backoff=RETRY_BACKOFF_FACTOR, retry_backoff_max=_settings().retry_backoff_max,
          retry_jitter=True, max_retries=_settings().max_retries)
def index_recall(self: Task, session_id: str, tenant: str = "default") -> dict[str, Any]:
    """Index what the session's compactions summarized away (up to its watermark now).

    The queued flag is released first, so a commit made while this runs asks
    for another job. A Redis failure is retried with backoff (Celery
    autoretry); a job whose call stopped at its bound asks for the next one.
    """
    # Logged with the job's ids; not in the compaction metrics (jobs, lag, queue depth:
    # they describe compactions; the queue depth gauge counts its waiting jobs, though).
    with log_context(session_id=session_id, tenant=tenant, job_id=self.request.id,
                     task="index_recall"):
        store = get_runtime(_settings()).compactor(tenant).store
        release_index_job(store, session_id)
        report = index_compacted(store, session_id)
        if report.left:
            request_index(store, session_id, tenant,
                          route=reply_route(self.request.delivery_info))
    status = "conflict" if report.conflict else "indexed" if report.messages else "skipped"
    return {"session_id": session_id, "status": status, "start": report.start,
            "end": report.end, "messages": report.messages, "left": report.left,
            "rebuilt": report.rebuilt, "ms": report.ms}


__all__ = ["MAX_RERUN_ROUNDS", "JobFailed", "Request", "compact", "index_recall",
           "longest_wait", "maybe_summarize", "reply_route", "request_index", "retry_countdown",
           "run_job"]
