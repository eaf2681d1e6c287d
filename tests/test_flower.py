"""Flower as deployed: never unauthenticated, and it sees the real worker's jobs.

The unit tests cover ``workers.flower_entry`` (credential parsing, refusal to
start). The end-to-end test starts a real Celery worker (threads pool,
queue ``compaction``) and Flower through ``workers.flower_entry`` as
subprocesses against a real Redis (store db 13, broker db 14, a key prefix of
its own), sends ``compaction.maybe_summarize`` by name, and reads Flower's
HTTP API with and without credentials. It ends by stopping the worker the
way ``docker stop`` does (SIGTERM) and checks that an idle worker exits at
once and cleanly.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import pytest
import redis
from celery import Celery
from hypothesis import given
from hypothesis import strategies as st

from shared.core.config import StoreConfig
from shared.core.errors import ConfigError
from shared.enqueue import QUEUE, TASK_MAYBE_SUMMARIZE
from shared.store.sessions import SessionStore
from workers.flower_entry import ENV_VAR, flower_command, main, parse_basic_auth
from workers.harness.stack.redis_server import RedisServer, free_port, start_server

ROOT = Path(__file__).resolve().parents[1]
STORE_DB, BROKER_DB = 13, 14
LOCK_KEY = "cmp:test_flower:lock"
T = TypeVar("T")


# ------------------------------------------------------------- unit tests

@pytest.mark.parametrize(("value", "pairs"), [
    ("ops:secret", [("ops", "secret")]),
    ("ops:pa:ss", [("ops", "pa:ss")]),  # HTTP basic auth splits at the first colon
    ("a:1,b:2", [("a", "1"), ("b", "2")]),
])
def test_parse_basic_auth_accepts_flowers_format(value: str, pairs: list[tuple[str, str]]) -> None:
    assert parse_basic_auth(value) == pairs


@pytest.mark.parametrize(("value", "complaint"), [
    (None, "not set"),
    ("", "not set"),
    ("   ", "not set"),
    ("ops", "user:password"),
    (":secret", "empty user"),
    ("ops:", "empty password"),
    ("ops:secret,", "entry 2"),
    (" ops:secret", "whitespace"),
    ("a:1, b:2", "entry 2 has surrounding whitespace"),
])
def test_parse_basic_auth_refuses_what_would_not_authenticate(value: str | None,
                                                             complaint: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_basic_auth(value)
    assert ENV_VAR in str(info.value) and complaint in str(info.value)


_user = st.text(st.characters(codec="utf-8", exclude_characters=":,",
                              exclude_categories=("Cs", "Cc", "Zs", "Zl", "Zp")),
                min_size=1, max_size=12)
_password = st.text(st.characters(codec="utf-8", exclude_characters=",",
                                  exclude_categories=("Cs", "Cc", "Zs", "Zl", "Zp")),
                    min_size=1, max_size=16)


@given(st.lists(st.tuples(_user, _password), min_size=1, max_size=4))
def test_parsed_pairs_are_exactly_what_flower_compares(pairs: list[tuple[str, str]]) -> None:
    value = ",".join(f"{user}:{password}" for user, password in pairs)
    assert parse_basic_auth(value) == pairs
    # Flower splits on commas and compares "user:password" literally.
    assert value.split(",") == [f"{user}:{password}" for user, password in pairs]


def test_flower_command_refuses_credentials_as_arguments() -> None:
    for arg in ("--basic-auth=a:b", "--basic_auth=a:b", "--basic-auth"):
        with pytest.raises(ConfigError, match=ENV_VAR):
            flower_command(["--port=5555", arg])
    command = flower_command(["--port=5555"])
    assert command[1:] == ["-m", "celery", "-A", "workers.app", "flower", "--port=5555"]


def test_main_execs_flower_only_with_credentials(capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[tuple[str, list[str], dict[str, str]]] = []

    def record(path: str, argv: list[str], env: dict[str, str]) -> None:
        calls.append((path, argv, env))

    assert main(["--port=1"], {"PATH": "/bin"}, execve=record) == 2
    assert not calls and ENV_VAR in capsys.readouterr().err
    assert main(["--port=1"], {ENV_VAR: "ops:secret"}, execve=record) == 0
    (path, argv, env), = calls
    assert path == sys.executable and argv[-2:] == ["flower", "--port=1"]
    assert env[ENV_VAR] == "ops:secret"
    assert "ops:secret" not in " ".join(argv)


def test_entry_point_process_refuses_to_start_without_credentials() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWER_")}
    done = subprocess.run([sys.executable, "-m", "workers.flower_entry", "--port=1"], env=env,
                          capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert done.returncode == 2
    assert f"{ENV_VAR} is not set" in done.stderr


# ------------------------------------------------------ end-to-end helpers

def _wait_for(what: str, probe: Callable[[], T | None], timeout: float,
              logs: Callable[[], str]) -> T:
    """Poll ``probe`` until it returns something; fail with the subprocess logs."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = probe()
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            last_error, value = exc, None
        if value is not None:
            return value
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what} "
                f"(last error: {last_error!r})\n{logs()}")


