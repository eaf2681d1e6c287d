"""A large read collects the young generations at once, not during a later warm call."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest

import shared.guard._shell as shell_module
from shared.core.config import StoreConfig
from shared.store.sessions import SessionStore
from tests.guard_shells import SHELLS, make

SYSTEM = "be brief"


@pytest.fixture(params=SHELLS)
def shell(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def collections() -> Iterator[list[int]]:
    """The generations the collector collects from now on."""
    seen: list[int] = []

    def callback(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            seen.append(int(info["generation"]))

    gc.callbacks.append(callback)
    yield seen
    gc.callbacks.remove(callback)


def _session(store: SessionStore, n: int) -> None:
    store.append("s", [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"}
                       for i in range(n)])


def test_a_large_read_collects_the_young_generations(
        key_prefix: str, shell: str, collections: list[int],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shell_module, "COLLECT_AFTER", 40)
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix=key_prefix))
    _session(store, 40)
    guard = make(shell, store, overrides={"m": 100_000})
    collections.clear()
    guard.prepare("s", SYSTEM, model="m")  # a cold read of 40 messages
    assert 1 in collections
    store.append("s", [{"role": "user", "content": "one more"}])
    gc.collect()  # counts at zero: the prepare alone cannot reach a middle collection
    collections.clear()
    guard.prepare("s", SYSTEM, model="m")  # an incremental read of one: no collection
    assert 1 not in collections


def test_nothing_is_collected_while_the_application_disabled_the_collector(
        key_prefix: str, shell: str, collections: list[int],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shell_module, "COLLECT_AFTER", 40)
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix=key_prefix))
    _session(store, 40)
    guard = make(shell, store, overrides={"m": 100_000})
    gc.disable()
    try:
        collections.clear()
        guard.prepare("s", SYSTEM, model="m")
        assert collections == []
    finally:
        gc.enable()
