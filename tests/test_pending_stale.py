"""A pending flag no worker claimed for ``pending_stale_seconds`` is re-armed and its job
published again by the next writer that would have set it.

The flag coalesces summary jobs: whoever sets it publishes one job, the worker's claim
deletes it. A job lost after the flag was set (a worker killed with ``kill -9`` as it took
the message: ``scripts/soak.py``) left the flag standing, and every later turn published
nothing until it expired (``pending_ttl_seconds``, 600 s). The flag's age is its TTL's
start minus its PTTL; a flag older than the stale age is taken for a lost job's.

A stale flag is simulated by setting it with a shorter expiry than the store's TTL: its
PTTL then reads as that much older.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
import redis
from pydantic import ValidationError

from shared.core.config import CompactionPolicy, StoreConfig
from shared.core.errors import ConfigError
from shared.core.records import InlineJob
from shared.enqueue import CallbackEnqueuer, request_summary
from shared.store import commands
from shared.store.sessions import SessionStore
from shared.telemetry.metrics import PrometheusMetrics, set_metrics
from tests.guard_shells import SHELLS, Recorder, make
from tests.test_guard import SYSTEM, coding_turn
from workers.settings import load_settings

TTL = 600
STALE = 300
TURN = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


def _store(client: Any, prefix: str, stale: int | None = STALE) -> SessionStore:
    return SessionStore(client, StoreConfig(key_prefix=prefix, pending_ttl_seconds=TTL,
                                            pending_stale_seconds=stale))


def _age(store: SessionStore, sid: str, seconds: int) -> None:
    """The flag as if set ``seconds`` ago with the store's TTL, no worker claiming it."""
    store.redis.set(store.keys(sid).pending, "1", ex=TTL - seconds)


def _left(store: SessionStore, sid: str) -> int:
    return int(store.redis.ttl(store.keys(sid).pending))


def _append(store: SessionStore, sid: str = "s", job: InlineJob | None = None) -> Any:
    encoded = commands.encode(TURN, store.config, store.counter)
    return store.append_encoded(sid, encoded, mark_pending=True, job=job)


def _job(store: SessionStore, prefix: str) -> InlineJob:
    db = int(store.redis.connection_pool.connection_kwargs.get("db", 0))
    return InlineJob(f"{prefix}:queue", b"job", db, db)


# -- the setting ---------------------------------------------------------------------
def test_the_stale_age_defaults_to_half_the_pending_ttl() -> None:
    assert StoreConfig().pending_stale_after == 300
    assert StoreConfig(pending_ttl_seconds=90).pending_stale_after == 45
    assert StoreConfig(pending_stale_seconds=0).pending_stale_after == 0
    assert StoreConfig(pending_stale_seconds=120).pending_stale_after == 120


@pytest.mark.parametrize("stale", [600, 900, -1])
def test_a_stale_age_not_below_the_ttl_is_refused_naming_the_field(stale: int) -> None:
    with pytest.raises(ValidationError) as info:
        StoreConfig(pending_ttl_seconds=600, pending_stale_seconds=stale)
    assert [err["loc"] for err in info.value.errors()] == [("pending_stale_seconds",)]


def test_the_setting_reaches_the_store_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COMPACTION_PENDING_TTL_SECONDS", raising=False)
    monkeypatch.delenv("COMPACTION_PENDING_STALE_SECONDS", raising=False)
    assert load_settings().store_config().pending_stale_after == 300
    monkeypatch.setenv("COMPACTION_PENDING_TTL_SECONDS", "90")  # a short TTL still starts
    assert load_settings().store_config().pending_stale_after == 45
    monkeypatch.setenv("COMPACTION_PENDING_STALE_SECONDS", "60")
    assert load_settings().store_config().pending_stale_after == 60
    monkeypatch.setenv("COMPACTION_PENDING_STALE_SECONDS", "0")
    assert load_settings().store_config().pending_stale_after == 0


