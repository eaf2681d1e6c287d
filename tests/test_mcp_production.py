"""``compaction mcp`` as MCP clients run it, through the real SDK client and a real
Redis: what a model reads from ``recall`` (each passage once), argument schemas a
client can show and check, a server started before Redis, Ctrl-C under stdio, the
``python -m`` entry's errors, and the README's client configuration as written."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import pytest

pytest.importorskip("mcp")

from mcp import Client, StdioServerParameters

from shared.core.config import StoreConfig
from shared.store.recall_index import drop_index
from shared.store.sessions import SessionStore
from workers.cli.mcp import build_server
from workers.harness.stack.redis_server import RedisServer
from workers.settings import Settings

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[1]


def _bulky(n: int = 40) -> list[dict[str, Any]]:
    filler = "lorem ipsum needle " * 400
    return [{"role": "user", "content": f"needle ERR_{i} 日本語のログ {filler}"} for i in range(n)]


def _in_process(store: SessionStore, settings: Settings, calls: list[tuple[str, dict[str, Any]]]
                ) -> tuple[list[Any], list[Any]]:
    async def main() -> tuple[list[Any], list[Any]]:
        async with Client(build_server(store, settings)) as client:
            tools = (await client.list_tools()).tools
            return tools, [await client.call_tool(n, a) for n, a in calls]

    return anyio.run(main)


def test_recall_gives_the_model_each_passage_once(redis_url: str, real_redis: Any,
                                                  key_prefix: str) -> None:
    """The text block a model reads is the rendered hits, not a JSON dump holding every
    passage twice (in ``hits`` and again in the rendered ``text``)."""
    settings = Settings(redis_url=redis_url, key_prefix=key_prefix)
    store = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix))
    store.append("s1", _bulky())
    try:
        _, (compacted, found) = _in_process(store, settings, [
            ("compact", {"session_id": "s1", "keep_recent": 100}),
            ("recall", {"session_id": "s1", "query": "needle 日本語", "limit": 20})])
        assert not compacted.is_error and not found.is_error, found.content
        hits = found.structured_content["hits"]
        assert len(hits) == 20
        (block,) = found.content
        passages = sum(len(h["text"]) for h in hits)
        assert block.text.startswith("[message ")
        assert passages <= len(block.text) < passages * 1.2  # once, with a header per hit
        for hit in hits:
            assert f"[message {hit['index']}, {hit['role']}" in block.text
        assert "日本語" in block.text  # not escaped
        assert set(found.structured_content) == {"session_id", "hits"}
    finally:
        drop_index(store, "s1")


def test_tool_schemas_describe_and_bound_every_argument(redis_url: str, real_redis: Any,
                                                        key_prefix: str) -> None:
    settings = Settings(redis_url=redis_url, key_prefix=key_prefix)
    store = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix))
    tools, _ = _in_process(store, settings, [])
    by_name = {t.name: t.input_schema for t in tools}
    assert by_name["recall"]["required"] == ["session_id", "query"]
    assert by_name["context_stats"]["required"] == ["session_id"]
    assert by_name["compact"]["required"] == ["session_id"]
    for name, schema in by_name.items():
        for field, spec in schema["properties"].items():
            assert len(spec.get("description", "")) > 20, (name, field)
        assert schema.get("additionalProperties") is False, name
        assert schema["properties"]["session_id"]["minLength"] == 1
    limit = by_name["recall"]["properties"]["limit"]
    assert (limit["minimum"], limit["maximum"]) == (1, 50)
    assert by_name["recall"]["properties"]["query"]["minLength"] == 1


def test_bad_arguments_are_tool_errors_naming_the_field(redis_url: str, real_redis: Any,
                                                        key_prefix: str) -> None:
    """Wrong types, out of range and misspelt arguments: an MCP tool error naming the
    argument in one line (a misspelt ``limt`` used to be dropped silently, the default
    served; the others came as pydantic's report, type codes and a link included)."""
    settings = Settings(redis_url=redis_url, key_prefix=key_prefix)
    store = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix))
    store.append("s1", _bulky(4))
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("recall", {"session_id": "s1", "query": "x", "limt": 3}, "limt"),
        ("recall", {"session_id": "s1", "query": "x", "limit": 0}, "limit"),
        ("recall", {"session_id": "s1", "query": "x", "limit": "many"}, "limit"),
        ("recall", {"session_id": "s1", "query": 7}, "query"),
        ("recall", {"session_id": "s1"}, "query"),
        ("context_stats", {"session_id": None}, "session_id"),
        ("context_stats", {"session_id": ""}, "session_id"),
        ("compact", {"session_id": "s1", "keep_recent": -1}, "keep_recent"),
        ("compact", {"session_id": "s1", "wait": "maybe"}, "wait"),
    ]
    _, results = _in_process(store, settings, [(n, a) for n, a, _ in cases])
    for (name, args, field), result in zip(cases, results, strict=True):
        assert result.is_error, (name, args)
        (block,) = result.content
        assert field in block.text, (name, args, block.text)
        # one line for the model: no pydantic type codes or documentation links
        assert block.text.startswith(f"invalid arguments for {name}: {field}: "), block.text
        assert "\n" not in block.text and "pydantic.dev" not in block.text
    assert results[0].content[0].text == (
        "invalid arguments for recall: limt: not an argument of recall "
        "(session_id, query, limit, start, end)")


