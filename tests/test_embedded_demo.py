"""``compaction demo``: the embedded stack (fakeredis, memory broker, in-process Celery worker).

The demo runs in-process through ``workers.cli.main.main`` with the real tasks
of ``workers.tasks``; nothing of this project is faked. The backend rules
(what the environment switches) are unit-tested, and the real-Redis and
deployed-worker variants run against the machine's Redis.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from shared.core.config import StoreConfig
from shared.core.errors import ConfigError
from shared.core.wire import to_openai
from shared.store.sessions import SessionStore
from workers.cli.demo import ProviderSim, landing_line, split_turns
from workers.cli.main import main
from workers.harness.demo_session import TOOLS
from workers.harness.fakes.counting import default_counter
from workers.harness.fakes.openai_server import FakeOpenAIServer
from workers.harness.fakes.summaries import SummarizerResponder
from workers.harness.stack.demo import Landing, choose_backends
from workers.harness.stack.in_process import MEMORY_BROKER
from workers.harness.stack.worker_process import WorkerProcess, purge_queue, worker_env
from workers.settings import Settings
from workers.urls import redact_url, with_db

CONNECTION_VARS = ("COMPACTION_REDIS_URL", "COMPACTION_BROKER_URL", "COMPACTION_SUMMARIZER",
                   "COMPACTION_TENANT", "COMPACTION_KEY_PREFIX")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The embedded default is what the environment does *not* set."""
    for name in CONNECTION_VARS:
        monkeypatch.delenv(name, raising=False)


