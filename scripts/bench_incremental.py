"""Summarizer input cost of incremental compaction against re-summarizing from scratch.

One long session (``--turns`` turns of ``generate_session``) is played turn
by turn the way the service runs it: ``ContextGuard.prepare`` before each
call, ``record_turn`` after it, then the worker's job (``Compactor.run``,
i.e. ``maybe_summarize``: compacts only when due) with a real
``OpenAIClient`` talking to the fake OpenAI server, which answers with
sectioned summaries and reports ``usage.prompt_tokens``.

Incremental: what the summarizer was actually sent, every call (merges
into the previous summary, split-turn prefix calls included), as the fake
counted it. From scratch: at the same compaction points (same session,
same window, same cuts) the request a summarizer without a previous summary
needs, ``[0, cut)`` in full (with the same fact-ledger block), counted by the
same counter. Both are compared with the session's own size: all its
messages, counted the same way. Prints markdown.

    .venv/bin/python scripts/bench_incremental.py [--windows 32000,128000] [--turns 400]
        [--tokenizer ../shared/data/tokenizers/o200k_base.tiktoken]
        [--redis-url redis://127.0.0.1:6379/5]
"""

from __future__ import annotations

import argparse
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.adapters import from_openai, to_openai
from shared.config import CompactionPolicy, StoreConfig
from shared.guard import ContextGuard
from shared.ledger import extract_facts
from shared.messages import Message
from shared.store import SessionStore, connect
from shared.tokens import DEFAULT_COUNTER
from shared.turns import turn_starts
from workers.compactor import Compactor
from workers.demo_session import SYSTEM_PROMPT, TOOLS, generate_session
from workers.fakes.behaviour import request_texts
from workers.fakes.counting import DEFAULT_TOKENIZER_PATH, default_counter
from workers.fakes.openai_server import FakeOpenAIServer
from workers.fakes.summaries import SummarizerResponder
from workers.summarizer.engine import SummaryEngine
from workers.summarizer.prompts import build_summary_request, request_tokens
from workers.summarizer.providers import OpenAIClient

AGENT_MODEL = "gpt-4o"
SUMMARIZER_MODEL = "gpt-4o-mini"
MAX_TOKENS = 2000
PREFIX_MARKER = "beginning of one long turn"
MESSAGE_INDEX = re.compile(r'<message index="(\d+)"')
TAG = re.compile(r"</?(?:message|tool_call)\b[^>]*>")


@dataclass
class Compaction:
    """One compaction: its cut and what each approach sent for it."""

    turn: int
    base: int
    cut: int
    calls: int
    incremental: int  # prompt tokens the fake counted, all calls of this job
    scratch: int  # the from-scratch request for [0, cut)
    incremental_heuristic: int
    scratch_heuristic: int
    stages: list[str] = field(default_factory=list)


@dataclass
class Played:
    window: int
    messages: int
    session_tokens: int
    session_heuristic: int
    summarized_tokens: int  # [0, last cut), same counter as session_tokens
    compactions: list[Compaction]
    engine_input: int  # what the engine itself reported (usage), as a cross-check
    seconds: float

    def total(self, name: str) -> int:
        return sum(int(getattr(c, name)) for c in self.compactions)


@dataclass
class CompactPrefixResponder:
    """``SummarizerResponder``, with short answers to split-turn prefix requests.

    The stock fake answers every request with all eight summary sections;
    for a tiny turn prefix (a few short tool results) that is longer than
    the prefix itself, the quality gate rejects it and the whole job fails
    (a finding reported beside the figures). A model told to stay within a
    budget answers such a prefix in a few lines, which is what this does, so
    the cost comparison measures summarization, not that failure.
    """

    inner: SummarizerResponder = field(default_factory=SummarizerResponder)
    prefix_requests: int = 0
    stock_too_long: int = 0

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        _system, user, _count = request_texts(request)
        if PREFIX_MARKER not in user:
            return self.inner(request)
        self.prefix_requests += 1
        indexes = [int(i) for i in MESSAGE_INDEX.findall(user)]
        span = f"#{min(indexes)}-#{max(indexes)}" if indexes else "the turn so far"
        # What the quality gate compares with: the prefix messages' own tokens (here from
        # the rendered transcript without its tags; clipped outputs make this a lower bound).
        transcript = user.split("<transcript>", 1)[-1].split("</transcript>", 1)[0]
        content = TAG.sub("", transcript)
        prefix_tokens = DEFAULT_COUNTER.text(content) + 4 * len(indexes)
        if DEFAULT_COUNTER.text(self.inner.summarize(user)) > prefix_tokens:
            self.stock_too_long += 1
        text = (f"### Turn request\n- The user's request opening messages {span}.\n"
                f"### Attempted\n- Tool calls in {span}.\n"
                "### Intermediate results\n- See the tool results summarized above.\n"
                "### Current state\n- In progress.")
        return {"role": "assistant", "content": text}


