"""What a guard holds for turns prepared but never recorded: its bound on turns in progress.

An agent prepares each model call of a turn with the turn so far as ``pending``
and records the turn at its end; one that stops mid-turn (a crash, a user who left)
never records it, and the guard keeps what it validated, counted and converted of
that turn until newer turns push it out. This script prepares one real 27-call tool
chain (55 messages, as an HTTP client sends them: new dicts each call) for each of
``--sessions`` sessions, never recorded, and reports the memory the guard holds
afterwards (tracemalloc, gc not frozen, the view cache off so only the turns count),
with the chain's tool outputs as they are and padded to ``--big`` bytes each.

    PYTHONPATH=scripts:. .venv/bin/python scripts/bench_guard_memory.py [--sessions 1200]
"""

from __future__ import annotations

import argparse
import gc
import json
import tracemalloc
from typing import Any

from _guard_sessions import SYSTEM, Env
from bench_guard_turns import chain_turn

from shared.core.messages import validate_messages
from shared.core.tokens import DEFAULT_COUNTER
from shared.core.viewcache import PENDING_TOKENS, PENDING_TURNS, ViewCache
from shared.enqueue import NullEnqueuer
from shared.guard import ContextGuard

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=1200)
    parser.add_argument("--big", type=int, default=40_000)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/8")
    args = parser.parse_args()
    env = Env(args.redis_url)
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
    finally:
        env.cleanup()


if __name__ == "__main__":
    main()