def run_demo(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = main(["demo", "--json", "--pace", "0", *args])
    out = capsys.readouterr().out
    return code, json.loads(out)


# -- the embedded demo ---------------------------------------------------------------------
def test_embedded_demo_keeps_every_call_in_the_window(capsys: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    code, figures = run_demo(capsys, "--turns", "40")
    elapsed = time.monotonic() - started
    assert code == 0
    assert figures["backends"]["store"] == "fakeredis (in-process)"
    assert figures["backends"]["broker"].startswith("memory://")
    assert figures["turns"] == 40
    assert figures["overflowing_calls_without_compaction"] > 0
    assert figures["overflowing_calls_with_compaction"] == 0
    assert figures["failed_calls"] == 0
    assert figures["compactions"] >= 1, figures
    assert sum(figures["summary_kinds"].values()) == figures["compactions"]
    assert figures["jobs"].get("compacted", 0) == figures["compactions"]
    assert figures["worker_errors"] == []
    assert figures["tokens_sent"] < figures["tokens_without_compaction"]
    assert 0 < figures["saved_ratio"] < 1
    assert 0 < figures["prepare_ms_p50"] <= figures["prepare_ms_p99"]
    assert elapsed < 20, f"the demo took {elapsed:.1f} s"


def test_demo_with_an_llm_summarizer(monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """COMPACTION_SUMMARIZER switches the in-process worker to that LLM (here the fake)."""
    with FakeOpenAIServer(responder=SummarizerResponder()) as llm:
        monkeypatch.setenv("COMPACTION_SUMMARIZER", "openai")
        monkeypatch.setenv("COMPACTION_SUMMARIZER_BASE_URL", llm.base_url)
        monkeypatch.setenv("COMPACTION_SUMMARIZER_API_KEY", "k")
        code, figures = run_demo(capsys, "--turns", "30", "--pace", "0.01")
        requests = len(llm.requests)
    assert code == 0 and figures["overflowing_calls_with_compaction"] == 0
    assert figures["backends"]["summarizer"] == "openai: gpt-4o-mini"
    assert figures["summary_kinds"].get("llm", 0) >= 1, figures
    assert requests >= figures["summary_kinds"]["llm"]


def test_demo_restores_the_worker_app_and_runtime(capsys: pytest.CaptureFixture[str]) -> None:
    """The in-process worker borrows workers.app.app; it gives it back as it was."""
    import workers.runtime
    from workers.app import app

    broker, settings = app.conf.broker_url, app.conf.compaction_settings
    code, figures = run_demo(capsys, "--turns", "8")
    assert code == 0 and figures["overflowing_calls_with_compaction"] == 0
    assert app.conf.broker_url == broker != MEMORY_BROKER
    assert app.conf.compaction_settings is settings
    assert workers.runtime._runtime is None


def test_demo_bad_option_is_an_argparse_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--turns", "0"])
    assert exc.value.code == 2
    assert "--turns" in capsys.readouterr().err


def test_provider_sim_counts_exactly_like_the_fake_server() -> None:
    """The per-message cache relies on the framing being additive; check it is exact."""
    counter = default_counter()
    sim = ProviderSim(16_000, 2_000, TOOLS)
    for turn in split_turns(6, seed=3):
        messages = to_openai(turn)
        assert sim.prompt_tokens(messages) == counter(messages, TOOLS)
    assert sim.fits(14_000) and not sim.fits(14_001)
    assert "maximum context length is 16000 tokens" in sim.overflow_error(15_000)


# -- what the environment switches ---------------------------------------------------------
def settings_from(monkeypatch: pytest.MonkeyPatch, **env: str) -> Settings:
    for name, value in env.items():
        monkeypatch.setenv(f"COMPACTION_{name.upper()}", value)
    return Settings()


def test_nothing_set_is_fully_embedded(monkeypatch: pytest.MonkeyPatch) -> None:
    backends = choose_backends(settings_from(monkeypatch))
    assert backends.store_url is None and backends.broker_url == MEMORY_BROKER
    assert backends.worker == "embedded" and backends.fully_embedded
    assert backends.summarizer.startswith("offline")


def test_redis_url_alone_keeps_broker_and_worker_embedded(monkeypatch: pytest.MonkeyPatch) -> None:
    backends = choose_backends(settings_from(monkeypatch, redis_url="redis://h:6379/3"))
    assert backends.store_url == "redis://h:6379/3"
    assert backends.broker_url == MEMORY_BROKER and backends.worker == "embedded"


def test_broker_url_means_deployed_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = settings_from(monkeypatch, redis_url="redis://h/0", broker_url="redis://h/1")
    deployed = choose_backends(settings)
    assert deployed.worker == "deployed" and deployed.broker_url == "redis://h/1"
    assert "deployed workers" in deployed.summarizer
    embedded = choose_backends(settings, "embedded")
    assert embedded.worker == "embedded" and embedded.broker_url == "redis://h/1"


def test_broker_without_store_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="COMPACTION_REDIS_URL"):
        choose_backends(settings_from(monkeypatch, broker_url="redis://h/1"))
    with pytest.raises(ConfigError, match="COMPACTION_BROKER_URL"):
        choose_backends(settings_from(monkeypatch), "deployed")


def test_summarizer_setting_names_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = settings_from(monkeypatch, summarizer="openai", summarizer_base_url="http://x/v1",
                             summarizer_model="small-model")
    assert choose_backends(settings).summarizer == "openai: small-model"


def test_broker_without_store_exits_2_naming_the_variable(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COMPACTION_BROKER_URL", "redis://127.0.0.1:6379/14")
    assert main(["demo", "--json"]) == 2
    assert "COMPACTION_REDIS_URL" in capsys.readouterr().err


@given(user=st.text(alphabet="abcdefgh", max_size=8),
       password=st.text(alphabet="XYZ0123456789!$%", min_size=4, max_size=20),
       host=st.sampled_from(["127.0.0.1:6379", "redis.internal", "[::1]:6380"]))
def test_redact_url_never_shows_the_password(user: str, password: str, host: str) -> None:
    redacted = redact_url(f"redis://{user}:{password}@{host}/0")
    assert password not in redacted.replace(f"@{host}/0", "")  # a password "6379" is a port too
    assert redacted == f"redis://{user}:***@{host}/0"
    assert redact_url(f"redis://{host}/0") == f"redis://{host}/0"


# -- real Redis, real broker, deployed worker --------------------------------------------------
@pytest.fixture
def store_url(own_redis_url: str, key_prefix: str) -> Iterator[str]:
    url = with_db(own_redis_url, 13)
    yield url
    client = redis.Redis.from_url(url)
    for key in client.scan_iter(match=f"{key_prefix}:*", count=1000):
        client.delete(key)
    client.close()


@pytest.mark.redis
def test_demo_on_real_redis_leaves_the_session_there(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], store_url: str,
        key_prefix: str) -> None:
    monkeypatch.setenv("COMPACTION_REDIS_URL", store_url)
    monkeypatch.setenv("COMPACTION_KEY_PREFIX", key_prefix)
    code, figures = run_demo(capsys, "--turns", "30", "--session", "real-demo")
    assert code == 0 and figures["overflowing_calls_with_compaction"] == 0
    assert figures["backends"]["store"] == store_url
    store = SessionStore(redis.Redis.from_url(store_url), StoreConfig(key_prefix=key_prefix))
    assert store.length("real-demo") == figures["messages"]
    kinds = {s.kind for s in store.summaries("real-demo")}
    assert "offline" in kinds, kinds


@pytest.mark.redis
def test_demo_reports_an_unreachable_store_cleanly(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COMPACTION_REDIS_URL", "redis://:hunter2@127.0.0.1:1/0")
    assert main(["demo", "--json"]) == 1
    err = capsys.readouterr().err
    assert "cannot reach Redis at redis://:***@127.0.0.1:1/0" in err
    assert "hunter2" not in err and "Traceback" not in err


@pytest.mark.celery
@pytest.mark.slow
def test_demo_with_a_deployed_worker_on_a_real_broker(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], own_redis_url: str,
        store_url: str, key_prefix: str) -> None:
    broker = with_db(own_redis_url, 14)
    purge_queue(broker)
    worker = WorkerProcess("demo", worker_env(broker_url=broker, redis_url=store_url,
                                              key_prefix=key_prefix)).start()
    try:
        monkeypatch.setenv("COMPACTION_REDIS_URL", store_url)
        monkeypatch.setenv("COMPACTION_BROKER_URL", broker)
        monkeypatch.setenv("COMPACTION_KEY_PREFIX", key_prefix)
        code, figures = run_demo(capsys, "--turns", "30", "--pace", "0.02")
    finally:
        worker.stop()
        purge_queue(broker)
    assert code == 0, figures
    assert figures["backends"]["worker"] == "deployed Celery workers"
    assert figures["overflowing_calls_with_compaction"] == 0
    assert figures["compactions"] >= 1, worker.log()[-2000:]
    assert "compaction.maybe_summarize" in worker.log()


@pytest.mark.celery
def test_deployed_mode_without_workers_says_so(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], own_redis_url: str,
        store_url: str, key_prefix: str) -> None:
    broker = with_db(own_redis_url, 14)
    monkeypatch.setenv("COMPACTION_REDIS_URL", store_url)
    monkeypatch.setenv("COMPACTION_BROKER_URL", broker)
    monkeypatch.setenv("COMPACTION_KEY_PREFIX", key_prefix)
    code = main(["demo", "--json"])
    out, err = capsys.readouterr()
    assert code == 1, (out, err)
    assert "no Celery worker answered" in err and "--worker embedded" in err, err


@pytest.mark.redis
def test_worker_app_publishes_to_the_broker_it_is_bound_to(own_redis_url: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Rebinding the worker app drops the producers of the previous broker (Celery's
    ``app.close()`` keeps them): a later in-process run must not publish to an old broker."""
    from kombu.transport import memory

    from workers.harness.stack.in_process import worker_app_with

    broker = with_db(own_redis_url, 14)
    purge_queue(broker)
    settings = settings_from(monkeypatch)
    try:
        with worker_app_with(settings, broker_url=broker) as app:
            app.send_task("compaction.maybe_summarize", args=["to-redis"], queue="compaction")
        with worker_app_with(settings, broker_url=MEMORY_BROKER) as app:
            app.send_task("compaction.maybe_summarize", args=["to-memory"], queue="compaction")
        client = redis.Redis.from_url(broker)
        queued = [json.loads(raw)["headers"]["argsrepr"]
                  for raw in client.lrange("compaction", 0, -1)]
        client.close()
        assert queued == ["['to-redis']"]
        assert memory.Channel.queues["compaction"].qsize() == 1
    finally:
        purge_queue(broker)
        memory.Channel.queues.pop("compaction", None)


def test_a_landing_fits_an_80_column_terminal_and_names_only_unusual_stages() -> None:
    """Rich wraps a longer line mid-phrase in the narrow terminals it defaults to."""
    from rich.console import Console

    plain = Landing(217, 321, "offline", ["offline_summary"], 1_312, 12_034, 2_210,
                    latency_ms=47.0)
    llm = Landing(12_217, 13_321, "llm", ["incremental_merge", "folded_3_chunks"], 2_048,
                  118_034, 42_210, model="gpt-4o-mini", latency_ms=2_470.0)
    for landing in (plain, llm):
        console = Console(width=80, record=True, color_system=None)
        console.print(landing_line(119, 10, landing))
        lines = console.export_text().splitlines()
        assert len(lines) == (2 if landing is plain else 3), lines
        assert all(len(line) <= 80 for line in lines), lines
    text = "\n".join(lines)
    assert "messages 12217-13320 → 2.0k-token summary, llm by gpt-4o-mini, 2470 ms" in text
    assert "folded_3_chunks" in text
    console = Console(width=80, record=True, color_system=None)
    console.print(landing_line(0, 1, plain))
    assert "offline_summary" not in console.export_text()


def test_an_in_process_worker_leaves_the_root_loggers_level_as_it_found_it() -> None:
    """Celery's worker set the root logger to ERROR and left it: every warning the
    process wrote after an embedded worker stopped was dropped (a broker outage's line)."""
    import logging

    from workers.harness.stack.demo import open_stack
    from workers.settings import load_settings

    root = logging.getLogger()
    before = root.level
    root.setLevel(logging.INFO)
    try:
        settings = load_settings()
        with open_stack(settings, choose_backends(settings, "embedded"), concurrency=1):
            pass
        assert root.level == logging.INFO
    finally:
        root.setLevel(before)
