"""Redis refusing writes for a while is an outage the guard rides out, not a crash.

A store at ``maxmemory`` under ``noeviction`` (the policy sessions need) answers every
write with ``OOM``; one that cannot persist with ``MISCONF``; a replica after a failover
with ``READONLY``. Before, those reached the agent as redis-py's own exceptions, past
``fallback_messages`` and past the ``StoreUnavailable`` the README's loop catches.
"""

from __future__ import annotations

import pytest
import redis

from shared.core.config import StoreConfig
from shared.core.errors import StoreUnavailable
from shared.store.sessions import SessionStore, typed_failure
from tests.guard_shells import SHELLS, make
from workers.harness.stack.redis_server import RedisServer

TURN = [{"role": "user", "content": "x" * 2_000}, {"role": "assistant", "content": "ok"}]
USER = {"role": "user", "content": "and now?"}


@pytest.mark.parametrize("error", [
    redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
    redis.exceptions.ReadOnlyError("You can't write against a read only replica."),
    redis.exceptions.MasterDownError("Link with MASTER is down and replica-serve-stale-data "
                                     "is set to 'no'."),
    redis.exceptions.ResponseError("MISCONF Redis is configured to save RDB snapshots, but "
                                   "it's currently unable to persist to disk."),
    redis.exceptions.ResponseError("BUSY Redis is busy running a script."),
    redis.exceptions.ResponseError("NOREPLICAS Not enough good replicas to write."),
    # a pipeline's command, as redis-py wraps it (sync, then asyncio's form)
    redis.exceptions.ResponseError("Command # 1 (HSET k f v) of pipeline caused error: "
                                   "NOREPLICAS Not enough good replicas to write."),
    redis.exceptions.ResponseError("Command # 2 (('HSET', 'k', 'f', 'v')) of pipeline caused "
                                   "error: MISCONF Redis is configured to save RDB snapshots"),
])
def test_refusals_are_outages(error: Exception) -> None:
    typed = typed_failure("append", error)
    assert isinstance(typed, StoreUnavailable)
    assert str(error)[:20] in str(typed)


def test_other_replies_are_left_to_the_caller() -> None:
    assert typed_failure("append", redis.exceptions.ResponseError("ID_CONFLICT {}")) is None
    assert typed_failure("append", redis.exceptions.ResponseError("ERR unknown")) is None


@pytest.mark.parametrize("shell", SHELLS)
def test_a_store_out_of_memory_is_ridden_out(own_redis: RedisServer, key_prefix: str,
                                             shell: str) -> None:
    client = redis.Redis.from_url(own_redis.url)
    store = SessionStore(client, StoreConfig(key_prefix=key_prefix))
    guard = make(shell, store, overrides={"m": 1_000_000})
    guard.record_turn("s", TURN)
    guard.prepare("s", "sys", model="m", pending=[USER])
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", str(int(client.info("memory")["used_memory"]) + 20_000))
    with pytest.raises(StoreUnavailable, match="out of memory"):
        for _ in range(100):
            guard.record_turn("s", TURN)
    for fresh in (guard, make(shell, store, overrides={"m": 1_000_000})):
        view = fresh.prepare("s2", "sys", model="m", max_tokens=10, pending=[USER],
                             fallback_messages=[])  # a new session's figures: a write
        assert [m.content for m in view.messages[1:]] == ["and now?"]
    with pytest.raises(StoreUnavailable):
        make(shell, store, overrides={"m": 1_000_000}).prepare(
            "s3", "sys", model="m", max_tokens=10, pending=[USER])
    client.config_set("maxmemory", "0")
    length = guard.record_turn("s", TURN)  # what the agent's loop does once Redis answers
    assert guard.prepare("s", "sys", model="m", pending=[USER]).report.length == length
