"""``restart``: appends race a Redis that is SIGKILLed, restarted and frozen.

Run long by ``scripts/reliability.py``, at CI size by ``tests/test_reliability.py``.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from shared.core.errors import StoreUnavailable
from shared.enqueue import QUEUE, TASK_COMPACT, publisher_app
from shared.guard import ContextGuard
from shared.store.sessions import SessionStore, connect
from workers.harness.demo_session import demo_turns
from workers.harness.reliability.common import MODEL, Env, integrity, start_workers
from workers.harness.stack.redis_server import start_server
from workers.harness.stack.worker_process import WorkerProcess
from workers.harness.timing import wait_for
from workers.urls import with_db


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
    # The prober times the read path under faults: no change feed, so every prepare reads
    # (with one, an unchanged session is served from the cache while Redis hangs).
    guard = ContextGuard(store, watch_changes=False)
    stop = threading.Event()
    acked: dict[int, list[int]] = defaultdict(list)
    failed: dict[int, list[int]] = defaultdict(list)
    state = {"phase": "up"}
    probes: list[tuple[str, float, str]] = []  # (phase, ms, outcome)
    worker: WorkerProcess | None = None
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
