"""Acknowledged turns lost, failed calls, stalls and recovery when a Redis Cluster changes.

Per trial: a fresh cluster of three masters with one replica each
(:func:`workers.harness.stack.redis_server.start_cluster`, ``cluster-node-timeout``
``--node-timeout`` ms). ``--guards`` sync guards in threads (one cluster client each)
record ``--rate`` turns a second (``prepare`` + ``record_turn``) on sessions spread over
the slots; half of the sessions share the slot of the first one (the slot the event
hits). A Compactor in-process (offline summaries, forced) compacts the sessions in turn
all along. After ``--before`` seconds (plus 0-1 s) the event hits the first session's
shard:

- ``failover``: a planned ``CLUSTER FAILOVER`` on the master's replica;
- ``kill``: SIGKILL of the master (its replica is promoted after the node timeout);
- ``hang``: SIGSTOP of the master (a hung host: connections open, no reply, so calls
  wait for their socket timeouts) until its replica is promoted, then SIGCONT (it
  comes back as a replica);
- ``migrate``: the slot moved to another master key by key (``--pause`` s between keys:
  clients meet the slot half moved, ASK and TRYAGAIN), as ``redis-cli --cluster
  reshard`` does. The clients wait a migration out up to ``--migration-wait`` s
  (default: theirs, the connect and socket timeouts: 1 s here).

The turns go on for ``--after`` seconds; then each session is read back and checked.

- lost: turns whose ``record_turn`` returned (acknowledged) that are not in the log;
- dup: acknowledged turns stored twice;
- failed: calls that raised StoreUnavailable (allowed: the caller retries its turn);
- other: any other exception, the guards' and the Compactor's (must be 0);
- failed_elsewhere: of those, the calls on sessions of the shards the event did not hit;
- stall: the longest single call (prepare + record_turn) of any guard, seconds;
- recovery: seconds from the event to the first acknowledged turn after the last failed
  or lost one (from then on every acknowledged turn is kept), the worst guard (inf: a
  guard whose calls still failed when the trial ended);
- bad: sessions failing the store's invariants afterwards (log and running totals of
  one length, totals increasing, a summary at the watermark, watermarks inside the log).

    PYTHONPATH=. python scripts/failover_cluster.py [--trials 3] [--guards 6] [--rate 20]
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import random
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from shared.core.config import StoreConfig
from shared.core.errors import StoreUnavailable
from shared.guard import ContextGuard
from shared.store.keys import DEFAULT_TENANT, SessionKeys
from shared.store.sessions import SessionStore, connect_cluster
from workers.compactor import Compactor
from workers.harness.reliability.common import integrity
from workers.harness.stack.redis_server import LocalCluster, start_cluster
from workers.summarizer.engine import SummaryEngine

CONFIG = StoreConfig(key_prefix="fc", socket_timeout=0.5, connect_timeout=0.5)
EVENTS = ("failover", "kill", "hang", "migrate")


@dataclass
class GuardRun:
    """One guard's attempts: (seconds since the event, turn number, outcome, duration)."""

    sid: str
    attempts: list[tuple[float, int, str, float]] = field(default_factory=list)


def _turn(sid: str, i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{sid} turn {i}"},
            {"role": "assistant", "content": f"{sid} done {i} " + "words " * 40}]


def _since(event_at: list[float], now: float) -> float:
    return now - event_at[0] if event_at else -1.0


def _drive(guard: ContextGuard, run: GuardRun, rate: float, event_at: list[float],
           stop: threading.Event) -> None:
    i, next_at = 0, time.monotonic()
    while not stop.is_set():
        began = time.monotonic()
        try:
            guard.prepare(run.sid, "system", None, 256, "gpt-4o", pending=_turn(run.sid, i)[:1])
            guard.record_turn(run.sid, _turn(run.sid, i))
            outcome = "ok"
        except StoreUnavailable:
            outcome = "failed"
        except Exception as exc:  # counted: must not happen
            outcome = f"other:{type(exc).__name__}:{str(exc)[:120]}"
        now = time.monotonic()
        run.attempts.append((_since(event_at, now), i, outcome, now - began))
        if outcome == "ok":
            i += 1
        next_at = max(next_at + 1 / rate, now)
        stop.wait(max(0.0, next_at - time.monotonic()))