@pytest.mark.parametrize("value", ["90", "120", "-5", "soon"])
def test_a_bad_stale_age_names_the_variable(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("COMPACTION_PENDING_TTL_SECONDS", "90")
    monkeypatch.setenv("COMPACTION_PENDING_STALE_SECONDS", value)
    with pytest.raises(ConfigError, match="COMPACTION_PENDING_STALE_SECONDS"):
        load_settings()


# -- the store's writes ---------------------------------------------------------------
def test_an_append_rearms_a_stale_flag_once(any_redis: Any, key_prefix: str) -> None:
    store = _store(any_redis, key_prefix)
    _age(store, "s", 400)
    first = _append(store)
    assert first.marked and first.republished and not first.published
    assert _left(store, "s") > TTL - 5, "re-armed with a fresh TTL"
    again = _append(store)
    assert not again.marked and not again.republished, "young again: coalesced"


def test_an_append_leaves_a_young_flag_alone(any_redis: Any, key_prefix: str) -> None:
    store = _store(any_redis, key_prefix)
    _age(store, "s", 100)
    result = _append(store)
    assert not result.marked and not result.republished
    assert _left(store, "s") <= TTL - 100


def test_stale_age_zero_changes_nothing(any_redis: Any, key_prefix: str) -> None:
    store = _store(any_redis, key_prefix, stale=0)
    _age(store, "s", 590)
    assert not _append(store).marked
    assert not store.mark_pending("s")
    assert _left(store, "s") <= 10


def test_a_flag_without_expiry_is_left_alone(any_redis: Any, key_prefix: str) -> None:
    """Its age cannot be told (set by hand, or by another tool): not taken for stale."""
    store = _store(any_redis, key_prefix)
    store.redis.set(store.keys("s").pending, "1")
    assert not _append(store).marked and not store.mark_pending("s")


def test_a_fresh_flag_is_not_a_republish(any_redis: Any, key_prefix: str) -> None:
    store = _store(any_redis, key_prefix)
    result = _append(store)
    assert result.marked and not result.republished
    assert store.mark_pending("t") == 1 and not store.mark_pending("t")


def test_mark_pending_rearms_a_stale_flag(any_redis: Any, key_prefix: str) -> None:
    store = _store(any_redis, key_prefix)
    _age(store, "s", 301)
    mark = store.mark_pending("s")
    assert mark and commands.rearmed(mark)
    assert _left(store, "s") > TTL - 5
    assert not store.mark_pending("s")


def test_request_summary_publishes_again_for_a_stale_flag(
        any_redis: Any, key_prefix: str, caplog: pytest.LogCaptureFixture) -> None:
    store = _store(any_redis, key_prefix)
    jobs = Recorder()
    assert request_summary(store, CallbackEnqueuer(jobs), "s")
    assert not request_summary(store, CallbackEnqueuer(jobs), "s")
    _age(store, "s", 400)
    with caplog.at_level(logging.INFO):
        assert request_summary(store, CallbackEnqueuer(jobs), "s")
    assert len(jobs.jobs) == 2
    assert [r for r in caplog.records if "published again" in r.getMessage()]


def test_the_pending_script_rearms_and_pushes(any_redis: Any, key_prefix: str) -> None:
    store = _store(any_redis, key_prefix)
    k, job = store.keys("s"), _job(store, key_prefix)
    assert store.execute(commands.pending_command(k, store.config, job)) == 2
    assert store.execute(commands.pending_command(k, store.config, job)) == 0
    _age(store, "s", 400)
    code = store.execute(commands.pending_command(k, store.config, job))
    assert commands.rearmed(code) and commands.pushed(code)
    assert store.execute(commands.pending_command(k, store.config, job)) == 0
    assert store.redis.lrange(job.key, 0, -1) == [b"job", b"job"]
    _age(store, "s", 400)
    assert store.execute(commands.pending_command(k, store.config, None)) == 3  # no job


def test_an_append_rearms_and_pushes_its_job(any_redis: Any, key_prefix: str) -> None:
    store = _store(any_redis, key_prefix)
    job = _job(store, key_prefix)
    _age(store, "s", 400)
    result = _append(store, job=job)
    assert result.marked and result.published and result.republished
    assert store.redis.lrange(job.key, 0, -1) == [b"job"]
    assert not _append(store, job=job).marked
    assert store.redis.llen(job.key) == 1


def test_the_claim_still_clears_a_rearmed_flag(any_redis: Any, key_prefix: str) -> None:
    store = _store(any_redis, key_prefix)
    _age(store, "s", 400)
    assert _append(store).republished
    token = store.claim("s", 5)
    assert token is not None and not store.is_pending("s")
    fresh = _append(store)
    assert fresh.marked and not fresh.republished


def test_racing_writers_rearm_a_stale_flag_once(real_redis: redis.Redis,
                                                key_prefix: str) -> None:
    """Appends and plain marks at once on one stale flag: one of them publishes."""
    store = _store(real_redis, key_prefix)
    for round_ in range(5):
        sid = f"race{round_}"
        _age(store, sid, 400)
        start = threading.Barrier(8)
        marks: list[bool] = []

        def write(i: int, sid: str = sid, start: threading.Barrier = start,
                  marks: list[bool] = marks) -> None:
            start.wait()
            marks.append(bool(_append(store, sid).marked if i % 2 else store.mark_pending(sid)))

        threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(marks) == [False] * 7 + [True], round_


# -- the guard ---------------------------------------------------------------------------
@pytest.fixture
def metrics() -> Any:
    m = PrometheusMetrics()
    set_metrics(m)
    yield m
    set_metrics(None)


def _counted(m: PrometheusMetrics, outcome: str) -> float:
    return m.registry.get_sample_value("compaction_enqueue_total", {"outcome": outcome}) or 0.0


@pytest.mark.parametrize("shell", SHELLS)
def test_record_turn_publishes_once_for_a_stale_flag(
        any_redis: Any, key_prefix: str, shell: str, metrics: PrometheusMetrics,
        caplog: pytest.LogCaptureFixture) -> None:
    store, jobs = _store(any_redis, key_prefix), Recorder()
    guard = make(shell, store, CallbackEnqueuer(jobs))
    guard.record_turn("s", TURN)
    guard.record_turn("s", TURN)
    assert len(jobs.jobs) == 1, "coalesced while the flag is young"
    _age(store, "s", 400)  # the job was lost: no claim came
    with caplog.at_level(logging.INFO):
        guard.record_turn("s", TURN)
    assert len(jobs.jobs) == 2 and _left(store, "s") > TTL - 5
    guard.record_turn("s", TURN)
    assert len(jobs.jobs) == 2, "re-armed: coalesced again"
    assert _counted(metrics, "republished") == 1 and _counted(metrics, "published") == 1
    assert len([r for r in caplog.records if "published again" in r.getMessage()]) == 1
    store.claim("s", 5)  # a worker takes the job: the next turn asks anew
    guard.prepare("s")
    guard.record_turn("s", TURN)
    assert len(jobs.jobs) == 3 and _counted(metrics, "published") == 2


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize(("stale", "age"), [(STALE, 100), (0, 590)])
def test_record_turn_leaves_a_young_flag_or_a_disabled_rule_alone(
        any_redis: Any, key_prefix: str, shell: str, stale: int, age: int) -> None:
    store, jobs = _store(any_redis, key_prefix, stale), Recorder()
    guard = make(shell, store, CallbackEnqueuer(jobs))
    guard.record_turn("s", TURN)
    _age(store, "s", age)
    guard.record_turn("s", TURN)
    assert len(jobs.jobs) == 1


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize(("age", "jobs_after"), [(400, 1), (100, 0)])
def test_a_truncating_prepare_applies_the_rule_too(any_redis: Any, key_prefix: str,
                                                    shell: str, age: int,
                                                    jobs_after: int) -> None:
    """A prepare that truncates forces a job even while one is pending: it re-arms a stale
    flag (the own-writes round trip on real Redis, the store's mark on fakeredis)."""
    store, jobs = _store(any_redis, key_prefix), Recorder()
    for i in range(12):
        store.append("s", coding_turn(i, 2000))
    tokens = store.range_tokens("s", 0, store.length("s"))
    no_cheap = CompactionPolicy(clear_keep_recent_turns=100, clear_tool_outputs_over_tokens=10**9)
    guard = make(shell, store, CallbackEnqueuer(jobs), overrides={"m": int(tokens * 0.7)},
                 policy=no_cheap)
    _age(store, "s", age)
    view = guard.prepare("s", SYSTEM, max_tokens=500, model="m")
    assert view.report.truncated
    assert len(jobs.jobs) == jobs_after and view.report.enqueued == bool(jobs_after)


@pytest.mark.parametrize("shell", SHELLS)
def test_racing_guards_publish_once_for_a_stale_flag(real_redis: redis.Redis, key_prefix: str,
                                                     shell: str) -> None:
    store, jobs = _store(real_redis, key_prefix), Recorder()
    guards = [make(shell, SessionStore(redis.Redis(connection_pool=real_redis.connection_pool),
                                       store.config), CallbackEnqueuer(jobs))
              for _ in range(2)]
    guards[0].record_turn("s", TURN)
    _age(store, "s", 400)
    start = threading.Barrier(len(guards))
    errors: list[BaseException] = []

    def turn(g: Any) -> None:
        start.wait()
        try:
            g.record_turn("s", TURN)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=turn, args=(g,)) for g in guards]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(jobs.jobs) == 2
