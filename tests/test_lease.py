"""The lease protocol (shared/store/lease.py): renewal, fencing, nothing dropped unseen.

Real Redis for the timing tests (a lease of one second, a summarizer that
takes longer), through the Celery tasks (eager) and the real OpenAI SDK
against the fake server; fakeredis where only the protocol's bookkeeping
matters.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
import redis

from shared.core.config import StoreConfig
from shared.core.errors import StoreUnavailable
from shared.core.records import SummaryRecord
from shared.enqueue import QUEUE, TASK_COMPACT, TASK_MAYBE_SUMMARIZE, publisher_app
from shared.guard import ContextGuard
from shared.store.lease import HOLD_TTL_SECONDS, MAX_HANDOFFS, Renewal, Request
from shared.store.sessions import SessionStore
from workers.app import app
from workers.compactor import Compactor
from workers.harness.demo_session import demo_turns
from workers.harness.fakes.openai_server import FakeOpenAIServer
from workers.harness.fakes.summaries import SummarizerResponder
from workers.harness.stack.worker_process import WorkerProcess, worker_env
from workers.runtime import Runtime, set_runtime
from workers.summarizer.engine import SummaryEngine
from workers.summarizer.providers import OpenAIClient
from workers.urls import with_db


def _record(watermark: int) -> SummaryRecord:
    return SummaryRecord(watermark=watermark, kind="llm", text="## Goal\n- x", tokens=5)


def _fill(store: SessionStore, sid: str = "s") -> None:
    for turn in demo_turns(12):  # ~24k tokens: not due for gpt-4o, a /compact compacts
        store.append(sid, turn)


# ------------------------------------------------------------------ fencing in the script

def test_a_commit_is_fenced_by_the_lease_token(store: SessionStore) -> None:
    store.append("s", [{"role": "user", "content": f"m{i}"} for i in range(6)])
    token = store.acquire_lease("s", 5)
    assert token is not None
    refused = store.commit_under_lease("s", _record(2), 0, "not-the-owner")
    assert not refused.ok and refused.reason == "lease"
    assert store.state("s").watermark == 0 and store.summaries("s") == []
    assert store.commit_under_lease("s", _record(2), 0, token).ok
    assert store.release_lease("s", token)
    gone = store.commit_under_lease("s", _record(4), 1, token)  # released: no longer its
    assert not gone.ok and gone.reason == "lease"
    assert store.commit_summary("s", _record(4), 1).ok  # the guard's unfenced truncation


def test_a_job_on_a_deleted_session_cannot_bring_its_summary_back(store: SessionStore) -> None:
    """The user deleted the session while a job summarized it: the job's lease went with
    it, so its commit (same version 0 on a session re-created since) is refused."""
    store.append("s", [{"role": "user", "content": f"m{i}"} for i in range(6)])
    token = store.acquire_lease("s", 5)
    assert token is not None
    store.delete_session("s")
    store.append("s", [{"role": "user", "content": f"new {i}"} for i in range(6)])
    refused = store.commit_under_lease("s", _record(4), 0, token)
    assert not refused.ok and refused.reason == "lease" and store.summaries("s") == []


def test_a_fenced_commit_never_gives_the_lease_a_ttl(real_redis: redis.Redis,
                                                     key_prefix: str) -> None:
    store = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix, ttl_seconds=3600))
    store.append("s", [{"role": "user", "content": f"m{i}"} for i in range(6)])
    token = store.acquire_lease("s", 5)
    assert token is not None and store.commit_under_lease("s", _record(2), 0, token).ok
    assert 0 < int(real_redis.pttl(store.keys("s").lease)) <= 5000  # still the lease's own


def test_renewal_keeps_the_lease_and_notices_a_loss(real_redis: redis.Redis,
                                                    key_prefix: str) -> None:
    store = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix))
    # a 1.5 s lease renewed every 0.5 s: a tick may come late on a loaded machine
    token = store.acquire_lease("s", 1.5)
    assert token is not None
    with Renewal(store, "s", token, 1.5, until=time.monotonic() + 60) as renewal:
        time.sleep(3.5)
        assert store.acquire_lease("s", 1.5) is None, "renewed: still held after 2.3 TTLs"
        real_redis.set(store.keys("s").lease, "another-job", px=60_000)
        time.sleep(1.2)
    assert renewal.renewals >= 3 and renewal.lost.is_set()
    stopped = store.acquire_lease("t", 0.6)
    assert stopped is not None
    with Renewal(store, "t", stopped, 0.6, until=time.monotonic() + 0.1) as renewal:
        time.sleep(1.2)  # limit passed before the first tick: the lease runs out
    assert renewal.renewals == 0 and store.acquire_lease("t", 0.6) is not None


# ------------------------------------------------------------------ a slow summarizer

class Tracking:
    """SummarizerResponder that counts the summarizer calls in flight, and can act mid-call."""

    def __init__(self, during: Any = None, delay: float = 0.0) -> None:
        self.delay = delay  # inside the in-flight window (the server's latency is not)
        self.inner = SummarizerResponder()
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.calls = 0
        self.during = during

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.in_flight += 1
            self.calls += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.during is not None:
                self.during()
            time.sleep(self.delay)
            reply: dict[str, Any] = self.inner(request)
            return reply
        finally:
            with self.lock:
                self.in_flight -= 1


@pytest.fixture
def slow_runtime(real_redis: redis.Redis,
                 key_prefix: str) -> Iterator[tuple[SessionStore, Tracking, FakeOpenAIServer]]:
    """Real Redis, a lease of 2 s, a summarizer answering after 5 s, as the runtime."""
    from workers.tasks import _settings

    store = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix, lease_ttl_seconds=2))
    _fill(store)
    tracking = Tracking(delay=5.0)
    with FakeOpenAIServer(responder=tracking) as server:
        client = OpenAIClient("gpt-4o-mini", api_key="k", base_url=server.base_url, timeout=20)
        set_runtime(Runtime(settings=_settings(), store=store, engine=SummaryEngine(client)))
        try:
            yield store, tracking, server
        finally:
            set_runtime(None)


def test_a_job_slower_than_its_lease_keeps_it_and_runs_alone(
        slow_runtime: tuple[SessionStore, Tracking, FakeOpenAIServer]) -> None:
    """Without renewal the 2 s lease expires during the 5 s call and a second job
    summarizes the same session at the same time. (A 1 s lease was lost once in seven
    runs at load 8 on 2 cores: renewal ticks late; the fenced commit then refused.)"""
    from workers.tasks import compact

    store, tracking, _ = slow_runtime
    results: list[dict[str, Any]] = []
    first = threading.Thread(target=lambda: results.append(
        compact.apply(args=["s"], kwargs={"keep_recent": 2000}).get()))
    first.start()
    time.sleep(3.0)  # past the lease's TTL, inside the summarizer call
    second = compact.apply(args=["s"], kwargs={"keep_recent": 1500}).get()
    first.join(timeout=60)
    assert second["status"] == "busy", second
    assert tracking.max_in_flight == 1, "two jobs summarized one session at once"
    (result,) = results
    assert result["status"] == "compacted" and result["summary_kind"] == "llm", result
    assert result["lease_renewals"] >= 4
    assert len(result["reruns"]) == 1  # the busy job's request, run by the holder after
    assert store.state("s").watermark > 0
    assert not store.redis.exists(store.keys("s").lease, store.keys("s").dirty)


def test_a_job_that_lost_its_lease_cannot_commit(
        slow_runtime: tuple[SessionStore, Tracking, FakeOpenAIServer]) -> None:
    """The lease passes to another job while the summarizer works (it expired: a stall
    longer than the renewal could cover): the old holder's commit is refused."""
    from workers.tasks import compact

    store, tracking, _ = slow_runtime
    key = store.keys("s").lease
    tracking.during = lambda: store.redis.set(key, "the-next-holder", px=60_000)
    result = compact.apply(args=["s"], kwargs={"keep_recent": 2000}).get()
    assert result["status"] == "lease_lost", result
    assert "fenced" in result["reason"]
    assert store.state("s").watermark == 0 and store.summaries("s") == []
    assert store.redis.get(key) == b"the-next-holder"  # the new holder's lease is untouched
    # ... and the request goes to that holder, which looks at the flag before it releases
    assert store.take_dirty_requests("s") == [Request(keep_recent=2000, manual=True).encode()]


