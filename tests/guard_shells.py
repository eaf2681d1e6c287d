"""Both guard shells behind one synchronous test API, so every guard test runs on both.

:class:`AsyncShell` drives a real :class:`shared.guard.AsyncContextGuard` over
redis.asyncio (fakeredis's async client on the same fake server, or the
same real Redis), each call on a private event loop. ``guard.store`` stays
the sync store of the test, for setting up and inspecting the session.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import fakeredis
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from shared.guard import AsyncContextGuard, ContextGuard
from shared.store.aio import AsyncSessionStore
from shared.store.sessions import SessionStore
from shared.store.tenancy import backing_store

SHELLS = ("sync", "async")


def async_client(sync_client: Any) -> Any:
    """An asyncio client talking to the same server as ``sync_client`` (as its user)."""
    kwargs = sync_client.connection_pool.connection_kwargs
    if isinstance(sync_client, fakeredis.FakeRedis):
        return fakeredis.FakeAsyncRedis(server=kwargs["server"], host=kwargs["host"],
                                        port=kwargs["port"], db=kwargs["db"])
    return redis.asyncio.Redis(host=kwargs.get("host", "127.0.0.1"), port=kwargs.get("port", 6379),
                               db=kwargs.get("db", 0), username=kwargs.get("username"),
                               password=kwargs.get("password"),
                               socket_timeout=kwargs.get("socket_timeout"),
                               socket_connect_timeout=kwargs.get("socket_connect_timeout"),
                               retry=Retry(NoBackoff(), 0))  # as connect_async() does


class AsyncShell:
    """The async guard with the sync guard's call signatures (for tests). Over a tenant
    handle (:class:`~shared.store.tenancy.TenantStore`), the async guard's store is the
    tenant's :class:`AsyncSessionStore` on the same server."""

    def __init__(self, store: SessionStore, enqueuer: Any = None, **kwargs: Any) -> None:
        self.store = store
        self.loop = asyncio.new_event_loop()
        OPEN.append(self)  # closed when the test ends (close_all): see there
        self.astore = AsyncSessionStore(async_client(backing_store(store).redis), store.config,
                                        tenant=store.tenant, counter=store.counter)
        self.inner = AsyncContextGuard(self.astore, enqueuer, **kwargs)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name == "call":
            def call(session_id: str, send: Any, **kw: Any) -> Any:
                async def asend(view: Any) -> Any:
                    return send(view)
                return self.loop.run_until_complete(self.inner.call(session_id, asend, **kw))
            return call
        if inspect.iscoroutinefunction(attr):
            def run(*args: Any, **kw: Any) -> Any:
                return self.loop.run_until_complete(attr(*args, **kw))
            return run
        return attr

    def close(self) -> None:
        """Close the async client and the event loop (three file descriptors)."""
        if self.loop.is_closed():
            return
        try:
            guard = self.__dict__.get("inner")  # None: its constructor raised
            if guard is not None:
                self.loop.run_until_complete(guard.aclose())
            self.loop.run_until_complete(self.astore.redis.aclose())
        finally:
            self.loop.close()


class AsyncStoreShell:
    """The asyncio store's session edits with the sync store's signatures (for tests);
    everything else (appends, reads for the test's checks) is the sync store's."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self.loop = asyncio.new_event_loop()
        OPEN.append(self)
        self.astore = AsyncSessionStore(async_client(backing_store(store).redis), store.config,
                                        tenant=store.tenant, counter=store.counter)

    def __getattr__(self, name: str) -> Any:
        if name not in ASYNC_STORE_EDITS:
            return getattr(self.store, name)
        attr = getattr(self.astore, name)  # never the sync store's: the test would not fail
        assert inspect.iscoroutinefunction(attr), f"AsyncSessionStore.{name} is not async"

        def run(*args: Any, **kw: Any) -> Any:
            return self.loop.run_until_complete(attr(*args, **kw))
        return run

    def close(self) -> None:
        if not self.loop.is_closed():
            try:
                self.loop.run_until_complete(self.astore.redis.aclose())
            finally:
                self.loop.close()


ASYNC_STORE_EDITS = ("truncate_after", "rewind", "delete_session")
"""What :class:`AsyncStoreShell` runs on the asyncio store."""


def store_shell(shell: str, store: SessionStore) -> Any:
    """``store``, or the asyncio store over the same server for its session edits."""
    return store if shell == "sync" else AsyncStoreShell(store)


OPEN: list[AsyncShell | AsyncStoreShell] = []
"""Shells not closed yet. A test's frames can outlive it (a traceback kept by a
library), and with them its shells: hundreds of event loops in one run (a
property test makes one per example) ran the process out of file descriptors."""


def close_all() -> None:
    """Close every shell made since the last call (the conftest calls it after each test)."""
    while OPEN:
        OPEN.pop().close()


def make(shell: str, store: SessionStore, enqueuer: Any = None, **kwargs: Any) -> Any:
    """A guard of the given shell over ``store``."""
    if shell == "sync":
        return ContextGuard(store, enqueuer, **kwargs)
    return AsyncShell(store, enqueuer, **kwargs)


class Recorder:
    def __init__(self) -> None:
        self.jobs: list[tuple[str, str]] = []

    def __call__(self, tenant: str, session_id: str) -> None:
        self.jobs.append((tenant, session_id))
