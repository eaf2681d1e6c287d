"""The pending sweep: re-publish summary jobs that were lost, without waiting for a turn.

Why. kombu's Redis transport pops a message (``BRPOP``) and only then records it
as unacknowledged: a worker SIGKILLed in between, or a Redis restart, loses the
job. The session keeps its pending flag (``shared.store.lease``), so no later
job is published for it until the flag goes stale and the session's *next*
append re-arms it (``append.lua``). A session with no next turn stayed over its
trigger, unsummarized, for good.

What. Every ``COMPACTION_SWEEP_SECONDS`` (60 s; 0: off) one worker of the
deployment SCANs the store for pending flags (``<prefix>:{*}:pending``: every
tenant; on a Redis Cluster every primary, redis-py's cluster ``scan_iter``),
reads their ``PTTL`` in one pipeline per SCAN batch, keeps those older than the
stale age (:func:`shared.store.commands.flag_stale`, the append's rule) and,
for each, runs ``rearm_lost.lua``: the flag is set again, young, only if it is
still stale and no worker holds the session's lease. The caller whose script
re-armed it publishes ``maybe_summarize``, as a job's follow-up is published
(``app.send_task`` to ``COMPACTION_QUEUE``). Two sweepers, or a sweeper and an
append, therefore publish once per flag and stale period; a duplicate job
would be harmless anyway (lease, compare-and-swap). A publish that fails
leaves the flag re-armed without a job: the next stale period brings it back.

One sweeper per period: a lock ``SET <prefix>:sweep:lock NX PX <period>`` on
the store, not released after the sweep (its expiry is the rate). Every worker
tries it four times a period, so a sweep follows the lock's expiry within a
quarter period whichever workers are alive; a failed try is one command.

Timer thread, not Celery beat: beat is one more process to run (and to keep to
exactly one), and the Quickstart, the Procfile and the compose file start
workers only. The thread starts on ``worker_ready`` (``celery worker``, any
pool: it runs in the main process) and stops on ``worker_shutdown``; an
in-process worker (``celery.contrib.testing``, the embedded demo) sends no
``worker_ready`` and does not sweep. The store client is the sweep's own (one
connection), built from the worker's settings.

Cost: a SCAN walks the whole keyspace of the store's database (``COUNT``
:data:`SCAN_COUNT` per call, about 1 ms of Redis time each: 1.5 million keys
took 1,501 calls, 1.4 s of Redis time, 1.7 s for the sweep), once per period
for the deployment, plus a PTTL per flag found (only sessions with a job queued
have one). A keyspace of tens of millions of keys wants a longer period.

Metrics (the process's :func:`~shared.telemetry.metrics.get_metrics`, read at each
try: nothing without ``COMPACTION_METRICS_PORT``): every try of the lock counts in
``compaction_sweeps_total`` by outcome, a sweep that ran its duration, and a sweep
its flags read, stale, published again and failed, also when an error cut it short.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery.signals import worker_ready, worker_shutdown

from shared.core.errors import StoreUnavailable
from shared.enqueue import TASK_MAYBE_SUMMARIZE
from shared.store.commands import flag_stale, rearm_lost_command
from shared.store.keys import SessionKeys, pending_pattern, session_of_pending
from shared.store.sessions import SessionStore, redis_errors
from shared.telemetry.metrics import get_metrics
from workers.settings import Settings

log = logging.getLogger("compaction.sweep")
SCAN_COUNT = 1000  # keys a SCAN call looks at: about 1 ms of Redis time each
TRIES_PER_PERIOD = 4  # lock tries per worker and period


@dataclass
class SweepReport:
    """What one sweep did: flags seen, stale ones, jobs published again, publish failures."""

    flags: int = 0
    stale: int = 0
    republished: int = 0
    failed: int = 0
    seconds: float = 0.0


Publish = Callable[[str, str], None]  # (tenant, session id) -> the job published


class PendingSweep:
    """Finds stale, unclaimed pending flags of every tenant and re-publishes their jobs.

    ``store``: any tenant's store on the deployment's Redis (its client and key prefix
    are used, not its tenant). ``publish(tenant, session_id)`` sends ``maybe_summarize``.
    """

    def __init__(self, store: SessionStore, publish: Publish, period_seconds: float,
                 scan_count: int = SCAN_COUNT) -> None:
        self.store, self.publish = store, publish
        self.period, self.scan_count = period_seconds, scan_count
        self.prefix = store.config.key_prefix
        self.lock_key = f"{self.prefix}:sweep:lock"

    def run_once(self, stop: threading.Event | None = None) -> SweepReport | None:
        """Sweep if this caller takes the period's lock; None when another one holds it.
        Counted by outcome (:data:`~shared.telemetry.metrics.SWEEP_OUTCOMES`)."""
        token = secrets.token_hex(8)
        ms = max(1, int(self.period * 1000))
        began, outcome, swept = time.monotonic(), "failed", False
        try:
            with redis_errors("sweep lock"):
                if not self.store.redis.set(self.lock_key, token, nx=True, px=ms):
                    outcome = "locked"
                    return None
            swept = True
            report = self.sweep(stop)
            outcome = "done"
            return report
        except StoreUnavailable:
            outcome = "store_unavailable"
            raise
        finally:
            get_metrics().sweep_done(outcome, time.monotonic() - began if swept else None)

    def sweep(self, stop: threading.Event | None = None) -> SweepReport:
        """One pass over the keyspace (no lock: :meth:`run_once` takes it); ``stop``, once
        set, ends it at the next key (the worker is shutting down)."""
        began, report = time.monotonic(), SweepReport()
        try:
            self._walk(report, stop)
        finally:  # what a sweep cut short did is counted too
            get_metrics().sweep_flags(seen=report.flags, stale=report.stale,
                                      republished=report.republished, failed=report.failed)
        report.seconds = time.monotonic() - began
        return report

    def _walk(self, report: SweepReport, stop: threading.Event | None) -> None:
        batch: list[tuple[str, str, str]] = []
        with redis_errors("sweep scan"):
            for key in self.store.redis.scan_iter(match=pending_pattern(self.prefix),
                                                  count=self.scan_count):
                if stop is not None and stop.is_set():
                    break
                found = session_of_pending(self.prefix, key)
                if found is not None:
                    batch.append((*found, key.decode() if isinstance(key, bytes) else key))
                if len(batch) >= self.scan_count:
                    self._settle(batch, report)
                    batch = []
            self._settle(batch, report)

    def _settle(self, batch: list[tuple[str, str, str]], report: SweepReport) -> None:
        if not batch:
            return
        report.flags += len(batch)
        pipe = self.store.redis.pipeline(transaction=False)
        for _, _, key in batch:
            pipe.pttl(key)
        lefts = pipe.execute()
        config = self.store.config
        for (tenant, session_id, _), left in zip(batch, lefts, strict=True):
            if not flag_stale(int(left), config):
                continue
            report.stale += 1
            keys = SessionKeys.for_session(self.prefix, tenant, session_id)
            if not self.store.execute(rearm_lost_command(keys, config)):
                continue  # young again, claimed, or leased: nothing to publish
            try:
                self.publish(tenant, session_id)
            except Exception as exc:  # the flag goes stale again: a later sweep retries
                report.failed += 1
                log.warning("sweep: job of %s/%s not published again: %s", tenant,
                            session_id, exc)
                continue
            report.republished += 1
            log.warning("session %s/%s: its pending flag stood past its stale age with no "
                        "worker on it (job lost): published again by the sweep", tenant,
                        session_id)


class SweepThread:
    """Runs ``sweep.run_once`` :data:`TRIES_PER_PERIOD` times a period until stopped."""

    def __init__(self, sweep: PendingSweep) -> None:
        self.sweep = sweep
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="compaction-sweep",
                                        daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.sweep.period / TRIES_PER_PERIOD):
            try:
                report = self.sweep.run_once(self._stop)
            except StoreUnavailable as exc:
                log.warning("sweep: the store is unavailable, trying again later: %s", exc)
                continue
            except Exception:  # never let the thread die: the next period tries again
                log.exception("sweep failed")
                continue
            if report is not None and (report.republished or report.failed):
                log.info("sweep: %d pending flags, %d stale, %d jobs published again, "
                         "%d failed, %.2f s", report.flags, report.stale,
                         report.republished, report.failed, report.seconds)

    def start(self) -> SweepThread:
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)


def celery_publisher(app: Any, queue: str) -> Publish:
    """Publishes ``maybe_summarize`` as a job's follow-up is (``workers.tasks``)."""
    def publish(tenant: str, session_id: str) -> None:
        app.send_task(TASK_MAYBE_SUMMARIZE, args=[session_id], kwargs={"tenant": tenant},
                      queue=queue)
    return publish


