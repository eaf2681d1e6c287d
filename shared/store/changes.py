"""Which sessions changed since the guard last read them, told by Redis itself.

Between two calls of one turn (a tool chain), nothing in the session usually
changes, yet each ``prepare`` paid a round trip to find that out. Redis's
client-side caching support can tell instead: a connection with ``CLIENT
TRACKING ON BCAST PREFIX <tenant's key prefix>`` receives an invalidation
push (RESP3) naming every key of those sessions that is written, by anyone.
:class:`ChangeFeed` keeps that connection and records, per session, the
sequence number of its last change; the guard skips its read while nothing
of the session changed since the read its cached view came from.

Why it stays correct:

- In broadcast mode Redis queues the push in the same event-loop pass as the
  write and (Redis 6 and 7: the client queued last is written first) sends it
  before the writer's reply, and every check drains the connection first (one
  ``poll`` with no wait, :mod:`shared.store.pushes`). The push and the reply
  travel on different connections, though: the reply can arrive first (over TCP
  on one host with another client writing, 6 in 60,000 writes, 28-171 µs late; none
  when quiet or over a Unix socket: ``scripts/bench_feed_order.py``; across a network
  a lost packet delays the push by a retransmission). Such a write is in the view
  from the first call after its push; a process handed a turn that another one
  recorded (a job, an HTTP request) passes ``prepare(min_length=)``, the length that
  append returned, and reads when its view is shorter.
- One prefix per tenant, not one per session read (which would push a process only
  its own sessions' writes): Redis scans every registered prefix on each pass of its
  event loop and checks every write against them, so the server's cost would grow with
  the sessions served (2,000 prefixes added ~370 µs to every command of every client,
  2026-11-28); one tenant-wide prefix is one entry however many processes share it.
- Only writes to keys a view is read from count (:data:`VIEW_KEY_NAMES`): a
  worker's lease and request ids leave a cached view as it was. The recall index
  is not under the watched prefix at all (:func:`shared.store.keys.recall_base`):
  the hundreds of term keys an index batch writes are pushed to no guard. A feed
  shared by several tenants' guards watches ``<prefix>:{`` for the same reason,
  not ``<prefix>:``.
  A write to the job flag alone (a worker claiming the job, the flag's expiry)
  is told apart (:data:`FLAG`): the view holds, whether a job is queued is
  unknown, and a request sets the flag only if absent, so the guard takes it
  as clear instead of reading (the worker claims a job after most turns).
- Own writes are not told apart from others' (``NOLOOP`` does not cover
  script writes in broadcast mode on Redis 7.0, and one push may carry the
  keys of several clients' writes): after writing, the guard reads again, except
  after its appends, which :mod:`shared.store.own_writes` vouches for.
- A connection that died quietly sends nothing; the feed is trusted only
  within :data:`VERIFY_SECONDS` of a ``PING`` answered on it (the pushes
  before the ``PONG`` are read before it), so a silent failure costs at most
  that much staleness, and a broken one turns the feed off (every prepare
  reads) until it reconnects, with backoff.
- The guard's own writes drop its mark at once (they do not wait for the push).
- A ``FLUSHDB`` (a push with no keys), a reconnection or a fork starts a new
  epoch: marks from before it are worthless (a forked child opens its own
  connection; the parent's is left alone).
- On an event loop's thread (the async guard) a check does no blocking I/O: it
  drains what arrived (one poll, no wait) and vouches only within
  :data:`VERIFY_SECONDS` of the last ``PONG``; the ``PING`` (from half that age
  on while the feed is in use, so it stays vouched for across a model call) and
  the reconnection run on a thread of the feed's own. A check that needs one
  waits for it at most :data:`WAIT_SECONDS` (Redis answering: it is done), and
  while that thread is slow (Redis is not answering) no check waits: the guard
  reads (a blocking connection there blocked the whole loop up to
  :data:`IO_TIMEOUT` an attempt).

Where tracking is not available (fakeredis, Redis Cluster, Redis before 6, a
custom connection class) the feed reports itself unavailable and the guard
reads on every call, as before.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from shared.store.keys import VIEW_KEY_NAMES
from shared.store.pushes import Pushes

log = logging.getLogger("shared.store.changes")

Locate = Callable[[], "tuple[str, int] | None"]
"""Where a Sentinel deployment's primary is now, as the store's pool last heard it while
that answer is fresh; None when it is not (the pool's next call asks the Sentinels)."""

NOTHING, FLAG, CHANGED = 0, 1, 2
"""What a session saw since a mark (:meth:`ChangeFeed.since`): nothing; its job flag
alone (a worker claimed the job, the flag expired, another process requested one: the
cached view holds, only whether a job is queued is unknown); anything else."""
FLAG_KEY_NAME = "pending"
"""The one view key whose writes leave a cached view as it was, but for its job flag."""

VERIFY_SECONDS = 1.0
"""How long a ``PING`` answered on the feed's connection vouches for it."""
IO_TIMEOUT = 0.25
"""Seconds the feed's connect and ``PING`` may take at most (inside a guard call)."""
RETRY_SECONDS = (0.5, 1.0, 2.0, 5.0, 10.0)
"""Waits before reconnecting after consecutive failures (then the last one, repeated)."""
_KWARGS = ("host", "port", "db", "username", "password", "socket_connect_timeout", "path",
           "driver_info", "credential_provider", "client_name")
# Every TLS option (``ssl_*``) is the store's too: a CA directory (``ssl_ca_path``), a
# client key's ``ssl_password``, ``ssl_min_version``... Without one the tracking
# connection failed where the store's succeeded (the guard then read on every call), or
# OpenSSL asked for the key's pass phrase on the terminal, inside a guard call.
_TLS_PREFIX = "ssl_"


def feed_kwargs(connection_kwargs: Mapping[str, Any], *, short: bool = True) -> dict[str, Any]:
    """A tracking connection's arguments, from the store's: the same server and
    credentials; ``short``: timeouts of at most :data:`IO_TIMEOUT` whatever the store's
    (the feed's checks run inside a guard call; a slow answer only turns the shortcut
    off for a while)."""
    kwargs = {k: v for k, v in connection_kwargs.items()
              if k in _KWARGS or k.startswith(_TLS_PREFIX)}
    for name in ("socket_timeout", "socket_connect_timeout"):
        given = connection_kwargs.get(name)
        kwargs[name] = (min(float(given or IO_TIMEOUT), IO_TIMEOUT) if short or given is None
                        else float(given))
    return kwargs


def session_base(key: bytes | str) -> str:
    """``prefix:{tenant:session}`` of a session's key (the part every key of it shares;
    tenants and session ids hold no braces, a recall term after it may)."""
    text = key.decode() if isinstance(key, bytes) else key
    end = text.find("}")
    return text[: end + 1] if end >= 0 else text


def _split(key: bytes | str) -> tuple[str, str | None]:
    """(:func:`session_base`, the key's name after it) of a session's key; None as the
    name when it has none (not a session key: counted as a change, to be safe)."""
    text = key.decode() if isinstance(key, bytes) else key
    end = text.find("}")
    if end < 0:
        return text, None
    return text[: end + 1], text[end + 2:]


class _Seen:
    """What the pushes told: the change counter, the epoch, each session's last change.

    Apart from the feed so that the connection's push handler does not hold the
    feed: a guard dropped is a feed dropped, and its socket closed, at once.
    """

    __slots__ = ("changed", "epoch", "flagged", "pushes", "seq")

    def __init__(self) -> None:
        self.seq = 0
        self.epoch = 0
        self.changed: dict[str, int] = {}
        self.flagged: dict[str, int] = {}  # per session, its last push of the job flag alone
        self.pushes: dict[str, int] = {}  # per session, how many pushes named it

    def forget(self) -> None:
        """Changes may have been missed: marks taken before now are worthless."""
        self.epoch += 1
        self.changed.clear()
        self.flagged.clear()
        self.pushes.clear()

    def since(self, base: str, epoch: int, seq: int) -> int:
        """What session ``base`` saw after (epoch, seq): :data:`NOTHING`, :data:`FLAG` (its
        job flag alone was written) or :data:`CHANGED` (anything else, or another epoch)."""
        if epoch != self.epoch or self.changed.get(base, -1) > seq:
            return CHANGED
        return FLAG if self.flagged.get(base, -1) > seq else NOTHING

    def invalidated(self, push: list[Any]) -> None:
        """A push ``[b"invalidate", keys | None]`` (None: the whole database was flushed)."""
        keys = push[1] if len(push) > 1 else None
        if keys is None:
            self.forget()
            return
        bases: dict[str, bool] = {}  # session -> only its job flag was written
        for key in keys:
            base, name = _split(key)
            if name is None or name in VIEW_KEY_NAMES:
                bases[base] = bases.get(base, True) and name == FLAG_KEY_NAME
        if not bases:  # only keys no view is read from (a lease, the recall index)
            return
        self.seq += 1
        for base, flag_only in bases.items():
            (self.flagged if flag_only else self.changed)[base] = self.seq
            self.pushes[base] = self.pushes.get(base, 0) + 1
        if len(self.changed) + len(self.flagged) > 100_000:  # bounded: forgetting is safe
            self.forget()


class ChangeFeed:
    """Invalidation pushes for one tenant's sessions, and the marks the guard compares.

    ``mark()`` before a read; later, ``unchanged(base, mark)`` is True only if
    the feed is healthy, in the same epoch, and no key of ``base`` was
    written since. Thread-safe; one feed serves every session of its guard.
    """

    def __init__(self, connection_kwargs: Mapping[str, Any], prefix: str, *,
                 connection_class: str = "Connection",
                 locate: Locate | None = None) -> None:
        self._kwargs = feed_kwargs(connection_kwargs)
        # On a Sentinel deployment: where the store's pool writes now (None while its answer
        # is stale); the feed connects there and vouches only while that stands.
        self._locate = locate
        self._address: tuple[str, int] | None = None
        self._store_kwargs = dict(connection_kwargs)
        self._class = connection_class
        self.prefix = prefix
        self._own: Any = None  # the sync guards' shared own-writes connection, when asked
        self._lock = threading.Lock()
        self._conn: Any = None
        self._pushes: Pushes | None = None
        self._seen = _Seen()
        self._verified = 0.0
        self._failures = 0
        self._retry_at = 0.0
        self._wanted = threading.Event()  # the feed's thread is asked to connect or PING
        self._checked = threading.Event()  # the feed's thread made a check
        self._worker: threading.Thread | None = None
        self._used = 0.0  # the last check on an event loop
        self._slow = False  # the feed's thread took longer than WAIT_SECONDS: not waited for
        self.closed = False
        _FEEDS.add(self)

    # -- what the guard calls -------------------------------------------------------------
    def mark(self) -> tuple[int, int] | None:
        """The point a read starts from (None: the feed cannot vouch for anything now)."""
        if not self._vouching():
            return None
        try:
            return self._seen.epoch, self._seen.seq
        finally:
            self._lock.release()

    def unchanged(self, base: str, mark: tuple[int, int] | None) -> bool:
        """True when no key of session ``base`` was written since ``mark`` was taken (but
        perhaps its job flag: :meth:`since` tells)."""
        return self.since(base, mark) != CHANGED

    def since(self, base: str, mark: tuple[int, int] | None) -> int:
        """What session ``base`` saw since ``mark`` was taken: :data:`NOTHING`,
        :data:`FLAG` or :data:`CHANGED` (also whenever the feed cannot vouch)."""
        if mark is None or not self._vouching():
            return CHANGED
        try:
            return self._seen.since(base, *mark)
        finally:
            self._lock.release()

    def tally(self, base: str) -> tuple[int, int, int] | None:
        """(epoch, sequence number, pushes that named session ``base``) now, the
        connection drained first; None when the feed cannot vouch for anything now.
        Around a write of its own, one more push names the session: that write's (with
        any other client's writes to it in the same pass of Redis's event loop)."""
        if not self._vouching():
            return None
        try:
            return self._seen.epoch, self._seen.seq, self._seen.pushes.get(base, 0)
        finally:
            self._lock.release()

    def shared_own_writes(self) -> Any:
        """One own-writes connection (:class:`shared.store.own_writes.OwnWrites`) for the
        sync guards sharing this feed, made on first use: like the feed, one connection
        for every tenant's guard (a busy one sends an append through the store)."""
        from shared.store.own_writes_sync import OwnWrites

        with self._lock:
            if self._own is None:
                self._own = OwnWrites(self._store_kwargs, connection_class=self._class,
                                      probe_key=self.prefix.split("{", 1)[0],
                                      locate=self._locate)
            return self._own

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self._drop()
            own, self._own = self._own, None
            self._wanted.set()  # the feed's thread, if any, ends
        if own is not None:
            own.close()

    # -- the connection ----------------------------------------------------------------------
    def _vouching(self) -> bool:
        """The lock taken and the feed ready (then the caller releases the lock). On an
        event loop's thread, never waiting long: a PING or reconnection (on the feed's
        thread) that takes more than :data:`WAIT_SECONDS`, and the caller reads; while it
        goes on, the checks do not wait at all."""
        if asyncio._get_running_loop() is None:
            self._lock.acquire()
            if self._ready():
                return True
            self._lock.release()
            return False
        if not self._lock.acquire(blocking=False) and not self._take_now():
            return False
        ready = self._ready_now()
        if ready is None:  # the feed's thread connects or PINGs: wait for it, briefly
            self._lock.release()
            self._checked.clear()
            self._in_background()
            if not self._checked.wait(WAIT_SECONDS):
                self._slow = True
                return False
            if not self._take_now():
                return False
            ready = self._ready_now()
        if ready:
            return True
        self._lock.release()
        return False

    def _take_now(self) -> bool:
        """The lock, on an event loop: waited for at most WAIT_SECONDS (the feed's thread
        may hold it for a PING), not at all while that thread is slow (Redis is)."""
        if self._lock.acquire(blocking=False):
            return True
        if not self._slow and self._lock.acquire(timeout=WAIT_SECONDS):
            return True
        self._slow = True
        return False

    def _ready_now(self) -> bool | None:
        """:meth:`_ready` without blocking (under the lock); None: not before the feed's
        thread connects or PINGs. Vouched for only within VERIFY_SECONDS of the last PONG,
        as between two PINGs; the thread PINGs from half that age on while the feed is in
        use, so a guard between two turns of a model finds it verified."""
        if self.closed or not self._at_primary():
            return False
        now = self._used = time.monotonic()
        if self._conn is None:
            return None if now >= self._retry_at else False
        age = now - self._verified
        if age > VERIFY_SECONDS:
            return None
        if age > VERIFY_SECONDS / 2:
            self._in_background()
        try:
            assert self._pushes is not None
            self._pushes.drain()  # one poll, no wait
        except Exception as exc:
            self._fail(exc)
            return False
        return True

    def _in_background(self) -> None:
        """Wake the feed's thread (started on first need; it ends with the feed, or when
        the feed was not used on an event loop for :data:`KEEP_SECONDS`)."""
        self._wanted.set()
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=_verify, args=(weakref.ref(self),
                                                                  self._wanted),
                                            name="change-feed", daemon=True)
            self._worker.start()

    def _next_check(self) -> float | None:
        """Seconds until the feed's thread checks the feed again (None: not in use)."""
        now = time.monotonic()
        if self.closed or now - self._used > KEEP_SECONDS:
            return None
        due = self._retry_at if self._conn is None else self._verified + VERIFY_SECONDS / 2
        return max(0.0, due - now)

    def _ready(self, verify_after: float | None = None) -> bool:
        """Connected, drained and verified recently (under the lock; ``verify_after``:
        the age of the last PONG that calls for a PING, by default VERIFY_SECONDS)."""
        if self.closed or not self._at_primary():
            return False
        now = time.monotonic()
        if self._conn is None and (now < self._retry_at or not self._connect()):
            return False
        try:
            assert self._pushes is not None
            self._pushes.drain()
            if now - self._verified > (VERIFY_SECONDS if verify_after is None
                                       else verify_after):
                self._conn.send_command("PING")
                self._conn.read_response()  # pushes before the PONG are handled first
                self._verified = time.monotonic()
        except Exception as exc:
            self._fail(exc)
            return False
        return True

    def _at_primary(self) -> bool:
        """Whether the feed may vouch now as to where it is connected: always on a single
        server; on a Sentinel deployment only while the store's pool knows the primary
        afresh (else its next call asks the Sentinels: the guard reads through it), and
        when that primary moved the connection is dropped, a new epoch (marks from
        before are worthless: writes to the new primary were not seen)."""
        if self._locate is None:
            return True
        where = self._locate()
        if where is None:
            return False
        if self._conn is not None and where != self._address:
            log.info("change feed for %s: the primary moved to %s:%s, reconnecting",
                     self.prefix, *where)
            self._drop()
            self._retry_at = 0.0
        return True

    def _connect(self) -> bool:
        import redis

        target: dict[str, Any] = {}
        if self._locate is not None:
            where = self._locate()
            if where is None:  # not known afresh: a later check connects
                return False
            target = {"host": where[0], "port": where[1]}
        try:
            cls = {"Connection": redis.Connection, "SSLConnection": redis.SSLConnection,
                   "UnixDomainSocketConnection": redis.UnixDomainSocketConnection}[self._class]
            from redis.driver_info import DriverInfo

            given = {"driver_info": DriverInfo(lib_version=redis.__version__), **self._kwargs,
                     **target}
            conn = cls(**given, protocol=3)
            conn.connect()
            conn._parser.set_invalidation_push_handler(self._seen.invalidated)
            conn.send_command("CLIENT", "TRACKING", "ON", "BCAST", "PREFIX", self.prefix)
            conn.read_response()
        except Exception as exc:
            self._fail(exc)
            return False
        self._conn = conn
        self._address = (target["host"], target["port"]) if target else None
        self._pushes = Pushes(conn, tls=self._class == "SSLConnection")
        self._seen.forget()  # changes before now were not seen: older marks are worthless
        self._verified = time.monotonic()
        self._failures = 0
        return True

    def _fail(self, exc: BaseException) -> None:
        if self._failures == 0:
            log.info("change feed for %s unavailable (%s): the guard reads on every call",
                     self.prefix, exc)
        wait = RETRY_SECONDS[min(self._failures, len(RETRY_SECONDS) - 1)]
        self._failures += 1
        self._retry_at = time.monotonic() + wait
        self._drop()

    def _forked(self) -> None:
        """In a forked child: the parent's connection, lock and thread are not this
        process's."""
        self._lock = threading.Lock()
        self._wanted = threading.Event()
        self._checked = threading.Event()
        self._worker = None
        self._conn = None  # the parent's socket: neither read nor closed here
        self._pushes = None
        self._seen.forget()
        self._retry_at = 0.0

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        self._address = None
        self._pushes = None
        self._seen.forget()
        if conn is not None:
            try:
                conn.disconnect()
            except Exception:  # already broken
                log.debug("closing the change feed's connection failed", exc_info=True)


