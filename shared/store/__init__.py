"""The Redis session store: key layout, Lua scripts, the lease protocol.

All keys of one session share a hash tag, so the multi-key scripts run on a
Redis Cluster. Every change of compaction state goes through one
compare-and-swap script keyed on the session's version.
"""

from __future__ import annotations

from shared.store.sessions import SessionStore, connect, connect_cluster

__all__ = ["SessionStore", "connect", "connect_cluster"]
