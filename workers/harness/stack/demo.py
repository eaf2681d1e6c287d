"""The stack behind ``compaction demo``: store, broker and workers, embedded or real.

The demo must run on a fresh machine with no servers and no API keys, and
the same command must exercise a real deployment when one is configured.
:func:`choose_backends` decides which, from what the *environment* set
(``settings.model_fields_set``), never from defaults:

=============================  ==============================================================
environment                    what the demo uses
=============================  ==============================================================
nothing set                    fakeredis (Lua scripts run in-process), Celery's ``memory://``
                               broker, one Celery worker in a thread of this process
                               (threads pool) running the real ``workers.tasks``, the
                               offline summarizer
``COMPACTION_REDIS_URL``       sessions live in that Redis (kept after the demo, so
                               ``compaction stats <session>`` can read them); the broker and
                               the worker stay embedded
``COMPACTION_BROKER_URL``      jobs are published to that broker and done by the deployed
                               workers (``celery -A workers.app worker -Q compaction``); the
                               demo starts no worker and checks that one answers a ping.
                               Requires ``COMPACTION_REDIS_URL``: workers can only compact
                               sessions in a store they can reach. ``--worker embedded``
                               consumes that broker with the in-process worker instead
``COMPACTION_SUMMARIZER``      the in-process worker summarizes with that LLM (model, key,
(``openai``/``vertex``/        base URL, timeout from the same settings); deployed workers
``gemini``)                    use their own environment, so it changes nothing for them
=============================  ==============================================================

The agent side is always the real one: a ``ContextGuard`` that publishes
with ``CeleryEnqueuer(publisher_app(broker))``, as an application would.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from shared.core.errors import CompactionError, ConfigError, StoreUnavailable
from shared.enqueue import CeleryEnqueuer, Enqueuer, publisher_app
from shared.store.sessions import SessionStore, connect, redis_errors
from workers.harness.stack.in_process import MEMORY_BROKER, worker_thread
from workers.settings import Settings
from workers.urls import redact_url

WorkerMode = Literal["auto", "embedded", "deployed"]


@dataclass(frozen=True, slots=True)
class Backends:
    """What the demo runs against (see the module docstring for the rules)."""

    store_url: str | None
    """None: fakeredis in this process."""
    broker_url: str
    worker: Literal["embedded", "deployed"]
    summarizer: str

    @property
    def fully_embedded(self) -> bool:
        return self.store_url is None and self.broker_url == MEMORY_BROKER

    def describe(self) -> dict[str, str]:
        """Human-readable lines (URLs without passwords)."""
        return {
            "store": redact_url(self.store_url) if self.store_url else "fakeredis (in-process)",
            "broker": ("memory:// (in-process)" if self.broker_url == MEMORY_BROKER
                       else redact_url(self.broker_url)),
            "worker": ("Celery worker in this process (threads pool)"
                       if self.worker == "embedded" else "deployed Celery workers"),
            "summarizer": self.summarizer,
        }


def choose_backends(settings: Settings, worker: WorkerMode = "auto") -> Backends:
    """Apply the rules of the module docstring; ConfigError names the variable at fault."""
    explicit = settings.model_fields_set
    store_url = settings.redis_url if "redis_url" in explicit else None
    broker_set = "broker_url" in explicit
    if broker_set and store_url is None:
        raise ConfigError("COMPACTION_BROKER_URL is set but COMPACTION_REDIS_URL is not: "
                          "workers reached through a real broker can only compact sessions in "
                          "a Redis they can reach; set COMPACTION_REDIS_URL too")
    if worker == "deployed" and not broker_set:
        raise ConfigError("--worker deployed needs COMPACTION_BROKER_URL (the broker the "
                          "deployed workers consume) and COMPACTION_REDIS_URL")
    mode: Literal["embedded", "deployed"] = (
        "deployed" if worker == "deployed" or (worker == "auto" and broker_set) else "embedded")
    if mode == "deployed":
        summarizer = "the deployed workers' own (their COMPACTION_SUMMARIZER)"
    elif settings.summarizer == "offline":
        summarizer = "offline (extractive, no LLM)"
    else:
        summarizer = f"{settings.summarizer}: {settings.summarizer_model_name}"
    return Backends(store_url=store_url,
                    broker_url=settings.broker_url if broker_set else MEMORY_BROKER,
                    worker=mode, summarizer=summarizer)


@dataclass(frozen=True, slots=True)
class Landing:
    """One compaction that landed in the store, as the demo reports it."""

    watermark_before: int
    watermark_after: int
    kind: str
    stages: list[str]
    summary_tokens: int
    tokens_before: int | None = None
    tokens_after: int | None = None
    model: str | None = None
    latency_ms: float | None = None


@dataclass
class Stack:
    """Store and enqueuer for the agent side, and what the workers did."""

    backends: Backends
    store: SessionStore
    enqueuer: Enqueuer
    _outcomes: queue.SimpleQueue[dict[str, Any]] = field(default_factory=queue.SimpleQueue)
    _active: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _seen: dict[str, tuple[int, int]] = field(default_factory=dict)
    jobs: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    # -- fed by the in-process worker's signals ------------------------------------
    def _job_started(self, **_: Any) -> None:
        with self._lock:
            self._active += 1

    def _job_finished(self, **_: Any) -> None:
        with self._lock:
            self._active -= 1

    def _job_succeeded(self, result: Any = None, **_: Any) -> None:
        if isinstance(result, dict):
            self._outcomes.put(result)

    def _job_failed(self, exception: Any = None, **_: Any) -> None:
        self.failures.append(f"{type(exception).__name__}: {exception}")

    # -- what landed -----------------------------------------------------------------
    def landed(self, session_id: str) -> list[Landing]:
        """Compactions of ``session_id`` since the last call.

        From the jobs' own outcomes (``JobOutcome``) with the embedded worker;
        from the store's state and summaries with deployed workers, whose
        results are not kept (``task_ignore_result``).
        """
        if self.backends.worker == "embedded":
            return self._from_outcomes(session_id)
        return self._from_store(session_id)

    def _from_outcomes(self, session_id: str) -> list[Landing]:
        out: list[Landing] = []
        while True:
            try:
                result = self._outcomes.get_nowait()
            except queue.Empty:
                return out
            if result.get("session_id") != session_id:
                continue
            status = str(result.get("status", "?"))
            self.jobs[status] = self.jobs.get(status, 0) + 1
            if status != "compacted":
                continue
            record = self.store.summary(session_id, int(result["watermark_after"]))
            out.append(Landing(
                watermark_before=int(result["watermark_before"]),
                watermark_after=int(result["watermark_after"]),
                kind=str(result["summary_kind"]), stages=list(result["stages"]),
                summary_tokens=record.tokens if record else 0,
                tokens_before=int(result["tokens_before"]),
                tokens_after=int(result["tokens_after"]),
                model=result.get("model"), latency_ms=float(result["latency_ms"])))

    def _from_store(self, session_id: str) -> list[Landing]:
        state = self.store.state(session_id)
        before = self._seen.get(session_id, (0, 0))
        self._seen[session_id] = (state.version, state.watermark)
        if state.version == before[0] or state.summary_kind in ("", "truncation"):
            return []
        record = self.store.summary(session_id, state.watermark)
        if record is None:
            return []
        self.jobs["compacted"] = self.jobs.get("compacted", 0) + 1
        return [Landing(watermark_before=before[1], watermark_after=record.watermark,
                        kind=record.kind, stages=list(record.stages),
                        summary_tokens=record.tokens, model=record.model)]

    def wait_idle(self, session_id: str, timeout: float) -> bool:
        """Wait until no job of the session is queued or running (True) or time is up."""
        lease = self.store.keys(session_id).lease
        deadline = time.monotonic() + timeout
        quiet = 0
        while time.monotonic() < deadline:
            with self._lock:
                active = self._active
            with redis_errors("wait_idle"):
                leased = bool(self.store.redis.exists(lease))
            busy = active > 0 or leased or self.store.is_pending(session_id)
            quiet = 0 if busy else quiet + 1
            if quiet >= 3:  # three quiet polls: nothing between "received" and "leased"
                return True
            time.sleep(0.05)
        return False


def _store_client(backends: Backends, settings: Settings) -> Any:
    if backends.store_url is None:
        try:
            import fakeredis
        except ImportError as exc:
            raise ConfigError("the embedded demo needs fakeredis with Lua: pip install "
                              "'context-compaction[embedded]' (or set COMPACTION_REDIS_URL "
                              "to use a real Redis)") from exc
        return fakeredis.FakeRedis()
    client = connect(backends.store_url, settings.store_config())
    try:
        with redis_errors("ping"):
            client.ping()
    except StoreUnavailable as exc:
        raise StoreUnavailable(f"cannot reach Redis at {redact_url(backends.store_url)} "
                               f"(COMPACTION_REDIS_URL): {exc.__cause__ or exc}") from None
    return client


@contextlib.contextmanager
def open_stack(settings: Settings, backends: Backends, *,
               concurrency: int = 4) -> Iterator[Stack]:
    """Build the store and the enqueuer, start the in-process worker if embedded.

    On exit the worker is stopped (a remote-control shutdown, so the
    memory transport's two-second drain does not delay it), the worker
    app's configuration and the process runtime are restored.
    """
    client = _store_client(backends, settings)
    store = SessionStore(client, settings.store_config(), tenant=settings.tenant)
    publisher = publisher_app(backends.broker_url)
    stack = Stack(backends=backends, store=store,
                  enqueuer=CeleryEnqueuer(publisher, queue=settings.queue))
    try:
        if backends.worker == "deployed":
            _check_deployed_workers(publisher, backends)
            yield stack
        else:
            with _embedded_worker(settings, backends, stack, concurrency):
                yield stack
    finally:
        publisher.close()


def _check_deployed_workers(publisher: Any, backends: Backends) -> None:
    try:
        replies = publisher.control.ping(timeout=2.0)
    except Exception as exc:
        raise CompactionError(f"cannot reach the broker at {redact_url(backends.broker_url)} "
                              f"(COMPACTION_BROKER_URL): {exc}") from None
    if not replies:
        raise CompactionError(
            f"no Celery worker answered on {redact_url(backends.broker_url)} within 2 s: start "
            "one (celery -A workers.app worker --pool threads) or run the demo "
            "with --worker embedded")


@contextlib.contextmanager
def _embedded_worker(settings: Settings, backends: Backends, stack: Stack,
                     concurrency: int) -> Iterator[None]:
    from celery import signals

    handlers = [(signals.task_prerun, stack._job_started),
                (signals.task_postrun, stack._job_finished),
                (signals.task_success, stack._job_succeeded),
                (signals.task_failure, stack._job_failed)]
    with worker_thread(settings, stack.store, broker_url=backends.broker_url,
                       concurrency=concurrency, handlers=handlers):
        yield


__all__ = [
    "Backends",
    "Landing",
    "Stack",
    "WorkerMode",
    "choose_backends",
    "open_stack",
]
