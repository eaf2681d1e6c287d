"""The operations commands against the real Redis, through ``workers.cli.main.main``.

Every test has its own key prefix (db 13 for sessions, db 14 as the broker)
and cleans up. Sessions are prepared through the store and the guard, as
an agent would leave them; compactions are made by the real task
(``compact --wait``).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

from shared.core.config import StoreConfig
from shared.core.repair import validate_view
from shared.core.wire import from_openai
from shared.guard import ContextGuard
from shared.store.sessions import SessionStore
from workers.cli._common import Meter, percentile
from workers.cli.demo import split_turns
from workers.cli.history import first_lines
from workers.cli.main import main
from workers.harness.demo_session import SYSTEM_PROMPT, TOOLS
from workers.harness.fakes.gemini_server import FakeGeminiServer
from workers.harness.fakes.openai_server import FakeOpenAIServer
from workers.harness.stack.worker_process import purge_queue

ROOT = Path(__file__).resolve().parents[1]
SESSION = "ops-1"
CLEARED = ("COMPACTION_TENANT", "COMPACTION_SUMMARIZER", "COMPACTION_SUMMARIZER_MODEL",
           "COMPACTION_SUMMARIZER_BASE_URL", "COMPACTION_SUMMARIZER_API_KEY",
           "COMPACTION_TRIGGER_RATIO")


def with_db(url: str, db: int) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", "", ""))


@pytest.fixture
def urls(redis_url: str, key_prefix: str,
         monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    store_url, broker_url = with_db(redis_url, 13), with_db(redis_url, 14)
    for name in CLEARED:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COMPACTION_REDIS_URL", store_url)
    monkeypatch.setenv("COMPACTION_BROKER_URL", broker_url)
    monkeypatch.setenv("COMPACTION_KEY_PREFIX", key_prefix)
    purge_queue(broker_url)
    yield store_url, broker_url
    purge_queue(broker_url)
    client = redis.Redis.from_url(store_url)
    for key in client.scan_iter(match=f"{key_prefix}:*", count=1000):
        client.delete(key)
    client.close()


@pytest.fixture
def store(urls: tuple[str, str], key_prefix: str) -> Iterator[SessionStore]:
    client = redis.Redis.from_url(urls[0])
    yield SessionStore(client, StoreConfig(key_prefix=key_prefix))
    client.close()


@pytest.fixture
def session(store: SessionStore) -> SessionStore:
    """30 turns in the log, figures recorded by one guard call (gpt-4o at a 16k window)."""
    turns = split_turns(30, seed=5)
    for turn in turns[:-1]:
        store.append(SESSION, turn)
    guard = ContextGuard(store, overrides={"gpt-4o": 16_000})
    view = guard.prepare(SESSION, SYSTEM_PROMPT, TOOLS, 2000, "gpt-4o", pending=turns[-1][:1])
    guard.record_turn(SESSION, turns[-1])
    assert view.report.truncated  # over budget: the agent's own call truncated
    return store


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code, out, err = cli(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def snapshot(store: SessionStore, session_id: str) -> dict[str, Any]:
    """Every key of the session with its content: to prove a command wrote nothing."""
    k = store.keys(session_id)
    r = store.redis
    return {"state": r.hgetall(k.state), "sums": r.hgetall(k.summaries),
            "cheap": r.hgetall(k.cheap), "log": r.llen(k.log), "pending": r.exists(k.pending)}


# -- stats ---------------------------------------------------------------------------------
def test_stats_reports_the_agents_window_and_regions(
        session: SessionStore, capsys: pytest.CaptureFixture[str]) -> None:
    figures = cli_json(capsys, "stats", SESSION)
    assert figures["window"] == 16_000 and figures["limits_source"] == "override"
    assert figures["length"] == session.length(SESSION)
    assert figures["regions"]["tools"] > 0 and figures["regions"]["history"] > 0
    assert figures["summaries"][0]["kind"] == "truncation"
    code, out, _ = cli(capsys, "stats", SESSION)
    assert code == 0
    assert "context" in out and "window 16.0k" in out and SESSION in out
    assert "input tokens" in out and "truncation" in out


@pytest.mark.parametrize(("ratio", "colour"), [
    (0.0, "green"), (0.59, "green"), (0.61, "dark_orange"), (0.79, "dark_orange"),
    (0.8, "red"), (1.4, "red")])
def test_meter_colour_follows_the_trigger(ratio: float, colour: str) -> None:
    meter = Meter(window=10_000, reserve=1_000, regions={"history": 100}, usage_ratio=ratio,
                  trigger_ratio=0.8)
    assert meter.colour == colour


def test_percentile_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50 and percentile(values, 99) == 99
    assert percentile(values, 100) == 100 and percentile([3.0], 99) == 3.0
    assert percentile([], 50) == 0.0


# -- show ----------------------------------------------------------------------------------------
def test_show_is_a_dry_run_of_prepare(session: SessionStore,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    session.redis.delete(session.keys(SESSION).pending)
    before = snapshot(session, SESSION)
    body = cli_json(capsys, "show", SESSION, "--system-prompt", "Be brief.")
    assert body["model"] == "gpt-4o" and body["max_tokens"] == 2000
    messages = body["messages"]
    assert messages[0]["role"] == "system" and messages[0]["content"].startswith("Be brief.")
    last = session.messages(SESSION, session.length(SESSION) - 1)[0]
    assert messages[-1]["role"] == "assistant" and messages[-1]["content"] == last.text()
    assert validate_view(from_openai(messages), "openai") == []
    code, out, _ = cli(capsys, "show", SESSION, "--chars", "80")
    assert code == 0 and "#0 system" in out and "more characters" in out
    assert snapshot(session, SESSION) == before, "show must not write anything"


def test_show_of_a_session_over_budget_says_it_would_truncate(
        store: SessionStore, capsys: pytest.CaptureFixture[str]) -> None:
    for turn in split_turns(20, seed=9):
        store.append("big", turn)
    store.update_state("big", model="gpt-4o", window=8_000, max_tokens=1_000)
    before = snapshot(store, "big")
    code, out, _ = cli(capsys, "show", "big")
    assert code == 0 and "the next call truncates" in out
    assert snapshot(store, "big") == before


# -- compact, history, rewind ------------------------------------------------------------------
def test_compact_publishes_through_the_broker(session: SessionStore, urls: tuple[str, str],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    reply = cli_json(capsys, "compact", SESSION, "--keep-recent", "3000", "--force")
    broker = redis.Redis.from_url(urls[1])
    queued = [json.loads(raw) for raw in broker.lrange("compaction", 0, -1)]
    broker.close()
    assert len(queued) == 1
    headers = queued[0]["headers"]
    assert headers["task"] == "compaction.compact" and headers["id"] == reply["task_id"]
    assert SESSION in headers["argsrepr"] and "3000" in headers["kwargsrepr"]
    code, out, _ = cli(capsys, "compact", SESSION)
    assert code == 0 and "task id" in out


def test_compact_wait_history_and_rewind(session: SessionStore,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    first = cli_json(capsys, "compact", SESSION, "--wait")
    assert first["status"] == "compacted" and first["summary_kind"] == "offline"
    assert first["tokens_after"] < first["tokens_before"]
    code, out, _ = cli(capsys, "compact", SESSION, "--wait", "--keep-recent", "500", "--force")
    assert code == 0 and "compacted" in out
    history = cli_json(capsys, "history", SESSION)
    watermarks = [h["watermark"] for h in history]
    assert watermarks == sorted(watermarks) and len(history) >= 3
    assert [h["current"] for h in history].count(True) == 1 and history[-1]["current"]
    assert "ledger_json" not in history[0]
    code, out, _ = cli(capsys, "history", SESSION)
    assert code == 0 and str(watermarks[-1]) in out and "offline" in out

    target = history[-2]["watermark"]
    code, out, _ = cli(capsys, "rewind", SESSION, str(target))
    assert code == 0 and f"watermark {target}" in out
    assert session.state(SESSION).watermark == target
    code, _, err = cli(capsys, "rewind", SESSION, str(target + 1))
    assert code == 1 and "no kept summary at watermark" in err and "Traceback" not in err
    code, out, _ = cli(capsys, "rewind", SESSION, "0")
    assert code == 0 and "no summary is current" in out


def test_unknown_session_is_a_clean_error(urls: tuple[str, str],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    for command in (["stats"], ["show"], ["history"], ["compact"], ["rewind"]):
        argv = [*command, "nobody", *(["3"] if command == ["rewind"] else [])]
        code, _, err = cli(capsys, *argv)
        assert code == 1 and "no session 'nobody'" in err, (command, err)


def test_tenant_option_reads_another_tenant(store: SessionStore,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    store.for_tenant("acme").append("t1", split_turns(2)[0])
    assert cli(capsys, "stats", "t1")[0] == 1
    assert cli_json(capsys, "stats", "t1", "--tenant", "acme")["tenant"] == "acme"


# -- errors ----------------------------------------------------------------------------------------
def test_unreachable_redis_is_one_clean_line(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COMPACTION_REDIS_URL", "redis://:hunter2@127.0.0.1:1/0")
    for argv in (["stats", "s"], ["show", "s"], ["history", "s"], ["rewind", "s", "1"],
                 ["compact", "s"]):
        code, _, err = cli(capsys, *argv)
        assert code == 1
        assert err.startswith("error: cannot reach Redis at redis://:***@127.0.0.1:1/0")
        assert "hunter2" not in err and "Traceback" not in err


def test_bad_settings_exit_2_naming_the_variable(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COMPACTION_TRIGGER_RATIO", "2")
    for argv in (["stats", "s"], ["doctor"], ["demo"]):
        code, _, err = cli(capsys, *argv)
        assert code == 2 and "COMPACTION_TRIGGER_RATIO" in err, err


def test_invalid_redis_url_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COMPACTION_REDIS_URL", "foo://nowhere")
    code, _, err = cli(capsys, "stats", "s")
    assert code == 2 and "COMPACTION_REDIS_URL" in err


def test_first_lines_skip_headings_and_clip() -> None:
    text = "## Goal\n\nShip it.\n## Progress\n" + "x" * 200
    assert first_lines(text) == "Ship it.\n" + "x" * 89 + "…"


# -- doctor ---------------------------------------------------------------------------------
def verdicts(checks: list[dict[str, str]]) -> dict[str, str]:
    return {c["name"]: c["verdict"] for c in checks}


def test_doctor_without_workers_fails_on_workers(urls: tuple[str, str],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "doctor", "--timeout", "0.5", "--json")
    assert code == 1
    found = verdicts(json.loads(out))
    assert found["redis store"] == "OK" and found["queue"] == "OK"
    assert found["broker"] in ("OK", "WARN") and found["workers"] == "FAIL"
    assert found["summarizer"] == "OK"
    code, out, _ = cli(capsys, "doctor", "--timeout", "0.5")
    assert code == 1 and "FAIL workers" in out and "OK   redis store" in out


def test_doctor_with_a_bad_redis_url(monkeypatch: pytest.MonkeyPatch, urls: tuple[str, str],
                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COMPACTION_REDIS_URL", "redis://:hunter2@127.0.0.1:1/0")
    code, out, err = cli(capsys, "doctor", "--timeout", "0.5")
    assert code == 1 and "Traceback" not in out + err and "hunter2" not in out
    assert "FAIL redis store cannot reach Redis at redis://:***@127.0.0.1:1/0" in out
    monkeypatch.setenv("COMPACTION_REDIS_URL", "foo://nowhere")
    code, out, _ = cli(capsys, "doctor", "--timeout", "0.5")
    assert code == 1 and "invalid COMPACTION_REDIS_URL" in out


def test_doctor_with_an_unreachable_broker(monkeypatch: pytest.MonkeyPatch,
                                           urls: tuple[str, str],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COMPACTION_BROKER_URL", "redis://127.0.0.1:1/1")
    found = verdicts(json.loads(cli(capsys, "doctor", "--timeout", "0.5", "--json")[1]))
    assert found == {"redis store": "OK", "broker": "FAIL", "queue": "FAIL",
                     "workers": "FAIL", "summarizer": "OK"}


@pytest.mark.celery
def test_doctor_all_ok_with_a_worker_on_the_broker(urls: tuple[str, str],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """An in-process Celery worker consuming the real broker answers ping and inspect."""
    from workers.harness.stack.demo import choose_backends, open_stack
    from workers.settings import load_settings

    settings = load_settings()
    backends = choose_backends(settings, "embedded")
    with open_stack(settings, backends, concurrency=1):
        code, out, _ = cli(capsys, "doctor", "--timeout", "2", "--json")
    found = verdicts(json.loads(out))
    assert found["workers"] == "OK", out
    assert code == (1 if "FAIL" in found.values() else 0)
    assert "FAIL" not in found.values(), out


def test_doctor_checks_an_openai_compatible_summarizer(
        monkeypatch: pytest.MonkeyPatch, urls: tuple[str, str],
        capsys: pytest.CaptureFixture[str]) -> None:
    with FakeOpenAIServer(model="summary-model") as server:
        monkeypatch.setenv("COMPACTION_SUMMARIZER", "openai")
        monkeypatch.setenv("COMPACTION_SUMMARIZER_BASE_URL", server.base_url)
        monkeypatch.setenv("COMPACTION_SUMMARIZER_API_KEY", "k")
        monkeypatch.setenv("COMPACTION_SUMMARIZER_MODEL", "summary-model")
        checks = json.loads(cli(capsys, "doctor", "--timeout", "0.5", "--json")[1])
        assert checks[-1]["verdict"] == "OK" and "summary-model" in checks[-1]["detail"]
        monkeypatch.setenv("COMPACTION_SUMMARIZER_MODEL", "other-model")
        checks = json.loads(cli(capsys, "doctor", "--timeout", "0.5", "--json")[1])
        assert checks[-1]["verdict"] == "WARN" and "other-model" in checks[-1]["detail"]
    monkeypatch.setenv("COMPACTION_SUMMARIZER_BASE_URL", "http://127.0.0.1:1/v1")
    checks = json.loads(cli(capsys, "doctor", "--timeout", "0.5", "--json")[1])
    assert checks[-1]["verdict"] == "FAIL" and "cannot connect" in checks[-1]["detail"]


def test_doctor_checks_a_gemini_summarizer(monkeypatch: pytest.MonkeyPatch,
                                           urls: tuple[str, str],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    with FakeGeminiServer() as server:
        monkeypatch.setenv("COMPACTION_SUMMARIZER", "gemini")
        monkeypatch.setenv("COMPACTION_SUMMARIZER_BASE_URL", server.base_url)
        monkeypatch.setenv("COMPACTION_SUMMARIZER_API_KEY", "k")
        checks = json.loads(cli(capsys, "doctor", "--timeout", "1", "--json")[1])
    assert checks[-1]["verdict"] == "OK", checks[-1]
    assert "countTokens" in checks[-1]["detail"]
    assert [r.path for r in server.requests if "countTokens" in r.path]


# -- the example agent loop ----------------------------------------------------------------------
def load_example() -> Any:
    spec = importlib.util.spec_from_file_location("agent_loop", ROOT / "examples" / "agent_loop.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_agent_loop_example_calls_tools_and_recovers_from_an_overflow(
        tmp_path: Path, store: SessionStore, urls: tuple[str, str], key_prefix: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    words = " ".join(f"token{i}" for i in range(2000))
    (tmp_path / "big.txt").write_text(words[:9000])
    (tmp_path / "notes.txt").write_text(words[:4000])

    def read(call_id: str, path: str) -> dict[str, Any]:
        return {"role": "assistant", "content": None, "tool_calls": [{
            "id": call_id, "type": "function",
            "function": {"name": "read_file", "arguments": json.dumps({"path": path})}}]}

    script = [read("call_1", "big.txt"), {"role": "assistant", "content": "Big file read."},
              read("call_2", "notes.txt"), {"role": "assistant", "content": "Notes read."}]
    session_id = f"{key_prefix}-loop"
    with FakeOpenAIServer(window=3000, responder=script) as server:
        code = load_example().main([
            "--base-url", server.base_url, "--api-key", "test", "--model", "gpt-4o",
            "--window", "32000", "--max-tokens", "300", "--root", str(tmp_path),
            "--redis-url", urls[0], "--session", session_id,
            "--prompt", "Read big.txt", "--prompt", "Now notes.txt"])
        statuses = [r.status for r in server.requests]
    out, err = capsys.readouterr()
    assert code == 0
    assert "Big file read." in out and "Notes read." in out
    assert 400 in statuses and statuses[-1] == 200, statuses
    assert "context overflow: retried" in err
    agent_store = SessionStore(store.redis)  # the example uses the default key prefix
    try:
        assert agent_store.length(session_id) == 8  # two turns: user, call, result, answer
        assert agent_store.state(session_id).learned_window == 3000
    finally:
        agent_store.delete_session(session_id)
