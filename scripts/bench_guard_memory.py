"""What a guard holds for turns prepared but never recorded: its bound on turns in progress.

An agent prepares each model call of a turn with the turn so far as ``pending``
and records the turn at its end; one that stops mid-turn (a crash, a user who left)
never records it, and the guard keeps what it validated, counted and converted of
that turn until newer turns push it out. This script prepares one real 27-call tool
chain (55 messages, as an HTTP client sends them: new dicts each call) for each of
``--sessions`` sessions, never recorded, and reports the memory the guard holds
afterwards (tracemalloc, gc not frozen, the view cache off so only the turns count),
with the chain's tool outputs as they are and padded to ``--big`` bytes each.

Then, for each shell, ``--recorded`` sessions of ``--turns`` real turns each (prepare, the
view in OpenAI's format, ``record_turn``; every seventh session deleted) through one
guard with its default bounds: the process's RSS and the collector's objects at each
checkpoint (``--marks``, 4 by default). Past the first (the view cache full) nothing
should grow but the bounded structures: the change feed's per-session marks (forgotten past 100,000
sessions) and the session-id check's memo (4,096 ids). ``--shells`` runs one guard only
(two processes can then run side by side); ``--marks`` sets the checkpoints; ``--ttl``
lets sessions expire, as a deployment does, so that Redis holds only the recent ones.

    PYTHONPATH=scripts:. .venv/bin/python scripts/bench_guard_memory.py [--sessions 1200] \
        [--recorded 8000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import time
import tracemalloc
from typing import Any

from _guard_sessions import SYSTEM, Env, all_turns
from _timing import proc_memory
from bench_guard_turns import chain_turn

from shared.core.messages import validate_messages
from shared.core.tokens import DEFAULT_COUNTER
from shared.core.viewcache import PENDING_TOKENS, PENDING_TURNS, ViewCache
from shared.enqueue import NullEnqueuer
from shared.guard import AsyncContextGuard, ContextGuard
from shared.store.aio import AsyncSessionStore, connect_async

MODEL = "bench-memory"


def turn_body(big: int) -> str:
    """The chain as JSON, each tool output padded (repeated) to ``big`` bytes if given."""
    wire: list[dict[str, Any]] = [m.model_dump(mode="json", exclude_none=True)
                                  for m in chain_turn(27)[:-1]]
    for m in wire:
        if big and m["role"] == "tool":
            m["content"] = (m["content"] * (big // max(1, len(m["content"])) + 1))[:big]
    return json.dumps(wire)


def held(env: Env, sessions: int, body: str) -> tuple[float, int]:
    """MB held after ``sessions`` abandoned turns, and how many turns the guard kept."""
    cache = ViewCache(0, 0)
    guard = ContextGuard(env.store(), NullEnqueuer(), view_cache=cache,
                         overrides={MODEL: 100_000_000})
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for s in range(sessions):
        guard.prepare(f"m{s}", SYSTEM, max_tokens=1000, model=MODEL, pending=json.loads(body))
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    kept = len(cache.pending()[0])
    guard.close()
    return used / 1e6, kept


RECORDED_MODEL = "bench-8k"


def checkpoint(shell: str, done: int, started: float) -> tuple[int, float, int, float]:
    """RSS and the collector's objects now, printed at once (a long run shows its
    progress, and a run cut short keeps what it measured)."""
    gc.collect()
    mark = done, proc_memory(os.getpid())[0], len(gc.get_objects()), time.monotonic() - started
    print(f"| {shell} | {done:,} | {mark[3]:,.0f} | {mark[1]:,.1f} | {mark[2]:,} |", flush=True)
    return mark


def turns_for(i: int, turns: list[Any], count: int) -> list[tuple[list[Any], list[Any]]]:
    """``count`` real turns for session ``i``: (what the call sends as pending, the turn)."""
    out = []
    for k in range(count):
        turn = turns[(i * count + k) % len(turns)]
        answer = max([j for j, m in enumerate(turn) if m.role == "assistant"] or [0])
        out.append((turn[:answer], turn))
    return out


def recorded_sync(env: Env, n: int, marks: int, per: int) -> list[tuple[int, float, int, float]]:
    store, turns = env.store(), all_turns()
    guard = ContextGuard(store, NullEnqueuer(), overrides={RECORDED_MODEL: 8000})
    done, started = [], time.monotonic()
    for i in range(n):
        for pending, turn in turns_for(i, turns, per):
            view = guard.prepare(f"r{i}", SYSTEM, pending=pending, max_tokens=2000,
                                 model=RECORDED_MODEL)
            view.openai()
            guard.record_turn(f"r{i}", turn,
                              usage={"prompt_tokens": view.report.estimated_prompt_tokens})
        if i % 7 == 0:
            store.delete_session(f"r{i}")
        if (i + 1) % max(1, n // marks) == 0:
            done.append(checkpoint("sync", i + 1, started))
    guard.close()
    return done


async def recorded_async(env: Env, n: int, marks: int, per: int,
                         ) -> list[tuple[int, float, int, float]]:
    store, turns = AsyncSessionStore(connect_async(env.url, env.config), env.config), all_turns()
    guard = AsyncContextGuard(store, NullEnqueuer(), overrides={RECORDED_MODEL: 8000})
    done, started = [], time.monotonic()
    for i in range(n):
        for pending, turn in turns_for(i, turns, per):
            view = await guard.prepare(f"a{i}", SYSTEM, pending=pending, max_tokens=2000,
                                       model=RECORDED_MODEL)
            view.openai()
            await guard.record_turn(f"a{i}", turn, usage={
                "prompt_tokens": view.report.estimated_prompt_tokens})
        if i % 7 == 0:
            await store.delete_session(f"a{i}")
        if (i + 1) % max(1, n // marks) == 0:
            done.append(checkpoint("async", i + 1, started))
    await guard.aclose()
    return done


def report_recorded(shell: str, marks: list[tuple[int, float, int, float]]) -> None:
    (first, rss0, obj0, _), (last, rss1, obj1, _) = marks[0], marks[-1]
    per = 1000 / max(1, last - first)
    print(f"| {shell}: growth per 1,000 sessions past the first mark | | | "
          f"{(rss1 - rss0) * per:+.2f} | {(obj1 - obj0) * per:+,.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=1200)
    parser.add_argument("--big", type=int, default=40_000)
    parser.add_argument("--recorded", type=int, default=8000)
    parser.add_argument("--shells", default="sync,async",
                        help="which guards serve the recorded sessions: sync, async or both")
    parser.add_argument("--marks", type=int, default=4, help="checkpoints per recorded run")
    parser.add_argument("--turns", type=int, default=3, help="real turns per recorded session")
    parser.add_argument("--ttl", type=int, default=None,
                        help="the sessions' TTL in seconds (a run of 100,000 sessions keeps "
                             "~5 GB in Redis without one)")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/8")
    args = parser.parse_args()
    env = Env(args.redis_url, ttl_seconds=args.ttl)
    print(f"bounds: {PENDING_TURNS:,} turns, {PENDING_TOKENS:,} tokens\n")
    print("| tool outputs | turn JSON | turn tokens | turns kept | held MB | bytes a token |")
    print("|---|---|---|---|---|---|")
    try:
        for big in (0, args.big):
            body = turn_body(big)
            tokens = sum(DEFAULT_COUNTER.message(m) for m in validate_messages(json.loads(body)))
            mb, kept = held(env, args.sessions, body)
            label = "as recorded" if not big else f"{big:,} bytes each"
            print(f"| {label} | {len(body) / 1e3:,.0f} kB | {tokens:,} | {kept:,} | {mb:,.0f} | "
                  f"{mb * 1e6 / max(1, kept * tokens):.1f} |")
        if args.recorded >= 4:
            print(f"\n{args.recorded:,} sessions of {args.turns} recorded turns through one guard "
                  "(default bounds), gc not frozen\n")
            print("| shell | sessions | seconds | RSS MiB | objects |\n|---|---|---|---|---|")
            shells = args.shells.split(",")
            if "sync" in shells:
                report_recorded("sync", recorded_sync(env, args.recorded, args.marks, args.turns))
            if "async" in shells:
                marks = asyncio.run(recorded_async(env, args.recorded, args.marks,
                                                   args.turns))
                report_recorded("async", marks)
    finally:
        env.cleanup()


if __name__ == "__main__":
    main()