def _stdio_env(redis_url: str, key_prefix: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_")}
    env.update({"PYTHONPATH": str(ROOT), "COMPACTION_REDIS_URL": redis_url,
                "COMPACTION_KEY_PREFIX": key_prefix})
    return env


def test_stdio_server_started_before_redis_serves_once_it_is_up(
        own_redis: RedisServer, key_prefix: str) -> None:
    """A client (Claude Desktop, an IDE) starts the server when it starts, maybe before
    Redis: the server starts anyway (a warning on stderr), each call says Redis cannot be
    reached, and the same process serves once Redis is back, and again after a restart.
    It used to exit at once."""
    own_redis.stop()
    params = StdioServerParameters(command=sys.executable, args=["-m", "workers.cli.mcp"],
                                   env=_stdio_env(own_redis.url, key_prefix), cwd=str(ROOT))

    async def main() -> tuple[list[str], Any, Any]:
        async with Client(params) as client:
            names = sorted(t.name for t in (await client.list_tools()).tools)
            down = await client.call_tool("context_stats", {"session_id": "s1"})
            await anyio.to_thread.run_sync(own_redis.start)
            await anyio.to_thread.run_sync(_seed, own_redis.url, key_prefix)
            up = await client.call_tool("context_stats", {"session_id": "s1"})
            await anyio.to_thread.run_sync(own_redis.restart)  # killed: pooled sockets die
            await anyio.to_thread.run_sync(_seed, own_redis.url, key_prefix)
            again = await client.call_tool("context_stats", {"session_id": "s1"})
            return names, down, [up, again]

    names, down, ups = anyio.run(main)
    assert names == ["compact", "context_stats", "recall"]
    assert down.is_error and "cannot reach Redis" in down.content[0].text
    for up in ups:
        assert not up.is_error, up.content
        assert up.structured_content["length"] in (4, 8)  # 8: the restart kept the first


def _seed(url: str, key_prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    SessionStore(client, StoreConfig(key_prefix=key_prefix)).append("s1", _bulky(4))
    client.close()


def _initialized(proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    assert proc.stdin is not None and proc.stdout is not None
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
             "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                        "clientInfo": {"name": "test", "version": "0"}}}
    proc.stdin.write((json.dumps(hello) + "\n").encode())
    proc.stdin.flush()
    reply: dict[str, Any] = json.loads(proc.stdout.readline())
    return reply


@pytest.mark.slow
def test_stdio_server_ends_on_ctrl_c(redis_url: str, key_prefix: str) -> None:
    """SIGINT (Ctrl-C in a terminal, a client's interrupt) ends the stdio server while its
    stdin is still open; it used to hang until stdin closed (the SDK reads stdin in a
    thread that cannot be cancelled)."""
    proc = subprocess.Popen([sys.executable, "-m", "workers.cli.mcp"], cwd=ROOT,
                            env=_stdio_env(redis_url, key_prefix), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        reply = _initialized(proc)
        assert reply["result"]["serverInfo"]["name"] == "context-compaction"
        proc.send_signal(signal.SIGINT)
        started = time.monotonic()
        code = proc.wait(timeout=10)
        assert time.monotonic() - started < 5
        assert code in (130, -signal.SIGINT)
        assert reply["result"]["serverInfo"]["version"]  # was ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


def test_python_m_entry_reports_errors_in_one_line() -> None:
    """``python -m workers.cli.mcp`` (the stdio tests', and some clients', command) ends
    a configuration error with the CLI's one line and status 2, not a traceback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_")}
    env.update({"PYTHONPATH": str(ROOT), "COMPACTION_REDIS_URL": "redis://127.0.0.1:1/0"})
    done = subprocess.run([sys.executable, "-m", "workers.cli.mcp", "--transport", "http"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().startswith("compaction: error:")
    assert len(done.stderr.strip().splitlines()) == 1
    # a bad tenant stops it in one line, Redis down or not (no "serving anyway" first)
    done = subprocess.run([sys.executable, "-m", "workers.cli.mcp", "--tenant", "a b"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "compaction: error: tenant: must be 1-64 characters of letters, digits, '_', '.', "
        "'-' and start with a letter or digit (got 'a b')"]


def _readme_entry(kind: str) -> dict[str, Any]:
    """The README's ``mcpServers`` entry that has ``kind`` ("command": stdio, "url")."""
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```json\n(.*?)```", text, flags=re.S)
    entries = [e for b in blocks if '"mcpServers"' in b
               for e in json.loads(b)["mcpServers"].values()]
    assert len(entries) == 2, "the README has one entry for stdio, one for HTTP"
    (entry,) = [e for e in entries if kind in e]
    found: dict[str, Any] = entry
    return found


@pytest.mark.slow
def test_readme_client_configuration_works_as_written(redis_url: str, real_redis: Any,
                                                      key_prefix: str) -> None:
    """The README's ``mcpServers`` entry, run as a client runs it: its command (the
    installed ``compaction`` next to this interpreter) with its args and env, where only
    the Redis URL and key prefix are this test's."""
    entry = _readme_entry("command")
    assert entry["command"] == "compaction"
    command = str(Path(sys.executable).with_name("compaction"))
    if not Path(command).exists():
        pytest.skip("the compaction script is not installed next to this interpreter")
    env = {**entry["env"], "COMPACTION_REDIS_URL": redis_url,
           "COMPACTION_KEY_PREFIX": key_prefix, "PYTHONPATH": str(ROOT)}
    assert set(entry["env"]) <= {"COMPACTION_REDIS_URL", "COMPACTION_TENANT",
                                 "COMPACTION_KEY_PREFIX"}
    tenant = entry["env"].get("COMPACTION_TENANT", "default")
    SessionStore(real_redis, StoreConfig(key_prefix=key_prefix), tenant=tenant).append(
        "s1", _bulky(6))
    params = StdioServerParameters(command=command, args=entry["args"], env=env)

    async def main() -> Any:
        async with Client(params) as client:
            return await client.call_tool("context_stats", {"session_id": "s1"})

    result = anyio.run(main)
    assert not result.is_error, result.content
    assert result.structured_content["tenant"] == tenant
    assert result.structured_content["length"] == 6


@pytest.mark.slow
def test_stdio_stdout_carries_protocol_messages_only(redis_url: str, real_redis: Any,
                                                     key_prefix: str) -> None:
    """Under stdio, stdout is the protocol: a compaction's logs, a failing call, a line
    that is not JSON and the warning of an unknown setting all stay on stderr, and a
    closed stdin ends the server with status 0."""
    SessionStore(real_redis, StoreConfig(key_prefix=key_prefix)).append("s1", _bulky(12))
    env = {**_stdio_env(redis_url, key_prefix), "COMPACTION_NOT_A_SETTING": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "workers.cli.mcp"], cwd=ROOT, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdin is not None
    try:
        _initialized(proc)
        calls = [("compact", {"session_id": "s1", "keep_recent": 100}),
                 ("recall", {"session_id": "s1", "query": "ERR_3"}),
                 ("context_stats", {"session_id": "nobody"})]
        lines: list[dict[str, Any]] = [{"jsonrpc": "2.0", "method": "notifications/initialized"}]
        lines += [{"jsonrpc": "2.0", "id": 10 + i, "method": "tools/call",
                   "params": {"name": n, "arguments": a}} for i, (n, a) in enumerate(calls)]
        assert proc.stdout is not None
        proc.stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in lines)
                         + b"not json\n")
        proc.stdin.flush()
        by_id: dict[int, Any] = {}
        while not {10, 11, 12} <= set(by_id):
            reply = json.loads(proc.stdout.readline())  # every line JSON
            by_id[reply.get("id", -1)] = reply
        proc.stdin.close()
        proc.stdin = None  # closed: communicate must not flush it
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err.decode()
    assert all(json.loads(line) for line in out.splitlines())
    assert not by_id[10]["result"]["isError"] and not by_id[11]["result"]["isError"]
    assert by_id[12]["result"]["isError"]
    assert b"COMPACTION_NOT_A_SETTING" in err
    drop_index(SessionStore(real_redis, StoreConfig(key_prefix=key_prefix)), "s1")


@pytest.mark.slow
def test_parallel_clients_of_two_tenants_over_http(redis_url: str, real_redis: Any,
                                                   key_prefix: str) -> None:
    """Four clients (two per tenant) calling all three tools at once on the same sessions:
    no call fails, each tenant's session is compacted (the others find it busy or done),
    and each sees its own tenant only. Passed before too: the measurement, kept."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    from tests.mcp_support import mcp_http_server

    tokens = {"tok-acme-0123456789abcdef": "acme", "tok-other-0123456789abcdef": "other"}
    for tenant in tokens.values():
        store = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix), tenant=tenant)
        for s in ("a", "b"):
            store.append(s, _bulky(30))
    results: list[tuple[str, str, Any]] = []

    async def client(url: str, token: str) -> None:
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                      timeout=60) as http, \
                Client(streamable_http_client(url, http_client=http)) as mcp:
            async def one(name: str, args: dict[str, Any]) -> None:
                results.append((tokens[token], name, await mcp.call_tool(name, args)))

            async with anyio.create_task_group() as group:
                for s in ("a", "b"):
                    group.start_soon(one, "compact", {"session_id": s, "keep_recent": 200})
                    group.start_soon(one, "context_stats", {"session_id": s})
                    group.start_soon(one, "recall", {"session_id": s, "query": "ERR_3"})

    async def main(url: str) -> None:
        async with anyio.create_task_group() as group:
            for token in (*tokens, *tokens):
                group.start_soon(client, url, token)

    try:
        with mcp_http_server(redis_url, key_prefix, tokens) as url:
            anyio.run(main, url)
        assert len(results) == 24
        assert [r.content for _, _, r in results if r.is_error] == []
        statuses: dict[tuple[str, str], list[str]] = {}
        for tenant, name, result in results:
            data = result.structured_content
            if name == "compact":
                statuses.setdefault((tenant, data["session_id"]), []).append(data["status"])
            if name == "context_stats":
                assert data["tenant"] == tenant
        assert len(statuses) == 4
        for outcome in statuses.values():
            assert "compacted" in outcome and set(outcome) <= {"compacted", "busy", "skipped"}
    finally:
        for tenant in tokens.values():
            store = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix), tenant=tenant)
            for s in ("a", "b"):
                drop_index(store, s)


@pytest.mark.slow
def test_readme_http_client_configuration_works_as_written(redis_url: str, real_redis: Any,
                                                           key_prefix: str) -> None:
    """The README's URL entry against ``compaction mcp --transport http``: its URL (the
    port this test's server got) and its headers, ``<token>`` a token of the map."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    from tests.mcp_support import mcp_http_server

    entry = _readme_entry("url")
    assert entry["url"] == "http://127.0.0.1:8765/mcp"  # the default port
    token = "tok-acme-0123456789abcdef"
    headers = {k: v.replace("<token>", token) for k, v in entry["headers"].items()}
    SessionStore(real_redis, StoreConfig(key_prefix=key_prefix), tenant="acme").append(
        "s1", _bulky(6))

    async def main(url: str) -> Any:
        async with httpx2.AsyncClient(headers=headers, timeout=30) as http, \
                Client(streamable_http_client(url, http_client=http)) as client:
            return await client.call_tool("context_stats", {"session_id": "s1"})

    with mcp_http_server(redis_url, key_prefix, {token: "acme"}) as url:
        port = str(urlsplit(url).port)
        result = anyio.run(main, entry["url"].replace(":8765/", f":{port}/"))
    assert not result.is_error, result.content
    assert result.structured_content["tenant"] == "acme"


def test_recall_before_any_compaction_says_so(redis_url: str, real_redis: Any,
                                              key_prefix: str) -> None:
    """A session nothing of which was compacted: recall says so, instead of "try other
    exact words" (which sent a model searching for words no query could find)."""
    settings = Settings(redis_url=redis_url, key_prefix=key_prefix)
    store = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix))
    store.append("s1", _bulky(4))
    try:
        _, (before, _compacted, missing) = _in_process(store, settings, [
            ("recall", {"session_id": "s1", "query": "ERR_1"}),
            ("compact", {"session_id": "s1", "keep_recent": 100}),
            ("recall", {"session_id": "s1", "query": "NOWHERE_TO_BE_FOUND"})])
        assert not before.is_error and before.structured_content["hits"] == []
        assert before.content[0].text.startswith("Nothing of session 's1' has been compacted")
        assert missing.content[0].text.startswith("No earlier message matches")
    finally:
        drop_index(store, "s1")
