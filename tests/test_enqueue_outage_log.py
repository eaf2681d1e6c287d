"""A broker outage is logged when it begins and when it ends, not once a turn.

The store is a real Redis, the broker another real redis-server that is not
there yet (a port nobody listens on) and is then started: every turn of the
outage fails to publish and is counted, but one warning says so; the first
publish that gets through says the outage is over.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator

import pytest
import redis

from shared.core.config import StoreConfig
from shared.enqueue import CeleryEnqueuer, publisher_app
from shared.store.sessions import SessionStore
from shared.telemetry.metrics import PrometheusMetrics, set_metrics
from shared.telemetry.publish_log import publish_failures
from tests.guard_shells import SHELLS, make
from workers.harness.demo_session import SYSTEM_PROMPT, TOOLS, demo_turns
from workers.harness.stack.redis_server import RedisServer, free_port, redis_binary


@pytest.fixture
def metrics() -> Iterator[PrometheusMetrics]:
    installed = PrometheusMetrics()
    set_metrics(installed)
    publish_failures.published()  # no outage left over from another test
    yield installed
    set_metrics(None)
    publish_failures.published()


@pytest.mark.parametrize("shell", SHELLS)
def test_an_outage_is_two_lines_and_every_failure_a_count(
        redis_url: str, key_prefix: str, metrics: PrometheusMetrics, shell: str,
        caplog: pytest.LogCaptureFixture) -> None:
    binary = redis_binary()
    assert binary is not None
    broker = RedisServer(free_port(), binary, tempfile.mkdtemp(prefix="cmp-broker-"))
    client = redis.Redis.from_url(redis_url)
    store = SessionStore(client, StoreConfig(key_prefix=key_prefix))
    guard = make(shell, store, CeleryEnqueuer(publisher_app(broker.url, timeout=0.5)),
                 overrides={"gpt-4o": 16_000})
    turns = demo_turns(12)
    caplog.set_level(logging.INFO)
    try:
        for turn in turns[:10]:  # the broker is not there: each turn asks, each fails
            guard.prepare("o1", SYSTEM_PROMPT, TOOLS, 2000, "gpt-4o", pending=turn[:1])
            guard.record_turn("o1", turn)
        failed = metrics.registry.get_sample_value("compaction_enqueue_total",
                                                  {"outcome": "failed"}) or 0
        assert failed >= 10  # every turn asked again (its flag was cleared) and was counted
        lines = [r for r in caplog.records if "enqueue" in r.getMessage()]
        assert [r.levelname for r in lines] == ["WARNING"], [r.getMessage() for r in lines]
        assert "o1" in lines[0].getMessage()
        caplog.clear()
        broker.start()
        for turn in turns[10:]:
            guard.prepare("o1", SYSTEM_PROMPT, TOOLS, 2000, "gpt-4o", pending=turn[:1])
            guard.record_turn("o1", turn)
        assert metrics.registry.get_sample_value(
            "compaction_enqueue_total", {"outcome": "published"}) == 1  # then coalesced
        over = [r.getMessage() for r in caplog.records if "enqueue" in r.getMessage()]
        assert over == [f"enqueue works again after {int(failed)} failed publishes"]
    finally:
        broker.remove()
        for key in client.scan_iter(match=f"{key_prefix}:*", count=1000):
            client.delete(key)
        client.close()
