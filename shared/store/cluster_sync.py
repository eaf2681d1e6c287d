"""The store's sync Redis Cluster client: nothing sent twice, slot migrations waited out.

:func:`shared.store.sessions.connect_cluster` builds it. Two departures from redis-py's
cluster client (8.1):

- A command is retried whole only where the cluster refused it before running it
  (``CLUSTERDOWN``, a slot no node covers: the slot map is reloaded first). redis-py also
  re-sends one after a timeout or a broken connection, when it may have run already: an
  append without a request id was stored twice, and a compare-and-swap that had won
  reported a loss. Without that retry a dead or hung node costs a call one socket
  timeout, not two; the failed call has reloaded the slot map, so the next one finds a
  promoted replica.
- ``TRYAGAIN`` (a multi-key command during a slot migration, not run) is tried again
  with a short backoff, from the slot's owner, for up to ``migration_wait`` seconds
  (:mod:`shared.store.cluster_wait`), then fails naming the slot; redis-py gave up after
  16 quick tries (about 0.4 s), and tried the node that had answered ``ASK`` again
  without ``ASKING``, which sends it back with ``MOVED`` and every fifth ``MOVED``
  reloads the slot map.
"""

from __future__ import annotations

import time
from typing import Any

import redis.exceptions
from redis.cluster import ClusterNode, RedisCluster, get_connection
from redis.commands import READ_COMMANDS
from redis.himport import parse_himport_set_args

from shared.store.cluster_wait import MigrationWait


class StoreCluster(RedisCluster):
    """redis-py's cluster client, retrying only what the cluster refused before running
    it, and waiting out a slot migration up to ``migration_wait`` seconds."""

    ERRORS_ALLOW_RETRY: Any = (redis.exceptions.ClusterDownError,
                               redis.exceptions.SlotNotCoveredError)

    def __init__(self, *args: Any, migration_wait: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.migration_wait = migration_wait

    def _execute_command(self, target_node: ClusterNode, *args: Any, **kwargs: Any) -> Any:
        """One command on one node, following ``MOVED`` and ``ASK`` (at most
        ``RedisClusterRequestTTL`` redirections between two ``TRYAGAIN``) and waiting
        out ``TRYAGAIN``; any other failure is redis-py's (:meth:`_send`)."""
        if parse_himport_set_args(args) is not None:  # type: ignore[no-untyped-call]
            # not a command the store sends
            return super()._execute_command(target_node, *args,  # type: ignore[no-untyped-call]
                                            **kwargs)
        wait: MigrationWait | None = None
        asked: ClusterNode | None = None
        hops = int(self.RedisClusterRequestTTL)
        while hops > 0:
            hops -= 1
            node = asked or target_node
            try:
                return self._send(node, args, kwargs, asking=asked is not None)
            except redis.exceptions.MovedError as exc:
                self._moved(exc)
                asked, target_node = None, self._owner(args)
            except redis.exceptions.AskError as exc:
                asked = self._asked(exc)
            except redis.exceptions.TryAgainError:
                wait = wait or MigrationWait(self.migration_wait)
                time.sleep(wait.pause(self.determine_slot(*args), node.name))
                # the migration may have ended (or been undone) since: the owner decides
                asked, target_node = None, self._owner(args)
                hops = int(self.RedisClusterRequestTTL)
        raise redis.exceptions.ClusterError("TTL exhausted.")

    def _owner(self, args: tuple[Any, ...]) -> ClusterNode:
        read = args[0] in READ_COMMANDS
        slot: Any = self.determine_slot(*args)  # keyed: the only commands redirected
        return self.nodes_manager.get_node_from_slot(
            slot, self.read_from_replicas and read,
            self.load_balancing_strategy if read else None)

    def _moved(self, exc: redis.exceptions.MovedError) -> None:
        """redis-py's handling: the slot map patched, or reloaded every
        ``reinitialize_steps`` redirections."""
        self.reinitialize_counter += 1
        if self._should_reinitialized():  # type: ignore[no-untyped-call]
            self.nodes_manager.initialize(additional_startup_nodes_info=[(exc.host, exc.port)])
            self.reinitialize_counter = 0
        else:
            self.nodes_manager.move_slot(exc)

    def _asked(self, exc: redis.exceptions.AskError) -> ClusterNode:
        """The node an ``ASK`` names (a node the slot map does not know yet: reloaded)."""
        lookup: Any = self.nodes_manager.get_node  # untyped in redis-py
        node: ClusterNode | None = lookup(exc.host, exc.port)
        if node is None:
            self.nodes_manager.initialize()
            node = lookup(exc.host, exc.port)
        if node is None:
            raise redis.exceptions.ClusterError(
                f"ASK to {exc.host}:{exc.port}, a node the cluster does not list")
        return node

    def _send(self, node: ClusterNode, args: tuple[Any, ...], kwargs: dict[str, Any], *,
              asking: bool) -> Any:
        """One try on ``node`` (``ASKING`` first on the same connection when asked), with
        redis-py's handling of every failure but the redirections, which it raises."""
        command = args[0]
        redis_node: Any = self.get_redis_connection(node)  # untyped in redis-py
        connection: Any = None
        try:
            connection = get_connection(redis_node)
            if asking:
                connection.send_command("ASKING")
                redis_node.parse_response(connection, "ASKING", **kwargs)
            connection.send_command(*args, **kwargs)
            response = redis_node.parse_response(connection, command, **kwargs)
            kwargs.pop("keys", None)  # for the client-side cache only
            if command in self.cluster_response_callbacks:
                response = self.cluster_response_callbacks[command](response, **kwargs)
            return response
        except (redis.exceptions.AuthenticationError, redis.exceptions.MaxConnectionsError,
                redis.exceptions.MovedError, redis.exceptions.AskError,
                redis.exceptions.TryAgainError):
            raise
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            # redis-py's: the node's connections reconnect, the slot map is reloaded
            # trying this node last, and the error is the caller's (not sent again)
            if connection is not None:
                connection.disconnect()
            pool = redis_node.connection_pool
            with pool._lock:
                pool.update_active_connections_for_reconnect()
                pool.disconnect_free_connections()
            self.nodes_manager.move_node_to_end_of_cached_nodes(node.name)
            self.nodes_manager.initialize(last_failed_node_name=node.name)
            raise
        except (redis.exceptions.ClusterDownError, redis.exceptions.SlotNotCoveredError):
            time.sleep(0.25)  # redis-py's: then the slot map again, and a retry
            self.nodes_manager.initialize()
            raise
        except redis.exceptions.ResponseError:
            raise
        except Exception:
            if connection is not None:
                connection.disconnect()
            raise
        finally:
            if connection is not None:
                redis_node.connection_pool.release(connection)


__all__ = ["StoreCluster"]
