"""A tool chain prepared call by call: the guard's cost per call within one turn.

The turn is ``scripts/bench_guard_turns.py``'s chain (a user message and ``--chain``
real (call, result) pairs from the dev transcripts) over a session of ``--turns`` real
turns. Each call prepares the turn so far as ``pending`` and converts the view to the
wire format, as an agent does before sending it. No worker, no model call: the
figures are the guard's own work per call, in two windows:

- *fits*: a window the whole session fits (nothing to compact; the view's end, the
  pending turn, grows by two messages per call);
- *truncates*: a window the chain outgrows, so its later calls truncate the turn
  (emergency truncation, committed as a summary) on every call.

A call's cost should not grow with the turn so far: the per-call p50 of the chain's first
quarter (its first call aside) and of its last quarter are reported apart (``--chain 150``:
300 pending messages by the end).

Each window and format runs ``--reps`` times, each on a fresh session (a truncation
moves the watermark); blocks alternate between formats, gc is not frozen.

    PYTHONPATH=scripts:. .venv/bin/python scripts/bench_guard_chain.py [--reps 15]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from _guard_sessions import SYSTEM, Env, all_turns
from _timing import loadavg, percentile
from bench_guard_turns import chain_turn

from shared.core.messages import Message
from shared.enqueue import NullEnqueuer
from shared.guard import ContextGuard

MODEL = "bench-chain"
FORMATS = ("openai", "anthropic", "gemini")
WINDOWS = {"fits": 10_000_000, "truncates": 8_000}


def one_turn(env: Env, sid: str, history: list[list[Message]], chain: list[Message],
             window: int, fmt: str) -> tuple[list[float], int]:
    """ms of each call of the chain (prepare + wire), and how many calls truncated."""
    guard = ContextGuard(env.store(), NullEnqueuer(), overrides={MODEL: window})
    for turn in history:
        guard.record_turn(sid, turn)
    wire(guard.prepare(sid, SYSTEM, max_tokens=4000, model=MODEL), fmt)  # the last turn's call
    chain = [m.model_copy() for m in chain]  # new objects: nothing of an earlier run reused
    calls = [i for i, m in enumerate(chain) if m.role == "assistant"]
    times, truncated = [], 0
    for i in calls:
        started = time.perf_counter()
        view = guard.prepare(sid, SYSTEM, pending=chain[:i], max_tokens=4000, model=MODEL)
        wire(view, fmt)
        times.append((time.perf_counter() - started) * 1000)
        truncated += view.report.truncated
    guard.close()
    return times, truncated


def wire(view: Any, fmt: str) -> None:
    """The view in the format the agent sends (kept, not copied: ``shared=True``)."""
    if fmt == "openai":
        view.wire("openai")
    else:
        getattr(view, fmt)(shared=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--chain", type=int, default=27)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/5")
    args = parser.parse_args()
    history = all_turns()[: args.turns]
    chain = chain_turn(args.chain)
    env = Env(args.redis_url)
    results: dict[tuple[str, str], dict[str, Any]] = {}
    try:
        for rep in range(args.reps):
            for name, window in WINDOWS.items():
                for fmt in FORMATS:
                    times, truncated = one_turn(env, f"c{rep}{name}{fmt}", history, chain,
                                                window, fmt)
                    row = results.setdefault((name, fmt), {"calls": [], "turns": [],
                                                           "truncated": 0, "early": [],
                                                           "late": []})
                    row["calls"] += times
                    quarter = max(1, len(times) // 4)
                    row["early"] += times[1:quarter + 1]  # the first call reads the turn
                    row["late"] += times[-quarter:]
                    row["turns"].append(sum(times))
                    row["truncated"] += truncated
    finally:
        env.cleanup()
    print(f"load average {loadavg()}; a {args.chain}-call chain over {args.turns} real turns, "
          f"{args.reps} runs each, gc on\n")
    print("| window | format | per call p50 / p99 ms | per call p50, first / last quarter of "
          "the chain | the turn's calls p50 / max ms | calls truncating |\n"
          "|---|---|---|---|---|---|")
    for (name, fmt), row in results.items():
        calls, turns = row["calls"], row["turns"]
        print(f"| {name} | {fmt} | {percentile(calls, 50):.3f} / {percentile(calls, 99):.3f} | "
              f"{percentile(row['early'], 50):.3f} / {percentile(row['late'], 50):.3f} | "
              f"{percentile(turns, 50):.1f} / {max(turns):.1f} | "
              f"{row['truncated'] / len(calls):.0%} |")


if __name__ == "__main__":
    main()
