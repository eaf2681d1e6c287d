"""``compaction serve`` stops on SIGTERM within its grace period.

A client that holds a request open (a body sent part-way, a slow upload)
kept uvicorn waiting for it without end: ``docker stop`` then killed the
server at its own deadline, whatever the other requests were doing. The
server now waits ``COMPACTION_SERVER_SHUTDOWN_GRACE_SECONDS`` at most, then
cancels what is left and exits.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")


from shared.core.config import StoreConfig
from shared.store.sessions import SessionStore
from tests.serve_support import start_serve
from workers.metrics import MULTIPROC_ENV
from workers.server.process import free_port

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "shutdown-test-token-0123456789"


@pytest.mark.redis
@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_with_a_request_held_open_exits_within_the_grace(
        redis_url: str, real_redis: Any, key_prefix: str, tmp_path: Path, workers: int) -> None:
    port = free_port()
    env = {**os.environ, "COMPACTION_REDIS_URL": redis_url, "COMPACTION_KEY_PREFIX": key_prefix,
           "COMPACTION_BROKER_URL": "memory://",
           "COMPACTION_SERVER_TOKENS": json.dumps({TOKEN: "acme"}),
           "COMPACTION_SERVER_SHUTDOWN_GRACE_SECONDS": "1",
           "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    env.pop(MULTIPROC_ENV, None)
    proc, _ = start_serve(env, port, workers)
    held = None
    try:
        held = socket.create_connection(("127.0.0.1", port))  # headers, then part of the body
        held.sendall(f"POST /v1/sessions/h1/record HTTP/1.1\r\nHost: t\r\n"
                     f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: 1000\r\n\r\n{{\"messages\": [".encode())
        time.sleep(0.5)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pytest.fail("compaction serve still running 10 s after SIGTERM (grace: 1 s)")
        assert time.monotonic() - started < 8
        store = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix), tenant="acme")
        assert store.length("h1") == 0  # the request never completed: nothing written
    finally:
        if held is not None:
            held.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
    assert not list(tmp_path.glob("compaction-metrics-*"))  # serve removed its directory
