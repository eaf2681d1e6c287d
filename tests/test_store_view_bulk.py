"""A large view read: the messages by plain LRANGE after the script, never a mixed view.

The view script leaves a range of more than ``BULK_MESSAGES`` messages (or
``BULK_TOKENS`` tokens) to plain reads in one MULTI/EXEC, which re-read what
proves the log unchanged since the script (epoch, gen, the total at the end).
Here: the result equals the in-script read; an append between the two steps
is harmless (the log is append-only), a truncation, a deletion or a replaced
log is detected and the read falls back to the script. Both stores (redis-py,
redis.asyncio), fakeredis and the real server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import fakeredis
import pytest
from hypothesis import HealthCheck, given, settings

from shared.core.config import StoreConfig
from shared.core.records import RawView, SummaryRecord, ViewCursor
from shared.core.viewcache import decode_view
from shared.core.wire import to_openai
from shared.store import commands
from shared.store.aio import AsyncSessionStore
from shared.store.sessions import SessionStore
from tests.guard_shells import SHELLS, async_client, make
from tests.test_guard_view import OPS, check_cached_views
from tests.test_store_cluster import cluster_store
from workers.harness.stack.redis_server import LocalCluster

Meddle = Callable[[SessionStore, str], None]


def turn(i: int, size: int = 40) -> list[dict[str, Any]]:
    """A user message, a tool call and its result, and the answer."""
    return [{"role": "user", "content": f"step {i} " + "x" * size},
            {"role": "assistant", "content": "",
             "tool_calls": [{"id": f"c{i}", "name": "read", "arguments": "{}"}]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": f"out {i} " + "y" * size},
            {"role": "assistant", "content": f"done {i}"}]


def seed(store: SessionStore, sid: str, turns: int, start: int = 0) -> None:
    for i in range(start, start + turns):
        store.append(sid, turn(i))


def in_script(store: SessionStore, sid: str, since: ViewCursor | None = None,
              with_counts: bool = True) -> RawView:
    """The read the script does whole (no bulk): the reference."""
    return commands.drive(commands.view_steps(store.keys(sid), since, with_counts, bulk=False),
                          store._send)


def read(store: SessionStore, shell: str, sid: str, since: ViewCursor | None = None,
         with_counts: bool = True, meddle: Meddle | None = None,
         at: int = 1) -> tuple[RawView, list[str]]:
    """A read with the default limits on one shell; the kinds of the steps it sent.
    ``meddle`` runs once, just before the ``at``-th plain read (1: the first chunk, a
    writer between the script and the plain reads; past the chunks: the proof)."""
    kinds: list[str] = []

    def before(step: commands.Step) -> None:
        kinds.append("script" if isinstance(step, commands.Command) else "batch")
        if meddle is not None and kinds[-1] == "batch" and kinds.count("batch") == at:
            meddle(store, sid)

    steps = commands.view_steps(store.keys(sid), since, with_counts)
    if shell == "sync":
        def send(step: commands.Step) -> Any:
            before(step)
            return store._send(step)
        return commands.drive(steps, send), kinds

    async def run() -> RawView:
        astore = AsyncSessionStore(async_client(store.redis), store.config)

        async def asend(step: commands.Step) -> Any:
            before(step)
            return await astore._send(step)
        try:
            return await commands.drive_async(steps, asend)
        finally:
            await astore.aclose()

    return asyncio.run(run()), kinds


@pytest.fixture(params=SHELLS)
def shell(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_a_large_read_equals_the_in_script_read(store: SessionStore, shell: str) -> None:
    seed(store, "s", 100)  # 400 messages > BULK_MESSAGES
    for with_counts in (True, False):
        got, kinds = read(store, shell, "s", with_counts=with_counts)
        assert kinds == ["script", "batch"]
        assert got == in_script(store, "s", with_counts=with_counts)
        assert len(got.messages) == 400 and got.start == 0
    assert got.totals == [] and in_script(store, "s").message_counts() is not None


def test_a_large_read_after_a_summary_starts_at_the_watermark(store: SessionStore,
                                                             shell: str) -> None:
    seed(store, "s", 200)
    record = SummaryRecord(watermark=400, kind="llm", text="so far", tokens=3)
    assert store.commit_summary("s", record, store.state("s").version).ok
    got, kinds = read(store, shell, "s")
    assert kinds == ["script", "batch"]
    assert got == in_script(store, "s")
    assert got.start == 400 and got.summary_json is not None
    assert got.message_counts() == in_script(store, "s").message_counts()


def test_small_reads_stay_one_round_trip(store: SessionStore, shell: str) -> None:
    seed(store, "s", 10)
    got, kinds = read(store, shell, "s")
    assert kinds == ["script"] and len(got.messages) == 40
    snap = decode_view(got, None)
    seed(store, "s", 1, start=10)
    later, kinds = read(store, shell, "s", since=snap.cursor)
    assert kinds == ["script"] and later.incremental and len(later.messages) == 4
    assert later == in_script(store, "s", since=snap.cursor)


def test_a_large_incremental_read_is_bulk_too(store: SessionStore, shell: str) -> None:
    seed(store, "s", 5)
    snap = decode_view(in_script(store, "s"), None)
    seed(store, "s", 100, start=5)
    got, kinds = read(store, shell, "s", since=snap.cursor)
    assert kinds == ["script", "batch"]
    assert got.incremental and got.start == 20 and len(got.messages) == 400
    assert got == in_script(store, "s", since=snap.cursor)


def test_few_large_messages_are_read_outside_the_script(store: SessionStore,
                                                        shell: str) -> None:
    seed(store, "s", 3, start=0)
    store.append("s", [{"role": "user", "content": "z" * 400_000}])  # > BULK_TOKENS
    got, kinds = read(store, shell, "s")
    assert kinds == ["script", "batch"] and len(got.messages) == 13
    assert got == in_script(store, "s")


def test_an_append_between_the_steps_is_not_read(store: SessionStore, shell: str) -> None:
    """The log is append-only: the plain reads take log[start:length] of the script's
    moment, and the later messages come with the next read."""
    seed(store, "s", 100)
    before = in_script(store, "s")
    got, kinds = read(store, shell, "s", meddle=lambda st, sid: seed(st, sid, 3, start=100))
    assert kinds == ["script", "batch"]
    assert got == before
    assert store.length("s") == 412


@pytest.mark.parametrize("edit", ["truncate", "truncate_and_refill", "delete", "recreate",
                                  "replaced"])
def test_a_replaced_log_between_the_steps_falls_back_to_the_script(
        store: SessionStore, shell: str, edit: str) -> None:
    """An edit landing between the script and the plain reads: never a mixed view, but
    the in-script read of the session as it is after the edit."""
    seed(store, "s", 100)

    def meddle(st: SessionStore, sid: str) -> None:
        if edit.startswith("truncate"):
            st.truncate_after(sid, 200)
            if edit == "truncate_and_refill":  # same length again, other messages
                seed(st, sid, 50, start=500)
        elif edit in ("delete", "recreate"):
            st.delete_session(sid)
            if edit == "recreate":
                seed(st, sid, 100, start=700)
        else:  # a restored backup: same epoch and gen, other figures
            st.redis.lset(st.keys(sid).cum, -1, 1)

    got, kinds = read(store, shell, "s", meddle=meddle)
    assert kinds == ["script", "batch", "script"]
    assert got == in_script(store, "s")
    if edit != "replaced":
        assert got.messages == store.redis.lrange(store.keys("s").log, 0, -1)


@pytest.fixture
def low_bulk() -> Iterator[None]:
    """Every read of more than two messages goes the bulk way."""
    with mock.patch.object(commands, "BULK_MESSAGES", 2):
        yield


@pytest.mark.usefixtures("low_bulk")
def test_cached_views_with_bulk_reads_equal_fresh_reads(shell: str) -> None:
    """The guard's property check (cached view == the store's view, whatever happens to
    the session) with every read of more than two messages a bulk one."""
    ops = [("turn", 1), ("prepare", 0), ("turn", 2), ("turn", 3), ("commit", 7),
           ("prepare", 0), ("turn", 4), ("truncate", 5), ("prepare", 0), ("cheap", 3),
           ("turn", 9), ("delete", 0), ("turn", 5), ("prepare", 0), ("rewind", 2),
           ("turn", 8), ("prepare", 0)]
    check_cached_views(SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="c")),
                       shell, ops)


@pytest.mark.parametrize("shell_name", SHELLS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS)
def test_cached_views_equal_fresh_reads_any_ops_bulk(shell_name: str,
                                                     ops: list[tuple[str, int]]) -> None:
    """The same over any operations (tests.test_guard_view's property)."""
    with mock.patch.object(commands, "BULK_MESSAGES", 2):
        check_cached_views(SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="c")),
                           shell_name, ops)


