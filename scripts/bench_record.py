"""``record_turn`` alone, with a real publish: wall and thread-CPU per call, round trips.

The loop of ``bench_guard.py``'s ``record_publish`` (a prepare of the turn so far,
untimed, then the turn recorded with a usage report, the pending flag cleared before
each call so that every call publishes), on a real session of ``--size`` messages, with
no summary and with one committed at 90% of the log, the turns with new call ids and with
the transcript's own ids (already stored: renamed at append). Per arm: wall and
``time.thread_time`` p50 / p99 ms, and the Redis round trips per record (commands sent,
counted at redis-py's ``send_packed_command``: a pipeline's is one). ``--profile``: a
cProfile of the records (cumulative, top rows) instead of figures.

One process measures one checkout (the one it is run from); to compare two, alternate
processes of each (``--label`` names the rows):

    PYTHONPATH=. .venv/bin/python scripts/bench_record.py [--size 10000] [--calls 300]
        [--redis-url redis://127.0.0.1:6379/15] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import pstats
import sys
import time
from collections.abc import Callable
from typing import Any

from _guard_sessions import Env, history, seed
from _timing import loadavg, percentile
from bench_guard import record_publish


class Trips:
    """Commands sent to Redis (redis-py's ``send_packed_command``), counted."""

    def __init__(self) -> None:
        import redis.connection

        self.count = 0
        cls = redis.connection.AbstractConnection
        original = cls.send_packed_command

        def counted(conn: Any, command: Any, check_health: bool = True) -> None:
            self.count += 1
            original(conn, command, check_health)

        cls.send_packed_command = counted  # type: ignore[method-assign]


def records(env: Env, broker_url: str, sid: str, calls: int, stored_ids: bool,
            trips: Trips, profile: cProfile.Profile | None) -> dict[str, Any]:
    wall: list[float] = []
    cpu: list[float] = []
    sent: list[int] = []

    def timed(record: Callable[[], None]) -> float:
        before = trips.count
        if profile is not None:
            profile.enable()
        c0, w0 = time.thread_time(), time.perf_counter()
        record()
        w1, c1 = time.perf_counter(), time.thread_time()
        if profile is not None:
            profile.disable()
        wall.append((w1 - w0) * 1000)
        cpu.append((c1 - c0) * 1000)
        sent.append(trips.count - before)
        return wall[-1]

    record_publish(env, broker_url, sid, calls, stored_ids, timed)
    return {"wall_p50": percentile(wall, 50), "wall_p99": percentile(wall, 99),
            "cpu_p50": percentile(cpu, 50), "cpu_p99": percentile(cpu, 99),
            "trips": sum(sent) / len(sent), "calls": calls}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--modes", default="none,summary")
    parser.add_argument("--ids", default="new,stored")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--broker-url", default=None, help="default: --redis-url")
    parser.add_argument("--label", default="")
    parser.add_argument("--profile", action="store_true",
                        help="a cProfile of the records (thread CPU time) after the figures")
    parser.add_argument("--sort", default="cumulative", help="the profile's order")
    parser.add_argument("--rows", type=int, default=45, help="the profile's rows")
    args = parser.parse_args()
    env = Env(args.redis_url)
    trips = Trips()
    profile = cProfile.Profile(time.thread_time) if args.profile else None  # CPU, not waits
    messages = history(args.size)
    try:
        for mode in args.modes.split(","):
            for ids in args.ids.split(","):
                sid = f"rec-{mode}-{ids}"
                seed(env.store(), sid, messages, summary_at=0.9 if mode == "summary" else None)
                gc.collect()
                row = records(env, args.broker_url or args.redis_url, sid, args.calls,
                              ids == "stored", trips, profile)
                row.update(label=args.label, mode=mode, ids=ids, load=loadavg())
                print(json.dumps(row), flush=True)
    finally:
        env.cleanup()
    if profile is not None:
        pstats.Stats(profile, stream=sys.stdout).sort_stats(args.sort).print_stats(args.rows)


if __name__ == "__main__":
    main()
