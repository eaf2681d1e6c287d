"""A session that outgrows its window while no worker summarizes it: the guard's cost per call.

The agent loop of a long coding task: turn after turn, one user message and a real tool
chain (``scripts/bench_guard_turns.py``'s, ``--chain`` calls, new call ids each turn),
every call prepared with the turn so far as ``pending`` and converted to the wire
format, then the turn recorded. No worker runs (``NullEnqueuer``: the workers are down
or far behind), so once the log outgrows the window only the guard's emergency
truncation keeps the view inside it. That truncation is committed as a summary record
(the watermark moves past what it dropped), so the calls after it should cost what a
quiet call costs, not a new truncation of the whole view each.

``--same-user``: the agent sends one user message object every turn (a constant
"continue"), as agents that build their prompt once do; the default builds one per
turn. ``--system-first``: the log opens with a system message the agent recorded and no
summary has landed (the cut keeps that message ahead of what it drops, so it cannot be
recorded as a watermark move: every call beyond the window cuts again). Reported per
phase (the log within the window; beyond it): per call p50 / p99, and the calls that
truncated.

    PYTHONPATH=scripts:. .venv/bin/python scripts/bench_guard_behind.py [--same-user]
        [--system-first] [--window 1000000] [--turns 170] [--chain 27]
"""

from __future__ import annotations

import argparse
import time

from _guard_sessions import SYSTEM, Env, all_turns, seed
from _timing import loadavg, percentile
from bench_guard_turns import chain_turn

from shared.core.messages import Message
from shared.enqueue import NullEnqueuer
from shared.guard import ContextGuard

MODEL = "bench-behind"


def renamed(turn: list[Message], k: int, user: Message | None) -> list[Message]:
    """The chain as new message objects with call ids of their own (a provider's new
    response each turn) and, given ``user``, that very object as its user message."""
    out: list[Message] = []
    for m in turn:
        if m.tool_calls:
            m = m.model_copy(update={"tool_calls": [
                c.model_copy(update={"id": f"{c.id}-t{k}"}) for c in m.tool_calls]})
        elif m.tool_call_id:
            m = m.model_copy(update={"tool_call_id": f"{m.tool_call_id}-t{k}"})
        else:
            m = user if user is not None and m.role == "user" else m.model_copy()
        out.append(m)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--window", type=int, default=1_000_000)
    parser.add_argument("--turns", type=int, default=170)
    parser.add_argument("--chain", type=int, default=27)
    parser.add_argument("--same-user", action="store_true")
    parser.add_argument("--system-first", action="store_true")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/5")
    args = parser.parse_args()
    env = Env(args.redis_url)
    store = env.store()
    sid = "behind"
    history = [m for t in all_turns()[:40] for m in t]
    if args.system_first:
        seed(store, sid, [Message(role="system", content="Project rules: be terse."), *history])
    else:
        seed(store, sid, history, summary_at=0.5)
    guard = ContextGuard(store, NullEnqueuer(), overrides={MODEL: args.window})
    chain = chain_turn(args.chain)
    user = chain[0] if args.same_user else None
    calls = [i for i, m in enumerate(chain) if m.role == "assistant"]
    within: list[float] = []
    beyond: list[float] = []
    truncated = 0
    started_beyond = None
    try:
        for k in range(args.turns):
            turn = renamed(chain, k, user)
            for i in calls:
                started = time.perf_counter()
                view = guard.prepare(sid, SYSTEM, pending=turn[:i], max_tokens=4000,
                                     model=MODEL)
                view.wire("openai")
                took = (time.perf_counter() - started) * 1000
                if started_beyond is None and (view.report.truncated
                                               or view.report.summary_kind == "truncation"):
                    started_beyond = k
                (beyond if started_beyond is not None else within).append(took)
                truncated += view.report.truncated
            guard.record_turn(sid, turn)
    finally:
        env.cleanup()
    sent = "one user message object" if args.same_user else "a new user message"
    print(f"load average {loadavg()}; window {args.window:,}, {args.turns} turns of "
          f"{len(calls)} calls, {sent} per turn; beyond the window from turn {started_beyond}; "
          f"{truncated} calls truncated\n")
    print("| phase | calls | p50 ms | p99 ms |\n|---|---|---|---|")
    for name, times in (("within the window", within), ("beyond it, no worker", beyond)):
        if times:
            print(f"| {name} | {len(times)} | {percentile(times, 50):.3f} | "
                  f"{percentile(times, 99):.3f} |")


if __name__ == "__main__":
    main()
