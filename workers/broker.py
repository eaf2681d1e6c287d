"""The worker's Redis broker transport: one redis-py client per connection pool.

Why: kombu's Redis channel runs most of its synchronous commands through
``Channel.conn_or_acquire()`` without a client (publishing each task event,
``QoS.append`` when a job arrives, ``QoS.ack`` when it is acked, pidbox
replies, ...), and each call builds a fresh ``redis.Redis`` on the channel's
connection pool. With redis-py 8 that costs about 57 µs of CPU (the client
copies every response callback into a new ``CaseInsensitiveDict``), about
four times per job (3,024 calls for 704 jobs of ``scripts/bench_workers.py``),
under the one GIL a threads-pool worker has; with a streaming credential
provider, each such client also registers one more re-auth callback on it.
A redis-py client that is not a single-connection client holds no
connection of its own: every command borrows one from the pool and returns
it, so one client per pool is safe to share between the pool's threads
(redis-py documents ``Redis`` as thread-safe). :class:`Channel` builds that
client once per pool, and a new one when kombu replaces the pool:
``_disconnect_pools`` (reconnect, close, after fork) drops it, and every use
also checks that the client still belongs to the channel's current pool.
Building it (and kombu's lazy pool) happens under a per-channel lock, so
threads that meet an empty or replaced slot build exactly one client: a
second one would cost the build and, with a streaming credential provider,
one more re-auth hook on the pool. The common path (the slot matches the
pool) takes no lock.
The connection limit stays the pool's (``max_connections``), shared or not.

Not shared: the asynchronous pool's clients (``Channel.client`` for BRPOP,
``Channel.subclient`` for pub/sub) carry per-connection state the event loop
polls; they stay as kombu builds them. Calls that pass a client
(``conn_or_acquire(client)``) use it unchanged. The client is built by
kombu's own ``_create_client``, so ``global_keyprefix`` (a
``PrefixedStrictRedis``) and a ``credential_provider`` apply as before.

Selection (:func:`worker_transport`): through Celery's ``broker_transport``
setting, for one ``redis://`` broker URL. Given a transport explicitly,
kombu parses the URL itself and forgets its scheme, so ``as_uri()`` (the
worker banner's ``transport:`` line, Flower's broker page) is kept printing
the ``redis://`` URL here instead of the class path. Left to kombu:
``rediss://`` (kombu derives its TLS defaults from the scheme; they stay
kombu's decision), ``sentinel://`` and every other scheme,
``redis+socket://`` (a transport named in the URL wins over the setting),
failover lists (on a switch kombu
takes the transport from the next URL's scheme, so the lists would mix
transports), and ``unix://``, which kombu does not accept as a broker URL
at all (its Unix-socket form is ``redis+socket:///path``). The messages on
the wire are the ones kombu writes: publishers and consumers on the stock
transport share the broker unchanged.

A ``sentinel://`` broker keeps kombu's Sentinel channel with one fix only
(:class:`SentinelChannel`: a worker survives its primary dying with a job in
flight), selected through kombu's ``sentinel`` alias in a starting worker
(:func:`use_sentinel_transport`), since its URL is a failover list.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from threading import Lock
from typing import Any
from urllib.parse import quote, urlsplit

import kombu.transport as kombu_transport
import redis
from kombu.transport import redis as kombu_redis
from kombu.utils.url import as_url

TRANSPORT = "workers.broker:Transport"
SENTINEL_TRANSPORT = "workers.broker:SentinelTransport"


def worker_transport(broker_url: str) -> str | None:
    """Celery's ``broker_transport`` for ``broker_url``: this module's, or None.

    None (kombu chooses by the URL's scheme, as without the setting) unless
    the URL is a single ``redis://`` URL; see the module docstring for what
    is left to kombu and why.
    """
    if ";" in broker_url or urlsplit(broker_url).scheme.lower() != "redis":
        return None
    return TRANSPORT


class Channel(kombu_redis.Channel):
    """kombu's Redis channel, sharing one synchronous client per connection pool."""

    #: (the pool, the client built on it); replaced as a whole, never mutated,
    #: so a thread reading it always gets a matching pair.
    _shared: tuple[redis.ConnectionPool, redis.Redis] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Before kombu's constructor: it may already use the channel's client.
        self._shared_lock = Lock()
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        """``client`` if given, else the channel's shared synchronous client."""
        yield client if client else self.shared_client()

    def shared_client(self) -> redis.Redis:
        """The client on the channel's current pool, built once per pool.

        Lock-free while the slot holds a client of the current pool; else
        one thread builds it (and the pool, if kombu has not yet) under the
        channel's lock while the others wait for it.
        """
        shared = self._shared
        if shared is not None and shared[0] is self._pool:
            return shared[1]
        with self._shared_lock:
            pool = self.pool  # kombu creates it lazily: under the lock, only once
            shared = self._shared
            if shared is None or shared[0] is not pool:
                client: redis.Redis = self._create_client()  # type: ignore[no-untyped-call]
                # Keyed by the pool the client really uses (_create_client reads
                # self.pool again; a pool replaced meanwhile means a rebuild next call).
                shared = (client.connection_pool, client)
                self._shared = shared
            return shared[1]

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        """kombu's parameters for a new pool; a connection error once the connection was
        released. kombu reads them off ``connection.client``, which is None then: a
        channel closed after a broker restart (its unacked jobs restored through a new
        pool, its acks sent through one) raised AttributeError, which Celery does not
        take for a connection error, and the worker exited instead of reconnecting. The
        jobs it could not restore stay in the unacked index; the broker's visibility
        timeout delivers them again."""
        _require_connection(self)
        params: dict[str, Any] = super()._connparams(asynchronous)  # type: ignore[no-untyped-call]
        return params

    def _disconnect_pools(self) -> None:
        """Forget the shared client with the pool it uses (reconnect, close, fork)."""
        self._shared = None
        super()._disconnect_pools()  # type: ignore[no-untyped-call]


def _require_connection(channel: Any) -> None:
    """A connection error, not kombu's AttributeError, for a channel whose connection
    was released (see :meth:`Channel._connparams`)."""
    if channel.connection.client is None:
        raise redis.exceptions.ConnectionError(
            "the broker connection was released (the broker restarted or went away)")


class SentinelChannel(kombu_redis.SentinelChannel):
    """kombu's Sentinel channel; a released connection is a connection error.

    The same defect as :meth:`Channel._connparams`, met on every primary that dies with
    a job in flight: the worker's ack fails, the consumer closes the channel on the
    released connection, restoring the job asks for a new pool, and kombu's
    AttributeError stopped the worker ("Unrecoverable error") instead of letting it
    reconnect to the promoted replica. The job it held is lost with the old primary's
    data either way (``scripts/failover_broker.py``); the lost-job sweep publishes it
    again. The client is not shared here: kombu's Sentinel pools are kept as they are.
    """

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        _require_connection(self)
        params: dict[str, Any] = super()._connparams(asynchronous)  # type: ignore[no-untyped-call]
        return params


class SentinelTransport(kombu_redis.SentinelTransport):
    """kombu's Sentinel transport with :class:`SentinelChannel`."""

    Channel = SentinelChannel


def is_sentinel_url(broker_url: str) -> bool:
    """Whether kombu serves ``broker_url`` (a ``;`` list: its first URL) with its
    Sentinel transport."""
    return urlsplit(broker_url.split(";", 1)[0]).scheme.lower() == "sentinel"


def use_sentinel_transport() -> None:
    """Resolve kombu's ``sentinel`` alias to :class:`SentinelTransport` in this process.

    Why the alias and not ``broker_transport``: a ``sentinel://`` broker is a ``;`` list
    of URLs, and each failed reconnect switches kombu's connection to the next one,
    taking the transport from its scheme again (``Connection.switch``): a transport
    given by class path would be replaced by kombu's own at the first failed attempt,
    which is exactly when it matters. Called in a starting worker only; the messages on
    the wire are kombu's, unchanged.
    """
    kombu_transport.TRANSPORT_ALIASES["sentinel"] = SENTINEL_TRANSPORT
    kombu_transport._transport_cache.pop("sentinel", None)  # resolved before: once more


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with :class:`Channel`; ``as_uri`` keeps the scheme."""

    Channel = Channel

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)  # type: ignore[no-untyped-call]
        # kombu's Connection.as_uri asks the transport *instance* to format
        # the URL only when it can parse URLs; the *class* attribute (False)
        # is what Connection.__init__ reads to decide that it parses the URL
        # itself, which it still must.
        self.can_parse_url = True

    def as_uri(self, uri: str, include_password: bool = False, mask: str = "**") -> str:
        """The URL kombu prints for the scheme-selected transport (never the class path)."""
        conn: Any = self.client  # the kombu Connection
        info = conn.info()
        password = info["password"]
        if not include_password:
            password = mask
        elif callable(password):
            password = password()
        return str(as_url("redis", conn.hostname or "localhost", info["port"],
                          info["userid"], password, quote(info["virtual_host"] or ""),
                          sanitize=not include_password, mask=mask))


__all__ = ["SENTINEL_TRANSPORT", "TRANSPORT", "Channel", "SentinelChannel", "SentinelTransport",
           "Transport", "is_sentinel_url", "use_sentinel_transport", "worker_transport"]
