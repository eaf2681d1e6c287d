"""The floor under a first prepare: what a new process pays to read and parse a cold view.

Without a summary a 10k-message session's view is its whole log (about 11.7 MB of
JSON), so a process that has never seen the session must read all of it before the
guard can plan anything. This script measures that floor on the machine at hand and
the guard's own first prepare of the same session, in new processes taken in turn:

- *floor*: redis-py and orjson imported, the connection open; then one ``LRANGE`` of
  the whole log and ``orjson.loads`` of every entry, nothing else;
- *guard*: ``scripts/bench_guard.py``'s first prepare (its view in OpenAI's format).

The gap between the two is the guard's work on top of the read (shapes, budget, wire).

    PYTHONPATH=scripts:. .venv/bin/python scripts/bench_guard_floor.py [--size 10000]
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from _guard_sessions import Env, history, seed
from _timing import loadavg
from bench_guard import first_runs

from shared.store.keys import SessionKeys

FLOOR = """
import time, redis, orjson
client = redis.Redis.from_url({url!r}, socket_timeout=60)
client.ping()
started = time.perf_counter()
raw = client.lrange({key!r}, 0, -1)
read = time.perf_counter()
parsed = [orjson.loads(entry) for entry in raw]
done = time.perf_counter()
print((read - started) * 1000, (done - read) * 1000, sum(map(len, raw)), len(parsed))
"""


def floor_once(url: str, key: str) -> tuple[float, float, int, int]:
    out = subprocess.run([sys.executable, "-c", FLOOR.format(url=url, key=key)], check=True,
                         capture_output=True, text=True).stdout.split()
    return float(out[0]), float(out[1]), int(out[2]), int(out[3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/9")
    args = parser.parse_args()
    env = Env(url=args.redis_url)
    try:
        store = env.store()
        sid = "floor"
        seed(store, sid, history(args.size))
        key = SessionKeys.for_session(env.prefix, store.tenant, sid).log
        print(f"load average {loadavg()}; {args.rounds} rounds, each a floor process then "
              "three guard processes\n")
        print("| round | `LRANGE` ms | `orjson.loads` ms | floor ms | guard's first prepare ms |")
        print("|---|---|---|---|---|")
        size = entries = 0
        for r in range(1, args.rounds + 1):
            read, parse, size, entries = floor_once(env.url, key)
            guard = sorted(first_runs(env, sid))[1]
            print(f"| {r} | {read:.1f} | {parse:.1f} | {read + parse:.1f} | {guard:.1f} |")
        print(f"\n{entries:,} entries, {size / 1e6:.2f} MB of JSON; the guard's figure is the "
              "median of three new processes")
    finally:
        env.cleanup()


if __name__ == "__main__":
    main()
