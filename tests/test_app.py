"""workers.app: the pool decision's consequences (time limits, preloading, bounded calls)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import typing
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery.signals import worker_init
from hypothesis import given, settings
from hypothesis import strategies as st

import workers.app as app_module
from shared.core.errors import ConfigError, InvalidInput, SummarizerUnavailable
from workers.app import SUMMARIZER_SDKS, app, celery_config, preload_summarizer_sdk
from workers.harness.stack.worker_process import WorkerProcess, worker_env
from workers.settings import Settings, load_settings
from workers.summarizer.providers import client_from_settings


@pytest.fixture
def imports(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Module names preload_summarizer_sdk asked for (nothing is really imported)."""
    asked: list[str] = []

    def record(name: str, package: str | None = None) -> Any:
        asked.append(name)
        return object()

    monkeypatch.setattr(app_module, "importlib", SimpleNamespace(import_module=record))
    return asked


def test_every_summarizer_has_an_sdk_entry() -> None:
    """A new provider in Settings must say what to preload (or None)."""
    choices = set(typing.get_args(Settings.model_fields["summarizer"].annotation))
    assert choices == set(SUMMARIZER_SDKS)


@pytest.mark.parametrize(("summarizer", "module"), [
    ("offline", None), ("openai", "openai"), ("gemini", "google.genai"),
    ("vertex", "google.genai")])
def test_preload_imports_the_configured_sdk_only(imports: list[str], summarizer: str,
                                                 module: str | None) -> None:
    overrides: dict[str, object] = {"summarizer": summarizer, "summarizer_api_key": "k",
                                    "vertex_project": "p"}
    assert preload_summarizer_sdk(load_settings(**overrides)) == module
    assert imports == ([module] if module else [])


def test_preload_of_a_missing_sdk_stops_the_start_naming_the_extra(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str, package: str | None = None) -> Any:
        raise ModuleNotFoundError(f"No module named {name!r}")

    monkeypatch.setattr(app_module, "importlib", SimpleNamespace(import_module=missing))
    with pytest.raises(ConfigError, match=r"COMPACTION_SUMMARIZER=vertex.*\[vertex\]"):
        preload_summarizer_sdk(load_settings(summarizer="vertex", vertex_project="p"))


def test_preload_really_imports_the_openai_sdk() -> None:
    import sys

    assert preload_summarizer_sdk(load_settings(summarizer="openai",
                                                summarizer_api_key="k")) == "openai"
    assert "openai" in sys.modules


def test_worker_start_preloads_with_the_apps_settings(imports: list[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """worker_init fires in the worker's main process before the pool starts (forks)."""
    monkeypatch.setitem(app.conf, "compaction_settings",
                        load_settings(summarizer="openai", summarizer_api_key="k"))
    worker_init.send(sender=None)
    assert imports == ["openai"]


@settings(max_examples=200, deadline=None)
@given(soft=st.integers(1, 3600), extra=st.integers(1, 600), call=st.floats(0.1, 600))
def test_time_limits_and_the_threads_bound_come_from_settings(soft: int, extra: int,
                                                              call: float) -> None:
    """Prefork enforces the limits Celery gets; threads end within soft + one call,
    which the longest job (hence lease and redelivery) accounts for."""
    s = load_settings(task_soft_time_limit=soft, task_time_limit=soft + extra,
                      summarizer_timeout=call)
    config = celery_config(s)
    assert config["task_soft_time_limit"] == soft
    assert config["task_time_limit"] == soft + extra
    assert s.longest_job_seconds >= max(config["task_time_limit"], soft + call)
    assert config["broker_transport_options"]["visibility_timeout"] > s.longest_job_seconds


def test_one_job_per_slot_acknowledged_after_the_job() -> None:
    config = celery_config(load_settings())
    assert config["worker_prefetch_multiplier"] == 1
    assert config["task_acks_late"] is True
    assert config["task_reject_on_worker_lost"] is True


# -- the threads pool relies on each LLM call being bounded --------------------------------

_REPLY = json.dumps({
    "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "gpt-4o-mini",
    "choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": "## Goal\n- g\n## Progress\n- p"}}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}})


