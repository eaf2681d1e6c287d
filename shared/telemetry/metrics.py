"""Metrics facade: what the guard and the workers count, behind one small protocol.

The I/O edges (guard shells, Celery tasks, the summarizer engine) call the
process's :func:`get_metrics`; the default :class:`NullMetrics` does
nothing, so nothing here costs anything until a process opts in with
:func:`set_metrics`. :class:`PrometheusMetrics` imports ``prometheus_client``
(the ``metrics`` extra) only when it is built, and registers on the
``CollectorRegistry`` it is given, so an agent process can mount it beside
its own metrics. The pure core (``shared.core``) never imports this module.

Names follow Prometheus conventions: the ``compaction_`` prefix, base units
in the name (``_seconds``, ``_tokens``), ``_total`` for counters. Every name
is in :data:`METRIC_NAMES` (as exposed; a counter's ``_total`` included).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, Protocol

PREFIX = "compaction_"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# Seconds: the guard's prepare is sub-millisecond, a job is seconds to minutes.
PREPARE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 1.0)
JOB_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
CALL_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)
LAG_SECONDS_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)
LAG_MESSAGES_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 400, 1000, 5000)
# A sweep is one SCAN pass: milliseconds on a small store, 1.7 s for 1.5 million keys.
SWEEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
SWEEP_OUTCOMES = ("done", "locked", "store_unavailable", "failed")

COMPACTION_KINDS = ("cheap", "llm", "offline", "truncation", "recovery")

METRIC_NAMES = (
    "compaction_guard_prepare_duration_seconds",
    "compaction_guard_view_tokens_total",
    "compaction_guard_log_tokens_total",
    "compaction_guard_saved_tokens_total",
    "compaction_compactions_total",
    "compaction_overflow_recoveries_total",
    "compaction_silent_truncation_suspected_total",
    "compaction_jobs_total",
    "compaction_job_duration_seconds",
    "compaction_summarizer_calls_total",
    "compaction_summarizer_call_duration_seconds",
    "compaction_summarizer_input_tokens_total",
    "compaction_summarizer_output_tokens_total",
    "compaction_summarizer_errors_total",
    "compaction_worker_lag_messages",
    "compaction_worker_lag_seconds",
    "compaction_queue_depth",
    "compaction_lease_contention_total",
    "compaction_enqueue_total",
    "compaction_sweeps_total",
    "compaction_sweep_duration_seconds",
    "compaction_sweep_pending_flags_total",
    "compaction_sweep_stale_flags_total",
    "compaction_sweep_republished_total",
    "compaction_sweep_publish_failures_total",
)

# The processes that record each metric: ``guard`` (an agent process, ``compaction serve``)
# or ``worker``. A process built for one role does not export the other role's series
# before it records one (tests/test_observability_targets.py checks that every metric a dashboard
# panel queries is exported by a service docker/prometheus.yml scrapes).
ROLES = ("guard", "worker")
GUARD_ONLY = frozenset({
    "compaction_guard_prepare_duration_seconds", "compaction_guard_view_tokens_total",
    "compaction_guard_log_tokens_total", "compaction_guard_saved_tokens_total",
    "compaction_overflow_recoveries_total", "compaction_silent_truncation_suspected_total",
    "compaction_enqueue_total"})
BOTH = frozenset({"compaction_compactions_total"})
METRIC_ROLES: dict[str, frozenset[str]] = {
    name: frozenset({"guard"}) if name in GUARD_ONLY
    else frozenset(ROLES) if name in BOTH else frozenset({"worker"})
    for name in METRIC_NAMES}


class Metrics(Protocol):
    """Every measurement the project takes; one method per decision."""

    def prepare_done(self, seconds: float, *, view_tokens: int, log_tokens: int,
                     path: str = "prepare") -> None:
        """A view was built (``path``: ``prepare`` or ``recover``); tokens sent vs the log."""

    def compaction(self, kind: str, outcome: str) -> None:
        """A compaction decision: ``kind`` in :data:`COMPACTION_KINDS`; ``outcome`` e.g.
        ``compacted``, ``lost_swap``, ``covered``, ``conflict``."""

    def recovery(self, outcome: str) -> None:
        """``recover()`` after a provider error: ``recovered``, ``not_overflow`` or
        ``unrecognised_overflow`` (taken for one by the refused request's size)."""

    def enqueue(self, outcome: str) -> None:
        """A job the guard asked for: ``published``, ``republished`` (again: the session's
        pending flag stood unclaimed past its stale age, its job lost), or ``failed`` (the
        broker refused or was unreachable; the session compacts only by truncation until
        one gets through)."""

    def silent_truncation(self) -> None:
        """The provider reported far fewer prompt tokens than were sent."""

    def job_done(self, task: str, status: str, seconds: float) -> None:
        """A Celery job ended (``status``: the job's status, or ``error``/``retry``)."""

    def worker_lag(self, *, messages: int | None = None, seconds: float | None = None) -> None:
        """How far behind the job started: messages since the watermark, seconds queued."""

    def summarizer_call(self, provider: str, model: str, seconds: float, *,
                        input_tokens: int = 0, output_tokens: int = 0,
                        error: str | None = None) -> None:
        """One summarizer model call, with its reported usage or the error's type."""

    def summarizer_skipped(self, provider: str, reason: str) -> None:
        """A summarizer call not made (``cooldown``: the provider told another call of
        the fleet to wait, :mod:`workers.summarizer.cooldown`): counted with the
        errors, not with the calls."""

    def lease_contention(self, result: str) -> None:
        """A job found the session's lease taken (``busy``: its request was handed over)."""

    def queue_depth_source(self, read: Callable[[], float]) -> None:
        """``read()`` gives the broker queue's depth when the metrics are collected."""

    def sweep_done(self, outcome: str, seconds: float | None = None) -> None:
        """One try of the workers' lost-job sweep (:data:`SWEEP_OUTCOMES`): ``done``,
        ``locked`` (another worker holds the period's lock: nothing read),
        ``store_unavailable`` or ``failed`` (another error); ``seconds`` when it took
        the lock and swept (None: no sweep ran, e.g. the lock's command failed)."""

    def sweep_flags(self, *, seen: int, stale: int, republished: int, failed: int) -> None:
        """What one sweep found, also when cut short: pending flags read, stale ones,
        jobs published again, publishes that failed (retried a stale period later)."""


class NullMetrics:
    """Measures nothing: the default of every process."""

    def prepare_done(self, seconds: float, *, view_tokens: int, log_tokens: int,
                     path: str = "prepare") -> None:
        return None

    def compaction(self, kind: str, outcome: str) -> None:
        return None

    def recovery(self, outcome: str) -> None:
        return None

    def enqueue(self, outcome: str) -> None:
        pass

    def silent_truncation(self) -> None:
        return None

    def job_done(self, task: str, status: str, seconds: float) -> None:
        return None

    def worker_lag(self, *, messages: int | None = None, seconds: float | None = None) -> None:
        return None

    def summarizer_call(self, provider: str, model: str, seconds: float, *,
                        input_tokens: int = 0, output_tokens: int = 0,
                        error: str | None = None) -> None:
        return None

    def summarizer_skipped(self, provider: str, reason: str) -> None:
        return None

    def lease_contention(self, result: str) -> None:
        return None

    def queue_depth_source(self, read: Callable[[], float]) -> None:
        return None

    def sweep_done(self, outcome: str, seconds: float | None = None) -> None:
        return None

    def sweep_flags(self, *, seen: int, stale: int, republished: int, failed: int) -> None:
        return None


def extra_missing(exc: ModuleNotFoundError) -> ModuleNotFoundError:
    """The error for prometheus_client missing: names the extra that installs it (the
    missing module stays named, as an import error's)."""
    return ModuleNotFoundError("Prometheus metrics need the 'metrics' extra: "
                               "pip install 'context-compaction[metrics]'", name=exc.name)


class PrometheusMetrics:
    """:class:`Metrics` on prometheus_client, registered on ``registry``.

    ``registry``: the caller's ``CollectorRegistry`` (default: a new one, so
    two instances never collide; pass ``prometheus_client.REGISTRY`` to
    join the process's default one). Thread-safe, as prometheus_client is.

    ``role``: what the process is (:data:`ROLES`), ``guard`` by default (an
    agent process, ``compaction serve``); the workers build theirs with
    ``worker``. A labelled metric has no series until something is recorded;
    an unlabelled one would be exported as 0 from its creation, so those of
    the other role (the guard's silent-truncation counter, the workers' lag
    histograms and sweep counters) are created on their first record only: a
    worker does not show a flat "0 silent truncations" that nobody measures.
    """

    def __init__(self, registry: Any = None, *, role: str = "guard") -> None:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, not {role!r}")
        try:
            import prometheus_client as prom
        except ModuleNotFoundError as exc:
            raise extra_missing(exc) from exc
        self.role = role
        self._prom = prom
        self._lazy_lock = threading.Lock()
        self.registry = registry if registry is not None else prom.CollectorRegistry()
        reg = self.registry
        p = PREFIX
        self.prepare_seconds = prom.Histogram(
            p + "guard_prepare_duration_seconds", "Time the guard took to build a view.",
            ["path"], buckets=PREPARE_BUCKETS, registry=reg)
        self.view_tokens = prom.Counter(
            p + "guard_view_tokens", "Estimated prompt tokens of the views the guard built.",
            ["path"], registry=reg)
        self.log_tokens = prom.Counter(
            p + "guard_log_tokens", "Tokens the same requests would have had with the whole "
            "log (no compaction).", ["path"], registry=reg)
        self.saved_tokens = prom.Counter(
            p + "guard_saved_tokens", "Log tokens minus view tokens: what compaction saved.",
            ["path"], registry=reg)
        self.compactions = prom.Counter(
            p + "compactions", "Compactions by kind (cheap, llm, offline, truncation, "
            "recovery) and outcome.", ["kind", "outcome"], registry=reg)
        self.recoveries = prom.Counter(
            p + "overflow_recoveries", "recover() calls after a provider error, by outcome.",
            ["outcome"], registry=reg)
        self._silent: Any = None
        self.jobs = prom.Counter(p + "jobs", "Celery jobs by task and outcome.",
                                 ["task", "outcome"], registry=reg)
        self.job_seconds = prom.Histogram(
            p + "job_duration_seconds", "Celery job duration.", ["task"],
            buckets=JOB_BUCKETS, registry=reg)
        self.calls = prom.Counter(p + "summarizer_calls", "Summarizer model calls.",
                                  ["provider", "model"], registry=reg)
        self.call_seconds = prom.Histogram(
            p + "summarizer_call_duration_seconds", "Summarizer model call duration.",
            ["provider"], buckets=CALL_BUCKETS, registry=reg)
        self.tokens_in = prom.Counter(
            p + "summarizer_input_tokens", "Prompt tokens the summarizer provider reported.",
            ["provider", "model"], registry=reg)
        self.tokens_out = prom.Counter(
            p + "summarizer_output_tokens", "Completion tokens the summarizer provider "
            "reported.", ["provider", "model"], registry=reg)
        self.errors = prom.Counter(p + "summarizer_errors", "Failed summarizer calls by "
                                   "provider and error type.", ["provider", "error"],
                                   registry=reg)
        self._lag: Any = None
        self._sweep: Any = None
        self.lease = prom.Counter(p + "lease_contention", "Jobs that found the session's "
                                  "lease taken.", ["result"], registry=reg)
        self.enqueues = prom.Counter(p + "enqueue", "Jobs the guard asked for, by outcome "
                                     "(published, republished, failed).", ["outcome"],
                                     registry=reg)
        self._prepare_children: dict[str, tuple[Any, Any, Any, Any]] = {}
        self.depth = QueueDepthCollector()
        reg.register(self.depth)
        if role == "guard":
            self.silent_counter()
        else:
            self.lag_histograms()
            self.sweep_metrics()

    def silent_counter(self) -> Any:
        """``compaction_silent_truncation_suspected_total``, created on first use."""
        if self._silent is None:
            with self._lazy_lock:
                if self._silent is None:
                    self._silent = self._prom.Counter(
                        PREFIX + "silent_truncation_suspected", "Usage reports far below "
                        "what was sent (or above the window): silent truncation upstream.",
                        registry=self.registry)
        return self._silent

    def lag_histograms(self) -> tuple[Any, Any]:
        """``compaction_worker_lag_messages`` and ``_seconds``, created on first use."""
        if self._lag is None:
            with self._lazy_lock:
                if self._lag is None:
                    prom, reg = self._prom, self.registry
                    self._lag = (
                        prom.Histogram(PREFIX + "worker_lag_messages", "Messages since the "
                                       "watermark when a job starts.",
                                       buckets=LAG_MESSAGES_BUCKETS, registry=reg),
                        prom.Histogram(PREFIX + "worker_lag_seconds", "Seconds from enqueue "
                                       "to the job's start (jobs whose publisher sent its "
                                       "time).", buckets=LAG_SECONDS_BUCKETS, registry=reg))
        lag: tuple[Any, Any] = self._lag
        return lag

    def sweep_metrics(self) -> tuple[Any, ...]:
        """The sweep's series (``compaction_sweep*``), created on first use: runs by
        outcome, duration, then flags seen, stale, published again, failed publishes."""
        if self._sweep is None:
            with self._lazy_lock:
                if self._sweep is None:
                    prom, reg, p = self._prom, self.registry, PREFIX + "sweep_"
                    self._sweep = (
                        prom.Counter(PREFIX + "sweeps", "Tries of the lost-job sweep by "
                                     "outcome (done, locked, store_unavailable, failed).",
                                     ["outcome"], registry=reg),
                        prom.Histogram(p + "duration_seconds", "Duration of the sweeps "
                                       "that took the lock (those cut short included).",
                                       buckets=SWEEP_BUCKETS, registry=reg),
                        prom.Counter(p + "pending_flags", "Pending flags the sweep read.",
                                     registry=reg),
                        prom.Counter(p + "stale_flags", "Pending flags the sweep found past "
                                     "their stale age.", registry=reg),
                        prom.Counter(p + "republished", "Jobs the sweep published again: "
                                     "each was lost.", registry=reg),
                        prom.Counter(p + "publish_failures", "Jobs the sweep could not "
                                     "publish again (a later sweep retries).", registry=reg))
        found: tuple[Any, ...] = self._sweep
        return found

    def prepare_done(self, seconds: float, *, view_tokens: int, log_tokens: int,
                     path: str = "prepare") -> None:
        # The hot path: the labelled children are looked up once per path, not per call.
        children = self._prepare_children.get(path)
        if children is None:
            children = self._prepare_children[path] = (
                self.prepare_seconds.labels(path), self.view_tokens.labels(path),
                self.log_tokens.labels(path), self.saved_tokens.labels(path))
        latency, view, log, saved = children
        latency.observe(seconds)
        view.inc(max(0, view_tokens))
        log.inc(max(0, log_tokens))
        saved.inc(max(0, log_tokens - view_tokens))

    def compaction(self, kind: str, outcome: str) -> None:
        self.compactions.labels(kind, outcome).inc()

    def recovery(self, outcome: str) -> None:
        self.recoveries.labels(outcome).inc()

    def enqueue(self, outcome: str) -> None:
        self.enqueues.labels(outcome).inc()

    def silent_truncation(self) -> None:
        self.silent_counter().inc()

    def job_done(self, task: str, status: str, seconds: float) -> None:
        self.jobs.labels(task, status).inc()
        self.job_seconds.labels(task).observe(seconds)

    def worker_lag(self, *, messages: int | None = None, seconds: float | None = None) -> None:
        lag_messages, lag_seconds = self.lag_histograms()
        if messages is not None:
            lag_messages.observe(max(0, messages))
        if seconds is not None:
            lag_seconds.observe(max(0.0, seconds))

    def summarizer_call(self, provider: str, model: str, seconds: float, *,
                        input_tokens: int = 0, output_tokens: int = 0,
                        error: str | None = None) -> None:
        self.calls.labels(provider, model).inc()
        self.call_seconds.labels(provider).observe(seconds)
        if error is not None:  # a rejected reply was billed all the same: its tokens count
            self.errors.labels(provider, error).inc()
        self.tokens_in.labels(provider, model).inc(max(0, input_tokens))
        self.tokens_out.labels(provider, model).inc(max(0, output_tokens))

    def summarizer_skipped(self, provider: str, reason: str) -> None:
        self.errors.labels(provider, reason).inc()

    def lease_contention(self, result: str) -> None:
        self.lease.labels(result).inc()

    def queue_depth_source(self, read: Callable[[], float]) -> None:
        self.depth.add(read)

    def sweep_done(self, outcome: str, seconds: float | None = None) -> None:
        runs, duration, *_ = self.sweep_metrics()
        runs.labels(outcome).inc()
        if seconds is not None:
            duration.observe(max(0.0, seconds))

    def sweep_flags(self, *, seen: int, stale: int, republished: int, failed: int) -> None:
        for counter, n in zip(self.sweep_metrics()[2:], (seen, stale, republished, failed),
                              strict=True):
            if n > 0:
                counter.inc(n)

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format (what /metrics serves)."""
        from prometheus_client import generate_latest

        data: bytes = generate_latest(self.registry)
        return data


class QueueDepthCollector:
    """``compaction_queue_depth``, read from its sources at each scrape.

    A collector rather than a gauge with a callback: it works the same in
    prometheus_client's multiprocess mode, where the serving process (not
    the one that ran the jobs) registers it.
    """

    def __init__(self) -> None:
        self._sources: list[Callable[[], float]] = []
        self._lock = threading.Lock()

    def add(self, read: Callable[[], float]) -> None:
        with self._lock:
            self._sources.append(read)

    def collect(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        with self._lock:
            sources = list(self._sources)
        if not sources:
            return
        total = 0.0
        for read in sources:
            try:
                total += float(read())
            except Exception:  # a broker hiccup must not break the scrape
                total = float("nan")
                break
        yield GaugeMetricFamily(PREFIX + "queue_depth", "Jobs waiting in the broker queue "
                                "(read at scrape time).", value=total)


_current: Metrics = NullMetrics()


def get_metrics() -> Metrics:
    """The process's metrics (a :class:`NullMetrics` until :func:`set_metrics`)."""
    return _current


