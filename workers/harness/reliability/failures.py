"""``failures``: every way the summarizer can fail, none stores a bad summary.

Run long by ``scripts/reliability.py``, at CI size by ``tests/test_reliability.py``.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shared.enqueue import QUEUE, TASK_COMPACT, publisher_app
from shared.store.sessions import SessionStore
from workers.harness.demo_session import demo_turns
from workers.harness.fakes.behaviour import REFUSAL_TEXT, Fault
from workers.harness.reliability.common import Env, ObservedLLM, integrity, marked, start_workers
from workers.harness.reliability.load import OVERFLOW_400
from workers.harness.timing import wait_for


@dataclass(frozen=True)
class FailureSpec:
    """One failure mode: the fault, how many requests get it, what must happen."""

    fault: Fault
    times: int | None  # requests that get the fault (None: all of them)
    expected: str  # kind of the stored summary
    retried: bool  # Celery retries it (SummarizerUnavailable), else the fallback runs at once
    requests: tuple[int, int] | None = None  # LLM requests expected, when not the default


FAILURE_CASES: dict[str, FailureSpec] = {
    "timeout": FailureSpec(Fault.stall(3.0), None, "offline", True),
    "rate-limit": FailureSpec(Fault.rate_limit(0.2), None, "offline", True),
    "server-error": FailureSpec(Fault.server_error(), None, "offline", True),
    "garbage": FailureSpec(Fault.garbage(), None, "offline", True),
    "empty": FailureSpec(Fault.empty(), None, "offline", False),
    "refusal": FailureSpec(Fault.refusal(), None, "offline", False),
    "endless": FailureSpec(Fault.endless(), None, "offline", False),
    "reset": FailureSpec(Fault.reset(), None, "offline", True),
    "overloaded-503": FailureSpec(Fault.unavailable(), None, "offline", True),
    "not-a-completion": FailureSpec(Fault.not_completion(), None, "offline", True),
    "bad-request-400": FailureSpec(Fault.http_error(
        400, '{"error": {"message": "Invalid request", "type": "invalid_request_error"}}'),
        None, "offline", False),
    # Up to 6 requests: the failed one, then summary and split-turn prefix, or more
    # chunks when the worker's engine has already learned the 16k window below.
    "transient-429": FailureSpec(Fault.rate_limit(0.2), 1, "llm", True, (2, 6)),
    # The summarizer's window (16k, says the error) is smaller than configured: the
    # engine splits the rest of the range smaller and folds (2 or 3 chunks + prefix).
    "overflow-400": FailureSpec(Fault.http_error(400, OVERFLOW_400), 1, "llm", False, (3, 6)),
}
BAD_TEXT = (REFUSAL_TEXT, "and the story goes on", "resp-garbage", "Rate limit reached",
            "had an error while processing")


@dataclass
class FailureCase:
    session_id: str
    fault: str
    kind: str = ""
    llm_requests: int = 0
    retries_logged: int = 0
    fallbacks_logged: int = 0
    events: Counter[str] = field(default_factory=Counter)
    reason: str = ""
    seconds: float = 0.0


@dataclass
class FailureResult:
    max_retries: int = 1
    cases: list[FailureCase] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)


class EventLog:
    """Celery task events (what Flower's /metrics counts), captured from the broker."""

    def __init__(self, broker_url: str) -> None:
        from celery import Celery

        self.app = Celery("reliability-events", broker=broker_url, set_as_current=False)
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._receiver: Any = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _on(self, event: dict[str, Any]) -> None:
        with self._lock:
            self.events.append(event)

    def _run(self) -> None:
        with self.app.connection_for_read() as conn:
            self._receiver = self.app.events.Receiver(conn, handlers={"*": self._on})
            self._receiver.capture(limit=None, timeout=None, wakeup=False)

    def start(self, timeout: float = 10) -> EventLog:
        self._thread.start()
        with self.app.connection_for_write() as conn:
            dispatcher = self.app.events.Dispatcher(conn)
            ok = wait_for(lambda: (dispatcher.send("task-ping"), self.of("task-ping"))[1] != [],
                          timeout, 0.1)
            dispatcher.close()
        if not ok:
            raise RuntimeError("the event receiver did not come up")
        return self

    def stop(self) -> None:
        if self._receiver is not None:
            self._receiver.should_stop = True
        self._thread.join(timeout=5)

    def of(self, kind: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.events if e.get("type") == kind]


def run_failures(env: Env, *, max_retries: int = 1,
                 progress: Callable[[str], None] = lambda _: None) -> FailureResult:
    """One session per failure mode, all compacted at once by one real worker.

    The worker runs with ``COMPACTION_MAX_RETRIES`` and a 1 s backoff cap and
    a 1 s client timeout. Each case is checked for: the stored summary's
    kind (offline after a persistent failure, llm after a transient one),
    no fault text in any stored summary, exactly ``max_retries + 1`` LLM
    requests, one "will retry" warning per retry and one fallback warning in
    the worker log, and the task events: ``task-retried`` per retry, one
    ``task-succeeded``, no ``task-failed``.
    """
    result = FailureResult(max_retries=max_retries)
    store = env.store()
    turns = demo_turns(12)
    faults = {sid: (case.fault, case.times) for sid, case in FAILURE_CASES.items()}
    events = EventLog(env.broker_url).start()
    with ObservedLLM(faults=faults) as llm:
        worker = start_workers("fail", env.workers(
            summarizer="openai", summarizer_base_url=llm.base_url, summarizer_api_key="k",
            summarizer_timeout="1", max_retries=str(max_retries), retry_backoff_max="1",
            # One fake provider fails each session its own way: a stated wait told to the
            # rate-limited sessions must not hold the others' calls, as it would on a real
            # provider (the shared cooldown: tests/test_provider_cooldown.py).
            summarizer_cooldown="false"),
            1, concurrency=len(FAILURE_CASES) + 1)[0]
        publisher = publisher_app(env.broker_url)
        try:
            task_ids: dict[str, str] = {}
            sent: dict[str, float] = {}
            for sid in FAILURE_CASES:
                for turn in marked(turns, sid):
                    store.append(sid, turn)
                sent[sid] = time.monotonic()
                task_ids[sid] = publisher.send_task(TASK_COMPACT, args=[sid], kwargs={
                    "tenant": "default", "force": True, "keep_recent": 2000}, queue=QUEUE).id
            done_at: dict[str, float] = {}

            def finished() -> bool:
                for sid in FAILURE_CASES:
                    if sid not in done_at and store.state(sid).version:
                        done_at[sid] = time.monotonic()
                return len(done_at) == len(FAILURE_CASES) and env.drained()

            if not wait_for(finished, 60, 0.1):
                missing = sorted(set(FAILURE_CASES) - set(done_at))
                result.violations.append(f"jobs did not finish: {missing}")
            wait_for(lambda: set(task_ids.values())
                     <= {e.get("uuid") for e in events.of("task-succeeded")}, 10, 0.1)
        finally:
            worker.stop()
            events.stop()
    log = worker.log()
    for sid, spec in FAILURE_CASES.items():
        case = FailureCase(sid, spec.fault.kind,
                           seconds=done_at.get(sid, time.monotonic()) - sent[sid])
        summaries = store.summaries(sid)
        case.kind = ",".join(s.kind for s in summaries)
        case.llm_requests = len(llm.arrivals(sid))
        case.retries_logged = log.count(f"summarizer failed for {sid}, will retry")
        case.fallbacks_logged = log.count(f"summarizer failed for {sid}, falling back")
        for e in events.events:
            if e.get("uuid") == task_ids[sid]:
                case.events[str(e.get("type"))] += 1
        reasons = re.findall(rf"summarizer failed for {re.escape(sid)}[^:]*: (.*)", log)
        case.reason = reasons[-1].strip() if reasons else ", ".join(
            stage for record in summaries for stage in record.stages
            if stage.startswith("summarizer_overflow"))
        result.cases.append(case)
        result.violations += _check_failure_case(store, case, spec, max_retries)
    progress("failures: " + ", ".join(f"{c.session_id}={c.kind}" for c in result.cases))
    if result.violations:
        result.violations.append(f"worker log: {worker.log_path}")
    return result


def _check_failure_case(store: SessionStore, case: FailureCase, spec: FailureSpec,
                        max_retries: int) -> list[str]:
    """Stored kind, no fault text stored, requests and retries bounded, all of it visible."""
    sid = case.session_id
    attempts = (max_retries + 1 if spec.retried else 1) if spec.times is None else spec.times
    retries = min(attempts, max_retries) if spec.retried else 0
    problems = integrity(store, sid)
    if case.kind != spec.expected:
        problems.append(f"{sid}: stored summaries {case.kind or 'none'}, expected {spec.expected}")
    for record in store.summaries(sid):
        bad = [t for t in BAD_TEXT if t in record.text]
        if bad:
            problems.append(f"{sid}: a stored summary contains fault text {bad}")
    # A failing attempt stops at its first call; a good one makes one or two (split turn).
    low, high = spec.requests or ((attempts, attempts) if spec.expected == "offline"
                                  else (attempts + 1, attempts + 2))
    if not low <= case.llm_requests <= high:
        problems.append(f"{sid}: {case.llm_requests} LLM requests, expected {low}..{high} "
                        "(retries must be bounded)")
    if case.retries_logged != retries:
        problems.append(f"{sid}: {case.retries_logged} 'will retry' warnings, expected {retries}")
    fallback = int(spec.expected == "offline")
    if case.fallbacks_logged != fallback:
        problems.append(f"{sid}: {case.fallbacks_logged} fallback warnings, expected {fallback}")
    if case.events["task-retried"] != retries or case.events["task-succeeded"] != 1 \
            or case.events["task-failed"]:
        problems.append(f"{sid}: task events {dict(case.events)}, expected {retries} "
                        "task-retried and one task-succeeded")
    return problems


# ======================================================================== report