@pytest.fixture
def trickling_server() -> Iterator[str]:
    """An OpenAI-compatible endpoint that sends its headers at once, then pads the body
    with one space every 0.25 s for 3 s (as proxies keeping a connection alive do)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(10)

    def serve() -> None:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            conn.recv(1 << 16)
            body = (" " * 12 + _REPLY).encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body))
            try:
                for i in range(12):
                    conn.sendall(body[i:i + 1])
                    time.sleep(0.25)
                conn.sendall(body[12:])
            except OSError:  # the client gave up: what the test wants
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    listener.close()
    thread.join(5)


def test_one_llm_call_ends_within_the_summarizer_timeout(trickling_server: str) -> None:
    client = client_from_settings(load_settings(
        summarizer="openai", summarizer_base_url=trickling_server, summarizer_api_key="k",
        summarizer_timeout=1.0))
    assert client is not None
    started = time.monotonic()
    with pytest.raises(SummarizerUnavailable, match="Timeout"):  # retried with backoff
        client.complete([{"role": "user", "content": "summarize"}], 100)
    assert time.monotonic() - started < 2.0


def test_one_gemini_call_ends_within_the_summarizer_timeout(trickling_server: str) -> None:
    pytest.importorskip("google.genai")
    client = client_from_settings(load_settings(
        summarizer="gemini", summarizer_base_url=trickling_server.removesuffix("/v1"),
        summarizer_api_key="k", summarizer_timeout=1.0))
    assert client is not None
    started = time.monotonic()
    with pytest.raises(SummarizerUnavailable, match="Timeout"):
        client.complete([{"role": "user", "content": "summarize"}], 100)
    assert time.monotonic() - started < 2.0


def test_a_reply_within_the_deadline_is_read_whole() -> None:
    """The deadline only stops slow calls: a prompt answer passes through untouched."""
    import httpx

    from workers.summarizer.deadline import DeadlineTransport

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=_REPLY.encode())

    transport = DeadlineTransport(5.0, httpx.MockTransport(answer))
    with httpx.Client(transport=transport) as http:  # type: ignore[arg-type]
        assert http.get("http://llm.invalid/v1/x").json()["model"] == "gpt-4o-mini"
    with pytest.raises(InvalidInput, match="timeout"):
        DeadlineTransport(0)


# -- 32 threads share one process's clients --------------------------------------------------

THREADS = 32  # the recommended --concurrency (Procfile, docker-compose; see tests/test_deploy.py)


def test_the_store_client_serves_every_thread_at_once(redis_url: str, key_prefix: str) -> None:
    """All threads of a process share one store client; its connection pool must hand
    each of them a connection at the same moment (redis-py raises MaxConnectionsError
    past its pool size rather than waiting)."""
    from shared.core.config import StoreConfig
    from shared.store.sessions import connect

    client = connect(redis_url, StoreConfig(socket_timeout=5))
    held = threading.Barrier(THREADS + THREADS // 2, timeout=10)
    errors: list[BaseException] = []

    def hold_a_connection(i: int) -> None:
        try:
            held.wait()
            client.blpop([f"{key_prefix}:never:{i}"], timeout=0.3)  # holds it 0.3 s
        except BaseException as exc:  # collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=hold_a_connection, args=(i,))
               for i in range(THREADS + THREADS // 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(15)
    client.close()
    assert errors == []


def _acks_at_once(redis_url: str, max_connections: int | None) -> list[str]:
    """THREADS threads acknowledging on one consumer channel of the worker's app config."""
    from celery import Celery

    from workers.app import celery_config
    from workers.settings import load_settings

    app = Celery("acks", set_as_current=False)
    app.conf.update(celery_config(load_settings(broker_url=redis_url)))
    if max_connections is not None:
        app.conf.broker_transport_options = {**app.conf.broker_transport_options,
                                             "max_connections": max_connections}
    errors: list[str] = []
    start = threading.Barrier(THREADS, timeout=10)
    with app.connection_for_write() as connection:
        channel = connection.default_channel

        def ack(i: int) -> None:
            start.wait()
            for n in range(100):
                try:
                    channel.qos.ack(f"never-delivered-{i}-{n}")
                except Exception as exc:  # collected for the assertion
                    errors.append(type(exc).__name__)

        threads = [threading.Thread(target=ack, args=(i,)) for i in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    return errors


def test_every_thread_can_acknowledge_at_once(redis_url: str) -> None:
    """acks_late under threads: each slot acks on the consumer's channel."""
    assert _acks_at_once(redis_url, None) == []
    # Control: kombu's default pool of 10 connections fails such a burst.
    assert "MaxConnectionsError" in _acks_at_once(redis_url, 10)


def test_a_worker_without_its_summarizer_sdk_does_not_start(tmp_path: Any,
                                                             redis_url: str) -> None:
    """A real ``celery worker``: exit status 2 and one line, never "ready" (worker_init's
    receivers run inside Celery's Signal.send, which swallows their exceptions)."""
    broken = tmp_path / "openai"
    broken.mkdir()
    (broken / "__init__.py").write_text('raise ImportError("simulated")\n')
    base = redis_url.rsplit("/", 1)[0]
    env = worker_env(broker_url=f"{base}/13", redis_url=f"{base}/13", key_prefix="tnosdk",
                     summarizer="openai", summarizer_api_key="k")
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env['PYTHONPATH']}"
    worker = WorkerProcess("nosdk", env).launch()
    try:
        assert worker.process is not None
        status = worker.process.wait(timeout=30)
    finally:
        worker.stop()
    log = worker.log()
    assert status == 2, log
    assert " ready." not in log
    assert "Traceback" not in log
    # (running as root, Celery warns first: that warning is not ours)
    assert log.strip().splitlines()[-1] == (
        "configuration error: COMPACTION_SUMMARIZER=openai needs the 'openai' extra: "
        "pip install 'context-compaction[openai]' (simulated)"), log
    assert log.count("configuration error") == 1
