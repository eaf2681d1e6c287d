"""Tenant isolation reviewed as an operator would try to break it: the Python API
(``SessionStore.for_tenant``), odd tenant names, the HTTP server (token -> tenant) and the
CLI, each against a real Redis."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from shared.core.config import StoreConfig
from shared.core.errors import InvalidInput
from shared.core.records import InlineJob
from shared.store import commands
from shared.store.keys import SessionKeys, session_of_pending
from shared.store.sessions import SessionStore
from shared.store.tenancy import TenantStore

ODD_TENANTS = [":", "a:b", "{a}", "a{", "a}", "a*", "*", "a?", "a[b]", "a b", " a", "a\n",
               "a\t", "ü", "aü", "租户", "a/b", "a\\b", "", "-a", ".a", "x" * 65, "a\x00"]


def _turn(tag: str, n: int = 0) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"{tag} secret plan {n}"},
            {"role": "assistant", "content": f"noted for {tag} {n}"}]


@pytest.fixture
def operator(real_redis: redis.Redis, key_prefix: str) -> SessionStore:
    return SessionStore(real_redis, StoreConfig(key_prefix=key_prefix))


def _own_keys(client: redis.Redis, prefix: str) -> dict[bytes, Any]:
    """Every key under ``prefix`` with a dump of its value: what a tenant must not change."""
    return {key: client.dump(key) for key in sorted(client.scan_iter(match=f"{prefix}:*"))}


# ------------------------------------------------------------------ names

@pytest.mark.parametrize("name", ODD_TENANTS)
def test_odd_tenant_names_are_refused_everywhere(operator: SessionStore, name: str) -> None:
    with pytest.raises(InvalidInput):
        operator.for_tenant(name)
    with pytest.raises(InvalidInput):
        SessionStore(operator.redis, operator.config, tenant=name)
    with pytest.raises(InvalidInput):
        SessionKeys.for_session("cmp", name, "s")


@pytest.mark.parametrize("session_id", ["{x}", "x}", "x{", "x*", "x y", "ü", "x\n", "",
                                        "x" * 129, ":x"])
def test_odd_session_ids_are_refused(operator: SessionStore, session_id: str) -> None:
    with pytest.raises(InvalidInput):
        operator.for_tenant("acme").append(session_id, _turn("x"))


def test_a_tenant_and_session_pair_never_shares_a_key_with_another() -> None:
    """``{tenant:session}``: tenants hold no ``:``, so the first ``:`` splits them back."""
    pairs = [("a", "b:c"), ("a", "b"), ("a.b", "c"), ("a", "b.c"), ("a-b", "c"),
             ("a", "b-c"), ("ab", "c"), ("a", "bc"), ("A", "b"), ("a", "B"),
             ("x" * 64, "y" * 128)]
    seen: dict[str, tuple[str, str]] = {}
    for tenant, session in pairs:
        keys = SessionKeys.for_session("cmp", tenant, session)
        for key in (*keys.all_keys(), keys.recall):
            assert key not in seen, (key, seen.get(key), (tenant, session))
            seen[key] = (tenant, session)
        assert session_of_pending("cmp", keys.pending) == (tenant, session)


# ------------------------------------------------------------------ the Python API

def test_tenant_b_reaches_none_of_tenant_a_sessions(real_redis: redis.Redis,
                                                    operator: SessionStore,
                                                    key_prefix: str) -> None:
    alpha, beta = operator.for_tenant("alpha"), operator.for_tenant("beta")
    alpha.append("s", _turn("alpha", 0))
    alpha.append("s", _turn("alpha", 1))
    before = _own_keys(real_redis, key_prefix)
    assert beta.length("s") == 0 and beta.messages("s") == []
    assert beta.load_view("s").length == 0 and beta.summaries("s") == []
    assert beta.state("s").version == 0
    beta.delete_session("s")
    beta.rewind("s", 0)
    beta.truncate_after("s", 0)
    beta.reset_damaged("s")
    beta.clear_pending("s")
    assert _own_keys(real_redis, key_prefix) == before
    assert alpha.messages("s")[0].content == "alpha secret plan 0"
    with pytest.raises(InvalidInput):
        beta.for_tenant("alpha")


def test_a_tenant_handle_runs_no_command_on_another_tenants_keys(
        real_redis: redis.Redis, operator: SessionStore, key_prefix: str) -> None:
    """``execute`` is one of the store's methods a handle forwards: a command built on
    another tenant's keys must be refused, not run (it would read or write them)."""
    alpha, beta = operator.for_tenant("alpha"), operator.for_tenant("beta")
    alpha.append("s", _turn("alpha"))
    before = _own_keys(real_redis, key_prefix)
    theirs = SessionKeys.for_session(key_prefix, "alpha", "s")
    with pytest.raises(InvalidInput):
        beta.execute(commands.view_command(theirs, None))
    with pytest.raises(InvalidInput):
        beta.execute(commands.reset_damaged_command(theirs))
    assert _own_keys(real_redis, key_prefix) == before
    # its own keys run as before
    assert beta.execute(commands.view_command(beta.keys("s"), None)) is not None


