"""append.lua's cost on the server and the own-writes connection's packing: a turn's
record runs both once, so each is held to what it must do."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
import redis.asyncio

from shared.core.config import StoreConfig
from shared.core.messages import Message
from shared.core.records import InlineJob
from shared.core.tokens import HeuristicCounter
from shared.store.aio import AsyncSessionStore
from shared.store.commands import EncodedBatch
from shared.store.sessions import SessionStore
from tests.guard_shells import async_client


def _turn(i: int) -> list[dict[str, Any]]:
    call = f"call_{i}"
    return [{"role": "user", "content": f"step {i}"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": call, "name": "read", "arguments": "{}"}]},
            {"role": "tool", "tool_call_id": call, "content": "ok"},
            {"role": "assistant", "content": f"done {i}"}]


def test_a_turns_append_makes_few_redis_calls(own_redis: Any) -> None:
    """A guard's append (request id, calibration fields, the pending flag and its job, a
    tool call) reads the state once and writes it in one HSET: 21 calls inside the
    script (31 before: each redis.call is a few microseconds of Redis's one thread,
    every other client waiting)."""
    client = redis.Redis.from_url(own_redis.url)
    store = SessionStore(client, StoreConfig(key_prefix="calls"), idempotency_keep=2)
    for i in range(3):  # the request ids' ring is full: the append drops the oldest
        store.append("s", _turn(i), request_id=f"r{i}")
    client.config_resetstat()
    result = store.append_encoded(
        "s", store.encode("s", _turn(3)), request_id="r3", mark_pending=True, with_state=True,
        state_fields={"calibration_ratio": 1.5}, fields_version=0,
        job=InlineJob(key="calls-queue", message=b"job", db=0, store_db=0))
    stats = client.info("commandstats")
    inner = {name[len("cmdstat_"):]: row["calls"] for name, row in stats.items()
             if name not in ("cmdstat_evalsha", "cmdstat_config|resetstat")}
    assert result.length == 16 and result.published and result.pending
    assert sum(inner.values()) <= 21, inner
    assert "hsetnx" not in inner and inner.get("llen") == 2  # the damage check's two
    assert client.hlen(store.keys("s").requests) == 2  # the ring still bounded


@pytest.mark.parametrize("mark", [True, False])
def test_the_append_writes_and_answers_the_state_as_each_call_did(store: SessionStore,
                                                                  any_redis: Any,
                                                                  mark: bool) -> None:
    """A state made by a prepare's figures alone (no version, watermark or epoch yet):
    the append adds those as absent fields, then the fields of its version; its reply
    tells the state after it and whether the pending flag is set (set by another
    caller too)."""
    store.update_state("s", model="m", window=1000)
    k = store.keys("s")
    first = store.append_encoded("s", store.encode("s", _turn(0)), request_id="a",
                                 with_state=True, mark_pending=mark,
                                 state_fields={"calibration_ratio": 1.5}, fields_version=0)
    state = {key.decode(): value.decode() for key, value in any_redis.hgetall(k.state).items()}
    assert state["version"] == state["watermark"] == "0" and state["model"] == "m"
    assert state["calibration_ratio"] == "1.5" and state["tail"].startswith("4:")
    assert state["epoch"] == state["tail"][2:] and state["tail_prev"] == ""
    assert first.state is not None and first.state.calibration_ratio == 1.5
    assert (first.watermark, first.version, first.tokens_before) == (0, 0, 0)
    assert first.pending is mark and first.marked is mark
    any_redis.set(k.pending, "1")  # another caller's job
    second = store.append_encoded("s", store.encode("s", _turn(1)), with_state=True)
    assert second.pending and not second.marked and second.tail_before == state["tail"]
    assert any_redis.hget(k.state, "epoch").decode() == state["epoch"]  # kept
    any_redis.delete(k.pending)
    third = store.append_encoded("s", [], state_fields={"calibration_ratio": 2.5},
                                 fields_version=0, with_state=True)
    assert third.pending is False and third.length == 8
    assert any_redis.hget(k.state, "calibration_ratio") == b"2.5"
    assert second.state_raw is not None  # an empty batch leaves the tail
    assert any_redis.hget(k.state, "tail") == second.state_raw["tail"].encode()


class _Counting(HeuristicCounter):
    """The default counter, counting its calls of :meth:`message`."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def message(self, message: Message) -> int:
        self.calls += 1
        return super().message(message)


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_batch_renamed_after_a_conflict_is_not_counted_again(any_redis: Any,
                                                               key_prefix: str,
                                                               shell: str) -> None:
    """The second attempt of an append whose call id the session holds (``ID_CONFLICT``:
    renamed against the session's mapping) keeps the first attempt's counts, message for
    message (a renamed message is counted as given); it only encodes the renamed ones
    again. Both stores."""
    counter = _Counting()
    store = SessionStore(any_redis, StoreConfig(key_prefix=key_prefix), counter=counter)
    store.append("s", _turn(0))
    counter.calls = 0
    batch = store.encode("s", _turn(0))  # call_0 again: the script refuses, then renamed
    counted = counter.calls
    assert counted == 4
    if shell == "sync":
        result = store.append_encoded("s", batch, with_state=True)
    else:
        async def append() -> Any:
            astore = AsyncSessionStore(async_client(any_redis), store.config, counter=counter)
            try:
                return await astore.append_encoded("s", batch, with_state=True)
            finally:
                await astore.redis.aclose()
        result = asyncio.run(append())
    assert counter.calls == counted  # before: the call and its result counted twice more
    stored = result.batch
    assert isinstance(stored, EncodedBatch) and stored is not batch
    assert [tokens for _, tokens in stored] == [tokens for _, tokens in batch] \
        == [HeuristicCounter().message(m) for m in batch.messages]
    assert stored.unique[1].tool_calls[0].id != "call_0"  # renamed
    k = store.keys("s")
    totals = [int(t) for t in any_redis.lrange(k.cum, 0, -1)]
    assert totals[-1] - totals[3] == sum(tokens for _, tokens in batch)
