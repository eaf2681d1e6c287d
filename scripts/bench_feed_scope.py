"""What a guard process is told by its change feed when other processes serve the tenant.

``--processes`` agent processes (real ones, each its own guard and feed) serve one
tenant, each its own ``--sessions`` sessions, turn after turn (a real turn of the dev
transcripts, one ``prepare`` per model call, then ``record_turn``); a worker process
compacts whatever is pending, as Celery would, and indexes the compacted range for
recall. Each process reports the keys its feed was pushed, how many of them named its
own sessions, and the CPU its feed's push handler took. A feed watches its tenant's
whole prefix (one entry in Redis however many processes share it; a prefix per session
would cost Redis a scan of all of them per pass of its event loop), so it is pushed
every process's writes to the keys views are read from; since 2026-11-28 not the recall
index's term keys, which moved out from under that prefix (hundreds per index batch).

    PYTHONPATH=scripts:. .venv/bin/python scripts/bench_feed_scope.py [--processes 4]
        [--sessions 4] [--turns 30]
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from typing import Any

from _guard_sessions import SYSTEM, Env, all_turns
from _timing import loadavg

MODEL = "bench-scope"


def agent(url: str, prefix: str, number: int, args: argparse.Namespace, out: Any) -> None:
    """One agent process: its sessions' turns, its feed's pushes counted."""
    from shared.core.config import StoreConfig
    from shared.enqueue import NullEnqueuer
    from shared.guard import ContextGuard
    from shared.store.changes import ChangeFeed
    from shared.store.sessions import SessionStore, connect

    cfg = StoreConfig(key_prefix=prefix, max_messages_per_session=400_000)
    store = SessionStore(connect(url, cfg), cfg)
    guard = ContextGuard(store, NullEnqueuer(), overrides={MODEL: args.window})
    feed = guard.feed
    assert isinstance(feed, ChangeFeed)
    counts = {"keys": 0, "own": 0, "ns": 0}
    mine = [f"p{number}-s{k}" for k in range(args.sessions)]
    own_tags = tuple(f"{{default:{sid}}}".encode() for sid in mine)
    handle = feed._seen.invalidated

    def counted(push: list[Any]) -> None:
        started = time.perf_counter_ns()
        handle(push)
        counts["ns"] += time.perf_counter_ns() - started
        keys = push[1] if len(push) > 1 and push[1] else []
        counts["keys"] += len(keys)
        counts["own"] += sum(1 for key in keys if any(tag in key for tag in own_tags))

    turns = all_turns()[: args.turns]
    hooked = None
    for turn in turns:
        for sid in mine:
            for i in [i for i, m in enumerate(turn) if m.role == "assistant"] or [len(turn)]:
                guard.prepare(sid, SYSTEM, pending=turn[:i], max_tokens=4000, model=MODEL)
                conn = feed._conn
                if conn is not None and conn is not hooked:  # (re)connected: count its pushes
                    conn._parser.set_invalidation_push_handler(counted)
                    hooked = conn
            guard.record_turn(sid, turn)
    time.sleep(0.2)
    guard.prepare(mine[0], SYSTEM, max_tokens=4000, model=MODEL)  # the last pushes drained
    guard.close()
    out.put((number, counts))


def worker(url: str, prefix: str, stop: Any) -> None:
    """Compacts every pending session, then indexes it for recall (as the jobs do)."""
    from shared.core.config import StoreConfig
    from shared.store.recall_index import index_compacted
    from shared.store.sessions import SessionStore, connect
    from workers.compactor import Compactor
    from workers.summarizer.engine import SummaryEngine

    cfg = StoreConfig(key_prefix=prefix, max_messages_per_session=400_000)
    store = SessionStore(connect(url, cfg), cfg)
    compactor = Compactor(store, SummaryEngine(None))
    client = store.redis
    while not stop.is_set():
        for key in client.scan_iter(match=f"{prefix}:{{default:*}}:pending", count=1000):
            sid = key.decode().split(":", 2)[2].removeprefix("{default:").split("}")[0]
            store.clear_pending(sid)
            if compactor.run(sid).status == "compacted":
                index_compacted(store, sid)
        time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--window", type=int, default=14_000)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/5")
    args = parser.parse_args()
    env = Env(args.redis_url)
    stop = multiprocessing.Event()
    out: Any = multiprocessing.Queue()
    compacting = multiprocessing.Process(target=worker, args=(env.url, env.prefix, stop))
    compacting.start()
    agents = [multiprocessing.Process(target=agent, args=(env.url, env.prefix, n, args, out))
              for n in range(args.processes)]
    try:
        for proc in agents:
            proc.start()
        results = dict(out.get(timeout=600) for _ in agents)
        for proc in agents:
            proc.join(30)
    finally:
        stop.set()
        compacting.join(10)
        env.cleanup()
    print(f"load average {loadavg()}; {args.processes} agent processes x {args.sessions} "
          f"sessions x {args.turns} turns, window {args.window}, a compacting worker\n")
    print("| process | keys pushed to its feed | naming its own sessions | push handler CPU ms |")
    print("|---|---|---|---|")
    for number, counts in sorted(results.items()):
        print(f"| {number} | {counts['keys']} | {counts['own']} | {counts['ns'] / 1e6:.1f} |")


if __name__ == "__main__":
    main()
