"""The enqueue client: how the agent process asks the workers for a summary.

The guard never waits for a worker. It enqueues by task *name* (so the agent
process does not import ``workers``), and it coalesces: the store's pending
flag is set only if absent, and only the caller that set it publishes a
job. A burst of turns therefore leaves at most one queued job per session;
the worker clears the flag when it starts, so the next turn can enqueue
again.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit, urlunsplit

import redis
from kombu import serialization
from kombu.exceptions import OperationalError
from kombu.utils.json import dumps as json_dumps
from kombu.utils.uuid import uuid
from redis.backoff import NoBackoff
from redis.retry import Retry

from shared.core.errors import InvalidInput, StoreUnavailable
from shared.core.records import InlineJob
from shared.store.commands import rearmed
from shared.telemetry.propagation import publish_headers
from shared.telemetry.publish_log import log_republished, publish_failures

TASK_MAYBE_SUMMARIZE = "compaction.maybe_summarize"
TASK_COMPACT = "compaction.compact"
QUEUE = "compaction"

log = logging.getLogger(__name__)


class Enqueuer(Protocol):
    """Publishes a summarization job for one session."""

    def enqueue(self, tenant: str, session_id: str) -> None: ...


class CeleryEnqueuer:
    """Publishes through a Celery app (any broker), by task name.

    ``app`` is a ``celery.Celery`` configured for the broker; it need not
    know the task: jobs are published by name. On a Redis broker the job is
    written by :class:`RedisTaskPublisher` (the message ``send_task`` would
    write, in one LPUSH); elsewhere, or when the app's configuration needs
    Celery's full publish path (see :meth:`RedisTaskPublisher.for_app`), and
    whenever a ``before_task_publish``/``after_task_publish`` receiver is
    connected (tracing may add headers there) or the app registers the task
    (its options would apply), through ``send_task``.
    ``lean=False`` always uses ``send_task``.

    ``queue``: the workers' ``COMPACTION_QUEUE`` (the queue they consume without
    ``-Q``); they send a job's follow-up and recall index jobs back to the queue
    it came from.

    Safe to share between threads. A failed publish raises
    ``kombu.exceptions.OperationalError`` on either path.
    """

    def __init__(self, app: Any, *, queue: str = QUEUE, lean: bool = True) -> None:
        self.app = app
        self.queue = queue
        self.publisher = RedisTaskPublisher.for_app(app, queue) if lean else None
        self._signals = _publish_signals()
        self._registry: Any = getattr(app, "_tasks", {})  # what send_task looks in, unfinalized

    def _lean(self) -> RedisTaskPublisher | None:
        """The lean publisher, when ``send_task`` would write the same message now."""
        before, after = self._signals
        if (self.publisher is not None and not (before.receivers or after.receivers)
                and TASK_MAYBE_SUMMARIZE not in self._registry):
            return self.publisher
        return None

    def enqueue(self, tenant: str, session_id: str) -> None:
        args, kwargs = [session_id], {"tenant": tenant}
        publisher = self._lean()
        if publisher is not None:
            publisher.publish(TASK_MAYBE_SUMMARIZE, args, kwargs)
            return
        self.app.send_task(TASK_MAYBE_SUMMARIZE, args=args, kwargs=kwargs, queue=self.queue,
                           ignore_result=True, headers=publish_headers() or None)  # telemetry

    def inline_job(self, tenant: str, session_id: str,
                   server: tuple[Any, ...] | None) -> InlineJob | None:
        """The job as an :class:`~shared.core.records.InlineJob` for an append on
        ``server`` (:func:`redis_server`), when the broker is that Redis server (any
        database) and the lean message is faithful; else None (the caller publishes with
        :meth:`enqueue`)."""
        publisher = self._lean()
        if publisher is None or server is None or publisher.server is None \
                or publisher.server[:3] != server[:3]:
            return None
        _, data = publisher.message(TASK_MAYBE_SUMMARIZE, [session_id], {"tenant": tenant})
        return InlineJob(publisher.key, data, int(publisher.server[3]), int(server[3]))

    def close(self) -> None:
        """Release the lean publisher's broker connections (``send_task``'s are the app's)."""
        if self.publisher is not None:
            self.publisher.close()


