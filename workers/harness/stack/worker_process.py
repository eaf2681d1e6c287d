"""Real ``celery worker`` processes of the stack (killable), and their environment.

Used by the replay, the reliability scripts and the tests: a worker in its
own process group (so SIGKILL takes its pool children too), logging to a
file the caller can read back (every job writes one ``compaction.end``
line, parsed by :func:`parse_job_lines`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.enqueue import QUEUE

ROOT = Path(__file__).resolve().parents[3]
JOB_MARKER = "compaction.end "


@dataclass
class WorkerProcess:
    """``celery -A <app> worker`` in its own process group, logging to a file.

    ``env`` is laid over this process's environment; ``queue`` is the one it
    consumes (``settings.queue``): on a shared broker, another queue is another
    deployment's jobs. ``None`` starts it as the Procfile does, without ``-Q``
    (it consumes ``COMPACTION_QUEUE`` from ``env``).
    """

    name: str
    env: dict[str, str]
    concurrency: int = 4
    pool: str = "threads"
    app: str = "workers.app"
    loglevel: str = "INFO"
    queue: str | None = QUEUE
    log_path: Path = field(
        default_factory=lambda: Path(tempfile.mkstemp(prefix="cmp-worker-", suffix=".log")[1]))
    process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        queues = ["-Q", self.queue] if self.queue is not None else []
        return [sys.executable, "-m", "celery", "-A", self.app, "worker", "--pool", self.pool,
                "-c", str(self.concurrency), *queues, "-n", f"{self.name}@%h",
                "--without-mingle", "--without-gossip", "-l", self.loglevel]

    def start(self, timeout: float = 60.0) -> WorkerProcess:
        """Launch and wait until the worker is ready (RuntimeError with its log if not)."""
        return self.launch().wait_ready(timeout)

    def launch(self) -> WorkerProcess:
        """Start the process without waiting (start several, then ``wait_ready`` each)."""
        with self.log_path.open("wb") as out:
            self.process = subprocess.Popen(self.command(), cwd=ROOT,
                                            env={**os.environ, **self.env}, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def wait_ready(self, timeout: float = 60.0) -> WorkerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if " ready." in self.log():
                return self
            if self.process is None or self.process.poll() is not None:
                break
            time.sleep(0.1)
        tail = self.log()[-3000:]
        self.stop()
        raise RuntimeError(f"celery worker {self.name} did not start:\n{tail}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def job_outcomes(self) -> list[dict[str, Any]]:
        """The outcomes of the jobs this worker logged so far."""
        return parse_job_lines(self.log().splitlines())

    def kill9(self) -> None:
        """SIGKILL the whole process group (pool children included)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self, timeout: float = 30.0) -> None:
        """Warm shutdown (running jobs finish), then SIGKILL of the group if it hangs."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill9()


def worker_env(*, broker_url: str, redis_url: str, key_prefix: str,
               **settings: str) -> dict[str, str]:
    """What a worker process's environment adds to this one's.

    The stack's URLs and key prefix, and ``settings``
    (``summarizer_timeout="5"`` becomes ``COMPACTION_SUMMARIZER_TIMEOUT``).
    The repository root leads ``PYTHONPATH`` so ``workers.app`` imports.
    """
    env = {"COMPACTION_BROKER_URL": broker_url, "COMPACTION_REDIS_URL": redis_url,
           "COMPACTION_KEY_PREFIX": key_prefix, "PYTHONUNBUFFERED": "1"}
    env.update({f"COMPACTION_{k.upper()}": v for k, v in settings.items()})
    path = os.environ.get("PYTHONPATH")
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{path}" if path else str(ROOT)
    return env


def purge_queue(broker_url: str, queue: str = QUEUE) -> None:
    """Drop leftover jobs (and kombu's unacked bookkeeping) of earlier runs."""
    import redis

    client = redis.Redis.from_url(broker_url)
    # kombu keeps a priority's jobs in a list of its own (the recall index job's: 9)
    priorities = [f"{queue}\x06\x16{p}" for p in (3, 6, 9)]
    client.delete(queue, *priorities, "unacked", "unacked_index", "unacked_mutex")
    client.close()


def parse_job_lines(lines: Iterable[str]) -> list[dict[str, Any]]:
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


__all__ = ["JOB_MARKER", "ROOT", "WorkerProcess", "parse_job_lines", "purge_queue", "worker_env"]
