"""Acknowledged turns lost, and time to recover, when a Sentinel deployment fails over.

Per trial: a fresh deployment (a primary, a replica, three Sentinels on loopback:
:mod:`workers.harness.stack.sentinel_pair`), ``--guards`` sync guards in threads (one
client each), each recording ``--rate`` turns a second (``prepare`` + ``record_turn``)
through a ``redis+sentinel://`` URL. After ``--before`` seconds the event: a planned
``SENTINEL FAILOVER`` or a SIGKILL of the primary. The turns go on for ``--after``
seconds (the event comes at a random point of the pools' one-second check cycle:
``--before`` plus 0-1 s); then the deployment settles (the old primary demoted and
resynchronised) and each session's log is read from the primary.

- lost: turns whose ``record_turn`` returned (acknowledged) that are not in the log;
- failed: calls that raised StoreUnavailable (allowed: the caller retries its turn);
- other: any other exception (must be 0);
- recovery: seconds from the event to the first acknowledged turn after the last
  failed or lost one (from then on every acknowledged turn is kept), the worst guard.

Pools compared in the same run, trials interleaved: redis-py's stock
``SentinelConnectionPool``, ours (:class:`shared.store.sentinel.FollowingSentinelPool`,
which hears the Sentinels' failover events) and ours with the events off
(``sentinel_events_seconds=0``: a check every second only).

    PYTHONPATH=. python scripts/failover.py [--trials 3] [--guards 4] [--rate 20]
        [--pools stock,following,polling]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from redis.sentinel import SentinelConnectionPool

from shared.core.config import StoreConfig
from shared.core.errors import StoreUnavailable
from shared.guard import ContextGuard
from shared.store.sentinel import FollowingSentinelPool, connect_sentinel
from shared.store.sessions import SessionStore, connect
from workers.harness.stack.sentinel_pair import SentinelDeployment, start_sentinel_deployment

POOLS: dict[str, tuple[type[SentinelConnectionPool], str]] = {
    "stock": (SentinelConnectionPool, ""), "following": (FollowingSentinelPool, ""),
    "polling": (FollowingSentinelPool, "?sentinel_events_seconds=0")}
"""Each pool's class and what its URL adds."""
CONFIG = StoreConfig(key_prefix="fo", socket_timeout=0.5, connect_timeout=0.5)


@dataclass
class GuardRun:
    """One guard's attempts: (seconds since the event, turn number, outcome)."""

    sid: str
    attempts: list[tuple[float, int, str]] = field(default_factory=list)


def _turn(sid: str, i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{sid} turn {i}"},
            {"role": "assistant", "content": f"{sid} done {i}"}]


def _drive(guard: ContextGuard, run: GuardRun, rate: float, event_at: list[float],
           stop: threading.Event) -> None:
    i, next_at = 0, time.monotonic()
    while not stop.is_set():
        try:
            guard.prepare(run.sid, "system", None, 256, "gpt-4o", pending=_turn(run.sid, i)[:1])
            guard.record_turn(run.sid, _turn(run.sid, i))
            outcome = "ok"
        except StoreUnavailable:
            outcome = "failed"
        except Exception as exc:  # counted: must not happen
            outcome = f"other:{type(exc).__name__}"
        now = time.monotonic()
        run.attempts.append((now - event_at[0] if event_at else -1.0, i, outcome))
        if outcome == "ok":
            i += 1
        next_at = max(next_at + 1 / rate, now)
        stop.wait(max(0.0, next_at - time.monotonic()))


def _kept(deployment: SentinelDeployment, sid: str) -> set[int]:
    store = SessionStore(connect(deployment.url(), CONFIG), CONFIG)
    try:
        return {int(str(m.content).rsplit(" ", 1)[1]) for m in store.messages(sid)
                if m.role == "user"}
    finally:
        store.redis.close()


