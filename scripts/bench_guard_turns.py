"""Guard wait per turn on a real long session, with a worker compacting beside it.

A real session (transcripts of ``../shared/data/transcripts.dev.jsonl``, turn
after turn, ``--turns`` of them) is replayed as an agent does it: one
``prepare`` per model call (the turn so far as ``pending``), then
``record_turn`` with usage. The window is small (an 8k trigger by default),
so the session compacts again and again; a worker process (the real
``Compactor``, offline summarizer) runs whenever a job is pending, as Celery
would, off the agent's process. One turn is a tool chain of ``--chain`` calls
built from real tool calls. Reported: guard wait per turn (every prepare of
the turn, its wire conversion included, plus record_turn) p50/p99, per prepare
p50/p99 when nothing needs compacting (alone, and with the view in the wire
format), and LangChain's ``SummarizationMiddleware.before_model`` (langchain v1,
a trigger it never reaches) on the view's messages at the same point of the
loop (alone, and followed by ``convert_to_openai_messages``, the conversion its
model call makes), paired call for call (the two in alternating order).

    PYTHONPATH=. .venv/bin/python scripts/bench_guard_turns.py [--turns 127] [--chain 27]
        [--format openai|anthropic|gemini] [--llm-ms 0]

``--llm-ms``: each prepare is followed by a model call of that long (a sleep), as in a
real agent, where the worker summarizes while the model answers; 0 (the default) is
the worst case, every call right after the last, the worker always behind.

``--gc-freeze``: ``gc.freeze()`` once the process has imported everything and loaded the
sessions, before the first turn, as a long-running agent can at startup: the collector's
full passes then walk only what was made since (the figures the benchmark reports are
without it). ``gc_full`` in the output: full collections during the replay and their ms.
"""

from __future__ import annotations

import argparse
import gc
import math
import multiprocessing
import time
from collections.abc import Sequence
from typing import Any

from _guard_sessions import SYSTEM, Env, all_turns, lc_messages
from _timing import loadavg, percentile

from shared.core.messages import Message
from shared.enqueue import NullEnqueuer
from shared.guard import ContextGuard

MODEL = "bench-8k"


def chain_turn(length: int) -> list[Message]:
    """One user turn holding ``length`` real (call, result) pairs in a row."""
    pairs: list[list[Message]] = []
    for turn in all_turns():
        for i, m in enumerate(turn):
            if m.role == "assistant" and len(m.tool_calls) == 1 and i + 1 < len(turn) \
                    and turn[i + 1].role == "tool":
                pairs.append([m, turn[i + 1]])
        if len(pairs) >= length:
            break
    out = [Message(role="user", content="Fix the failing test, step by step.")]
    for k, (call, result) in enumerate(pairs[:length]):
        cid = f"chain-{k}"
        out.append(call.model_copy(update={"tool_calls": [
            call.tool_calls[0].model_copy(update={"id": cid})]}))
        out.append(result.model_copy(update={"tool_call_id": cid}))
    out.append(Message(role="assistant", content="Done: the test passes."))
    return out


def worker(url: str, prefix: str, sid: str, stop: Any) -> None:
    """The compaction worker: runs the real Compactor whenever the job is pending."""
    from shared.core.config import StoreConfig
    from shared.store.sessions import SessionStore, connect
    from workers.compactor import Compactor
    from workers.summarizer.engine import SummaryEngine

    cfg = StoreConfig(key_prefix=prefix, max_messages_per_session=400_000)
    store = SessionStore(connect(url, cfg), cfg)
    compactor = Compactor(store, SummaryEngine(None))
    while not stop.is_set():
        if store.is_pending(sid):
            store.clear_pending(sid)
            compactor.run(sid)
        time.sleep(0.005)


