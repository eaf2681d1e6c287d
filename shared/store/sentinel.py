"""The session store on a Redis Sentinel deployment: clients that follow the primary.

The URL (``redis+sentinel://``, ``rediss+sentinel://``): :mod:`shared.store.sentinel_url`.

Why not redis-py's stock :class:`~redis.sentinel.SentinelConnectionPool` as it is: it
asks the Sentinels only when a connection opens. A connection it pooled keeps writing
to the primary it opened on; after a planned failover that old primary goes on taking
writes for several seconds (until the Sentinels demote it) and every one of them is
lost when it resynchronises from the new primary. :class:`FollowingSentinelPool` (and
its asyncio twin) adds these and nothing else:

- it asks the Sentinels again at least every ``follow_seconds`` while it is used (one
  ``SENTINEL MASTERS`` round trip a second, on the call that finds the answer stale),
  and when the answer changed it drops the idle connections to the old primary; busy
  ones are dropped when they come back (redis-py's ``owns_connection``);
- a connection error, a timeout or a ``READONLY`` reply (also inside a script's error)
  makes the next call ask again, at most every ``error_gap`` seconds (a dead primary
  must not turn every call into a Sentinel query);
- while a Sentinel reports a failover of the service in progress (the flag
  ``failover_in_progress``, set before the replica is promoted), calls fail at once
  instead of writing to a primary about to be replaced, for at most
  :data:`FAILOVER_HOLD_SECONDS`. Each check asks every Sentinel for that flag (only the
  one leading the failover sets it), so a check is one round trip per Sentinel;
- it hears the Sentinels' failover events as they happen (pub/sub, every Sentinel of
  the URL: :mod:`shared.store.sentinel_events`): a failover starting holds calls at
  once, ``+switch-master`` makes the next call ask; while every Sentinel is heard (a
  PING answered within ``follow_seconds``), the answer lasts ``sentinel_events_seconds``
  (15 s; 0: no subscription) instead of ``follow_seconds``.

The call that met the error fails (:class:`~shared.core.errors.StoreUnavailable`
through the store): no silent retry, as with :func:`shared.store.sessions.connect`.
The guard's change feed and own-writes connection follow the primary through the pool
(``primary_now``: the pool's answer while it is fresh;
:func:`shared.store.changes.sentinel_target`): they vouch for cached views, and write,
only while their connection is on the server the pool would write to; a stale answer
sends the call through the pool, a moved primary drops them. The inline job stays off
(:func:`shared.enqueue.redis_server`).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Generator
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.sentinel as aio_sentinel
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import (
    MasterNotFoundError,
    Sentinel,
    SentinelConnectionPool,
    SentinelConnectionPoolProxy,
    SentinelManagedConnection,
)

from shared.core.config import StoreConfig
from shared.store.pools import AsyncFairConnectionPool, TurnTakingPool
from shared.store.sentinel_events import (
    EVENTS_SECONDS,
    FAILOVER_HOLD_SECONDS,
    EventTask,
    EventThread,
    SentinelEvents,
)
from shared.store.sentinel_url import (  # the URL's names, importable from here too
    DEFAULT_SENTINEL_PORT,
    EVENTS_OPTION,
    SCHEME,
    TLS_SCHEME,
    SentinelURL,
    is_sentinel_url,
    parse_sentinel_url,
)
from shared.store.sessions import MAX_CONNECTIONS, driver_info, server_error

log = logging.getLogger("shared.store.sentinel")

FOLLOW_SECONDS = 1.0
"""How stale the pool's idea of the primary may get while it is used."""
ERROR_GAP_SECONDS = 0.2
"""The least time between two Sentinel queries prompted by errors (or a failover)."""
QUIET_SECONDS = 10.0
"""How long a Sentinel that did not answer is left out of the checks, unless the others
vouch for no primary: a hung one (its port open, no reply) cost the call making each
check a whole socket timeout, once a second. Doubled at each further miss, up to
:data:`QUIET_MAX_SECONDS`."""
QUIET_MAX_SECONDS = 120.0
# FAILOVER_HOLD_SECONDS (shared.store.sentinel_events): the longest calls wait for a
# failover a Sentinel reports in progress (one that never completes, say for want of a
# good replica, must not stop writes for its whole ``failover-timeout``).


