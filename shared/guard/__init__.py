"""The agent's hot path: a guard that never calls an LLM, in a sync and an async shell.

What a guard does is written once, as steps (:mod:`shared.guard._flow`), over one
sans-I/O core (:mod:`shared.core.guard_state`) and an incrementally maintained view of
each session (:mod:`shared.core.viewcache`); two shells perform the steps' store calls:

- :class:`ContextGuard` (:mod:`shared.guard.sync`): redis-py, blocking;
- :class:`AsyncContextGuard` (:mod:`shared.guard.aio`): redis.asyncio, awaited.

Cost on the hot path: one Redis round trip per ``prepare`` (more only when
it writes: new figures, cheap decisions, a truncation), and Python work
proportional to what changed since the last call, not to the history.
"""

from __future__ import annotations

from shared.core.prepared import PreparedView, ViewReport
from shared.guard.aio import AsyncContextGuard
from shared.guard.sync import ContextGuard

__all__ = ["AsyncContextGuard", "ContextGuard", "PreparedView", "ViewReport"]