# Broker URL schemes kombu's Redis transport serves and redis-py parses the same way.
_REDIS_SCHEMES = ("redis", "rediss")
# Transport options that leave a priority-0 LPUSH to the queue's own key unchanged (the
# rest only concern consumers). Any other option sends the app through ``send_task``.
_HARMLESS_TRANSPORT_OPTIONS = frozenset({
    "socket_timeout", "socket_connect_timeout", "global_keyprefix", "visibility_timeout",
    "unacked_restore_interval", "unacked_restore_throttle", "polling_interval",
    "health_check_interval", "max_connections", "retry_on_timeout", "socket_keepalive",
    "queue_order_strategy", "fanout_prefix", "fanout_patterns"})
_DELIVERY_MODES = {"transient": 1, "persistent": 2}
_RETRYABLE = (redis.ConnectionError, redis.TimeoutError)
# Where a cached message's task id and delivery tag go: uuid4 text of this process's own.
_ID_MARK, _TAG_MARK = uuid().encode(), uuid().encode()


def redis_server(client: Any) -> tuple[Any, ...] | None:
    """Which Redis server and database a redis-py client (sync or asyncio) talks to:
    (host, port, unix socket path, db), or None when that is not one server (a Cluster,
    a Sentinel pool, a client of another kind). Equal names only: ``localhost`` and
    ``127.0.0.1`` differ, which only costs the inline job."""
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    connection = getattr(pool, "connection_class", None)
    if not isinstance(kwargs, dict) or type(pool).__name__ not in {
            "ConnectionPool", "BlockingConnectionPool", "FairConnectionPool",
            "AsyncFairConnectionPool"} \
            or not getattr(connection, "__module__", "").startswith("redis."):
        return None  # fakeredis, say: its "server" is in this process
    return (kwargs.get("host"), kwargs.get("port"), kwargs.get("path"), kwargs.get("db", 0))


def _publish_signals() -> tuple[Any, Any]:
    """Celery's publish signals: only ``send_task`` fires them, so listeners need it."""
    from celery import signals

    return signals.before_task_publish, signals.after_task_publish


@dataclass(frozen=True)
class _PublishRetry:
    """The app's ``task_publish_retry_policy``, as ``send_task`` would apply it."""

    retries: int
    start: float
    step: float
    ceiling: float

    def wait(self, attempt: int) -> float:
        return min(self.ceiling, self.start + self.step * attempt)