def is_readonly(exc: BaseException) -> bool:
    """A ``READONLY`` refusal: the server answering is a replica now (also inside a
    script's error text, as Redis reports a write a script attempted there)."""
    if isinstance(exc, redis.exceptions.ReadOnlyError):
        return True
    return isinstance(exc, redis.exceptions.ResponseError) and (
        server_error(exc).startswith("READONLY") or "-READONLY" in str(exc))


class _Follow:
    """When the pool must ask the Sentinels again: the sans-I/O part both shells share."""

    def __init__(self, follow_seconds: float, error_gap: float) -> None:
        self.follow_seconds = follow_seconds
        self.error_gap = error_gap
        self.asked = -math.inf
        self.suspect = False
        self.hold_since: float | None = None
        self.quiet_until: dict[int, float] = {}  # Sentinel (its index) -> when to ask again
        self.misses: dict[int, int] = {}  # Sentinel -> answers missed in a row
        self.events: SentinelEvents | None = None  # the Sentinels' events, when heard

    def to_ask(self, count: int) -> tuple[list[int], list[int]]:
        """The Sentinels (of ``count``) to ask now, and those left out for now, having
        not answered lately: all of them when none answered lately."""
        now = time.monotonic()
        active = [i for i in range(count) if self.quiet_until.get(i, 0.0) <= now]
        if not active:
            return list(range(count)), []
        return active, [i for i in range(count) if i not in active]

    def answered(self, index: int, ok: bool) -> None:
        if ok:
            self.quiet_until.pop(index, None)
            self.misses.pop(index, None)
            return
        missed = self.misses[index] = self.misses.get(index, 0) + 1
        self.quiet_until[index] = time.monotonic() + min(
            QUIET_SECONDS * 2 ** min(missed - 1, 16), QUIET_MAX_SECONDS)

    def _gap(self) -> float:
        """How long an answer lasts: ``error_gap`` after an error or while a failover is
        reported; ``follow_seconds``, or the events' longer bound while every Sentinel is
        heard (a failover would have been heard as it started)."""
        events = self.events
        if self.suspect or self.hold_since is not None or (
                events is not None and events.holding()):
            return self.error_gap
        if events is not None and events.live():
            return max(self.follow_seconds, events.fresh_seconds)
        return self.follow_seconds

    def due(self, known: bool) -> bool:
        events = self.events
        return (not known or time.monotonic() - self.asked >= self._gap()
                or (events is not None and events.changed >= self.asked))

    def asking(self) -> None:
        self.asked = time.monotonic()
        self.suspect = False

    def saw_failover(self, seen: bool) -> None:
        """Whether a Sentinel reported a failover in progress at the last check."""
        if not seen:
            self.hold_since = None
        elif self.hold_since is None:
            self.hold_since = time.monotonic()

    def holding(self) -> bool:
        """Calls must wait for the new primary (a failover reported, by a check or an
        event, not for too long)."""
        if self.events is not None and self.events.holding():
            return True
        return (self.hold_since is not None
                and time.monotonic() - self.hold_since < FAILOVER_HOLD_SECONDS)

    def fresh(self, address: Any) -> tuple[str, int] | None:
        """``address`` (the pool's last answer) while the pool would use it without asking
        again: asked within ``follow_seconds`` (or the events' bound), no error or event
        since, no failover reported; else None (the pool's next call asks the Sentinels)."""
        if address is None or self.suspect or self.hold_since is not None \
                or self.holding() or self.due(True):
            return None
        return str(address[0]), int(address[1])


def failover_flagged(state: Any) -> bool:
    """A Sentinel's ``SENTINEL MASTER`` state of a service being failed over."""
    flags = state.get("flags", "") if isinstance(state, dict) else ""
    return "failover_in_progress" in (flags if isinstance(flags, str) else ",".join(flags))