def test_a_tenant_handle_pushes_no_inline_job_into_another_tenants_keys(
        real_redis: redis.Redis, operator: SessionStore, key_prefix: str) -> None:
    """The append script pushes an :class:`InlineJob` into the key it names: through a
    tenant's handle that key must not be another tenant's (or any session's) key."""
    alpha, beta = operator.for_tenant("alpha"), operator.for_tenant("beta")
    alpha.append("s", _turn("alpha"))
    log_before = real_redis.lrange(alpha.keys("s").log, 0, -1)
    db = int(real_redis.connection_pool.connection_kwargs.get("db", 0))
    forged = json.dumps({"role": "user", "content": "beta wrote this"}).encode()
    job = InlineJob(alpha.keys("s").log, forged, db, db)
    encoded = beta.encode("mine", _turn("beta"))
    with pytest.raises(InvalidInput):
        beta.append_encoded("mine", encoded, mark_pending=True, job=job)
    assert real_redis.lrange(alpha.keys("s").log, 0, -1) == log_before
    assert beta.length("mine") == 0  # refused before anything was written
    beta.append_encoded("mine", encoded, mark_pending=True)  # no job: as before
    assert beta.length("mine") == 2


def test_a_tenant_handle_is_not_a_way_around_its_checks() -> None:
    store = TenantStore.__new__(TenantStore)
    with pytest.raises(AttributeError):
        store.tenant = "other"  # type: ignore[misc]


# ------------------------------------------------------------------ the HTTP server