class RedisTaskPublisher:
    """Writes a Celery task message to a Redis broker in one LPUSH.

    Why: ``send_task`` spends about 0.6 ms of CPU per job in Celery and
    kombu (producer pool, router, a redis-py client object per publish,
    several message layers) around a single LPUSH; on the agent's hot path
    that was more than half of ``record_turn``.

    The message is the one ``send_task`` writes for a publisher app (no
    local task, no routes, protocol 2): headers, properties and body come
    from Celery's own ``app.amqp.as_task_v2``, the body is serialized by
    kombu's registry and wrapped the way kombu's Redis channel does
    (base64 body, ``delivery_info``, a ``delivery_tag``), then pushed to the
    queue's key (plus ``global_keyprefix``). Like ``send_task`` for a queue
    on a direct exchange, it uses the anonymous exchange and routes by
    queue name, so it neither looks up nor declares bindings. A worker
    cannot tell the two apart (``tests/test_enqueue.py`` compares them byte
    for byte and runs a real worker on the result).

    Failures: connection errors and timeouts are retried as the app's
    publish retry policy says (``publisher_app``: once, after 0.1 s), each
    attempt bounded by the broker socket timeouts; then, like
    ``send_task``, ``kombu.exceptions.OperationalError``. redis-py's own
    retries are off so that this bound holds. A retry after a timeout may
    queue the job twice (the first LPUSH may have landed), as ``send_task``
    may: a duplicate ``maybe_summarize`` is harmless (lease and
    compare-and-swap). Thread-safe: redis-py's connection pool hands each
    thread its own connection (and starts afresh in a forked child).
    """

    def __init__(self, app: Any, queue: str, url: str, *, key_prefix: str = "",
                 socket_timeout: float | None = None,
                 connect_timeout: float | None = None) -> None:
        if not queue:
            raise InvalidInput("must be a non-empty queue name", field="queue")
        conf = app.conf
        policy = dict(conf.task_publish_retry_policy or {})
        self.retry = _PublishRetry(
            retries=int(policy.get("max_retries") or 0) if conf.task_publish_retry else 0,
            start=float(policy.get("interval_start", 0)),
            step=float(policy.get("interval_step", 0.2)),
            ceiling=float(policy.get("interval_max", 0.2)))
        self.amqp = app.amqp
        self.app = app
        self.queue = queue
        self.key = key_prefix + queue
        target = app.amqp.queues[queue]
        mode = target.exchange.delivery_mode or conf.task_default_delivery_mode
        self.delivery_mode = _DELIVERY_MODES.get(mode, mode)
        self.client = redis.Redis.from_url(
            url, socket_timeout=socket_timeout, socket_connect_timeout=connect_timeout,
            retry=Retry(NoBackoff(), 0))
        self.server = redis_server(self.client)
        maxlevels = conf.task_repr_maxlevels
        self._reprs = functools.lru_cache(maxsize=4096)(functools.partial(
            _reprs, self.amqp.argsrepr_maxsize, self.amqp.kwargsrepr_maxsize, maxlevels))
        self._template = functools.lru_cache(maxsize=4096)(self._template_of)

    @classmethod
    def for_app(cls, app: Any, queue: str) -> RedisTaskPublisher | None:
        """A publisher for ``app``'s broker, or None when only ``send_task`` is faithful.

        None unless: one plain ``redis://``/``rediss://`` broker URL (no
        failover list, no ``broker_use_ssl``), only transport options listed
        in ``_HARMLESS_TRANSPORT_OPTIONS``, JSON without compression,
        protocol 2, no task-sent events, no task routes (they may add message
        options), and the queue on a direct exchange.
        :class:`CeleryEnqueuer` also checks, per job, what ``send_task``
        checks per job: whether the task is registered in the app (its
        options would apply) and whether publish signals have listeners.
        """
        conf = app.conf
        url = conf.broker_write_url or conf.broker_url
        options = dict(conf.broker_transport_options or {})
        if (not isinstance(url, str) or ";" in url
                or urlsplit(url).scheme not in _REDIS_SCHEMES or conf.broker_use_ssl
                or set(options) - _HARMLESS_TRANSPORT_OPTIONS
                or conf.task_serializer != "json" or conf.task_compression
                or conf.task_protocol != 2 or conf.task_send_sent_event or conf.task_routes):
            return None
        try:
            target = app.amqp.queues[queue]
        except KeyError:  # task_create_missing_queues off and the queue not configured
            return None
        if target.exchange.type != "direct":
            return None
        timeout = conf.broker_connection_timeout
        return cls(app, queue, url, key_prefix=str(options.get("global_keyprefix", "")),
                   socket_timeout=options.get("socket_timeout", timeout),
                   connect_timeout=options.get("socket_connect_timeout", timeout))

    def message(self, name: str, args: list[Any], kwargs: dict[str, Any]) -> tuple[str, bytes]:
        """(task id, the bytes kombu's Redis channel would LPUSH for this job)."""
        task_id, tag = uuid(), uuid()
        extra = publish_headers()  # telemetry: traceparent, sent-at (often none)
        if not extra:
            # A session's jobs differ only by their two ids: its message is made once,
            # with marks where the ids go (same length and alphabet, so byte for byte).
            with contextlib.suppress(TypeError):  # unhashable arguments: made in full
                template = self._template(self.app.thread_oid, name, tuple(args),
                                          tuple(kwargs.items()))
                return task_id, template.replace(_ID_MARK, task_id.encode()).replace(
                    _TAG_MARK, tag.encode())
        return task_id, self._made(name, args, kwargs, extra, task_id, tag, self.app.thread_oid)

    def _made(self, name: str, args: list[Any], kwargs: dict[str, Any],
              extra: dict[str, Any], task_id: str, tag: str, reply_to: str) -> bytes:
        reprs: tuple[str | None, str | None] = (None, None)  # None: Celery makes them
        with contextlib.suppress(TypeError):  # unhashable arguments
            # the same text as Celery's saferepr of them, made once per session
            reprs = self._reprs(tuple(args), tuple(kwargs.items()))
        argsrepr, kwargsrepr = reprs
        headers, properties, body, _ = self.amqp.as_task_v2(
            task_id, name, args, kwargs, reply_to=reply_to, ignore_result=True,
            argsrepr=argsrepr, kwargsrepr=kwargsrepr)
        headers.update(extra)
        content_type, content_encoding, payload = serialization.dumps(  # type: ignore[no-untyped-call]
            body, "json")
        raw = payload.encode() if isinstance(payload, str) else payload
        properties.update(
            delivery_mode=self.delivery_mode,
            delivery_info={"exchange": "", "routing_key": self.queue},
            priority=0, body_encoding="base64", delivery_tag=tag)
        envelope = {"body": base64.b64encode(raw).decode("ascii"),
                    "content-encoding": content_encoding, "content-type": content_type,
                    "headers": headers, "properties": properties}
        text: str = json_dumps(envelope)  # type: ignore[no-untyped-call]
        return text.encode()

    def _template_of(self, reply_to: str, name: str, args: tuple[Any, ...],
                     items: tuple[tuple[str, Any], ...]) -> bytes:
        return self._made(name, list(args), dict(items), {}, _ID_MARK.decode(),
                          _TAG_MARK.decode(), reply_to)

    def publish(self, name: str, args: list[Any], kwargs: dict[str, Any]) -> str:
        """Push one job, return its task id; ``OperationalError`` once the retries are spent."""
        task_id, data = self.message(name, args, kwargs)
        attempt = 0
        while True:
            try:
                self.client.lpush(self.key, data)
                return task_id
            except _RETRYABLE as exc:
                if attempt >= self.retry.retries:
                    raise OperationalError(f"broker unreachable: {exc}") from exc
                time.sleep(self.retry.wait(attempt))
                attempt += 1
            except redis.RedisError as exc:
                raise OperationalError(f"broker refused the job: {exc}") from exc

    def close(self) -> None:
        """Disconnect the pool; a later publish connects again."""
        self.client.close()


