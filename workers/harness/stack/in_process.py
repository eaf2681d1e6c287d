"""A Celery worker in a thread of this process, running the real tasks.

The stack's embedded mode (the demo with nothing configured, the replay
without a ``redis-server`` binary, tests): the worker app
(``workers.app.app``) is bound to the caller's settings, the process
runtime is given the caller's store (fakeredis or a real Redis), and a
threads-pool worker consumes the broker (usually Celery's ``memory://``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from shared.store.sessions import SessionStore
from workers.runtime import Runtime, build_runtime, set_runtime
from workers.settings import Settings

MEMORY_BROKER = "memory://"
# The memory transport polls; 20 ms keeps a job's pickup latency below a simulated call.
MEMORY_POLLING_INTERVAL = 0.02
Handlers = Sequence[tuple[Any, Callable[..., None]]]


@contextlib.contextmanager
def worker_app_with(settings: Settings, **conf: Any) -> Iterator[Any]:
    """The worker's Celery app (``workers.app.app``) bound to ``settings`` for a while.

    The tasks read their settings from that app, so an in-process run (the
    embedded worker, ``compact --wait``) installs the caller's settings and
    any configuration overrides, and restores the previous ones afterwards.
    """
    from workers import tasks  # noqa: F401  (registers the tasks on the app)
    from workers.app import app

    values = {"compaction_settings": settings, **conf}
    saved = {key: app.conf.get(key) for key in values}
    _drop_connections(app)
    app.conf.update(values)
    try:
        yield app
    finally:
        _drop_connections(app)
        app.conf.update(saved)


def _drop_connections(app: Any) -> None:
    """Forget the app's pooled connections and producers (they belong to the old broker).

    ``app.close()`` is not enough in Celery 5.7: it drops the connection pool
    but keeps ``amqp``'s producer pool, so ``send_task`` would keep publishing
    to the previous broker (and it unregisters the app). Both pools come from
    kombu's process-wide registry, shared by every app on that broker (an
    in-process worker's replies go through them too), so they are only
    forgotten, never closed. This is what Celery itself resets after a fork.
    """
    app._pool = None
    amqp = app.__dict__.get("amqp")
    if amqp is not None:
        amqp._producer_pool = None


@contextlib.contextmanager
def worker_thread(settings: Settings, store: SessionStore, *, broker_url: str,
                  concurrency: int = 4, handlers: Handlers = (),
                  shutdown_timeout: float = 30) -> Iterator[Any]:
    """Run a threads-pool worker on ``broker_url`` with ``store``; yields the worker app.

    ``handlers`` are (Celery signal, receiver) pairs connected for the
    worker's lifetime. On exit the worker is stopped (a remote-control
    shutdown, so the memory transport's two-second drain does not delay
    it), the app's configuration and the process runtime are restored.
    """
    from celery.contrib.testing.worker import start_worker

    from workers.app import celery_config

    options = dict(celery_config(settings)["broker_transport_options"])
    if broker_url == MEMORY_BROKER:
        options["polling_interval"] = MEMORY_POLLING_INTERVAL
    conf = {"broker_url": broker_url, "broker_transport_options": options,
            # Nothing to wait for on stop: jobs are idempotent and callers waited already.
            "worker_soft_shutdown_timeout": 0.0, "worker_send_task_events": False,
            "task_send_sent_event": False}
    runtime: Runtime = build_runtime(settings, store)  # the cooldown on it too
    root, root_level = logging.getLogger(), logging.getLogger().level
    with worker_app_with(settings, **conf) as app, _restored_level(root, root_level):
        set_runtime(runtime)
        for signal, handler in handlers:
            signal.connect(handler, weak=False)
        try:
            # the configured queue, named: the app's queues were fixed at its first use,
            # which may predate this process's COMPACTION_QUEUE (an earlier stack)
            with start_worker(app, pool="threads", concurrency=concurrency, loglevel="ERROR",
                              perform_ping_check=False, queues=[settings.queue],
                              shutdown_timeout=shutdown_timeout) as worker:
                try:
                    yield app
                finally:
                    with contextlib.suppress(Exception):
                        app.control.shutdown(destination=[worker.hostname])
        finally:
            for signal, handler in handlers:
                signal.disconnect(handler)
            set_runtime(None)


@contextlib.contextmanager
def _restored_level(logger: logging.Logger, level: int) -> Iterator[None]:
    """Celery's worker sets the root logger to its own level (ERROR here) and leaves it
    there: every warning of the process after an in-process worker stopped was dropped
    (an enqueue outage's line, say)."""
    try:
        yield
    finally:
        logger.setLevel(level)


class JobCapture(logging.Handler):
    """Collects the ``compaction.end`` records an in-process worker logs."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self._lock_lines = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self._lock_lines:
            self.lines.append(record.getMessage())

    def snapshot(self) -> list[str]:
        with self._lock_lines:
            return list(self.lines)

    @contextlib.contextmanager
    def installed(self, logger_name: str = "compaction.job") -> Iterator[JobCapture]:
        """Attach to the jobs' logger (at INFO) for a while."""
        job_log = logging.getLogger(logger_name)
        previous_level = job_log.level
        job_log.addHandler(self)
        job_log.setLevel(logging.INFO)
        try:
            yield self
        finally:
            job_log.removeHandler(self)
            job_log.setLevel(previous_level)


__all__ = ["MEMORY_BROKER", "MEMORY_POLLING_INTERVAL", "JobCapture", "worker_app_with",
           "worker_thread"]
