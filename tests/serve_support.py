"""`compaction serve` as a real process for the tests that need one (signals, several
workers): started on a free port, returned once it answers its health check."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]


def start_serve(env: dict[str, Any], port: int,
                workers: int) -> tuple[subprocess.Popen[bytes], str]:
    """The process and its base URL, healthy; its stderr piped (its lines on a failed
    start are in the assertion)."""
    cmd = [sys.executable, "-m", "workers.cli.main", "serve", "--host", "127.0.0.1",
           "--port", str(port), "--workers", str(workers), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    try:
        while True:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    return proc, url
            assert time.monotonic() < deadline, "compaction serve did not start"
            time.sleep(0.1)
    except BaseException:  # not started: nobody else stops it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
