"""Worker throughput with a slow fake LLM, pool choice and per-job CPU, as markdown.

Real Celery worker processes (``celery -A workers.app worker``) consume
real ``compaction.maybe_summarize`` jobs from a Redis broker; each job
compacts one session in the Redis store and makes exactly one summarizer
call to a fake OpenAI-compatible server answering after ``--latency``
seconds (the fake runs in its own process, so its CPU is accounted apart).

The sessions are copies (server-side ``COPY``) of one template built the way
an agent builds it: turns recorded through ``ContextGuard`` until the
worker's own plan (``Compactor.plan``) says compaction is due with a cut on
a turn boundary, i.e. one LLM call, no split-turn prefix call, no folding.

A configuration suffixed ``@llm-only`` runs the same worker configuration,
broker, publish path and task name with a job that only makes that LLM call
(same request, same SDK client) and marks the session summarized: the
ceiling of the pool, the broker and the SDK, so that the gap to the real job
is the job's own work.

For every configuration: workers start, a warm-up batch lets each process
(each prefork child) build its runtime, the workers stop consuming
(``cancel_consumer``), ``--seconds`` worth of jobs at the ideal rate
(concurrency / latency) are published with ``request_summary``, and the
clock starts when consumption resumes (``add_consumer``); the run ends when
every session holds its LLM summary. Publishing is kept out of the window:
the agents that publish run on other machines.
Reported: jobs/s against the ideal, CPU per job (worker processes, fake,
Redis), the CPUs the workers kept busy, the other load on the machine while
timed, memory per worker, then where one job's CPU goes (cProfile with a CPU
clock, in-process, fake at zero latency). Every figure is the median of
``--rounds`` rounds, configurations interleaved within each round, so ratios
compare runs made minutes apart under similar load.

    .venv/bin/python scripts/bench_workers.py [--redis-url redis://127.0.0.1:6379/5]
        [--broker-url redis://127.0.0.1:6379/6] [--latency 0.5] [--window 32000]
        [--configs threads:32x1,threads:32x2,prefork:32x1,threads:32x1@llm-only,...]
        [--rounds 3] [--py-spy PATH]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import multiprocessing
import multiprocessing.connection
import os
import pstats
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import openai
import redis

from shared.core.config import CompactionPolicy, StoreConfig
from shared.core.messages import Message
from shared.core.turns import turn_starts
from shared.core.wire import from_openai
from shared.enqueue import (
    QUEUE,
    TASK_MAYBE_SUMMARIZE,
    CeleryEnqueuer,
    publisher_app,
    request_summary,
)
from shared.guard import ContextGuard
from shared.store.sessions import SessionStore, connect
from workers.compactor import Compactor
from workers.harness.demo_session import SYSTEM_PROMPT, TOOLS, generate_session
from workers.harness.fakes.counting import char_counter
from workers.harness.fakes.openai_server import FakeOpenAIServer
from workers.harness.fakes.summaries import SummarizerResponder
from workers.summarizer.engine import SummaryEngine
from workers.summarizer.prompts import build_summary_request
from workers.summarizer.providers import OpenAIClient

ROOT = Path(__file__).resolve().parent.parent
SUMMARIZER_MODEL = "gpt-4o-mini"
AGENT_MODEL = "gpt-4o"
TICK = os.sysconf("SC_CLK_TCK")


# -- machine ------------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def _cpu_ticks() -> tuple[int, int]:
    with open("/proc/stat", encoding="ascii") as handle:
        fields = [int(x) for x in handle.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def machine_busy(seconds: float = 1.0) -> float:
    """Share of all CPUs busy over the next ``seconds`` (we only sleep meanwhile)."""
    busy0, total0 = _cpu_ticks()
    time.sleep(seconds)
    busy1, total1 = _cpu_ticks()
    return (busy1 - busy0) / max(1, total1 - total0)


def wait_for_quiet(threshold: float, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    busy = machine_busy()
    while busy > threshold and time.monotonic() < deadline:
        busy = machine_busy()
    return busy


def loadavg() -> str:
    try:
        with open("/proc/loadavg", encoding="ascii") as handle:
            return " ".join(handle.read().split()[:3])
    except OSError:
        return "n/a"


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of one live process; 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def proc_memory(pid: int) -> tuple[float, float]:
    """(RSS, PSS) in MiB of one process (PSS shares copy-on-write pages fairly)."""
    rss = pss = 0.0
    with suppress(OSError), open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("Rss:"):
                rss = int(line.split()[1]) / 1024
            elif line.startswith("Pss:"):
                pss = int(line.split()[1]) / 1024
    return rss, pss


def children_of(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with suppress(OSError), open(f"/proc/{entry}/stat", encoding="ascii") as handle:
            if int(handle.read().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


# -- the fake LLM in its own process -----------------------------------------------------
def _serve_fake(conn: multiprocessing.connection.Connection, latency: float,
                counter_name: str) -> None:
    """Child process: a FakeOpenAIServer answering summaries; commands over the pipe."""
    counter = char_counter() if counter_name == "chars" else None
    server = FakeOpenAIServer(window=4_000_000, responder=SummarizerResponder(),
                              counter=counter, latency=latency)
    with server:
        conn.send(server.base_url)
        while True:
            command, arg = conn.recv()
            if command == "stop":
                break
            if command == "latency":
                server.latency = float(arg)
                conn.send(True)
            elif command == "reset":
                server.reset()
                conn.send(True)
            elif command == "count":
                conn.send(sum(1 for r in server.requests if r.path.endswith("/completions")))
            elif command == "stats":
                chats = [r for r in server.requests if r.path.endswith("/completions")]
                conn.send(([r.timestamp for r in chats], [r.status for r in chats],
                           [r.prompt_tokens or 0 for r in chats]))
    conn.close()


@dataclass
class FakeLLM:
    """Handle on the fake server process."""

    process: multiprocessing.process.BaseProcess
    conn: multiprocessing.connection.Connection
    base_url: str
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ask(self, command: str, arg: Any = None) -> Any:
        with self.lock:
            self.conn.send((command, arg))
            return self.conn.recv()

    def cpu(self) -> float:
        return proc_cpu(self.process.pid or 0)


@contextmanager
def fake_llm(latency: float) -> Iterator[FakeLLM]:
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=_serve_fake, args=(child, latency, "chars"), daemon=True)
    process.start()
    base_url = parent.recv()
    fake = FakeLLM(process, parent, base_url)
    try:
        yield fake
    finally:
        with suppress(OSError, EOFError):
            parent.send(("stop", None))
        process.join(10)
        if process.is_alive():
            process.kill()


def fake_capacity(fake: FakeLLM, request: list[dict[str, str]], clients: int,
                  seconds: float) -> tuple[float, int]:
    """Requests/s the fake serves to ``clients`` concurrent SDK clients (this process)."""
    client = openai.OpenAI(base_url=fake.base_url, api_key="bench", max_retries=0, timeout=30)
    deadline = time.monotonic() + seconds
    done = [0] * clients

    def loop(i: int) -> None:
        while time.monotonic() < deadline:
            client.chat.completions.create(
                model=SUMMARIZER_MODEL, messages=request,  # type: ignore[arg-type]
                max_tokens=2000)
            done[i] += 1

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(loop, range(clients)))
    wall = time.perf_counter() - started
    return sum(done) / wall, sum(done)


# -- sessions -----------------------------------------------------------------------------
def demo_turns(turns: int, seed: int) -> list[list[Message]]:
    body = from_openai(generate_session(turns, seed=seed))[1:]
    starts = turn_starts(body)
    return [body[a:b] for a, b in zip(starts, [*starts[1:], len(body)], strict=True)]


@dataclass(frozen=True)
class Template:
    session_id: str
    messages: int
    tokens: int
    summarized_messages: int
    summarized_tokens: int
    request: list[dict[str, str]]


def build_template(store: SessionStore, window: int, seed: int) -> Template:
    """Record turns through the guard until a job is due with a whole-turn cut."""
    turns = demo_turns(400, seed)
    planner = Compactor(store, SummaryEngine(OpenAIClient(
        SUMMARIZER_MODEL, base_url="http://127.0.0.1:9/v1", api_key="x")),
        policy=CompactionPolicy())  # only plans: no LLM call is made
    for attempt in range(20):
        sid = f"template-{window}-{attempt}"
        guard = ContextGuard(store, overrides={AGENT_MODEL: window})
        for turn in turns[attempt:]:
            view = guard.prepare(sid, SYSTEM_PROMPT, TOOLS, 2000, AGENT_MODEL, pending=turn[:1])
            if view.report.truncated:
                break
            guard.record_turn(sid, turn)
            plan = planner.plan(sid, store.load_view(sid), force=False, keep_recent=None)
            if isinstance(plan, str):
                continue
            if plan.prefix_start is not None:
                break  # a split turn would add a second call: try another start
            store.clear_pending(sid)
            data = store.load_view(sid)
            messages = data.messages()
            covered = messages[:plan.cut]
            request = build_summary_request(covered, None, start=0, max_summary_tokens=2000)
            return Template(sid, data.length, data.tokens_total, plan.cut,
                            store.range_tokens(sid, 0, plan.cut), request)
        store.delete_session(sid)
    raise SystemExit(f"no due session with a whole-turn cut for window {window}")


def copy_sessions(store: SessionStore, template: str, ids: list[str]) -> None:
    src = store.keys(template)
    client = store.redis
    present = [k for k in src.data_keys() if client.exists(k)]
    pipe = client.pipeline(transaction=False)
    for sid in ids:
        dst = store.keys(sid)
        for key in present:
            pipe.copy(key, key.replace(f"{{{src.tenant}:{src.session_id}}}",
                                       f"{{{dst.tenant}:{dst.session_id}}}"), replace=True)
        pipe.delete(dst.pending, dst.lease, dst.dirty)
    pipe.execute()


def delete_sessions(store: SessionStore, ids: list[str]) -> None:
    pipe = store.redis.pipeline(transaction=False)
    for sid in ids:
        k = store.keys(sid)
        pipe.delete(*k.data_keys(), k.pending, k.lease, k.dirty)
    pipe.execute()


def committed(store: SessionStore, ids: list[str]) -> tuple[int, int]:
    """(sessions with any summary, sessions with an LLM summary)."""
    pipe = store.redis.pipeline(transaction=False)
    for sid in ids:
        pipe.hmget(store.keys(sid).state, "watermark", "summary_kind")
    rows = pipe.execute()
    any_summary = sum(1 for w, _ in rows if w is not None and int(w) > 0)
    llm = sum(1 for w, kind in rows if w is not None and int(w) > 0 and kind == b"llm")
    return any_summary, llm


# -- the LLM-only job: same worker, broker and LLM call, no compaction work --------------------
WORKER_APP = "workers.app"
LLM_ONLY_APP = "bench_workers:llm_only_app"
REQUEST_KEY = "bench:request"
"""Under the store's key prefix: the template's LLM request and cut, for the LLM-only job."""


def store_request(store: SessionStore, template: Template) -> None:
    store.redis.set(f"{store.config.key_prefix}:{REQUEST_KEY}",
                    json.dumps({"request": template.request,
                                "cut": template.summarized_messages}))


def _build_llm_only_app() -> Any:
    """A worker app whose ``compaction.maybe_summarize`` only makes the job's LLM call.

    Same Celery configuration (``workers.app.celery_config``), same runtime
    (store client, ``OpenAIClient``), same publish path and task name; the job
    clears the pending flag, sends the template's request (the one a real job
    sends) and marks the session summarized. It skips what the real job adds:
    lease, view loads, plan, transcript rendering, token counts, ledger, commit.
    The gap between the two is the job's own work; this one is the ceiling of
    the pool, the broker and the SDK.
    """
    from celery import Celery

    from workers.app import celery_config
    from workers.runtime import get_runtime
    from workers.settings import load_settings

    settings = load_settings()
    app = Celery("compaction-bench-llm-only", set_as_current=False)
    app.conf.update(celery_config(settings))
    cache: dict[str, Any] = {}

    @app.task(name=TASK_MAYBE_SUMMARIZE)  # type: ignore[untyped-decorator]
    def llm_only(session_id: str, tenant: str = "default") -> dict[str, Any]:
        runtime = get_runtime(settings)
        store = runtime.store.for_tenant(tenant)
        store.clear_pending(session_id)
        if "request" not in cache:
            raw = store.redis.get(f"{settings.key_prefix}:{REQUEST_KEY}")
            cache.update(json.loads(raw))
        client = runtime.engine.client
        if client is None:
            raise RuntimeError("the LLM-only job needs COMPACTION_SUMMARIZER=openai")
        completion = client.complete(cache["request"], 2000)
        store.redis.hset(store.keys(session_id).state,
                         mapping={"watermark": cache["cut"], "summary_kind": "llm"})
        return {"session_id": session_id, "status": "compacted",
                "summarizer_input_tokens": completion.input_tokens}

    return app


def __getattr__(name: str) -> Any:
    """``llm_only_app`` is built on first access: only the LLM-only worker builds it."""
    if name == "llm_only_app":
        app = _build_llm_only_app()
        globals()[name] = app
        return app
    raise AttributeError(name)


# -- worker processes -----------------------------------------------------------------------
@dataclass
class WorkerSet:
    """``processes`` Celery worker processes of one pool configuration."""

    pool: str
    concurrency: int
    processes: int
    env: dict[str, str]
    app: str = WORKER_APP
    popens: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])

    def names(self) -> list[str]:
        """Node names of the processes (for remote control aimed at these workers only)."""
        host = socket.gethostname()
        return [f"bench{i}-{self.tag}@{host}" for i in range(self.processes)]

    @property
    def label(self) -> str:
        return f"{self.pool} -c {self.concurrency} x {self.processes} process" + (
            "es" if self.processes > 1 else "") + (" (LLM-only job)" if self.app != WORKER_APP
                                                   else "")

    def start(self, timeout: float = 120) -> float:
        """Start and wait until every process is ready; seconds it took."""
        started = time.perf_counter()
        for i in range(self.processes):
            fd, name = tempfile.mkstemp(prefix="bench_workers_", suffix=".log")
            os.close(fd)
            path = Path(name)
            self.logs.append(path)
            cmd = [sys.executable, "-m", "celery", "-A", self.app, "worker",
                   "--pool", self.pool, "-c", str(self.concurrency), "-Q", "compaction",
                   "-n", f"bench{i}-{self.tag}@%h", "--without-mingle", "--without-gossip",
                   "-l", "INFO"]
            env = {**os.environ, **self.env}
            if self.app != WORKER_APP:  # the LLM-only app lives in this script
                env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "scripts"), str(ROOT)])
            with path.open("wb") as log:
                self.popens.append(subprocess.Popen(
                    cmd, cwd=ROOT, env=env, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + timeout
        for popen, path in zip(self.popens, self.logs, strict=True):
            while " ready." not in path.read_text(errors="replace"):
                if popen.poll() is not None or time.monotonic() > deadline:
                    tail = path.read_text(errors="replace")[-2000:]
                    self.stop()
                    raise SystemExit(f"worker did not start:\n{tail}")
                time.sleep(0.1)
        return time.perf_counter() - started

    def pids(self) -> list[int]:
        out: list[int] = []
        for popen in self.popens:
            out.append(popen.pid)
            out.extend(children_of(popen.pid))
        return out

    def cpu(self) -> float:
        return sum(proc_cpu(pid) for pid in self.pids())

    def memory(self) -> tuple[float, float, int]:
        """(total RSS, total PSS) in MiB and how many OS processes."""
        pids = self.pids()
        mems = [proc_memory(pid) for pid in pids]
        return sum(m[0] for m in mems), sum(m[1] for m in mems), len(pids)

    def log_tail(self, chars: int = 3000) -> str:
        return "".join(p.read_text(errors="replace")[-chars:] for p in self.logs)

    def errors(self) -> int:
        return sum(path.read_text(errors="replace").count("Traceback") for path in self.logs)

    def stop(self) -> None:
        for popen in self.popens:
            if popen.poll() is None:
                with suppress(ProcessLookupError):
                    os.killpg(popen.pid, signal.SIGTERM)
        for popen in self.popens:
            try:
                popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(popen.pid, signal.SIGKILL)
                popen.wait(timeout=10)
        for path in self.logs:
            path.unlink(missing_ok=True)
        self.popens, self.logs = [], []


# -- one measured run ----------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    """One pool configuration and which job its workers run."""

    pool: str
    concurrency: int
    processes: int
    llm_only: bool = False

    @property
    def slots(self) -> int:
        return self.concurrency * self.processes


@dataclass
class RunResult:
    label: str
    jobs: int
    ideal: float
    wall: float
    steady: float
    llm_calls: int
    llm_summaries: int
    worker_cpu_ms: float
    fake_cpu_ms: float
    redis_cpu_ms: float
    rss: float
    pss: float
    os_processes: int
    errors: int
    start_seconds: float
    warmup_seconds: float
    busy_before: float
    others_during: float
    """Share of the machine's CPUs busy with processes other than the workers, the fake,
    Redis and this script while the run was timed."""

    @property
    def rate(self) -> float:
        return self.jobs / self.wall

    @property
    def worker_cores(self) -> float:
        """CPUs the worker processes kept busy on average while timed."""
        return self.rate * self.worker_cpu_ms / 1000


@dataclass
class Bench:
    args: argparse.Namespace
    store: SessionStore
    template: Template
    fake: FakeLLM
    enqueuer: CeleryEnqueuer
    env: dict[str, str]
    redis_pid: int
    control: Any

    def publish(self, ids: list[str]) -> None:
        for sid in ids:
            if not request_summary(self.store, self.enqueuer, sid):
                raise SystemExit(f"{sid}: a job was already pending")

    def start_spy(self, pid: int, output: Path | None, jobs: int,
                  seconds: float) -> subprocess.Popen[bytes] | None:
        """py-spy on the thread holding the GIL, once 15% of the jobs have called the LLM."""
        if output is None or not self.args.py_spy:
            return None
        deadline = time.monotonic() + 60
        while self.fake.ask("count") < jobs * 0.15 and time.monotonic() < deadline:
            time.sleep(0.05)
        cmd = [self.args.py_spy, "record", "--pid", str(pid), "--rate", "100", "--gil",
               "--format", "raw", "--output", str(output), "--duration",
               str(max(2, int(seconds)))]
        log = output.with_suffix(".log").open("wb")
        try:
            return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()

    def wait_all(self, ids: list[str], llm_calls: int, timeout: float,
                 workers: WorkerSet, stall: float = 30) -> float:
        """Block until every session is summarized; the time it happened (perf_counter).

        Fails fast when nothing moves for ``stall`` seconds (a broken template, a
        dead worker).
        """
        deadline = time.monotonic() + timeout
        progress, moved = (-1, -1), time.monotonic()
        while time.monotonic() < deadline:
            calls = self.fake.ask("count")
            done = committed(self.store, ids)[0] if calls >= llm_calls else -1
            if done >= len(ids):
                return time.perf_counter()
            if (calls, done) != progress:
                progress, moved = (calls, done), time.monotonic()
            elif time.monotonic() - moved > stall:
                break
            time.sleep(0.02 if calls >= llm_calls else 0.1)
        raise SystemExit(f"stalled: {progress[0]} LLM calls, {committed(self.store, ids)} of "
                         f"{len(ids)} committed; worker log:\n{workers.log_tail()}")

    def run(self, config: Config, busy: float, spy_output: Path | None = None) -> RunResult:
        args = self.args
        slots = config.slots
        ideal = slots / args.latency
        jobs = max(slots, round(ideal * args.seconds / slots) * slots)
        warm = [f"warm-{i}" for i in range(2 * slots)]
        ids = [f"job-{i}" for i in range(jobs)]
        copy_sessions(self.store, self.template.session_id, warm + ids)
        workers = WorkerSet(config.pool, config.concurrency, config.processes, self.env,
                            app=LLM_ONLY_APP if config.llm_only else WORKER_APP)
        try:
            start_seconds = workers.start()
            self.fake.ask("reset")
            t0 = time.perf_counter()
            self.publish(warm)
            # Prefork children build their runtime on their first job, all at once:
            # on a busy machine that can take a while without any visible progress.
            self.wait_all(warm, len(warm), timeout=600, workers=workers, stall=180)
            warmup = time.perf_counter() - t0
            # Publish the whole batch while the workers do not consume (the agents that
            # publish run elsewhere in production), then let them loose at once.
            self.control.cancel_consumer(QUEUE, reply=True, timeout=5,
                                         destination=workers.names())
            self.publish(ids)
            time.sleep(0.5)
            self.fake.ask("reset")
            cpu0, fake0, redis0 = workers.cpu(), self.fake.cpu(), proc_cpu(self.redis_pid)
            machine0, own0 = _cpu_ticks()[0], time.process_time()
            started = time.perf_counter()
            replies = self.control.add_consumer(QUEUE, reply=True, timeout=5,
                                                destination=workers.names())
            if len(replies) != config.processes:
                raise SystemExit(f"add_consumer answered by {len(replies)} of "
                                 f"{config.processes} workers: {replies}")
            spy = self.start_spy(workers.popens[0].pid, spy_output, jobs, args.seconds * 0.6)
            ended = self.wait_all(ids, jobs, timeout=60 + 8 * jobs / ideal, workers=workers)
            machine1, own1 = _cpu_ticks()[0], time.process_time()
            if spy is not None:
                spy.wait(timeout=60)
            cpu1, fake1, redis1 = workers.cpu(), self.fake.cpu(), proc_cpu(self.redis_pid)
            rss, pss, nproc = workers.memory()
            stamps, statuses, _ = self.fake.ask("stats")
            llm = committed(self.store, ids)[1]
            errors = workers.errors()
        finally:
            workers.stop()
            delete_sessions(self.store, warm + ids)
        stamps.sort()
        lo, hi = stamps[len(stamps) // 10], stamps[(len(stamps) * 9) // 10]
        steady = (len(stamps) * 8 // 10) / (hi - lo) if hi > lo else float("nan")
        wall = ended - started
        ours = (cpu1 - cpu0) + (fake1 - fake0) + (redis1 - redis0) + (own1 - own0)
        others = max(0.0, (machine1 - machine0) / TICK - ours) / (wall * (os.cpu_count() or 1))
        return RunResult(
            label=workers.label, jobs=jobs, ideal=ideal, wall=wall, steady=steady,
            llm_calls=sum(1 for s in statuses if s == 200), llm_summaries=llm,
            worker_cpu_ms=(cpu1 - cpu0) / jobs * 1000, fake_cpu_ms=(fake1 - fake0) / jobs * 1000,
            redis_cpu_ms=(redis1 - redis0) / jobs * 1000, rss=rss, pss=pss, os_processes=nproc,
            errors=errors, start_seconds=start_seconds, warmup_seconds=warmup,
            busy_before=busy, others_during=min(1.0, others))


# -- where one job's CPU goes ----------------------------------------------------------------
PROFILE_PARTS: list[tuple[str, str, str]] = [
    ("Compactor.run (one job, in-process, no Celery)", "compactor.py", "run"),
    ("store.load_view (EVALSHA, reply parsing, state/summary models, per-message counts)",
     "store.py", "load_view"),
    ("ViewData.messages (decoding the session's messages)", "records.py", "messages"),
    ("Compactor.plan (trigger, find_cut_point, tokens freed)", "compactor.py", "plan"),
    ("  find_cut_point", "turns.py", "find_cut_point"),
    ("extract_facts (ledger)", "ledger.py", "extract_facts"),
    ("SummaryEngine.summarize (prompt + LLM call + quality check)", "engine.py", "summarize"),
    ("  chunk_for_window (sizes the request)", "prompts.py", "chunk_for_window"),
    ("  render_messages (renders the transcript, once)", "prompts.py", "render_messages"),
    ("  build_summary_request (assembles the request)", "prompts.py", "build_summary_request"),
    ("  OpenAIClient.complete (openai SDK, httpx2, JSON both ways)", "providers.py", "complete"),
    ("  check_summary (quality gate)", "quality.py", "check_summary"),
    ("the store's per-message counts handed to the job's counter", "compactor.py",
     "_seed_counts"),
    ("message token estimates (messages the store did not count)", "tokens.py",
     "estimate_message_tokens"),
    ("Ledger.missing_from / render / to_json", "ledger.py", "missing_from"),
    ("store.commit_summary (Lua CAS)", "store.py", "commit_summary"),
    ("logging (json.dumps of the outcome)", "compactor.py", "as_dict"),
]


def profile_jobs(bench: Bench, jobs: int, top: int) -> tuple[float, list[tuple[str, float]],
                                                              list[str]]:
    """CPU ms per job in-process, and a cProfile breakdown (shares) on the thread's CPU clock."""
    store = bench.store
    client = OpenAIClient(SUMMARIZER_MODEL, base_url=bench.fake.base_url, api_key="bench",
                          timeout=30)
    compactor = Compactor(store, SummaryEngine(client, counter=store.counter),
                          policy=CompactionPolicy(), counter=store.counter)
    bench.fake.ask("latency", 0.0)
    ids = [f"prof-{i}" for i in range(2 * jobs + 5)]
    copy_sessions(store, bench.template.session_id, ids)
    try:
        for sid in ids[:5]:  # warm the client's connection and the scripts
            compactor.run(sid)
        cpu0 = time.thread_time()
        for sid in ids[5:5 + jobs]:
            outcome = compactor.run(sid)
            if outcome.status != "compacted" or "turn_prefix_summary" in outcome.stages:
                raise SystemExit(f"profiled job did not compact in one call: {outcome}")
        per_job = (time.thread_time() - cpu0) / jobs * 1000
        profiler = cProfile.Profile(time.thread_time)
        profiler.enable()
        for sid in ids[5 + jobs:]:
            compactor.run(sid)
        profiler.disable()
    finally:
        bench.fake.ask("latency", bench.args.latency)
        delete_sessions(store, ids)
    raw: dict[Any, Any] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    whole = sum(ct for (filename, _line, name), (_cc, _nc, _tt, ct, _c) in raw.items()
                if name == "run" and filename.endswith("compactor.py"))
    parts = []
    for label, file_part, func in PROFILE_PARTS:
        total = sum(ct for (filename, _line, name), (_cc, _nc, _tt, ct, _c) in raw.items()
                    if name == func and filename.endswith(file_part))
        parts.append((label, total / whole if whole else 0.0))
    rows = sorted(((tt, nc, f"{fn.split('site-packages/')[-1].replace(str(ROOT) + '/', '')}"
                    f":{line}({name})") for (fn, line, name), (_cc, nc, tt, _ct, _c)
                   in raw.items()), reverse=True)
    table = ["| function | calls per job | share of own CPU |", "|---|---|---|"]
    total_own = sum(r[0] for r in rows) or 1.0
    table += [f"| `{where}` | {nc / jobs:.1f} | {tt / total_own:.1%} |"
              for tt, nc, where in rows[:top]]
    return per_job, parts, table