def newest_primary(states: list[Any], manager: Any, service: str) -> tuple[str, int] | None:
    """The primary named by the Sentinel with the newest configuration (``config-epoch``)
    among those that vouch for it (redis-py's ``check_master_state``: a master, not down,
    enough peers). redis-py takes the first Sentinel's answer: one that has not heard of
    a failover yet names the old primary for up to a second more."""
    valid = [s for s in states if isinstance(s, dict) and manager.check_master_state(s, service)]
    if not valid:
        return None
    best = max(valid, key=lambda s: int(s.get("config-epoch") or 0))
    forced = getattr(manager, "_force_master_ip", None)
    return (forced if forced is not None else str(best["ip"]), int(best["port"]))


def _settle(follow: _Follow, states: list[Any], manager: Any, service: str,
            known: tuple[str, int] | None) -> tuple[str, int]:
    """The primary to use after asking every Sentinel (``states``: the answers): the
    newest one; with no answer at all, the one ``known`` (the Sentinels may be out of
    reach while the primary is fine); MasterNotFoundError when they answered and none
    vouches for a primary, or none answered and none is known."""
    follow.saw_failover(any(failover_flagged(s) for s in states))
    address = newest_primary(states, manager, service)
    if address is not None:
        return address
    follow.suspect = True  # ask again soon: this is a failover's time, or an outage's
    if not states and known is not None:
        log.debug("no Sentinel answered: keeping %s", known)
        return known
    raise MasterNotFoundError(f"No master found for {service!r} "
                              f"({len(states)} Sentinel(s) answered)")


_NO_ANSWER = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
              redis.exceptions.ResponseError)
"""A Sentinel that did not answer: the others decide."""


def _ask(follow: _Follow, manager: Any, service: str, known: tuple[str, int] | None,
         ) -> Generator[Any, Any, tuple[str, int]]:
    """Ask every Sentinel, the sans-I/O part both pools drive: each Sentinel client is
    yielded, and its ``SENTINEL MASTER`` answer sent back (None: it did not answer);
    returns the primary to use (:func:`_settle`). One that did not answer is left out for
    :data:`QUIET_SECONDS`, unless those asked vouch for no primary."""
    follow.asking()
    states: list[Any] = []
    active, skipped = follow.to_ask(len(manager.sentinels))

    def ask(indexes: list[int]) -> Generator[Any, Any, None]:
        for i in indexes:
            state = yield manager.sentinels[i]
            follow.answered(i, state is not None)
            if state is not None:
                states.append(state)

    yield from ask(active)
    if skipped and newest_primary(states, manager, service) is None:
        yield from ask(skipped)
    return _settle(follow, states, manager, service, known)


def _holding_error(service: str) -> redis.exceptions.ConnectionError:
    return redis.exceptions.ConnectionError(
        f"a failover of {service!r} is in progress: calls wait for the new primary")


def _ask_in_turn(pool: Any, address: Any) -> bool:
    """A call's first step once its turn came, both pools (``address``: the pool's last
    answer): the events listener kept or started, and whether to ask the Sentinels now.
    After the wait, not before: a call that waited through a failover, or past the
    moment the primary moved, decides on what is true when its turn came."""
    if not pool.is_master:
        return False
    pool._listen()
    return bool(pool.follow.due(address is not None))


def _hold_in_turn(pool: Any) -> None:
    """A call's last step before a connection, both pools (after :func:`_ask_in_turn`
    and the asking): none while a failover is reported in progress."""
    if pool.is_master and pool.follow.holding():
        raise _holding_error(pool.service_name)


# -- blocking ------------------------------------------------------------------------------
class _FollowingProxy(SentinelConnectionPoolProxy):
    """The stock proxy (what connections ask for the primary's address), answering from
    its last answer until that is due again (:class:`_Follow`)."""

    def __init__(self, *args: Any, follow: _Follow, **kwargs: Any) -> None:
        self.follow = follow
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]

    def get_master_address(self) -> Any:
        """The stock proxy's, with every Sentinel asked (:func:`newest_primary`)."""
        known = self.master_address
        if known is not None and not self.follow.due(True):
            return known
        asking = _ask(self.follow, self.sentinel_manager, self.service_name, known)
        try:
            sentinel = next(asking)
            while True:
                try:
                    state = sentinel.sentinel_master(self.service_name)
                except _NO_ANSWER:
                    state = None
                sentinel = asking.send(state)
        except StopIteration as done:
            address: tuple[str, int] = done.value
        if self.is_master and address != self.master_address:
            self.master_address = address
            pool = self.connection_pool_ref()
            if pool is not None:  # idle connections to the old primary: closed now
                pool.disconnect(inuse_connections=False)
        return address


