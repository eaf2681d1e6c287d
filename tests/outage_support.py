"""What the outage tests share: a guard on a redis-server of the test's own."""

from __future__ import annotations

from shared.core.config import StoreConfig
from shared.guard import ContextGuard
from shared.store.sessions import SessionStore, connect
from workers.harness.stack.redis_server import RedisServer


def guard_on(server: RedisServer, prefix: str) -> ContextGuard:
    """A sync guard on ``server`` that neither connects ahead nor watches changes (every
    failure in an outage test is then the call's own)."""
    return ContextGuard(SessionStore(connect(server.url), StoreConfig(key_prefix=prefix)),
                        warm_up=False, watch_changes=False)
