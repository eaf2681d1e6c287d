"""``compaction doctor``: is the deployment able to compact?

Checks, each with one verdict line (OK / WARN / FAIL) and every one bounded
by ``--timeout``: the Redis store (reachable, version, latency, eviction
policy: anything but ``noeviction`` evicts sessions' keys one at a time),
whether a warm guard can skip its reads there (client tracking), the
broker (reachable, ``maxmemory-policy``: anything but
``noeviction`` may silently drop queued jobs), the queue length, the
workers (Celery ``control.ping``, and whether they consume the queue,
``COMPACTION_QUEUE``), this host's clock against the store's (a WARN beyond
1 s), and the summarizer (a ``models.list()`` for OpenAI-compatible servers,
a ``countTokens`` call for Vertex / Gemini, a note for the offline summarizer).
A server that does not serve ``GET /models`` (404, 405, 501: some gateways
restrict it) is a WARN, not a FAIL: the workers only call chat completions,
and checking those would cost a billed call; a rejected key (401, 403) or an
unreachable host stays a FAIL.
Exit status 0 only if nothing FAILs.

A check never raises: whatever goes wrong becomes its FAIL line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

import redis
from rich.console import Console
from rich.markup import escape

from shared.core.errors import StoreUnavailable
from shared.enqueue import QUEUE, publisher_app, sentinel_broker_tls, sentinel_options
from shared.store.sentinel import is_sentinel_url
from workers.cli._common import connection_trouble, working
from workers.cli._format import extra_for, needs_extra
from workers.server.config import load_server_config
from workers.settings import Settings
from workers.store_client import store_client
from workers.urls import redact_url

Verdict = Literal["OK", "WARN", "FAIL"]
STYLES = {"OK": "bold green", "WARN": "bold dark_orange", "FAIL": "bold red"}
# kombu's Redis transport keeps one list per priority step: "compaction", "compaction\x06\x163"...
KOMBU_PRIORITY_SEP = "\x06\x16"
KOMBU_PRIORITY_STEPS = (3, 6, 9)
PINGS = 5
MEMORY_BROKER = "memory://"  # the embedded stack's in-process broker
# the Procfile's worker (tests/test_deploy.py: the same as README's, compose's and the image's)
WORKER_COMMAND = "celery -A workers.app worker --pool threads --concurrency 32 --loglevel INFO -E"


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    verdict: Verdict
    detail: str


def _timeout(text: str) -> float:
    value = float(text)
    if not 0 < value <= 60:
        raise argparse.ArgumentTypeError(f"must be in (0, 60] seconds (got {value})")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--timeout", type=_timeout, default=2.0,
                        help="seconds allowed to each network check (default 2)")
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")


def _guarded(name: str, check: Callable[[], Check]) -> Check:
    try:
        return check()
    except ModuleNotFoundError as exc:
        extra = extra_for(exc)
        if extra is None:
            return Check(name, "FAIL", f"{type(exc).__name__}: {exc}")
        return Check(name, "FAIL", needs_extra(f"checking the {name}", extra))
    except Exception as exc:
        return Check(name, "FAIL", f"{type(exc).__name__}: {exc}")


def _is_redis(url: str) -> bool:
    return url.split("://", 1)[0] in ("redis", "rediss", "unix")


def _redis_client(url: str, timeout: float) -> Any:
    return redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                retry_on_timeout=False)


def _eviction_policy(client: Any) -> str | None:
    try:
        policy = client.config_get("maxmemory-policy").get("maxmemory-policy")
    except redis.exceptions.ResponseError:  # CONFIG disabled (managed Redis)
        return None
    return str(policy) if policy is not None else None


# -- store -------------------------------------------------------------------------------
def check_store(settings: Settings) -> Check:
    name, url = "redis store", settings.redis_url
    try:
        client = store_client(settings)
    except ValueError as exc:
        return Check(name, "FAIL", f"invalid COMPACTION_REDIS_URL {redact_url(url)!r}: {exc}")
    except StoreUnavailable as exc:
        return Check(name, "FAIL", f"cannot reach the Redis Cluster at {redact_url(url)}: "
                                   f"{exc.__cause__ or exc}")
    try:
        timings = []
        for _ in range(PINGS):
            started = time.perf_counter()
            client.ping()
            timings.append((time.perf_counter() - started) * 1000)
        version = client.info("server").get("redis_version", "?")
        policy = _eviction_policy(client)
        if settings.redis_cluster:
            version = f"{version} (Cluster, {len(client.get_primaries())} primaries)"
    except redis.exceptions.RedisError as exc:
        return Check(name, "FAIL", connection_trouble(url, exc))
    finally:
        client.close()
    detail = (f"{redact_url(url)}: Redis {version}, ping {statistics.median(timings):.2f} ms "
              f"(median of {PINGS}), key prefix {settings.key_prefix!r}, tenant "
              f"{settings.tenant!r}")
    if policy is not None and policy != "noeviction":
        # Eviction takes a session's keys one at a time (TTLs expire them together): a
        # session that lost its log starts afresh, its history lost (SessionDamaged).
        return Check(name, "WARN", f"{detail}; maxmemory-policy {policy}: under memory "
                                   "pressure Redis evicts sessions' keys one at a time, and "
                                   "a session whose log is evicted starts afresh, its "
                                   "history lost (use noeviction, and "
                                   "COMPACTION_SESSION_TTL_SECONDS to bound memory)")
    return Check(name, "OK", detail + (f", maxmemory-policy {policy}" if policy else ""))


CLOCK_SKEW_WARN_SECONDS = 1.0
"""This host's clock against the store's ``TIME``: beyond this a WARN. Hosts compare wall
clocks in a few places: a job's queue lag (publisher's send time, worker's clock), a
retry's countdown (an ETA another worker may hold) and kombu's redelivery of unacknowledged
jobs (the visibility timeout, with a 30 s margin)."""


def _wall_clock() -> float:
    """This host's wall clock (a function of its own, so a test can move it)."""
    return time.time()