_FEEDS: weakref.WeakSet[ChangeFeed] = weakref.WeakSet()
KEEP_SECONDS = 30.0
"""How long the feed's thread keeps the feed verified after its last check on a loop."""
WAIT_SECONDS = 0.005
"""How long a check on an event loop waits for the feed's thread to connect or PING."""


def _verify(ref: weakref.ref[ChangeFeed], wanted: threading.Event) -> None:
    """The feed's thread: the blocking part of the checks made on an event loop (a PING,
    a reconnection), when asked and then every VERIFY_SECONDS / 2 while the feed is in
    use. It holds the feed only while checking: a feed dropped is closed at once."""
    while True:
        feed = ref()
        if feed is None or feed._wanted is not wanted:  # dropped, or forked
            return
        delay = feed._next_check()
        del feed
        if not wanted.wait(KEEP_SECONDS if delay is None else delay) and delay is None:
            return
        wanted.clear()
        feed = ref()
        if feed is None or feed.closed or feed._wanted is not wanted:
            return
        with feed._lock:
            feed._ready(VERIFY_SECONDS / 2)
            feed._slow = False
            feed._checked.set()
        del feed


def _after_fork() -> None:
    for feed in list(_FEEDS):
        feed._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def tracking_pool(client: Any) -> tuple[Mapping[str, Any], str] | None:
    """The connection arguments and class name of ``client``'s pool (redis-py, sync or
    asyncio), or None where tracking cannot work (fakeredis, a cluster client, an
    unknown connection class)."""
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if pool is None or not isinstance(kwargs, Mapping):
        return None
    if type(client).__module__.startswith("fakeredis") or "server" in kwargs:
        return None
    cls = getattr(pool, "connection_class", None)
    name = getattr(cls, "__name__", "")
    if name not in ("Connection", "SSLConnection", "UnixDomainSocketConnection"):
        return None
    return kwargs, name


