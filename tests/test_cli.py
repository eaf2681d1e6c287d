"""The operations commands against the real Redis, through ``workers.cli.main.main``.

Every test has its own key prefix (db 13 for sessions, db 14 as the broker)
and cleans up. Sessions are prepared through the store and the guard, as
an agent would leave them; compactions are made by the real task
(``compact --wait``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
from workers.urls import with_db

ROOT = Path(__file__).resolve().parents[1]
SESSION = "ops-1"
CLEARED = ("COMPACTION_TENANT", "COMPACTION_SUMMARIZER", "COMPACTION_SUMMARIZER_MODEL",
           "COMPACTION_SUMMARIZER_BASE_URL", "COMPACTION_SUMMARIZER_API_KEY",
           "COMPACTION_TRIGGER_RATIO")


@pytest.fixture
def urls(own_redis_url: str, key_prefix: str,
         monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    store_url, broker_url = with_db(own_redis_url, 13), with_db(own_redis_url, 14)
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
    code, out, _ = cli(capsys, "rewind", SESSION, str(target), "--yes")
    assert code == 0 and f"watermark {target}" in out
    assert session.state(SESSION).watermark == target
    code, _, err = cli(capsys, "rewind", SESSION, str(target + 1), "--yes")
    assert code == 2 and "no kept summary at watermark" in err and "Traceback" not in err
    code, out, _ = cli(capsys, "rewind", SESSION, "0", "--yes")
    assert code == 0 and "no summary is current" in out


def test_compact_wait_with_a_failing_summarizer_is_one_line(
        session: SessionStore, tmp_path: Path) -> None:
    """The real command: the job's failure is one ``compaction: error:`` line, not Celery's
    "raised unexpected" traceback (celery.app.trace logs it during the inline run)."""
    broken = tmp_path / "openai"
    broken.mkdir()
    (broken / "__init__.py").write_text('raise ImportError("simulated")\n')
    env = {**os.environ, "COMPACTION_SUMMARIZER": "openai", "COMPACTION_SUMMARIZER_API_KEY": "k",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    done = subprocess.run([sys.executable, "-m", "workers.cli.main", "compact", SESSION,
                           "--wait", "--force"], env=env, capture_output=True, text=True,
                          timeout=120, cwd=ROOT, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "compaction: error: COMPACTION_SUMMARIZER=openai needs the 'openai' extra: "
        "pip install 'context-compaction[openai]'"], done.stderr


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
        assert err.startswith("compaction: error: cannot reach Redis at redis://:***@127.0.0.1:1/0")
        assert "hunter2" not in err and "Traceback" not in err


def test_bad_settings_exit_2_naming_the_variable(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COMPACTION_TRIGGER_RATIO", "2")
    for argv in (["stats", "s"], ["doctor"], ["demo"]):
        code, _, err = cli(capsys, *argv)
        assert code == 2 and "COMPACTION_TRIGGER_RATIO" in err, err


@pytest.mark.parametrize(("variable", "value"), [
    ("COMPACTION_SERVER_PORT", "70000"), ("COMPACTION_SERVER_MAX_BODY_BYTES", "abc"),
    ("COMPACTION_SERVER_TOKENS", '{"too-short": "acme"}')])
def test_doctor_refuses_what_serve_would_refuse(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str],
                                                variable: str, value: str) -> None:
    """docs/upgrading.md has operators run ``doctor`` on the new pods' environment before
    rolling; a server setting ``compaction serve`` stops on must stop it too (it passed)."""
    monkeypatch.setenv(variable, value)
    code, _, err = cli(capsys, "doctor", "--timeout", "0.5")
    assert code == 2 and variable in err and "Traceback" not in err, err


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
    assert found["guard reads"] == "OK"
    assert found["broker"] in ("OK", "WARN") and found["workers"] == "FAIL"
    assert found["summarizer"] == "OK"
    # the hint is the command the Procfile (and README, compose, the image) runs
    procfile = dict(line.split(": ", 1) for line in
                    (ROOT / "Procfile").read_text().splitlines() if ": " in line)
    (workers,) = [c for c in json.loads(out) if c["name"] == "workers"]
    assert f"as the Procfile does: {procfile['worker']})" in workers["detail"], workers
    code, out, _ = cli(capsys, "doctor", "--timeout", "0.5")
    assert code == 1 and "FAIL workers" in out and "OK   redis store" in out


def test_doctor_with_a_bad_redis_url(monkeypatch: pytest.MonkeyPatch, urls: tuple[str, str],
                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COMPACTION_REDIS_URL", "redis://:hunter2@127.0.0.1:1/0")
    code, out, err = cli(capsys, "doctor", "--timeout", "0.5")
    assert code == 1 and "Traceback" not in out + err and "hunter2" not in out
    assert "FAIL redis store cannot reach Redis at redis://:***@127.0.0.1:1/0" in out
    monkeypatch.setenv("COMPACTION_REDIS_URL", "foo://nowhere")  # refused by the settings
    code, _, err = cli(capsys, "doctor", "--timeout", "0.5")
    assert code == 2 and "COMPACTION_REDIS_URL='foo://nowhere'" in err


def test_doctor_with_an_unreachable_broker(monkeypatch: pytest.MonkeyPatch,
                                           urls: tuple[str, str],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COMPACTION_BROKER_URL", "redis://127.0.0.1:1/1")
    found = verdicts(json.loads(cli(capsys, "doctor", "--timeout", "0.5", "--json")[1]))
    assert found == {"redis store": "OK", "guard reads": "OK", "clock": "OK", "broker": "FAIL",
                     "queue": "FAIL", "workers": "FAIL", "summarizer": "OK"}


@pytest.mark.celery
def test_doctor_all_ok_with_a_worker_on_the_broker(urls: tuple[str, str],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """An in-process Celery worker consuming the real broker answers ping and inspect."""
    from workers.app import app
    from workers.harness.stack.demo import choose_backends, open_stack
    from workers.settings import load_settings

    settings = load_settings()
    backends = choose_backends(settings, "embedded")
    try:
        with open_stack(settings, backends, concurrency=1):
            code, out, _ = cli(capsys, "doctor", "--timeout", "2", "--json")
    finally:
        # The worker answered remote control on this broker, and the worker app's cached
        # Control stays bound to it: every later in-process worker of this process (on
        # another broker) then missed its remote shutdown and took ~4 s to stop. Forget
        # it, as the stack forgets the app's pools (harness: _drop_connections).
        app.__dict__.pop("control", None)
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


@contextlib.contextmanager
def example_agent(tmp_path: Path) -> Iterator[tuple[Any, SessionStore, Any, Any]]:
    """examples/agent_loop.py's agent on a redis-server of its own (to stop and start)
    and the fake OpenAI server: (agent, store, fake server, redis-server)."""
    import openai

    from shared.store.sessions import connect
    from workers.harness.stack.redis_server import start_server

    own = start_server()
    try:
        store = SessionStore(connect(own.url))
        with FakeOpenAIServer(window=128_000) as server:
            client = openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0)
            yield (load_example().Agent(ContextGuard(store), client, "gpt-4o", 300, tmp_path),
                   store, server, own)
    finally:
        own.remove()


def users_asked(server: Any) -> list[list[str]]:
    return [[m["content"] for m in r.body["messages"] if m["role"] == "user"]
            for r in server.requests]


@pytest.mark.redis
def test_agent_loop_example_rides_out_a_redis_outage(tmp_path: Path) -> None:
    """As the README's loop: while Redis is down the turns are answered (a view of the
    turns the agent holds unrecorded, then the new one), and once Redis is back (a restart
    without persistence: empty) they are recorded, in order and once, before the first
    turn it answers, whose view holds them."""
    with example_agent(tmp_path) as (agent, store, server, own):
        own.stop()
        texts = ["first, Redis down", "second, still down", "third"]
        for text in texts[:2]:
            assert agent.turn("outage", text)
        assert len(agent.unrecorded) == 2
        own.start()
        assert agent.turn("outage", texts[2])
        assert users_asked(server) == [texts[:1], texts[:2], texts]
        assert agent.unrecorded == []
        assert [m.text() for m in store.messages("outage") if m.role == "user"] == texts
        assert store.length("outage") == 6


@pytest.mark.redis
def test_agent_loop_example_keeps_the_recorded_history_through_an_outage_and_flushes_at_exit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A turn recorded before Redis stops stays in the outage view (not only the turns
    Redis missed), and at the loop's end a turn still unrecorded is said to be lost, or
    recorded when Redis answers again."""
    with example_agent(tmp_path) as (agent, store, server, own):
        assert agent.turn("outage", "my name is Ada")
        redis.Redis.from_url(own.url).save()
        own.stop()
        assert agent.turn("outage", "what is my name?")
        assert users_asked(server)[1] == ["my name is Ada", "what is my name?"]
        assert agent.finish("outage") == 1
        assert "1 turns of session 'outage' were not recorded" in capsys.readouterr().err
        own.start()
        assert agent.finish("outage") == 0
        assert [m.text() for m in store.messages("outage") if m.role == "user"] == [
            "my name is Ada", "what is my name?"]


