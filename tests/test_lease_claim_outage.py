"""A job that starts while Redis is away: its claim rides out a short outage.

A job's first step is the claim (clear the pending flag, take the lease). Before, a
claim that met a Redis restart, a failover or a freeze failed the job at once (Celery
logged "raised unexpected: StoreUnavailable"), and since the claim had not cleared the
session's pending flag, no later turn published a new job until the flag went stale
(300 s by default): minutes of guard truncations instead of a summary. Now the claim is
tried again for a few seconds with the same lease token (a claim that ran but whose
answer was lost is then recognised as the job's own), and a claim still refused after
that asks Celery for a retry.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from shared.core.config import StoreConfig
from shared.core.errors import StoreUnavailable
from shared.store import lease as lease_module
from shared.store.lease import LeaseHolder, Request
from shared.store.sessions import SessionStore, connect
from workers.harness.stack.redis_server import RedisServer


@pytest.fixture
def store(pausable_redis: RedisServer) -> Iterator[SessionStore]:
    config = StoreConfig(key_prefix="claim", socket_timeout=0.3, connect_timeout=0.3)
    yield SessionStore(connect(pausable_redis.url, config), config)


@dataclass
class Done:
    status: str = "compacted"


def _holder(store: SessionStore, ran: list[str]) -> LeaseHolder[Done]:
    def execute(request: Request, token: str) -> Done:
        ran.append(token)
        return Done()

    def follow_up(countdown: float, handoff: int) -> None:
        raise AssertionError("no follow-up expected")

    return LeaseHolder(store, "s", execute, follow_up, lambda exc: False,
                       time_limit=60, ttl_seconds=30)


def _paused(server: RedisServer, seconds: float) -> threading.Thread:
    """Redis frozen now (SIGSTOP) and resumed after ``seconds``, from a thread."""
    assert server.process is not None
    pid = server.process.pid
    os.kill(pid, signal.SIGSTOP)

    def resume() -> None:
        time.sleep(seconds)
        os.kill(pid, signal.SIGCONT)

    thread = threading.Thread(target=resume, daemon=True)
    thread.start()
    return thread


def test_a_claim_during_a_freeze_waits_it_out_and_runs_the_job(
        store: SessionStore, pausable_redis: RedisServer) -> None:
    """The claims time out while Redis is frozen; the job claims again until Redis
    answers, then runs (before, the job failed and left the pending flag set)."""
    store.mark_pending("s")
    ran: list[str] = []
    holder = _holder(store, ran)
    resumer = _paused(pausable_redis, 0.8)
    assert holder.run(Request()) is True
    resumer.join()
    assert len(ran) == 1 and holder.outcome == Done()
    assert not store.is_pending("s")  # a later turn publishes its own job
    assert store.lease_remaining("s") == 0  # released at the end


def test_a_claim_during_a_restart_waits_it_out(
        store: SessionStore, pausable_redis: RedisServer) -> None:
    """Redis down (connections refused) for about a second, as in a restart."""
    store.mark_pending("s")
    ran: list[str] = []
    holder = _holder(store, ran)
    pausable_redis.stop()
    restarter = threading.Timer(1.0, pausable_redis.start)
    restarter.start()
    try:
        assert holder.run(Request()) is True
    finally:
        restarter.join()
    assert len(ran) == 1
    assert store.lease_remaining("s") == 0


def test_a_longer_outage_still_fails_the_claim_after_the_retries(
        store: SessionStore, pausable_redis: RedisServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lease_module, "CLAIM_RETRY_DELAYS", (0.05, 0.05))
    ran: list[str] = []
    holder = _holder(store, ran)
    pausable_redis.stop()
    began = time.monotonic()
    try:
        with pytest.raises(StoreUnavailable, match="claim"):
            holder.run(Request())
        assert time.monotonic() - began < 3
    finally:
        pausable_redis.start()  # the fixture resumes and removes a running server
    assert ran == [] and not holder.claimed


def test_the_same_token_claims_again_a_lease_it_holds(store: SessionStore) -> None:
    """A claim whose answer was lost may have taken the lease: sent again with its token,
    it finds the lease its own (with a new token it found the lease busy, left its request
    for a holder that does not exist and waited for the lease's TTL)."""
    token = store.claim("s", 30)
    assert token is not None
    assert store.claim("s", 30, token=token) == token  # the retried claim: its own lease
    assert store.claim("s", 30) is None  # anyone else: busy
    assert store.acquire_lease("s", 30) is None


def test_a_job_whose_claim_fails_asks_celery_for_a_retry(
        store: SessionStore, pausable_redis: RedisServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The task (eager) on a store that stays down: every attempt's claim fails, each
    but the last asks Celery for a retry with a backoff countdown; the last raises."""
    from workers.runtime import Runtime, set_runtime
    from workers.summarizer.engine import SummaryEngine
    from workers.tasks import _settings, maybe_summarize

    monkeypatch.setattr(lease_module, "CLAIM_RETRY_DELAYS", (0.01,))
    countdowns: list[float] = []
    original = maybe_summarize.retry

    def retry(*args: Any, **kwargs: Any) -> Any:
        countdowns.append(float(kwargs.get("countdown") or 0))
        return original(*args, **kwargs)

    monkeypatch.setattr(maybe_summarize, "retry", retry)
    settings = _settings()
    set_runtime(Runtime(settings=settings, store=store, engine=SummaryEngine(None)))
    pausable_redis.stop()
    try:
        with pytest.raises(StoreUnavailable, match="claim"):
            maybe_summarize.apply(args=["s"]).get()
    finally:
        set_runtime(None)
        pausable_redis.start()
    assert len(countdowns) == settings.max_retries
    assert all(0 <= c <= settings.retry_backoff_max for c in countdowns), countdowns