def replay(guard: ContextGuard, sid: str, turns: list[list[Message]], args: argparse.Namespace,
           full: FullCollections) -> tuple[list[float], ...]:
    """Per turn: wall ms of every prepare plus record_turn (and the same in this thread's
    CPU ms, which other load on the machine does not inflate). Per quiet prepare (nothing
    to compact): its ms, and LangChain's hook on the same messages at the same point of
    the loop (after the same model call), in alternating order."""
    per_turn, quiet, chain, cpu, hooked, hook_turns = [], [], [], [], [], []
    alone, converted, quiet_cpu = args.alone, args.converted, args.quiet_cpu
    hook, lc_state = middleware_hook(), LcState()
    kw = {"max_tokens": args.max_tokens, "model": MODEL}
    for number, turn in enumerate(turns):
        wait = used = hook_wait = 0.0
        calls = [i for i, m in enumerate(turn) if m.role == "assistant"] or [len(turn)]
        view = None
        for i in calls:
            if args.llm_ms:
                time.sleep(args.llm_ms / 1000)  # the model call the last view was sent to
            hook_first = len(quiet) % 2 == 1
            lc = timed_hook(hook, lc_state.state) if hook_first else None
            full.guarding = True
            cpu_started, started = time.thread_time(), time.perf_counter()
            view = guard.prepare(sid, SYSTEM, pending=turn[:i], **kw)
            prepared = time.perf_counter()
            if args.format == "openai":
                view.wire("openai")
            else:
                getattr(view, args.format)(shared=True)
            took = (time.perf_counter() - started) * 1000
            full.guarding = False
            this_cpu = (time.thread_time() - cpu_started) * 1000
            used += this_cpu
            if not hook_first:
                lc = timed_hook(hook, lc_state.state)
            wait += took
            hook_wait += lc[0] if lc is not None else 0.0
            report = view.report
            if not (report.truncated or report.budget.should_compact or report.cheap_applied):
                quiet.append(took)
                quiet_cpu.append(this_cpu)
                alone.append((prepared - started) * 1000)
                if lc is not None:
                    hooked.append(lc[0])
                    converted.append(lc[0] + lc[1])
            if number == args.chain_at:
                chain.append(took)
            lc_state.update(view.messages)
        assert view is not None
        if args.llm_ms:
            time.sleep(args.llm_ms / 1000)  # the model call whose answer ends the turn
        full.guarding = True
        cpu_started, started = time.thread_time(), time.perf_counter()
        guard.record_turn(sid, turn, usage={"prompt_tokens": view.report.estimated_prompt_tokens})
        full.guarding = False
        per_turn.append(wait + (time.perf_counter() - started) * 1000)
        cpu.append(used + (time.thread_time() - cpu_started) * 1000)
        args.turn_calls.append(len(calls))
        if number:  # the first turn's first call has no state for the hook yet
            hook_turns.append(hook_wait)
    return per_turn, quiet, chain, cpu, hooked, hook_turns


class FullCollections:
    """A ``gc.callbacks`` hook: the wall ms of each full (generation 2) collection, and
    whether it ran inside a guard call (``guarding`` is set around each): a collection
    runs in whichever call's allocation crosses the threshold, though the garbage may be
    anyone's (LangChain's hook and state in this loop make most of it)."""

    def __init__(self) -> None:
        self.took: list[tuple[float, bool]] = []
        self.started = 0.0
        self.guarding = False

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self.started = time.perf_counter()
        else:
            self.took.append(((time.perf_counter() - self.started) * 1000, self.guarding))

    def described(self) -> str:
        if not self.took:
            return "gc_full 0"
        inside = sum(1 for _, guarding in self.took if guarding)
        times = ", ".join(f"{ms:.1f}" for ms, _ in self.took)
        return f"gc_full {len(self.took)} ({times} ms; {inside} inside the guard's calls)"


class LcState:
    """A LangChain agent's state holding the view's messages (after our system message),
    each message converted once: the loop makes no more garbage per call than the agent
    would (a list rebuilt per call makes the collector run on the guard's time)."""

    def __init__(self) -> None:
        self.state: dict[str, Any] | None = None
        self.system = lc_messages([])[0]
        self.known: dict[int, tuple[Message, Any]] = {}

    def update(self, messages: Sequence[Message]) -> None:
        out = [self.system]
        for m in list(messages)[1:]:
            found = self.known.get(id(m))
            if found is None or found[0] is not m:
                found = self.known[id(m)] = (m, lc_messages([m])[1])
            out.append(found[1])
        self.state = {"messages": out}


def middleware_hook() -> Any:
    """LangChain's ``SummarizationMiddleware`` with a trigger it never reaches: its
    ``before_model`` is the per-call cost of a LangChain agent that does not compact."""
    from langchain.agents.middleware import SummarizationMiddleware
    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    return SummarizationMiddleware(FakeListChatModel(responses=["summary"]),
                                   trigger=("tokens", 10**9), keep=("messages", 20))


