"""The Celery app: ``celery -A workers.app worker -Q compaction``.

Every production setting below is a decision; the comment says why.

Pool: we recommend ``--pool threads --concurrency 32`` per process
(summarization is I/O-bound: a job spends its time waiting on the LLM, see
BENCHMARKS.md "Worker pool"). The threads pool does not enforce Celery's
time limits, so each LLM call carries its own client timeout
(``COMPACTION_SUMMARIZER_TIMEOUT``) and the job checks its deadline between
calls; with ``--pool prefork`` the soft/hard limits below are enforced by
Celery as well.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from kombu.entity import Exchange, Queue

from shared.enqueue import QUEUE
from workers.settings import Settings, load_settings


def celery_config(settings: Settings) -> dict[str, Any]:
    """The Celery configuration for a settings object (pure; used by tests too)."""
    return {
        "broker_url": settings.broker_url,
        # Results are not needed (the store holds the outcome; Flower reads events).
        "result_backend": None,
        "task_ignore_result": True,
        # JSON only: task arguments are ids, never pickles (and never API keys).
        "task_serializer": "json",
        "accept_content": ["json"],
        "result_serializer": "json",
        # At-least-once: ack after the job, requeue if the worker process dies.
        # The job is idempotent (lease + compare-and-swap), so a redelivery is harmless.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        # One job at a time per slot: a long summarization must not hold others hostage.
        "worker_prefetch_multiplier": 1,
        # Redis redelivers an unacked message after visibility_timeout: keep it above
        # the hard time limit plus the longest retry countdown (retries with a countdown
        # stay unacked in the worker until due), or a slow job runs twice.
        "broker_transport_options": {
            "visibility_timeout": settings.visibility_timeout,
            # Sweep for jobs of dead workers (kill -9) every few seconds; each sweep
            # is one bounded ZRANGEBYSCORE on the unacked index.
            "unacked_restore_interval": settings.broker_restore_sweep_seconds,
            "unacked_restore_throttle": 1,
            "socket_timeout": 5,
            "socket_connect_timeout": 5,
        },
        "broker_connection_retry_on_startup": True,
        # Routing: everything on the dedicated queue, so the service can share a broker.
        "task_default_queue": QUEUE,
        "task_queues": (Queue(QUEUE, Exchange(QUEUE), routing_key=QUEUE),),
        "task_routes": {"compaction.*": {"queue": QUEUE}},
        # Time limits (enforced by prefork; threads rely on client timeouts).
        "task_soft_time_limit": settings.task_soft_time_limit,
        "task_time_limit": settings.task_time_limit,
        # Events for Flower: task-sent from the publisher, task-* from workers.
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        # Shutdown: SIGTERM is Celery's warm shutdown, which waits for running jobs
        # (give containers a grace period above one LLM call: compose uses 90 s).
        # A cold shutdown (SIGQUIT) under prefork first gets this soft-shutdown
        # window to finish jobs; what is still running then is requeued (acks_late).
        # The threads pool cannot cancel jobs on a cold shutdown, so warm it is.
        "worker_soft_shutdown_timeout": 30.0,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "worker_hijack_root_logger": False,
        "timezone": "UTC",
    }


def create_app(settings: Settings | None = None) -> Celery:
    settings = settings or load_settings()
    app = Celery("compaction", include=["workers.tasks"])
    app.conf.update(celery_config(settings))
    app.conf.compaction_settings = settings
    return app


app = create_app()

__all__ = ["app", "celery_config", "create_app"]