def build_sweep(settings: Settings, app: Any) -> PendingSweep | None:
    """The worker's sweep from its settings (None when ``COMPACTION_SWEEP_SECONDS=0``, or
    ``COMPACTION_PENDING_STALE_SECONDS=0``: no flag is ever stale then)."""
    if not settings.sweep_seconds or not settings.store_config().pending_stale_after:
        return None
    from workers.store_client import store_client

    store = SessionStore(store_client(settings), settings.store_config(),
                         tenant=settings.tenant)
    return PendingSweep(store, celery_publisher(app, settings.queue), settings.sweep_seconds)


_running: list[SweepThread] = []


def _start(sender: Any = None, **_: Any) -> None:
    """``worker_ready``: the consumer is the sender; its app carries the settings."""
    app = getattr(sender, "app", None)
    settings = getattr(getattr(app, "conf", None), "compaction_settings", None)
    if not isinstance(settings, Settings):
        return
    try:
        sweep = build_sweep(settings, app)
    except Exception:  # a worker without its sweep still runs jobs
        log.exception("sweep: not started")
        return
    if sweep is not None:
        _running.append(SweepThread(sweep).start())
        log.info("sweep: every %d s, for pending flags older than %d s", settings.sweep_seconds,
                 settings.store_config().pending_stale_after)


def _stop(**_: Any) -> None:
    """``worker_shutdown``: stop the thread (a sweep under way settles what it read)."""
    while _running:
        _running.pop().stop()


# Celery's signals are untyped: connected by call, not as decorators (mypy --strict).
worker_ready.connect(_start, weak=False)
worker_shutdown.connect(_stop, weak=False)

__all__ = ["SCAN_COUNT", "PendingSweep", "SweepReport", "SweepThread", "build_sweep",
           "celery_publisher"]
