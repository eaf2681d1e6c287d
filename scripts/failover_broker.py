"""The job path through a Sentinel broker at a failover: jobs lost, consumers' recovery.

Per trial: a fresh Sentinel deployment (a primary, a replica, three Sentinels on loopback:
:mod:`workers.harness.stack.sentinel_pair`) holds the broker (kombu's ``sentinel://``
transport, database 1); the session store is a standalone redis-server, so that only the
broker fails over. ``--workers`` real ``celery worker`` processes (threads pool, offline
summarizer) consume it. ``--guards`` sync guards in threads record turns (``prepare`` +
``record_turn``, ``--rate`` turns a second each) round-robin over ``--sessions`` sessions
each, on a model window small enough that sessions go over their trigger every few turns,
so that the guards publish ``maybe_summarize`` jobs all along. After ``--before`` seconds
(plus 0-1 s) the event: a planned ``SENTINEL FAILOVER`` or a SIGKILL of the primary. The
turns go on for ``--after`` seconds, then stop; the trial waits up to ``--settle`` seconds
for every session to be compacted.

- published: jobs whose publish returned (Celery's ``after_task_publish``);
- executed: those of them a worker received (its ``Task ...[id] received`` log line);
- lost: published, never received;
- failed publishes: ``enqueue`` calls that raised (``record_turn`` itself must never
  raise: counted as ``turn errors``); the slowest publish, in seconds;
- worst wait: the longest a job published after the event waited for a worker;
- disconnected: seconds from the event until a worker lost its broker connection (the
  old primary killed, or demoted); reconnected: until the last of them was connected
  again (Celery retries after 2, 4, 6, ... s, each round through every Sentinel);
- still due: sessions the compactor would still compact when the settle time is over
  (a lost job leaves the session's pending flag set: only the lost-job sweep,
  ``COMPACTION_SWEEP_SECONDS``, or a later turn publishes its job again).

Each trial runs once per ``--sweeps`` value (``COMPACTION_SWEEP_SECONDS``: 5 and 0, off),
the pending flag stale after ``--stale-seconds``. Turns that stop soon after the event
(``--after 12`` for a planned failover, past the old primary's demotion) leave a lost
job's session to the sweep alone.

    PYTHONPATH=. python scripts/failover_broker.py [--trials 3] [--events failover,kill]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from celery.signals import after_task_publish

from shared.core.config import StoreConfig
from shared.enqueue import CeleryEnqueuer, publisher_app
from shared.guard import ContextGuard
from shared.store.sessions import SessionStore, connect
from workers.compactor import Compactor
from workers.harness.demo_session import SYSTEM_PROMPT, TOOLS, demo_turns
from workers.harness.stack.redis_server import start_server
from workers.harness.stack.sentinel_pair import SentinelDeployment, start_sentinel_deployment
from workers.harness.stack.worker_process import WorkerProcess, worker_env
from workers.harness.timing import wait_for
from workers.summarizer.engine import SummaryEngine

PREFIX = "fb"
LOST = re.compile(r"^\[([\d:, -]+): WARNING/\w+\] consumer: Connection to broker lost")
CONNECTED = re.compile(r"^\[([\d:, -]+): INFO/\w+\] Connected to ")
RECEIVED = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): INFO/\w+\] "
                      r"Task compaction\.maybe_summarize\[([0-9a-f-]+)\] received")


@dataclass
class Tally:
    """What the guards saw; ``published``: task id -> wall time of the publish."""

    published: dict[str, float] = field(default_factory=dict)
    failed: int = 0
    turn_errors: list[str] = field(default_factory=list)
    slowest: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)


class TimedEnqueuer:
    """The guard's enqueuer, timed and counted (failures re-raised: the guard handles them)."""

    def __init__(self, inner: CeleryEnqueuer, tally: Tally) -> None:
        self.inner, self.tally = inner, tally

    def enqueue(self, tenant: str, session_id: str) -> None:
        started = time.monotonic()
        try:
            self.inner.enqueue(tenant, session_id)
        except Exception:
            with self.tally.lock:
                self.tally.failed += 1
            raise
        finally:
            with self.tally.lock:
                self.tally.slowest = max(self.tally.slowest, time.monotonic() - started)


