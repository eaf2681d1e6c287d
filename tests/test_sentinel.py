"""The store and the broker on Redis Sentinel: URLs, settings, failover, a real worker.

Each test that needs servers starts its own deployment (a primary, a replica, three
Sentinels on free ports, about 0.3 s: :mod:`workers.harness.stack.sentinel_pair`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from typing import Any

import pytest
import redis
from redis.sentinel import SentinelConnectionPool

from shared.core.config import StoreConfig
from shared.core.errors import InvalidInput, StoreUnavailable
from shared.enqueue import CeleryEnqueuer, publisher_app
from shared.guard import AsyncContextGuard, ContextGuard
from shared.store.aio import AsyncSessionStore, connect_async
from shared.store.changes import feed_for
from shared.store.sentinel import (
    QUIET_MAX_SECONDS,
    FollowingSentinelPool,
    _ask,
    _Follow,
    _settle,
    connect_sentinel,
    is_readonly,
    newest_primary,
    parse_sentinel_url,
)
from shared.store.sessions import SessionStore, connect
from workers.app import celery_config
from workers.cli.doctor import run_checks
from workers.harness.demo_session import SYSTEM_PROMPT, TOOLS, demo_turns
from workers.harness.stack.sentinel_pair import SentinelDeployment, start_sentinel_deployment
from workers.harness.stack.worker_process import WorkerProcess, worker_env
from workers.harness.timing import wait_for
from workers.settings import Settings
from workers.settings_urls import redact_url

SHELLS = ("sync", "async")


# -- URLs and settings (no servers) ---------------------------------------------------------
def test_the_url_names_sentinels_service_db_and_credentials() -> None:
    parsed = parse_sentinel_url("redis+sentinel://app:s%40cret@10.0.0.1:26380,sentinel-b,"
                                "[::1]:26381/cache-primary/3?sentinel_password=sp")
    assert parsed.sentinels == (("10.0.0.1", 26380), ("sentinel-b", 26379), ("::1", 26381))
    assert (parsed.service, parsed.db, parsed.username, parsed.password) == (
        "cache-primary", 3, "app", "s@cret")
    assert parsed.sentinel_password == "sp" and parsed.sentinel_username is None
    assert parse_sentinel_url("redis+sentinel://h/svc").db == 0


@pytest.mark.parametrize("url, why", [
    ("redis://h:26379/svc", "scheme"),
    ("redis+sentinel://h:26379", "no service"),
    ("redis+sentinel://h:26379/svc/one", "database must be a number"),
    ("redis+sentinel://h:70000/svc", "bad Sentinel address"),
    ("redis+sentinel://h:1,,h2:2/svc", "empty"),
    ("redis+sentinel://h/svc?password=x", "unknown option"),
])
def test_a_bad_url_says_what_is_wrong(url: str, why: str) -> None:
    with pytest.raises(InvalidInput, match=why) as info:
        parse_sentinel_url(url)
    assert info.value.field == "url"


def test_settings_take_a_sentinel_store_and_broker_and_redact_their_secrets() -> None:
    settings = Settings(
        redis_url="redis+sentinel://u:pw@127.0.0.1:26379,127.0.0.1:26380/svc/0"
                  "?sentinel_password=sentinel-secret",
        broker_url="sentinel://:pw@127.0.0.1:26379/1;sentinel://:pw@127.0.0.1:26380/1",
        broker_sentinel_master="svc")
    shown = redact_url(settings.redis_url) + redact_url(settings.broker_url)
    assert "pw" not in shown.replace("password", "") and "sentinel-secret" not in shown
    options = celery_config(settings)["broker_transport_options"]
    assert options["master_name"] == "svc"
    app = publisher_app(settings.broker_url, sentinel_master="svc")
    assert app.conf.broker_transport_options["master_name"] == "svc"


@pytest.mark.parametrize("fields, message", [
    ({"redis_url": "redis+sentinel://u:topsecret@h:26379/svc/x"}, "redis_url"),
    ({"broker_url": "sentinel://h:26379/1"}, "COMPACTION_BROKER_SENTINEL_MASTER is required"),
    ({"broker_sentinel_master": "svc"}, "applies to a sentinel://"),
])
def test_bad_sentinel_settings_name_the_setting(fields: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Settings(**fields)  # type: ignore[arg-type]


def test_load_settings_redacts_a_bad_sentinel_url(monkeypatch: pytest.MonkeyPatch) -> None:
    from shared.core.errors import ConfigError
    from workers.settings import load_settings

    monkeypatch.setenv("COMPACTION_REDIS_URL", "redis+sentinel://u:topsecret@h:26379/svc/x")
    with pytest.raises(ConfigError, match="COMPACTION_REDIS_URL") as info:
        load_settings()
    assert "topsecret" not in str(info.value)


def test_readonly_is_recognised_bare_and_inside_a_script_error() -> None:
    assert is_readonly(redis.exceptions.ReadOnlyError("You can't write against a replica"))
    assert is_readonly(redis.exceptions.ResponseError(
        "Error running script (call to f_1): @user_script:1: -READONLY You can't write"))
    assert not is_readonly(redis.exceptions.ResponseError("NOREPLICAS Not enough good replicas"))


def _state(port: int, epoch: int, flags: str = "master") -> dict[str, Any]:
    return {"ip": "127.0.0.1", "port": port, "config-epoch": epoch, "flags": flags,
            "is_master": "master" in flags.split(","), "is_sdown": False, "is_odown": False,
            "num-other-sentinels": 2}


def test_the_sentinel_with_the_newest_configuration_names_the_primary() -> None:
    manager = redis.sentinel.Sentinel([])
    # a Sentinel that has not heard of the failover yet still names the old primary
    assert newest_primary([_state(1, 3), _state(2, 4), _state(1, 3)], manager, "s") == (
        "127.0.0.1", 2)
    assert newest_primary([_state(1, 3, "master,o_down") | {"is_odown": True}], manager,
                          "s") is None


def test_a_failover_in_progress_holds_calls_and_silent_sentinels_keep_the_primary() -> None:
    manager, follow = redis.sentinel.Sentinel([]), _Follow(1.0, 0.2)
    flagged = _state(1, 3, "master,failover_in_progress,force_failover")
    follow.asking()
    assert _settle(follow, [flagged, _state(1, 3)], manager, "s", None) == ("127.0.0.1", 1)
    assert follow.holding() and not follow.due(True)
    time.sleep(0.2)
    assert follow.due(True)  # while holding, asked again every error_gap
    assert _settle(follow, [_state(2, 4)], manager, "s", ("127.0.0.1", 1)) == ("127.0.0.1", 2)
    assert not follow.holding()
    assert _settle(follow, [], manager, "s", ("127.0.0.1", 2)) == ("127.0.0.1", 2)
    assert follow.suspect  # asked again after error_gap, not a second later
    with pytest.raises(redis.exceptions.ConnectionError, match="No master found"):
        _settle(follow, [_state(2, 4, "slave") | {"is_master": False}], manager, "s",
                ("127.0.0.1", 2))


def _drive(follow: _Follow, manager: Any, answers: dict[str, Any]) -> tuple[list[str],
                                                                            tuple[str, int]]:
    """Run :func:`_ask` as a pool does: (the Sentinels asked, in order; the primary)."""
    asked: list[str] = []
    asking = _ask(follow, manager, "s", None)
    try:
        sentinel = next(asking)
        while True:
            asked.append(sentinel)
            sentinel = asking.send(answers[sentinel])
    except StopIteration as done:
        return asked, done.value


def test_a_sentinel_that_did_not_answer_is_left_out_until_the_others_vouch_for_none() -> None:
    manager, follow = redis.sentinel.Sentinel([]), _Follow(1.0, 0.2)
    manager.sentinels = ["a", "b", "c"]
    answers = {"a": None, "b": _state(1, 3), "c": _state(1, 3)}
    assert _drive(follow, manager, answers) == (["a", "b", "c"], ("127.0.0.1", 1))
    assert _drive(follow, manager, answers) == (["b", "c"], ("127.0.0.1", 1))
    # those asked vouch for no primary: the quiet one is asked too, and its answer counts
    answers = {"a": _state(2, 4), "b": None, "c": None}
    assert _drive(follow, manager, answers) == (["b", "c", "a"], ("127.0.0.1", 2))
    # each further miss doubles the time a Sentinel is left out, up to a bound
    assert follow.misses == {1: 1, 2: 1}
    for _ in range(12):
        follow.answered(1, False)
    assert QUIET_MAX_SECONDS - 1 < follow.quiet_until[1] - time.monotonic() <= QUIET_MAX_SECONDS
    follow.answered(1, True)
    assert 1 not in follow.misses and 1 not in follow.quiet_until
    # none answered lately: all are asked
    follow.quiet_until = {0: time.monotonic() + 60, 1: time.monotonic() + 60,
                          2: time.monotonic() + 60}
    asked, _ = _drive(follow, manager, {"a": _state(1, 3), "b": None, "c": None})
    assert asked == ["a", "b", "c"]


def test_an_async_connection_busy_at_the_switch_goes_back_disconnected() -> None:
    import redis.asyncio.sentinel as aio_sentinel

    from shared.store.sentinel import AsyncFollowingSentinelPool

    class Busy:
        host, port, closed = "127.0.0.1", 1, False

        async def disconnect(self) -> None:
            self.closed = True

        def should_reconnect(self) -> bool:
            return False

        async def re_auth(self) -> None:
            return None

    async def run() -> tuple[bool, bool]:
        pool = AsyncFollowingSentinelPool("s", aio_sentinel.Sentinel([]), max_connections=2)
        old, current = Busy(), Busy()
        current.port = 2
        pool.master_address = ("127.0.0.1", 2)  # the Sentinels named a new primary meanwhile
        for conn in (old, current):
            pool._in_use_connections.add(conn)
            await pool.release(conn)
        return old.closed, current.closed

    assert asyncio.run(run()) == (True, False)


# -- a real deployment -----------------------------------------------------------------------
@pytest.fixture
def deployment() -> Iterator[SentinelDeployment]:
    with start_sentinel_deployment() as running:
        yield running


def _turn(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"question {i}"},
            {"role": "assistant", "content": f"answer {i}"}]


class Shell:
    """One guard (sync or async) on a store built from the Sentinel URL, driven by
    blocking calls; ``log_length_on(port)`` reads the session's log on one server."""

    def __init__(self, kind: str, url: str, **guard_kwargs: Any) -> None:
        self.config = StoreConfig(key_prefix="ts", socket_timeout=0.5, connect_timeout=0.5)
        self.kind = kind
        self.loop = asyncio.new_event_loop()
        if kind == "sync":
            self.store: Any = SessionStore(connect(url, self.config), self.config)
            self.guard: Any = ContextGuard(self.store, None, **guard_kwargs)
        else:
            self.store = AsyncSessionStore(connect_async(url, self.config), self.config)
            self.guard = AsyncContextGuard(self.store, None, **guard_kwargs)

    def _run(self, value: Any) -> Any:
        return self.loop.run_until_complete(value) if self.kind == "async" else value

    def turn(self, sid: str, i: int) -> int:
        self._run(self.guard.prepare(sid, "system", None, 256, "gpt-4o",
                                     pending=_turn(i)[:1]))
        return int(self._run(self.guard.record_turn(sid, _turn(i))))

    def seen(self, sid: str) -> list[str]:
        """The texts of the session's view, as a prepare with nothing pending makes it."""
        view = self._run(self.guard.prepare(sid, "system", None, 256, "gpt-4o"))
        return [m.text() for m in view.messages]

    def log_length_on(self, port: int, sid: str, db: int = 0) -> int:
        with closing(redis.Redis(port=port, db=db, socket_timeout=2)) as direct:
            return int(direct.llen(self.store.keys(sid).log))

    def close(self) -> None:
        if self.kind == "async":
            self.loop.run_until_complete(self.guard.aclose())
            self.loop.run_until_complete(self.store.redis.aclose())
        else:
            self.guard.close()
            self.store.redis.close()
        self.loop.close()


