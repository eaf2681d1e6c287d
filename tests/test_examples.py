"""Every documented example runs as written: README.md and examples/.

Fenced blocks say what they are in their info string:

- ```` ```bash runnable ````: run with bash from the repository root. The
  test only swaps in its own port, file names, Redis database and the
  interpreter (``.venv/bin/python``, ``compaction``); nothing else changes.
- ```` ```python fragment ````: a piece of an agent loop; the prose around
  it names the variables that are "yours" and this test supplies them
  (a client of the fake OpenAI server, a real Redis and broker).

Every ``python`` and ``bash`` block is one of these or explicitly left out
here (``NOT_RUN``, each with the reason), so a new example cannot go
untested by accident. ``examples/*.py`` run offline against the fake
OpenAI-compatible server (``workers/harness/fakes/openai_server.py``).
"""

from __future__ import annotations

import os
import re
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from shared import (
    CeleryEnqueuer,
    ContextGuard,
    SessionStore,
    StoreUnavailable,
    connect,
    from_openai,
    publisher_app,
)
from workers.harness.fakes.openai_server import FakeOpenAIServer
from workers.harness.stack.worker_process import purge_queue
from workers.urls import with_db

openai = pytest.importorskip("openai")  # the dev extra installs it; the examples need it

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "examples").glob("*.md"))]
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)

# Blocks that are documentation but not run here, by their first line, with the reason.
NOT_RUN = {
    "# 1. the main job: replay a long agent session through guard + workers (embedded: "
    "no servers, no keys)":
        "Quickstart: command 1 is tests/test_install.py's fresh venv plus test_embedded_demo.py; "
        "command 2 is the whole CI run",
    "export OPENAI_API_KEY=sk-...": "needs a real provider and its key",
    "from shared.integrations.langchain import ContextGuardMiddleware":
        "an excerpt of examples/langchain_agent.py, run by tests/test_integrations_examples.py",
    "from shared.integrations.pydantic_ai import ContextGuardCapability":
        "an excerpt of examples/pydantic_ai_agent.py, run by tests/test_integrations_examples.py",
    "from shared.integrations.agents_sdk import GuardedSession":
        "an excerpt of examples/agents_sdk_agent.py, run by tests/test_server_examples.py",
    'hits = guard.recall(sid, "src/app/main.py ERR_CONN_RESET", limit=5)  # [RecallHit(index, '
    'role, text, score)]':
        "needs a compacted session; tests/test_recall_index.py runs the same calls",
    "celery -A workers.app worker --pool threads -c 8 &   # consumes COMPACTION_QUEUE":
        "starts deployed workers and runs an open-ended agent ('...')",
}


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    language: str
    kind: str
    code: str

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks() -> list[Block]:
    found = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            words = match.group(1).split()
            language = words[0] if words else ""
            kind = words[1] if len(words) > 1 else ""
            line = text.count("\n", 0, match.start()) + 1
            found.append(Block(path, line, language, kind, match.group(2)))
    return found


def of_kind(language: str, kind: str) -> list[Any]:
    return [pytest.param(b, id=b.name) for b in blocks()
            if b.language == language and b.kind == kind]


def test_every_code_block_is_run_or_says_why_not() -> None:
    untested = [b.name for b in blocks() if b.language in ("python", "bash", "sh")
                and b.kind not in ("runnable", "fragment")
                and b.code.splitlines()[0].strip() not in NOT_RUN]
    assert untested == [], f"mark these blocks runnable/fragment or list them in NOT_RUN: " \
                           f"{untested}"
    first_lines = {b.code.splitlines()[0].strip() for b in blocks()}
    assert set(NOT_RUN) <= first_lines, "NOT_RUN names a block that no longer exists"
    assert of_kind("bash", "runnable") and of_kind("python", "fragment")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def urls(own_redis_url: str, key_prefix: str) -> Iterator[tuple[str, str]]:
    store_url, broker_url = with_db(own_redis_url, 13), with_db(own_redis_url, 14)
    purge_queue(broker_url)
    yield store_url, broker_url
    purge_queue(broker_url)
    client = redis.Redis.from_url(store_url)
    for key in client.scan_iter(match=f"{key_prefix}:*", count=1000):
        client.delete(key)
    client.close()


