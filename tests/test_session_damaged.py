"""A session Redis evicted some keys of: the guard mends it (its running totals counted
again from its log) or starts it afresh (its log gone); other readers name it.

Eviction (any ``maxmemory-policy`` but ``noeviction``) removes keys one at a time, so a
session can lose its log and keep its state, or lose its running token totals and keep
its log. Before, every prepare, stats and job of such a session raised ``InvalidInput: a
token count cannot be negative`` for as long as the rest of it lived.
"""

from __future__ import annotations

import logging
from typing import Any

import fakeredis
import pytest
import redis

from shared.core.config import StoreConfig
from shared.core.errors import SessionDamaged
from shared.core.messages import Message
from shared.core.turns import turn_starts
from shared.core.wire import from_openai
from shared.store.sessions import SessionStore
from tests.guard_shells import SHELLS, make
from workers.compactor import Compactor
from workers.harness.demo_session import SYSTEM_PROMPT, TOOLS, generate_session
from workers.harness.stack.redis_server import RedisServer
from workers.summarizer.engine import SummaryEngine

MODEL = "gpt-4o"
WINDOW = 8_000
USER = {"role": "user", "content": "and now?"}
REPLY = {"role": "assistant", "content": "done."}


def turns() -> list[list[Message]]:
    messages = from_openai(generate_session(24))[1:]
    starts = turn_starts(messages)
    return [messages[a:b] for a, b in zip(starts, [*starts[1:], len(messages)], strict=True)]


def summarized(store: SessionStore, shell: str, session: str = "s") -> Any:
    """A guard, and a session of real turns with a committed summary (watermark > 0)."""
    guard = make(shell, store, overrides={MODEL: WINDOW})
    for turn in turns():
        guard.prepare(session, SYSTEM_PROMPT, TOOLS, 1000, MODEL, pending=turn[:1])
        guard.record_turn(session, turn)
    Compactor(store, SummaryEngine(None)).run(session)
    assert store.state(session).watermark > 0
    return guard


def evict(store: SessionStore, which: str, session: str = "s") -> None:
    k = store.keys(session)
    store.redis.delete(*{"log": [k.log], "totals": [k.cum], "both": [k.log, k.cum]}[which])


def own_keys(store: SessionStore, session: str = "s") -> set[str]:
    return {key.decode() for key in store.redis.scan_iter(match=f"{store.config.key_prefix}:*")
            if f":{session}}}" in key.decode()}


@pytest.fixture
def store(key_prefix: str) -> SessionStore:
    return SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix=key_prefix))


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("which", ["log", "both"])
def test_a_session_missing_its_log_starts_afresh(
        store: SessionStore, shell: str, which: str, caplog: pytest.LogCaptureFixture) -> None:
    warm = summarized(store, shell)
    evict(store, which)
    for guard in (warm, make(shell, store, overrides={MODEL: WINDOW})):  # cached, and cold
        with caplog.at_level(logging.WARNING, logger="shared.guard"):
            view = guard.prepare("s", SYSTEM_PROMPT, TOOLS, 1000, MODEL, pending=[USER])
        assert [m.content for m in view.messages[1:]] == [USER["content"]]
        assert view.report.length == 0 and view.report.watermark == 0
    assert sum("starts afresh" in r.getMessage() for r in caplog.records) == 1
    assert own_keys(store) <= {store.keys("s").state}  # nothing of the old session is left
    assert warm.record_turn("s", [USER, REPLY]) == 2
    view = warm.prepare("s", SYSTEM_PROMPT, TOOLS, 1000, MODEL, pending=[USER])
    assert [m.content for m in view.messages[1:]] == ["and now?", "done.", "and now?"]
    assert warm.stats("s")["length"] == 2


@pytest.mark.parametrize("shell", SHELLS)
def test_a_session_missing_its_totals_keeps_its_history(
        store: SessionStore, shell: str, caplog: pytest.LogCaptureFixture) -> None:
    """Its log is whole: the totals are counted again from it, the same figures."""
    warm = summarized(store, shell)
    before = warm.prepare("s", SYSTEM_PROMPT, TOOLS, 1000, MODEL, pending=[USER])
    k = store.keys("s")
    totals = store.redis.lrange(k.cum, 0, -1)
    state = store.state("s")
    epoch = store.redis.hget(k.state, "epoch")
    length = store.redis.llen(k.log)
    evict(store, "totals")
    for guard in (warm, make(shell, store, overrides={MODEL: WINDOW})):  # cached, and cold
        with caplog.at_level(logging.WARNING, logger="shared.guard"):
            view = guard.prepare("s", SYSTEM_PROMPT, TOOLS, 1000, MODEL, pending=[USER])
        assert [m.model_dump() for m in view.messages] == \
            [m.model_dump() for m in before.messages]
        assert (view.report.length, view.report.watermark) == (length, state.watermark)
        assert view.report.estimated_prompt_tokens == before.report.estimated_prompt_tokens
    assert sum("counted again" in r.getMessage() for r in caplog.records) == 1
    assert store.redis.lrange(k.cum, 0, -1) == totals
    assert store.state("s").watermark == state.watermark
    assert store.redis.hget(k.state, "epoch") not in (epoch, None)  # cached views read again
    assert warm.record_turn("s", [USER, REPLY]) == length + 2
    assert "damaged" not in Compactor(store, SummaryEngine(None)).run("s").reason


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("which", ["log", "totals"])
def test_a_turn_recorded_into_a_damaged_session(store: SessionStore, shell: str,
                                                which: str) -> None:
    """The append refuses to write into a damaged session (a turn there would be lost with
    it); the guard mends it and appends the turn: after the history when only the totals
    went, as the new session's first when the log did."""
    guard = summarized(store, shell)
    guard.prepare("s", SYSTEM_PROMPT, TOOLS, 1000, MODEL, pending=[USER])
    length = store.redis.llen(store.keys("s").log)
    evict(store, which)
    if which == "totals":
        assert guard.record_turn("s", [USER, REPLY]) == length + 2
        assert [m.content for m in store.messages("s")[-2:]] == ["and now?", "done."]
        assert store.range_tokens("s", length, length + 2) > 0
        assert guard.prepare("s", SYSTEM_PROMPT, TOOLS, 1000, MODEL,
                             pending=[USER]).report.length == length + 2
        return
    assert guard.record_turn("s", [USER, REPLY]) == 2
    assert [m.content for m in store.messages("s")] == ["and now?", "done."]
    assert store.range_tokens("s", 0, 2) > 0
    view = guard.prepare("s", SYSTEM_PROMPT, TOOLS, 1000, MODEL, pending=[USER])
    assert view.report.length == 2