SPY_PARTS: list[tuple[str, tuple[str, ...], bool]] = [
    # (label, any of these frames, only outside the task body)
    ("outside the task body (Celery and kombu)", (), True),
    ("  task events published (`EventDispatcher`, Flower's feed)", ("EventDispatcher.send",
                                                                    "EventDispatcher.flush",
                                                                    "EventDispatcher.publish"),
     True),
    ("  receiving jobs (BRPOP, QoS bookkeeping, request objects)", (
        "Channel._brpop_read", "Channel._brpop_start", "MultiChannelPoller.on_poll_start"),
     True),
    ("  acknowledging jobs (`basic_ack`, unacked index)", ("Message.ack",), True),
    ("  task tracing around the body (result repr, success log, request stack)",
     ("fast_trace_task",), True),
    ("task body (`run_job`)", ("run_job",), False),
    ("  lease, pending and dirty flags (Redis)", (
        "SessionStore.claim", "SessionStore.finish_lease", "SessionStore.acquire_lease",
        "SessionStore.release_lease", "SessionStore.take_dirty"), False),
    ("  `store.load_view`", ("load_view",), False),
    ("  decoding messages (`ViewData.messages`, `store.messages`)", ("ViewData.messages",),
     False),
    ("  `Compactor.plan`", ("Compactor.plan",), False),
    ("    `find_cut_point`", ("find_cut_point",), False),
    ("  `extract_facts`", ("extract_facts",), False),
    ("  `SummaryEngine.summarize`", ("SummaryEngine.summarize",), False),
    ("    `chunk_for_window`", ("chunk_for_window",), False),
    ("    `build_summary_request`", ("build_summary_request",), False),
    ("    `OpenAIClient.complete` (openai SDK, httpx)", ("OpenAIClient.complete",), False),
    ("    `check_summary`", ("check_summary",), False),
    ("  token estimation, anywhere in the job", (
        "estimate_messages_tokens", "estimate_message_tokens", "estimate_tokens"), False),
    ("  `commit_summary`", ("commit_summary",), False),
    ("  logging in the job", ("Logger.info", "Logger.warning"), False),
]


