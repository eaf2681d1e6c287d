"""One replayed session: the agent loop an integrator writes, against the fake provider.

The provider's side is :class:`ReplayResponder` (the next recorded
assistant message of the session); :class:`SessionRunner` is the agent's
side (guard, SDK call, recovery from an overflow, record). The whole run
(fakes, Redis, workers, report) is :mod:`workers.harness.replay.run`.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import openai

from shared.core.errors import CompactionError, InvalidInput
from shared.core.messages import Message
from shared.core.wire import from_openai, to_openai
from shared.guard import ContextGuard, PreparedView
from workers.harness.fakes.behaviour import Reply, Script, generated_text, normalize_reply
from workers.harness.fakes.counting import (
    REPLY_PRIMING,
    FramedCounter,
    completion_tokens,
)
from workers.harness.replay.report import SessionReport
from workers.harness.replay.sessions import ReplaySession, Turn

_CLIPPED = re.compile(r"\[\.\.\. \d+ characters removed by emergency truncation \.\.\.\]")


Progress = Callable[[SessionReport], None]


Trace = Callable[[dict[str, Any]], None]


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    """How one replay runs (one window)."""

    window: int
    max_tokens: int = 1024
    model: str = "gpt-4o"
    parallel: int = 1
    workers: int = 1
    concurrency: int = 4
    latency: float = 0.0
    summarizer: Literal["fake", "offline"] = "fake"
    summarizer_window: int = 128_000
    summarizer_latency: float = 0.0
    learn_window: bool = False
    drain_timeout: float = 120.0
    keep_data: bool = False

    def __post_init__(self) -> None:
        if self.window < 2048:
            raise InvalidInput("must be >= 2048", field="window")
        if not 1 <= self.max_tokens < self.window // 2:
            raise InvalidInput("must be >= 1 and below half the window", field="max_tokens")
        for name in ("parallel", "workers", "concurrency"):
            if getattr(self, name) < 1:
                raise InvalidInput("must be >= 1", field=name)
        for name in ("latency", "summarizer_latency", "drain_timeout"):
            if getattr(self, name) < 0:
                raise InvalidInput("must be >= 0", field=name)
        if self.summarizer not in ("fake", "offline"):
            raise InvalidInput("must be 'fake' or 'offline'", field="summarizer")
        if self.summarizer_window < 4096:
            raise InvalidInput("must be >= 4096", field="summarizer_window")


def _framed(encoding: Any, name: str) -> FramedCounter:
    return FramedCounter(lambda text: len(encoding.encode(text, disallowed_special=())), name)


class ReplayResponder:
    """The agent-side provider's answers: each session's recorded replies, in order.

    Requests name their session in ``prompt_cache_key``. A recorded reply
    longer than the request's ``max_tokens`` is still delivered whole (so
    the replay follows the transcript) with its usage capped at
    ``max_tokens``; such replies are counted per session.
    """

    def __init__(self, counter: FramedCounter) -> None:
        self.counter = counter
        self._scripts: dict[str, Script] = {}
        self.over_max_tokens: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, key: str, turns: Sequence[Turn]) -> None:
        replies = [to_openai([t.reply], include_reasoning=False)[0] for t in turns]
        with self._lock:
            self._scripts[key] = Script(replies)

    def discard(self, key: str) -> None:
        with self._lock:
            self._scripts.pop(key, None)

    def align(self, key: str, turn: int) -> None:
        """Skip replies of turns that failed without consuming theirs."""
        script = self._scripts[key]
        while script.position < turn:
            script.next({})

    def __call__(self, request: dict[str, Any]) -> Reply:
        key = request.get("prompt_cache_key")
        script = self._scripts.get(str(key))
        if script is None:
            raise InvalidInput(f"no recorded session {key!r}", field="prompt_cache_key")
        item = script.next(request)
        if not isinstance(item, dict):
            raise InvalidInput("scripts of a replay hold replies only", field="script")
        reply = normalize_reply(item)
        limit = request.get("max_completion_tokens") or request.get("max_tokens")
        used = completion_tokens(self.counter, generated_text(reply))
        if isinstance(limit, int) and used > limit:
            reply["completion_tokens"] = limit
            with self._lock:
                self.over_max_tokens[str(key)] += 1
        return reply


def _is_overflow_answer(exc: openai.APIStatusError) -> bool:
    return exc.status_code == 400 and getattr(exc, "code", None) == "context_length_exceeded"


def _reply_message(response: Any) -> Message:
    """The assistant message of a chat completion, as a neutral Message."""
    message = response.choices[0].message
    wire: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
    calls = [c for c in (message.tool_calls or []) if getattr(c, "function", None) is not None]
    if calls:
        wire["tool_calls"] = [{"id": c.id, "type": "function", "function": {
            "name": c.function.name, "arguments": c.function.arguments}} for c in calls]
    return from_openai([wire])[0]


class SessionRunner:
    """Replays one session turn by turn through its own guard."""

    def __init__(self, session: ReplaySession, guard: ContextGuard, client: openai.OpenAI,
                 responder: ReplayResponder, counter: FramedCounter,
                 options: ReplayOptions, trace: Trace | None = None) -> None:
        self.session = session
        self.trace = trace
        self._row: dict[str, Any] = {}
        self.guard = guard
        self.client = client
        self.responder = responder
        self.counter = counter
        self.options = options
        self.report = SessionReport(key=session.key, source_id=session.source_id,
                                    line=session.line, messages=len(session.messages),
                                    tools_source=session.tools_source,
                                    repairs=len(session.repairs),
                                    reused_tool_ids=session.reused_tool_ids)
        self._due: tuple[int, float, int] | None = None
        self._clipped: set[tuple[str, str]] = set()

    # -- figures of the recorded session -------------------------------------------
    def _message_tokens(self) -> list[int]:
        return [self.counter([wire], None) - REPLY_PRIMING
                for wire in to_openai(list(self.session.messages), include_reasoning=False)]

    def _fixed_tokens(self) -> int:
        s = self.session
        fixed = REPLY_PRIMING
        if s.system_prompt:
            fixed += self.counter([{"role": "system", "content": s.system_prompt}]) - REPLY_PRIMING
        if s.tools:
            fixed += self.counter([], s.tools) - REPLY_PRIMING
        return fixed

    # -- the loop ---------------------------------------------------------------------
    def run(self) -> SessionReport:
        started = time.monotonic()
        s, r, o = self.session, self.report, self.options
        sizes = self._message_tokens()
        fixed = self._fixed_tokens()
        budget = o.window - o.max_tokens
        r.oversized_messages = sum(1 for n in sizes if fixed + n > budget)
        prefix = [0]
        for n in sizes:
            prefix.append(prefix[-1] + n)
        turns = s.turns()
        r.turns = len(turns)
        for number, turn in enumerate(turns):
            full = fixed + prefix[turn.index]
            r.tokens_full += full
            r.turns_over_window_without_compaction += full + o.max_tokens > o.window
            self.responder.align(s.key, number)
            self._row = {"session": s.key, "turn": number, "index": turn.index,
                         "full_prompt": full, "failures_before": r.failed_turns}
            reply, usage = self._turn(number, turn)
            self._record(number, [*turn.pending, reply if reply is not None else turn.reply],
                         usage)
            if self.trace is not None:
                self._row["failed"] = r.failed_turns > self._row.pop("failures_before")
                self.trace(self._row)
        r.unresolved_dues = int(self._due is not None)
        r.replies_over_max_tokens = self.responder.over_max_tokens.get(s.key, 0)
        r.elapsed_s = round(time.monotonic() - started, 3)
        return r

    def _turn(self, number: int, turn: Turn) -> tuple[Message | None, Any]:
        """One provider call (and one retry after recovery); (reply, usage) or (None, None)."""
        s, r, o = self.session, self.report, self.options
        pending = list(turn.pending)
        args = (s.system_prompt, s.tools, o.max_tokens, o.model)
        try:
            began = time.perf_counter()
            view = self.guard.prepare(s.key, *args, pending=pending)
            r.prepare_ms.append((time.perf_counter() - began) * 1000)
        except CompactionError as exc:
            r.fail(number, "prepare", exc)
            return None, None
        self._observe(number, view, prepared=True)
        if not view.messages:  # a reply recorded with no input at all: nothing to send
            r.calls_without_input += 1
            return None, None
        try:
            return self._send(view)
        except openai.APIStatusError as exc:
            first: openai.APIStatusError = exc
        except openai.OpenAIError as exc:
            r.other_errors += 1
            r.fail(number, "send", exc)
            return None, None
        self._row["rejected"] = first.message
        if _is_overflow_answer(first):
            r.rejections += 1
            r.rejected_truncated += view.report.truncated
        else:
            r.other_errors += 1
        try:
            retry = self.guard.recover(s.key, first, *args, pending=pending)
        except CompactionError as exc:
            r.fail(number, "recover", exc)
            return None, None
        if retry is None:
            r.fail(number, "send", f"HTTP {first.status_code}: {first.message}")
            return None, None
        r.reactive_recoveries += 1
        self._observe(number, retry, prepared=False)
        try:
            answer = self._send(retry)
        except openai.APIStatusError as exc:
            r.rejections += _is_overflow_answer(exc)
            r.rejected_truncated += _is_overflow_answer(exc) and retry.report.truncated
            r.other_errors += not _is_overflow_answer(exc)
            r.fail(number, "retry", f"HTTP {exc.status_code}: {exc.message}")
            return None, None
        except openai.OpenAIError as exc:
            r.other_errors += 1
            r.fail(number, "retry", exc)
            return None, None
        r.recovered_turns += 1
        return answer

    def _send(self, view: PreparedView) -> tuple[Message, Any]:
        s, o = self.session, self.options
        reserve = view.report.budget.reserve
        kwargs: dict[str, Any] = {"model": o.model, "messages": view.openai(),
                                  "max_tokens": reserve, "prompt_cache_key": s.key}
        if s.tools:
            kwargs["tools"] = s.tools
        response = self.client.chat.completions.create(**kwargs)
        usage = response.usage
        if usage is not None:
            self._row["prompt_tokens"] = usage.prompt_tokens
            r = self.report
            r.tokens_sent += usage.prompt_tokens
            r.max_prompt_ratio = max(r.max_prompt_ratio,
                                     round(usage.prompt_tokens / o.window, 4))
            r.max_request_ratio = max(r.max_request_ratio,
                                      round((usage.prompt_tokens + reserve) / o.window, 4))
        return _reply_message(response), usage

    def _record(self, number: int, messages: list[Message], usage: Any) -> None:
        try:
            began = time.perf_counter()
            self.guard.record_turn(self.session.key, messages, usage)
            self.report.record_ms.append((time.perf_counter() - began) * 1000)
        except CompactionError as exc:
            self.report.fail(number, "record_turn", exc)

    def _observe(self, number: int, view: PreparedView, *, prepared: bool) -> None:
        """Truncations, clipped messages, and when a compaction fell due / landed."""
        r, report = self.report, view.report
        self._row["prepare" if prepared else "recover"] = {
            "estimated": report.estimated_prompt_tokens, "usage_ratio": round(
                report.budget.usage_ratio, 4), "truncated": report.truncated,
            "dropped": report.dropped_messages, "watermark": report.watermark,
            "version": report.version, "summary_kind": report.summary_kind,
            "cheap": report.cheap_applied, "enqueued": report.enqueued,
            "recovery": report.recovery, "sent_messages": len(view.messages)}
        if prepared and report.truncated:
            if report.recovery:
                r.flagged_recoveries += 1
            else:
                r.proactive_truncations += 1
        r.enqueued += report.enqueued
        clipped = [m for m in view.messages if _CLIPPED.search(m.text())]
        if clipped:
            r.clipped_turns += 1
            for m in clipped:
                self._clipped.add((m.tool_call_id or m.role, m.text()[:60]))
            r.clipped_messages = len(self._clipped)
        if not prepared:
            return
        now = time.monotonic()
        if self._due is not None:
            turn, since, version = self._due
            if report.version > version and report.summary_kind in ("llm", "offline"):
                r.lag_turns.append(number - turn)
                r.lag_seconds.append(now - since)
                self._due = None
        if self._due is None and (report.budget.should_compact or report.truncated):
            r.dues += 1
            self._due = (number, now, report.version)
