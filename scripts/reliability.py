"""Reliability runs against real Redis and real Celery workers, printed as markdown.

Each scenario is one function that returns its figures and the list of
invariant violations it found; ``tests/test_reliability.py`` runs the same
functions at CI size and asserts that the list is empty, this script runs
them long and prints the figures (BENCHMARKS.md, "Reliability"):

- ``kill9``: a worker is SIGKILLed while summarizing (the fake LLM holds each
  call for ``--llm-seconds``); the job is redelivered to a fresh worker and
  must complete with exactly one stored summary per watermark.
- ``restart``: appends race a Redis (AOF, ``appendfsync always``) that is
  SIGKILLed and restarted, then frozen (SIGSTOP); every acknowledged append
  must survive, the guard must fail fast with ``StoreUnavailable`` and
  recover on its own; a worker on the same Redis keeps working afterwards.
- ``races``: 4 workers, 50 sessions, appends, history edits and manual
  compactions at once: no stale summary, watermarks move back only through
  an edit, every view valid for OpenAI, Anthropic and Gemini.
- ``load``: 1,000 sessions x 100 turns fed by agent processes as fast as
  they go while workers compact: the queue drains, no job is lost, guard
  latency under load, Redis memory per session, throughput.
- ``failures``: the summarizer times out, rate-limits, errors, answers
  garbage, nothing, a refusal or endless text: no bad summary is stored,
  retries are bounded, the offline fallback runs on the last attempt, and
  every failure shows in the log and in the task events.

Every scenario starts its own ``redis-server`` (``--redis-url`` uses an
existing one instead: store in db 7, broker in db 8) and its own workers.

    .venv/bin/python scripts/reliability.py all [--quick]
    .venv/bin/python scripts/reliability.py kill9 --trials 20
    .venv/bin/python scripts/reliability.py load --sessions 1000 --turns 100
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import multiprocessing
import os
import random
import re
import secrets
import signal
import statistics
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: the worker/redis helpers live in tests/
    sys.path.insert(0, str(ROOT))

from shared.core.config import StoreConfig  # noqa: E402
from shared.core.errors import StoreUnavailable  # noqa: E402
from shared.core.messages import Message  # noqa: E402
from shared.core.records import SummaryRecord  # noqa: E402
from shared.core.repair import PROVIDERS, validate_view  # noqa: E402
from shared.core.turns import turn_starts  # noqa: E402
from shared.core.wire import from_openai  # noqa: E402
from shared.enqueue import QUEUE, TASK_COMPACT, CeleryEnqueuer, publisher_app  # noqa: E402
from shared.guard import ContextGuard, PreparedView  # noqa: E402
from shared.store.sessions import SessionStore, connect  # noqa: E402
from tests.celery_worker import WorkerProcess, purge_queue, worker_env  # noqa: E402
from tests.redis_server import RedisServer, start_server  # noqa: E402
from workers.compactor import Compactor  # noqa: E402
from workers.harness.demo_session import SYSTEM_PROMPT, TOOLS, generate_session  # noqa: E402
from workers.harness.fakes.behaviour import REFUSAL_TEXT, Fault  # noqa: E402
from workers.harness.fakes.http_base import RESET, Exchange, Outcome  # noqa: E402
from workers.harness.fakes.openai_server import FakeOpenAIServer  # noqa: E402
from workers.harness.fakes.summaries import SummarizerResponder  # noqa: E402
from workers.settings import load_settings  # noqa: E402
from workers.summarizer.engine import SummaryEngine  # noqa: E402
from workers.summarizer.providers import OpenAIClient  # noqa: E402

MODEL = "gpt-4o"
MARKER = re.compile(rb"rel-mark-([A-Za-z0-9_.:\-]+?)-end")
STORE_DB, BROKER_DB = 7, 8


# -- small helpers ---------------------------------------------------------------------
def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); 0 for an empty sample."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def with_db(url: str, db: int) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", "", ""))


def marker(session_id: str) -> str:
    """Text put in a session's user messages so the fake LLM knows whose request it got."""
    return f"rel-mark-{session_id}-end"


def demo_turns(turns: int, seed: int = 7) -> list[list[Message]]:
    """A generated coding session (without its system prompt), split into turns."""
    body = from_openai(generate_session(turns, seed))[1:]
    starts = turn_starts(body)
    return [body[a:b] for a, b in zip(starts, [*starts[1:], len(body)], strict=True)]


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

    def take_fault(self, exchange: Exchange) -> tuple[Fault | None, Outcome | None]:
        exchange.index = self.next_index()
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
        if fault is None:
            return None, None
        exchange.fault = fault.kind
        whole = self.whole_answer_fault(fault, exchange)
        if whole is not None:
            return fault, whole
        if fault.kind == "stall" and (not self.pause(fault.seconds) or exchange.client_gone()):
            return fault, RESET
        return fault, None

    def arrivals(self, session_id: str | None = None) -> list[float]:
        """Arrival times of the completion requests (of one session)."""
        with self._lock:
            return [t for t, who in self._arrivals if session_id is None or who == session_id]


