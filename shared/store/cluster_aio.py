"""An asyncio client of a Redis Cluster whose calls wait for a free connection.

redis-py's asyncio cluster client keeps at most ``max_connections`` connections per node
and fails a call at once when they are all busy (``MaxConnectionsError``, a connection
error with no message): an async server with more calls in flight than that on one node
lost them as :class:`~shared.core.errors.StoreUnavailable`, as the standalone client did
before :func:`shared.store.aio.connect_async` gave it a blocking pool. The cluster client
has no blocking pool, so :class:`WaitingCluster` bounds the calls in flight instead: at
most ``max_connections`` across the cluster, so that no node can run out, each call
waiting up to ``pool_timeout`` for its turn (then a connection error, which the store
reports as StoreUnavailable naming the wait).

Two more things of redis-py's asyncio cluster client (8.1) break concurrent calls, and
:class:`WaitingCluster` mends them:

- Calls made before the client knows the slot map are routed as keyless, to any node,
  and come back ``MOVED``; every fifth ``MOVED`` (also after a resharding or a failover)
  and every ``CLUSTERDOWN`` make the client call its own ``aclose()``, which closes
  every connection, those other calls are using too: they failed with an
  ``AttributeError`` from inside redis-py instead of an answer. The client now learns
  the slot map before its first call, and a reset made inside a call marks the
  connections for reconnection, as redis-py itself does after a connection error,
  instead of closing them under the calls using them (or, idle, under the call about to
  take them). redis-py still closes a failed node's idle connections on a connection
  error, and a call taking one of them at that moment meets the same error: it is
  reported as the connection error it is (StoreUnavailable through the store).
- ``ASK`` (a key of a slot being migrated, already moved) was followed with ``ASKING``
  sent on one connection of the target and the command on another, which the target
  sends back (``MOVED``): during a migration, reads of moved keys failed, and the
  stray ``ASKING`` let the next command on that connection run where it should not.
  ``TRYAGAIN`` (a multi-key command, such as the store's scripts, during a migration;
  not run) was tried 16 times in about 0.4 s. Both now as the sync client does
  (:mod:`shared.store.cluster_sync`): ``ASKING`` and the command on one connection, and
  ``TRYAGAIN`` waited out up to ``migration_wait`` seconds
  (:mod:`shared.store.cluster_wait`).
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import traceback
from typing import Any

import redis.asyncio.cluster
import redis.exceptions
from redis.asyncio.cluster import ClusterNode
from redis.commands import READ_COMMANDS
from redis.himport import parse_himport_set_args

from shared.core.config import StoreConfig
from shared.store.cluster_wait import (
    MigrationWait,
    check_migration_wait,
    default_migration_wait,
)
from shared.store.pools import LoopTurns
from shared.store.sessions import cluster_nodes, driver_info

TOPOLOGY_HEADROOM = 2
"""Connections per node beyond the bound on calls: a slot-map refresh, which the client
makes on a node's connection while calls hold the rest, must not find them all taken."""


_INSIDE_CALL: contextvars.ContextVar[bool] = contextvars.ContextVar("inside_cluster_call",
                                                                    default=False)
"""Set while a call runs: an ``aclose()`` then is the client resetting itself."""


