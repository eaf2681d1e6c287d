"""The store's Redis client, as the settings name it: one place for the worker, the CLI
and the server, so that a Redis Cluster (``COMPACTION_REDIS_CLUSTER``) or a Sentinel
deployment (a ``redis+sentinel://`` URL) reaches all three."""

from __future__ import annotations

from typing import Any

from shared.store.sessions import connect, connect_cluster, redis_errors
from workers.settings import Settings


def store_client(settings: Settings) -> Any:
    """A client for ``COMPACTION_REDIS_URL`` (bounded timeouts, no silent retries): a
    cluster client following slot moves, a client of the primary a Sentinel deployment
    names (``redis+sentinel://``, :mod:`shared.store.sentinel`), or a standalone one.

    ValueError for a URL redis-py cannot parse. A standalone client connects at its
    first command; a cluster client asks for the slot map now, so an unreachable
    cluster is :class:`~shared.core.errors.StoreUnavailable` here.
    """
    config = settings.store_config()
    if settings.redis_cluster:
        with redis_errors("connecting to the cluster"):
            return connect_cluster(settings.redis_url, config)
    return connect(settings.redis_url, config)


__all__ = ["store_client"]