class FollowingConnection(SentinelManagedConnection):
    """A primary's connection that tells its pool when the primary may have moved."""

    def _suspect(self, exc: BaseException) -> None:
        proxy = self.connection_pool
        if isinstance(proxy, _FollowingProxy):
            proxy.follow.suspect = True
        log.debug("sentinel-managed connection failed (%s): ask the Sentinels again", exc)

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        try:
            super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            self._suspect(exc)
            raise

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().read_response(*args, **kwargs)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            self._suspect(exc)
            raise
        except redis.exceptions.ResponseError as exc:
            if not is_readonly(exc):
                raise
            self._suspect(exc)
            self.disconnect()  # type: ignore[no-untyped-call]
            raise redis.exceptions.ConnectionError(
                f"the primary has become a replica: {exc}") from exc


class FollowingSSLConnection(FollowingConnection, redis.SSLConnection):
    """:class:`FollowingConnection` over TLS (redis-py's ``SentinelManagedSSLConnection``
    with the following added)."""


class FollowingSentinelPool(TurnTakingPool, SentinelConnectionPool):
    """redis-py's Sentinel pool that follows a moved primary (see the module docstring).
    ``ssl=True``: TLS to the data nodes, as redis-py's pool takes it.

    Like :func:`shared.store.sessions.connect`'s pool, a thread beyond
    ``max_connections`` waits its turn, first in, first out, and fails once no
    connection came back from an answered call for ``timeout`` seconds
    (:class:`shared.store.pools.ThreadTurns`; ``None``: it waits as long as it takes).
    redis-py's pool under it never waits: it failed the 101st thread's call at once
    with ``Too many connections`` while Redis answered every call. A turn is taken
    before the pool consults the Sentinels, so a call that waited uses the primary
    named when its turn came; a connection busy when the primary moved still goes back
    disconnected (redis-py's ``owns_connection``), and its turn to the next caller."""

    def __init__(self, service_name: str, sentinel_manager: Any, *,
                 follow_seconds: float = FOLLOW_SECONDS,
                 error_gap: float = ERROR_GAP_SECONDS,
                 events_seconds: float = EVENTS_SECONDS,
                 timeout: float | None = 1.0, **kwargs: Any) -> None:
        ssl = kwargs.pop("ssl", False)
        kwargs.setdefault("connection_class", FollowingSSLConnection if ssl
                          else FollowingConnection)
        super().__init__(service_name, sentinel_manager, **kwargs)  # type: ignore[no-untyped-call]
        self._start_turns(self.max_connections, timeout)
        self.follow = _Follow(follow_seconds, error_gap)
        self.events_seconds = events_seconds
        self.listener: EventThread | None = None
        self._listen_lock = threading.Lock()
        self.proxy = _FollowingProxy(
            connection_pool=self, is_master=self.is_master,
            check_connection=self.check_connection, service_name=service_name,
            sentinel_manager=sentinel_manager, follow=self.follow)
        self.connection_kwargs["connection_pool"] = self.proxy

    def primary_now(self) -> tuple[str, int] | None:
        """The primary this pool writes to, while its answer is fresh (:meth:`_Follow.fresh`);
        None when the next call will ask the Sentinels first. No I/O: the change feed asks
        it on every check (:func:`shared.store.changes.feed_for`)."""
        if not self.is_master:
            return None
        if self.follow.events is not None:
            self.follow.events.touch()
        return self.follow.fresh(self.proxy.master_address)

    def _listen(self) -> None:
        """The events listener, started at the first call (again after a close, and in
        a forked child: a thread does not survive a fork, nor may its state)."""
        listener = self.listener
        if _kept(self.follow, listener) or not _listens(self):
            return
        if listener is not None and listener.pid != os.getpid():
            self._listen_lock = threading.Lock()  # the parent's, maybe held at the fork
        with self._listen_lock:
            if self.listener is not listener:
                return
            events = _events_for(self.follow, self.service_name,
                                 len(self.sentinel_manager.sentinels), self.events_seconds)
            self.listener = EventThread(events, self.sentinel_manager.sentinels).start()
            weakref.finalize(self, self.listener.stopping.set)

    def disconnect(self, inuse_connections: bool = True) -> None:
        """Close the pool's connections; a full close (the client's) stops the listener
        too (the next call starts it again)."""
        if inuse_connections and self.listener is not None:
            self.listener.stop()
            self.listener = None
            self.follow.events = None
        super().disconnect(inuse_connections)

    def _in_turn(self) -> None:
        """The primary named when the call's turn came (asked again when due), and no
        call while a failover is reported in progress (:func:`_ask_in_turn`,
        :func:`_hold_in_turn`; the asyncio pool's twin awaits the asking)."""
        if _ask_in_turn(self, self.proxy.master_address):
            self.proxy.get_master_address()  # type: ignore[no-untyped-call]
        _hold_in_turn(self)