def _reprs(args_max: int, kwargs_max: int, maxlevels: int, args: tuple[Any, ...],
           items: tuple[tuple[str, Any], ...]) -> tuple[str, str]:
    """The ``argsrepr``/``kwargsrepr`` headers ``as_task_v2`` would make (saferepr)."""
    from celery.utils.saferepr import saferepr

    return (saferepr(list(args), args_max, maxlevels=maxlevels),
            saferepr(dict(items), kwargs_max, maxlevels=maxlevels))


class CallbackEnqueuer:
    """Hands the job to a callable (embedded demo, tests, custom queues)."""

    def __init__(self, callback: Callable[[str, str], None]) -> None:
        self.callback = callback

    def enqueue(self, tenant: str, session_id: str) -> None:
        self.callback(tenant, session_id)


class NullEnqueuer:
    """Enqueues nothing: for guards that run without workers (recovery still works)."""

    def enqueue(self, tenant: str, session_id: str) -> None:
        return None


def tls_verified(url: str) -> str:
    """``url`` (each URL of a ``;`` failover list) with ``ssl_cert_reqs=required`` added
    to a ``rediss://`` URL that names no ``ssl_cert_reqs``. Without it kombu connects to
    the broker without checking the server's certificate ("defaulting to insecure SSL
    behaviour"), where redis-py, the store's client, checks it. A URL that names one,
    ``ssl_cert_reqs=none`` included, is kept as it is."""
    parts = []
    for part in url.split(";"):
        split = urlsplit(part)
        if split.scheme.lower() == "rediss" and "ssl_cert_reqs" not in parse_qs(split.query):
            query = "&".join(q for q in (split.query, "ssl_cert_reqs=required") if q)
            part = urlunsplit(split._replace(query=query))
        parts.append(part)
    return ";".join(parts)


_TEXT_ONLY_TLS = frozenset({"ssl_min_version", "ssl_include_verify_flags",
                            "ssl_exclude_verify_flags"})
"""Options kombu hands to redis-py as the URL's text (it converts only ``ssl_cert_reqs``
and ``ssl_check_hostname``): redis-py cannot use them so."""


def sentinel_broker_tls(broker_url: str) -> dict[str, Any] | None:
    """The TLS keywords of a ``sentinel://`` broker list whose URLs carry ``ssl_*`` options
    (as a ``rediss://`` URL does), None without any (or another scheme).

    kombu reads the options of the first URL only and drops them when it moves on to the
    next one: every URL carries the same ones, or only the first. :class:`InvalidInput`
    (field ``url``) otherwise, or naming a bad option (:func:`shared.store.tls.tls_options`)."""
    from shared.store.tls import is_tls_option, tls_options

    parts = broker_url.split(";")
    if not all(p.lower().startswith("sentinel://") for p in parts):
        return None
    queries = [{k: v for k, v in parse_qs(urlsplit(p).query).items() if is_tls_option(k)}
               for p in parts]
    if not any(queries):
        return None
    if any(q and q != queries[0] for q in queries[1:]):
        raise InvalidInput("the sentinel:// URLs carry different ssl_* options: give them "
                           "on the first URL only, or the same on every one", field="url")
    text_only = sorted(_TEXT_ONLY_TLS.intersection(queries[0]))
    if text_only:
        raise InvalidInput(f"{', '.join(text_only)}: not supported on a sentinel:// broker "
                           "(kombu passes it on as text)", field="url")
    return tls_options(queries[0])