@pytest.fixture
def shims(tmp_path: Path) -> Path:
    """``.venv/bin/python`` and ``compaction`` of this checkout, whatever venv runs the tests."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, command in (("python", f'exec "{sys.executable}" "$@"'),
                          ("compaction", f'exec "{sys.executable}" -m workers.cli.main "$@"')):
        script = bin_dir / name
        script.write_text(f"#!/bin/sh\n{command}\n")
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def run_bash(code: str, shims: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_")}
    return subprocess.run(
        ["bash", "-e", "-c", code], cwd=ROOT, capture_output=True, text=True,
        timeout=240, check=False,
        env={**clean, **env, "PATH": f"{shims}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT),
             "COLUMNS": "80"})


@pytest.mark.parametrize("block", of_kind("bash", "runnable"))
def test_runnable_bash_blocks(block: Block, tmp_path: Path, shims: Path, key_prefix: str,
                              urls: tuple[str, str]) -> None:
    code = block.code.replace(".venv/bin/python", str(shims / "python"))
    code = code.replace("--port 8001", f"--port {(port := free_port())}")
    code = code.replace("127.0.0.1:8001", f"127.0.0.1:{port}")
    code = code.replace("/tmp/script.jsonl", str(tmp_path / "script.jsonl"))
    code = code.replace("redis://127.0.0.1:6379/0", urls[0])
    done = run_bash(code, shims, {"COMPACTION_KEY_PREFIX": key_prefix,
                                  "COMPACTION_REDIS_URL": urls[0]})
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{block.name} failed:\n{output[-3000:]}"
    assert "Traceback" not in output and "error:" not in output, output[-3000:]
    if "agent_loop.py" in code:  # what examples/README.md says the output shows
        assert "[guard] context overflow: retried with" in done.stderr
        assert "(window 3000)" in done.stderr
        assert "README.md describes the service." in done.stdout
        assert "CONTRIBUTING.md maps the modules." in done.stdout
    if "compaction stats" in code:
        assert "readme-1" in done.stdout and "context" in done.stdout
        assert max(len(line) for line in done.stdout.splitlines()) <= 80


def read_call(call_id: str, path: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [{
        "id": call_id, "type": "function",
        "function": {"name": "read_file", "arguments": f'{{"path": "{path}"}}'}}]}


@pytest.mark.parametrize("block", of_kind("python", "fragment"))
def test_python_fragments(block: Block, urls: tuple[str, str], key_prefix: str,
                          capsys: pytest.CaptureFixture[str]) -> None:
    """Run the block with the names its prose says are yours; it must complete a turn."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("agent_loop", ROOT / "examples" / "agent_loop.py")
    assert spec is not None and spec.loader is not None
    agent_loop = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent_loop)
    sid = f"{key_prefix}-fragment"
    store = SessionStore(connect(urls[0]))
    tool_loop = "run_tool(c)" in block.code
    # the tool loop reads README.md (large): the server's small window makes one call overflow
    script = [read_call("call_1", "README.md"), {"role": "assistant", "content": "Read it."}]
    with FakeOpenAIServer(window=3000 if tool_loop else 128_000,
                          responder=script if tool_loop else None) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0)
        names: dict[str, Any] = {
            "openai": openai, "from_openai": from_openai, "ContextGuard": ContextGuard,
            "SessionStore": SessionStore, "connect": connect, "CeleryEnqueuer": CeleryEnqueuer,
            "publisher_app": publisher_app, "REDIS_URL": urls[0], "BROKER_URL": urls[1],
            "client": client, "sid": sid, "text": "What is in README.md?", "unrecorded": [],
            "StoreUnavailable": StoreUnavailable,
            "SYSTEM": agent_loop.SYSTEM, "TOOLS": agent_loop.TOOLS, "MODEL": "gpt-4o",
            "guard": ContextGuard(store, overrides={"gpt-4o": 32_000}),
            "run_tool": lambda call: agent_loop.run_tool(
                ROOT, call.function.name, call.function.arguments),
        }
        try:
            exec(compile(block.code, block.name, "exec"), names)
            statuses = [r.status for r in server.requests]
            assert statuses and statuses[-1] == 200, statuses
            assert store.length(sid) >= 2, "the turn was recorded"
            if tool_loop:
                assert 400 in statuses, "the small window made one call overflow"
                assert store.length(sid) == 4
        finally:
            store.delete_session(sid)