# -- infrastructure -----------------------------------------------------------------------
@dataclass
class LoggedWorker(WorkerProcess):
    """A real ``celery worker`` process with a chosen log level (tests' helper logs INFO)."""

    loglevel: str = "INFO"

    def start(self, timeout: float = 30) -> LoggedWorker:
        import subprocess

        from tests.celery_worker import ROOT as WORKER_ROOT

        cmd = [sys.executable, "-m", "celery", "-A", "workers.app", "worker",
               "--pool", self.pool, "-c", str(self.concurrency), "-Q", QUEUE,
               "-n", f"{self.name}@%h", "--without-mingle", "--without-gossip",
               "-l", self.loglevel]
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(cmd, cwd=WORKER_ROOT, env={**os.environ, **self.env},
                                            stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        if not wait_for(lambda: " ready." in self.log() or self.process is None
                        or self.process.poll() is not None, timeout, 0.1) \
                or " ready." not in self.log():
            self.stop()
            raise RuntimeError(f"worker {self.name} did not start:\n{self.log()[-3000:]}")
        return self


def start_workers(name: str, env: dict[str, str], count: int, *, concurrency: int = 2,
                  loglevel: str = "INFO") -> list[LoggedWorker]:
    """``count`` workers started in parallel (each takes ~2 s to import Celery)."""
    workers = [LoggedWorker(f"{name}{i}-{secrets.token_hex(2)}", env, concurrency=concurrency,
                            loglevel=loglevel) for i in range(count)]
    errors: list[BaseException] = []

    def run(w: LoggedWorker) -> None:
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
@dataclass
class Kill9Result:
    trials: int = 0
    jobs: int = 0
    killed_before_commit: int = 0
    killed_after_commit: int = 0
    redelivered: int = 0
    recovery_seconds: list[float] = field(default_factory=list)
    llm_requests: int = 0
    commits: int = 0
    violations: list[str] = field(default_factory=list)


def run_kill9(env: Env, *, trials: int, sessions_per_trial: int = 2, llm_seconds: float = 1.0,
              visibility: int | None = 5, kill_delays: Sequence[float] | None = None,
              seed: int = 1,
              progress: Callable[[str], None] = lambda _: None) -> Kill9Result:
    """SIGKILL the worker while its jobs wait on the LLM; a new worker must finish them.

    Each trial compacts ``sessions_per_trial`` fresh sessions at once, waits
    until every one of their LLM calls is in flight, sleeps a delay (random
    in ``[0, 2 * llm_seconds + 0.5]`` unless ``kill_delays`` gives them: a
    job makes one or two calls, so some kills land after the commit, a few
    before the acknowledgement), kills the whole worker process
    group and starts the next worker, which gets the jobs redelivered after
    the broker's visibility timeout. ``visibility=None`` runs the workers with
    the default timing settings (visibility timeout, time limits, restore
    sweep), to measure how long a killed job waits in production.
    """
    rng = random.Random(seed)
    result = Kill9Result()
    store = env.store()
    turns = demo_turns(12)
    publisher = publisher_app(env.broker_url)
    with ObservedLLM(default_fault=Fault.stall(llm_seconds)) as llm:
        wenv = env.workers(summarizer="openai", summarizer_base_url=llm.base_url,
                           summarizer_api_key="k", summarizer_timeout="30",
                           **({} if visibility is None else {
                               "broker_visibility_timeout": str(visibility),
                               "broker_restore_sweep_seconds": "1",
                               "task_time_limit": "25", "task_soft_time_limit": "20"}))
        defaults = load_settings(summarizer_timeout=30)
        redelivery = visibility if visibility is not None else (
            defaults.visibility_timeout + defaults.broker_restore_sweep_seconds)
        worker = start_workers("kill", wenv, 1, concurrency=4)[0]
        logs: list[LoggedWorker] = [worker]
        try:
            for trial in range(trials):
                sids = [f"k{trial}-{i}" for i in range(sessions_per_trial)]
                for sid in sids:
                    for turn in marked(turns, sid):
                        store.append(sid, turn)
                lengths = {sid: store.length(sid) for sid in sids}
                ids = [publisher.send_task(TASK_COMPACT, args=[sid], kwargs={
                    "tenant": "default", "force": True, "keep_recent": 2000}, queue=QUEUE).id
                    for sid in sids]

                def in_flight(s: list[str] = sids) -> bool:
                    return all(llm.arrivals(x) for x in s)

                if not wait_for(in_flight, 30):
                    result.violations.append(f"trial {trial}: the LLM calls never started")
                    break
                delay = (kill_delays[trial % len(kill_delays)] if kill_delays
                         else rng.uniform(0, 2 * llm_seconds + 0.5))
                time.sleep(delay)
                worker.kill9()
                killed_at = time.monotonic()
                for sid in sids:
                    if store.state(sid).version:
                        result.killed_after_commit += 1
                    else:
                        result.killed_before_commit += 1
                worker = start_workers("kill", wenv, 1, concurrency=4)[0]
                logs.append(worker)

                def done(s: list[str] = sids) -> bool:
                    return all(store.state(x).version >= 1 for x in s) and env.drained() and \
                        not any(store.redis.exists(store.keys(x).lease) for x in s)

                if not wait_for(done, redelivery + 30, 0.1):
                    result.violations.append(f"trial {trial}: jobs not completed after "
                                             f"redelivery: {[store.state(x) for x in sids]}")
                    continue
                result.recovery_seconds.append(time.monotonic() - killed_at)
                result.redelivered += sum(f"[{i}] received" in worker.log() for i in ids)
                result.trials += 1
                result.jobs += len(sids)
                for sid in sids:
                    result.violations += _check_single_commit(store, sid, lengths[sid])
                    result.commits += store.state(sid).version
                    result.llm_requests += len(llm.arrivals(sid))
                progress(f"kill9 trial {trial + 1}/{trials}: killed after {delay:.2f} s, "
                         f"recovered in {result.recovery_seconds[-1]:.1f} s")
        finally:
            worker.stop()
    if result.violations:
        result.violations.append("worker logs: " + ", ".join(str(w.log_path) for w in logs))
    return result


def _check_single_commit(store: SessionStore, sid: str, length: int) -> list[str]:
    """One job, one summary: version 1, one kept LLM summary, log untouched, nothing left."""
    problems = integrity(store, sid)
    state = store.state(sid)
    summaries = store.summaries(sid)
    if state.version != 1 or len(summaries) != 1:
        problems.append(f"{sid}: {state.version} commits and {len(summaries)} summaries "
                        "for one job (a summary stored twice?)")
    if [s.kind for s in summaries] != ["llm"]:
        problems.append(f"{sid}: summary kinds {[s.kind for s in summaries]}, expected ['llm']")
    if store.length(sid) != length:
        problems.append(f"{sid}: the log changed from {length} to {store.length(sid)} messages")
    return problems


# ======================================================================== Redis restart
@dataclass
class RestartResult:
    cycles: int = 0
    acknowledged: int = 0
    failed_appends: int = 0
    failed_applied: int = 0
    lost: int = 0
    down_seconds: list[float] = field(default_factory=list)
    refused_ms: list[float] = field(default_factory=list)
    hung_ms: list[float] = field(default_factory=list)
    recovery_ms: list[float] = field(default_factory=list)
    timeout_s: float = 0.0
    worker_jobs_after: int = 0
    violations: list[str] = field(default_factory=list)


def run_restart(*, cycles: int = 1, writers: int = 4, hang_seconds: float = 2.0,
                with_worker: bool = False, socket_timeout: float = 0.5,
                progress: Callable[[str], None] = lambda _: None) -> RestartResult:
    """Appends and guard calls while Redis (AOF, fsync always) is killed/restarted and frozen.

    Writers append numbered messages to their own session and remember
    which appends returned. A prober calls ``guard.prepare`` every 20 ms
    and times each StoreUnavailable. Each cycle: SIGKILL + restart on the
    same AOF directory, then SIGSTOP for ``hang_seconds`` + SIGCONT. At the
    end every acknowledged append must be in its log, once, in order.
    """
    result = RestartResult(timeout_s=socket_timeout)
    server = start_server("--appendonly", "yes", "--appendfsync", "always")
    env = Env(with_db(server.url, 0), with_db(server.url, 1))
    config = env.config(socket_timeout=socket_timeout, connect_timeout=socket_timeout)
    store = SessionStore(connect(env.store_url, config), config)
    guard = ContextGuard(store)
    stop = threading.Event()
    acked: dict[int, list[int]] = defaultdict(list)
    failed: dict[int, list[int]] = defaultdict(list)
    state = {"phase": "up"}
    probes: list[tuple[str, float, str]] = []  # (phase, ms, outcome)
    worker: LoggedWorker | None = None
    store.append("probe", [{"role": "user", "content": "hello"}])

    def writer(w: int) -> None:
        n = 0
        while not stop.is_set():
            try:
                store.append(f"w{w}", [{"role": "user", "content": f"w{w}-n{n}"}])
                acked[w].append(n)
            except StoreUnavailable:
                failed[w].append(n)
                time.sleep(0.01)
            n += 1

    def prober() -> None:
        while not stop.is_set():
            phase = state["phase"]
            started = time.perf_counter()
            try:
                guard.prepare("probe", "system", None, 500, MODEL)
                outcome = "ok"
            except StoreUnavailable:
                outcome = "unavailable"
            except Exception as exc:  # anything else is a finding
                outcome = f"{type(exc).__name__}: {exc}"
            if state["phase"] != phase and outcome != "ok":  # the phase that made it fail
                phase = state["phase"]
            probes.append((phase, (time.perf_counter() - started) * 1000, outcome))
            time.sleep(0.02)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    threads.append(threading.Thread(target=prober))
    try:
        if with_worker:
            worker = start_workers("restart", env.workers(), 1, concurrency=2)[0]
        for t in threads:
            t.start()
        for cycle in range(cycles):
            time.sleep(0.7)
            state["phase"] = "down"
            went_down = time.monotonic()
            assert server.process is not None
            server.stop()  # SIGKILL: what a crash looks like
            time.sleep(0.3)
            server.start()  # same port, same directory: the AOF is replayed
            result.down_seconds.append(time.monotonic() - went_down)
            state["phase"] = "back"
            came_back = time.perf_counter()
            if not wait_for(lambda: bool(probes) and probes[-1][0] == "back"
                            and probes[-1][2] == "ok", 10, 0.01):
                result.violations.append(f"cycle {cycle}: the guard did not recover by itself")
            result.recovery_ms.append((time.perf_counter() - came_back) * 1000)
            time.sleep(0.5)
            state["phase"] = "hung"
            assert server.process is not None
            os.kill(server.process.pid, signal.SIGSTOP)
            time.sleep(hang_seconds)
            os.kill(server.process.pid, signal.SIGCONT)
            state["phase"] = "up"
            time.sleep(0.5)
            result.cycles += 1
            progress(f"restart cycle {cycle + 1}/{cycles}: down {result.down_seconds[-1]:.2f} s")
        stop.set()
        for t in threads:
            t.join(timeout=30)
        if with_worker and worker is not None:
            result.worker_jobs_after = _jobs_after_restart(env, store, result)
        _check_appends(store, acked, failed, writers, result)
    finally:
        stop.set()
        if worker is not None:
            worker.stop()
        server.stop()
    result.refused_ms = [ms for phase, ms, out in probes if phase == "down" and out != "ok"]
    result.hung_ms = [ms for phase, ms, out in probes if phase == "hung" and out != "ok"]
    odd = {out for _, _, out in probes if out not in ("ok", "unavailable")}
    result.violations += [f"guard raised {out} instead of StoreUnavailable" for out in odd]
    slow = [ms for ms in result.refused_ms + result.hung_ms if ms > socket_timeout * 1000 * 1.5
            + 100]
    if slow:
        result.violations.append(f"StoreUnavailable took up to {max(slow):.0f} ms with a "
                                 f"{socket_timeout * 1000:.0f} ms timeout")
    if not result.hung_ms:
        result.violations.append("no guard call ran into the frozen Redis")
    return result


def _check_appends(store: SessionStore, acked: dict[int, list[int]],
                   failed: dict[int, list[int]], writers: int, result: RestartResult) -> None:
    """Every acknowledged append once and in order; failed ones at most once."""
    server_store = store
    for w in range(writers):
        texts = [m.text() for m in server_store.messages(f"w{w}")]
        seen = [int(t.split("-n")[1]) for t in texts]
        counts = Counter(seen)
        dupes = [n for n, c in counts.items() if c > 1]
        if dupes:
            result.violations.append(f"w{w}: appended twice: {dupes[:5]}")
        present = set(seen)
        lost = [n for n in acked[w] if n not in present]
        result.lost += len(lost)
        if lost:
            result.violations.append(f"w{w}: {len(lost)} acknowledged appends lost: {lost[:5]}")
        order = [n for n in seen if n in set(acked[w])]
        if order != sorted(order):
            result.violations.append(f"w{w}: acknowledged appends out of order")
        result.acknowledged += len(acked[w])
        result.failed_appends += len(failed[w])
        result.failed_applied += len(present & set(failed[w]))
        result.violations += integrity(server_store, f"w{w}")


def _jobs_after_restart(env: Env, store: SessionStore, result: RestartResult) -> int:
    """The worker that lived through the restarts still takes and finishes jobs."""
    publisher = publisher_app(env.broker_url)
    sids = [f"after{i}" for i in range(3)]
    for sid in sids:
        for turn in demo_turns(12):
            store.append(sid, turn)
        publisher.send_task(TASK_COMPACT, args=[sid], kwargs={
            "tenant": "default", "force": True, "keep_recent": 2000}, queue=QUEUE)
    if not wait_for(lambda: all(store.state(s).watermark > 0 for s in sids), 60, 0.2):
        result.violations.append("the worker did not finish jobs after the Redis restarts")
        return 0
    return len(sids)


# ======================================================================== races
@dataclass(frozen=True)
class Edit:
    """A history edit: its version lies in ``[low, high]``, it finished at ``done_at``."""

    low: int
    high: int
    index: int
    done_at: float


@dataclass
class RaceResult:
    seconds: float = 0.0
    sessions: int = 0
    workers: int = 0
    turns: int = 0
    views: int = 0
    edits: int = 0
    edits_exact: int = 0
    manual_compactions: int = 0
    commits: int = 0
    conflicts: int = 0
    busy: int = 0
    watermark_drops: int = 0
    summaries_checked: int = 0
    unhonored: int = 0
    busy_run: int = 0
    drain_seconds: float = 0.0
    violations: list[str] = field(default_factory=list)


BROKEN_CAS = """\
# Loaded by the race workers with --break-cas: the compare-and-swap always "expects"
# the current version, as a careless writer would. The race checks must catch it.
import shared.store.sessions as _store

_commit = _store.SessionStore.commit_summary


def _blind_commit(self, session_id, record, expected_version):
    return _commit(self, session_id, record, self.state(session_id).version)


_store.SessionStore.commit_summary = _blind_commit
"""


def sabotaged(env: dict[str, str]) -> dict[str, str]:
    """Worker environment whose interpreter loads BROKEN_CAS at start (sitecustomize)."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="rel-broken-cas-"))
    (folder / "sitecustomize.py").write_text(BROKEN_CAS, encoding="utf-8")
    path = os.environ.get("PYTHONPATH")
    return {**env, "PYTHONPATH": f"{folder}{os.pathsep}{path}" if path else str(folder)}


def run_races(env: Env, *, seconds: float, workers: int = 4, sessions: int = 50,
              appenders: int = 3, window: int = 12_000, seed: int = 2, break_cas: bool = False,
              llm_seconds: float = 0.3,
              progress: Callable[[str], None] = lambda _: None) -> RaceResult:
    """Appends, history edits and manual compactions on the same sessions, 4+ workers.

    Checked: every view the guard returns is valid for the three providers;
    between two observations of a session (by the thread that feeds it, and
    by a poller reading the state hash), the watermark goes down only if a
    history edit happened in between (by version); no kept summary covers
    a position an edit removed unless it was computed after that edit
    (``source_version`` >= the edit's version); the stored structure is
    intact and every pending flag, lease and job is gone at the end.
    ``break_cas`` runs the workers with a blind compare-and-swap (see
    BROKEN_CAS), to show that these checks do catch stale writers.
    """
    rng = random.Random(seed)
    result = RaceResult(sessions=sessions, workers=workers)
    store = env.store(socket_timeout=2.0, connect_timeout=2.0)
    publisher = publisher_app(env.broker_url)
    sids = [f"race{i}" for i in range(sessions)]
    base_turns = demo_turns(160)
    stop = threading.Event()
    lock = threading.Lock()
    edits: dict[str, list[Edit]] = defaultdict(list)
    seen_feed: dict[str, list[tuple[int, int]]] = defaultdict(list)
    seen_poll: dict[str, list[tuple[int, int]]] = defaultdict(list)
    seen_records: dict[str, list[tuple[float, SummaryRecord]]] = defaultdict(list)
    counts: Counter[str] = Counter()
    violations: list[str] = []

    def guarded(name: str, body: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                body()
            except BaseException as exc:  # a crash of a harness thread is a finding too
                with lock:
                    violations.append(f"{name} thread crashed: {type(exc).__name__}: {exc}")
        return run

    def feeder(mine: list[str]) -> None:
        guard = ContextGuard(store, CeleryEnqueuer(publisher), overrides={MODEL: window})
        cursor = dict.fromkeys(mine, 0)
        turns = {sid: marked(base_turns, sid) for sid in mine}
        while not stop.is_set():
            for sid in mine:
                turn = turns[sid][cursor[sid] % len(turns[sid])]
                cursor[sid] += 1
                view = guard.prepare(sid, SYSTEM_PROMPT, TOOLS, 1500, MODEL, pending=turn[:1])
                problems = valid_everywhere(view)
                with lock:
                    # A truncated view reports the watermark of its own truncation record,
                    # which is not stored when its compare-and-swap lost: only untruncated
                    # views say what the store held.
                    if not view.report.truncated:
                        seen_feed[sid].append((view.report.version, view.report.watermark))
                    counts["views"] += 1
                    violations.extend(f"{sid} view: {p}" for p in problems[:3])
                guard.record_turn(sid, turn)
                with lock:
                    counts["turns"] += 1
                if stop.is_set():
                    return

    def editor() -> None:
        while not stop.wait(0.05):
            sid = rng.choice(sids)
            length = store.length(sid)
            if length < 4:
                continue
            state = store.state(sid)
            before = state.version
            # Mostly regenerations near the end; some edits inside the range a job
            # in flight may be summarizing; a few deep ones (fallback to old summaries).
            where = rng.random()
            low = (max(0, length - 8) if where < 0.5
                   else min(state.watermark, length) if where < 0.85 else 0)
            index = rng.randint(low, length)
            after = store.truncate_after(sid, index).version
            with lock:
                edits[sid].append(Edit(before + 1, after, index, time.monotonic()))
                counts["edits"] += 1
                counts["edits_exact"] += int(after == before + 1)

    def compactor() -> None:
        while not stop.wait(0.1):
            keep = rng.choice([None, 800, 2500])
            publisher.send_task(TASK_COMPACT, args=[rng.choice(sids)], kwargs={
                "tenant": "default", "keep_recent": keep, "force": rng.random() < 0.3},
                queue=QUEUE)
            with lock:
                counts["manual"] += 1

    def poller() -> None:
        while not stop.is_set():
            for sid in sids:
                at = time.monotonic()
                state = store.state(sid)
                seen_poll[sid].append((state.version, state.watermark))
                record = store.summary(sid, state.watermark) if state.watermark else None
                if record is not None:
                    seen_records[sid].append((at, record))

    with ObservedLLM(latency=llm_seconds) as llm:
        wenv = env.workers(summarizer="openai", summarizer_base_url=llm.base_url,
                           summarizer_api_key="k", summarizer_timeout="20")
        pool = start_workers("race", sabotaged(wenv) if break_cas else wenv, workers,
                             concurrency=2)
        try:
            parts = [sids[i::appenders] for i in range(appenders)]
            threads = [threading.Thread(target=guarded("feeder", functools.partial(feeder, p)))
                       for p in parts]
            threads += [threading.Thread(target=guarded(n, f)) for n, f in
                        (("editor", editor), ("compactor", compactor), ("poller", poller))]
            started = time.monotonic()
            for t in threads:
                t.start()
            while time.monotonic() - started < seconds and (break_cas or not violations):
                time.sleep(0.2)
            stop.set()
            for t in threads:
                t.join(timeout=60)
            result.seconds = time.monotonic() - started
            progress(f"races: fed {counts['turns']} turns, {counts['edits']} edits; draining")
            drain_started = time.monotonic()
            settled = wait_for(lambda: env.drained() and not env.keys_matching("pending")
                               and not env.keys_matching("lease"), 120, 0.2)
            result.drain_seconds = time.monotonic() - drain_started
            if not settled:
                violations.append("the queue did not drain / pending flags stayed set")
        finally:
            for w in pool:
                w.stop()
    logs = "\n".join(w.log() for w in pool)
    result.conflicts = logs.count("compare-and-swap lost")
    result.busy = logs.count("'status': 'busy'")
    result.busy_run = sum(len(re.findall(r"'(?:compacted|skipped|covered|conflict)'", found))
                          for found in re.findall(r"'reruns': \[([^\]]*)\]", logs))
    result.turns, result.views = counts["turns"], counts["views"]
    result.edits, result.edits_exact = counts["edits"], counts["edits_exact"]
    result.manual_compactions = counts["manual"]
    for sid in sids:
        for seq in (seen_feed[sid], seen_poll[sid]):
            violations += _watermark_drops(sid, seq, edits[sid], result)
        kept = [(time.monotonic(), record) for record in store.summaries(sid)]
        violations += _stale_summaries(sid, seen_records[sid] + kept, edits[sid], result)
        violations += integrity(store, sid)
        result.unhonored += int(bool(store.redis.exists(store.keys(sid).dirty)))
        final = ContextGuard(store, overrides={MODEL: window}).prepare(
            sid, SYSTEM_PROMPT, TOOLS, 1500, MODEL)
        violations += [f"{sid} final view: {p}" for p in valid_everywhere(final)]
        result.commits += store.state(sid).version
    result.commits -= result.edits  # versions count edits too
    result.violations = violations
    return result


def _watermark_drops(sid: str, seq: list[tuple[int, int]], edits: list[Edit],
                     result: RaceResult) -> list[str]:
    """A watermark may go down between two observations only if an edit's version lies between."""
    problems = []
    for (v1, w1), (v2, w2) in itertools.pairwise(seq):
        if v2 < v1:
            problems.append(f"{sid}: version went back {v1} -> {v2}")
        if w2 < w1:
            result.watermark_drops += 1
            if not any(e.low <= v2 and e.high > v1 for e in edits):
                problems.append(f"{sid}: watermark {w1} -> {w2} between versions {v1} and {v2} "
                                "without a history edit")
    return problems


def _stale_summaries(sid: str, seen: list[tuple[float, SummaryRecord]], edits: list[Edit],
                     result: RaceResult) -> list[str]:
    """No summary seen after an edit covers the edited position unless computed after it.

    An edit at ``index`` deletes every summary whose watermark is past it,
    so a summary seen later with such a watermark was committed after the
    edit, through a compare-and-swap on a version >= the edit's: its
    ``source_version`` cannot be below the edit's version.
    """
    problems: list[str] = []
    checked: set[tuple[int, float]] = set()
    for at, record in seen:
        if (record.watermark, record.created_at) not in checked:
            checked.add((record.watermark, record.created_at))
            result.summaries_checked += 1
        for e in edits:
            if e.done_at < at and e.index < record.watermark \
                    and record.source_version < e.low:
                problems.append(
                    f"{sid}: summary at watermark {record.watermark} computed at version "
                    f"{record.source_version}, seen after an edit at index {e.index} "
                    f"(version >= {e.low})")
    return sorted(set(problems))


# ======================================================================== load
@dataclass
class LoadResult:
    sessions: int = 0
    turns_per_session: int = 0
    feeders: int = 0
    workers: int = 0
    concurrency: int = 0
    feed_seconds: float = 0.0
    drain_seconds: float = 0.0
    turns: int = 0
    messages: int = 0
    prepare_ms: list[float] = field(default_factory=list)
    record_ms: list[float] = field(default_factory=list)
    truncated_views: int = 0
    sessions_due: int = 0
    sessions_compacted: int = 0
    sessions_cheap_only: int = 0
    still_due: int = 0
    commits: int = 0
    llm_requests: int = 0
    max_queue: int = 0
    used_memory_bytes: int = 0
    key_bytes_per_session: float = 0.0
    raw_bytes_per_session: float = 0.0
    violations: list[str] = field(default_factory=list)


def _feed(store_url: str, broker_url: str, prefix: str, sids: list[str], turns: int,
          window: int, sample_every: int) -> dict[str, Any]:
    """One agent process: for each turn of each session, prepare then record (round robin)."""
    config = StoreConfig(key_prefix=prefix)
    store = SessionStore(connect(store_url, config), config)
    guard = ContextGuard(store, CeleryEnqueuer(publisher_app(broker_url)),
                         overrides={MODEL: window})
    session = marked(demo_turns(turns), "load")
    prepare_ms: list[float] = []
    record_ms: list[float] = []
    due: set[str] = set()
    truncated = messages = 0
    for t in range(turns):
        turn = session[t % len(session)]
        for sid in sids:
            started = time.perf_counter()
            view = guard.prepare(sid, SYSTEM_PROMPT, TOOLS, 2000, MODEL, pending=turn[:1])
            middle = time.perf_counter()
            guard.record_turn(sid, turn)
            ended = time.perf_counter()
            messages += len(turn)
            if view.report.budget.should_compact:
                due.add(sid)
            truncated += int(view.report.truncated)
            if (t * len(sids) + sids.index(sid)) % sample_every == 0:
                prepare_ms.append((middle - started) * 1000)
                record_ms.append((ended - middle) * 1000)
    return {"prepare_ms": prepare_ms, "record_ms": record_ms, "due": sorted(due),
            "truncated": truncated, "messages": messages}


def _feed_star(args: tuple[Any, ...]) -> dict[str, Any]:
    return _feed(*args)


def run_load(*, sessions: int, turns: int, feeders: int = 2, workers: int = 2,
             concurrency: int = 16, window: int = 32_000, llm_seconds: float = 0.2,
             redis_url: str | None = None,
             progress: Callable[[str], None] = lambda _: None) -> LoadResult:
    """Agent processes feed every session turn by turn while workers compact.

    The fake LLM answers each summarization after ``llm_seconds``. At the
    end: the broker queue and its unacknowledged set are empty, no pending
    flag is left, every session the guard found due has a summary, and the
    compactor's own plan finds no session still due (a lost job would
    leave one).
    """
    result = LoadResult(sessions=sessions, turns_per_session=turns, feeders=feeders,
                        workers=workers, concurrency=concurrency)
    with environment(redis_url, "--appendonly", "yes", "--appendfsync", "everysec") as env, \
            ObservedLLM(latency=llm_seconds) as llm:
        client = env.client()
        baseline = int(client.info("memory")["used_memory"])
        pool = start_workers("load", env.workers(
            summarizer="openai", summarizer_base_url=llm.base_url, summarizer_api_key="k",
            summarizer_timeout="60"), workers, concurrency=concurrency)
        broker = redis.Redis.from_url(env.broker_url)
        try:
            sids = [f"load{i}" for i in range(sessions)]
            parts = [sids[i::feeders] for i in range(feeders)]
            sample_every = max(1, sessions * turns // 20_000)
            jobs = [(env.store_url, env.broker_url, env.key_prefix, part, turns, window,
                     sample_every) for part in parts]
            ctx = multiprocessing.get_context("spawn")
            started = time.monotonic()
            with ctx.Pool(feeders) as procs:
                pending = procs.map_async(_feed_star, jobs)
                while not pending.ready():
                    result.max_queue = max(result.max_queue, int(broker.llen(QUEUE)))
                    pending.wait(0.5)
                outputs = pending.get()
            result.feed_seconds = time.monotonic() - started
            progress(f"load: fed in {result.feed_seconds:.0f} s; draining")
            drained_at = time.monotonic()
            if not wait_for(lambda: env.drained() and not env.keys_matching("pending"), 600, 0.5):
                result.violations.append("the queue did not drain within 10 minutes")
            result.drain_seconds = time.monotonic() - drained_at
            for out in outputs:
                result.prepare_ms += out["prepare_ms"]
                result.record_ms += out["record_ms"]
                result.truncated_views += out["truncated"]
                result.messages += out["messages"]
            due = {sid for out in outputs for sid in out["due"]}
            result.turns = sessions * turns
            result.sessions_due = len(due)
            result.used_memory_bytes = int(client.info("memory")["used_memory"]) - baseline
            _check_load(env, sids, due, llm, result)
            result.llm_requests = len(llm.arrivals())
        finally:
            for w in pool:
                w.stop()
            broker.close()
            client.close()
    return result


def _check_load(env: Env, sids: list[str], due: set[str], llm: ObservedLLM,
                result: LoadResult) -> None:
    store = env.store()
    engine = SummaryEngine(OpenAIClient("gpt-4o-mini", base_url=llm.base_url, api_key="k"))
    compactor = Compactor(store, engine)
    sample = set(sids[:: max(1, len(sids) // 20)])
    key_bytes: list[int] = []
    raw_bytes: list[int] = []
    for sid in sids:
        state = store.state(sid)
        result.commits += state.version
        result.sessions_compacted += int(state.watermark > 0)
        data = store.load_view(sid)
        result.sessions_cheap_only += int(state.watermark == 0 and bool(data.cheap))
        if sid in due and state.watermark == 0:
            result.violations.append(f"{sid} became due and was never compacted")
        plan = compactor.plan(sid, data, force=False, keep_recent=None)
        if not isinstance(plan, str):
            result.still_due += 1
            result.violations.append(f"{sid} is still due after the queue drained (lost job?)")
        result.violations += integrity(store, sid)
        if sid in sample:
            k = store.keys(sid)
            key_bytes.append(sum(int(store.redis.memory_usage(key) or 0)
                                 for key in k.data_keys()))
            raw_bytes.append(sum(len(r) for r in store.redis.lrange(k.log, 0, -1)))
    result.key_bytes_per_session = statistics.fmean(key_bytes) if key_bytes else 0.0
    result.raw_bytes_per_session = statistics.fmean(raw_bytes) if raw_bytes else 0.0


# ======================================================================== summarizer failures
OVERFLOW_400 = ('{"error": {"message": "This model\'s maximum context length is 16000 tokens. '
                'However, your messages resulted in 25371 tokens. Please reduce the length of '
                'the messages.", "type": "invalid_request_error", "param": "messages", '
                '"code": "context_length_exceeded"}}')


@dataclass(frozen=True)
class FailureSpec:
    """One failure mode: the fault, how many requests get it, what must happen."""

    fault: Fault
    times: int | None  # requests that get the fault (None: all of them)
    expected: str  # kind of the stored summary
    retried: bool  # Celery retries it (SummarizerUnavailable), else the fallback runs at once
    requests: tuple[int, int] | None = None  # LLM requests expected, when not the default


FAILURE_CASES: dict[str, FailureSpec] = {
    "timeout": FailureSpec(Fault.stall(3.0), None, "offline", True),
    "rate-limit": FailureSpec(Fault.rate_limit(0.2), None, "offline", True),
    "server-error": FailureSpec(Fault.server_error(), None, "offline", True),
    "garbage": FailureSpec(Fault.garbage(), None, "offline", True),
    "empty": FailureSpec(Fault.empty(), None, "offline", False),
    "refusal": FailureSpec(Fault.refusal(), None, "offline", False),
    "endless": FailureSpec(Fault.endless(), None, "offline", False),
    "reset": FailureSpec(Fault.reset(), None, "offline", True),
    "overloaded-503": FailureSpec(Fault.unavailable(), None, "offline", True),
    "not-a-completion": FailureSpec(Fault.not_completion(), None, "offline", True),
    "bad-request-400": FailureSpec(Fault.http_error(
        400, '{"error": {"message": "Invalid request", "type": "invalid_request_error"}}'),
        None, "offline", False),
    # Up to 6 requests: the failed one, then summary and split-turn prefix, or more
    # chunks when the worker's engine has already learned the 16k window below.
    "transient-429": FailureSpec(Fault.rate_limit(0.2), 1, "llm", True, (2, 6)),
    # The summarizer's window (16k, says the error) is smaller than configured: the
    # engine splits the rest of the range smaller and folds (2 or 3 chunks + prefix).
    "overflow-400": FailureSpec(Fault.http_error(400, OVERFLOW_400), 1, "llm", False, (3, 6)),
}
BAD_TEXT = (REFUSAL_TEXT, "and the story goes on", "resp-garbage", "Rate limit reached",
            "had an error while processing")


@dataclass
class FailureCase:
    session_id: str
    fault: str
    kind: str = ""
    llm_requests: int = 0
    retries_logged: int = 0
    fallbacks_logged: int = 0
    events: Counter[str] = field(default_factory=Counter)
    reason: str = ""
    seconds: float = 0.0


@dataclass
class FailureResult:
    max_retries: int = 1
    cases: list[FailureCase] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)


class EventLog:
    """Celery task events (what Flower's /metrics counts), captured from the broker."""

    def __init__(self, broker_url: str) -> None:
        from celery import Celery

        self.app = Celery("reliability-events", broker=broker_url, set_as_current=False)
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._receiver: Any = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _on(self, event: dict[str, Any]) -> None:
        with self._lock:
            self.events.append(event)

    def _run(self) -> None:
        with self.app.connection_for_read() as conn:
            self._receiver = self.app.events.Receiver(conn, handlers={"*": self._on})
            self._receiver.capture(limit=None, timeout=None, wakeup=False)

    def start(self, timeout: float = 10) -> EventLog:
        self._thread.start()
        with self.app.connection_for_write() as conn:
            dispatcher = self.app.events.Dispatcher(conn)
            ok = wait_for(lambda: (dispatcher.send("task-ping"), self.of("task-ping"))[1] != [],
                          timeout, 0.1)
            dispatcher.close()
        if not ok:
            raise RuntimeError("the event receiver did not come up")
        return self

    def stop(self) -> None:
        if self._receiver is not None:
            self._receiver.should_stop = True
        self._thread.join(timeout=5)

    def of(self, kind: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.events if e.get("type") == kind]


def run_failures(env: Env, *, max_retries: int = 1,
                 progress: Callable[[str], None] = lambda _: None) -> FailureResult:
    """One session per failure mode, all compacted at once by one real worker.

    The worker runs with ``COMPACTION_MAX_RETRIES`` and a 1 s backoff cap and
    a 1 s client timeout. Each case is checked for: the stored summary's
    kind (offline after a persistent failure, llm after a transient one),
    no fault text in any stored summary, exactly ``max_retries + 1`` LLM
    requests, one "will retry" warning per retry and one fallback warning in
    the worker log, and the task events: ``task-retried`` per retry, one
    ``task-succeeded``, no ``task-failed``.
    """
    result = FailureResult(max_retries=max_retries)
    store = env.store()
    turns = demo_turns(12)
    faults = {sid: (case.fault, case.times) for sid, case in FAILURE_CASES.items()}
    events = EventLog(env.broker_url).start()
    with ObservedLLM(faults=faults) as llm:
        worker = start_workers("fail", env.workers(
            summarizer="openai", summarizer_base_url=llm.base_url, summarizer_api_key="k",
            summarizer_timeout="1", max_retries=str(max_retries), retry_backoff_max="1"),
            1, concurrency=len(FAILURE_CASES) + 1)[0]
        publisher = publisher_app(env.broker_url)
        try:
            task_ids: dict[str, str] = {}
            sent: dict[str, float] = {}
            for sid in FAILURE_CASES:
                for turn in marked(turns, sid):
                    store.append(sid, turn)
                sent[sid] = time.monotonic()
                task_ids[sid] = publisher.send_task(TASK_COMPACT, args=[sid], kwargs={
                    "tenant": "default", "force": True, "keep_recent": 2000}, queue=QUEUE).id
            done_at: dict[str, float] = {}

            def finished() -> bool:
                for sid in FAILURE_CASES:
                    if sid not in done_at and store.state(sid).version:
                        done_at[sid] = time.monotonic()
                return len(done_at) == len(FAILURE_CASES) and env.drained()

            if not wait_for(finished, 60, 0.1):
                missing = sorted(set(FAILURE_CASES) - set(done_at))
                result.violations.append(f"jobs did not finish: {missing}")
            wait_for(lambda: set(task_ids.values())
                     <= {e.get("uuid") for e in events.of("task-succeeded")}, 10, 0.1)
        finally:
            worker.stop()
            events.stop()
    log = worker.log()
    for sid, spec in FAILURE_CASES.items():
        case = FailureCase(sid, spec.fault.kind,
                           seconds=done_at.get(sid, time.monotonic()) - sent[sid])
        summaries = store.summaries(sid)
        case.kind = ",".join(s.kind for s in summaries)
        case.llm_requests = len(llm.arrivals(sid))
        case.retries_logged = log.count(f"summarizer failed for {sid}, will retry")
        case.fallbacks_logged = log.count(f"summarizer failed for {sid}, falling back")
        for e in events.events:
            if e.get("uuid") == task_ids[sid]:
                case.events[str(e.get("type"))] += 1
        reasons = re.findall(rf"summarizer failed for {re.escape(sid)}[^:]*: (.*)", log)
        case.reason = reasons[-1].strip() if reasons else ", ".join(
            stage for record in summaries for stage in record.stages
            if stage.startswith("summarizer_overflow"))
        result.cases.append(case)
        result.violations += _check_failure_case(store, case, spec, max_retries)
    progress("failures: " + ", ".join(f"{c.session_id}={c.kind}" for c in result.cases))
    if result.violations:
        result.violations.append(f"worker log: {worker.log_path}")
    return result


def _check_failure_case(store: SessionStore, case: FailureCase, spec: FailureSpec,
                        max_retries: int) -> list[str]:
    """Stored kind, no fault text stored, requests and retries bounded, all of it visible."""
    sid = case.session_id
    attempts = (max_retries + 1 if spec.retried else 1) if spec.times is None else spec.times
    retries = min(attempts, max_retries) if spec.retried else 0
    problems = integrity(store, sid)
    if case.kind != spec.expected:
        problems.append(f"{sid}: stored summaries {case.kind or 'none'}, expected {spec.expected}")
    for record in store.summaries(sid):
        bad = [t for t in BAD_TEXT if t in record.text]
        if bad:
            problems.append(f"{sid}: a stored summary contains fault text {bad}")
    # A failing attempt stops at its first call; a good one makes one or two (split turn).
    low, high = spec.requests or ((attempts, attempts) if spec.expected == "offline"
                                  else (attempts + 1, attempts + 2))
    if not low <= case.llm_requests <= high:
        problems.append(f"{sid}: {case.llm_requests} LLM requests, expected {low}..{high} "
                        "(retries must be bounded)")
    if case.retries_logged != retries:
        problems.append(f"{sid}: {case.retries_logged} 'will retry' warnings, expected {retries}")
    fallback = int(spec.expected == "offline")
    if case.fallbacks_logged != fallback:
        problems.append(f"{sid}: {case.fallbacks_logged} fallback warnings, expected {fallback}")
    if case.events["task-retried"] != retries or case.events["task-succeeded"] != 1 \
            or case.events["task-failed"]:
        problems.append(f"{sid}: task events {dict(case.events)}, expected {retries} "
                        "task-retried and one task-succeeded")
    return problems


# ======================================================================== report
def fmt_ms(values: Sequence[float]) -> str:
    if not values:
        return "-"
    return (f"{percentile(values, 50):.1f} / {percentile(values, 99):.1f} / "
            f"{max(values):.1f}")


def report_kill9(r: Kill9Result, args: argparse.Namespace) -> list[str]:
    rec = r.recovery_seconds
    return [
        "### Worker killed (SIGKILL) during summarization",
        "",
        f"{r.trials} trials x {args.sessions_per_trial} sessions: each kill takes down the "
        f"worker while its jobs wait on the fake LLM ({args.llm_seconds:g} s per call); a new "
        "worker gets them back after the visibility timeout ("
        + (f"{args.visibility} s here)." if args.visibility else
           f"the default, {load_settings().visibility_timeout} s)."),
        "",
        "| jobs | killed before the commit | killed after the commit | redelivered | "
        "commits | LLM requests | kill -> all done (s, median / max) |",
        "|---|---|---|---|---|---|---|",
        f"| {r.jobs} | {r.killed_before_commit} | {r.killed_after_commit} | {r.redelivered} | "
        f"{r.commits} | {r.llm_requests} | "
        f"{statistics.median(rec) if rec else 0:.1f} / {max(rec) if rec else 0:.1f} |",
        "",
        f"Violations: {len(r.violations)}" + _first(r.violations),
    ]


def report_restart(r: RestartResult) -> list[str]:
    return [
        "### Redis killed and restarted (AOF, fsync always), then frozen",
        "",
        "| cycles | appends acknowledged | acknowledged and lost | appends that raised "
        "(of which applied) | Redis down (s) | guard: StoreUnavailable while down, ms p50/p99/max "
        "| while frozen (timeout "
        f"{r.timeout_s * 1000:.0f} ms) | back to a working prepare (ms, max) |",
        "|---|---|---|---|---|---|---|---|",
        f"| {r.cycles} | {r.acknowledged} | {r.lost} | {r.failed_appends} "
        f"({r.failed_applied}) | {max(r.down_seconds, default=0):.2f} | {fmt_ms(r.refused_ms)} "
        f"| {fmt_ms(r.hung_ms)} | {max(r.recovery_ms, default=0):.0f} |",
        "",
        f"Worker on the same Redis: {r.worker_jobs_after} jobs published after the restarts "
        "completed (no worker restart)." if r.worker_jobs_after else "",
        f"Violations: {len(r.violations)}" + _first(r.violations),
    ]


def report_races(r: RaceResult) -> list[str]:
    return [
        "### Races: appends, history edits, manual compactions",
        "",
        f"{r.workers} workers x 2 threads, {r.sessions} sessions, {r.seconds:.0f} s.",
        "",
        "| turns appended | views checked (3 providers) | history edits (version exact) | "
        "manual compactions sent | summaries committed | CAS lost | lease busy | "
        "watermark drops (all by edits) | summaries checked for staleness | drain (s) | "
        "requests run from the dirty flag | busy requests left unhonored |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        f"| {r.turns} | {r.views} | {r.edits} ({r.edits_exact}) | {r.manual_compactions} | "
        f"{r.commits} | {r.conflicts} | {r.busy} | {r.watermark_drops} | "
        f"{r.summaries_checked} | {r.drain_seconds:.1f} | {r.busy_run} | {r.unhonored} |",
        "",
        f"Violations: {len(r.violations)}" + _first(r.violations),
    ]


def report_load(r: LoadResult) -> list[str]:
    turns_s = r.turns / r.feed_seconds if r.feed_seconds else 0
    total = r.feed_seconds + r.drain_seconds
    return [
        "### Load",
        "",
        f"{r.sessions} sessions x {r.turns_per_session} turns ({r.messages} messages) fed by "
        f"{r.feeders} agent processes (prepare + record_turn per turn, round robin over "
        f"sessions), {r.workers} workers x {r.concurrency} threads, fake LLM with "
        "latency.",
        "",
        "| feed (s) | turns/s | messages/s | drain after feed (s) | summaries committed | "
        "commits/s | max queue | sessions compacted | under the trigger by "
        "cheap stages alone | still due at the end | views truncated by the guard |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        f"| {r.feed_seconds:.0f} | {turns_s:.0f} | {r.messages / r.feed_seconds:.0f} | "
        f"{r.drain_seconds:.1f} | {r.commits} | {r.commits / total:.1f} | {r.max_queue} | "
        f"{r.sessions_compacted} | {r.sessions_cheap_only} | "
        f"{r.still_due} | {r.truncated_views} |",
        "",
        "| call under load | p50 / p99 / max (ms) | samples |",
        "|---|---|---|",
        f"| `prepare` | {fmt_ms(r.prepare_ms)} | {len(r.prepare_ms)} |",
        f"| `record_turn` (append + coalesced enqueue) | {fmt_ms(r.record_ms)} | "
        f"{len(r.record_ms)} |",
        "",
        f"Redis memory: {r.used_memory_bytes / r.sessions / 1024:.0f} KiB per session "
        f"(`INFO memory` used_memory delta / sessions); `MEMORY USAGE` of a session's keys: "
        f"{r.key_bytes_per_session / 1024:.0f} KiB for {r.raw_bytes_per_session / 1024:.0f} KiB "
        f"of message JSON. LLM requests: {r.llm_requests}.",
        "",
        f"Violations: {len(r.violations)}" + _first(r.violations),
    ]


def report_failures(r: FailureResult) -> list[str]:
    lines = [
        "### Summarizer failures",
        "",
        f"`COMPACTION_MAX_RETRIES={r.max_retries}`, backoff cap 1 s, client timeout 1 s; "
        "one session per failure, one real worker.",
        "",
        "| failure | stored | LLM requests | 'will retry' logged | fallback logged | "
        "task events | logged reason | publish -> commit (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in r.cases:
        events = ", ".join(f"{k.removeprefix('task-')} {v}" for k, v in sorted(c.events.items())
                           if k in ("task-retried", "task-succeeded", "task-failed"))
        reason = c.reason.replace("|", "/")[:70]
        lines.append(f"| {c.session_id} | {c.kind} | {c.llm_requests} | {c.retries_logged} | "
                     f"{c.fallbacks_logged} | {events} | {reason} | {c.seconds:.1f} |")
    lines += ["", f"Violations: {len(r.violations)}" + _first(r.violations)]
    return lines


def _first(violations: Sequence[str]) -> str:
    return "".join(f"\n- {v}" for v in violations[:10])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", choices=["kill9", "restart", "races", "load", "failures",
                                             "all"])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--redis-url", default=None,
                        help="use this Redis (store db 7, broker db 8) instead of starting one")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--sessions-per-trial", type=int, default=2)
    parser.add_argument("--llm-seconds", type=float, default=1.0)
    parser.add_argument("--visibility", type=int, default=5,
                        help="kill9: visibility timeout; 0 runs the default timing settings")
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--feeders", type=int, default=2)
    parser.add_argument("--break-cas", action="store_true",
                        help="races: workers with a blind compare-and-swap (the checks must fail)")
    args = parser.parse_args(argv)
    if args.quick:
        args.trials, args.cycles, args.seconds = 3, 1, 15.0
        args.sessions, args.turns = 40, 20

    def progress(text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)

    chosen = ["kill9", "restart", "races", "failures", "load"] if args.scenario == "all" \
        else [args.scenario]
    out: list[str] = []
    failed = 0
    for name in chosen:
        progress(f"{name}: starting")
        lines: list[str]
        violations: list[str]
        if name == "kill9":
            with environment(args.redis_url) as env:
                k = run_kill9(env, trials=args.trials, sessions_per_trial=args.sessions_per_trial,
                              llm_seconds=args.llm_seconds,
                              visibility=args.visibility or None,
                              progress=progress)
            lines, violations = report_kill9(k, args), k.violations
        elif name == "restart":
            r = run_restart(cycles=args.cycles, with_worker=True, progress=progress)
            lines, violations = report_restart(r), r.violations
        elif name == "races":
            with environment(args.redis_url) as env:
                c = run_races(env, seconds=args.seconds, workers=args.workers,
                              break_cas=args.break_cas, progress=progress)
            lines, violations = report_races(c), c.violations
        elif name == "failures":
            with environment(args.redis_url) as env:
                f = run_failures(env, progress=progress)
            lines, violations = report_failures(f), f.violations
        else:
            load = run_load(sessions=args.sessions, turns=args.turns, feeders=args.feeders,
                            redis_url=args.redis_url, progress=progress)
            lines, violations = report_load(load), load.violations
        failed += len(violations)
        out += [*lines, ""]
        print("\n".join(lines) + "\n", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
