"""The Celery app: ``celery -A workers.app worker --pool threads -c 32 -Q compaction``.

Every production setting below is a decision; the comment says why.

Pool: ``--pool threads --concurrency 32``, one worker process per CPU core
(``docker compose up --scale worker=N``); measured against prefork in
BENCHMARKS.md "Worker throughput and pool". A job waits on the LLM for most
of its life, so a slot should cost little: a thread costs about 3 MiB, a
prefork child about 56 MiB, and threads share one store client and one
HTTP connection pool per process. Two threads processes matched one prefork
worker of 32 children on two CPUs with a ninth of the memory and twice the
slots. One process is one GIL: the job's own CPU (view read, ledger,
rendering, the SDK call, Celery's events and acks: about 7 ms for a
14k-token range, growing with the range) caps a process near
``1000 / CPU ms per job`` jobs/s, so scale out with processes. More threads
per process only help when the LLM is slow (a process needs about
jobs/s x LLM latency threads); stay at or under 100, the connection pool of
the store's Redis client (redis-py fails past it, it does not wait), and
keep ``COMPACTION_BROKER_MAX_CONNECTIONS`` above it (every thread acks).

Time limits: prefork enforces the soft and hard limits below; the threads
pool enforces neither (a thread cannot be interrupted). There a job is
bounded by its own deadline instead: ``workers.tasks`` gives the job
``COMPACTION_TASK_SOFT_TIME_LIMIT`` seconds, the summary engine checks it
before every LLM call, and every call ends within the SDK client timeout
(``COMPACTION_SUMMARIZER_TIMEOUT``, no SDK retries; a whole-call deadline,
:mod:`workers.summarizer.deadline`, so a reply trickled in slowly cannot
outlive it), so a job ends within the soft limit plus one call
(``Settings.longest_job_seconds``, which the lease and the visibility
timeout are derived from).

Broker transport: a worker started on a ``redis://`` broker consumes
through ``workers.broker`` (``broker_transport``, set when the worker
starts: ``celeryd_init``), kombu's Redis transport with one redis-py client
per connection pool instead of a new client per broker command (task
events, acks: CPU under the one GIL). Publishers, Flower and in-process
workers keep kombu's own; the messages on the wire are the same. The worker
banner still prints the ``redis://`` URL.
"""

from __future__ import annotations

import importlib
import logging
import sys
import typing
from typing import Any

from celery import Celery
from celery.signals import celeryd_after_setup, celeryd_init, worker_init
from kombu.entity import Exchange, Queue

from shared.core.errors import ConfigError
from shared.enqueue import sentinel_broker_tls, sentinel_options
from workers.broker import is_sentinel_url, use_sentinel_transport, worker_transport
from workers.settings import (
    RECALL_INDEX_PRIORITY,
    RECALL_INDEX_TASK,
    Settings,
    load_settings,
)

log = logging.getLogger("compaction.app")

# The SDK each summarizer needs (and the extra that installs it).
SUMMARIZER_SDKS: dict[str, tuple[str, str] | None] = {
    "offline": None,
    "openai": ("openai", "openai"),
    "vertex": ("google.genai", "vertex"),
    "gemini": ("google.genai", "vertex"),
}


def restore_lock_seconds(settings: Settings) -> int:
    """How long the restore sweep's lock may stand when its holder died: two sweeps."""
    return max(5, 2 * settings.broker_restore_sweep_seconds)


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
        # Redis redelivers an unacked message after visibility_timeout: it is derived
        # above the lease (longest job + margin) plus the longest retry countdown
        # (retries with a countdown stay unacked in the worker until due), or a slow
        # job runs twice (see "Timing" in workers.settings).
        "broker_transport_options": {
            "visibility_timeout": settings.visibility_timeout,
            # Sweep for jobs of dead workers (kill -9) every few seconds; each sweep
            # is one bounded ZRANGEBYSCORE on the unacked index.
            "unacked_restore_interval": settings.broker_restore_sweep_seconds,
            "unacked_restore_throttle": 1,
            # The sweep holds a Redis lock while it runs (milliseconds). kombu lets the
            # lock of a worker killed mid-sweep stand for 5 minutes, and no worker
            # sweeps meanwhile: every dead worker's job then waited that much longer.
            # Any expiry is safe: each restore is its own transaction on the message.
            "unacked_mutex_expire": restore_lock_seconds(settings),
            "socket_timeout": 5,
            "socket_connect_timeout": 5,
            # Under the threads pool every slot acknowledges its own job (acks_late),
            # on the consumer's channel: 32 threads at once. kombu's pools allow 10
            # connections and redis-py fails past the limit instead of waiting, so a
            # burst of acks failed (MaxConnectionsError) and those jobs were run
            # again after the visibility timeout. Keep it at or above --concurrency.
            "max_connections": settings.broker_max_connections,
            **sentinel_options(settings.broker_sentinel_master, settings.broker_url,
                               timeout=5),
        },
        # A sentinel:// broker over TLS (ssl_* options on its URL): the data nodes' TLS
        # keywords, kept when kombu moves to the list's next URL (whose own are not).
        "broker_use_ssl": sentinel_broker_tls(settings.broker_url) or False,
        "broker_connection_retry_on_startup": True,
        # Routing: everything on the dedicated queue (COMPACTION_QUEUE, "compaction"), so
        # the service can share a broker.
        # A publisher may pick another queue (CeleryEnqueuer(app, queue=...), a worker
        # with -Q that queue): a job's follow-up and index jobs go back to the queue it
        # came from (workers.tasks.reply_route); these routes serve the rest.
        "task_default_queue": settings.queue,
        "task_queues": (Queue(settings.queue, Exchange(settings.queue),
                              routing_key=settings.queue),),
        # The recall index job rides its job's queue at the lowest priority: workers take
        # it only when no compaction is waiting (workers.tasks.index_recall).
        "task_routes": {RECALL_INDEX_TASK: {"queue": settings.queue,
                                            "priority": RECALL_INDEX_PRIORITY},
                        "compaction.*": {"queue": settings.queue}},
        # Time limits: enforced by prefork only. Under threads the job stops starting
        # LLM calls after the soft limit and each call has its client timeout (see the
        # module docstring); Settings.longest_job_seconds covers both pools.
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