def check_clock(settings: Settings) -> Check:
    """How far this host's clock is from the store's (Redis ``TIME``, half the round trip
    as the margin): the hosts of a deployment are compared through one reference."""
    name = "clock"
    client = store_client(settings)
    try:
        before = _wall_clock()
        reply = client.time()
        after = _wall_clock()
    except redis.exceptions.RedisError as exc:  # TIME refused (an ACL): nothing compared
        return Check(name, "WARN", f"not checked: Redis TIME failed: {exc}")
    finally:
        client.close()
    if isinstance(reply, dict):  # a cluster client answers by node
        reply = next(iter(reply.values()))
    seconds, micros = reply
    offset = (int(seconds) + int(micros) / 1e6) - (before + after) / 2
    margin = (after - before) / 2
    ahead = "behind" if offset > 0 else "ahead of"
    detail = f"this host is {abs(offset):.3f} s {ahead} the store's clock (± {margin:.3f} s)"
    if abs(offset) - margin > CLOCK_SKEW_WARN_SECONDS:
        return Check(name, "WARN", f"{detail}: queue-lag figures and retry delays are off by "
                                   "as much, and beyond 30 s kombu redelivers jobs early or "
                                   "late; sync the clocks (NTP)")
    return Check(name, "OK", detail)


def check_tracking(settings: Settings) -> Check:
    """Whether a warm guard can skip its reads here: the change feed (``CLIENT TRACKING``
    in broadcast mode) and the own-writes connection (default mode, ``NOLOOP``, its probe
    passed). Without them the guard works, reading on every call: a WARN."""
    from shared.store.changes import feed_for
    from shared.store.own_writes import own_writes_for

    name = "guard reads"
    if settings.redis_cluster:
        return Check(name, "WARN", "client tracking is off on a Redis Cluster: every prepare "
                                   "reads the session (one round trip)")
    try:
        client = store_client(settings)
    except (ValueError, StoreUnavailable) as exc:
        return Check(name, "WARN", f"not checked: {exc}")
    if is_sentinel_url(settings.redis_url):
        try:  # the pool asks the Sentinels: the feed and own writes go where it names
            client.ping()
        except Exception as exc:  # any failure is this check's verdict
            client.close()
            return Check(name, "WARN", f"not checked: {exc}")
    feed = feed_for(client, f"{settings.key_prefix}:{{{settings.tenant}:")
    own = own_writes_for(client, f"{settings.key_prefix}:")
    try:
        feed_ok = feed is not None and feed.mark() is not None
        own_ok = own is not None and bool(own.warm_up())
        probe = own.state.usable if own is not None else None
    finally:
        for closing in (feed, own):
            if closing is not None:
                closing.close()
        client.close()
    if feed_ok and own_ok:
        return Check(name, "OK", "change feed and own-writes connection work (CLIENT TRACKING; "
                                 "the probe passed): a warm guard reads only what others wrote")
    missing = [what for what, ok in (("change feed", feed_ok), ("own-writes connection", own_ok))
               if not ok]
    why = ("the server failed the own-writes probe" if probe is False else
           "CLIENT TRACKING refused or unreachable (the guard's user needs the client command)")
    return Check(name, "WARN", f"no {' or '.join(missing)}: {why}; the guard reads the "
                               "session on every call, or after its own appends")


