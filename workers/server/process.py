"""``compaction serve`` as a child process on a free port (tests, benchmark, examples).

::

    with ServerProcess(env={"COMPACTION_REDIS_URL": url, ...}) as server:
        httpx.get(server.url + "/healthz")

Runs ``uvicorn --factory workers.server.main:app_from_env`` (what
``compaction serve`` runs) with this interpreter, waits until ``/healthz``
answers, and stops it (SIGTERM, then SIGKILL) on exit. Imports nothing
optional; the child needs the ``server`` extra.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from types import TracebackType

import httpx


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

    def start(self) -> ServerProcess:
        cmd = [sys.executable, "-m", "uvicorn", "--factory", "workers.server.main:app_from_env",
               "--host", "127.0.0.1", "--port", str(self.port), "--log-level", self.log_level,
               "--no-access-log"]
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise RuntimeError(f"the server exited with {self.proc.returncode}: "
                                   f"{err.strip()[-2000:]}")
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
        if self.proc.stderr is not None:
            self.proc.stderr.close()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


__all__ = ["ServerProcess", "free_port"]