def _compact(store: SessionStore, sids: list[str], stop: threading.Event,
             outcomes: collections.Counter[str]) -> None:
    """Forced compactions of each session in turn (offline summaries), all along."""
    compactor = Compactor(store, SummaryEngine(None), recall_indexer=None)
    n = 0
    while not stop.is_set():
        sid = sids[n % len(sids)]
        n += 1
        try:
            outcomes[compactor.run(sid, force=True, keep_recent=4).status] += 1
        except StoreUnavailable:
            outcomes["failed"] += 1
        except Exception as exc:  # counted: must not happen
            outcomes[f"other:{type(exc).__name__}:{str(exc)[:120]}"] += 1
        stop.wait(0.05)


def _slot(cluster: LocalCluster, sid: str) -> int:
    return cluster.key_slot(SessionKeys.for_session(CONFIG.key_prefix, DEFAULT_TENANT, sid).log)


def session_ids(cluster: LocalCluster, guards: int) -> list[str]:
    """``guards`` session ids: the first half in one slot (the event's), the rest spread."""
    sids = ["g0"]
    target, n = _slot(cluster, "g0"), 0
    while len(sids) < max(1, guards // 2):
        n += 1
        if _slot(cluster, f"g0-{n}") == target:
            sids.append(f"g0-{n}")
    return sids + [f"g{g}" for g in range(len(sids), guards)]


def _event(cluster: LocalCluster, event: str, slot: int, pause: float) -> None:
    master = cluster.master_of_slot(slot)
    if event == "failover":
        cluster.failover(master)
    elif event == "kill":
        cluster.kill(master)
        cluster.wait_master_not(master)
    elif event == "hang":
        cluster.pause(master)
        cluster.wait_master_not(master)
        cluster.resume(master)
    else:
        target = next(p for p in cluster.masters() if p != master)
        cluster.migrate_slot(slot, target, batch=1, pause=pause)


def _check(cluster: LocalCluster, runs: list[GuardRun], elsewhere: set[str]) -> dict[str, Any]:
    store = SessionStore(connect_cluster(cluster.url, CONFIG), CONFIG)
    lost = dup = failed = failed_elsewhere = bad = 0
    stall = recovery = 0.0
    others: list[str] = []
    problems: list[str] = []
    try:
        for run in runs:
            numbers = [int(str(m.content).rsplit(" ", 1)[1]) for m in store.messages(run.sid)
                       if m.role == "user"]
            kept = set(numbers)
            dup += len(numbers) - len(kept)
            issues = integrity(store, run.sid, quiet=False)
            bad += bool(issues)
            problems += issues
            bad_until = 0.0
            for at, i, outcome, took in run.attempts:
                is_bad = outcome != "ok" or i not in kept
                lost += outcome == "ok" and i not in kept
                failed += outcome == "failed"
                failed_elsewhere += outcome == "failed" and run.sid in elsewhere
                if outcome.startswith("other"):
                    others.append(outcome)
                stall = max(stall, took)
                if is_bad and at >= 0:
                    bad_until = max(bad_until, at)
            first_good = min((at for at, i, o, _ in run.attempts
                              if o == "ok" and at > bad_until), default=math.inf)
            recovery = max(recovery, first_good if bad_until > 0 else 0.0)  # inf: never
    finally:
        store.redis.close()
    return {"lost": lost, "dup": dup, "failed": failed, "failed_elsewhere": failed_elsewhere,
            "other": len(others),
            "stall_s": round(stall, 2), "recovery_s": round(recovery, 2), "bad": bad,
            "others": sorted(set(others))[:5], "problems": problems[:5]}


def trial(event: str, guards: int, rate: float, before: float, after: float,
          node_timeout: int, pause: float, node_args: tuple[str, ...] = (),
          migration_wait: float | None = None) -> dict[str, Any]:
    cluster = start_cluster(replicas=1, node_timeout_ms=node_timeout, extra_args=node_args)
    try:
        sids = session_ids(cluster, guards)
        runs = [GuardRun(sid) for sid in sids]
        clients = [connect_cluster(cluster.url, CONFIG, migration_wait=migration_wait)
                   for _ in runs]
        compacting = SessionStore(
            connect_cluster(cluster.url, CONFIG, migration_wait=migration_wait), CONFIG)
        compactions: collections.Counter[str] = collections.Counter()
        event_at: list[float] = []
        stop = threading.Event()
        threads = [threading.Thread(target=_drive, args=(
            ContextGuard(SessionStore(c, CONFIG), None), r, rate, event_at, stop))
            for c, r in zip(clients, runs, strict=True)]
        threads.append(threading.Thread(target=_compact,
                                        args=(compacting, sids, stop, compactions)))
        for t in threads:
            t.start()
        time.sleep(before + random.random())
        slot = _slot(cluster, sids[0])
        hit = cluster.master_of_slot(slot)
        elsewhere = {s for s in sids if cluster.master_of_slot(_slot(cluster, s)) != hit}
        event_at.append(time.monotonic())
        _event(cluster, event, slot, pause)
        took = time.monotonic() - event_at[0]
        time.sleep(after)
        stop.set()
        for t in threads:
            t.join()
        for c in [*clients, compacting.redis]:
            c.close()
        result = {"event": event, "event_s": round(took, 2), **_check(cluster, runs, elsewhere),
                  "sessions_elsewhere": len(elsewhere),
                  "acked": sum(o == "ok" for r in runs for _, _, o, _ in r.attempts),
                  "compactions": dict(compactions)}
        result["other"] += sum(n for k, n in compactions.items() if k.startswith("other"))
        return result
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--guards", type=int, default=6)
    parser.add_argument("--rate", type=float, default=20.0, help="turns/s per guard")
    parser.add_argument("--before", type=float, default=2.0)
    parser.add_argument("--after", type=float, default=6.0,
                        help="seconds of turns after the event is over")
    parser.add_argument("--events", default=",".join(EVENTS))
    parser.add_argument("--node-timeout", type=int, default=1000,
                        help="cluster-node-timeout of the nodes, ms")
    parser.add_argument("--node-args", default="",
                        help="more redis-server arguments for every node, e.g. "
                        "'--cluster-require-full-coverage no'")
    parser.add_argument("--pause", type=float, default=0.05,
                        help="seconds between two keys of a slot migration")
    parser.add_argument("--migration-wait", type=float, default=None,
                        help="seconds a call waits for a slot migration to end "
                        "(default: the client's, connect + socket timeout)")
    args = parser.parse_args()
    events = args.events.split(",")
    results = []
    for n in range(args.trials):
        for event in events:
            result = trial(event, args.guards, args.rate, args.before, args.after,
                           args.node_timeout, args.pause, tuple(args.node_args.split()),
                           args.migration_wait)
            result["trial"] = n + 1
            print(json.dumps(result), flush=True)
            results.append(result)
    print(f"\n{args.guards} guards x {args.rate:g} turns/s, 3 masters + 3 replicas, "
          f"cluster-node-timeout {args.node_timeout} ms; per event: median (min-max) over "
          f"{args.trials} trials {args.node_args}"
          + (f" migration-wait {args.migration_wait:g} s"
             if args.migration_wait is not None else ""))
    keys = ("lost", "dup", "failed", "failed_elsewhere", "stall_s", "recovery_s", "bad")
    print(f"{'event':<9} " + " ".join(f"{k:<16}" for k in keys) + " other")
    for event in events:
        rows = [r for r in results if r["event"] == event]

        def fig(key: str, rows: list[dict[str, Any]] = rows) -> str:
            values = [r[key] for r in rows]
            return f"{statistics.median(values):g} ({min(values):g}-{max(values):g})"

        print(f"{event:<9} " + " ".join(f"{fig(k):<16}" for k in keys)
              + f" {sum(r['other'] for r in rows)}")


if __name__ == "__main__":
    main()