def spy_breakdown(path: Path, top: int) -> tuple[int, list[tuple[str, float]], list[str]]:
    """Shares of GIL-holding samples by part (inclusive) and the top leaf functions."""
    stacks: list[tuple[list[str], int]] = []
    for line in path.read_text(errors="replace").splitlines():
        frames, _, count = line.rpartition(" ")
        if frames and count.isdigit():
            stacks.append(([f.split(" (", 1)[0] for f in frames.split(";")], int(count)))
    total = sum(n for _, n in stacks) or 1

    def has(names: list[str], wanted: str) -> bool:
        return any(n == wanted or n.endswith("." + wanted) for n in names)

    parts = []
    for label, markers, outside in SPY_PARTS:
        hit = sum(n for names, n in stacks
                  if (not outside or not has(names, "run_job"))
                  and (not markers or any(has(names, m) for m in markers)))
        parts.append((label, hit / total))
    leaves: dict[str, int] = {}
    for line in path.read_text(errors="replace").splitlines():
        frames, _, count = line.rpartition(" ")
        if frames and count.isdigit():
            leaf = frames.split(";")[-1].replace(str(ROOT) + "/", "")
            leaves[leaf] = leaves.get(leaf, 0) + int(count)
    table = ["| leaf function (GIL held) | share |", "|---|---|"]
    table += [f"| `{leaf}` | {n / total:.1%} |"
              for leaf, n in sorted(leaves.items(), key=lambda kv: -kv[1])[:top]]
    return total, parts, table