def _drive(guard: ContextGuard, sids: list[str], rate: float, tally: Tally,
           stop: threading.Event) -> None:
    turns = demo_turns(200)
    done = dict.fromkeys(sids, 0)
    next_at = time.monotonic()
    n = 0
    while not stop.is_set():
        sid = sids[n % len(sids)]
        turn = turns[done[sid] % len(turns)]
        try:
            guard.prepare(sid, SYSTEM_PROMPT, TOOLS, 1000, "gpt-4o", pending=turn[:1])
            guard.record_turn(sid, turn)
            done[sid] += 1
        except Exception as exc:  # the store is not failing over: must not happen
            with tally.lock:
                tally.turn_errors.append(f"{type(exc).__name__}: {exc}")
        n += 1
        next_at = max(next_at + 1 / rate, time.monotonic())
        stop.wait(max(0.0, next_at - time.monotonic()))


def _received(workers: list[WorkerProcess]) -> dict[str, float]:
    """Task id -> wall time a worker logged receiving it (the earliest)."""
    out: dict[str, float] = {}
    for worker in workers:
        for line in worker.log().splitlines():
            match = RECEIVED.match(line)
            if match:
                at = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                out[match[2]] = min(at, out.get(match[2], at))
    return out


def _stamped(worker: WorkerProcess, pattern: re.Pattern[str], event_at: float) -> list[float]:
    """Seconds after the event of the worker's log lines matching ``pattern``."""
    out = []
    for line in worker.log().splitlines():
        match = pattern.match(line)
        if match:
            at = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp() - event_at
            if at > 0:
                out.append(at)
    return out


def _reconnects(workers: list[WorkerProcess], event_at: float) -> tuple[Any, Any]:
    """(seconds until a worker first lost its broker connection: the old primary demoted
    or killed, seconds until the last worker that lost it was connected again)."""
    lost, back = [], []
    for worker in workers:
        down = _stamped(worker, LOST, event_at)
        up = [t for t in _stamped(worker, CONNECTED, event_at) if down and t > down[0]]
        if down:
            lost.append(down[0])
            back.append(up[-1] if up else float("inf"))
    return (round(min(lost), 2) if lost else None, round(max(back), 2) if back else None)


def _still_due(store: SessionStore, sids: list[str]) -> list[str]:
    compactor = Compactor(store, SummaryEngine(None))
    return [sid for sid in sids
            if not isinstance(compactor.plan(sid, store.load_view(sid), force=False,
                                             keep_recent=None), str)]


def trial(event: str, sweep: int, args: argparse.Namespace) -> dict[str, Any]:
    config = StoreConfig(key_prefix=PREFIX, pending_ttl_seconds=2 * args.stale_seconds,
                         pending_stale_seconds=args.stale_seconds)
    store_server = start_server()
    try:
        with start_sentinel_deployment() as deployment:
            return _trial(deployment, store_server.url, config, event, sweep, args)
    finally:
        store_server.remove()