def trial(pool: str, event: str, guards: int, rate: float, before: float,
          after: float, replicas: int = 1, node_args: tuple[str, ...] = ()) -> dict[str, Any]:
    with start_sentinel_deployment(*node_args, replicas=replicas) as deployment:
        runs = [GuardRun(f"g{g}") for g in range(guards)]
        pool_class, options = POOLS[pool]
        clients = [connect_sentinel(deployment.url() + options, CONFIG, pool_class=pool_class)
                   for _ in runs]
        event_at: list[float] = []
        stop = threading.Event()
        threads = [threading.Thread(target=_drive, args=(
            ContextGuard(SessionStore(c, CONFIG), None), r, rate, event_at, stop))
            for c, r in zip(clients, runs, strict=True)]
        for t in threads:
            t.start()
        time.sleep(before + random.random())  # not in phase with the pools' checks
        old = deployment.primary_port()
        event_at.append(time.monotonic())
        if event == "failover":
            deployment.failover()
        else:
            deployment.kill_primary()
        deployment.wait_primary_not(old)
        time.sleep(after)
        stop.set()
        for t in threads:
            t.join()
        deployment.wait_ready(60)  # the old primary demoted and in sync (failover)
        lost = failed = other = 0
        recovery = 0.0
        for run in runs:
            kept = _kept(deployment, run.sid)
            bad_until = 0.0
            for at, i, outcome in run.attempts:
                bad = outcome != "ok" or i not in kept
                lost += outcome == "ok" and i not in kept
                failed += outcome == "failed"
                other += outcome.startswith("other")
                if bad and at >= 0:
                    bad_until = max(bad_until, at)
            first_good = min((at for at, i, o in run.attempts
                              if o == "ok" and at > bad_until), default=float("nan"))
            recovery = max(recovery, first_good if bad_until > 0 else 0.0)
        for c in clients:
            c.close()
        return {"pool": pool, "event": event, "lost": lost, "failed": failed, "other": other,
                "recovery_s": round(recovery, 2),
                "acked": sum(o == "ok" for r in runs for _, _, o in r.attempts)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--guards", type=int, default=4)
    parser.add_argument("--rate", type=float, default=20.0, help="turns/s per guard")
    parser.add_argument("--before", type=float, default=2.0)
    parser.add_argument("--after", type=float, default=12.0,
                        help="seconds of turns after the Sentinels name the new primary")
    parser.add_argument("--events", default="failover,kill")
    parser.add_argument("--pools", default=",".join(POOLS),
                        help=f"of {', '.join(POOLS)}")
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--node-args", default="",
                        help="more redis-server arguments for the data nodes, e.g. "
                        "'--min-replicas-to-write 1 --min-replicas-max-lag 1'")
    args = parser.parse_args()
    pools = args.pools.split(",")
    results = []
    for n in range(args.trials):
        for event in args.events.split(","):
            for pool in pools:
                result = trial(pool, event, args.guards, args.rate, args.before, args.after,
                               args.replicas, tuple(args.node_args.split()))
                result["trial"] = n + 1
                print(json.dumps(result), flush=True)
                results.append(result)
    print(f"\n{args.guards} guards x {args.rate:g} turns/s, {args.replicas} replica(s) "
          f"{args.node_args}; per pool and event: median (min-max) over the trials")
    print(f"{'event':<9} {'pool':<10} {'lost acked turns':<20} {'failed calls':<16} "
          f"{'recovery s':<16} other")
    for event in args.events.split(","):
        for pool in pools:
            rows = [r for r in results if r["pool"] == pool and r["event"] == event]

            def fig(key: str, rows: list[dict[str, Any]] = rows) -> str:
                values = [r[key] for r in rows]
                return f"{statistics.median(values):g} ({min(values):g}-{max(values):g})"

            print(f"{event:<9} {pool:<10} {fig('lost'):<20} {fig('failed'):<16} "
                  f"{fig('recovery_s'):<16} {sum(r['other'] for r in rows)}")


if __name__ == "__main__":
    main()