# -- report -----------------------------------------------------------------------------------
def median_of(results: list[RunResult], fn: Callable[[RunResult], float]) -> float:
    return statistics.median(fn(r) for r in results)


def parse_configs(text: str) -> list[Config]:
    """``pool:CxP`` items, comma separated; ``@llm-only`` runs the LLM-only job."""
    out = []
    for item in text.split(","):
        spec, _, job = item.strip().partition("@")
        pool, _, rest = spec.partition(":")
        concurrency, _, processes = rest.partition("x")
        if (pool not in ("threads", "prefork", "solo") or not concurrency.isdigit()
                or not (processes or "1").isdigit() or job not in ("", "llm-only")):
            raise SystemExit(f"--configs: bad item {item!r} (pool:CxP[@llm-only], e.g. "
                             "threads:32x2)")
        out.append(Config(pool, int(concurrency), int(processes or 1), job == "llm-only"))
    return out


def report(bench: Bench) -> None:
    args, template = bench.args, bench.template
    configs = parse_configs(args.configs)
    print("## Worker throughput and pool\n")
    flags = " ".join(sys.argv[1:])
    print(f"Command: `.venv/bin/python scripts/bench_workers.py{' ' + flags if flags else ''}` "
          "(real `celery -A workers.app "
          "worker` processes, Redis broker and store on 127.0.0.1:6379 in their own dbs, "
          f"fake OpenAI server in its own process answering after {args.latency * 1000:.0f} ms; "
          f"{args.rounds} rounds, configurations interleaved; medians over rounds; "
          f"{os.cpu_count()} CPUs shared with other users).\n")

    request_tokens = char_counter()(template.request, None)
    capacity, served = fake_capacity(bench.fake, template.request, args.fake_clients,
                                     args.fake_seconds)
    print(f"Jobs: `compaction.maybe_summarize` published with `request_summary` (pending flag + "
          f"`CeleryEnqueuer`) while the workers' consumers are cancelled, timed from "
          "`add_consumer` to the last commit; one session each: a copy of a "
          f"{template.messages}-message "
          f"session (~{template.tokens} estimated tokens, window {args.window}) recorded "
          "through `ContextGuard`; each job loads the view, plans, summarizes messages "
          f"[0, {template.summarized_messages}) (~{template.summarized_tokens} tokens, a "
          f"~{request_tokens}-token request) in exactly one LLM call on a turn boundary, "
          "commits through the CAS (the view after it is derived, not read again).\n")
    print(f"Fake LLM capacity: {capacity:.0f} requests/s with {args.fake_clients} concurrent "
          f"SDK clients sending that request at {args.latency * 1000:.0f} ms latency "
          f"({served} requests in {args.fake_seconds:.0f} s; ideal "
          f"{args.fake_clients / args.latency:.0f}/s): "
          f"{'not the bottleneck' if capacity > 64 else 'TOO SLOW'} for 64 jobs/s"
          + (" per process pair." if capacity > 128 else ".") + "\n")

    results: dict[Config, list[RunResult]] = {c: [] for c in configs}
    fd, spy_name = tempfile.mkstemp(prefix="bench_workers_spy_", suffix=".txt")
    os.close(fd)
    spy_path = Path(spy_name)
    try:
        for _ in range(args.rounds):
            for config in configs:
                busy = wait_for_quiet(args.quiet, args.quiet_wait)
                results[config].append(bench.run(config, busy=busy))
        print_results(results)
        verdicts(results)
        if args.py_spy:
            busy = wait_for_quiet(args.quiet, args.quiet_wait)
            spied = bench.run(Config("threads", 32, 1), busy=busy, spy_output=spy_path)
        if args.py_spy and spy_path.stat().st_size:
            samples, spy_parts, spy_table = spy_breakdown(spy_path, args.profile_top)
            print("\nWhere the worker's GIL time goes (threads -c 32 x 1, an extra run with "
                  "py-spy `--gil` sampling the thread that holds the GIL at 100 Hz for "
                  f"{max(2, int(args.seconds * 0.6))} s mid-run, {samples} samples; sampling "
                  f"pauses the process, the run made {spied.rate:.1f} jobs/s; inclusive "
                  "shares):\n")
            print("| part | share of GIL-holding samples |")
            print("|---|---|")
            for label, share in spy_parts:
                print(f"| {label} | {share:.0%} |")
            print("\n" + "\n".join(spy_table))
    finally:
        spy_log = spy_path.with_suffix(".log")
        if args.py_spy and spy_log.exists() and not spy_path.stat().st_size:
            print(f"\n(py-spy recorded nothing: {spy_log.read_text(errors='replace')[-500:]})")
        spy_path.unlink(missing_ok=True)
        spy_log.unlink(missing_ok=True)

    per_job, parts, table = profile_jobs(bench, args.profile_jobs, args.profile_top)
    print(f"\nWhere one job's CPU goes without Celery (in-process `Compactor.run` on the same "
          f"sessions, fake at zero latency in its own process): {per_job:.1f} CPU ms per job. "
          f"Shares from cProfile on the thread's CPU clock over {args.profile_jobs} jobs "
          "(inclusive; the profiler inflates Python-heavy parts, so the ms column is the share "
          "times the unprofiled figure, approximate):\n")
    print("| part | share of `Compactor.run` | ~CPU ms per job |")
    print("|---|---|---|")
    for label, share in parts:
        print(f"| {label} | {share:.0%} | {share * per_job:.1f} |")
    print("\nTop functions by own CPU time:\n")
    print("\n".join(table))
    size_sweep(bench)


