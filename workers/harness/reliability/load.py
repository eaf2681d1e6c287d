"""``load``: many sessions fed by agent processes while workers compact.

Run long by ``scripts/reliability.py``, at CI size by ``tests/test_reliability.py``.
"""

from __future__ import annotations

import multiprocessing
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from shared.core.config import StoreConfig
from shared.enqueue import QUEUE, CeleryEnqueuer, publisher_app
from shared.guard import ContextGuard
from shared.store.sessions import SessionStore, connect
from workers.compactor import Compactor
from workers.harness.demo_session import SYSTEM_PROMPT, TOOLS, demo_turns
from workers.harness.reliability.common import (
    MODEL,
    Env,
    ObservedLLM,
    environment,
    integrity,
    marked,
    start_workers,
)
from workers.harness.timing import wait_for
from workers.summarizer.engine import SummaryEngine
from workers.summarizer.providers import OpenAIClient


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
