"""Start real Celery worker processes for tests (subprocesses, killable)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class WorkerProcess:
    name: str
    env: dict[str, str]
    pool: str = "threads"
    concurrency: int = 4
    log_path: Path = field(default_factory=lambda: Path(tempfile.mkstemp(suffix=".log")[1]))
    process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30) -> WorkerProcess:
        cmd = [sys.executable, "-m", "celery", "-A", "workers.app", "worker",
               "--pool", self.pool, "-c", str(self.concurrency), "-Q", "compaction",
               "-n", f"{self.name}@%h", "--without-mingle", "--without-gossip",
               "-l", "INFO"]
        log = self.log_path.open("wb")
        self.process = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **self.env},
                                        stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if " ready." in self.log():
                return self
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"worker {self.name} did not start:\n{self.log()[-3000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill9(self) -> None:
        """SIGKILL the whole process group (pool children included)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.kill9()


def worker_env(*, broker_url: str, redis_url: str, key_prefix: str,
               **settings: str) -> dict[str, str]:
    env = {"COMPACTION_BROKER_URL": broker_url, "COMPACTION_REDIS_URL": redis_url,
           "COMPACTION_KEY_PREFIX": key_prefix, "PYTHONUNBUFFERED": "1"}
    env.update({f"COMPACTION_{k.upper()}": v for k, v in settings.items()})
    return env


def purge_queue(broker_url: str) -> None:
    """Drop leftover jobs (and kombu's unacked bookkeeping) of earlier runs."""
    import redis

    client = redis.Redis.from_url(broker_url)
    client.delete("compaction", "unacked", "unacked_index", "unacked_mutex")
    client.close()