def timed_hook(hook: Any, state: dict[str, Any] | None) -> tuple[float, float] | None:
    """ms of ``before_model`` on ``state``, then of ``convert_to_openai_messages`` on its
    messages (what LangChain's model call does before sending); None before the first
    view."""
    from langchain_core.messages import convert_to_openai_messages

    if state is None:
        return None
    started = time.perf_counter()
    assert hook.before_model(state, None) is None
    hooked = time.perf_counter()
    convert_to_openai_messages(state["messages"])
    return (hooked - started) * 1000, (time.perf_counter() - hooked) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=127)
    parser.add_argument("--chain", type=int, default=27)
    parser.add_argument("--window", type=int, default=14_000, help="8k trigger: (w - 4000) * .8")
    parser.add_argument("--max-tokens", type=int, default=4000)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/5")
    parser.add_argument("--format", choices=("openai", "anthropic", "gemini"), default="openai",
                        help="the wire format the agent sends")
    parser.add_argument("--gc-freeze", action="store_true",
                        help="gc.freeze() after start-up, before the first turn")
    parser.add_argument("--llm-ms", type=float, default=0.0,
                        help="the model call after each prepare, in ms (0: none, the worker "
                             "always behind: the worst case)")
    args = parser.parse_args()
    args.alone, args.converted, args.quiet_cpu, args.turn_calls = [], [], [], []
    turns = all_turns()[: args.turns - 1]
    args.chain_at = len(turns) // 2
    turns.insert(args.chain_at, chain_turn(args.chain))
    env = Env(args.redis_url)
    sid = "turns"
    stop = multiprocessing.Event()
    proc = multiprocessing.Process(target=worker, args=(env.url, env.prefix, sid, stop))
    proc.start()
    try:
        guard = ContextGuard(env.store(), NullEnqueuer(), overrides={MODEL: args.window})
        if args.gc_freeze:
            gc.collect()
            gc.freeze()
        full = FullCollections()
        gc.callbacks.append(full)
        try:
            per_turn, quiet, chain, cpu, lc, lc_turns = replay(guard, sid, turns, args, full)
        finally:
            gc.callbacks.remove(full)
        summaries = len(guard.store.summaries(sid))
    finally:
        stop.set()
        proc.join(10)
        env.cleanup()
    print(f"load average {loadavg()}; {len(turns)} turns, {sum(len(t) for t in turns)} "
          f"messages, window {args.window}, {summaries} summaries kept at the end, "
          f"model call {args.llm_ms:g} ms; gc "
          f"{'frozen after start-up' if args.gc_freeze else 'as is'}, {full.described()}\n")
    print("| figure | p50 ms | p99 ms | target |\n|---|---|---|---|")
    print(f"| guard wait per turn | {percentile(per_turn, 50):.2f} | "
          f"{percentile(per_turn, 99):.2f} | p99 <= 5 |")
    print(f"| the same, CPU of the agent's thread | {percentile(cpu, 50):.2f} | "
          f"{percentile(cpu, 99):.2f} | |")
    print(f"| SummarizationMiddleware.before_model per turn (every call, never compacting) | "
          f"{percentile(lc_turns, 50):.2f} | {percentile(lc_turns, 99):.2f} | |")
    print(f"| tool chain of {args.chain} calls: per prepare | {percentile(chain, 50):.2f} | "
          f"{percentile(chain, 99):.2f} | total {sum(chain):.1f} ms |")
    alone, converted = args.alone, args.converted
    ranked = sorted(range(len(cpu)), key=cpu.__getitem__)
    p99_turn = ranked[max(0, math.ceil(0.99 * len(cpu)) - 1)]  # nearest rank, as percentile
    print(f"| the p99 turn (nearest rank, by CPU): its CPU / wall, calls | {cpu[p99_turn]:.2f} | "
          f"{per_turn[p99_turn]:.2f} | {args.turn_calls[p99_turn]} calls |")
    print(f"| prepare, nothing to compact, the view in {args.format}'s format: CPU of the "
          f"agent's thread | {percentile(args.quiet_cpu, 50):.3f} | "
          f"{percentile(args.quiet_cpu, 99):.3f} | |")
    print(f"| prepare, nothing to compact | {percentile(alone, 50):.3f} | "
          f"{percentile(alone, 99):.3f} | <= 2x middleware |")
    print(f"| the same, the view in {args.format}'s format | {percentile(quiet, 50):.3f} | "
          f"{percentile(quiet, 99):.3f} | |")
    if lc:
        print(f"| SummarizationMiddleware.before_model, not compacting | "
              f"{percentile(lc, 50):.3f} | {percentile(lc, 99):.3f} | |")
        print(f"| the same, then convert_to_openai_messages | {percentile(converted, 50):.3f} | "
              f"{percentile(converted, 99):.3f} | |")
        print(f"\nprepare / before_model p50: {percentile(alone, 50) / percentile(lc, 50):.2f}x")
        if args.format == "openai":
            print(f"both with the OpenAI conversion, p50: "
                  f"{percentile(quiet, 50) / percentile(converted, 50):.2f}x")


if __name__ == "__main__":
    main()