def size_sweep(bench: Bench) -> None:
    """threads -c 32 x 1 with smaller and larger sessions (one run each)."""
    args = bench.args
    windows = [int(w) for w in args.size_sweep.split(",") if w.strip()]
    if not windows:
        return
    print("\nJob size (threads -c 32 x 1 process, one run per window; the job's summarized "
          "range grows with the window the agent fills):\n")
    print("| window | session tokens | summarized tokens | jobs/s | of ideal 64 | "
          "worker CPU ms/job | worker CPUs busy | other load during |")
    print("|---|---|---|---|---|---|---|---|")
    for window in [*windows, args.window]:
        try:
            template = (bench.template if window == args.window
                        else build_template(bench.store, window, args.seed))
        except SystemExit as exc:
            print(f"| {window} | - | - | - | - | - | no template: {exc} |")
            continue
        sized = replace(bench, template=template)
        busy = wait_for_quiet(args.quiet, args.quiet_wait)
        result = sized.run(Config("threads", 32, 1), busy=busy)
        print(f"| {window} | {template.tokens} | {template.summarized_tokens} | "
              f"{result.rate:.1f} | {result.rate / 64:.0%} | {result.worker_cpu_ms:.1f} | "
              f"{result.worker_cores:.2f} | {result.others_during:.0%} |")
        if template is not bench.template:
            bench.store.delete_session(template.session_id)


