"""The stack a replay needs: Redis, a broker and real Celery workers.

Three ways to get it, in this order (the report says which one ran):

1. ``configured``: the caller's Redis (``COMPACTION_REDIS_URL`` was set) and
   broker (``COMPACTION_BROKER_URL``, else the next database of that Redis);
   worker processes are started on them. A tenant of its own keeps the
   replay's keys apart, and they are deleted at the end.
2. ``embedded``: a ``redis-server`` binary is started on a free port (store
   in db 0, broker in db 1, nothing persisted) and worker processes on it.
3. ``in-process``: no binary either, so fakeredis (with Lua) holds the
   store, Celery's in-memory transport carries the jobs and one worker runs
   in a thread of this process. Same tasks and compactor, less isolation.

Every job goes through ``settings.queue`` (``COMPACTION_QUEUE``): the workers
consume it, the guard and the warm-up publish to it, the drain counts it. On a
shared broker a queue of the replay's own keeps production's workers off its
jobs, and its workers (a fake summarizer) off production's.

Workers are real ``celery worker`` processes (threads pool), so the replay
exercises what production runs: the broker round trip, the lease, the
compare-and-swap racing the agent's turns. Their outcomes are read back
from the ``compaction.end`` log line every job writes.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import redis

from shared.core.errors import ConfigError
from shared.enqueue import QUEUE, TASK_MAYBE_SUMMARIZE, CeleryEnqueuer, Enqueuer, publisher_app
from workers.harness.stack.in_process import JobCapture
from workers.harness.stack.redis_server import RedisServer, redis_binary, start_server
from workers.harness.stack.worker_process import (
    JOB_MARKER,
    WorkerProcess,
    parse_job_lines,
    worker_env,
)
from workers.settings import Settings
from workers.urls import db_number, redact_url, with_db

Mode = Literal["configured", "embedded", "in-process"]
WARMUP_TENANT = "replay-warmup"
WARMUP_SESSION = "warmup"
log = logging.getLogger(__name__)


@dataclass
class Services:
    """What the harness talks to; build with :func:`start_services`."""

    mode: Mode
    description: str
    store_client: Any
    enqueuer: Enqueuer
    worker_settings: Settings
    workers: list[WorkerProcess] = field(default_factory=list)
    broker_client: Any = None
    capture: JobCapture | None = None
    queue: str = QUEUE

    def job_outcomes(self) -> list[dict[str, Any]]:
        """Every job outcome the workers logged so far."""
        if self.capture is not None:
            return parse_job_lines(self.capture.snapshot())
        return [job for worker in self.workers for job in worker.job_outcomes()]

    def queued_jobs(self) -> int:
        """Jobs waiting in the broker queue (0 when it cannot be read: in-process)."""
        if self.broker_client is None:
            return 0
        with contextlib.suppress(redis.exceptions.RedisError):
            return int(self.broker_client.llen(self.queue))
        return 0

    def worker_logs(self) -> dict[str, str]:
        return {w.name: str(w.log_path) for w in self.workers}


def _settings_from_env(settings: Settings, overrides: Mapping[str, str]) -> Settings:
    """``settings`` with ``COMPACTION_*`` overrides applied (for the in-process worker)."""
    values = {k.removeprefix("COMPACTION_").lower(): v for k, v in overrides.items()
              if k.startswith("COMPACTION_")}
    data = settings.model_dump()
    data.update(values)
    return Settings.model_validate(data)


def _warm_up(publisher: Any, workers: list[WorkerProcess], concurrency: int, queue: str,
             store: Any = None, timeout: float = 60.0) -> bool:
    """Run a no-op job in every worker process before the replay starts.

    A worker builds its runtime (Redis client, summarizer SDK client) on its
    first job, which takes a second or two; unwarmed, that start-up would
    count as worker lag of the first sessions. ``store`` (the warm-up tenant's):
    the job's session is recorded first and deleted after, so that no job reports
    a session it cannot find (which means misconfigured workers).
    """
    if store is not None:
        store.append(WARMUP_SESSION, [{"role": "user", "content": "warm-up"}])
    try:
        return _warm_up_jobs(publisher, workers, concurrency, queue, timeout)
    finally:
        if store is not None:
            store.delete_session(WARMUP_SESSION)


def _warm_up_jobs(publisher: Any, workers: list[WorkerProcess], concurrency: int, queue: str,
                  timeout: float) -> bool:
    for _ in range(len(workers) * concurrency * 2):
        publisher.send_task(TASK_MAYBE_SUMMARIZE, args=[WARMUP_SESSION],
                            kwargs={"tenant": WARMUP_TENANT}, queue=queue, ignore_result=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(JOB_MARKER in w.log() for w in workers):
            return True
        time.sleep(0.1)
    log.warning("replay workers did not all finish their warm-up job within %.0f s", timeout)
    return False


@contextlib.contextmanager
def _processes(mode: Mode, description: str, redis_url: str, broker_url: str,
               settings: Settings, base_env: Mapping[str, str], overrides: Mapping[str, str],
               workers: int, concurrency: int) -> Iterator[Services]:
    worker_settings = _settings_from_env(settings, overrides)
    queue = worker_settings.queue  # the workers' app routes follow-ups to it too
    env = {**base_env, **worker_env(redis_url=redis_url, broker_url=broker_url,
                                    key_prefix=settings.key_prefix, queue=queue), **overrides}
    store_client = redis.Redis.from_url(redis_url, socket_timeout=5, socket_connect_timeout=5)
    broker_client = redis.Redis.from_url(broker_url, socket_timeout=5, socket_connect_timeout=5)
    try:
        store_client.ping()
        broker_client.ping()
    except redis.exceptions.RedisError as exc:
        raise ConfigError(f"{description}: Redis is not reachable ({exc})") from None
    tag = secrets.token_hex(3)
    started: list[WorkerProcess] = []
    try:
        for i in range(workers):
            try:
                started.append(WorkerProcess(f"replay{i}-{tag}", env, concurrency,
                                             queue=queue).start())
            except RuntimeError as exc:
                raise ConfigError(str(exc)) from None
        publisher = publisher_app(broker_url, timeout=2.0)
        from shared.store.sessions import SessionStore

        _warm_up(publisher, started, concurrency, queue,
                 SessionStore(store_client, worker_settings.store_config(),
                              tenant=WARMUP_TENANT))
        yield Services(mode=mode, description=description, store_client=store_client,
                       enqueuer=CeleryEnqueuer(publisher, queue=queue),
                       worker_settings=worker_settings, workers=started,
                       broker_client=broker_client, queue=queue)
    finally:
        for worker in started:
            worker.stop()
        store_client.close()
        broker_client.close()


@contextlib.contextmanager
def _in_process(settings: Settings, overrides: Mapping[str, str],
                concurrency: int) -> Iterator[Services]:
    """fakeredis + memory broker + a worker thread running the real tasks."""
    import fakeredis

    from shared.store.sessions import SessionStore
    from workers.harness.stack.in_process import MEMORY_BROKER, worker_thread

    worker_settings = _settings_from_env(settings, overrides).model_copy(
        update={"broker_url": MEMORY_BROKER})
    server = fakeredis.FakeServer()
    store = SessionStore(fakeredis.FakeRedis(server=server), worker_settings.store_config(),
                         tenant=worker_settings.tenant)
    with JobCapture().installed() as capture, worker_thread(
            worker_settings, store, broker_url=MEMORY_BROKER, concurrency=concurrency,
            shutdown_timeout=60) as app:
        yield Services(
            mode="in-process",
            description="in-process: fakeredis store, in-memory broker, one "
                        "worker thread pool (no redis-server binary found)",
            store_client=fakeredis.FakeRedis(server=server),
            enqueuer=CeleryEnqueuer(app, queue=worker_settings.queue),
            worker_settings=worker_settings, capture=capture, queue=worker_settings.queue)


@contextlib.contextmanager
def start_services(settings: Settings, *, base_env: Mapping[str, str],
                   overrides: Mapping[str, str], workers: int = 1, concurrency: int = 4,
                   configured: bool = False, redis_server: str | None = None,
                   force_in_process: bool = False) -> Iterator[Services]:
    """Redis, broker and workers for one replay (see the module docstring for the order).

    ``overrides`` are ``COMPACTION_*`` settings the workers must use (the
    summarizer's URL, retention...); ``base_env`` is the environment the
    worker processes inherit. ``configured`` means the operator set
    ``COMPACTION_REDIS_URL`` (and perhaps ``COMPACTION_BROKER_URL``; without
    it the broker is the next database of the same Redis).
    """
    if workers < 1:
        raise ConfigError("--workers: must be >= 1")
    explicit = settings.model_fields_set
    if "broker_url" in explicit and "redis_url" not in explicit:
        raise ConfigError("COMPACTION_BROKER_URL is set but COMPACTION_REDIS_URL is not: the "
                          "replay's workers must reach the sessions' Redis; set both")
    if configured and not force_in_process:
        broker = settings.broker_url if "broker_url" in explicit else with_db(
            settings.redis_url, (db_number(settings.redis_url) + 1) % 16)
        with _processes("configured", f"configured Redis {redact_url(settings.redis_url)}, "
                        f"broker {redact_url(broker)}; {workers} worker process(es)",
                        settings.redis_url, broker, settings, base_env,
                        overrides, workers, concurrency) as services:
            yield services
        return
    binary = None if force_in_process else redis_binary(redis_server)
    if binary is None:
        if redis_server and not force_in_process:
            raise ConfigError(f"--redis-server: {redis_server} is not an executable")
        with _in_process(settings, overrides, concurrency) as services:
            yield services
        return
    try:
        server: RedisServer = start_server(binary=binary)
    except RuntimeError as exc:
        raise ConfigError(str(exc)) from None
    try:
        with _processes("embedded", f"embedded redis-server ({binary}) on port {server.port}; "
                        f"{workers} worker process(es)", with_db(server.url, 0),
                        with_db(server.url, 1), settings, base_env, overrides, workers,
                        concurrency) as services:
            yield services
    finally:
        server.remove()


__all__ = ["Mode", "Services", "start_services"]
