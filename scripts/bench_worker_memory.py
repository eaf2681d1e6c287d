"""A worker process over many sessions and tenants: does anything grow with them?

Production workers run for weeks, each job a session the process may never see
again. This starts one real ``celery worker`` (threads pool, ``--concurrency``) on
the production app (through ``_worker_memory_app``, which only adds snapshots on
request), the offline summarizer and its /metrics endpoint, against a Redis the
caller names (store db, broker db + 1). It copies one due session (a generated
agent session recorded through the guard) to ``--sessions`` new ids spread over
``--tenants`` tenants, in batches, and per session publishes ``maybe_summarize``
twice, a forced ``compact`` and ``maybe_summarize`` again (with the recall index
jobs they ask for: about 5 jobs a session); once a batch's jobs are done, every
second session is deleted and the rest expire (``--ttl``), as in production.

At each checkpoint (after a batch has drained): the worker's RSS, the collector's
objects, the process-wide caches (the tenants' compactors, the session-id check's
memo, the unknown-model warnings), the metrics' series, and with ``--tracemalloc``
the traced memory and the lines that grew most since the first checkpoint. Past the
first checkpoint, nothing should grow with the sessions or tenants.

    PYTHONPATH=scripts:. .venv/bin/python scripts/bench_worker_memory.py \
        --redis-url redis://127.0.0.1:6430/0 [--sessions 5000] [--tenants 1500]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import redis
from _timing import ROOT, proc_memory
from _workers_sessions import build_template

from shared.core.config import StoreConfig
from shared.enqueue import QUEUE, TASK_COMPACT, CeleryEnqueuer, publisher_app
from shared.store.sessions import SessionStore, connect
from workers.harness.stack.worker_process import WorkerProcess, purge_queue, worker_env

PRIORITY_LISTS = [QUEUE] + [f"{QUEUE}\x06\x16{p}" for p in (3, 6, 9)]


def copy_to(src: SessionStore, template: str, dst: SessionStore, sid: str, pipe: Any) -> None:
    """Queue the copy of ``template`` (``src``'s) as ``dst``'s session ``sid`` on ``pipe``."""
    a, b = src.keys(template), dst.keys(sid)
    old, new = f"{{{a.tenant}:{a.session_id}}}", f"{{{b.tenant}:{b.session_id}}}"
    for key in a.data_keys():
        pipe.copy(key, key.replace(old, new), replace=True)
    pipe.delete(b.pending, b.lease, b.dirty)
    if dst.config.ttl_seconds:
        for key in b.data_keys():
            pipe.expire(key, dst.config.ttl_seconds)


def drained(broker: redis.Redis, timeout: float) -> float:
    """Seconds until the queue and kombu's unacked jobs are empty (twice in a row)."""
    started = time.monotonic()
    quiet = 0
    while time.monotonic() - started < timeout:
        waiting = sum(int(broker.llen(k)) for k in PRIORITY_LISTS) + int(broker.hlen("unacked"))
        quiet = quiet + 1 if waiting == 0 else 0
        if quiet >= 3:
            return time.monotonic() - started
        time.sleep(0.2)
    raise SystemExit(f"the queue did not drain in {timeout:.0f} s")


def snapshot(where: Path, name: str, timeout: float = 300) -> dict[str, Any]:
    (where / f"{name}.req").write_text("")
    target = where / f"{name}.json"
    deadline = time.monotonic() + timeout
    while not target.exists():
        if time.monotonic() > deadline:
            raise SystemExit("the worker answered no snapshot request")
        time.sleep(0.1)
    data: dict[str, Any] = json.loads(target.read_text())
    return data


def series(port: int) -> dict[str, int]:
    """Series per metric family on the worker's /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, int] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            for suffix in ("_bucket", "_count", "_sum", "_created"):
                name = name.removesuffix(suffix)
            out[name] = out.get(name, 0) + 1
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/8")
    parser.add_argument("--sessions", type=int, default=5000)
    parser.add_argument("--tenants", type=int, default=1500,
                        help="tenants the sessions are spread over (round robin)")
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--ttl", type=int, default=120, help="the sessions' TTL, seconds")
    parser.add_argument("--metrics-port", type=int, default=9808)
    parser.add_argument("--window", type=int, default=8000, help="the template's window")
    parser.add_argument("--tracemalloc", action="store_true")
    args = parser.parse_args()
    base = args.redis_url.rsplit("/", 1)[0]
    db = int(args.redis_url.rsplit("/", 1)[1])
    store_url, broker_url = f"{base}/{db}", f"{base}/{db + 1}"
    prefix = "wm" + uuid.uuid4().hex[:6]
    config = StoreConfig(key_prefix=prefix, ttl_seconds=args.ttl)
    store = SessionStore(connect(store_url, config), config)
    snaps = Path(tempfile.mkdtemp(prefix="worker-memory-"))
    purge_queue(broker_url)
    template = build_template(store, args.window, 7)
    for key in store.keys(template.session_id).data_keys():
        store.redis.persist(key)  # the copies expire, not the template
    print(f"template: {template.messages} messages, {template.tokens} tokens, "
          f"cut at {template.summarized_messages}")
    env = worker_env(broker_url=broker_url, redis_url=store_url, key_prefix=prefix,
                     summarizer="offline", metrics_port=str(args.metrics_port),
                     session_ttl_seconds=str(args.ttl))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "scripts"), env["PYTHONPATH"]])
    env["WORKER_MEMORY_SNAP_DIR"] = str(snaps)
    env["WORKER_MEMORY_TRACEMALLOC"] = "1" if args.tracemalloc else "0"
    worker = WorkerProcess("memory", env, args.concurrency, app="_worker_memory_app",
                           loglevel="INFO")
    publisher = publisher_app(broker_url)
    enqueuer = CeleryEnqueuer(publisher)
    broker = redis.Redis.from_url(broker_url)
    tenants = [store.for_tenant(f"t{t}") for t in range(args.tenants)]
    print("| sessions | jobs published | seconds | RSS MiB | objects | traced MB | compactors | "
          "session-id memo | metric series |\n|---|---|---|---|---|---|---|---|---|")
    marks: list[tuple[int, float, int]] = []
    try:
        worker.start(120)
        assert worker.process is not None
        started, jobs = time.monotonic(), 0
        for first in range(0, args.sessions, args.batch):
            ids = [(tenants[i % len(tenants)], f"s{i}-{uuid.uuid4().hex[:8]}")
                   for i in range(first, min(args.sessions, first + args.batch))]
            with store.redis.pipeline(transaction=False) as pipe:
                for owner, sid in ids:
                    copy_to(store, template.session_id, owner, sid, pipe)
                pipe.execute()
            for step in range(4):
                for owner, sid in ids:
                    if step == 2:
                        publisher.send_task(TASK_COMPACT, args=[sid], kwargs={
                            "keep_recent": 4, "force": True, "tenant": owner.tenant},
                            queue=QUEUE, ignore_result=True)
                    else:
                        enqueuer.enqueue(owner.tenant, sid)
                    jobs += 1
            drained(broker, 900)
            for owner, sid in ids[::2]:
                owner.delete_session(sid)
            done = first + len(ids)
            snap = snapshot(snaps, f"at{done}")
            rss = proc_memory(worker.process.pid)[0]
            counted = series(args.metrics_port)
            caches = snap["caches"]
            marks.append((done, rss, int(snap["objects"])))
            print(f"| {done:,} | {jobs:,} | {time.monotonic() - started:,.0f} | {rss:,.1f} | "
                  f"{snap['objects']:,} | {snap.get('traced_mb', 0):,.1f} | "
                  f"{caches['runtime._compactors']:,} | {caches['keys._session_id']:,} | "
                  f"{sum(counted.values()):,} |", flush=True)
        print("\nmetric series at the end:", json.dumps(counted, sort_keys=True))
        print("commonest objects:", snap["top_types"][:8])
        for line in snap.get("grown", [])[:10]:
            print("grown since the first checkpoint:", line)
        if len(marks) > 1:
            (s0, r0, o0), (s1, r1, o1) = marks[0], marks[-1]
            per = 1000 / max(1, s1 - s0)
            print(f"\ngrowth per 1,000 sessions past the first checkpoint: RSS "
                  f"{(r1 - r0) * per:+.2f} MiB, objects {(o1 - o0) * per:+,.0f}")
        print("tracebacks in the worker's log:", worker.log().count("Traceback"))
    finally:
        worker.stop()
        enqueuer.close()
        keys = list(store.redis.scan_iter(match=f"{prefix}:*", count=1000))
        for i in range(0, len(keys), 500):
            store.redis.delete(*keys[i:i + 500])
        purge_queue(broker_url)


if __name__ == "__main__":
    main()