# -- broker and queue ----------------------------------------------------------------------
def check_broker(settings: Settings, timeout: float) -> list[Check]:
    """Broker, queue length and workers; the last two only if the broker answers."""
    url = settings.broker_url
    if url.startswith(MEMORY_BROKER):
        return [Check("broker", "FAIL", "memory:// lives inside one process: deployed workers "
                                        "need a real broker (COMPACTION_BROKER_URL)")]
    master = settings.broker_sentinel_master
    broker = _guarded("broker", lambda: _broker_redis(url, timeout) if _is_redis(url)
                      else _broker_kombu(url, timeout, master))
    if broker.verdict == "FAIL":
        return [broker, Check("queue", "FAIL", "broker unreachable"),
                Check("workers", "FAIL", "broker unreachable")]
    queue = _guarded("queue", lambda: _queue_length(url, settings.queue, timeout, master))
    workers = _guarded("workers", lambda: check_workers(url, timeout, settings.queue, master))
    return [broker, queue, workers]


def _broker_redis(url: str, timeout: float) -> Check:
    client = _redis_client(url, timeout)
    try:
        client.ping()
        version = client.info("server").get("redis_version", "?")
        policy = _eviction_policy(client)
    except redis.exceptions.RedisError as exc:
        return Check("broker", "FAIL", f"cannot reach the broker at {redact_url(url)}: {exc}")
    finally:
        client.close()
    detail = f"{redact_url(url)}: Redis {version}"
    if policy is None:
        return Check("broker", "WARN", f"{detail}; cannot read maxmemory-policy (CONFIG "
                                       "disabled?): it must be noeviction")
    if policy != "noeviction":
        return Check("broker", "WARN", f"{detail}; maxmemory-policy {policy}: Redis may evict "
                                       "queued jobs under memory pressure, use noeviction")
    return Check("broker", "OK", f"{detail}, maxmemory-policy noeviction")


def _kombu_connection(url: str, timeout: float, master: str | None = None) -> Any:
    """A kombu connection for non-Redis brokers (kombu ships no annotations); ``master``:
    the service of a ``sentinel://`` broker."""
    from kombu.connection import Connection

    return Connection(url, connect_timeout=timeout,  # type: ignore[no-untyped-call]
                      ssl=(sentinel_broker_tls(url) or False) if master else False,
                      transport_options=sentinel_options(master, url, timeout=timeout))


def _broker_kombu(url: str, timeout: float, master: str | None = None) -> Check:
    with _kombu_connection(url, timeout, master) as conn:
        try:
            conn.ensure_connection(max_retries=1, timeout=timeout)
        except Exception as exc:  # kombu's OperationalError and transport errors
            return Check("broker", "FAIL", f"cannot reach the broker at {redact_url(url)}: {exc}")
        return Check("broker", "OK", f"{redact_url(url)}: reachable ({conn.transport_cls})")


