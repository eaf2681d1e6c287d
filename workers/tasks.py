"""Celery tasks, thin like web views. Stable names (documented in the README):

- ``compaction.maybe_summarize(session_id, tenant="default")``: enqueued by
  the guard after each turn (coalesced); compacts only when due.
- ``compaction.compact(session_id, keep_recent=None, force=False,
  tenant="default")``: a manual ``/compact``.

Delivery is at least once (acks_late): every job is idempotent. A
per-session lease (owner token with expiry, released only by its owner)
keeps two workers from summarizing one session at once. A job that finds
the lease taken leaves its request (``force``, ``keep_recent``, manual or
not) in the session's dirty flag and tries the lease once more; the holder
runs every request it finds, and releases only in the same atomic step as a
look that finds the flag empty, so no request is left behind with nobody to
run it (see :func:`run_job`).

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
from dataclasses import dataclass, field
from typing import Any

from celery import Task

from shared.core.errors import SummarizerError, SummarizerUnavailable
from shared.enqueue import QUEUE, TASK_COMPACT, TASK_MAYBE_SUMMARIZE
from shared.store.sessions import SessionStore
from workers.app import app
from workers.compactor import JobOutcome
from workers.metrics import observed, record_outcome
from workers.runtime import get_runtime
from workers.settings import RETRY_BACKOFF_FACTOR, Settings

log = logging.getLogger("compaction.tasks")
# Rounds of "take the requests left while we held the lease, run them" per job; after
# that the job hands what is left to a follow-up job instead of running forever.
MAX_RERUN_ROUNDS = 3


def _settings() -> Settings:
    settings: Settings = app.conf.compaction_settings
    return settings


@dataclass(frozen=True, slots=True)
class Request:
    """What one job was asked to do; left in the dirty flag when the lease is busy."""

    force: bool = False
    keep_recent: int | None = None
    manual: bool = False

    def encode(self) -> str:
        return json.dumps({"force": self.force, "keep_recent": self.keep_recent,
                           "manual": self.manual}, sort_keys=True)

    @classmethod
    def decode(cls, line: str) -> Request:
        """A request read back; anything unreadable (a flag from an older version: "1")
        is a plain rerun, which is what such a flag meant."""
        try:
            data = json.loads(line)
            keep = data.get("keep_recent")
            return cls(force=data.get("force") is True, manual=data.get("manual") is True,
                       keep_recent=keep if isinstance(keep, int) and not isinstance(keep, bool)
                       and keep >= 0 else None)
        except (ValueError, AttributeError):
            return cls()


def _distinct(lines: list[str]) -> list[Request]:
    """The requests to run, each once, in arrival order; a plain rerun goes last
    (after a manual one it usually finds nothing due, but it costs one read)."""
    seen: list[Request] = []
    for request in map(Request.decode, lines or [""]):
        if request not in seen:
            seen.append(request)
    return sorted(seen, key=lambda r: r == Request())


@dataclass
class _Job:
    """One task execution: the session, its store and how to run one request."""

    session_id: str
    tenant: str
    store: SessionStore
    run: Callable[..., JobOutcome]
    last_attempt: bool
    deadline: float
    outcome: JobOutcome | None = None
    reruns: list[str] = field(default_factory=list)

    def execute(self, request: Request) -> JobOutcome:
        return record_outcome(_compact_once(self.run, self.session_id, request,  # metrics
                                            self.last_attempt, self.deadline))

    def finish(self, token: str) -> bool:
        """Run the requests left in the dirty flag while we hold the lease, then release.

        The last look and the release are one atomic step
        (:meth:`SessionStore.finish_lease`), so nothing can be left behind in
        between. Returns False when the lease was lost or requests may remain
        after MAX_RERUN_ROUNDS (the lease is released then too): :meth:`settle`
        takes over. A failure that will be retried puts the requests not yet
        run back first; the caller releases the lease.
        """
        for _ in range(MAX_RERUN_ROUNDS):
            status, lines = self.store.finish_lease(self.session_id, token)
            if status != "dirty":
                return status == "released"
            requests = _distinct(lines)
            for i, request in enumerate(requests):
                try:
                    outcome = self.execute(request)
                except BaseException:
                    self.put_back(requests[i:])
                    raise
                self.reruns.append(outcome.status)
                self.outcome = self.outcome or outcome
        self.store.release_lease(self.session_id, token)
        return False

    def put_back(self, requests: list[Request]) -> None:
        for request in requests:
            self.store.mark_dirty(self.session_id, request.encode())

    def settle(self) -> None:
        """After the lease was lost or rounds ran out: a request left in the flag has
        nobody else to run it, so take it back under the lease (or leave it to the
        job that holds the lease now: it looks before it releases)."""
        for _ in range(MAX_RERUN_ROUNDS):
            lines = self.store.take_dirty_requests(self.session_id)
            if lines is None:
                return
            self.put_back(_distinct(lines))
            token = self.store.acquire_lease(self.session_id)
            if token is None:
                return  # acquired after our put_back: its holder will find them
            try:
                done = self.finish(token)
            except BaseException:
                self.store.release_lease(self.session_id, token)
                raise
            if not done:
                break
        lines = self.store.take_dirty_requests(self.session_id)
        if lines is not None:  # a stream of requests: hand the rest to a fresh job
            self.put_back(_distinct(lines))
            app.send_task(TASK_MAYBE_SUMMARIZE, args=[self.session_id],
                          kwargs={"tenant": self.tenant}, queue=QUEUE)
            log.info("requests left for %s after %d rerun rounds: follow-up job sent",
                     self.session_id, MAX_RERUN_ROUNDS)


def run_job(task: Task, session_id: str, tenant: str, *, force: bool,
            keep_recent: int | None, manual: bool = False) -> dict[str, Any]:
    """Lease, compact (LLM, or offline on the last attempt), run requests left, release.

    The lease protocol, which leaves no request behind:

    - busy: append the request to the dirty flag, then try the lease again
      (the holder may have released in between, after its last look);
    - holder: run its own request, then take and run the flag's requests
      until it is empty; the look that finds it empty releases the lease in
      the same atomic step (:meth:`_Job.finish`).

    Whoever appends to the flag either gets the lease afterwards or fails to
    because someone holds it then; that holder's last look comes after the
    append, since it releases only in a look that finds the flag empty.
    """
    settings = _settings()
    runtime = get_runtime(settings)
    compactor = runtime.compactor(tenant)
    store = compactor.store
    store.keys(session_id)  # validates tenant and session id before anything else
    request = Request(force=force, keep_recent=keep_recent, manual=manual)
    own: Request | None = request
    token = store.claim(session_id)  # clears the pending flag too
    if token is None:
        store.mark_dirty(session_id, request.encode())
        token = store.acquire_lease(session_id)
        if token is None:
            return {"session_id": session_id, "status": "busy",
                    "reason": "another job holds the lease; it runs this request before "
                              "it ends", "request": request.encode()}
        own = None  # our request is in the flag now: finish() runs it
    retries = task.request.retries or 0
    job = _Job(session_id, tenant, store, compactor.run,
               last_attempt=retries >= (task.max_retries or 0),
               deadline=time.monotonic() + settings.task_soft_time_limit)
    try:
        if own is not None:
            job.outcome = job.execute(own)
        finished = job.finish(token)
    except BaseException:
        store.release_lease(session_id, token)
        raise
    if not finished:
        job.settle()
    # Short fields first: Celery's log line of the result is cut at 1,024 characters.
    result: dict[str, Any] = {"session_id": session_id, "status": "skipped",
                              "attempt": retries + 1, "reruns": job.reruns}
    result.update(job.outcome.as_dict() if job.outcome is not None
                  else {"reason": "nothing left to run"})
    return result


def _compact_once(run: Callable[..., JobOutcome], session_id: str, request: Request,
                  last_attempt: bool, deadline: float) -> JobOutcome:
    """One request: LLM summary, or the offline summarizer when retrying cannot help."""
    args = {"force": request.force, "keep_recent": request.keep_recent,
            "manual": request.manual}
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
def maybe_summarize(self: Task, session_id: str, tenant: str = "default") -> dict[str, Any]:
    """Compact the session if the budget formula says it is due."""
    return observed(self, session_id, tenant,  # span, log ids, metrics (workers.metrics)
                    lambda: run_job(self, session_id, tenant, force=False, keep_recent=None))


@app.task(name=TASK_COMPACT, bind=True, **_RETRY)
def compact(self: Task, session_id: str, keep_recent: int | None = None, force: bool = False,
            tenant: str = "default") -> dict[str, Any]:
    """Manual /compact: runs below the trigger; ``force`` also when it frees little."""
    return observed(self, session_id, tenant,  # span, log ids, metrics (workers.metrics)
                    lambda: run_job(self, session_id, tenant, force=force,
                                    keep_recent=keep_recent, manual=True))


__all__ = ["MAX_RERUN_ROUNDS", "Request", "compact", "maybe_summarize", "run_job"]
