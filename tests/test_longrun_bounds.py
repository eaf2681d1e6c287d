"""Per-session and per-model state of a long-running process stays within its bounds.

An agent process or ``compaction serve`` runs for weeks over sessions it may never
see again and model names its callers choose: what it remembers of each is bounded
per process (every tenant's guard of a server together), counted in entries here.
"""

from __future__ import annotations

from typing import Any

import fakeredis
import pytest

from shared.core.config import StoreConfig
from shared.core.limits import LimitBook
from shared.core.viewcache import ViewCache
from shared.store.sessions import SessionStore
from tests.guard_shells import SHELLS, make
from tests.test_guard import SYSTEM, coding_turn

TENANTS = ("alpha", "beta", "gamma")
SESSIONS = 12


def _remembered(guard: Any, sessions: list[str]) -> int:
    """How many of ``sessions`` the guard still holds a prepared request of (for the usage
    report that would describe it)."""
    return sum(1 for sid in sessions if guard._sent.get(sid) is not None)


@pytest.mark.parametrize("shell_name", SHELLS)
def test_prepared_requests_of_every_tenant_share_the_caches_bound(shell_name: str) -> None:
    """A server's tenants each have a guard on one view cache: the requests they remember
    until a usage report (a client that never reports one leaves each behind) are bounded
    once for the process, not once per tenant (3 tenants x 12 sessions held 36 where the
    bound is 8; 10,000 tenants held up to 10M)."""
    cache = ViewCache(max_sessions=4, pending_turns=8)
    redis = fakeredis.FakeRedis()
    guards = {name: make(shell_name, SessionStore(redis, StoreConfig(key_prefix="p")),
                         view_cache=cache.scoped(name)) for name in TENANTS}
    sessions = [f"s{i}" for i in range(SESSIONS)]
    for name, guard in guards.items():
        for sid in sessions:
            guard.prepare(sid, SYSTEM, model="gpt-4o", pending=[
                {"role": "user", "content": f"{name} {sid}: what changed?"}])
    held = sum(_remembered(guard, sessions) for guard in guards.values())
    assert held == 8  # the newest 8 of 36: every tenant's together
    newest = guards[TENANTS[-1]]
    assert _remembered(newest, sessions[-8:]) == 8  # least recently prepared out first
    # a usage report still finds its request, and takes it
    newest.record_turn(sessions[-1], [{"role": "user", "content": "q"},
                                      {"role": "assistant", "content": "a"}],
                       usage={"prompt_tokens": 50})
    assert _remembered(newest, sessions) == 7


@pytest.mark.parametrize("shell_name", SHELLS)
def test_windows_learned_per_model_name_are_bounded(shell_name: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Model names come from requests: a window learned from an overflow for each name the
    callers use (a guessed window: the name is unknown) was kept for the process's life;
    the book keeps the newest ``MAX_MODELS`` (each session keeps its own learned window)."""
    monkeypatch.setattr(LimitBook, "MAX_MODELS", 4, raising=False)
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="p"))
    guard = make(shell_name, store)
    for i in range(4):
        store.append("s", coding_turn(i))
    models = [f"in-house-model-{i}" for i in range(10)]
    for model in models:
        view = guard.recover("s", RuntimeError("This model's maximum context length is 6000 "
                                               "tokens. Please reduce the length."),
                             SYSTEM, max_tokens=500, model=model)
        assert view is not None and view.report.budget.window == 6000
    shell = getattr(guard, "inner", guard)  # the async guard behind its test driver
    assert len(shell.limits) == 4
    assert [shell.limits.get(m) for m in models[-4:]] == [6000] * 4  # the newest kept
    assert shell.limits.get(models[0]) is None
    assert store.state("s").learned_window == 6000  # the session's own stays