def demo_turns(turns: int, seed: int) -> list[list[Message]]:
    body = from_openai(generate_session(turns, seed=seed))[1:]
    starts = turn_starts(body)
    return [body[a:b] for a, b in zip(starts, [*starts[1:], len(body)], strict=True)]


def scratch_request(messages: list[Message], policy: CompactionPolicy) -> list[dict[str, str]]:
    """What a from-scratch summarizer is sent for ``messages`` = [0, cut)."""
    ledger = extract_facts(messages).capped(policy.max_ledger_chars)
    return build_summary_request(messages, None, ledger=ledger, start=0,
                                 max_summary_tokens=policy.max_summary_tokens)


def play(store: SessionStore, server: FakeOpenAIServer, turns: list[list[Message]],
         window: int) -> Played:
    """Record every turn, run the job after each one, price both approaches per compaction."""
    started = time.perf_counter()
    policy = CompactionPolicy()
    sid = f"incr-{window}"
    client = OpenAIClient(SUMMARIZER_MODEL, base_url=server.base_url, api_key="bench",
                          timeout=120)
    compactor = Compactor(store, SummaryEngine(client, counter=store.counter), policy=policy)
    guard = ContextGuard(store, overrides={AGENT_MODEL: window}, policy=policy)
    count = server.counter
    server.reset()
    compactions: list[Compaction] = []
    engine_input = 0
    for number, turn in enumerate(turns, start=1):
        guard.prepare(sid, SYSTEM_PROMPT, TOOLS, MAX_TOKENS, AGENT_MODEL, pending=turn[:1])
        guard.record_turn(sid, turn)
        store.clear_pending(sid)  # the job below plays the worker that would clear it
        seen = len(server.requests)
        outcome = compactor.run(sid)
        if outcome.status != "compacted":
            continue
        if outcome.summary_kind != "llm":
            raise SystemExit(f"turn {number}: compaction without the LLM: {outcome}")
        sent = server.requests[seen:]
        bodies = [r.body["messages"] for r in sent]
        covered = store.messages(sid, 0, outcome.watermark_after)
        scratch = scratch_request(covered, policy)
        engine_input += outcome.summarizer_input_tokens
        compactions.append(Compaction(
            turn=number, base=outcome.watermark_before,
            cut=outcome.watermark_after, calls=len(sent),
            incremental=sum(r.prompt_tokens or 0 for r in sent),
            scratch=count(scratch, None),
            incremental_heuristic=sum(request_tokens(b) for b in bodies),
            scratch_heuristic=request_tokens(scratch), stages=outcome.stages))
    log = store.messages(sid)
    session_tokens = count(to_openai(log), None)
    last_cut = compactions[-1].cut if compactions else 0
    summarized = count(to_openai(log[:last_cut]), None) if last_cut else 0
    store.delete_session(sid)
    return Played(window, len(log), session_tokens, DEFAULT_COUNTER.messages(log), summarized,
                  compactions, engine_input, time.perf_counter() - started)


