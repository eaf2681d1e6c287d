"""``compaction serve --workers N``: /metrics counts the requests of every process.

A real ``compaction serve --workers 2`` (uvicorn, two worker processes behind
one socket): each request on a new connection reaches either process, and
every scrape, whichever process answers it, shows the total.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.serve_support import start_serve
from workers.metrics import MULTIPROC_ENV
from workers.server.process import free_port

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "multiprocess-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
COUNT = "compaction_guard_prepare_duration_seconds_count"


@contextlib.contextmanager
def serve_two(redis_url: str, key_prefix: str, tmp: Path) -> Iterator[str]:
    """The base url of a running ``compaction serve --workers 2`` whose TMPDIR is ``tmp``."""
    port = free_port()
    env = {**os.environ, "COMPACTION_REDIS_URL": redis_url, "COMPACTION_KEY_PREFIX": key_prefix,
           "COMPACTION_BROKER_URL": "memory://",
           "COMPACTION_SERVER_TOKENS": json.dumps({TOKEN: "acme"}),
           "TMPDIR": str(tmp), "PYTHONPATH": str(ROOT)}
    env.pop(MULTIPROC_ENV, None)
    proc, url = start_serve(env, port, 2)
    try:
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)  # uvicorn stops its workers, serve cleans up
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def prepared(text: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == COUNT and sample.labels.get("path") == "prepare":
                return float(sample.value)
    return 0.0


def test_every_scrape_counts_the_requests_of_both_processes(
        redis_url: str, real_redis: Any, key_prefix: str, tmp_path: Path) -> None:
    requests = 30
    with serve_two(redis_url, key_prefix, tmp_path) as url:
        [shared] = list(tmp_path.glob("compaction-metrics-*"))  # serve's multiprocess dir
        for i in range(requests):  # a connection each: the kernel spreads them over both
            response = httpx.post(f"{url}/v1/sessions/m{i % 3}/prepare", headers=AUTH,
                                  json={"model": "gpt-4o",
                                        "pending": [{"role": "user", "content": "hello"}]})
            assert response.status_code == 200, response.text
        pids = {path.stem.rsplit("_", 1)[-1] for path in shared.glob("*.db")}
        assert len(pids) == 2, pids  # both processes served prepares
        for _ in range(10):
            scrape = httpx.get(f"{url}/metrics", timeout=5)  # no redirect to /metrics/
            assert scrape.status_code == 200
            assert prepared(scrape.text) == requests
        assert httpx.get(f"{url}/metrics/", timeout=5).status_code == 200
    assert not list(tmp_path.glob("compaction-metrics-*"))  # serve removed it on exit
