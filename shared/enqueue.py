"""The enqueue client: how the agent process asks the workers for a summary.

The guard never waits for a worker. It enqueues by task *name* (so the agent
process does not import ``workers``), and it coalesces: the store's pending
flag is set only if absent, and only the caller that set it publishes a
job. A burst of turns therefore leaves at most one queued job per session;
the worker clears the flag when it starts, so the next turn can enqueue
again.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any, Protocol

from shared.errors import StoreUnavailable

TASK_MAYBE_SUMMARIZE = "compaction.maybe_summarize"
TASK_COMPACT = "compaction.compact"
QUEUE = "compaction"

log = logging.getLogger(__name__)


class Enqueuer(Protocol):
    """Publishes a summarization job for one session."""

    def enqueue(self, tenant: str, session_id: str) -> None: ...


class CeleryEnqueuer:
    """Publishes through a Celery app (any broker), by task name.

    ``app`` is a ``celery.Celery`` configured for the broker; it need not
    know the task: ``send_task`` publishes by name.
    """

    def __init__(self, app: Any, *, queue: str = QUEUE) -> None:
        self.app = app
        self.queue = queue

    def enqueue(self, tenant: str, session_id: str) -> None:
        self.app.send_task(
            TASK_MAYBE_SUMMARIZE,
            args=[session_id],
            kwargs={"tenant": tenant},
            queue=self.queue,
            ignore_result=True,
        )


class CallbackEnqueuer:
    """Hands the job to a callable (embedded demo, tests, custom queues)."""

    def __init__(self, callback: Callable[[str, str], None]) -> None:
        self.callback = callback

    def enqueue(self, tenant: str, session_id: str) -> None:
        self.callback(tenant, session_id)


class NullEnqueuer:
    """Enqueues nothing: for guards that run without workers (recovery still works)."""

    def enqueue(self, tenant: str, session_id: str) -> None:
        return None


def publisher_app(broker_url: str, *, timeout: float = 1.0) -> Any:
    """A minimal Celery app for the agent side: publish only, bounded time.

    Publishing retries are kept short (the hot path must not stall on a
    broker hiccup): one retry after 0.1 s, and a bounded connection timeout.
    A missed enqueue is harmless: the next turn enqueues again.
    """
    from celery import Celery

    app = Celery("compaction-agent", broker=broker_url, set_as_current=False)
    app.conf.update(
        broker_connection_timeout=timeout,
        broker_connection_retry_on_startup=False,
        task_publish_retry=True,
        task_publish_retry_policy={"max_retries": 1, "interval_start": 0.1,
                                   "interval_step": 0.1, "interval_max": 0.1},
        task_serializer="json",
        broker_transport_options={"socket_timeout": timeout, "socket_connect_timeout": timeout},
    )
    return app


def request_summary(store: Any, enqueuer: Enqueuer, session_id: str) -> bool:
    """Enqueue a job unless one is already pending. True when a job was published.

    If publishing fails the pending flag is cleared again, so that the next
    turn retries instead of waiting for the flag to expire.
    """
    if not store.mark_pending(session_id):
        return False
    try:
        enqueuer.enqueue(store.tenant, session_id)
    except Exception as exc:
        with contextlib.suppress(StoreUnavailable):
            store.clear_pending(session_id)
        log.warning("enqueue failed for session %s: %s", session_id, exc)
        return False
    return True


__all__ = [
    "QUEUE",
    "TASK_COMPACT",
    "TASK_MAYBE_SUMMARIZE",
    "CallbackEnqueuer",
    "CeleryEnqueuer",
    "Enqueuer",
    "NullEnqueuer",
    "publisher_app",
    "request_summary",
]
