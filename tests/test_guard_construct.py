"""A guard given the other shell's store, or a ``send`` of the other kind, is refused at
once, naming what to use instead (not with a coroutine error at the first call)."""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

import pytest

from shared.core.errors import InvalidInput
from shared.core.prepared import PreparedView
from shared.guard import AsyncContextGuard, ContextGuard
from shared.store.aio import AsyncSessionStore
from shared.store.sessions import SessionStore
from tests.guard_shells import async_client

TURN = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]


def astore_for(store: SessionStore) -> AsyncSessionStore:
    return AsyncSessionStore(async_client(store.redis), store.config, tenant=store.tenant,
                             counter=store.counter)


@pytest.mark.parametrize("tenant_handle", [False, True])
def test_the_async_guard_refuses_a_sync_store(store: SessionStore, tenant_handle: bool) -> None:
    given: Any = store.for_tenant("acme") if tenant_handle else store
    with pytest.raises(InvalidInput, match="ContextGuard") as caught:
        AsyncContextGuard(given, watch_changes=False)
    assert caught.value.field == "store"


def test_the_sync_guard_refuses_an_async_store(store: SessionStore) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing left unawaited either
        with pytest.raises(InvalidInput, match="AsyncContextGuard") as caught:
            ContextGuard(astore_for(store), watch_changes=False)  # type: ignore[arg-type]
    assert caught.value.field == "store"


def test_each_guard_takes_its_own_store(store: SessionStore) -> None:
    ContextGuard(store, watch_changes=False)
    ContextGuard(store.for_tenant("acme"), watch_changes=False)
    AsyncContextGuard(astore_for(store), watch_changes=False)


def test_the_sync_call_refuses_a_coroutine_function_before_anything_is_sent(
        store: SessionStore) -> None:
    guard = ContextGuard(store, watch_changes=False)
    store.append("s", TURN)

    async def send(view: PreparedView) -> str:
        raise AssertionError("never run")

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InvalidInput, match="AsyncContextGuard") as caught:
            guard.call("s", send)  # type: ignore[arg-type]
        assert caught.value.field == "send"
        with pytest.raises(InvalidInput, match="awaitable"):  # a plain function returning one
            guard.call("s", lambda view: send(view))


def test_the_async_call_refuses_a_send_whose_result_cannot_be_awaited(
        store: SessionStore) -> None:
    store.append("s", TURN)
    sent: list[PreparedView] = []

    def send(view: PreparedView) -> str:
        sent.append(view)
        return "reply"

    async def run() -> Any:
        guard = AsyncContextGuard(astore_for(store), watch_changes=False)
        try:
            return await guard.call("s", send)  # type: ignore[arg-type]
        finally:
            await guard.aclose()

    with pytest.raises(InvalidInput, match="ContextGuard") as caught:
        asyncio.run(run())
    assert caught.value.field == "send"