def test_a_token_reaches_only_its_tenants_sessions(real_redis: redis.Redis,
                                                   operator: SessionStore,
                                                   key_prefix: str) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from shared.enqueue import CallbackEnqueuer
    from workers.server.app import create_app
    from workers.server.config import ServerConfig

    tokens = {"alpha-token-0123456789": "alpha", "beta-token-01234567890": "beta"}
    alpha_h = {"Authorization": "Bearer alpha-token-0123456789"}
    beta_h = {"Authorization": "Bearer beta-token-01234567890"}
    published: list[tuple[str, str]] = []
    compacted: list[tuple[str, str]] = []

    def compact(tenant: str, sid: str, keep: int | None, force: bool) -> str:
        compacted.append((tenant, sid))
        return "task-1"

    app = create_app(ServerConfig(), operator,
                     CallbackEnqueuer(lambda t, s: published.append((t, s))),
                     compact=compact, tokens=tokens)
    with TestClient(app, raise_server_exceptions=False) as client:
        url = "/v1/sessions/s"
        assert client.post(f"{url}/record", json={"messages": _turn("alpha")},
                           headers=alpha_h).status_code == 200
        before = _own_keys(real_redis, key_prefix)
        assert client.get(f"{url}/stats", headers=beta_h).status_code == 404
        assert client.get(f"{url}/history", headers=beta_h).status_code == 404
        assert client.post(f"{url}/compact", json={}, headers=beta_h).status_code == 404
        recall = client.post(f"{url}/recall", json={"query": "secret plan"}, headers=beta_h)
        assert recall.status_code == 404 or recall.json().get("hits") == [], recall.text
        view = client.post(f"{url}/prepare", json={"system_prompt": "s", "max_tokens": 100,
                                                   "model": "gpt-4o-mini"}, headers=beta_h)
        assert view.status_code == 200 and "alpha" not in view.text, view.text
        assert compacted == [] and _own_keys(real_redis, key_prefix).keys() >= before.keys()
        # beta's own turn under the same id is beta's own session
        assert client.post(f"{url}/record", json={"messages": _turn("beta")},
                           headers=beta_h).status_code == 200
        assert "beta" not in client.get(f"{url}/history", headers=alpha_h).text
        assert client.get(f"{url}/stats", headers=alpha_h).json()["tenant"] == "alpha"
        assert client.get(f"{url}/stats", headers=beta_h).json()["tenant"] == "beta"
    assert operator.for_tenant("alpha").length("s") == 2
    assert [m.content for m in operator.for_tenant("beta").messages("s")] == [
        "beta secret plan 0", "noted for beta 0"]
    assert {t for t, _ in published} <= {"alpha", "beta"}


# ------------------------------------------------------------------ the CLI

def test_cli_sessions_prefix_lists_only_ids_that_start_with_it(operator: SessionStore) -> None:
    """``--prefix`` without ``--tenant``: the pattern's tenant ``*`` also matches the start
    of a session id holding ``:``, so tenant a's ``x:b1`` matched ``--prefix b``."""
    from workers.cli.sessions import list_page

    operator.for_tenant("a").append("x:b1", _turn("a"))
    operator.for_tenant("a").append("b2", _turn("a"))
    operator.for_tenant("c").append("b3", _turn("c"))
    rows = list_page(operator, prefix="b", limit=100).sessions
    assert sorted((r.tenant, r.session_id) for r in rows) == [("a", "b2"), ("c", "b3")]
    rows = list_page(operator, tenant="a", prefix="x:", limit=100).sessions
    assert [(r.tenant, r.session_id) for r in rows] == [("a", "x:b1")]