class WaitingCluster(redis.asyncio.cluster.RedisCluster):
    """redis-py's asyncio cluster client, each command and pipeline waiting for one of
    ``calls_bound`` turns (the pool a standalone client has, counted across nodes)."""

    ERRORS_ALLOW_RETRY: Any = (redis.exceptions.ClusterDownError,
                               redis.exceptions.SlotNotCoveredError)
    """Retried (the slot map reloaded first) only where the cluster refused a command
    before running it; redis-py also re-sends one after a timeout or a broken connection,
    when it may have run: the sync client stored an append twice that way
    (:func:`shared.store.sessions.connect_cluster`)."""

    def __init__(self, *args: Any, calls_bound: int, pool_timeout: float,
                 migration_wait: float = 1.0, **kwargs: Any) -> None:
        kwargs["max_connections"] = calls_bound + TOPOLOGY_HEADROOM
        super().__init__(*args, **kwargs)
        self.calls_bound = calls_bound
        self.pool_timeout = pool_timeout
        self.migration_wait = check_migration_wait(migration_wait)
        # first in, first out; a waiting call fails only once no call was answered for
        # pool_timeout (shared.store.pools: a burst on a busy loop waits, a dead cluster fails)
        self._turns = LoopTurns(calls_bound, pool_timeout)

    async def _take_turn(self) -> None:
        try:
            await self._turns.take()
        except redis.exceptions.ConnectionError:
            raise redis.exceptions.ConnectionError(
                f"no call to the cluster was answered while this one waited {self.pool_timeout:g} "
                f"s for one of {self.calls_bound} connections (max_connections)") from None

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        await self._take_turn()
        inside = _INSIDE_CALL.set(True)
        answered = False
        try:
            if self._initialize:  # the slot map first: a call resolved without it goes astray
                await self.initialize()
            result = await super().execute_command(*args, **kwargs)
            answered = True
            return result
        except redis.exceptions.ResponseError:
            answered = True  # an error reply is an answer
            raise
        except (AttributeError, TypeError) as exc:
            raise _closed_under_call(exc) from exc
        finally:
            _INSIDE_CALL.reset(inside)
            self._turns.give(answered)

    async def _execute_command(self, target_node: ClusterNode, *args: Any,
                               **kwargs: Any) -> Any:
        """One command on one node, following ``MOVED`` and ``ASK`` (at most
        ``RedisClusterRequestTTL`` redirections between two ``TRYAGAIN``) and waiting
        out ``TRYAGAIN``; any other failure is redis-py's (:meth:`_send`)."""
        if parse_himport_set_args(args) is not None:  # type: ignore[no-untyped-call]
            # not a command the store sends
            return await super()._execute_command(target_node, *args, **kwargs)
        wait: MigrationWait | None = None
        asked: ClusterNode | None = None
        hops = int(self.RedisClusterRequestTTL)
        while hops > 0:
            hops -= 1
            node = asked or target_node
            try:
                return await self._send(node, args, kwargs, asking=asked is not None)
            except redis.exceptions.MovedError as exc:
                await self._moved(exc)
                asked, target_node = None, await self._owner(args)
            except redis.exceptions.AskError as exc:
                asked = await self._asked(exc)
            except redis.exceptions.TryAgainError:
                wait = wait or MigrationWait(self.migration_wait)
                await asyncio.sleep(wait.pause(await self._determine_slot(*args), node.name))
                # the migration may have ended (or been undone) since: the owner decides
                asked, target_node = None, await self._owner(args)
                hops = int(self.RedisClusterRequestTTL)
        raise redis.exceptions.ClusterError("TTL exhausted.")

    async def _owner(self, args: tuple[Any, ...]) -> ClusterNode:
        read = args[0] in READ_COMMANDS
        return self.nodes_manager.get_node_from_slot(
            await self._determine_slot(*args), self.read_from_replicas and read,
            self.load_balancing_strategy if read else None)

    async def _moved(self, exc: redis.exceptions.MovedError) -> None:
        """redis-py's handling: the slot map patched, or reloaded (:meth:`aclose`, here
        a reset) every ``reinitialize_steps`` redirections."""
        self.reinitialize_counter += 1
        if self.reinitialize_steps and self.reinitialize_counter % self.reinitialize_steps == 0:
            await self.aclose()
            self.reinitialize_counter = 0
        else:
            await self.nodes_manager.move_slot(exc)

    async def _asked(self, exc: redis.exceptions.AskError) -> ClusterNode:
        """The node an ``ASK`` names (a node the slot map does not know yet: reloaded)."""
        node = self.get_node(host=exc.host, port=exc.port)
        if node is None:
            await self.nodes_manager.initialize()
            node = self.get_node(host=exc.host, port=exc.port)
        if node is None:
            raise redis.exceptions.ClusterError(
                f"ASK to {exc.host}:{exc.port}, a node the cluster does not list")
        return node

    async def _send(self, node: ClusterNode, args: tuple[Any, ...], kwargs: dict[str, Any],
                    *, asking: bool) -> Any:
        """One try on ``node`` (asked: ``ASKING`` first, on the same connection), with
        redis-py's handling of every failure but the redirections, which it raises."""
        try:
            if asking:
                return await _asking(node, args, kwargs)
            return await node.execute_command(*args, **kwargs)
        except (redis.exceptions.MaxConnectionsError, redis.exceptions.MovedError,
                redis.exceptions.AskError, redis.exceptions.TryAgainError):
            raise
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            # redis-py's: the node's connections reconnect, the slot map is reloaded
            # before the next call trying this node last; not sent again
            node.update_active_connections_for_reconnect()
            await node.disconnect_free_connections()
            self.nodes_manager.move_node_to_end_of_cached_nodes(node.name)
            failed: Any = exc
            failed.last_failed_node_name = node.name  # read by execute_command
            self._initialize = True
            raise
        except (redis.exceptions.ClusterDownError, redis.exceptions.SlotNotCoveredError):
            await self.aclose()  # redis-py's: a reset (see aclose), then a retry
            await asyncio.sleep(0.25)
            raise

    async def aclose(self) -> None:
        """Close every connection; called by redis-py inside a call (a reset after
        ``MOVED`` or ``CLUSTERDOWN``), only learn the slot map again and reconnect each
        connection once it is free (the calls using them finish first)."""
        if not _INSIDE_CALL.get():
            await super().aclose()
            return
        self._initialize = True
        manager = self.nodes_manager
        for node in {**manager.startup_nodes, **manager.nodes_cache}.values():
            for connection in node._connections:  # closed when next taken, or given back
                connection.mark_for_reconnect()  # type: ignore[no-untyped-call]

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None,
                 ) -> redis.asyncio.cluster.ClusterPipeline:
        if shard_hint:  # refused as the stock client refuses it
            return super().pipeline(transaction, shard_hint)
        return _WaitingPipeline(self, transaction=transaction)  # type: ignore[abstract]