def _kept(follow: _Follow, listener: EventThread | EventTask | None) -> bool:
    """Whether ``listener`` is alive and kept (its events consulted, the pool in use):
    both pools' first step at each call."""
    if listener is None or not listener.alive():
        return False
    follow.events = listener.events
    listener.events.touch()
    return True


def _listens(pool: Any) -> bool:
    """Whether ``pool`` subscribes at all (``sentinel_events_seconds`` 0: it does not)."""
    return bool(pool.events_seconds > 0 and pool.sentinel_manager.sentinels)


def _events_for(follow: _Follow, service: str, count: int,
                fresh_seconds: float) -> SentinelEvents:
    """A fresh events state for a pool's listener, consulted by its ``follow`` from now
    on (the Sentinels heard within ``follow_seconds`` count as live)."""
    events = SentinelEvents(service, count, fresh_seconds=fresh_seconds,
                            live_seconds=follow.follow_seconds)
    follow.events = events
    return events


def _node_kwargs(cfg: StoreConfig, parsed: SentinelURL) -> dict[str, Any]:
    return {"db": parsed.db, "username": parsed.username, "password": parsed.password,
            "socket_timeout": cfg.socket_timeout,
            "socket_connect_timeout": cfg.connect_timeout, "health_check_interval": 30,
            "driver_info": driver_info(), **parsed.tls_kwargs()}


def _sentinel_kwargs(cfg: StoreConfig, parsed: SentinelURL, retry: Any) -> dict[str, Any]:
    return {"socket_timeout": cfg.socket_timeout, "socket_connect_timeout": cfg.connect_timeout,
            "username": parsed.sentinel_username, "password": parsed.sentinel_password,
            "retry": retry, **parsed.tls_kwargs()}


def connect_sentinel(url: str, config: StoreConfig | None = None, *,
                     max_connections: int = MAX_CONNECTIONS, pool_timeout: float | None = None,
                     pool_class: type[SentinelConnectionPool] = FollowingSentinelPool,
                     follow_seconds: float = FOLLOW_SECONDS) -> redis.Redis:
    """A client of the primary a Sentinel deployment names (``url``: see the module
    docstring), with bounded socket timeouts and no silent retries, like
    :func:`shared.store.sessions.connect`. Nothing is sent until the first command.
    Its pool holds at most ``max_connections``; a thread beyond them waits its turn,
    first come first served, and fails once no connection came back from an answered
    call for ``pool_timeout`` seconds, by default the connect and socket timeouts
    (:class:`FollowingSentinelPool`; redis-py's Sentinel pool failed the 101st thread's
    call at once with ``Too many connections`` while Redis answered every call).
    ``pool_class``: redis-py's stock pool for comparisons (``scripts/failover.py``; it
    does not wait). ``follow_seconds``: how often the pool asks the Sentinels while it
    is used."""
    cfg = config or StoreConfig()
    parsed = parse_sentinel_url(url)
    manager = Sentinel(list(parsed.sentinels),  # type: ignore[no-untyped-call]
                       sentinel_kwargs=_sentinel_kwargs(cfg, parsed, Retry(NoBackoff(), 0)))
    extra: dict[str, Any] = {"max_connections": max_connections}
    if issubclass(pool_class, FollowingSentinelPool):
        extra["follow_seconds"] = follow_seconds
        extra["events_seconds"] = parsed.events_seconds
        extra["timeout"] = (cfg.connect_timeout + cfg.socket_timeout if pool_timeout is None
                            else pool_timeout)
    client: redis.Redis = manager.master_for(  # type: ignore[no-untyped-call]
        parsed.service, connection_pool_class=pool_class, retry=Retry(NoBackoff(), 0),
        **_node_kwargs(cfg, parsed), **extra)
    return client


