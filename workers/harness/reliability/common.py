"""Shared pieces of the reliability scenarios: the observed fake LLM, workers, Env.

Run long by ``scripts/reliability.py``, at CI size by ``tests/test_reliability.py``.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import secrets
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from shared.core.config import StoreConfig
from shared.core.messages import Message
from shared.core.repair import PROVIDERS, validate_view
from shared.enqueue import QUEUE
from shared.guard import PreparedView
from shared.store.sessions import SessionStore, connect
from workers.harness.fakes.behaviour import Fault
from workers.harness.fakes.http_base import Exchange, Outcome
from workers.harness.fakes.openai_server import FakeOpenAIServer
from workers.harness.fakes.summaries import SummarizerResponder
from workers.harness.stack.redis_server import RedisServer, start_server
from workers.harness.stack.worker_process import WorkerProcess, purge_queue, worker_env
from workers.urls import with_db

MODEL = "gpt-4o"
MARKER = re.compile(rb"rel-mark-([A-Za-z0-9_.:\-]+?)-end")
STORE_DB, BROKER_DB = 7, 8


# -- small helpers ---------------------------------------------------------------------






def marker(session_id: str) -> str:
    """Text put in a session's user messages so the fake LLM knows whose request it got."""
    return f"rel-mark-{session_id}-end"




def marked(turns: Sequence[Sequence[Message]], session_id: str) -> list[list[Message]]:
    """``turns`` with the session's marker at the start of every user message."""
    tag = marker(session_id)
    return [[m.model_copy(update={"content": f"[{tag}] {m.text()}"}) if m.role == "user" else m
             for m in turn] for turn in turns]


def valid_everywhere(view: PreparedView) -> list[str]:
    """validate_view's complaints for every provider, prefixed with the provider."""
    return [f"{p}: {problem}" for p in PROVIDERS for problem in validate_view(view.messages, p)]


# -- the fake LLM, observed --------------------------------------------------------------
class ObservedLLM(FakeOpenAIServer):
    """The fake OpenAI server, plus: who asked (by marker), and faults chosen per session.

    ``faults`` maps a session id to ``(fault, times)``: the first ``times``
    requests carrying that session's marker get the fault (``None``: all of
    them). ``default_fault`` applies to every other request (e.g. a stall
    that keeps each call in flight long enough to kill a worker during it).
    The raw ``Authorization`` values are kept apart from the (redacted)
    request log, for the test that checks where an API key travels.
    """

    def __init__(self, *, faults: Mapping[str, tuple[Fault, int | None]] | None = None,
                 default_fault: Fault | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("responder", SummarizerResponder())
        super().__init__(**kwargs)
        self.routes = dict(faults or {})
        self.default_fault = default_fault
        self._lock = threading.Lock()
        self._arrivals: list[tuple[float, str]] = []
        self.authorizations: list[str] = []

    def route(self, exchange: Exchange) -> Outcome:
        with self._lock:
            self.authorizations.append(exchange.headers.get("authorization", ""))
        return super().route(exchange)

    def planned_fault(self, index: int, exchange: Exchange) -> Fault | None:
        """The fault routed to the request's session (by marker), else ``default_fault``."""
        found = MARKER.search(exchange.raw)
        who = found.group(1).decode() if found else ""
        with self._lock:
            self._arrivals.append((time.monotonic(), who))
            fault = self.default_fault
            if who in self.routes:
                planned, times = self.routes[who]
                if times is None or times > 0:
                    fault = planned
                    if times is not None:
                        self.routes[who] = (planned, times - 1)
                else:
                    fault = None
        return fault

    def arrivals(self, session_id: str | None = None) -> list[float]:
        """Arrival times of the completion requests (of one session)."""
        with self._lock:
            return [t for t, who in self._arrivals if session_id is None or who == session_id]


# -- infrastructure -----------------------------------------------------------------------
def start_workers(name: str, env: dict[str, str], count: int, *, concurrency: int = 2,
                  loglevel: str = "INFO") -> list[WorkerProcess]:
    """``count`` workers started in parallel (each takes ~2 s to import Celery)."""
    workers = [WorkerProcess(f"{name}{i}-{secrets.token_hex(2)}", env, concurrency=concurrency,
                            loglevel=loglevel) for i in range(count)]
    errors: list[BaseException] = []

    def run(w: WorkerProcess) -> None:
        try:
            w.start()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        for w in workers:
            w.stop()
        raise errors[0]
    return workers


@dataclass
class Env:
    """Where a scenario runs: store and broker URLs and a key prefix of its own."""

    store_url: str
    broker_url: str
    key_prefix: str = field(default_factory=lambda: "rel" + secrets.token_hex(4))
    store_timeout: float = 5.0

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.store_url, socket_timeout=10, socket_connect_timeout=5)

    def config(self, **overrides: Any) -> StoreConfig:
        values: dict[str, Any] = {"key_prefix": self.key_prefix,
                                  "socket_timeout": self.store_timeout,
                                  "connect_timeout": self.store_timeout}
        values.update(overrides)
        return StoreConfig(**values)

    def store(self, **overrides: Any) -> SessionStore:
        config = self.config(**overrides)
        return SessionStore(connect(self.store_url, config), config)

    def workers(self, **settings: str) -> dict[str, str]:
        return worker_env(broker_url=self.broker_url, redis_url=self.store_url,
                          key_prefix=self.key_prefix, **settings)

    def purge(self) -> None:
        purge_queue(self.broker_url)

    def drained(self) -> bool:
        """No job queued and none delivered but unacknowledged."""
        broker = redis.Redis.from_url(self.broker_url, socket_timeout=5)
        try:
            return int(broker.llen(QUEUE)) == 0 and int(broker.hlen("unacked")) == 0
        finally:
            broker.close()

    def keys_matching(self, suffix: str) -> list[bytes]:
        client = self.client()
        try:
            return list(client.scan_iter(match=f"{self.key_prefix}:*:{suffix}", count=1000))
        finally:
            client.close()

    def cleanup(self) -> None:
        client = self.client()
        try:
            keys = list(client.scan_iter(match=f"{self.key_prefix}:*", count=1000))
            for i in range(0, len(keys), 500):
                client.delete(*keys[i:i + 500])
        finally:
            client.close()
        self.purge()


