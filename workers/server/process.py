"""``compaction serve`` as a child process on a free port (tests, benchmark, examples).

::

    with ServerProcess(env={"COMPACTION_REDIS_URL": url, ...}) as server:
        httpx.get(server.url + "/healthz")

Runs ``uvicorn --factory workers.server.main:app_from_env`` (what
``compaction serve`` runs, with its shutdown grace) with this interpreter,
waits until ``/healthz`` answers, and stops it (SIGTERM, then SIGKILL) on
exit. Imports nothing
optional; the child needs the ``server`` extra.

The child's stderr is read as it comes, keeping the last :data:`STDERR_TAIL`
bytes (:meth:`ServerProcess.stderr_tail`, and the error when it fails to
start): a pipe nobody reads fills at 64 kB, and the server's next log line
(a warning for every 503 while Redis is down) would block its event loop.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from types import TracebackType

import httpx

from workers.server.config import ENV_PREFIX, ServerConfig

#: uvicorn's own command line takes the grace as a flag (``compaction serve`` passes it)
GRACE_ENV = f"{ENV_PREFIX}SHUTDOWN_GRACE_SECONDS"

#: bytes of the child's stderr kept (the newest)
STDERR_TAIL = 64 * 1024


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ServerProcess:
    """A uvicorn child serving the app built from ``env`` (``COMPACTION_*`` variables)."""

    def __init__(self, env: Mapping[str, str], *, port: int | None = None,
                 startup_timeout: float = 60.0, log_level: str = "warning") -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, **env}
        self.startup_timeout = startup_timeout
        self.log_level = log_level
        self.proc: subprocess.Popen[bytes] | None = None
        self._stderr = bytearray()
        self._stderr_lock = threading.Lock()
        self._reader: threading.Thread | None = None

    def _drain(self, fd: int) -> None:
        """Read the child's stderr until it closes, keeping the newest bytes."""
        for chunk in iter(lambda: os.read(fd, 65536), b""):
            with self._stderr_lock:
                self._stderr += chunk
                del self._stderr[:-STDERR_TAIL]

    def stderr_tail(self) -> str:
        """The newest :data:`STDERR_TAIL` bytes the server wrote to stderr."""
        with self._stderr_lock:
            return self._stderr.decode(errors="replace")

    def _join_reader(self) -> None:
        if self._reader is not None:
            self._reader.join(timeout=5)

    def start(self) -> ServerProcess:
        grace = self.env.get(GRACE_ENV) or str(
            ServerConfig.model_fields["shutdown_grace_seconds"].default)
        cmd = [sys.executable, "-m", "uvicorn", "--factory", "workers.server.main:app_from_env",
               "--host", "127.0.0.1", "--port", str(self.port), "--log-level", self.log_level,
               "--no-access-log", "--timeout-graceful-shutdown", grace]
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        assert self.proc.stderr is not None
        self._reader = threading.Thread(target=self._drain, args=(self.proc.stderr.fileno(),),
                                        name=f"server-stderr-{self.port}", daemon=True)
        self._reader.start()
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._join_reader()  # the child is gone: its stderr ends
                raise RuntimeError(f"the server exited with {self.proc.returncode}: "
                                   f"{self.stderr_tail().strip()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/healthz", timeout=1.0).status_code == 200:
                    return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the server did not answer on {self.url} within "
                           f"{self.startup_timeout} s")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._join_reader()
        if self.proc.stderr is not None:
            self.proc.stderr.close()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


__all__ = ["STDERR_TAIL", "ServerProcess", "free_port"]
