"""Summarizer input cost of incremental compaction against re-summarizing from scratch.

One long session is played turn by turn the way the service runs it (a
*turn* is one agent step, as in ``compaction replay``: the step's new input
and the assistant reply): ``ContextGuard.prepare`` before the model call,
``record_turn`` after it, then the worker's job (``Compactor.run``, i.e.
``maybe_summarize``: compacts only when due) with a real ``OpenAIClient``
talking to the fake OpenAI server, which answers with sectioned summaries and
reports ``usage.prompt_tokens``.

The session (``--source``):

- ``real`` (the default when ``--data`` exists): the coding sessions of
  ``transcripts.dev.jsonl`` (a SWE-bench agent; real tool outputs) chained in
  file order into one session of ``--turns`` steps, cut at a step boundary.
  No recorded session is that long, so the chain is synthetic: the agent
  takes one task after the other in one conversation. Tool-call ids are
  prefixed per source session (the recorded ids repeat across sessions);
  nothing else changes.
- ``demo``: ``generate_session`` (deterministic, no third-party text), for
  machines without the data.

Incremental: what the summarizer was actually sent, every call (merges into
the previous summary, folds, split-turn prefix calls, rebuilds after a
guard truncation), as the fake counted it. From scratch: at the same
compaction points (same session, window and cuts) the request a summarizer
without a previous summary needs, ``[0, cut)`` in full with the same
fact-ledger block, counted by the same counter (one request: past the
summarizer's own window it would have to be folded, which costs at least as
much). Both are compared with the session's own size: all its messages,
counted the same way. Prints markdown.

    .venv/bin/python scripts/bench_incremental.py [--data ../shared/data/transcripts.dev.jsonl]
        [--source real|demo] [--windows 16000,32000,128000] [--turns 400]
        [--tokenizer ../shared/data/tokenizers/o200k_base.tiktoken]
        [--redis-url redis://127.0.0.1:6379/5]
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _timing  # noqa: F401  (puts this checkout first on sys.path)

from shared.core.config import CompactionPolicy, StoreConfig
from shared.core.facts import extract_facts
from shared.core.messages import Message
from shared.core.tokens import DEFAULT_COUNTER
from shared.core.wire import from_openai, to_openai
from shared.guard import ContextGuard
from shared.store.sessions import SessionStore, connect
from workers.compactor import Compactor
from workers.harness.demo_session import SYSTEM_PROMPT, TOOLS, generate_session
from workers.harness.fakes.counting import DEFAULT_TOKENIZER_PATH, PromptCounter, default_counter
from workers.harness.fakes.openai_server import FakeOpenAIServer
from workers.harness.fakes.summaries import SummarizerResponder
from workers.harness.replay.sessions import load_sessions
from workers.harness.transcripts import DATA_DIR, TRANSCRIPTS
from workers.summarizer.engine import SummaryEngine
from workers.summarizer.prompts import build_summary_request, request_tokens
from workers.summarizer.providers import OpenAIClient

DEFAULT_DATA = DATA_DIR / TRANSCRIPTS
AGENT_MODEL = "gpt-4o"
SUMMARIZER_MODEL = "gpt-4o-mini"
MAX_TOKENS = 2000
REAL_DOMAIN = "mini-swe"  # the coding sessions' ids start with this


@dataclass(frozen=True)
class Step:
    """One agent step: the input since the previous reply, and the reply."""

    pending: tuple[Message, ...]
    reply: Message


@dataclass(frozen=True)
class Source:
    """The session to play and where it came from."""

    description: str
    system_prompt: str
    tools: list[dict[str, Any]] | None
    steps: list[Step]


@dataclass
class Compaction:
    """One compaction: its cut and what each approach sent for it."""

    turn: int
    base: int
    cut: int
    calls: int
    incremental: int  # prompt tokens the fake counted, all calls of this job
    transcript: int  # of which the messages themselves (the <transcript> blocks)
    scratch: int  # the from-scratch request for [0, cut)
    incremental_heuristic: int
    scratch_heuristic: int
    kind: str
    stages: list[str] = field(default_factory=list)


@dataclass
class Played:
    window: int
    turns: int
    messages: int
    session_tokens: int
    session_heuristic: int
    summarized_tokens: int  # [0, last cut), same counter as session_tokens
    compactions: list[Compaction]
    engine_input: int  # what the engine itself reported (usage), as a cross-check
    failed_jobs: list[str]
    truncations: int
    seconds: float

    def total(self, name: str) -> int:
        return sum(int(getattr(c, name)) for c in self.compactions)


def steps_of(body: Sequence[Message]) -> list[Step]:
    """Every assistant message with the messages since the previous one."""
    out: list[Step] = []
    start = 0
    for i, message in enumerate(body):
        if message.role == "assistant":
            out.append(Step(tuple(body[start:i]), message))
            start = i + 1
    return out


def _prefixed(message: Message, prefix: str) -> Message:
    """``message`` with its tool-call ids (and the id it answers) prefixed."""
    update: dict[str, Any] = {}
    if message.tool_calls:
        update["tool_calls"] = [tc.model_copy(update={"id": f"{prefix}{tc.id}"})
                                for tc in message.tool_calls]
    if message.tool_call_id:
        update["tool_call_id"] = f"{prefix}{message.tool_call_id}"
    return message.model_copy(update=update) if update else message


def real_source(path: Path, turns: int) -> Source:
    """The recorded coding sessions chained in file order, cut after ``turns`` steps."""
    loaded = load_sessions(path, select=[REAL_DOMAIN])
    if not loaded.sessions:
        raise SystemExit(f"{path}: no '{REAL_DOMAIN}' session to build the session from")
    steps: list[Step] = []
    used: list[str] = []
    for number, session in enumerate(loaded.sessions):
        prefix = f"s{number}_"
        body = [_prefixed(m, prefix) for m in session.messages]
        taken = steps_of(body)[: turns - len(steps)]
        steps.extend(taken)
        used.append(f"{session.source_id} ({len(taken)} steps)")
        if len(steps) >= turns:
            break
    first = loaded.sessions[0]
    description = (f"real: {len(used)} coding sessions of `{path.name}` chained in file order "
                   f"into one {len(steps)}-step session ({'; '.join(used)}); system prompt and "
                   f"tool definitions ({first.tools_source}) of the first")
    return Source(description, first.system_prompt, first.tools, steps)


def demo_source(turns: int, seed: int) -> Source:
    body = from_openai(generate_session(turns, seed=seed))[1:]
    steps = steps_of(body)[:turns]
    return Source(f"synthetic: `generate_session` (seed {seed}), first {len(steps)} steps",
                  SYSTEM_PROMPT, TOOLS, steps)


def transcript_tokens(request: list[dict[str, Any]], count: PromptCounter) -> int:
    """Tokens of the ``<transcript>`` block of a summary request (the messages summarized);
    the rest of the request is its fixed part: instructions, previous summary, facts."""
    text = "\n".join(str(m.get("content") or "") for m in request if m.get("role") == "user")
    if "<transcript>" not in text:
        return 0
    block = text.split("<transcript>", 1)[1].split("</transcript>", 1)[0]
    return count([{"role": "user", "content": block}], None)


def scratch_request(messages: list[Message], policy: CompactionPolicy) -> list[dict[str, str]]:
    """What a from-scratch summarizer is sent for ``messages`` = [0, cut)."""
    ledger = extract_facts(messages).capped(policy.max_ledger_chars)
    return build_summary_request(messages, None, ledger=ledger, start=0,
                                 max_summary_tokens=policy.max_summary_tokens)


def play(store: SessionStore, server: FakeOpenAIServer, source: Source, window: int,
         count: PromptCounter) -> Played:
    """Record every step, run the job after each one, price both approaches per compaction."""
    started = time.perf_counter()
    policy = CompactionPolicy()
    sid = f"incr-{window}"
    client = OpenAIClient(SUMMARIZER_MODEL, base_url=server.base_url, api_key="bench",
                          timeout=120)
    compactor = Compactor(store, SummaryEngine(client, counter=store.counter), policy=policy)
    guard = ContextGuard(store, overrides={AGENT_MODEL: window}, policy=policy)
    server.reset()
    compactions: list[Compaction] = []
    failed: list[str] = []
    truncations = 0
    engine_input = 0
    for number, step in enumerate(source.steps, start=1):
        view = guard.prepare(sid, source.system_prompt, source.tools, MAX_TOKENS, AGENT_MODEL,
                             pending=list(step.pending))
        truncations += bool(view.report.truncated)
        guard.record_turn(sid, [*step.pending, step.reply])
        store.clear_pending(sid)  # the job below plays the worker that would clear it
        seen = len(server.requests)
        try:
            outcome = compactor.run(sid)
        except Exception as exc:  # a failed job is a finding, reported; the play goes on
            failed.append(f"turn {number}: {type(exc).__name__}: {str(exc)[:160]}")
            continue
        if outcome.status != "compacted":
            continue
        sent = server.requests[seen:]
        bodies = [r.body["messages"] for r in sent]
        covered = store.messages(sid, 0, outcome.watermark_after)
        scratch = scratch_request(covered, policy)
        engine_input += outcome.summarizer_input_tokens
        compactions.append(Compaction(
            turn=number, base=outcome.watermark_before, cut=outcome.watermark_after,
            calls=len(sent), incremental=sum(r.prompt_tokens or 0 for r in sent),
            transcript=sum(transcript_tokens(b, count) for b in bodies),
            scratch=count(scratch, None), incremental_heuristic=sum(request_tokens(b)
                                                                    for b in bodies),
            scratch_heuristic=request_tokens(scratch), kind=outcome.summary_kind,
            stages=outcome.stages))
    log = store.messages(sid)
    session_tokens = count(to_openai(log), None)
    last_cut = compactions[-1].cut if compactions else 0
    summarized = count(to_openai(log[:last_cut]), None) if last_cut else 0
    store.delete_session(sid)
    return Played(window, len(source.steps), len(log), session_tokens,
                  DEFAULT_COUNTER.messages(log), summarized, compactions, engine_input, failed,
                  truncations, time.perf_counter() - started)


def report(played: list[Played], source: Source, counter_name: str,
           args: argparse.Namespace) -> None:
    print("## Incremental summarization cost\n")
    print("Command: `.venv/bin/python scripts/bench_incremental.py` "
          f"(`--turns {args.turns} --windows {args.windows}`; Redis store on 127.0.0.1:6379, "
          "own db and key prefix, cleaned up). After every step the worker's job "
          "`Compactor.run` runs with `OpenAIClient` on the fake OpenAI server "
          "(`SummarizerResponder`: all sections, merges the previous summary). Tokens are "
          f"counted by the fake's counter ({counter_name}), the same one for the session and "
          "for both approaches; the project's heuristic estimate is given beside it.\n")
    print(f"Session: {source.description}.\n")
    print("| agent window | steps | messages | session tokens | compactions | LLM calls | "
          "incremental input | / session | from scratch input | / session | "
          "scratch / incremental | target: incremental <= 1.3x session |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for p in played:
        inc, scratch = p.total("incremental"), p.total("scratch")
        print(f"| {p.window} | {p.turns} | {p.messages} | {p.session_tokens} | "
              f"{len(p.compactions)} | {p.total('calls')} | {inc} | "
              f"{inc / p.session_tokens:.2f}x | {scratch} | "
              f"{scratch / p.session_tokens:.1f}x | {scratch / max(1, inc):.1f}x | "
              f"{'met' if inc <= 1.3 * p.session_tokens else 'NOT met'} |")
    print("\nThe same in the project's heuristic estimate (what the workers budget with):\n")
    print("| agent window | session tokens | incremental input | / session | "
          "from scratch input | / session |")
    print("|---|---|---|---|---|---|")
    for p in played:
        inc, scratch = p.total("incremental_heuristic"), p.total("scratch_heuristic")
        print(f"| {p.window} | {p.session_heuristic} | {inc} | "
              f"{inc / p.session_heuristic:.2f}x | {scratch} | "
              f"{scratch / p.session_heuristic:.1f}x |")
    for p in played:
        split = sum(1 for c in p.compactions if "turn_prefix_summary" in c.stages)
        kinds = sorted({c.kind for c in p.compactions})
        print(f"\nWindow {p.window}: {len(p.compactions)} compactions (summary kinds: "
              f"{', '.join(kinds) or '-'}; {split} with a split-turn prefix call), "
              f"{p.truncations} guard truncations, {len(p.failed_jobs)} failed jobs; "
              f"summarized range [0, {p.compactions[-1].cut if p.compactions else 0}) = "
              f"{p.summarized_tokens} tokens, incremental input / that range "
              f"{p.total('incremental') / max(1, p.summarized_tokens):.2f}x, of which the "
              f"transcripts {p.total('transcript')} tokens and the fixed parts (instructions, "
              f"previous summary, facts; per call: "
              f"{(p.total('incremental') - p.total('transcript')) / max(1, p.total('calls')):.0f}"
              f") {p.total('incremental') - p.total('transcript')}; the engine's own "
              f"usage total {p.engine_input} (the fake's log: {p.total('incremental')}); "
              f"played in {p.seconds:.1f} s.")
        for failure in p.failed_jobs[:5]:
            print(f"- failed job, {failure}")
        print("\n| compaction | step | watermark before -> after | calls | incremental input | "
              "from scratch input |")
        print("|---|---|---|---|---|---|")
        shown = p.compactions if len(p.compactions) <= 8 else (
            p.compactions[:4] + p.compactions[-4:])
        for i, c in enumerate(shown):
            index = p.compactions.index(c) + 1
            if len(p.compactions) > 8 and i == 4:
                print("| ... | | | | | |")
            print(f"| {index} | {c.turn} | {c.base} -> {c.cut} | {c.calls} | {c.incremental} "
                  f"| {c.scratch} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/5",
                        help="session store (own db; unique key prefix, cleaned up)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA,
                        help="transcripts.dev.jsonl (real sessions)")
    parser.add_argument("--source", choices=("auto", "real", "demo"), default="auto",
                        help="auto: real when --data exists, else demo")
    parser.add_argument("--windows", default="16000,32000,128000",
                        help="agent model context windows, comma separated")
    parser.add_argument("--turns", type=int, default=400, help="agent steps to play")
    parser.add_argument("--seed", type=int, default=7, help="demo session seed")
    parser.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER_PATH,
                        help="o200k_base.tiktoken for the fake's counter (chars/4 if missing)")
    args = parser.parse_args(argv)
    if args.turns < 1:
        parser.error("--turns must be >= 1")
    use_real = args.source == "real" or (args.source == "auto" and args.data.exists())
    source = real_source(args.data, args.turns) if use_real else demo_source(args.turns,
                                                                             args.seed)
    counter = default_counter(str(args.tokenizer))
    counter_name = getattr(counter, "name", "o200k")
    prefix = "bi" + uuid.uuid4().hex[:8]
    config = StoreConfig(key_prefix=prefix, socket_timeout=10, connect_timeout=5)
    client = connect(args.redis_url, config)
    store = SessionStore(client, config)
    played: list[Played] = []
    try:
        with FakeOpenAIServer(window=4_000_000, responder=SummarizerResponder(),
                              counter=counter) as server:
            for window in (int(w) for w in args.windows.split(",")):
                played.append(play(store, server, source, window, counter))
    finally:
        for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            client.delete(key)
    report(played, source, counter_name, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