# ------------------------------------------------------------------ nothing dropped unseen

@pytest.fixture
def eager_store() -> Iterator[SessionStore]:
    from workers.tasks import _settings

    store = SessionStore(fakeredis.FakeRedis(), StoreConfig())
    _fill(store)
    set_runtime(Runtime(settings=_settings(), store=store, engine=SummaryEngine(None)))
    yield store
    set_runtime(None)


def _capture_sends(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    def send_task(name: str, args: list[Any], kwargs: dict[str, Any], queue: str,
                  **options: Any) -> None:
        sent.append({"name": name, "args": args, "kwargs": kwargs, **options})

    monkeypatch.setattr(app, "send_task", send_task)
    return sent


def test_a_manual_request_left_with_a_holder_that_fails_is_run_later(
        eager_store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A /compact finds the lease busy; the holder then dies of a failure that is not
    retried (Redis went away). Before: the request sat in the flag until it expired."""
    from workers.tasks import JobFailed, compact, maybe_summarize

    sent = _capture_sends(monkeypatch)
    original = Compactor.run
    runs: list[dict[str, Any]] = []

    def run(self: Compactor, session_id: str, **kwargs: Any) -> Any:
        runs.append({k: kwargs.get(k) for k in ("keep_recent", "manual")})
        if len(runs) == 1:
            busy = compact.apply(args=[session_id], kwargs={"keep_recent": 2000}).get()
            assert busy["status"] == "busy"
            raise StoreUnavailable("redis unavailable during load_view: connection reset")
        return original(self, session_id, **kwargs)

    monkeypatch.setattr(Compactor, "run", run)
    failed = maybe_summarize.apply(args=["s"])
    with pytest.raises(JobFailed) as caught:
        failed.get()
    assert "StoreUnavailable" in str(caught.value) and "handed_to_follow_up" in str(caught.value)
    assert isinstance(caught.value.__cause__, StoreUnavailable)
    watcher, handed = sent  # the busy job watches the holder; the failing holder hands over
    assert watcher["countdown"] > 1 and watcher["kwargs"]["handoff"] == 1
    assert handed == {"name": TASK_MAYBE_SUMMARIZE, "args": ["s"],
                      "kwargs": {"tenant": "default", "handoff": 1}}  # released: no countdown
    follow_up = maybe_summarize.apply(args=handed["args"], kwargs=handed["kwargs"]).get()
    assert runs[-1] == {"keep_recent": 2000, "manual": True}
    assert follow_up["reruns"] == ["compacted"] and eager_store.state("s").watermark > 0
    assert eager_store.take_dirty_requests("s") is None


def test_a_holder_that_could_not_release_hands_over_after_the_lease_ttl(
        eager_store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
    from workers.tasks import JobFailed, maybe_summarize

    sent = _capture_sends(monkeypatch)
    eager_store.mark_dirty("s", Request(keep_recent=2000, manual=True).encode())

    def run(self: Compactor, session_id: str, **kwargs: Any) -> Any:
        raise StoreUnavailable("redis unavailable during load_view: timed out")

    def release(self: SessionStore, session_id: str, token: str) -> bool:
        raise StoreUnavailable("redis unavailable during release_lease: timed out")

    monkeypatch.setattr(Compactor, "run", run)
    monkeypatch.setattr(SessionStore, "release_lease", release)
    with pytest.raises(JobFailed):
        maybe_summarize.apply(args=["s"]).get()
    assert sent[0]["countdown"] == min(eager_store.config.lease_ttl_seconds, HOLD_TTL_SECONDS)


def test_requests_given_up_on_are_reported_in_state_stats_and_the_result(
        eager_store: SessionStore, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The follow-up jobs fail too: the requests leave the flag as *failed*, visible in
    the session's state, guard.stats(), `compaction stats` and the task's result."""
    from workers.tasks import JobFailed, maybe_summarize

    sent = _capture_sends(monkeypatch)
    eager_store.mark_dirty("s", Request(keep_recent=2000, manual=True).encode())

    def run(self: Compactor, session_id: str, **kwargs: Any) -> Any:
        raise StoreUnavailable("redis unavailable during load_view: timed out")

    monkeypatch.setattr(Compactor, "run", run)
    with pytest.raises(JobFailed) as caught:
        maybe_summarize.apply(args=["s"], kwargs={"handoff": MAX_HANDOFFS}).get()
    assert "requests_failed" in str(caught.value) and sent == []
    state = eager_store.state("s")
    assert state.requests_failed == 1 and "StoreUnavailable" in state.last_request_failure
    assert eager_store.take_dirty_requests("s") is None  # taken out: failed, not pending
    stats = ContextGuard(eager_store).stats("s")
    assert stats["requests_failed"] == 1 and '"manual": true' in stats["last_request_failure"]

    from workers.cli import stats as stats_cli

    monkeypatch.setattr(stats_cli, "open_store", lambda settings, tenant: eager_store)
    args = type("Args", (), {"session": "s", "tenant": "default", "json": False})()
    assert stats_cli.run(args, __import__("workers.tasks").tasks._settings()) == 0
    out = capsys.readouterr().out
    assert "failed compaction requests" in out and "StoreUnavailable" in out


def test_a_follow_up_that_cannot_be_sent_is_reported_failed(
        eager_store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
    from workers import tasks

    eager_store.mark_dirty("s", Request(keep_recent=2000, manual=True).encode())

    def run(self: Compactor, session_id: str, **kwargs: Any) -> Any:
        raise StoreUnavailable("redis unavailable during load_view: timed out")

    def send_task(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("broker unreachable")

    monkeypatch.setattr(Compactor, "run", run)
    monkeypatch.setattr(app, "send_task", send_task)
    with pytest.raises(tasks.JobFailed):
        tasks.maybe_summarize.apply(args=["s"]).get()
    assert eager_store.state("s").requests_failed == 1


def test_a_failure_with_nothing_waiting_raises_as_it_is(
        eager_store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
    from workers.tasks import maybe_summarize

    sent = _capture_sends(monkeypatch)

    def run(self: Compactor, session_id: str, **kwargs: Any) -> Any:
        raise StoreUnavailable("redis unavailable during load_view: timed out")

    monkeypatch.setattr(Compactor, "run", run)
    with pytest.raises(StoreUnavailable):
        maybe_summarize.apply(args=["s"]).get()
    assert sent == [] and not eager_store.redis.exists(eager_store.keys("s").lease)


def test_a_renewal_that_fails_is_tried_again_soon() -> None:
    """Redis away for one tick: the next try comes at a tenth of the TTL, not a third."""
    calls: list[float] = []

    class Flaky:
        def extend_lease(self, session_id: str, token: str, ttl: float) -> bool:
            calls.append(time.monotonic())
            if len(calls) == 1:
                raise StoreUnavailable("redis unavailable during extend_lease: timed out")
            return True

    flaky: Any = Flaky()
    with Renewal(flaky, "s", "t", 3.0, until=time.monotonic() + 60) as renewal:
        time.sleep(1.5)
    assert len(calls) == 2 and renewal.renewals == 1 and not renewal.lost.is_set()
    assert 0.25 <= calls[1] - calls[0] <= 0.6  # 0.3 s later (a third would be 1 s)


# ------------------------------------------------------------------ busy jobs' follow-ups

@pytest.fixture
def busy_store(real_redis: redis.Redis, key_prefix: str) -> Iterator[SessionStore]:
    from workers.tasks import _settings

    store = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix))
    _fill(store)
    set_runtime(Runtime(settings=_settings(), store=store, engine=SummaryEngine(None)))
    yield store
    set_runtime(None)


def test_busy_jobs_share_one_follow_up_and_a_dead_holders_requests_still_run(
        busy_store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every busy job sent a follow-up of its own (the soak audit: 172 delayed jobs for
    one session); one per session is enough, as long as a watcher that still finds the
    lease held watches again and the last one runs what the dead holder never took."""
    from workers.tasks import compact, maybe_summarize

    sent = _capture_sends(monkeypatch)
    assert busy_store.acquire_lease("s", ttl_seconds=30)  # then killed with -9: runs nothing
    results = [maybe_summarize.apply(args=["s"]).get() for _ in range(5)]
    results.append(compact.apply(args=["s"], kwargs={"keep_recent": 2000}).get())
    assert {r["status"] for r in results} == {"busy"}
    (watcher,) = sent
    assert 1 < watcher["countdown"] <= 31 and watcher["kwargs"]["handoff"] == 1
    # it comes while the lease still runs (the holder renewed it before dying): watch again
    again = maybe_summarize.apply(args=watcher["args"], kwargs=watcher["kwargs"]).get()
    assert again["status"] == "busy" and len(sent) == 2
    assert sent[1]["kwargs"]["handoff"] == 2
    assert maybe_summarize.apply(args=["s"]).get()["status"] == "busy" and len(sent) == 2
    busy_store.redis.delete(busy_store.keys("s").lease)  # the dead holder's lease expires
    done = maybe_summarize.apply(args=sent[1]["args"], kwargs=sent[1]["kwargs"]).get()
    assert "compacted" in done["reruns"], done  # the /compact left with the dead holder
    assert busy_store.state("s").watermark > 0
    assert not busy_store.requests_waiting("s")
    assert maybe_summarize.apply(args=["s"]).get()["status"] != "busy" and len(sent) == 2


def test_a_busy_job_does_not_rely_on_a_follow_up_that_watches_no_further(
        busy_store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
    from workers.tasks import maybe_summarize

    sent = _capture_sends(monkeypatch)
    assert busy_store.acquire_lease("s", ttl_seconds=30)
    chain = maybe_summarize.apply(args=["s"], kwargs={"handoff": MAX_HANDOFFS - 1}).get()
    assert chain["status"] == "busy" and [s["kwargs"]["handoff"] for s in sent] == [MAX_HANDOFFS]
    for _ in range(3):  # the last of a chain: a fresh request gets a watcher of its own, once
        assert maybe_summarize.apply(args=["s"]).get()["status"] == "busy"
    assert [s["kwargs"]["handoff"] for s in sent] == [MAX_HANDOFFS, 1]


@pytest.mark.celery
@pytest.mark.slow
def test_a_worker_keeps_one_delayed_follow_up_per_busy_session(own_redis_url: str,
                                                               key_prefix: str) -> None:
    """A real worker: the delayed follow-ups sit in its memory and the broker's unacked
    set (21 of them for 21 busy jobs before); one runs what the dead holder never took."""
    store_url, broker_url = with_db(own_redis_url, 13), with_db(own_redis_url, 14)
    store = SessionStore(redis.Redis.from_url(store_url), StoreConfig(key_prefix=key_prefix))
    broker = redis.Redis.from_url(broker_url)
    _fill(store)
    worker = WorkerProcess("busy", worker_env(broker_url=broker_url, redis_url=store_url,
                                              key_prefix=key_prefix, summarizer="offline"))
    worker.start()
    try:
        assert store.acquire_lease("s", ttl_seconds=4)  # a holder killed with -9
        publisher = publisher_app(broker_url, timeout=2.0)
        for _ in range(10):
            publisher.send_task(TASK_MAYBE_SUMMARIZE, args=["s"], queue=QUEUE)
        publisher.send_task(TASK_COMPACT, args=["s"], kwargs={"keep_recent": 2000}, queue=QUEUE)
        deadline = time.monotonic() + 20
        while worker.log().count("'status': 'busy'") < 11 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert worker.log().count("'status': 'busy'") == 11, worker.log()[-2000:]
        assert broker.hlen("unacked") == 1  # the one delayed follow-up
        while store.requests_waiting("s") and time.monotonic() < deadline + 10:
            time.sleep(0.2)
        assert not store.requests_waiting("s") and store.state("s").watermark > 0
    finally:
        worker.stop()
        broker.flushdb()
        store.redis.flushdb()


def test_a_job_stopped_while_the_broker_is_away_leaves_the_requests_waiting(
        eager_store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Celery cancels a running prefork job when the broker connection drops (SystemExit in
    the job) and no follow-up can be sent then: a /compact left for the holder used to be
    recorded failed and dropped; it stays in the flag for the job's redelivery, which runs
    it (measured: a broker restart beside a live store under a prefork worker)."""
    from workers import tasks

    eager_store.mark_dirty("s", Request(keep_recent=2000, manual=True).encode())

    def stopped(self: Compactor, session_id: str, **kwargs: Any) -> Any:
        raise SystemExit(-15)

    def send_task(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("broker unreachable")

    monkeypatch.setattr(Compactor, "run", stopped)
    monkeypatch.setattr(app, "send_task", send_task)
    with pytest.raises(SystemExit):
        tasks.maybe_summarize.apply(args=["s"])
    assert eager_store.state("s").requests_failed == 0
    assert eager_store.requests_waiting("s")
    monkeypatch.undo()
    redelivered = tasks.maybe_summarize.apply(args=["s"]).get()
    assert redelivered["reruns"] == ["compacted"] and eager_store.state("s").watermark > 0
