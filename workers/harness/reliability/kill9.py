"""``kill9``: a worker SIGKILLed while summarizing; the job completes once elsewhere.

Run long by ``scripts/reliability.py``, at CI size by ``tests/test_reliability.py``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import redis

from shared.enqueue import QUEUE, TASK_COMPACT, publisher_app
from shared.store.sessions import SessionStore
from workers.app import celery_config
from workers.harness.demo_session import demo_turns
from workers.harness.fakes.behaviour import Fault
from workers.harness.reliability.common import Env, ObservedLLM, integrity, marked, start_workers
from workers.harness.stack.worker_process import WorkerProcess
from workers.harness.timing import wait_for
from workers.settings import load_settings

RESTORE_LOCK = "unacked_mutex"
"""kombu's lock on the restore sweep (the broker's key; no global key prefix here)."""


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
              seed: int = 1, killed_sweeping: bool = False,
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
    ``killed_sweeping``: each killed worker dies holding the restore sweep's lock
    (as one killed while it swept: the lock stands until it expires).
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
        # as long as the workers' config lets a dead sweeper's lock stand (kombu: 300 s)
        swept = load_settings(summarizer_timeout=30, **({} if visibility is None else {
            "broker_restore_sweep_seconds": 1}))
        lock_ms = 1000 * int(celery_config(swept)["broker_transport_options"].get(
            "unacked_mutex_expire", 300))
        worker = start_workers("kill", wenv, 1, concurrency=4)[0]
        logs: list[WorkerProcess] = [worker]
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
                if killed_sweeping:
                    with redis.Redis.from_url(env.broker_url, socket_timeout=5) as broker:
                        broker.set(RESTORE_LOCK, "a-killed-sweeper", px=lock_ms)
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