def report(played: list[Played], counter_name: str, args: argparse.Namespace) -> None:
    print("## Incremental summarization cost\n")
    print("Command: `.venv/bin/python scripts/bench_incremental.py` (one "
          f"{args.turns}-turn `generate_session` (seed {args.seed}) recorded through "
          "`ContextGuard`; after every turn the worker's job `Compactor.run` with `OpenAIClient` "
          "on the fake OpenAI server (`SummarizerResponder`, prefix answers kept short: see "
          "below); Redis store on "
          f"127.0.0.1:6379, own db, cleaned up). Tokens are counted by the fake's counter "
          f"({counter_name}), the same one for the session and for both approaches; the "
          "project's heuristic estimate is given beside it.\n")
    print("| window | messages | session tokens | compactions | LLM calls | incremental input "
          "| / session | / range summarized | from scratch input | / session | "
          "scratch / incremental | incremental <= 1.3x session |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for p in played:
        inc, scratch = p.total("incremental"), p.total("scratch")
        print(f"| {p.window} | {p.messages} | {p.session_tokens} | {len(p.compactions)} | "
              f"{p.total('calls')} | {inc} | {inc / p.session_tokens:.2f}x | "
              f"{inc / max(1, p.summarized_tokens):.2f}x | {scratch} | "
              f"{scratch / p.session_tokens:.1f}x | {scratch / max(1, inc):.1f}x | "
              f"{'met' if inc <= 1.3 * p.session_tokens else 'NOT met'} |")
    print("\n(range summarized: messages [0, last cut), which every approach must read at least "
          "once; the rest of the session is still verbatim in the view.)")
    print("\nThe same in the project's heuristic estimate (what the workers budget with):\n")
    print("| window | session tokens | incremental input | / session | from scratch input | "
          "/ session |")
    print("|---|---|---|---|---|---|")
    for p in played:
        inc, scratch = p.total("incremental_heuristic"), p.total("scratch_heuristic")
        print(f"| {p.window} | {p.session_heuristic} | {inc} | "
              f"{inc / p.session_heuristic:.2f}x | {scratch} | "
              f"{scratch / p.session_heuristic:.1f}x |")
    for p in played:
        split = sum(1 for c in p.compactions if "turn_prefix_summary" in c.stages)
        print(f"\nWindow {p.window}: {len(p.compactions)} compactions ({split} with a split-turn "
              f"prefix call), cuts at turns {', '.join(str(c.turn) for c in p.compactions[:12])}"
              f"{', ...' if len(p.compactions) > 12 else ''}; the engine's own usage total "
              f"{p.engine_input} (the fake's log: {p.total('incremental')}); "
              f"played in {p.seconds:.1f} s.")
        print("\n| compaction | turn | range summarized | calls | incremental input | "
              "from scratch input |")
        print("|---|---|---|---|---|---|")
        shown = p.compactions if len(p.compactions) <= 8 else (
            p.compactions[:4] + p.compactions[-4:])
        for i, c in enumerate(shown):
            index = p.compactions.index(c) + 1
            if len(p.compactions) > 8 and i == 4:
                print("| ... | | | | | |")
            print(f"| {index} | {c.turn} | [{c.base}, {c.cut}) | {c.calls} | {c.incremental} | "
                  f"{c.scratch} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/5",
                        help="session store (own db; unique key prefix, cleaned up)")
    parser.add_argument("--windows", default="32000,128000",
                        help="agent model context windows, comma separated")
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER_PATH,
                        help="o200k_base.tiktoken for the fake's counter (chars/4 if missing)")
    args = parser.parse_args(argv)
    counter = default_counter(str(args.tokenizer))
    counter_name = getattr(counter, "name", "o200k")
    prefix = "bi" + uuid.uuid4().hex[:8]
    config = StoreConfig(key_prefix=prefix, socket_timeout=10, connect_timeout=5)
    client = connect(args.redis_url, config)
    store = SessionStore(client, config)
    turns = demo_turns(args.turns, args.seed)
    played: list[Played] = []
    try:
        responder = CompactPrefixResponder()
        with FakeOpenAIServer(window=4_000_000, responder=responder,
                              counter=counter) as server:
            for window in (int(w) for w in args.windows.split(",")):
                played.append(play(store, server, turns, window))
    finally:
        for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            client.delete(key)
    report(played, counter_name, args)
    print(f"\nSplit-turn prefix requests: {responder.prefix_requests}; for "
          f"{responder.stock_too_long} of them the stock `SummarizerResponder` answer (all eight "
          "sections) is longer than the prefix messages themselves, so `check_summary` would "
          "reject it and the whole job would fail; the fake used here answers prefixes in four "
          "short lines.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