def test_a_cold_guard_view_of_a_large_session(store: SessionStore, shell: str) -> None:
    """A new guard's first prepare of a session read the bulk way: the stored messages,
    in OpenAI's format, after the system prompt."""
    seed(store, "s", 150)
    guard = make(shell, store, overrides={"big": 10_000_000})
    view = guard.prepare("s", "sys", max_tokens=100, model="big")
    expected = to_openai(store.messages("s"))
    assert view.openai() == [{"role": "system", "content": "sys"}, *expected]
    assert view.report.truncated is False


def test_the_bulk_steps_are_sans_io() -> None:
    """The steps name only the session's keys; the plain reads end at the script's length."""
    keys = SessionStore(mock.Mock(), StoreConfig(key_prefix="p")).keys("s")
    steps = commands.view_steps(keys, None, with_counts=True)
    script = next(steps)
    assert isinstance(script, commands.Command) and script.args[-2:] == [
        commands.BULK_MESSAGES, commands.BULK_TOKENS]
    deferred = commands.DeferredView(RawView(
        state_raw={"epoch": "e", "gen": "2"}, messages=[], start=10, tokens_before_watermark=5,
        tokens_total=99, length=500, summary_json=None, summary_included=True, cheap_raw={},
        pending=False, incremental=False), with_counts=True)
    batch = steps.send(deferred)
    assert isinstance(batch, commands.Batch)
    assert batch.calls == [("LRANGE", keys.log, 10, 499), ("LRANGE", keys.cum, 9, 499),
                           ("HMGET", keys.state, "epoch", "gen"), ("LINDEX", keys.cum, 499)]
    assert batch.parse([[b"{}"] * 490, [b"5"] * 491, [b"e", b"2"], b"99"]) is not None
    for wrong in ([[b"{}"] * 490, [], [b"e", b"3"], b"99"],  # gen moved
                  [[b"{}"] * 490, [], [b"f", b"2"], b"99"],  # another epoch
                  [[b"{}"] * 490, [], [None, None], None],  # deleted
                  [[b"{}"] * 489, [], [b"e", b"2"], b"99"],  # shorter
                  [[b"{}"] * 490, [], [b"e", b"2"], b"98"]):  # another total
        assert batch.parse(wrong) is None
    with pytest.raises(StopIteration) as done:
        steps.send(batch.parse([[b"{}"] * 490, [b"5"] * 491, [b"e", b"2"], b"99"]))
    assert len(done.value.value.messages) == 490