class _WaitingPipeline(redis.asyncio.cluster.ClusterPipeline):
    """A pipeline that takes one turn of its client for its ``execute`` (the store's
    pipelines touch one session: one slot, one node)."""

    async def execute(self, raise_on_error: bool = True,
                      allow_redirections: bool = True) -> list[Any]:
        client = self.cluster_client
        if not isinstance(client, WaitingCluster):  # pragma: no cover - built by it
            return await super().execute(raise_on_error, allow_redirections)
        await client._take_turn()
        inside = _INSIDE_CALL.set(True)
        answered = False
        try:
            result = await super().execute(raise_on_error, allow_redirections)
            answered = True
            return result
        except redis.exceptions.ResponseError:
            answered = True
            raise
        except (AttributeError, TypeError) as exc:
            raise _closed_under_call(exc) from exc
        finally:
            _INSIDE_CALL.reset(inside)
            client._turns.give(answered)


async def _asking(node: ClusterNode, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``ASKING`` then the command on one connection of ``node``: the permission holds
    for the next command of that connection only (redis-py sent the two on two
    connections, taking whichever were free)."""
    connection = node.acquire_connection()
    try:
        await node.disconnect_if_needed(connection)
        await connection.send_command("ASKING")
        await node.parse_response(connection, "ASKING")
        await connection.send_packed_command(connection.pack_command(*args))
        return await node.parse_response(connection, args[0], **kwargs)
    finally:
        try:
            await node.disconnect_if_needed(connection)
        finally:
            node.release(connection)


def _closed_under_call(exc: Exception) -> BaseException:
    """A connection error for redis-py's connection used after another task closed it,
    which the client still does on a connection error (redis-py closes the idle
    connections of the failed node, one of which another call is just taking): its
    stream gone (``'NoneType' object has no attribute 'writelines'``, Python 3.11) or its
    transport half torn down (``'NoneType' object is not callable`` inside asyncio's
    ``writelines``, 3.12). The store reports it as StoreUnavailable, like the failure
    that set it off. Only an error raised while a connection sends, reads or connects:
    any other (a bad argument to ``pack_command``, a bug of ours) as is."""
    frames = traceback.extract_tb(exc.__traceback__)
    redis_frames = [f for f in frames if f.filename.endswith(_CONNECTION_MODULE)]
    if not redis_frames or redis_frames[-1].name not in _STREAM_CALLS:
        return exc
    raised_in = frames[-1].filename
    if not (raised_in.endswith(_CONNECTION_MODULE) or _ASYNCIO_DIR in raised_in):
        return exc
    return redis.exceptions.ConnectionError(
        f"a cluster connection was closed while this call used it: {exc!r}")


_CONNECTION_MODULE = os.path.join("redis", "asyncio", "connection.py")
_ASYNCIO_DIR = f"{os.sep}asyncio{os.sep}"
_STREAM_CALLS = frozenset({"_send_packed_command", "send_packed_command", "send_command",
                           "read_response", "connect", "connect_check_health",
                           "on_connect_check_health", "_connect"})


def connect_cluster_async(url: str, config: StoreConfig | None = None, *,
                          max_connections: int = 100,
                          pool_timeout: float | None = None,
                          migration_wait: float | None = None) -> WaitingCluster:
    """An asyncio Redis Cluster client (``url``: one node or several,
    ``redis://h1:7000,h2:7000``, as :func:`~shared.store.sessions.connect_cluster` takes) for
    :class:`~shared.store.aio.AsyncSessionStore`, with the sync
    :func:`~shared.store.sessions.connect_cluster`'s bounded timeouts and nothing sent
    twice (slot moves, MOVED and ASK, are followed by the client). At most
    ``max_connections`` calls are in flight; the others wait up to ``pool_timeout``
    seconds (default: the store's connect and socket timeouts), as
    :func:`~shared.store.aio.connect_async`'s do. A call whose slot is being moved to
    another master waits for the move to end, at most ``migration_wait`` seconds
    (default: the connect and socket timeouts, as the sync client). Nothing is sent
    before the first call."""
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    from shared.store.aio import _check_positive

    _check_positive("max_connections", max_connections)
    cfg = config or StoreConfig()
    migrating = check_migration_wait(default_migration_wait(cfg) if migration_wait is None
                                     else migration_wait)
    wait = cfg.connect_timeout + cfg.socket_timeout if pool_timeout is None else pool_timeout
    first, others = cluster_nodes(url)  # several nodes: none of them alone is needed
    client = WaitingCluster.from_url(
        first, startup_nodes=[redis.asyncio.cluster.ClusterNode(host, port)
                              for host, port in others],
        calls_bound=max_connections, pool_timeout=wait,
        migration_wait=migrating,
        socket_timeout=cfg.socket_timeout, socket_connect_timeout=cfg.connect_timeout,
        retry=Retry(NoBackoff(), 1), driver_info=driver_info())
    assert isinstance(client, WaitingCluster)
    return client


__all__ = ["WaitingCluster", "connect_cluster_async"]
