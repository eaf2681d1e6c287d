"""Worker processes of one pool configuration, and one measured run of them."""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _timing import (
    ROOT,
    TICK,
    children_of,
    cpu_ticks,
    proc_cpu,
    proc_memory,
)
from _workers_fake import FakeLLM
from _workers_llm_only import LLM_ONLY_APP, WORKER_APP
from _workers_sessions import (
    Template,
    committed,
    copy_sessions,
    delete_sessions,
    indexed_all,
)

from shared.enqueue import (
    QUEUE,
    CeleryEnqueuer,
    request_summary,
)
from shared.store.sessions import SessionStore
from workers.harness.stack.worker_process import WorkerProcess


# -- worker processes -----------------------------------------------------------------------
@dataclass
class WorkerSet:
    """``processes`` Celery worker processes of one pool configuration."""

    pool: str
    concurrency: int
    processes: int
    env: dict[str, str]
    app: str = WORKER_APP
    recall_index: str = "task"
    workers: list[WorkerProcess] = field(default_factory=list)
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])

    def names(self) -> list[str]:
        """Node names of the processes (for remote control aimed at these workers only)."""
        host = socket.gethostname()
        return [f"bench{i}-{self.tag}@{host}" for i in range(self.processes)]

    @property
    def label(self) -> str:
        return f"{self.pool} -c {self.concurrency} x {self.processes} process" + (
            "es" if self.processes > 1 else "") + (
            " (LLM-only job)" if self.app != WORKER_APP else
            "" if self.recall_index == "task" else f" (recall index: {self.recall_index})")

    def start(self, timeout: float = 120) -> float:
        """Start and wait until every process is ready; seconds it took."""
        started = time.perf_counter()
        env = dict(self.env)
        env["COMPACTION_RECALL_INDEX"] = self.recall_index
        if self.app != WORKER_APP:  # the LLM-only app lives in scripts/
            env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "scripts"), str(ROOT)])
        self.workers = [WorkerProcess(f"bench{i}-{self.tag}", env, self.concurrency,
                                      pool=self.pool, app=self.app).launch()
                        for i in range(self.processes)]
        deadline = time.monotonic() + timeout
        try:
            for worker in self.workers:
                worker.wait_ready(max(0.0, deadline - time.monotonic()))
        except RuntimeError as exc:
            self.stop()
            raise SystemExit(str(exc)) from None
        return time.perf_counter() - started

    def pids(self) -> list[int]:
        out: list[int] = []
        for worker in self.workers:
            if worker.process is not None:
                out.append(worker.process.pid)
                out.extend(children_of(worker.process.pid))
        return out

    def cpu(self) -> float:
        return sum(proc_cpu(pid) for pid in self.pids())

    def memory(self) -> tuple[float, float, int]:
        """(total RSS, total PSS) in MiB and how many OS processes."""
        pids = self.pids()
        mems = [proc_memory(pid) for pid in pids]
        return sum(m[0] for m in mems), sum(m[1] for m in mems), len(pids)

    def log_tail(self, chars: int = 3000) -> str:
        return "".join(worker.log()[-chars:] for worker in self.workers)

    def errors(self) -> int:
        return sum(worker.log().count("Traceback") for worker in self.workers)

    def stop(self) -> None:
        """Warm shutdown of every process at once (SIGKILL of a group that hangs)."""
        if self.workers:
            with ThreadPoolExecutor(len(self.workers)) as pool:
                list(pool.map(lambda worker: worker.stop(), self.workers))
        for worker in self.workers:
            worker.log_path.unlink(missing_ok=True)
        self.workers = []