def set_metrics(metrics: Metrics | None) -> Metrics:
    """Make ``metrics`` the process's metrics (None: back to :class:`NullMetrics`)."""
    global _current
    _current = metrics if metrics is not None else NullMetrics()
    return _current


def metrics_enabled() -> bool:
    return not isinstance(_current, NullMetrics)


def install_prometheus(registry: Any = None, *, role: str = "guard") -> PrometheusMetrics:
    """The process's :class:`PrometheusMetrics`, built on ``registry`` (for ``role``) the
    first time."""
    current = _current
    if isinstance(current, PrometheusMetrics) and registry in (None, current.registry):
        return current
    metrics = PrometheusMetrics(registry, role=role)
    set_metrics(metrics)
    return metrics


def multiprocess_dir() -> str | None:
    """``PROMETHEUS_MULTIPROC_DIR`` when set: the process is one of several that record
    into that directory (prometheus_client's multiprocess mode), None otherwise."""
    return os.environ.get(MULTIPROC_ENV) or None


def served_registry(registry: Any = None) -> Any:
    """What a /metrics endpoint of this process should serve.

    The process's :class:`PrometheusMetrics` (installed on ``registry`` if it
    is not yet). In multiprocess mode (:func:`multiprocess_dir`, ``registry``
    not given) every process records into the directory, so the endpoint
    serves a fresh registry whose ``MultiProcessCollector`` sums them all:
    one process's own registry would show a fraction of the traffic that
    changes with the process a scrape reaches.
    """
    metrics = install_prometheus(registry)
    if registry is not None or multiprocess_dir() is None:
        return metrics.registry
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    merged = CollectorRegistry()
    MultiProcessCollector(merged)  # type: ignore[no-untyped-call]
    merged.register(metrics.depth)  # read at scrape time, by the process scraped
    return merged


