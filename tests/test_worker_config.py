"""Worker configuration checked at start-up, and a worker on a queue of the publisher's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from pydantic import ValidationError

from shared.core.config import StoreConfig
from shared.core.errors import ConfigError
from shared.enqueue import QUEUE, TASK_COMPACT, NullEnqueuer, publisher_app
from shared.guard import ContextGuard
from shared.store.sessions import SessionStore
from workers.harness.demo_session import SYSTEM_PROMPT, TOOLS, demo_turns
from workers.harness.stack.worker_process import WorkerProcess, purge_queue, worker_env
from workers.harness.timing import wait_for
from workers.settings import Settings, load_settings
from workers.tasks import reply_route
from workers.urls import with_db

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _no_outside_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's own COMPACTION_* or genai keys must not decide a test."""
    for name in list(os.environ):
        if name.startswith("COMPACTION_") or name in ("GOOGLE_API_KEY", "GEMINI_API_KEY"):
            monkeypatch.delenv(name)


def _start_worker(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``celery -A workers.app worker`` with ``env``; it must stop before connecting."""
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "workers.app", "worker", "--pool", "threads",
         "-c", "1", "-Q", QUEUE, "--without-mingle", "--without-gossip"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_")},
             "PYTHONPATH": str(ROOT), "COMPACTION_BROKER_URL": "redis://127.0.0.1:6379/9",
             "COMPACTION_REDIS_URL": "redis://127.0.0.1:6379/9", **env})


# -- F1: key prefix and tenant ---------------------------------------------------------------
@pytest.mark.parametrize(("variable", "value"), [
    ("COMPACTION_KEY_PREFIX", "My-Prefix"),
    ("COMPACTION_KEY_PREFIX", "averyveryverylongprefix"),
    ("COMPACTION_KEY_PREFIX", ""),
    ("COMPACTION_TENANT", "acme:prod"),
    ("COMPACTION_TENANT", ""),
])
def test_an_invalid_key_prefix_or_tenant_fails_at_load(monkeypatch: pytest.MonkeyPatch,
                                                       variable: str, value: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=f"^{re.escape(f'{variable}={value!r}: ')}"):
        load_settings()


def test_valid_key_prefix_and_tenant_load_and_make_a_store_config(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPACTION_KEY_PREFIX", "t_1")
    monkeypatch.setenv("COMPACTION_TENANT", "acme.prod-1")
    settings = load_settings()
    assert settings.store_config().key_prefix == "t_1"
    assert settings.tenant == "acme.prod-1"


def test_store_config_raises_a_config_error_naming_the_variable() -> None:
    """Settings built around validation (model_construct) still never leak pydantic's error."""
    settings = Settings.model_construct(key_prefix="Bad-Prefix")
    with pytest.raises(ConfigError, match=r"^COMPACTION_KEY_PREFIX='Bad-Prefix': ") as info:
        settings.store_config()
    assert not isinstance(info.value, ValidationError)


def test_a_worker_with_an_invalid_key_prefix_does_not_start() -> None:
    done = _start_worker({"COMPACTION_KEY_PREFIX": "My-Prefix"})
    assert done.returncode == 2, done.stderr[-2000:]
    assert "configuration error: COMPACTION_KEY_PREFIX='My-Prefix': " in done.stderr
    assert "Traceback" not in done.stderr


# -- F2: gemini needs a key ------------------------------------------------------------------
def test_gemini_without_an_api_key_is_a_configuration_error() -> None:
    with pytest.raises(ConfigError, match=r"COMPACTION_SUMMARIZER_API_KEY is required when "
                       r"COMPACTION_SUMMARIZER=gemini .*GOOGLE_API_KEY / GEMINI_API_KEY"):
        load_settings(summarizer="gemini")
    # a base URL does not stand in for the key: google-genai's API-key mode needs one
    with pytest.raises(ConfigError, match="COMPACTION_SUMMARIZER_API_KEY"):
        load_settings(summarizer="gemini", summarizer_base_url="http://127.0.0.1:1")


@pytest.mark.parametrize("variable", ["GOOGLE_API_KEY", "GEMINI_API_KEY"])
def test_gemini_takes_the_key_google_genai_reads_from_the_environment(
        monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    pytest.importorskip("google.genai")
    from workers.summarizer.providers import client_from_settings

    monkeypatch.setenv(variable, "from-env")
    settings = load_settings(summarizer="gemini")
    assert client_from_settings(settings) is not None  # the client accepts it too
    monkeypatch.setenv(variable, "")  # google-genai counts an empty value as unset
    with pytest.raises(ConfigError, match="COMPACTION_SUMMARIZER_API_KEY"):
        load_settings(summarizer="gemini")


def test_gemini_client_without_a_key_raises_a_config_error() -> None:
    pytest.importorskip("google.genai")
    from workers.summarizer.providers import GeminiClient

    with pytest.raises(ConfigError, match="COMPACTION_SUMMARIZER_API_KEY"):
        GeminiClient("gemini-2.5-flash-lite", vertexai=False, api_key=None)


# -- F4: non-finite floats -------------------------------------------------------------------
@pytest.mark.parametrize("variable", [
    "COMPACTION_SUMMARIZER_TIMEOUT", "COMPACTION_REDIS_SOCKET_TIMEOUT",
    "COMPACTION_TRIGGER_RATIO", "COMPACTION_MIN_SAVING_RATIO",
    "COMPACTION_UNRECOGNISED_OVERFLOW_AT"])
@pytest.mark.parametrize("value", ["inf", "-inf", "Infinity", "nan"])
def test_non_finite_floats_are_configuration_errors(monkeypatch: pytest.MonkeyPatch,
                                                    variable: str, value: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=f"^{re.escape(f'{variable}={value!r}: ')}"):
        load_settings()


def test_a_worker_with_an_infinite_timeout_stops_with_one_line() -> None:
    done = _start_worker({"COMPACTION_SUMMARIZER_TIMEOUT": "inf"})
    assert done.returncode == 2, done.stderr[-2000:]
    assert "configuration error: COMPACTION_SUMMARIZER_TIMEOUT='inf': " in done.stderr
    assert "OverflowError" not in done.stderr and "Traceback" not in done.stderr


# -- F5: the worker's own jobs go back to the job's queue ------------------------------------
def test_reply_route_follows_the_delivery() -> None:
    # every publisher here sends through the anonymous exchange, routing by queue name
    assert reply_route({"exchange": "", "routing_key": "tenant_a", "priority": 0}) == {
        "queue": "tenant_a"}
    # another exchange keeps its routing key, as Celery's own retry does
    assert reply_route({"exchange": "jobs", "routing_key": "a.b"}) == {
        "exchange": "jobs", "routing_key": "a.b"}
    # eager or unknown: the app's routes (the compaction queue)
    assert reply_route(None) == {}
    assert reply_route({"is_eager": True, "exchange": None, "routing_key": None}) == {}


@dataclass
class QueueWorker(WorkerProcess):
    """A real worker consuming one queue of the caller's (``-Q queue``)."""

    queue: str = QUEUE

    def command(self) -> list[str]:
        command = super().command()
        command[command.index("-Q") + 1] = self.queue
        return command


@pytest.fixture
def urls(own_redis_url: str) -> Iterator[tuple[str, str]]:
    broker, store = with_db(own_redis_url, 12), with_db(own_redis_url, 11)
    purge_queue(broker)
    yield broker, store
    purge_queue(broker)


@pytest.mark.celery
@pytest.mark.slow
def test_a_worker_on_a_custom_queue_runs_its_follow_up_and_index_jobs(
        urls: tuple[str, str], key_prefix: str) -> None:
    """A busy job's follow-up and the recall index job stay on the job's own queue."""
    broker, store_url = urls
    queue = f"q{key_prefix}"
    client = redis.Redis.from_url(store_url)
    broker_client = redis.Redis.from_url(broker)
    worker = QueueWorker("wq", worker_env(broker_url=broker, redis_url=store_url,
                                          key_prefix=key_prefix), queue=queue).start()
    try:
        store = SessionStore(client, StoreConfig(key_prefix=key_prefix))
        guard = ContextGuard(store, NullEnqueuer(), overrides={"gpt-4o": 24_000})
        for turn in demo_turns(12):
            guard.prepare("s1", SYSTEM_PROMPT, TOOLS, 2000, "gpt-4o", pending=turn[:1])
            guard.record_turn("s1", turn)
        # Someone holds the lease: the job leaves its request and sends a follow-up job
        # due when the lease expires, which runs the request (and then an index job).
        assert store.acquire_lease("s1", 3) is not None
        publisher = publisher_app(broker)
        publisher.send_task(TASK_COMPACT, args=["s1"], queue=queue,
                            kwargs={"tenant": "default", "force": True, "keep_recent": 2000})
        assert wait_for(lambda: store.state("s1").watermark > 0, 30), worker.log()[-3000:]
        assert wait_for(lambda: "compaction.index_recall" in worker.log()
                        and "succeeded" in worker.log().split("compaction.index_recall")[-1],
                        20), worker.log()[-3000:]
        log = worker.log()
        assert log.count("compaction.maybe_summarize[") >= 1  # the follow-up ran here
        stranded = [QUEUE, *(f"{QUEUE}\x06\x16{p}" for p in (3, 6, 9))]
        assert sum(int(broker_client.llen(key)) for key in stranded) == 0
    finally:
        worker.stop()
        broker_client.delete(queue, *(f"{queue}\x06\x16{p}" for p in (3, 6, 9)))
        for key in client.scan_iter(match=f"{key_prefix}:*", count=1000):
            client.delete(key)
        client.close()
        broker_client.close()