def test_the_servers_log_lines_name_the_requests_tenant(
        real_redis: redis.Redis, operator: SessionStore, key_prefix: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Session ids are per tenant: a server line about session ``s`` must say whose."""
    pytest.importorskip("fastapi")
    import io
    import logging

    from fastapi.testclient import TestClient

    from shared.enqueue import CallbackEnqueuer
    from shared.telemetry.logs import configure_json
    from shared.telemetry.publish_log import publish_failures
    from workers.server.app import ServerState, create_app
    from workers.server.config import ServerConfig

    def unreachable(_tenant: str, _sid: str) -> None:
        raise ConnectionError("broker unreachable")

    tokens = {"alpha-token-0123456789": "alpha", "beta-token-01234567890": "beta"}
    beta_h = {"Authorization": "Bearer beta-token-01234567890"}
    out = io.StringIO()
    handler = configure_json(logging.StreamHandler(out))
    root = logging.getLogger()
    root.addHandler(handler)
    publish_failures.published()  # no outage left over by another test: its first line
    try:
        app = create_app(ServerConfig(), operator, CallbackEnqueuer(unreachable),
                         tokens=tokens)
        with TestClient(app, raise_server_exceptions=False) as client:
            # a guard's line, written on the route's thread
            assert client.post("/v1/sessions/s/record", json={"messages": _turn("beta")},
                               headers=beta_h).status_code == 200
            # an unexpected error's line, written by Starlette's outermost middleware
            monkeypatch.setattr(ServerState, "guard", lambda self, tenant: 1 / 0)
            assert client.get("/v1/sessions/s/stats", headers=beta_h).status_code == 500
            client.get("/v1/sessions/s/stats")  # no token: 401, nothing bound
    finally:
        root.removeHandler(handler)
        publish_failures.published()
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    failed = [r for r in lines if str(r["message"]).startswith("enqueue failed for session s")]
    crashed = [r for r in lines if str(r["message"]).startswith("unhandled error on GET")]
    assert failed and crashed, lines
    for record in (*failed, *crashed):
        assert (record["tenant"], record["session_id"]) == ("beta", "s"), record
    assert "ZeroDivisionError" in crashed[0]["exc_info"]


def test_cli_commands_with_another_tenant_reach_nothing_of_this_one(
        redis_url: str, real_redis: redis.Redis, operator: SessionStore, key_prefix: str,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Any) -> None:
    from workers.cli.main import main

    for name in ("COMPACTION_TENANT", "COMPACTION_SUMMARIZER", "COMPACTION_TRIGGER_RATIO"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COMPACTION_REDIS_URL", redis_url)
    monkeypatch.setenv("COMPACTION_KEY_PREFIX", key_prefix)
    alpha = operator.for_tenant("alpha")
    for n in range(4):
        alpha.append("s", _turn("alpha", n))
    before = _own_keys(real_redis, key_prefix)
    for argv in (["stats", "s"], ["show", "s"], ["history", "s"], ["rewind", "s", "0"],
                 ["report", "s", "-o", str(tmp_path / "r.html")]):
        code = main([*argv, "--tenant", "beta"])
        _, err = capsys.readouterr()
        assert code == 1 and "no session 's' in tenant 'beta'" in err, (argv, code, err)
    assert main(["sessions", "--tenant", "beta", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sessions"] == []
    assert main(["sessions", "--tenant", "alpha", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["sessions"]
    assert [(r["tenant"], r["session_id"]) for r in listed] == [("alpha", "s")]
    for bad in ("a:b", "a*", "{a}", "ü"):
        assert main(["sessions", "--tenant", bad, "--json"]) != 0
        capsys.readouterr()
    assert _own_keys(real_redis, key_prefix) == before
    assert not (tmp_path / "r.html").exists()


@pytest.mark.redis
@pytest.mark.slow
def test_compaction_serve_writes_json_logs_naming_the_tenant(
        redis_url: str, real_redis: redis.Redis, key_prefix: str, tmp_path: Any) -> None:
    """``COMPACTION_LOG_FORMAT=json`` for ``compaction serve``: the guard's lines (here a
    broker it cannot reach) are JSON objects with the request's tenant and session id,
    as uvicorn's own lines are; before, the setting was ignored by the server: they were
    the CLI's text lines (``compaction: warning: enqueue failed for session s9``), with
    no tenant."""
    import os
    import signal

    import httpx

    from tests.serve_support import start_serve
    from workers.server.process import free_port

    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    token = "json-logs-token-0123456789"
    env = {**os.environ, "COMPACTION_REDIS_URL": redis_url, "COMPACTION_KEY_PREFIX": key_prefix,
           "COMPACTION_BROKER_URL": "redis://127.0.0.1:1/0", "COMPACTION_LOG_FORMAT": "json",
           "COMPACTION_SERVER_TOKENS": json.dumps({token: "acme"}),
           "TMPDIR": str(tmp_path), "PYTHONPATH": str(root)}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    proc, url = start_serve(env, free_port(), 1)
    try:
        answer = httpx.post(f"{url}/v1/sessions/s9/record", json={"messages": _turn("acme")},
                            headers={"Authorization": f"Bearer {token}"}, timeout=30)
        assert answer.status_code == 200, answer.text
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    text = err.decode()
    assert text
    records = [json.loads(line) for line in text.splitlines() if line.strip()]  # all JSON
    [failed] = [r for r in records if str(r["message"]).startswith("enqueue failed for s")]
    assert (failed["level"], failed["tenant"], failed["session_id"]) == ("WARNING", "acme", "s9")
    assert failed["logger"] == "shared.enqueue"