def _trial(deployment: SentinelDeployment, store_url: str, config: StoreConfig, event: str,
           sweep: int, args: argparse.Namespace) -> dict[str, Any]:
    broker, master = deployment.broker_url(1), deployment.service
    env = worker_env(broker_url=broker, redis_url=store_url, key_prefix=PREFIX,
                     broker_sentinel_master=master, sweep_seconds=str(sweep),
                     pending_ttl_seconds=str(config.pending_ttl_seconds),
                     pending_stale_seconds=str(config.pending_stale_after))
    workers = [WorkerProcess(f"fb{n}", env, concurrency=args.concurrency).launch()
               for n in range(args.workers)]
    tally = Tally()

    def published(headers: Any = None, **_: Any) -> None:
        with tally.lock:
            tally.published[str((headers or {}).get("id"))] = time.time()

    after_task_publish.connect(published, weak=False)
    app = publisher_app(broker, sentinel_master=master)
    stores = [SessionStore(connect(store_url, config), config) for _ in range(args.guards)]
    guards = [ContextGuard(s, TimedEnqueuer(CeleryEnqueuer(app), tally),
                           overrides={"gpt-4o": args.window}) for s in stores]
    sids = [[f"g{g}s{n}" for n in range(args.sessions)] for g in range(args.guards)]
    stop = threading.Event()
    threads = [threading.Thread(target=_drive, args=(guard, s, args.rate, tally, stop))
               for guard, s in zip(guards, sids, strict=True)]
    try:
        for worker in workers:
            worker.wait_ready()
        for thread in threads:
            thread.start()
        time.sleep(args.before + random.random())
        old = deployment.primary_port()
        event_at = time.time()
        if event == "failover":
            deployment.failover()
        else:
            deployment.kill_primary()
        promoted = deployment.wait_primary_not(old) and time.time() - event_at
        time.sleep(args.after)
        stop.set()
        for thread in threads:
            thread.join()
        every = [sid for group in sids for sid in group]
        wait_for(lambda: not _still_due(stores[0], every), args.settle, interval=1.0)
        received = _received(workers)
        lost = [i for i in tally.published if i not in received]
        waits = [received[i] - at for i, at in tally.published.items()
                 if at > event_at and i in received]
        lost_at, reconnected = _reconnects(workers, event_at)
        return {
            "event": event, "sweep_s": sweep, "promoted_s": round(float(promoted), 2),
            "published": len(tally.published),
            "executed": len(tally.published) - len(lost), "lost": len(lost),
            "lost_before_event": sum(tally.published[i] <= event_at for i in lost),
            "failed_publishes": tally.failed, "slowest_publish_s": round(tally.slowest, 2),
            "turn_errors": len(tally.turn_errors),
            "worst_wait_s": round(max(waits), 2) if waits else None,
            "disconnected_s": lost_at, "reconnected_s": reconnected,
            "still_due": len(_still_due(stores[0], every)),
            "sessions": len(every),
            "workers_alive": sum(w.process is not None and w.process.poll() is None
                                 for w in workers),
        }
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        after_task_publish.disconnect(published)
        for worker in workers:
            worker.stop(timeout=10)
        for guard in guards:
            guard.close()
        for store in stores:
            store.redis.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=1)
    parser.add_argument("--events", default="failover,kill")
    parser.add_argument("--sweeps", default="5,0", help="COMPACTION_SWEEP_SECONDS per run")
    parser.add_argument("--stale-seconds", type=int, default=10,
                        help="a pending flag no worker claimed is stale after this")
    parser.add_argument("--guards", type=int, default=4)
    parser.add_argument("--sessions", type=int, default=5, help="sessions per guard")
    parser.add_argument("--rate", type=float, default=20.0, help="turns/s per guard")
    parser.add_argument("--window", type=int, default=8000, help="the model's window")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--before", type=float, default=3.0)
    parser.add_argument("--after", type=float, default=15.0)
    parser.add_argument("--settle", type=float, default=40.0)
    args = parser.parse_args()
    results = []
    for n in range(args.trials):
        for event in args.events.split(","):
            for sweep in (int(s) for s in args.sweeps.split(",")):
                result = trial(event, sweep, args)
                result["trial"] = n + 1
                print(json.dumps(result), flush=True)
                results.append(result)
    keys = ("published", "lost", "failed_publishes", "slowest_publish_s",
            "worst_wait_s", "reconnected_s", "still_due", "turn_errors")
    print(f"\n{args.guards} guards x {args.rate:g} turns/s, {args.workers} workers; "
          "median over the trials")
    print("event     sweep  " + " ".join(f"{k:>17}" for k in keys))
    for event in args.events.split(","):
        for sweep in (int(s) for s in args.sweeps.split(",")):
            rows = [r for r in results if r["event"] == event and r["sweep_s"] == sweep]
            figures = [statistics.median(v) if (v := [r[k] for r in rows if r[k] is not None])
                       else None for k in keys]
            print(f"{event:<9} {sweep:>5}  " + " ".join(f"{f!s:>17}" for f in figures))


if __name__ == "__main__":
    main()