def test_bulk_reads_on_a_cluster(cluster: LocalCluster, key_prefix: str) -> None:
    """The plain reads go to the session's node in one MULTI/EXEC (its keys share a slot),
    on the redis-py and the redis.asyncio cluster clients."""
    import redis.asyncio.cluster

    store = cluster_store(cluster, key_prefix)
    sids = [f"user:{n}" for n in range(4)]  # several slots, so several nodes
    for sid in sids:
        seed(store, sid, 70)
    for sid in sids:
        got, kinds = read(store, "sync", sid)
        assert kinds == ["script", "batch"] and len(got.messages) == 280
        assert got == in_script(store, sid)

    async def run() -> list[RawView]:
        astore = AsyncSessionStore(redis.asyncio.cluster.RedisCluster.from_url(cluster.url),
                                   store.config)
        try:
            return [await astore.read_view(sid, with_counts=True) for sid in sids]
        finally:
            await astore.aclose()

    assert asyncio.run(run()) == [in_script(store, sid) for sid in sids]
    got, kinds = read(store, "sync", sids[0], meddle=lambda st, sid: st.truncate_after(sid, 9))
    assert kinds == ["script", "batch", "script"] and len(got.messages) == 9


# -- a range past BULK_CHUNK: one LRANGE per chunk, each its own round trip ------------
def test_a_long_read_goes_in_chunks_and_equals_the_in_script_read(
        store: SessionStore, shell: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One LRANGE of a whole large view held Redis 18-22 ms (5.3k messages): past
    BULK_CHUNK the plain reads go a chunk a step, the proof after the last."""
    monkeypatch.setattr(commands, "BULK_CHUNK", 60)
    seed(store, "s", 100)  # 400 messages: 7 chunks
    lranges: list[int] = []
    real = store._send

    def spy(step: commands.Step) -> Any:
        if isinstance(step, commands.Batch):
            lranges.extend(c[3] - c[2] + 1 for c in step.calls if c[0] == "LRANGE")
        return real(step)

    monkeypatch.setattr(store, "_send", spy)
    for with_counts in (True, False):
        lranges.clear()
        got, kinds = read(store, shell, "s", with_counts=with_counts)
        assert kinds == ["script"] + ["batch"] * 8
        assert got == in_script(store, "s", with_counts=with_counts)
        assert len(got.messages) == 400
        if shell == "sync":
            assert lranges and max(lranges) <= 61  # totals: one more (the one before start)


@pytest.mark.parametrize("edit", ["append", "truncate", "truncate_and_refill", "delete",
                                  "replaced"])
def test_an_edit_between_chunks_is_never_a_mixed_view(
        store: SessionStore, shell: str, edit: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer after the first chunk: an append is not read (append-only); an edit, a
    deletion or a replaced log sends the read back to the script, whole."""
    monkeypatch.setattr(commands, "BULK_CHUNK", 60)
    seed(store, "s", 100)
    before = in_script(store, "s")
    steps = commands.view_steps(store.keys("s"), None, with_counts=True)
    reply = store._send(next(steps))
    sent = 0
    try:
        while True:
            step = steps.send(reply)
            sent += 1
            if sent == 2:  # the first chunk is read: a writer now
                if edit == "append":
                    seed(store, "s", 3, start=100)
                elif edit.startswith("truncate"):
                    store.truncate_after("s", 200)
                    if edit == "truncate_and_refill":
                        seed(store, "s", 50, start=500)
                elif edit == "delete":
                    store.delete_session("s")
                else:
                    store.redis.lset(store.keys("s").cum, -1, 1)
            reply = store._send(step)
    except StopIteration as done:
        got = done.value
    if edit == "append":
        assert got == before and store.length("s") == 412
    else:
        assert got == in_script(store, "s")
        if edit != "replaced":
            assert got.messages == store.redis.lrange(store.keys("s").log, 0, -1)


@pytest.mark.parametrize("writer", ["append", "commit", "truncate", "truncate_and_refill",
                                    "delete", "recreate"])
def test_a_writer_between_any_two_chunks_on_either_shell(
        store: SessionStore, shell: str, writer: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The chunked read as the stores send it (redis-py and redis.asyncio), with a writer
    landing before each chunk in turn (the first, a middle one, the proof): the view is the
    script's moment's (an append or a compaction commit changes no log entry it read) or
    the in-script read after the writer, never a mix."""
    monkeypatch.setattr(commands, "BULK_CHUNK", 90)
    seed(store, "s", 100)  # 400 messages: 5 chunks, then the proof
    for at in (1, 3, 6):
        before = in_script(store, "s")

        def meddle(st: SessionStore, sid: str, at: int = at, before: RawView = before) -> None:
            if writer == "append":
                seed(st, sid, 2, start=900)
            elif writer == "commit":
                record = SummaryRecord(watermark=st.length(sid) - 8, kind="llm", text="t",
                                       tokens=2)
                assert st.commit_summary(sid, record, st.state(sid).version).ok
            elif writer.startswith("truncate"):
                st.truncate_after(sid, 380 - 10 * at)
                if writer == "truncate_and_refill":  # the same length and total again
                    st.redis.rpush(st.keys(sid).log, *before.messages[380 - 10 * at:])
                    st.redis.rpush(st.keys(sid).cum, *before.totals[380 - 10 * at:])
            else:
                st.delete_session(sid)
                if writer == "recreate":
                    seed(st, sid, 100, start=300)

        got, kinds = read(store, shell, "s", meddle=meddle, at=at)
        assert kinds[:2] == ["script", "batch"] and kinds.count("batch") == 6
        if writer in ("append", "commit"):
            assert kinds[-1] == "batch" and got == before
        else:
            assert kinds[-1] == "script" and got == in_script(store, "s")
            assert got.messages == store.redis.lrange(store.keys("s").log, 0, -1)
        store.delete_session("s")
        seed(store, "s", 100)
