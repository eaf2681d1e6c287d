"""What the recall index costs per compaction: worker CPU, Redis CPU, Redis commands.

In-process, on copies of the benchmark's template: each copy gets the commit a job
makes (a summary up to the job's cut), then :func:`index_compacted` indexes what it
summarized away, exactly what the compaction job (or its index task) calls. The
Redis server's CPU comes from ``/proc`` (the server must run on this machine) and
its per-command figures from ``INFO commandstats`` deltas: other clients of a
shared server add to them, so the run is repeated and the best round kept.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

from _timing import proc_cpu
from _workers_sessions import Template, copy_sessions, delete_sessions

from shared.core.records import SummaryRecord
from shared.store.recall_index import index_compacted, index_stats, recall_keys
from shared.store.sessions import SessionStore


@dataclass
class IndexCost:
    jobs: int
    messages: int
    """Messages indexed per job."""
    worker_ms: float
    """Indexing CPU of the calling thread per job (median of rounds)."""
    redis_ms: float
    """Redis server CPU per job (median of rounds)."""
    commands: dict[str, tuple[float, float]]
    """Per job: command -> (calls, server microseconds), scripts' inner calls included."""
    keys: int
    """Redis keys of one session's index."""
    bytes_per_message: float
    """``MEMORY USAGE`` of one session's index keys per indexed message."""
    terms: int
    passages: int

    @property
    def worker_ms_per_message(self) -> float:
        return self.worker_ms / max(self.messages, 1)

    @property
    def redis_ms_per_message(self) -> float:
        return self.redis_ms / max(self.messages, 1)


def _commandstats(client: Any) -> dict[str, tuple[int, int]]:
    raw = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
            for name, v in raw.items()}


def _commit(store: SessionStore, sid: str, watermark: int) -> None:
    record = SummaryRecord(watermark=watermark, kind="offline", text="summary", tokens=5)
    if not store.commit_summary(sid, record, store.state(sid).version).ok:
        raise SystemExit(f"{sid}: the benchmark's commit failed")


def index_keys(store: SessionStore, sid: str) -> list[str]:
    """Every key of a session's index (``SCAN`` on its prefix: a measurement, not a hot path)."""
    k = recall_keys(store, sid)
    base = k.meta.removesuffix("meta")
    return [key.decode() if isinstance(key, bytes) else key
            for key in store.redis.scan_iter(match=base.replace("{", "\\{").replace(
                "}", "\\}") + "*", count=1000)]


def index_cost(store: SessionStore, template: Template, redis_pid: int, *, jobs: int = 40,
               rounds: int = 3) -> IndexCost:
    """Index ``jobs`` fresh copies of the template's compacted range, ``rounds`` times."""
    client = store.redis
    worker, server, per_round = [], [], []
    keys, size, stats = 0, 0, {"terms": 0, "passages": 0}
    for r in range(rounds):
        ids = [f"ix{r}-{i}" for i in range(jobs + 2)]
        copy_sessions(store, template.session_id, ids)
        try:
            for sid in ids:
                _commit(store, sid, template.summarized_messages)
            for sid in ids[:2]:  # scripts loaded, connection warm
                index_compacted(store, sid)
            before = _commandstats(client)
            redis0, cpu0 = proc_cpu(redis_pid), time.thread_time()
            for sid in ids[2:]:
                report = index_compacted(store, sid)
                if report.messages != template.summarized_messages:
                    raise SystemExit(f"indexed {report.messages} messages, expected "
                                     f"{template.summarized_messages}: {report}")
            worker.append((time.thread_time() - cpu0) * 1000 / jobs)
            server.append((proc_cpu(redis_pid) - redis0) * 1000 / jobs)
            after = _commandstats(client)
            per_round.append({name: ((after[name][0] - before.get(name, (0, 0))[0]) / jobs,
                                     (after[name][1] - before.get(name, (0, 0))[1]) / jobs)
                              for name in after
                              if after[name][0] != before.get(name, (0, 0))[0]})
            if r == 0:
                found = index_keys(store, ids[-1])
                keys = len(found)
                pipe = client.pipeline(transaction=False)
                for key in found:
                    pipe.memory_usage(key, samples=0)
                size = sum(int(n or 0) for n in pipe.execute())
                got = index_stats(store, ids[-1])
                stats = {"terms": got["terms"], "passages": got["passages"]}
        finally:
            delete_sessions(store, ids)  # their indexes too
    best = min(range(rounds), key=lambda i: server[i])  # the round least disturbed
    return IndexCost(jobs=jobs, messages=template.summarized_messages,
                     worker_ms=statistics.median(worker), redis_ms=statistics.median(server),
                     commands=per_round[best], keys=keys,
                     bytes_per_message=size / max(template.summarized_messages, 1),
                     terms=stats["terms"], passages=stats["passages"])


def report_index_cost(cost: IndexCost, top: int = 8) -> list[str]:
    """Markdown lines: the cost per job and per message, and the commands behind it."""
    lines = [f"Recall indexing per compaction (in-process `index_compacted` on {cost.jobs} "
             f"fresh copies x 3 rounds, {cost.messages} messages each, medians): "
             f"worker {cost.worker_ms:.2f} CPU ms per job ({cost.worker_ms_per_message * 1000:.0f}"
             f" µs per message), Redis {cost.redis_ms:.2f} CPU ms per job "
             f"({cost.redis_ms_per_message * 1000:.0f} µs per message); one session's index: "
             f"{cost.keys} keys, {cost.passages} passages, {cost.terms} terms, "
             f"{cost.bytes_per_message / 1000:.2f} kB per message (`MEMORY USAGE`).\n",
             "| Redis command (per job, scripts' inner calls included) | calls | server µs |",
             "|---|---|---|"]
    ranked = sorted(cost.commands.items(), key=lambda kv: -kv[1][1])
    for name, (calls, usec) in ranked[:top]:
        lines.append(f"| {name} | {calls:.1f} | {usec:.0f} |")
    return lines