def test_other_readers_name_the_damage_and_the_job_skips(store: SessionStore) -> None:
    summarized(store, "sync")
    evict(store, "log")
    with pytest.raises(SessionDamaged, match=r"log holds 0 messages.*noeviction") as caught:
        store.load_view("s")
    assert caught.value.log_length == 0 and caught.value.totals_length > 0
    outcome = Compactor(store, SummaryEngine(None)).run("s")
    assert outcome.status == "skipped" and "damaged" in outcome.reason
    assert store.redis.exists(store.keys("s").state)  # a job never removes anything


def test_a_healthy_session_is_never_reset(store: SessionStore) -> None:
    summarized(store, "sync")
    before = own_keys(store)
    assert store.reset_damaged("s") is False
    assert own_keys(store) == before
    assert store.reset_damaged("nobody") is False
    assert store.mend_damaged("s") == "" and store.mend_damaged("nobody") == ""
    assert own_keys(store) == before


def test_totals_are_written_only_for_the_log_they_were_counted_from(
        store: SessionStore) -> None:
    """An edit or a reset between the count and the write makes the write a no-op."""
    from shared.store.damage import retotal_command
    summarized(store, "sync")
    k = store.keys("s")
    totals = [int(v) for v in store.redis.lrange(k.cum, 0, -1)]
    evict(store, "totals")
    assert store.execute(retotal_command(k, len(totals) - 1, totals[:-1])) is False
    assert store.execute(retotal_command(k, len(totals), totals[:-1])) is False
    assert not store.redis.exists(k.cum)
    assert store.execute(retotal_command(k, len(totals), totals)) is True
    assert store.execute(retotal_command(k, len(totals), totals)) is False  # mended already
    store.load_view("s")


def test_eviction_under_memory_pressure_never_breaks_a_session(
        own_redis: RedisServer, key_prefix: str) -> None:
    """A real Redis evicting with volatile-lru (every session key has a TTL): whatever it
    took, each session answers, whole (mended) or afresh."""
    client = redis.Redis.from_url(own_redis.url)
    store = SessionStore(client, StoreConfig(key_prefix=key_prefix, ttl_seconds=3600))
    guard = make("sync", store, overrides={MODEL: 1_000_000})
    body = "x" * 2_000
    sessions = [f"s{i}" for i in range(300)]
    for sid in sessions[:20]:
        guard.record_turn(sid, [{"role": "user", "content": body}, REPLY])
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", str(used + 600_000))
    client.config_set("maxmemory-policy", "volatile-lru")
    for sid in sessions[20:]:
        guard.record_turn(sid, [{"role": "user", "content": body}, REPLY])
    assert int(client.info("stats")["evicted_keys"]) > 0
    damaged_before = 0
    for sid in sessions:
        try:
            store.load_view(sid)
        except SessionDamaged:
            damaged_before += 1
    assert damaged_before > 0  # eviction did split sessions
    fresh = make("sync", store, overrides={MODEL: 1_000_000})
    client.config_set("maxmemory", "0")
    for sid in sessions:
        view = fresh.prepare(sid, "sys", pending=[USER])
        assert view.report.length in (0, 2)  # afresh, or whole
        store.load_view(sid)  # consistent now


@pytest.mark.parametrize(("policy", "verdict"), [("volatile-lru", "WARN"),
                                                  ("allkeys-lru", "WARN"),
                                                  ("noeviction", "OK")])
def test_doctor_warns_of_any_eviction_policy(own_redis: RedisServer, policy: str,
                                             verdict: str) -> None:
    """volatile-* was called safe with a session TTL: TTLs expire a session's keys
    together, eviction does not."""
    from workers.cli.doctor import check_store
    from workers.settings import Settings

    redis.Redis.from_url(own_redis.url).config_set("maxmemory-policy", policy)
    check = check_store(Settings(redis_url=own_redis.url))
    assert check.verdict == verdict, check
    assert ("one at a time" in check.detail) is (verdict == "WARN")