def preload_summarizer_sdk(settings: Settings) -> str | None:
    """Import the configured summarizer's SDK; the module name, or None (offline).

    Called in the worker's main process before the pool starts. Prefork
    children would otherwise each import the SDK on their first job (about
    half a second of CPU each, 32 children at once after every start) and each
    keep a private copy; imported before the fork, its pages are shared. No
    client is built here: sockets must not cross a fork (``workers.runtime``
    builds one per process). A missing SDK stops the start with the extra to
    install, instead of failing every job.
    """
    sdk = SUMMARIZER_SDKS.get(settings.summarizer)
    if sdk is None:
        return None
    module, extra = sdk
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"COMPACTION_SUMMARIZER={settings.summarizer} needs the '{extra}' "
                          f"extra: pip install 'context-compaction[{extra}]' ({exc})") from exc
    return module


def create_app(settings: Settings | None = None) -> Celery:
    settings = settings or load_settings()
    app = Celery("compaction", include=["workers.tasks"])
    app.conf.update(celery_config(settings))
    app.conf.compaction_settings = settings
    return app


def _app_for_startup() -> Celery:
    """The module's app; a configuration error is one line on stderr and exit status 2.

    ``celery -A workers.app worker`` (and Flower, and the image's health
    check) import this module first: without this, a bad setting would be
    Celery's "Unable to load celery application" with a traceback.
    """
    try:
        return create_app()
    except ConfigError as exc:
        _stop_on(exc)


def _stop_on(exc: ConfigError) -> typing.NoReturn:
    """One line on stderr, exit status 2 (SystemExit: Celery's signals swallow Exception)."""
    print(f"configuration error: {exc}", file=sys.stderr, flush=True)
    raise SystemExit(2) from None


app = _app_for_startup()


@celeryd_init.connect
def _select_worker_transport(sender: Any = None, conf: Any = None, **_: Any) -> None:
    """A starting worker (``celery worker``) consumes through :mod:`workers.broker`.

    Chosen here, from the broker URL the worker really starts with, not in
    :func:`celery_config`: code that rebinds the app to another broker later
    (``app.conf.broker_url = "memory://"``, the embedded demo) would keep a
    Redis transport for a URL that is not Redis. An explicit
    ``broker_transport`` is left alone. Publishers and Flower keep kombu's.
    """
    if conf is not None and not conf.get("broker_transport"):
        conf.broker_transport = worker_transport(conf.broker_url)


@celeryd_init.connect
def _select_sentinel_transport(sender: Any = None, conf: Any = None, **_: Any) -> None:
    """A starting worker on a ``sentinel://`` broker consumes through
    :class:`workers.broker.SentinelTransport` (it survives a primary killed mid-job);
    an explicit ``broker_transport`` is left alone."""
    if conf is not None and not conf.get("broker_transport") and is_sentinel_url(
            conf.broker_url):
        use_sentinel_transport()


@celeryd_init.connect
def _warn_on_timing(**_: Any) -> None:
    """A starting worker says so when its visibility timeout is below the longest job."""
    warning = app.conf.compaction_settings.visibility_warning()
    if warning:
        print(warning, file=sys.stderr, flush=True)


@celeryd_after_setup.connect
def _warn_on_queue(sender: Any = None, instance: Any = None, **_: Any) -> None:
    """A worker started with ``-Q`` queues that leave out ``COMPACTION_QUEUE`` says so:
    the guard, the CLI and the server publish there, and its jobs would never run (a
    Procfile or image command that names ``compaction`` with the setting changed)."""
    queue: str = app.conf.compaction_settings.queue
    queues = getattr(getattr(getattr(instance, "app", None), "amqp", None), "queues", None)
    consumed = set(getattr(queues, "consume_from", None) or queues or ())
    if consumed and queue not in consumed:
        print(f"warning: COMPACTION_QUEUE is {queue!r} but this worker consumes "
              f"{', '.join(sorted(consumed))}: the jobs published to {queue!r} do not run "
              f"here (start it with -Q {queue})", file=sys.stderr, flush=True)


@worker_init.connect
def _preload_on_worker_start(sender: Any = None, **_: Any) -> None:
    """Before the pool starts (and forks): see :func:`preload_summarizer_sdk`.

    Celery's ``Signal.send`` logs and swallows a receiver's exception, so a
    ConfigError raised here let the worker print "ready" and fail every job;
    SystemExit is not an Exception and stops the start.
    """
    settings: Settings = app.conf.compaction_settings
    try:
        module = preload_summarizer_sdk(settings)
    except ConfigError as exc:
        _stop_on(exc)
    if module:
        log.info("summarizer SDK %s imported before the pool starts", module)


# Observability (docs/observability.md): /metrics on COMPACTION_METRICS_PORT, JSON logs;
# the sweep re-publishing lost jobs (workers/sweep.py, COMPACTION_SWEEP_SECONDS).
from workers import logging_setup, metrics, sweep  # noqa: E402, F401  (signal receivers)

__all__ = ["SUMMARIZER_SDKS", "app", "celery_config", "create_app", "preload_summarizer_sdk",
           "restore_lock_seconds"]