# -- asyncio -------------------------------------------------------------------------------
class AsyncFollowingConnection(aio_sentinel.SentinelManagedConnection):
    """The asyncio twin of :class:`FollowingConnection`."""

    def _suspect(self, exc: BaseException) -> None:
        follow = getattr(self.connection_pool, "follow", None)
        if isinstance(follow, _Follow):
            follow.suspect = True
        log.debug("sentinel-managed connection failed (%s): ask the Sentinels again", exc)

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        try:
            await super().send_packed_command(command, check_health)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            self._suspect(exc)
            raise

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            self._suspect(exc)
            raise
        except redis.exceptions.ResponseError as exc:
            if not is_readonly(exc):
                raise
            self._suspect(exc)
            await self.disconnect()
            raise redis.exceptions.ConnectionError(
                f"the primary has become a replica: {exc}") from exc


class AsyncFollowingSSLConnection(AsyncFollowingConnection, redis.asyncio.SSLConnection):
    """The asyncio twin of :class:`FollowingSSLConnection`."""


class AsyncFollowingSentinelPool(aio_sentinel.SentinelConnectionPool,
                                 AsyncFairConnectionPool):
    """The asyncio twin of :class:`FollowingSentinelPool`; like
    :func:`shared.store.aio.connect_async`'s pool, a call beyond ``max_connections`` waits
    its turn for a connection instead of failing at once, and fails once no connection
    came back from an answered call for ``timeout`` seconds (:mod:`shared.store.pools`).
    As in the sync pool, a call asks the Sentinels (when due) and checks for a failover
    in progress once its turn came (:meth:`_in_turn`)."""

    def __init__(self, service_name: str, sentinel_manager: Any, *,
                 follow_seconds: float = FOLLOW_SECONDS,
                 error_gap: float = ERROR_GAP_SECONDS,
                 events_seconds: float = EVENTS_SECONDS, **kwargs: Any) -> None:
        ssl = kwargs.pop("ssl", False)
        kwargs.setdefault("connection_class", AsyncFollowingSSLConnection if ssl
                          else AsyncFollowingConnection)
        self.follow = _Follow(follow_seconds, error_gap)
        self.events_seconds = events_seconds
        self.listener: EventTask | None = None
        super().__init__(service_name, sentinel_manager, **kwargs)  # type: ignore[no-untyped-call]

    async def get_master_address(self) -> Any:
        """See :meth:`_FollowingProxy.get_master_address`."""
        known = self.master_address
        if known is not None and not self.follow.due(True):
            return known
        asking = _ask(self.follow, self.sentinel_manager, self.service_name, known)
        try:
            sentinel = next(asking)
            while True:
                try:
                    state = await sentinel.sentinel_master(self.service_name)
                except _NO_ANSWER:
                    state = None
                sentinel = asking.send(state)
        except StopIteration as done:
            address: tuple[str, int] = done.value
        if self.is_master and address != self.master_address:
            self.master_address = address
            await self.disconnect(inuse_connections=False)
        return address

    def primary_now(self) -> tuple[str, int] | None:
        """See :meth:`FollowingSentinelPool.primary_now` (no I/O: callable off the loop)."""
        if not self.is_master:
            return None
        if self.follow.events is not None:
            self.follow.events.touch()
        return self.follow.fresh(self.master_address)

    def _listen(self) -> None:
        """The events listener: a task on the running loop, started at the first call
        (again after a close, on another loop, or in a forked child)."""
        listener = self.listener
        if _kept(self.follow, listener) or not _listens(self):
            return
        events = _events_for(self.follow, self.service_name,
                             len(self.sentinel_manager.sentinels), self.events_seconds)
        self.listener = EventTask(events, self.sentinel_manager.sentinels).start()

    async def disconnect(self, inuse_connections: bool = True) -> None:
        """See :meth:`FollowingSentinelPool.disconnect`."""
        if inuse_connections and self.listener is not None:
            listener, self.listener = self.listener, None
            self.follow.events = None
            await listener.stop()
        await super().disconnect(inuse_connections)

    async def _in_turn(self) -> None:
        """See :meth:`FollowingSentinelPool._in_turn`. Before the wait, as this pool did,
        a call that waited through a failover's start, or past the switch, went to the
        old primary on the connection it was handed."""
        if _ask_in_turn(self, self.master_address):
            await self.get_master_address()
        _hold_in_turn(self)

    async def _put_back(self, connection: Any) -> None:
        """A connection that was busy when the primary moved goes back disconnected (it
        reconnects to the new primary when used): redis.asyncio's pool, unlike the
        blocking one, puts every released connection back as it is. Back even when the
        close is cancelled (an await: kept as in use, its turn taken, for good), and
        inside the shared release, which counted a call answered before the close."""
        address = self.master_address
        try:
            if self.is_master and address is not None and \
                    (connection.host, connection.port) != tuple(address):
                await connection.disconnect()
        finally:
            await super()._put_back(connection)


