"""The examples of the Agents SDK integration and the HTTP server run offline."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_example(name: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / name), *args], env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_agents_sdk_agent_runs_past_its_window() -> None:
    pytest.importorskip("agents")
    out = run_example("agents_sdk_agent.py", "--files", "24", "--window", "8192")
    assert "Audited 24 files" in out
    largest = int(re.search(r"largest prompt (\d+) tokens", out).group(1))  # type: ignore[union-attr]
    tool_tokens = int(re.search(r"~(\d+) tokens", out).group(1))  # type: ignore[union-attr]
    assert largest < 8192 < tool_tokens
    assert "0 refused for overflow" in out
    # the run was compacted, then recalled: the first read_file call, verbatim, index 1
    assert re.search(r"compacted up to message \d+; Recalled: \[message 1, assistant, score "
                     r"[0-9.]+\]\n+read_file \{\"path\": \"m1.py\"\}", out), out


def test_http_client_keeps_a_long_session_inside_the_window() -> None:
    pytest.importorskip("fastapi")
    out = run_example("http_client.py", "--turns", "80")
    match = re.search(r"80 turns, 160 messages stored, view at (\d+)% of the input budget, "
                      r"watermark (\d+)", out)
    assert match, out
    assert int(match.group(1)) <= 100 and int(match.group(2)) > 0


def documents(text: str) -> list[Any]:
    """The JSON documents curl printed one after another (no newline between them)."""
    decoder, out, pos = json.JSONDecoder(), [], 0
    while pos < len(text.rstrip()):
        value, pos = decoder.raw_decode(text, pos)
        out.append(value)
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return out


def run_docs_script(script: str, redis_url: str, key_prefix: str,
                    tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """A bash block of docs/server.md against a real ``compaction serve`` (tenant "docs")."""
    from workers.server.process import ServerProcess

    token = "docs-curl-token-0123456789"
    env = {"COMPACTION_REDIS_URL": redis_url, "COMPACTION_KEY_PREFIX": key_prefix,
           "COMPACTION_BROKER_URL": "memory://",
           "COMPACTION_SERVER_TOKENS": json.dumps({token: "docs"})}
    with ServerProcess(env) as server:
        done = subprocess.run(["bash", "-euc", script.replace("http://127.0.0.1:8080",
                                                              server.url)],
                              env={**os.environ, "TOKEN": token}, cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_the_curl_example_in_the_docs(redis_url: str, real_redis: object, key_prefix: str,
                                      tmp_path: Path) -> None:
    pytest.importorskip("fastapi")

    text = (ROOT / "docs" / "server.md").read_text()
    script = text.split("## curl", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    done = run_docs_script(script, redis_url, key_prefix, tmp_path)
    recorded, recovered, stats = documents(done.stdout)
    assert recorded == {"session_id": "demo-1", "length": 4}
    # the provider counted far more than the guard, and the turn it can drop holds a tool's
    # output (which may hold what the estimate missed): the retry holds the new question
    assert recovered["recovered"] is True
    assert [m["content"] for m in recovered["view"]["messages"][1:]] == ["And /lib?"]
    assert stats["length"] == 4 and stats["tenant"] == "docs"
    view = json.loads((tmp_path / "view.json").read_text())
    assert view["messages"][-1] == {"role": "user", "content": "What is in /src?"}


def _section(text: str, heading: str, fence: str) -> str:
    return text.split(heading, 1)[1].split(fence, 1)[1].split("```", 1)[0]


def test_the_recall_tool_in_the_docs_is_the_one_definition() -> None:
    from shared.core.recall_tool import recall_tool

    text = (ROOT / "docs" / "server.md").read_text()
    assert json.loads(_section(text, "## Recall", "```json")) == recall_tool("openai")


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_the_recall_curl_example_in_the_docs(redis_url: str, real_redis: Any,
                                             key_prefix: str, tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    from shared.core.config import StoreConfig
    from shared.guard import ContextGuard
    from shared.store.sessions import SessionStore
    from tests.recall_adapters_support import FACT, assert_recalled, compact, opening

    store = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix), tenant="docs")
    guard = ContextGuard(store)
    for i in range(4):  # the fact in turn 1's user message: index 2, as the docs show
        guard.record_turn("demo-1", [{"role": "user", "content": opening(i)},
                                     {"role": "assistant", "content": f"Noted, turn {i}."}])
    compact(store, "demo-1")
    script = _section((ROOT / "docs" / "server.md").read_text(), "## Recall", "```bash")
    done = run_docs_script(script, redis_url, key_prefix, tmp_path)
    [answer] = documents(done.stdout)
    assert answer["session_id"] == "demo-1" and len(answer["hits"]) <= 3
    assert (answer["hits"][0]["index"], answer["hits"][0]["text"]) == (2, FACT)
    assert_recalled(answer["text"], 2)