def _queue_length(url: str, queue: str, timeout: float, master: str | None = None) -> Check:
    if _is_redis(url):
        client = _redis_client(url, timeout)
        try:
            names = [queue] + [f"{queue}{KOMBU_PRIORITY_SEP}{p}" for p in KOMBU_PRIORITY_STEPS]
            length = sum(int(client.llen(n)) for n in names)
        finally:
            client.close()
    elif url.startswith("sentinel://"):  # kombu's Redis lists, on the primary it finds
        with _kombu_connection(url, timeout, master) as conn:
            client = conn.default_channel.client
            names = [queue] + [f"{queue}{KOMBU_PRIORITY_SEP}{p}" for p in KOMBU_PRIORITY_STEPS]
            length = sum(int(client.llen(n)) for n in names)
    else:
        with _kombu_connection(url, timeout, master) as conn:
            declared = conn.default_channel.queue_declare(queue, passive=True)
            length = int(declared.message_count)
    return Check("queue", "OK", f"{length} job(s) waiting in {queue!r}")


def _start_hint(queue: str) -> str:
    """The Procfile's command (it has no ``-Q``: a worker consumes ``COMPACTION_QUEUE``)."""
    where = "" if queue == QUEUE else f", with COMPACTION_QUEUE={queue}"
    return f"start one as the Procfile does: {WORKER_COMMAND}{where}"


def check_workers(url: str, timeout: float, queue: str = QUEUE,
                  sentinel_master: str | None = None) -> Check:
    app = publisher_app(url, timeout=timeout, sentinel_master=sentinel_master)
    try:
        replies = app.control.ping(timeout=timeout) or []
        names = sorted(name for reply in replies for name in reply)
        if not names:
            return Check("workers", "FAIL", f"no worker answered within {timeout:g} s "
                                            f"({_start_hint(queue)})")
        queues = app.control.inspect(destination=names, timeout=timeout,
                                     limit=len(names)).active_queues() or {}
    finally:
        app.close()
    idle = [n for n in names if queue not in {q.get("name") for q in queues.get(n, [])}]
    detail = f"{len(names)} online: {', '.join(names)}"
    if idle:  # none consuming it: no job published there ever runs
        said = f"{detail}; not consuming {queue!r}: {', '.join(idle)}"
        return Check("workers", "FAIL", said) if len(idle) == len(names) else \
            Check("workers", "WARN", said)
    return Check("workers", "OK", detail)


# -- summarizer ------------------------------------------------------------------------------
MODEL_LIST_UNSUPPORTED = frozenset({404, 405, 501})
"""Statuses of a GET /models the server does not serve: WARN (cannot verify), not FAIL."""


def check_summarizer(settings: Settings, timeout: float) -> Check:
    kind = settings.summarizer
    if kind == "offline":
        return Check("summarizer", "OK", "offline: no LLM configured (extractive summaries)")
    if kind == "openai":
        return _guarded("summarizer", lambda: _openai(settings, timeout))
    return _guarded("summarizer", lambda: _gemini(settings, timeout))


def _openai(settings: Settings, timeout: float) -> Check:
    import openai

    key = settings.summarizer_api_key.get_secret_value() if settings.summarizer_api_key else None
    client = openai.OpenAI(api_key=key or "unused", base_url=settings.summarizer_base_url,
                           timeout=timeout, max_retries=0)
    where = redact_url(str(client.base_url))
    model = settings.summarizer_model_name
    try:
        ids = [m.id for m in client.models.list()]
    except openai.AuthenticationError as exc:
        return Check("summarizer", "FAIL", f"openai at {where}: API key rejected ({exc.message})")
    except openai.APIStatusError as exc:
        if exc.status_code in MODEL_LIST_UNSUPPORTED:
            # Gateways (LiteLLM, vLLM behind a proxy...) may not serve GET /models while
            # chat completions work; a completion to check it would be billed.
            return Check("summarizer", "WARN", f"openai at {where}: cannot verify the model "
                                               f"list: GET /models answered HTTP "
                                               f"{exc.status_code} ({exc.message}); chat "
                                               "completions not checked (a call is billed); "
                                               "check COMPACTION_SUMMARIZER_BASE_URL if this "
                                               "server should list models")
        return Check("summarizer", "FAIL", f"openai at {where}: HTTP {exc.status_code}: "
                                           f"{exc.message}")
    except openai.APIConnectionError as exc:
        return Check("summarizer", "FAIL", f"openai at {where}: cannot connect ({exc})")
    finally:
        client.close()
    detail = f"openai at {where}: {len(ids)} model(s) listed"
    if model not in ids:
        return Check("summarizer", "WARN", f"{detail}, but not {model!r} "
                                           "(COMPACTION_SUMMARIZER_MODEL)")
    return Check("summarizer", "OK", f"{detail}, {model!r} among them")


