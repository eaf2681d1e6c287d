"""A warm guard on a Sentinel deployment: the change feed on against every call reading.

A Sentinel deployment on loopback (a primary, a replica, three Sentinels: the harness's).
Two guards of the same kind (sync or asyncio) on ``redis+sentinel://`` stores, each on a
session of its own, replay the same real turns (``../shared/data/transcripts.dev.jsonl``)
as an agent does: a prepare per model call with the turn so far pending, the view in
OpenAI's format, then ``record_turn``. One guard has the change feed and the own-writes
connection (the default: both follow the primary), the other ``watch_changes=False``
(every prepare reads the session: what Sentinel deployments had before they followed
it). They alternate turn by turn, so both see the same minutes of a shared machine.
Reported per guard: prepare + wire p50 / p99, and the view reads per prepare (the
primary's ``EVALSHA`` calls during its prepares).

    PYTHONPATH=. .venv/bin/python scripts/bench_sentinel_feed.py [--turns 120] [--shell sync|async]
        [--llm-ms 0] [--events-seconds 15]

``--llm-ms``: a model call (a sleep) before each prepare. The guards vouch only while the
store's pool's answer is fresh: asked within its follow interval (1 s), or within
``--events-seconds`` (the URL's ``sentinel_events_seconds``) while it hears every
Sentinel's events; ``--events-seconds 0``: no events, calls more than a second apart read.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from contextlib import closing
from typing import Any

import redis
from _guard_sessions import SYSTEM, all_turns
from _timing import loadavg, percentile

from shared.core.config import StoreConfig
from shared.guard import AsyncContextGuard, ContextGuard
from shared.store.aio import AsyncSessionStore, connect_async
from shared.store.sessions import SessionStore, connect
from workers.harness.stack.sentinel_pair import start_sentinel_deployment

MODEL = "gpt-4o"


class Arm:
    """One guard replaying turns on its own session; its prepare times and reads."""

    def __init__(self, kind: str, url: str, feed: bool, loop: asyncio.AbstractEventLoop,
                 primary: int) -> None:
        config = StoreConfig(key_prefix="feed" if feed else "nofeed")
        self.kind, self.loop, self.primary = kind, loop, primary
        self.name = "feed and own writes (default)" if feed else "watch_changes=False"
        if kind == "sync":
            self.store: Any = SessionStore(connect(url, config), config)
            self.guard: Any = ContextGuard(self.store, None, watch_changes=feed)
        else:
            self.store = AsyncSessionStore(connect_async(url, config), config)
            self.guard = AsyncContextGuard(self.store, None, watch_changes=feed)
        self.times: list[float] = []
        self.read_times: list[float] = []  # the prepares that read the session
        self.reads = 0

    def _run(self, value: Any) -> Any:
        return self.loop.run_until_complete(value) if self.kind == "async" else value

    def turn(self, turn: list[Any], llm_ms: float) -> None:
        calls = [i for i, m in enumerate(turn) if m.role == "assistant"] or [len(turn)]
        for i in calls:
            # the model call the last view was sent to (awaited on the loop, async)
            self._run(asyncio.sleep(llm_ms / 1000)) if self.kind == "async" \
                else time.sleep(llm_ms / 1000)
            before = _scripts_run(self.primary)
            started = time.perf_counter()
            view = self._run(self.guard.prepare("s", SYSTEM, max_tokens=4000, model=MODEL,
                                                pending=turn[:i]))
            view.wire("openai")
            took = (time.perf_counter() - started) * 1000
            self.times.append(took)
            read = _scripts_run(self.primary) - before
            self.reads += read
            if read:
                self.read_times.append(took)
        self._run(self.guard.record_turn("s", turn))

    def close(self) -> None:
        if self.kind == "async":
            self.loop.run_until_complete(self.guard.aclose())
            self.loop.run_until_complete(self.store.redis.aclose())
        else:
            self.guard.close()
            self.store.redis.close()


def _scripts_run(port: int) -> int:
    """Scripts the server has run so far (a guard's read of a view is one ``EVALSHA``)."""
    with closing(redis.Redis(port=port, socket_timeout=2)) as direct:
        stats: Any = direct.info("commandstats")
        return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=120)
    parser.add_argument("--shell", choices=("sync", "async"), default="sync")
    parser.add_argument("--llm-ms", type=float, default=0.0,
                        help="a model call this long before each prepare (0: back to back)")
    parser.add_argument("--events-seconds", type=float, default=None,
                        help="the URL's sentinel_events_seconds (default: the URL's default)")
    args = parser.parse_args()
    turns = all_turns()[: args.turns]
    loop = asyncio.new_event_loop()
    with start_sentinel_deployment() as deployment:
        deployment.wait_ready()
        primary = deployment.primary_port()
        url = deployment.url() + ("" if args.events_seconds is None
                                  else f"?sentinel_events_seconds={args.events_seconds:g}")
        arms = [Arm(args.shell, url, feed, loop, primary) for feed in (True, False)]
        try:
            for number, turn in enumerate(turns):
                for arm in arms if number % 2 else arms[::-1]:
                    arm.turn(turn, args.llm_ms)
        finally:
            for arm in arms:
                arm.close()
            loop.close()
    print(f"load average {loadavg()}; {args.shell} guards on redis+sentinel://, {len(turns)} "
          f"real turns, {len(arms[0].times)} prepares each, alternating turn by turn, model "
          f"calls {args.llm_ms:g} ms, sentinel_events_seconds "
          f"{'default' if args.events_seconds is None else f'{args.events_seconds:g}'}\n")
    print("| guard | prepare + wire p50 ms | p99 ms | view reads per prepare | p50 of those "
          "that read; of the others |\n|---|---|---|---|---|")
    for arm in arms:
        quiet = [t for t in arm.times if t not in arm.read_times] or [0.0]
        print(f"| {arm.name} | {percentile(arm.times, 50):.3f} | {percentile(arm.times, 99):.3f} "
              f"| {arm.reads / len(arm.times):.2f} | {percentile(arm.read_times, 50):.3f}; "
              f"{percentile(quiet, 50):.3f} |")
    on, off = (percentile(arm.times, 50) for arm in arms)
    print(f"\nwatch_changes=False / default, p50: {off / on:.2f}x")


if __name__ == "__main__":
    main()