@pytest.fixture(params=SHELLS)
def shell_on(request: pytest.FixtureRequest) -> Iterator[Callable[[str], Shell]]:
    made: list[Shell] = []

    def make(url: str) -> Shell:
        made.append(Shell(request.param, url))
        return made[-1]

    yield make
    for shell in made:
        shell.close()


def test_the_guard_prepares_and_records_through_a_sentinel_url(
        deployment: SentinelDeployment, shell_on: Callable[[str], Shell]) -> None:
    shell = shell_on(deployment.url(2))
    lengths = [shell.turn("s1", i) for i in range(5)]
    assert lengths == [2, 4, 6, 8, 10]
    assert shell.log_length_on(deployment.primary_port(), "s1", db=2) == 10


def _view_reads(port: int) -> int:
    """Scripts run on the server at ``port`` so far (a guard's read of a view is one)."""
    with closing(redis.Redis(port=port, socket_timeout=2)) as direct:
        return int(direct.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def test_a_warm_guard_on_sentinel_skips_its_reads_and_sees_another_writer(
        deployment: SentinelDeployment, shell_on: Callable[[str], Shell]) -> None:
    """The change feed follows the primary through the Sentinel pool: the calls of a tool
    chain do not read the session (they read once a second at most, when the pool asks
    the Sentinels again), and a turn another process records is in the next view. Before,
    the feed was off on Sentinel and every prepare read."""
    writer, reader = shell_on(deployment.url()), shell_on(deployment.url())
    assert feed_for(reader.store.redis, "ts:{") is not None
    # no read forced by the pool's answer going stale on a loaded machine: asked once
    reader.store.redis.connection_pool.follow.follow_seconds = 60.0
    writer.turn("s", 0)
    assert "answer 0" in reader.seen("s")
    port = deployment.primary_port()
    before = _view_reads(port)
    for _ in range(10):
        assert reader.seen("s")[-1] == "answer 0"
    assert _view_reads(port) - before <= 2
    writer.turn("s", 1)
    assert reader.seen("s")[-2:] == ["question 1", "answer 1"]
    reader.turn("s", 2)  # its own append, on the own-writes connection to the primary
    before = _view_reads(port)
    assert reader.seen("s")[-2:] == ["question 2", "answer 2"]
    assert _view_reads(port) == before  # vouched for: no read after its own turn


def test_an_own_write_that_meets_a_replica_goes_through_the_store(
        deployment: SentinelDeployment, shell_on: Callable[[str], Shell]) -> None:
    """The own-writes connection writes only where the pool's fresh answer says the
    primary is; were it on a replica (a demoted primary, in the moment before the pool
    hears of it), its writes answer READONLY: nothing was written, the connection is
    dropped and they go through the store (the prepare's as the append's), once."""
    shell = shell_on(deployment.url())
    own = shell.guard.own
    assert own is not None
    primary = ("127.0.0.1", deployment.primary_port())
    turns = 0
    while own._address != primary:  # on a loaded machine the pool's answer may be stale
        assert turns < 20, "the own-writes connection never opened on the primary"
        shell.turn("s", turns)  # at an append: that one goes through the store
        turns += 1
    pool = shell.store.redis.connection_pool
    replica = next(n.port for n in deployment.nodes if n.port != primary[1])
    fresh = pool.follow.fresh
    pool.follow.fresh = lambda address: ("127.0.0.1", replica) if fresh(address) else None
    try:  # the "moved" primary: the connection is dropped and opened on the replica
        assert shell.turn("s", turns) == 2 * turns + 2
        assert own._conn is None  # READONLY: dropped, backing off (the store took the turn)
    finally:
        pool.follow.fresh = fresh
    assert shell.log_length_on(primary[1], "s") == 2 * turns + 2
    assert shell.seen("s")[-2:] == [f"question {turns}", f"answer {turns}"]


def _ride_out(shell: Shell, sid: str, start: int, until: Callable[[], bool],
              timeout: float = 20.0) -> tuple[int, list[BaseException]]:
    """Turns every 20 ms until ``until()`` holds after a successful one; StoreUnavailable
    is allowed meanwhile (anything else propagates). (turns done, failures seen)."""
    failures: list[BaseException] = []
    i, deadline = start, time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            shell.turn(sid, i)
            i += 1
            if until():
                return i, failures
        except StoreUnavailable as exc:
            failures.append(exc)
        time.sleep(0.02)
    raise AssertionError(f"no recovery within {timeout} s; last failures {failures[-3:]}")


def test_a_sentinel_that_stops_answering_stalls_one_call_not_one_a_second(
        deployment: SentinelDeployment, shell_on: Callable[[str], Shell]) -> None:
    """A hung Sentinel (SIGSTOP: its port open, no answer) costs the call that finds it
    so one socket timeout; the checks after that ask the two that answer. Before, every
    check (once a second) waited the timeout on it: a 0.5 s stall each second."""
    shell = shell_on(deployment.url(0))
    shell.turn("hung", 0)
    hung = deployment.sentinels[0].process
    assert hung is not None
    os.kill(hung.pid, signal.SIGSTOP)
    try:
        slow, i, began = 0, 1, time.monotonic()
        while time.monotonic() - began < 4.5:
            started = time.monotonic()
            shell.turn("hung", i)
            slow += time.monotonic() - started > 0.25
            i += 1
            time.sleep(0.02)
    finally:
        os.kill(hung.pid, signal.SIGCONT)
    assert slow <= 1, f"{slow} calls stalled on the hung Sentinel in {i - 1} turns"
    assert shell.log_length_on(deployment.primary_port(), "hung") == 2 * i


def test_after_a_planned_failover_the_next_calls_go_to_the_new_primary(
        deployment: SentinelDeployment, shell_on: Callable[[str], Shell]) -> None:
    shell = shell_on(deployment.url())
    done = sum(1 for i in range(5) if shell.turn("s1", i))
    old = deployment.primary_port()
    deployment.failover()
    new = deployment.wait_primary_not(old)
    # the old primary takes writes for seconds after the switch (until it is demoted):
    # within a follow interval every call must have left it
    time.sleep(1.2)
    length = shell.turn("s1", done)
    assert shell.log_length_on(new, "s1") >= length, "the call went to the old primary"
    done, _ = _ride_out(shell, "s1", done + 1,
                        lambda: shell.log_length_on(new, "s1") >= 2 * 3)
    assert shell.turn("s1", done) == shell.log_length_on(new, "s1")


def test_after_a_failover_the_feed_vouches_for_nothing_the_old_primary_saw(
        deployment: SentinelDeployment, shell_on: Callable[[str], Shell]) -> None:
    """A guard in use across a planned failover (a call every 20 ms, so its pool's
    answer never goes stale): once its pool names the new primary, its feed drops the
    connection to the old one (which takes writes, and stays open, until the Sentinels
    demote it) and vouches for nothing cached before; a turn another process records on
    the new primary is in its next view, and the feed is on the new primary from then."""
    writer, reader = shell_on(deployment.url()), shell_on(deployment.url())
    writer.turn("s", 0)
    assert reader.seen("s")[-1] == "answer 0"
    pool = reader.store.redis.connection_pool
    old = deployment.primary_port()
    # the turn on the replica first: a write it has not received is lost with the switch
    # (what a reader then sees is the new primary's shorter log, feed or not)
    assert wait_for(lambda: all(writer.log_length_on(node.port, "s") == 2
                                for node in deployment.nodes), 10.0)
    deployment.failover()
    deadline = time.monotonic() + 30
    while (pool.primary_now() or ("", old))[1] == old:  # the reader's pool follows the switch
        assert time.monotonic() < deadline, "the pool never named the new primary"
        with contextlib.suppress(StoreUnavailable):  # while the failover is in progress
            assert reader.seen("s")[-1] == "answer 0"
        time.sleep(0.02)
    new = pool.primary_now()[1]
    done, _ = _ride_out(writer, "s", 1, lambda: writer.log_length_on(new, "s") >= 4)
    assert reader.seen("s")[-1] == f"answer {done - 1}"
    feed = reader.guard.feed
    assert feed is not None and feed._address is not None and feed._address[1] == new
    before = _view_reads(new)
    for _ in range(5):
        assert reader.seen("s")[-1] == f"answer {done - 1}"
    assert _view_reads(new) - before <= 2


def test_after_the_primary_is_killed_the_guard_recovers(
        deployment: SentinelDeployment, shell_on: Callable[[str], Shell]) -> None:
    shell = shell_on(deployment.url())
    for i in range(5):
        shell.turn("s1", i)
    killed = deployment.kill_primary()
    started = time.monotonic()
    with pytest.raises(StoreUnavailable):
        shell.turn("s1", 5)  # the dead primary: a typed outage, no redis exception
    new = deployment.wait_primary_not(killed)
    done, failures = _ride_out(shell, "s1", 5, lambda: True)
    recovered = time.monotonic() - started
    assert recovered < 15, recovered
    assert all(isinstance(f, StoreUnavailable) for f in failures)
    assert shell.turn("s1", done) == shell.log_length_on(new, "s1")


def test_the_stock_pool_is_what_the_failover_test_tells_apart(
        deployment: SentinelDeployment) -> None:
    """The failover test's check, on redis-py's stock pool: its pooled connection still
    writes to the old primary after the switch, ours does not."""
    config = StoreConfig(key_prefix="ts", socket_timeout=0.5, connect_timeout=0.5)
    stock = connect_sentinel(deployment.url(), config, pool_class=SentinelConnectionPool)
    ours = connect_sentinel(deployment.url(), config)
    assert isinstance(ours.connection_pool, FollowingSentinelPool)
    try:
        stock.set("k", "0")
        ours.set("k", "0")
        old = deployment.primary_port()
        deployment.failover()
        new = deployment.wait_primary_not(old)
        time.sleep(1.2)
        stock.set("stock", "1")
        ours.set("ours", "1")
        with closing(redis.Redis(port=new, socket_timeout=2)) as direct:
            assert direct.get("ours") == b"1"
            assert direct.get("stock") is None  # the write went to the old primary
    finally:
        stock.close()
        ours.close()


def worker_compacts_through(deployment: SentinelDeployment, name: str,
                            timeout: float) -> None:
    """Store and broker on ``deployment``: a real worker (threads pool) compacts a session
    the guard records, and every doctor check passes (the guard's reads too: the change
    feed follows the primary)."""
    broker, store_url, master = deployment.broker_url(1), deployment.url(0), deployment.service
    env = worker_env(broker_url=broker, redis_url=store_url, key_prefix="tw",
                     broker_sentinel_master=master)
    worker = WorkerProcess(name, env, concurrency=2).start()
    config = StoreConfig(key_prefix="tw")
    store = SessionStore(connect(store_url, config), config)
    guard = ContextGuard(store, CeleryEnqueuer(publisher_app(broker, sentinel_master=master)),
                         overrides={"gpt-4o": 24_000})
    try:
        for turn in demo_turns(30):
            guard.prepare("s1", SYSTEM_PROMPT, TOOLS, 2000, "gpt-4o", pending=turn[:1])
            guard.record_turn("s1", turn)
            time.sleep(0.05)
        assert wait_for(lambda: store.state("s1").watermark > 0, timeout), worker.log()[-3000:]
        assert "compaction.maybe_summarize" in worker.log()
        settings = Settings(redis_url=store_url, broker_url=broker, key_prefix="tw",
                            broker_sentinel_master=master)
        verdicts = {c.name: c.verdict for c in run_checks(settings, 5.0)}
        assert verdicts["redis store"] == verdicts["broker"] == verdicts["queue"] == "OK"
        assert verdicts["workers"] == "OK" and verdicts["guard reads"] == "OK", verdicts
    finally:
        worker.stop()
        guard.close()
        store.redis.close()


@pytest.mark.celery
def test_a_worker_on_a_sentinel_broker_compacts_a_session(
        deployment: SentinelDeployment) -> None:
    worker_compacts_through(deployment, "sentinel", 20)
