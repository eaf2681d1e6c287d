"""Worker observability: the /metrics endpoint, and a span and metrics around every job.

``COMPACTION_METRICS_PORT=9808`` makes each worker process serve Prometheus
metrics on that port (the ``metrics`` extra), started from Celery's
``celeryd_after_setup`` signal (``worker_init`` for a bare ``WorkController``,
which sends no ``celeryd_after_setup``), so a worker that does not set it
imports nothing. ``celeryd_after_setup`` comes after Celery has set up logging
(and after ``-Q``, before the pool forks): the "serving" line and the error of a
taken port are in the worker's log format (``COMPACTION_LOG_FORMAT=json``
included); at ``worker_init`` they went to Python's last-resort handler, a bare
line (or, the INFO one, nowhere).

Several workers:

- **threads or solo pool** (the default: threads): jobs run in the worker's
  one process, which serves its own registry. One process per container
  (compose ``--scale worker=N``): every container uses the same port in its
  own network namespace, and Prometheus scrapes each. Several worker
  processes on one host need one port each (``COMPACTION_METRICS_PORT`` per
  process); a port already taken is logged as an error and the worker runs
  on without metrics.
- **prefork**: jobs run in child processes. With ``PROMETHEUS_MULTIPROC_DIR``
  set (an empty directory, emptied before each start) the children write
  their metrics there and the main process serves them all
  (prometheus_client's multiprocess mode). Without it the worker logs an
  error and serves nothing: per-child registries would each count a
  fraction of the jobs.

:func:`observed` wraps a task body: a CONSUMER span whose parent is the
trace context the publisher put in the message headers (the agent's
``record_turn``), log lines bound to the session, tenant and job, and the
job metrics: outcome and duration, compactions by kind, lease contention,
worker lag (messages since the watermark; seconds since the publish when the
publisher sent its time, ``compaction_sent_at``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from celery.signals import (
    celeryd_after_setup,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
)

from shared.core.errors import SummarizerUnavailable
from shared.enqueue import QUEUE
from shared.telemetry.logs import log_context
from shared.telemetry.metrics import MULTIPROC_ENV, get_metrics, install_prometheus
from shared.telemetry.propagation import SENT_AT_HEADER
from shared.telemetry.tracing import context_from, span

log = logging.getLogger("compaction.metrics")
# Kombu's Redis transport defaults (kombu.transport.redis): one list per priority step.
REDIS_PRIORITY_SEP = "\x06\x16"
REDIS_PRIORITY_STEPS = (0, 3, 6, 9)
T = TypeVar("T")
_server: Any = None  # (server, thread) of the running endpoint, if any


def _settings(sender: Any) -> Any:
    app = getattr(sender, "app", None)
    if app is None:
        from workers.app import app as default_app

        app = default_app
    return app.conf.compaction_settings


def _is_prefork(sender: Any) -> bool:
    from celery import concurrency

    pool = concurrency.get_implementation(getattr(sender, "pool_cls", None) or "prefork")
    return getattr(pool, "__module__", "").endswith("prefork")


def queue_depth_reader(broker_url: str, queues: Iterable[str] = (QUEUE,),
                       key_prefix: str = "", *, sep: str = REDIS_PRIORITY_SEP,
                       priority_steps: Iterable[int] = REDIS_PRIORITY_STEPS,
                       ) -> Callable[[], float] | None:
    """A function returning the jobs waiting in ``queues`` (Redis brokers), or None.

    Kombu's Redis transport keeps one list per queue and priority step (a
    job at priority 0 in ``name``, one at step 9 in ``name<sep>9``: the
    recall index jobs), so every list of every queue is summed.
    """
    if not broker_url.startswith(("redis://", "rediss://")) or ";" in broker_url:
        return None
    import redis

    client = redis.Redis.from_url(broker_url, socket_timeout=1, socket_connect_timeout=1)
    keys = [key_prefix + queue + (f"{sep}{step}" if step else "")
            for queue in dict.fromkeys(queues) for step in dict.fromkeys(priority_steps)]

    def read() -> float:
        with client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.llen(key)
            return float(sum(int(n) for n in pipe.execute()))

    return read


def consumed_queues(sender: Any) -> list[str]:
    """The queues a starting worker consumes (``-Q``, else the app's queues)."""
    app = getattr(sender, "app", None)
    queues = getattr(getattr(app, "amqp", None), "queues", None)
    active = getattr(queues, "consume_from", None) if queues is not None else None
    names = [str(getattr(queue, "name", name)) for name, queue in (active or {}).items()]
    return names or [QUEUE]


def start_metrics_server(port: int, *, multiprocess: bool = False,
                         broker_url: str | None = None, key_prefix: str = "",
                         queues: Iterable[str] = (QUEUE,),
                         transport_options: Mapping[str, Any] | None = None) -> Any:
    """Serve /metrics on ``port``; the registry served (None when the port is taken).

    ``queues``: whose waiting jobs ``compaction_queue_depth`` counts (the
    worker's own); ``transport_options``: the broker's (key prefix, priority
    steps and separator of the Redis transport).
    """
    global _server
    import prometheus_client as prom

    if multiprocess:
        from prometheus_client import multiprocess as mp
        from prometheus_client.core import CollectorRegistry

        from shared.telemetry.metrics import QueueDepthCollector

        registry = CollectorRegistry()
        mp.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        depth = QueueDepthCollector()
        registry.register(depth)
        add_depth: Callable[[Callable[[], float]], None] = depth.add
    else:
        metrics = install_prometheus(role="worker")
        registry = metrics.registry
        add_depth = metrics.queue_depth_source
    if broker_url:
        options = transport_options or {}
        reader = queue_depth_reader(
            broker_url, queues, key_prefix,
            sep=str(options.get("sep", REDIS_PRIORITY_SEP)),
            priority_steps=options.get("priority_steps", REDIS_PRIORITY_STEPS))
        if reader is not None:
            add_depth(reader)
        else:
            log.warning("metrics: compaction_queue_depth is read from a single Redis broker "
                        "only; COMPACTION_BROKER_URL is %s, so this worker exports no queue "
                        "depth", _broker_kind(broker_url))
    try:
        _server = prom.start_http_server(port, registry=registry)
    except OSError as exc:
        log.error("metrics: cannot serve on port %d (%s); running without /metrics "
                  "(give each worker process on a host its own COMPACTION_METRICS_PORT)",
                  port, exc)
        return None
    log.info("metrics: serving /metrics on port %d (pid %d%s)", port, os.getpid(),
             ", multiprocess" if multiprocess else "")
    return registry


def _broker_kind(broker_url: str) -> str:
    """What a broker URL is, without its host or credentials (for a log line)."""
    if ";" in broker_url:
        return "a failover list"
    scheme = broker_url.split("://", 1)[0] if "://" in broker_url else "?"
    return f"a {scheme}:// URL"


def _start_on_worker_init(sender: Any = None, **_: Any) -> None:
    """A bare ``WorkController`` sends no ``celeryd_after_setup``: start here for it."""
    from celery.apps.worker import Worker

    if not isinstance(sender, Worker):
        _start(sender)


def _start_after_setup(sender: Any = None, instance: Any = None, **_: Any) -> None:
    """``celery worker`` (``celery.apps.worker.Worker``): logging is set up by now."""
    _start(instance)


def _start(sender: Any) -> None:
    settings = _settings(sender)
    if settings.metrics_port is None:
        return
    options = dict(settings_broker_options(sender))
    prefix = str(options.get("global_keyprefix", ""))
    where = {"broker_url": settings.broker_url, "key_prefix": prefix,
             "queues": consumed_queues(sender), "transport_options": options}
    if _is_prefork(sender):
        if not os.environ.get(MULTIPROC_ENV):
            log.error("metrics: the prefork pool runs jobs in child processes; set %s to an "
                      "empty directory (prometheus_client multiprocess mode) or use "
                      "--pool threads. No /metrics served.", MULTIPROC_ENV)
            return
        if start_metrics_server(settings.metrics_port, multiprocess=True, **where) is not None:
            # The main process records too, into the directory: the lost-job sweep runs
            # there (workers.sweep). Children forked later reuse the instance; its values
            # move to a file of the child's pid at its first record (prometheus_client).
            install_prometheus(role="worker")
        return
    start_metrics_server(settings.metrics_port, **where)


def settings_broker_options(sender: Any) -> Mapping[str, Any]:
    app = getattr(sender, "app", None)
    return (app.conf.broker_transport_options or {}) if app is not None else {}


def _child_metrics(**_: Any) -> None:
    """A prefork child in multiprocess mode records into the shared directory."""
    if os.environ.get(MULTIPROC_ENV):
        from workers.app import app

        if app.conf.compaction_settings.metrics_port is not None:
            install_prometheus(role="worker")


def _child_exit(pid: int | None = None, **_: Any) -> None:
    if os.environ.get(MULTIPROC_ENV) and pid is not None:
        from prometheus_client import multiprocess as mp

        mp.mark_process_dead(pid)  # type: ignore[no-untyped-call]


# Celery's signals are untyped: connected by call, not as decorators (mypy --strict).
worker_init.connect(_start_on_worker_init, weak=False)
celeryd_after_setup.connect(_start_after_setup, weak=False)
worker_process_init.connect(_child_metrics, weak=False)
worker_process_shutdown.connect(_child_exit, weak=False)


def _headers(request: Any) -> dict[str, Any]:
    """The message headers a task sees (custom ones are attributes of the request too)."""
    found: dict[str, Any] = {}
    headers = getattr(request, "headers", None)
    if isinstance(headers, Mapping):
        found.update(headers)
    for key in ("traceparent", "tracestate", SENT_AT_HEADER):
        value = getattr(request, key, None)
        if value is not None:
            found.setdefault(key, value)
    return found


def destination(request: Any) -> str:
    """The queue a job came from: its delivery's routing key (a direct queue's name,
    as :func:`workers.tasks.reply_route` reads it), else the default queue."""
    info = getattr(request, "delivery_info", None)
    key = info.get("routing_key") if isinstance(info, Mapping) else None
    return key if isinstance(key, str) and key else QUEUE


def observed(task: Any, session_id: str, tenant: str,
             run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one job body with its span, bound log ids and metrics (see the module doc)."""
    name = str(task.name).rsplit(".", 1)[-1]
    request = task.request
    headers = _headers(request)
    metrics = get_metrics()
    sent_at = headers.get(SENT_AT_HEADER)
    if sent_at is not None:
        with contextlib.suppress(TypeError, ValueError):
            metrics.worker_lag(seconds=time.time() - float(sent_at))
    attributes = {"messaging.system": "celery", "messaging.operation.type": "process",
                  "messaging.destination.name": destination(request),
                  "messaging.message.id": request.id,
                  "compaction.session_id": session_id, "compaction.tenant": tenant,
                  "compaction.attempt": (request.retries or 0) + 1}
    started = time.perf_counter()
    status = "error"
    with log_context(session_id=session_id, tenant=tenant, job_id=request.id, task=name), \
            span(f"compaction.{name}", attributes, kind="consumer",
                 parent=context_from(headers)) as current:
        try:
            result = run()
            status = str(result.get("status", "unknown"))
            _record_result(result, current)
            return result
        except SummarizerUnavailable:
            status = "retry"
            raise
        finally:
            metrics.job_done(name, status, time.perf_counter() - started)


def _record_result(result: Mapping[str, Any], current: Any) -> None:
    metrics = get_metrics()
    status = result.get("status")
    current.set_attributes({f"compaction.{key}": result[key] for key in (
        "status", "summary_kind", "watermark_before", "watermark_after", "tokens_before",
        "tokens_after", "messages_before", "attempts") if result.get(key) not in (None, "")})
    if status == "busy":
        metrics.lease_contention("busy")
        return
    if "messages_before" in result:
        metrics.worker_lag(messages=int(result["messages_before"]))


def record_outcome(outcome: T) -> T:
    """Count one compaction a job ran (its own request, or one it took over), by kind.

    ``compacted`` carries the summary's kind (``llm``, ``offline``); every
    compare-and-swap it lost (``covered``, ``conflict``: the outcome's
    ``lost_swaps``, those a later attempt made up for included) has no
    summary, so its kind is ``summary``. Skips are not compactions (they are
    in ``compaction_jobs_total``).
    """
    metrics = get_metrics()
    status = getattr(outcome, "status", "")
    lost = getattr(outcome, "lost_swaps", None)
    if lost is None:  # an outcome without the list: its own status is its one lost swap
        lost = [status] if status in ("covered", "conflict") else []
    for swap in lost:
        metrics.compaction("summary", swap)
    if status == "compacted":
        metrics.compaction(getattr(outcome, "summary_kind", "") or "summary", status)
    return outcome


__all__ = ["MULTIPROC_ENV", "SENT_AT_HEADER", "consumed_queues", "destination", "observed",
           "queue_depth_reader",
           "record_outcome", "start_metrics_server"]