def test_the_agent_loop_rides_out_a_redis_outage(urls: tuple[str, str],
                                                 key_prefix: str) -> None:
    """The README's loop, one guard for every turn, with Redis down for two turns (a
    restart without persistence: it comes back empty): the model still answers (a view of
    the turn alone), the turns are kept, and the next turn, Redis back, records them all,
    in order, before its own."""
    from workers.harness.stack.redis_server import start_server

    (block,) = [b for b in blocks() if b.kind == "fragment" and "unrecorded" in b.code]
    sid = f"{key_prefix}-outage"
    redis_server = start_server()
    store = SessionStore(connect(redis_server.url))
    guard = ContextGuard(store, CeleryEnqueuer(publisher_app(urls[1])))
    unrecorded: list[Any] = []
    try:
        with FakeOpenAIServer(window=128_000) as server:
            client = openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0)
            redis_server.stop()
            for text in ("first, Redis down", "second, still down", "third"):
                if text == "third":
                    redis_server.start()
                exec(compile(block.code, block.name, "exec"), {
                    "openai": openai, "from_openai": from_openai,
                    "StoreUnavailable": StoreUnavailable, "guard": guard, "client": client,
                    "sid": sid, "text": text, "SYSTEM": "You are terse.", "TOOLS": [],
                    "MODEL": "gpt-4o", "unrecorded": unrecorded})
            assert [r.status for r in server.requests] == [200, 200, 200]
            asked = [[m["content"] for m in r.body["messages"] if m["role"] == "user"]
                     for r in server.requests]
        # Redis down: the turn once, alone; back: the missed turns in the view, in order
        assert asked[:2] == [["first, Redis down"], ["second, still down"]]
        assert asked[2] == ["first, Redis down", "second, still down", "third"]
        assert unrecorded == []
        assert [m.text() for m in store.messages(sid) if m.role == "user"] == [
            "first, Redis down", "second, still down", "third"]
        assert store.length(sid) == 6
    finally:
        redis_server.remove()


def test_the_agent_loop_sends_the_reserve_the_window_leaves(urls: tuple[str, str],
                                                            key_prefix: str) -> None:
    """The README's loop on a model whose window leaves no room for its ``max_tokens``
    (3,000 tokens, 2,000 asked for: a small self-hosted model): the guard reserves less
    and the loop sends that reserve, so every turn is answered. Sending the 2,000 asked
    for instead, the retry after a recovery was refused again and the loop raised."""
    (block,) = [b for b in blocks() if b.kind == "fragment" and "unrecorded" in b.code]
    sid = f"{key_prefix}-small"
    store = SessionStore(connect(urls[0]))
    guard = ContextGuard(store, CeleryEnqueuer(publisher_app(urls[1])))
    unrecorded: list[Any] = []
    try:
        with FakeOpenAIServer(window=3000) as server:
            client = openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0)
            for turn, words in enumerate((40, 40, 150, 40)):
                exec(compile(block.code, block.name, "exec"), {
                    "openai": openai, "from_openai": from_openai,
                    "StoreUnavailable": StoreUnavailable, "guard": guard, "client": client,
                    "sid": sid, "text": f"turn {turn}: " + "look at src/app/main.py and " * words,
                    "SYSTEM": "You are terse.", "TOOLS": [], "MODEL": "gpt-4o",
                    "unrecorded": unrecorded})
            assert server.requests[-1].status == 200
        assert store.length(sid) == 8 and unrecorded == []
    finally:
        store.delete_session(sid)


def test_examples_agent_loop_sends_the_reserve_the_window_leaves(tmp_path: Path) -> None:
    """``examples/agent_loop.py`` on a model whose window leaves no room for its
    ``--max-tokens`` (3,000 tokens, 2,000 asked for): it sends the view's reserve, so every
    turn is answered (sending ``--max-tokens`` itself, a call and its retry after recover
    were refused and the loop raised)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("agent_loop", ROOT / "examples" / "agent_loop.py")
    assert spec is not None and spec.loader is not None
    agent_loop = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent_loop)
    with FakeOpenAIServer(window=3000) as server:
        code = agent_loop.main([
            "--base-url", server.base_url, "--api-key", "test", "--model", "small-model",
            "--window", "3000", "--max-tokens", "2000", "--root", str(tmp_path),
            *("--prompt", "look at src/app/main.py and " * 150),
            *("--prompt", "and now the tests, please " * 40)])
        assert code == 0
        assert [r.status for r in server.requests][-1] == 200
        sent = [r.body["max_tokens"] for r in server.requests]
    assert sent and all(tokens < 2000 for tokens in sent)