def _gemini(settings: Settings, timeout: float) -> Check:
    from google import genai
    from google.genai import errors, types

    key = settings.summarizer_api_key.get_secret_value() if settings.summarizer_api_key else None
    options = types.HttpOptions(timeout=int(timeout * 1000), base_url=settings.summarizer_base_url,
                                retry_options=types.HttpRetryOptions(attempts=1))
    if settings.summarizer == "vertex":
        client = genai.Client(vertexai=True, project=settings.vertex_project,
                              location=settings.vertex_location, http_options=options)
        where = f"vertex {settings.vertex_project}/{settings.vertex_location}"
    else:
        client = genai.Client(api_key=key, http_options=options)
        where = f"gemini API at {redact_url(settings.summarizer_base_url)}" \
            if settings.summarizer_base_url else "gemini API"
    model = settings.summarizer_model_name
    try:
        counted = client.models.count_tokens(model=model, contents="ping")
    except errors.APIError as exc:
        what = "API key rejected" if exc.code in (401, 403) or "API_KEY" in str(exc) \
            else f"HTTP {exc.code}"
        return Check("summarizer", "FAIL", f"{where}: {what}: {exc.message or exc.status}")
    except Exception as exc:  # httpx's connection errors and timeouts (not an API answer)
        return Check("summarizer", "FAIL", f"{where}: cannot connect "
                                           f"({type(exc).__name__}: {exc})")
    return Check("summarizer", "OK", f"{where}: countTokens on {model!r} answered "
                                     f"({counted.total_tokens} tokens)")


# -- the command -------------------------------------------------------------------------------
def run_checks(settings: Settings, timeout: float) -> list[Check]:
    store = _guarded("redis store", lambda: check_store(settings))
    # with no store to reach, client tracking cannot be told refused from unreachable
    if store.verdict == "FAIL":
        tracking = Check("guard reads", "WARN", "not checked: the store is not reachable")
        clock = Check("clock", "WARN", "not checked: the store is not reachable")
    else:
        tracking = _guarded("guard reads", lambda: check_tracking(settings))
        clock = _guarded("clock", lambda: check_clock(settings))
    return [store, tracking, clock, *check_broker(settings, timeout),
            check_summarizer(settings, timeout)]


def run(args: argparse.Namespace, settings: Settings) -> int:
    # `compaction serve` replicas read COMPACTION_SERVER_* too: a value they would refuse at
    # start stops doctor the same way (status 2), so one run vets a pod's whole environment
    # before a roll (docs/upgrading.md). No token is required here: workers have none.
    load_server_config()
    # Each check is bounded by --timeout; together they can take seconds: a spinner meanwhile.
    with working("checking Redis, broker, workers, summarizer"):
        checks = run_checks(settings, args.timeout)
    failed = sum(c.verdict == "FAIL" for c in checks)
    if args.json:
        print(json.dumps([asdict(c) for c in checks], indent=2))
    else:
        console = Console()
        for c in checks:
            console.print(f"[{STYLES[c.verdict]}]{c.verdict:<4}[/] {c.name:<11} "
                          f"{escape(c.detail)}", highlight=False)
        warned = sum(c.verdict == "WARN" for c in checks)
        summary = ("[bold green]all checks passed[/]" if not failed and not warned else
                   f"{failed} FAIL, {warned} WARN")
        console.print(f"doctor: {summary}")
    return 1 if failed else 0


__all__ = ["WORKER_COMMAND", "Check", "add_arguments", "check_broker", "check_clock",
           "check_store", "check_summarizer", "check_tracking", "check_workers", "run",
           "run_checks"]
