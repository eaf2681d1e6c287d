"""The guard's own append extends its cached view; anything else makes it read."""

from __future__ import annotations

import dataclasses
from typing import Any

import fakeredis
import pytest

from shared.core.appended import appended_read
from shared.core.config import StoreConfig
from shared.core.records import AppendResult
from shared.store.sessions import SessionStore
from tests.guard_shells import SHELLS, make
from tests.test_guard import SYSTEM, coding_turn

GO = [{"role": "user", "content": "go"}]


def _store() -> SessionStore:
    return SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="ap"))


def _warm(shell_name: str) -> tuple[SessionStore, Any, list[int]]:
    """A store, a guard that has recorded a turn and prepared once (so it caches the
    view), and the list of how many messages each later store read brought back."""
    store = _store()
    guard = make(shell_name, store, overrides={"m": 1_000_000})
    inner = guard.inner.store if shell_name == "async" else guard.store
    sizes: list[int] = []
    original = inner.read_view

    def count(raw: Any) -> Any:
        sizes.append(len(raw.messages))
        return raw

    if shell_name == "async":
        async def read_view(*args: Any, **kwargs: Any) -> Any:
            return count(await original(*args, **kwargs))
    else:
        def read_view(*args: Any, **kwargs: Any) -> Any:
            return count(original(*args, **kwargs))
    inner.read_view = read_view
    guard.record_turn("s", coding_turn(0, 100))
    guard.prepare("s", SYSTEM, model="m", pending=GO)
    return store, guard, sizes


def _equals_a_cold_guard(shell_name: str, store: SessionStore, view: Any) -> bool:
    cold = make(shell_name, store, overrides={"m": 1_000_000})
    return bool(view.openai() == cold.prepare("s", SYSTEM, model="m", pending=GO).openai())


@pytest.mark.parametrize("shell_name", SHELLS)
def test_the_read_after_an_own_append_brings_nothing_back(shell_name: str) -> None:
    store, guard, sizes = _warm(shell_name)
    for step in range(1, 4):
        guard.record_turn("s", coding_turn(step, 100))
        assert guard.views.get("s").end == store.length("s")  # extended, not read
        sizes.clear()
        view = guard.prepare("s", SYSTEM, model="m", pending=GO)
        assert sizes == [0]  # the turn was not sent back
        assert _equals_a_cold_guard(shell_name, store, view)


@pytest.mark.parametrize("shell_name", SHELLS)
def test_a_write_by_someone_else_before_the_append_is_read(shell_name: str) -> None:
    store, guard, sizes = _warm(shell_name)
    store.append("s", coding_turn(1, 100))  # another process appends first
    guard.record_turn("s", coding_turn(2, 100))
    sizes.clear()
    view = guard.prepare("s", SYSTEM, model="m", pending=GO)
    assert sizes == [10]  # both turns read: the cache was not extended past a gap
    assert _equals_a_cold_guard(shell_name, store, view)


def test_appended_read_refuses_what_it_cannot_vouch_for() -> None:
    store = _store()
    guard = make("sync", store, overrides={"m": 1_000_000})
    guard.record_turn("s", coding_turn(0, 100))
    guard.prepare("s", SYSTEM, model="m", pending=GO)
    cached = guard.views.get("s")
    batch = store.encode("s", coding_turn(1, 100))
    state = dict(cached.state_raw)
    ok = AppendResult(length=cached.end + len(batch), watermark=cached.start,
                      version=cached.version, tokens_before=cached.total, state_raw=state,
                      batch=batch)
    raw = appended_read(cached, batch, ok)
    assert raw is not None and raw.start == cached.end and len(raw.messages) == len(batch)
    assert raw.message_counts() == [tokens for _, tokens in batch]
    refused = [
        dataclasses.replace(ok, duplicate=True),
        dataclasses.replace(ok, state_raw=None),
        dataclasses.replace(ok, length=ok.length + 1),  # someone appended too
        dataclasses.replace(ok, tokens_before=ok.tokens_before + 1),
        dataclasses.replace(ok, state_raw={**state, "version": str(cached.version + 1)}),
        dataclasses.replace(ok, state_raw={**state, "gen": str(cached.gen + 1)}),
        dataclasses.replace(ok, state_raw={**state, "epoch": "other"}),
        dataclasses.replace(ok, state_raw={**state, "watermark": str(cached.start + 5)}),
        dataclasses.replace(ok, state_raw={**state, "cheap_gen": "9"}),
    ]
    assert [appended_read(cached, batch, r) for r in refused] == [None] * len(refused)
    assert appended_read(cached, [], ok) is None