def connect_sentinel_async(url: str, config: StoreConfig | None = None, *,
                           max_connections: int = 100, pool_timeout: float | None = None,
                           pool_class: type[Any] = AsyncFollowingSentinelPool,
                           follow_seconds: float = FOLLOW_SECONDS) -> redis.asyncio.Redis:
    """The asyncio twin of :func:`connect_sentinel` (pool bounds as
    :func:`shared.store.aio.connect_async`'s)."""
    from redis.asyncio.retry import Retry as AsyncRetry

    cfg = config or StoreConfig()
    parsed = parse_sentinel_url(url)
    manager = aio_sentinel.Sentinel(  # type: ignore[no-untyped-call]
        list(parsed.sentinels),
        sentinel_kwargs=_sentinel_kwargs(cfg, parsed, AsyncRetry(NoBackoff(), 0)))
    extra: dict[str, Any] = {"max_connections": max_connections}
    if issubclass(pool_class, AsyncFollowingSentinelPool):
        extra["follow_seconds"] = follow_seconds
        extra["events_seconds"] = parsed.events_seconds
    if issubclass(pool_class, redis.asyncio.BlockingConnectionPool):
        extra["timeout"] = (cfg.connect_timeout + cfg.socket_timeout if pool_timeout is None
                            else pool_timeout)
    client: redis.asyncio.Redis = manager.master_for(
        parsed.service, connection_pool_class=pool_class, retry=AsyncRetry(NoBackoff(), 0),
        **_node_kwargs(cfg, parsed), **extra)
    return client


__all__ = ["DEFAULT_SENTINEL_PORT", "ERROR_GAP_SECONDS", "EVENTS_OPTION", "EVENTS_SECONDS",
           "FAILOVER_HOLD_SECONDS", "FOLLOW_SECONDS", "QUIET_MAX_SECONDS", "QUIET_SECONDS",
           "SCHEME", "TLS_SCHEME", "AsyncFollowingConnection", "AsyncFollowingSSLConnection",
           "AsyncFollowingSentinelPool", "FollowingConnection", "FollowingSSLConnection",
           "FollowingSentinelPool", "SentinelURL", "connect_sentinel",
           "connect_sentinel_async", "failover_flagged", "is_readonly", "is_sentinel_url",
           "newest_primary", "parse_sentinel_url"]