# -- a CLI like the well-made ones ------------------------------------------------------------
def widest(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


def test_version_comes_from_the_package_metadata(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib import metadata

    with pytest.raises(SystemExit) as stopped:
        main(["--version"])
    assert stopped.value.code == 0
    assert capsys.readouterr().out.strip() == f"compaction {metadata.version('context-compaction')}"


def test_stats_history_show_sessions_fit_80_columns(
        session: SessionStore, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    session.for_tenant("a-long-tenant-name").append("x" * 120, split_turns(1)[0])
    assert cli(capsys, "compact", SESSION, "--wait")[0] == 0
    monkeypatch.setenv("COLUMNS", "80")
    for argv in (["stats", SESSION], ["history", SESSION], ["show", SESSION],
                 ["show", SESSION, "--chars", "0"], ["sessions"], ["doctor", "--timeout", "0.3"]):
        code, out, err = cli(capsys, *argv)
        assert code in (0, 1) and out, (argv, err)
        assert widest(out) <= 80, (argv, max(out.splitlines(), key=len))
        assert "-0%" not in out and "-0.0%" not in out


def test_stats_history_show_have_json(session: SessionStore,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_json(capsys, "stats", SESSION)["limits_detail"].startswith("override")
    assert isinstance(cli_json(capsys, "history", SESSION), list)
    assert cli_json(capsys, "show", SESSION)["messages"]


def test_pct_and_human_never_print_negative_zero() -> None:
    from workers.cli._format import human, pct

    assert pct(-0.0) == "0%" and pct(-0.0001, 1) == "0.0%" and pct(-0.004) == "0%"
    assert pct(-0.5) == "-50%" and pct(0.123, 1) == "12.3%" and pct(1.0) == "100%"
    assert human(-0.0) == "0" and human(-40) == "-40" and human(12_345) == "12.3k"


def test_errors_have_one_prefix_never_stacked(
        urls: tuple[str, str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from workers.cli.main import message_of

    assert message_of(Exception("error: error: boom")) == "boom"
    assert message_of(Exception("compaction: error: configuration error: X")) == "X"
    cases = [(["stats", "nobody"], 1), (["sessions", "--prefix", "bad id"], 2),
             (["show", "nobody", "--tools", "/nonexistent.json"], 2), (["stats"], 2),
             (["sessions", "--limit", "0"], 2), (["rewind", "s", "x"], 2)]
    for argv, expected in cases:
        try:
            code, _, err = cli(capsys, *argv)
        except SystemExit as stopped:  # argparse: usage line, then the error line
            code, err = int(str(stopped.code)), capsys.readouterr().err
        last = err.strip().splitlines()[-1]
        assert code == expected, (argv, err)
        assert last.startswith("compaction: error: "), (argv, err)
        assert last.count("error:") == 1 and "Traceback" not in err, (argv, err)
    monkeypatch.setenv("COMPACTION_TRIGGER_RATIO", "2")
    code, _, err = cli(capsys, "stats", "s")
    assert code == 2 and err.count("error") == 1 and err.startswith("compaction: error: ")


# -- sessions ------------------------------------------------------------------------------------
def test_sessions_lists_filters_and_pages_with_scan(
        store: SessionStore, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    turn = split_turns(1)[0]
    for i in range(130):
        store.append(f"job-{i:03d}", turn)
    store.for_tenant("acme").append("job-999", turn)
    store.append("other-1", turn)
    commands: list[str] = []
    real_execute = redis.Redis.execute_command

    def spy(self: redis.Redis, *args: Any, **options: Any) -> Any:
        commands.append(str(args[0]).upper())
        return real_execute(self, *args, **options)

    monkeypatch.setattr(redis.Redis, "execute_command", spy)
    first = cli_json(capsys, "sessions", "--limit", "20")
    assert "KEYS" not in commands and "SCAN" in commands
    rows = first["sessions"]
    assert len(rows) >= 20 and first["cursor"] != 0
    row = rows[0]
    assert set(row) == {"tenant", "session_id", "messages", "tokens", "watermark", "model",
                        "idle_seconds"}
    assert row["messages"] == len(turn) and row["tokens"] > 0
    seen = {(r["tenant"], r["session_id"]) for r in rows}
    cursor = first["cursor"]
    while cursor:
        page = cli_json(capsys, "sessions", "--limit", "20", "--cursor", str(cursor))
        seen |= {(r["tenant"], r["session_id"]) for r in page["sessions"]}
        cursor = page["cursor"]
    assert len(seen) == 132 and ("acme", "job-999") in seen
    acme = cli_json(capsys, "sessions", "--tenant", "acme", "--limit", "1000")
    assert [r["session_id"] for r in acme["sessions"]] == ["job-999"] and acme["cursor"] == 0
    other = cli_json(capsys, "sessions", "--prefix", "other", "--limit", "1000")
    assert [r["session_id"] for r in other["sessions"]] == ["other-1"]
    code, out, _ = cli(capsys, "sessions", "--limit", "10")
    assert code == 0 and "next page: compaction sessions --cursor" in out
    assert "last activity" in out and "job-" in out


def test_sessions_next_page_command_keeps_the_page_size(
        store: SessionStore, capsys: pytest.CaptureFixture[str]) -> None:
    """The command printed at the end of a page is the next page as the reader asked for
    it: with ``--limit 5`` it pages by 5 too, not by the default 50."""
    turn = split_turns(1)[0]
    for i in range(60):
        store.append(f"page-{i:03d}", turn)
    code, out, _ = cli(capsys, "sessions", "--prefix", "page", "--limit", "5")
    assert code == 0
    line = next(x for x in out.splitlines() if x.startswith("next page: compaction sessions"))
    argv = line.removeprefix("next page: compaction ").split()
    assert argv[argv.index("--limit") + 1] == "5" and "--prefix" in argv, line
    page = cli_json(capsys, *argv)
    assert 5 <= len(page["sessions"]) < 50, len(page["sessions"])


def test_sessions_report_the_logs_idle_time_and_leave_it_alone(
        store: SessionStore, capsys: pytest.CaptureFixture[str]) -> None:
    """The listing shows how long ago the log was last used, and listing is no use: it
    does not read the log (a read would reset the figure the next listing shows)."""
    turn = split_turns(1)[0]
    store.append("quiet-1", turn)
    log = store.keys("quiet-1").log
    dumped = store.redis.dump(log)
    store.redis.delete(log)
    store.redis.restore(log, 0, dumped, idletime=900)  # last used 15 minutes ago
    for _ in range(2):
        rows = cli_json(capsys, "sessions", "--prefix", "quiet")["sessions"]
        assert [(r["session_id"], r["messages"]) for r in rows] == [("quiet-1", len(turn))]
        assert rows[0]["idle_seconds"] >= 900


# -- bad input ------------------------------------------------------------------------------------
def test_bad_usage_and_orphan_tool_results_name_the_field(store: SessionStore) -> None:
    from shared.core.errors import InvalidInput

    guard = ContextGuard(store)
    user = {"role": "user", "content": "hi"}
    answer = {"role": "assistant", "content": "hello"}
    with pytest.raises(InvalidInput) as bad:
        guard.record_turn("bad-1", [user, answer], usage={"prompt_tokens": "abc"})
    assert bad.value.field == "usage.prompt_tokens" and "'abc'" in str(bad.value)
    for usage, field in [({"prompt_tokens": -3}, "usage.prompt_tokens"),
                         ({"input_tokens": 10, "cache_read_input_tokens": "x"},
                          "usage.cache_read_input_tokens"),
                         ({"prompt_tokens": 5, "completion_tokens": [1]},
                          "usage.completion_tokens"),
                         ("abc", "usage"), (True, "usage")]:
        with pytest.raises(InvalidInput) as bad:
            guard.record_turn("bad-1", [user, answer], usage=usage)
        assert bad.value.field == field, usage
    assert store.length("bad-1") == 0, "nothing is written when the input is bad"
    guard.record_turn("bad-1", [user, answer], usage={"prompt_tokens": 12.0, "total_tokens": 20})

    call = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "name": "f", "arguments": "{}"}]}
    result = {"role": "tool", "tool_call_id": "call_1", "content": "ok"}
    orphan = {"role": "tool", "tool_call_id": "call_x", "content": "??"}
    with pytest.raises(InvalidInput) as bad:
        guard.record_turn("bad-2", [user, call, result, orphan, answer])
    assert bad.value.field == "messages[3].tool_call_id" and "call_x" in str(bad.value)
    assert store.length("bad-2") == 0
    guard.record_turn("bad-2", [user, call, result, answer])
    # a turn that continues a stored call (results first) is not an orphan
    guard.record_turn("bad-2", [result, answer])


# -- where the window comes from ------------------------------------------------------------------
def test_unknown_model_warns_once_and_stats_names_the_fallback(
        store: SessionStore, caplog: pytest.LogCaptureFixture,
        capsys: pytest.CaptureFixture[str]) -> None:
    import secrets

    from shared.core.limits import model_limits

    model = f"house-model-{secrets.token_hex(3)}"
    with caplog.at_level("WARNING", logger="shared.core.limits"):
        for _ in range(3):
            assert model_limits(model).context_window == 128_000
    warnings = [r.getMessage() for r in caplog.records if model in r.getMessage()]
    assert len(warnings) == 1 and "128000" in warnings[0] and "fallback" in warnings[0]

    guard = ContextGuard(store)
    turns = split_turns(2)
    for sid, kind in (("w-fallback", model), ("w-registry", "gpt-4o")):
        guard.prepare(sid, "sys", None, 500, kind, pending=turns[0][:1])
        guard.record_turn(sid, turns[0])
    assert cli_json(capsys, "stats", "w-fallback")["limits_source"] == "fallback"
    assert cli_json(capsys, "stats", "w-registry")["limits_source"] == "registry"
    code, out, _ = cli(capsys, "stats", "w-fallback")
    assert code == 0 and "default fallback" in out
    assert "model registry" in cli(capsys, "stats", "w-registry")[1]


# -- optional extras ----------------------------------------------------------------------
def test_a_missing_extra_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    import workers.cli.replay

    def needs_openai(*_: Any) -> int:
        raise ModuleNotFoundError("No module named 'openai'", name="openai")

    monkeypatch.setattr(workers.cli.replay, "run", needs_openai)
    code, out, err = cli(capsys, "replay", "sessions.jsonl")
    assert code == 2 and out == ""
    assert err == ("compaction: error: replay needs the 'openai' extra: "
                   "pip install 'context-compaction[openai]'\n")

    def broken(*_: Any) -> int:
        raise ModuleNotFoundError("No module named 'nonexistent'", name="nonexistent")

    monkeypatch.setattr(workers.cli.replay, "run", broken)
    with pytest.raises(ModuleNotFoundError):  # a real bug is not disguised as an extra
        main(["replay", "sessions.jsonl"])


def test_the_cli_and_the_demo_load_no_optional_dependency() -> None:
    """``compaction --help`` and the embedded demo never load a provider SDK or tokenizer."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from workers.cli.main import main\n"
        "for argv in (['--help'], *([c, '--help'] for c in "
        "('demo','sessions','stats','show','compact','history','rewind','delete','doctor',"
        "'replay'))):\n"
        "    try: main(argv)\n"
        "    except SystemExit: pass\n"
        "import shared; shared.ContextGuard, shared.SessionStore, shared.from_openai\n"
        "tops = ('openai', 'google', 'tiktoken', 'flower', 'langchain')\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in tops)\n"
        "print('HEAVY', heavy, file=sys.stderr)\n"
        "assert main(['demo', '--turns', '4', '--pace', '0', '--json']) == 0\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in tops[:2] + tops[3:])\n"
        "print('DEMO', heavy, file=sys.stderr)\n")
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("COMPACTION_")}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=180, check=False, env={**env, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "HEAVY []" in done.stderr, done.stderr[-2000:]
    # the demo's provider simulation counts with tiktoken when it is installed (imported
    # inside a function, chars/4 otherwise); no provider SDK is ever loaded
    assert "DEMO []" in done.stderr, done.stderr[-2000:]


def test_doctor_warns_when_the_guard_must_read_every_call(
        monkeypatch: pytest.MonkeyPatch, urls: tuple[str, str]) -> None:
    import shared.store.own_writes as own_writes
    from workers.cli.doctor import check_tracking
    from workers.settings import load_settings

    assert check_tracking(load_settings()).verdict == "OK"
    monkeypatch.setattr(own_writes, "probe_verdict", lambda pushes, key: False)
    found = check_tracking(load_settings())
    assert found.verdict == "WARN" and "probe" in found.detail, found
    monkeypatch.setenv("COMPACTION_REDIS_CLUSTER", "true")
    monkeypatch.setenv("COMPACTION_REDIS_URL", "redis://127.0.0.1:6379/0")
    assert "Cluster" in check_tracking(load_settings()).detail


# -- one-line errors, closed pipes and capped reserves (audit F7, F8) ----------------------------
SERVER_TOKENS = json.dumps({"tok-aaaaaaaaaaaaaaaaaaaa": "acme"})


def one_line_error(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """Exit status and the stderr of a command that must fail in one line."""
    try:
        code, _, err = cli(capsys, *argv)
    except SystemExit as stopped:  # argparse
        code, err = int(str(stopped.code)), capsys.readouterr().err
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("compaction: error: ") and last.count("error:") == 1, err
    return code, last


def test_serve_without_a_token_or_with_a_bad_port_is_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("COMPACTION_SERVER_TOKENS", "COMPACTION_SERVER_TOKENS_FILE",
                 "COMPACTION_SERVER_PORT"):
        monkeypatch.delenv(name, raising=False)
    code, line = one_line_error(capsys, "serve", "--port", "0")
    assert code == 2 and "no bearer token configured" in line
    monkeypatch.setenv("COMPACTION_SERVER_TOKENS", SERVER_TOKENS)
    code, line = one_line_error(capsys, "serve", "--port", "99999")
    assert code == 2 and "--port=99999: " in line and "COMPACTION_SERVER_PORT" not in line
    monkeypatch.setenv("COMPACTION_SERVER_PORT", "99999")  # from the variable: named so
    code, line = one_line_error(capsys, "serve")
    assert code == 2 and "COMPACTION_SERVER_PORT='99999': " in line


def test_report_to_a_path_it_cannot_write_is_one_line(
        session: SessionStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for output in (tmp_path / "missing" / "x.html", tmp_path):
        code, line = one_line_error(capsys, "report", SESSION, "-o", str(output))
        assert code == 2 and "--output: " in line and str(output) in line
    code, _, _ = cli(capsys, "report", SESSION, "-o", str(tmp_path / "r.html"))
    assert code == 0 and (tmp_path / "r.html").read_text().startswith("<!doctype html>")


def test_demo_refuses_an_unwritable_report_before_playing(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("COMPACTION_BROKER_URL", raising=False)
    for output in (tmp_path / "missing" / "x.html", tmp_path):
        code, line = one_line_error(capsys, "demo", "--turns", "3", "--pace", "0", "--json",
                                    "--worker", "embedded", "--report", str(output))
        assert code == 2 and "--report: " in line
    assert capsys.readouterr().out == ""  # no figures: the demo never ran


def test_demo_sends_the_reserve_the_guard_capped(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """--max-tokens 20000 in a 16000 window: the guard caps the reserve, and the calls must
    send that value (output_reserve), not the one the provider refuses every time."""
    monkeypatch.delenv("COMPACTION_BROKER_URL", raising=False)
    code = main(["demo", "--turns", "3", "--pace", "0", "--json", "--worker", "embedded",
                 "--report", "", "--max-tokens", "20000"])
    captured = capsys.readouterr()
    figures = json.loads(captured.out)
    assert code == 0 and figures["failed_calls"] == 0
    assert figures["max_tokens"] == 16_000 - 1024
    assert "every call sends max_tokens 14976" in " ".join(captured.err.split())


def test_show_says_the_capped_reserve_and_never_empty_parentheses(
        session: SessionStore, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "show", SESSION, "--max-tokens", "999999", "--chars", "40")
    text = " ".join(out.split())
    assert code == 0 and "()" not in text
    capped = cli_json(capsys, "show", SESSION, "--max-tokens", "999999")["max_tokens"]
    # the window less the input's 1,024-token minimum and the request's fixed part
    assert 14_900 < capped <= 16_000 - 1024
    assert "--max-tokens 999999 leaves no input budget" in text and f"capped to {capped}" in text
    assert "the next call truncates (" in text


def test_bad_numbers_name_what_is_expected_not_a_function(
        urls: tuple[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["sessions", "--cursor", "abc"], ["sessions", "--limit", "x"],
                 ["demo", "--turns", "x"], ["demo", "--pace", "x"]):
        code, line = one_line_error(capsys, *argv)
        assert code == 2 and "expected a" in line and "_" not in line.split(":")[-2], line
    code, line = one_line_error(capsys, "sessions", "--cursor", "-1")
    assert code == 2 and "must be >= 0" in line


@pytest.mark.parametrize("argv", [["show", SESSION, "--chars", "0"], ["history", SESSION]])
def test_a_closed_pipe_ends_quietly(session: SessionStore, argv: list[str]) -> None:
    """`compaction show S | head -3`: the reader goes away; no error, no traceback, 141
    (128 + SIGPIPE, like any program the shell runs in a pipe), nothing at exit either."""
    child = subprocess.Popen([sys.executable, "-m", "workers.cli.main", *argv], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout is not None and child.stderr is not None
    child.stdout.close()  # before the child writes: its first write meets a closed pipe
    err = child.stderr.read().decode()
    assert child.wait(timeout=60) == 141, err
    assert err == ""