def sentinel_options(master_name: str | None, broker_url: str = "", *,
                     timeout: float = 5.0) -> dict[str, Any]:
    """The transport options a ``sentinel://`` broker needs: the service the Sentinels
    monitor (kombu's ``master_name``); nothing without one. Over TLS
    (:func:`sentinel_broker_tls`) also the Sentinels' own connection options (kombu's
    ``sentinel_kwargs``: without them it reaches the Sentinels in plain TCP, with only
    the data nodes on TLS), with ``timeout`` for their sockets as for the nodes'. The data
    nodes' TLS is Celery's ``broker_use_ssl``: the same keywords."""
    if not master_name:
        return {}
    tls = sentinel_broker_tls(broker_url)
    if tls is None:
        return {"master_name": master_name}
    return {"master_name": master_name, "sentinel_kwargs": {
        "ssl": True, **tls, "socket_timeout": timeout, "socket_connect_timeout": timeout}}


def publisher_app(broker_url: str, *, timeout: float = 1.0,
                  sentinel_master: str | None = None) -> Any:
    """A minimal Celery app for the agent side: publish only, bounded time.

    Publishing retries are kept short (the hot path must not stall on a
    broker hiccup): one retry after 0.1 s, and a bounded connection timeout.
    A missed enqueue is harmless: the next turn enqueues again. A ``rediss://`` broker's
    certificate is checked (:func:`tls_verified`). A Redis Sentinel broker: kombu's
    ``sentinel://h1:26379/<db>;sentinel://h2:26379/<db>`` URL and the ``sentinel_master``
    the Sentinels monitor (jobs then go through ``send_task``); ``ssl_*`` options on it
    put the Sentinels and the data nodes on TLS (:func:`sentinel_options`).
    """
    from celery import Celery

    app = Celery("compaction-agent", broker=tls_verified(broker_url), set_as_current=False)
    app.conf.update(
        broker_connection_timeout=timeout,
        broker_connection_retry_on_startup=False,
        task_publish_retry=True,
        task_publish_retry_policy={"max_retries": 1, "interval_start": 0.1,
                                   "interval_step": 0.1, "interval_max": 0.1},
        task_serializer="json",
        broker_transport_options={"socket_timeout": timeout, "socket_connect_timeout": timeout,
                                  **sentinel_options(sentinel_master, broker_url,
                                                     timeout=timeout)},
    )
    tls = sentinel_broker_tls(broker_url) if sentinel_master else None
    if tls is not None:  # kept when kombu moves to the list's next URL (the URL's are not)
        app.conf.broker_use_ssl = tls
    return app


def request_summary(store: Any, enqueuer: Enqueuer, session_id: str) -> bool:
    """Enqueue a job unless one is already pending. True when a job was published.

    If publishing fails the pending flag is cleared again, so that the next
    turn retries instead of waiting for the flag to expire.
    """
    marked = store.mark_pending(session_id)
    if not marked:
        return False
    if rearmed(marked):  # a stale flag re-armed: its job was lost
        log_republished(session_id)
    return publish_marked(store, enqueuer, session_id)


def publish_marked(store: Any, enqueuer: Enqueuer, session_id: str) -> bool:
    """Publish the job for a session whose pending flag this caller just set (see
    :func:`request_summary`); on failure the flag is cleared again."""
    try:
        enqueuer.enqueue(store.tenant, session_id)
    except Exception as exc:
        with contextlib.suppress(StoreUnavailable):
            store.clear_pending(session_id)
        publish_failures.failed(session_id, exc)  # the first of an outage, then 1/min
        return False
    publish_failures.published()
    return True


__all__ = [
    "QUEUE",
    "TASK_COMPACT",
    "TASK_MAYBE_SUMMARIZE",
    "CallbackEnqueuer",
    "CeleryEnqueuer",
    "Enqueuer",
    "NullEnqueuer",
    "RedisTaskPublisher",
    "publish_marked",
    "publisher_app",
    "redis_server",
    "request_summary",
    "sentinel_broker_tls",
    "sentinel_options",
    "tls_verified",
]