def print_results(results: dict[Config, list[RunResult]]) -> None:
    print("| pool (job) | jobs per run | ideal jobs/s | jobs/s (median) | of ideal | steady "
          "jobs/s (10-90%) | runs (jobs/s) | worker CPU ms/job | worker CPUs busy | fake CPU "
          "ms/job | Redis CPU ms/job | other load during (per run) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for runs in results.values():
        rate = median_of(runs, lambda r: r.rate)
        print(f"| {runs[0].label} | {runs[0].jobs} | {runs[0].ideal:.0f} | {rate:.1f} | "
              f"{rate / runs[0].ideal:.0%} | {median_of(runs, lambda r: r.steady):.1f} | "
              f"{', '.join(f'{r.rate:.1f}' for r in runs)} | "
              f"{median_of(runs, lambda r: r.worker_cpu_ms):.1f} | "
              f"{median_of(runs, lambda r: r.worker_cores):.2f} | "
              f"{median_of(runs, lambda r: r.fake_cpu_ms):.1f} | "
              f"{median_of(runs, lambda r: r.redis_cpu_ms):.1f} | "
              f"{', '.join(f'{r.others_during:.0%}' for r in runs)} |")

    print("\n| pool (job) | OS processes | RSS MiB (total) | PSS MiB (total) | PSS MiB per slot "
          "| start s | warm-up s (first job of each slot) | LLM calls / jobs | LLM summaries "
          "| tracebacks |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for config, runs in results.items():
        print(f"| {runs[0].label} | {runs[0].os_processes} | "
              f"{median_of(runs, lambda r: r.rss):.0f} | {median_of(runs, lambda r: r.pss):.0f} "
              f"| {median_of(runs, lambda r: r.pss) / config.slots:.1f} | "
              f"{median_of(runs, lambda r: r.start_seconds):.1f} | "
              f"{median_of(runs, lambda r: r.warmup_seconds):.1f} | "
              f"{sum(r.llm_calls for r in runs)} / {sum(r.jobs for r in runs)} | "
              f"{sum(r.llm_summaries for r in runs)} | {sum(r.errors for r in runs)} |")


def verdicts(results: dict[Config, list[RunResult]]) -> None:
    """The issue's targets, for the real job and for the LLM-only job (same rounds)."""
    print("\nTargets (ratios within the same round):\n")
    for llm_only in (False, True):
        job = "LLM-only job" if llm_only else "real job"
        one = results.get(Config("threads", 32, 1, llm_only))
        two = results.get(Config("threads", 32, 2, llm_only))
        if one:
            rate = median_of(one, lambda r: r.rate)
            cpu = median_of(one, lambda r: r.worker_cpu_ms)
            print(f"- {job}, one process, threads -c 32: {rate:.1f} jobs/s = {rate / 64:.0%} of "
                  f"the ideal 64 ({'met' if rate >= 0.85 * 64 else 'NOT met'}, target >= 85%); "
                  f"at {cpu:.1f} worker CPU ms per job one process (one GIL) cannot exceed "
                  f"{1000 / cpu:.0f} jobs/s even on an idle CPU.")
        if one and two:
            ratios = [b.rate / a.rate for a, b in zip(one, two, strict=True)]
            ratio = statistics.median(ratios)
            print(f"- {job}, two processes / one: {ratio:.2f}x (per round: "
                  f"{', '.join(f'{r:.2f}' for r in ratios)}; "
                  f"{'met' if ratio >= 1.8 else 'NOT met'}, target >= 1.8x).")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/5",
                        help="session store (own db; unique key prefix, cleaned up)")
    parser.add_argument("--broker-url", default="redis://127.0.0.1:6379/6",
                        help="Celery broker (own db: the queue is purged before and after)")
    parser.add_argument("--latency", type=float, default=0.5, help="fake LLM latency, seconds")
    parser.add_argument("--window", type=int, default=32_000,
                        help="the agent model's context window the sessions fill")
    parser.add_argument("--configs", default="threads:32x1,threads:32x2,prefork:32x1,"
                        "threads:32x1@llm-only,threads:32x2@llm-only",
                        help="pool:CONCURRENCYxPROCESSES[@llm-only], comma separated")
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="jobs per run = ideal rate x this")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fake-clients", type=int, default=96)
    parser.add_argument("--fake-seconds", type=float, default=5.0)
    parser.add_argument("--profile-jobs", type=int, default=30)
    parser.add_argument("--profile-top", type=int, default=15)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--size-sweep", default="8000,128000",
                        help="other windows to run threads -c 32 x 1 with (empty: none)")
    parser.add_argument("--py-spy", default=shutil.which("py-spy"),
                        help="py-spy binary: sample the worker's GIL holder mid-run")
    parser.add_argument("--quiet", type=float, default=0.5,
                        help="wait before each run until other load is under this share")
    parser.add_argument("--quiet-wait", type=float, default=0.0,
                        help="longest wait for a quiet machine per run, seconds (0: none)")
    args = parser.parse_args(argv)
    run(args)
    return 0