@contextlib.contextmanager
def environment(redis_url: str | None, *extra_args: str) -> Iterator[Env]:
    """An Env on ``redis_url`` (db 7 store, db 8 broker) or on a redis-server of its own."""
    server: RedisServer | None = None
    if redis_url is None:
        server = start_server(*extra_args)
        env = Env(with_db(server.url, 0), with_db(server.url, 1))
    else:
        env = Env(with_db(redis_url, STORE_DB), with_db(redis_url, BROKER_DB))
    env.purge()
    try:
        yield env
    finally:
        with contextlib.suppress(redis.exceptions.RedisError):
            env.cleanup()
        if server is not None:
            server.stop()


def integrity(store: SessionStore, session_id: str, *, quiet: bool = True) -> list[str]:
    """Structural invariants of one stored session (``quiet``: no job should be running).

    A dirty flag left at rest means a job found the lease busy and its
    request (a manual /compact, say) was never run.
    """
    problems: list[str] = []
    k = store.keys(session_id)
    client = store.redis
    length = int(client.llen(k.log))
    cum = [int(x) for x in client.lrange(k.cum, 0, -1)]
    if len(cum) != length:
        problems.append(f"{session_id}: {len(cum)} running totals for {length} messages")
    if any(b < a for a, b in itertools.pairwise(cum)):
        problems.append(f"{session_id}: running token totals decrease")
    state = store.state(session_id)
    summaries = store.summaries(session_id)
    marks = [s.watermark for s in summaries]
    if state.watermark > length:
        problems.append(f"{session_id}: watermark {state.watermark} past the log ({length})")
    if state.watermark and state.watermark not in marks:
        problems.append(f"{session_id}: no summary kept at the watermark {state.watermark}")
    current = store.summary(session_id, state.watermark) if state.watermark else None
    if current is not None and (current.kind != state.summary_kind
                                or current.tokens != state.summary_tokens):
        problems.append(f"{session_id}: state says {state.summary_kind}/{state.summary_tokens} "
                        f"tokens, the summary is {current.kind}/{current.tokens}")
    if any(m > length for m in marks):
        problems.append(f"{session_id}: a kept summary covers past the log: {marks} > {length}")
    if quiet:
        for name, key in (("lease", k.lease), ("pending flag", k.pending),
                          ("dirty flag (a busy request never run)", k.dirty),
                          ("taken requests (an owner died running them)", k.taken)):
            if client.exists(key):
                problems.append(f"{session_id}: {name} left behind")
    return problems


# ======================================================================== kill -9
