"""A guard given the other shell's store, or a ``send`` of the other kind, is refused at
once, naming what to use instead (not with a coroutine error at the first call)."""

from __future__ import annotations

import asyncio
import inspect
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


# -- the two shells' public API: the same names, signatures and documented behaviour ------
IO_METHODS = ("call", "drive", "load", "prepare", "recall", "record_turn", "recover", "snapshot",
              "stats", "warm_up")
"""What the async guard awaits: every call that may reach Redis (or the provider)."""

DOCS_DIFFER = {
    "call": "send is a plain function, or one returning an awaitable",
    "drive": "each step blocking, or awaited",
    "perform": "the async shell runs a local step on a worker thread",
    "warm_up": "the async constructor connects only the change feed",
    "own_class": "OwnWrites or AsyncOwnWrites",
    "store_class": "SessionStore or AsyncSessionStore",
}
"""Public names whose docstrings differ on purpose: what the shell does differently."""


def public(cls: type) -> list[str]:
    return sorted(name for name in dir(cls) if not name.startswith("_"))


def test_the_async_guard_has_every_public_name_of_the_sync_one() -> None:
    missing = set(public(ContextGuard)) - set(public(AsyncContextGuard))
    assert not missing, f"AsyncContextGuard lacks {sorted(missing)}"
    assert set(public(AsyncContextGuard)) - set(public(ContextGuard)) == {"aclose"}


@pytest.mark.parametrize("name", [n for n in public(ContextGuard)
                                  if inspect.isfunction(getattr(ContextGuard, n))])
def test_each_method_has_the_sync_ones_signature(name: str) -> None:
    """Parameter for parameter (name, kind, default, annotation), the return type too;
    only ``call``'s ``send`` returns an awaitable on the async guard."""
    sync, aio = (inspect.signature(getattr(cls, name)) for cls in (ContextGuard,
                                                                    AsyncContextGuard))
    if name == "call":
        assert sync.parameters["send"].annotation == "Callable[[PreparedView], R]"
        assert aio.parameters["send"].annotation == "Callable[[PreparedView], Awaitable[R]]"
        sync = sync.replace(parameters=[p for p in sync.parameters.values() if p.name != "send"])
        aio = aio.replace(parameters=[p for p in aio.parameters.values() if p.name != "send"])
    assert aio == sync, f"{name}: async {aio} vs sync {sync}"
    assert inspect.iscoroutinefunction(getattr(AsyncContextGuard, name)) == (name in IO_METHODS)
    assert not inspect.iscoroutinefunction(getattr(ContextGuard, name))


@pytest.mark.parametrize("name", public(ContextGuard))
def test_each_docstring_says_what_the_sync_one_says(name: str) -> None:
    """The async guard's docstring repeats the sync one's (it may add to it) or points at
    it; where they differ on purpose, the reason is listed in :data:`DOCS_DIFFER`."""
    sync = inspect.getdoc(getattr(ContextGuard, name)) or ""
    aio = inspect.getdoc(getattr(AsyncContextGuard, name)) or ""
    if name in DOCS_DIFFER:
        assert aio and aio != sync, f"{name} is listed as differing: {DOCS_DIFFER[name]}"
        return
    assert aio.startswith(sync) or f"ContextGuard.{name}`" in aio, \
        f"{name}:\n  sync:  {sync[:200]!r}\n  async: {aio[:200]!r}"