def sentinel_target(client: Any) -> tuple[Mapping[str, Any], str, Locate] | None:
    """For a Sentinel client of this project (:mod:`shared.store.sentinel`, sync or
    asyncio): its pool's connection arguments (no address: ``locate`` gives it), the
    plain connection class to open, and its pool's ``primary_now``. None for others."""
    pool = getattr(client, "connection_pool", None)
    locate = getattr(pool, "primary_now", None)
    if not callable(locate):
        return None
    kwargs = getattr(pool, "connection_kwargs", {})
    cls = getattr(pool, "connection_class", object)
    tls = any(c.__name__ == "SSLConnection" for c in cls.__mro__)
    return kwargs, "SSLConnection" if tls else "Connection", locate


def feed_for(client: Any, prefix: str) -> ChangeFeed | None:
    """A feed on the same server as ``client`` (redis-py, sync or asyncio), or None where
    tracking cannot work (:func:`tracking_pool`). On a Sentinel client of this project,
    a feed that follows its pool's primary (:func:`sentinel_target`)."""
    located = sentinel_target(client)
    if located is not None:
        kwargs, name, locate = located
        return ChangeFeed(kwargs, prefix, connection_class=name, locate=locate)
    found = tracking_pool(client)
    if found is None:
        return None
    return ChangeFeed(found[0], prefix, connection_class=found[1])


__all__ = ["IO_TIMEOUT", "RETRY_SECONDS", "VERIFY_SECONDS", "ChangeFeed", "Locate", "feed_for",
           "feed_kwargs", "sentinel_target", "session_base", "tracking_pool"]