# -- one measured run ----------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    """One pool configuration and which job its workers run."""

    pool: str
    concurrency: int
    processes: int
    llm_only: bool = False
    recall_index: str = "task"
    """COMPACTION_RECALL_INDEX of the workers: task (default), job or off."""

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
    indexed_wall: float
    """Seconds from the start until every session's recall index covered its summary."""
    indexed_cpu_ms: float
    """Worker CPU per job until then (index jobs included)."""
    indexed_redis_ms: float
    """Redis CPU per job until then."""
    """Share of the machine's CPUs busy with processes other than the workers, the fake,
    Redis and this script while the run was timed."""

    @property
    def rate(self) -> float:
        return self.jobs / self.wall

    @property
    def indexed_rate(self) -> float:
        return self.jobs / self.indexed_wall if self.indexed_wall else float("nan")

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

    def wait_indexed(self, ids: list[str], config: Config, timeout: float) -> float | None:
        """When every session's recall index covered its summary (perf_counter); None when
        the workers do not index (LLM-only job, ``off``)."""
        if config.llm_only or config.recall_index == "off":
            return None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if indexed_all(self.store, ids):
                return time.perf_counter()
            time.sleep(0.02)
        raise SystemExit(f"recall indexes not caught up after {timeout:.0f} s")

    def run(self, config: Config, busy: float, spy_output: Path | None = None) -> RunResult:
        args = self.args
        slots = config.slots
        ideal = slots / args.latency
        jobs = max(slots, round(ideal * args.seconds / slots) * slots)
        warm = [f"warm-{i}" for i in range(2 * slots)]
        ids = [f"job-{i}" for i in range(jobs)]
        copy_sessions(self.store, self.template.session_id, warm + ids)
        workers = WorkerSet(config.pool, config.concurrency, config.processes, self.env,
                            app=LLM_ONLY_APP if config.llm_only else WORKER_APP,
                            recall_index=config.recall_index)
        try:
            start_seconds = workers.start()
            self.fake.ask("reset")
            t0 = time.perf_counter()
            self.publish(warm)
            # Prefork children build their runtime on their first job, all at once:
            # on a busy machine that can take a while without any visible progress.
            self.wait_all(warm, len(warm), timeout=600, workers=workers, stall=180)
            self.wait_indexed(warm, config, timeout=120)
            warmup = time.perf_counter() - t0
            # Publish the whole batch while the workers do not consume (the agents that
            # publish run elsewhere in production), then let them loose at once.
            self.control.cancel_consumer(QUEUE, reply=True, timeout=5,
                                         destination=workers.names())
            self.publish(ids)
            time.sleep(0.5)
            self.fake.ask("reset")
            cpu0, fake0, redis0 = workers.cpu(), self.fake.cpu(), proc_cpu(self.redis_pid)
            machine0, own0 = cpu_ticks()[0], time.process_time()
            started = time.perf_counter()
            replies = self.control.add_consumer(QUEUE, reply=True, timeout=5,
                                                destination=workers.names())
            if len(replies) != config.processes:
                raise SystemExit(f"add_consumer answered by {len(replies)} of "
                                 f"{config.processes} workers: {replies}")
            spy = self.start_spy(workers.pids()[0], spy_output, jobs, args.seconds * 0.6)
            ended = self.wait_all(ids, jobs, timeout=60 + 8 * jobs / ideal, workers=workers)
            machine1, own1 = cpu_ticks()[0], time.process_time()
            if spy is not None:
                spy.wait(timeout=60)
            cpu1, fake1, redis1 = workers.cpu(), self.fake.cpu(), proc_cpu(self.redis_pid)
            indexed = self.wait_indexed(ids, config, timeout=120)
            cpu2, redis2 = workers.cpu(), proc_cpu(self.redis_pid)
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
            busy_before=busy, others_during=min(1.0, others),
            indexed_wall=(indexed - started) if indexed else 0.0,
            indexed_cpu_ms=(cpu2 - cpu0) / jobs * 1000,
            indexed_redis_ms=(redis2 - redis0) / jobs * 1000)


# -- report -----------------------------------------------------------------------------------
def median_of(results: list[RunResult], fn: Callable[[RunResult], float]) -> float:
    return statistics.median(fn(r) for r in results)


JOBS = {"": "task", "llm-only": "task", "index-in-job": "job", "no-index": "off"}
"""Job suffix -> the workers' COMPACTION_RECALL_INDEX."""


def parse_configs(text: str) -> list[Config]:
    """``pool:CxP`` items, comma separated; ``@llm-only`` runs the LLM-only job,
    ``@index-in-job`` indexes for recall in the compaction job, ``@no-index`` not at
    all (default: the index job)."""
    out = []
    for item in text.split(","):
        spec, _, job = item.strip().partition("@")
        pool, _, rest = spec.partition(":")
        concurrency, _, processes = rest.partition("x")
        if (pool not in ("threads", "prefork", "solo") or not concurrency.isdigit()
                or not (processes or "1").isdigit() or job not in JOBS):
            suffixes = "|@".join(k for k in JOBS if k)
            raise SystemExit(f"--configs: bad item {item!r} (pool:CxP[@{suffixes}], e.g. "
                             "threads:32x2)")
        out.append(Config(pool, int(concurrency), int(processes or 1), job == "llm-only",
                          JOBS[job]))
    return out