def broker_keys(url: str) -> set[bytes]:
    client = redis.Redis.from_url(url)
    try:
        return set(client.scan_iter(count=1000))
    finally:
        client.close()


def clean_broker(url: str, before: set[bytes]) -> None:
    """Drop the queue and whatever kombu created in the broker db during the run."""
    client = redis.Redis.from_url(url)
    client.delete(QUEUE, "unacked", "unacked_index", "unacked_mutex")
    for key in set(client.scan_iter(count=1000)) - before:
        client.delete(key)
    client.close()


def run(args: argparse.Namespace) -> None:
    prefix = "bw" + uuid.uuid4().hex[:8]
    config = StoreConfig(key_prefix=prefix, socket_timeout=10, connect_timeout=5)
    client = connect(args.redis_url, config)
    store = SessionStore(client, config)
    broker_before = broker_keys(args.broker_url)
    clean_broker(args.broker_url, broker_before)  # stale jobs of an interrupted run
    load_before = loadavg()
    redis_pid = int(client.info("server").get("process_id", 0))
    try:
        template = build_template(store, args.window, args.seed)
        store_request(store, template)
        with fake_llm(args.latency) as fake:
            env = {"COMPACTION_BROKER_URL": args.broker_url, "COMPACTION_REDIS_URL": args.redis_url,
                   "COMPACTION_KEY_PREFIX": prefix, "COMPACTION_SUMMARIZER": "openai",
                   "COMPACTION_SUMMARIZER_BASE_URL": fake.base_url,
                   "COMPACTION_SUMMARIZER_API_KEY": "bench",
                   "COMPACTION_SUMMARIZER_MODEL": SUMMARIZER_MODEL,
                   "COMPACTION_SUMMARIZER_TIMEOUT": "60", "PYTHONUNBUFFERED": "1"}
            app = publisher_app(args.broker_url, timeout=5)
            report(Bench(args, store, template, fake, CeleryEnqueuer(app), env, redis_pid,
                         app.control))
    finally:
        for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            client.delete(key)
        clean_broker(args.broker_url, broker_before)
    print(f"\nLoad average (1, 5, 15 min): {load_before} before, {loadavg()} after.")


if __name__ == "__main__":
    raise SystemExit(main())