def metrics_app(registry: Any = None) -> Any:
    """An ASGI app serving the process's metrics (:func:`served_registry`).

    Installs :class:`PrometheusMetrics` (on ``registry``) as the process's
    metrics if it is not already, so the guard and everything else in the
    process report to what this app serves. Mounted
    (``app.mount("/metrics", metrics_app())``) Starlette answers ``/metrics``
    with a redirect to ``/metrics/``; :class:`MetricsEndpoint` serves the
    exact path.
    """
    try:
        from prometheus_client import make_asgi_app
    except ModuleNotFoundError as exc:
        raise extra_missing(exc) from exc
    return make_asgi_app(served_registry(registry))


class MetricsEndpoint:
    """:func:`metrics_app` as a route's endpoint: ``Route("/metrics", MetricsEndpoint())``.

    An instance (not a function), so Starlette passes it the raw ASGI call
    instead of a ``Request``; the route answers the path itself, no redirect.
    """

    def __init__(self, registry: Any = None) -> None:
        self.app = metrics_app(registry)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


__all__ = ["COMPACTION_KINDS", "METRIC_NAMES", "METRIC_ROLES", "MULTIPROC_ENV", "PREFIX",
           "ROLES", "SWEEP_OUTCOMES", "Metrics",
           "MetricsEndpoint", "NullMetrics", "PrometheusMetrics", "get_metrics",
           "install_prometheus", "metrics_app", "metrics_enabled", "multiprocess_dir",
           "served_registry", "set_metrics"]