def _stop(process: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM the process group, SIGKILL it if it does not go in time."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    except ProcessLookupError:
        pass


def _messages(turns: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(turns):
        out.append({"role": "user", "content": f"Turn {i}: why does stock.reserve() "
                    f"double-count item {i}? " * 4})
        out.append({"role": "assistant", "content": f"Turn {i}: reserve() runs twice when "
                    f"the retry fires; guarding it with the order id fixes item {i}. " * 4})
    return out


@pytest.fixture(scope="module")
def redis_base() -> Iterator[str]:
    """``redis://host:port`` of the real Redis: the machine's, or one started here."""
    configured = os.environ.get("COMPACTION_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
    parts = urlsplit(configured)
    base = f"redis://{parts.hostname or '127.0.0.1'}:{parts.port or 6379}"
    server: RedisServer | None = None
    try:
        redis.Redis.from_url(base, socket_connect_timeout=1).ping()
    except redis.exceptions.RedisError:
        try:
            server = start_server()
        except RuntimeError as exc:
            pytest.fail(f"this test needs a real Redis and none could be found or started: {exc}")
        base = server.url.rsplit("/", 1)[0]
    yield base
    if server is not None:
        server.stop()


@pytest.fixture
def broker_lock(redis_base: str) -> Iterator[redis.Redis]:
    """Own broker db 14 for the test (the queue name is fixed), and clean up after it."""
    client = redis.Redis.from_url(f"{redis_base}/{BROKER_DB}", socket_timeout=5)
    token = secrets.token_hex(8)
    deadline = time.monotonic() + 60
    while not client.set(LOCK_KEY, token, nx=True, ex=120):
        if time.monotonic() > deadline:
            pytest.fail(f"{LOCK_KEY} in db {BROKER_DB} is held by another run of this test")
        time.sleep(0.5)
    before = set(client.scan_iter(count=1000))
    client.delete(QUEUE)  # leftovers of an interrupted run must not reach this worker
    yield client
    created = set(client.scan_iter(count=1000)) - before - {LOCK_KEY.encode()}
    if created:
        client.delete(*created)
    if client.get(LOCK_KEY) == token.encode():
        client.delete(LOCK_KEY)
    client.close()


# --------------------------------------------------------- end-to-end test

@pytest.mark.celery
@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.timeout(120)
def test_flower_lists_the_workers_jobs_and_refuses_strangers(
        redis_base: str, broker_lock: redis.Redis, tmp_path: Path) -> None:
    broker_url = f"{redis_base}/{BROKER_DB}"
    store_url = f"{redis_base}/{STORE_DB}"
    prefix = "tf" + secrets.token_hex(4)
    user, password = "ops", secrets.token_urlsafe(12)
    port = free_port()
    node = f"w1@{socket.gethostname()}"
    flower_url = f"http://127.0.0.1:{port}"

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("COMPACTION_", "FLOWER_", "REMAP_SIGTERM"))}
    env.update({
        "COMPACTION_BROKER_URL": broker_url, "COMPACTION_REDIS_URL": store_url,
        "COMPACTION_KEY_PREFIX": prefix, "COMPACTION_SUMMARIZER": "offline",
        # Small thresholds so the offline summarizer really compacts the long session.
        "COMPACTION_MESSAGE_THRESHOLD": "20", "COMPACTION_KEEP_RECENT_TOKENS": "200",
        # What docker/docker-compose.yml gives Flower.
        ENV_VAR: f"{user}:{password}", "FLOWER_PURGE_OFFLINE_WORKERS": "300",
        "FLOWER_MAX_TASKS": "10000",
    })
    store_client = redis.Redis.from_url(store_url, socket_timeout=5)
    store = SessionStore(store_client, StoreConfig(key_prefix=prefix))
    sessions = {"long": 30, "short-a": 2, "short-b": 3}
    for session_id, turns in sessions.items():
        store.append(session_id, _messages(turns))

    worker_log, flower_log = tmp_path / "worker.log", tmp_path / "flower.log"

    def logs() -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}"
                         for p in (worker_log, flower_log) if p.exists())

    processes: list[subprocess.Popen[bytes]] = []
    publisher = Celery(broker=broker_url)
    try:
        with worker_log.open("wb") as out:
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "workers.app", "worker", "--pool",
                 "threads", "-c", "4", "-Q", QUEUE, "-n", "w1@%h", "--loglevel", "INFO"],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True))
        with flower_log.open("wb") as out:
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "workers.flower_entry", f"--port={port}",
                 "--address=127.0.0.1"],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True))
        worker, flower = processes
        auth = httpx.BasicAuth(user, password)
        http = httpx.Client(base_url=flower_url, timeout=5)

        # /healthcheck answers without credentials (what the compose healthcheck calls).
        health = _wait_for("Flower's /healthcheck",
                           lambda: (r := http.get("/healthcheck")).status_code == 200 and r,
                           30, logs)
        assert health.text == "OK"

        # Events are pub/sub: Flower only sees what is published after it subscribed.
        # The worker's heartbeat reaching Flower proves its event receiver is live,
        # so the task-received events (which carry the task's name) cannot be missed.
        _wait_for(f"{node} online in /api/workers?status=1", lambda: (
            http.get("/api/workers", params={"status": 1}, auth=auth).json().get(node) or None),
            30, logs)

        task_ids = {publisher.send_task(TASK_MAYBE_SUMMARIZE, args=[session_id],
                                        kwargs={"tenant": "default"}, queue=QUEUE).id: session_id
                    for session_id in sessions}

        def finished() -> dict[str, Any] | None:
            response = http.get("/api/tasks", auth=auth)
            response.raise_for_status()
            tasks: dict[str, Any] = response.json()
            mine = {tid: tasks[tid] for tid in task_ids if tid in tasks}
            if len(mine) == len(task_ids) and all(
                    t["state"] in {"SUCCESS", "FAILURE"} for t in mine.values()):
                return mine
            return None

        tasks = _wait_for("the jobs to finish in Flower", finished, 30, logs)
        for task_id, task in tasks.items():
            assert task["state"] == "SUCCESS", (task, logs())
            assert task["name"] == TASK_MAYBE_SUMMARIZE
            assert task["worker"] == node
            assert isinstance(task["runtime"], float) and task["runtime"] > 0
            assert repr(task_ids[task_id]) in task["args"]
        results = {task_ids[tid]: t["result"] for tid, t in tasks.items()}
        assert "'status': 'compacted'" in results["long"], results["long"]
        assert "'status': 'skipped'" in results["short-a"], results["short-a"]
        assert store.state("long").watermark > 0  # the job Flower reported really ran

        # Still online per its heartbeats, and, asked over remote control, consuming
        # the compaction queue.
        assert http.get("/api/workers", params={"status": 1}, auth=auth).json().get(node)
        workers = http.get("/api/workers", params={"refresh": 1, "workername": node},
                           auth=auth, timeout=15)
        assert workers.status_code == 200, workers.text
        queues = {q["name"] for q in workers.json()[node]["active_queues"]}
        assert queues == {QUEUE}, queues

        for path in ("/api/workers", "/api/tasks", "/"):
            assert http.get(path).status_code == 401, path
            assert http.get(path, auth=(user, password + "x")).status_code == 401, path
            assert http.get(path, auth=(user + "x", password)).status_code == 401, path
            assert http.get(path, auth=auth).status_code == 200, path
        assert "Basic" in http.get("/").headers.get("WWW-Authenticate", "")
        # Flower serves /metrics without credentials (docker/README.md says so, and
        # that the port must stay private); this fails if a Flower release changes it.
        assert http.get("/metrics").status_code == 200
        http.close()

        # docker stop sends SIGTERM: an idle threads-pool worker must exit at once, cleanly.
        started = time.monotonic()
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the worker ignored SIGTERM for 20 s\n{logs()}")
        assert worker.returncode == 0, logs()
        assert time.monotonic() - started < 15
        _stop(flower, timeout=10)
    finally:
        publisher.close()
        for process in processes:
            _stop(process, timeout=10)
        keys = list(store_client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            store_client.delete(*keys)
        store_client.close()
