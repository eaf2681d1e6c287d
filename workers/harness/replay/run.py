"""Replay recorded agent sessions against a provider that enforces the window.

The end-to-end proof of the project: real sessions, a small window, the
guard on the hot path, real Celery workers summarizing in the background,
and a fake OpenAI-compatible provider that counts prompt tokens with o200k
and rejects any request over its window with OpenAI's own error.

The agent loop is what an integrator writes with the ``openai`` SDK, one
recorded assistant message per turn::

    view = guard.prepare(session, system, tools, max_tokens, model, pending=new_messages)
    try:
        response = client.chat.completions.create(messages=view.openai(), ...)
    except openai.BadRequestError as exc:        # context_length_exceeded
        retry = guard.recover(session, exc, ..., pending=new_messages)
        response = client.chat.completions.create(messages=retry.openai(), ...)
    guard.record_turn(session, [*new_messages, reply], usage=response.usage)

The provider answers each call with the next recorded assistant message of
that session (requests carry the session as ``prompt_cache_key``), so the
conversation follows the real transcript whatever the guard sent. Workers
are never waited for during a session; their lag is measured instead.
Summarization requests go to a second fake (the summarizer is another
model with its own, larger window) that answers with
:class:`~workers.harness.fakes.summaries.SummarizerResponder`.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import openai

from shared.core.config import CompactionPolicy, StoreConfig
from shared.core.errors import CompactionError, InvalidInput
from shared.core.messages import Message
from shared.core.wire import from_openai, to_openai
from shared.guard import ContextGuard, PreparedView
from shared.store.sessions import SessionStore
from workers.harness.fakes.behaviour import Reply, Script, generated_text, normalize_reply
from workers.harness.fakes.counting import (
    DEFAULT_TOKENIZER_PATH,
    REPLY_PRIMING,
    FramedCounter,
    char_counter,
    completion_tokens,
    load_o200k,
)
from workers.harness.fakes.openai_server import FakeOpenAIServer
from workers.harness.fakes.summaries import SummarizerResponder
from workers.harness.replay.report import RunReport, SessionReport, SkippedReport
from workers.harness.replay.sessions import ReplaySession, Turn, load_sessions
from workers.harness.stack.services import Services, start_services
from workers.settings import Settings

TIKTOKEN_O200K_CACHE_NAME = "fb374d419588a4632f3f557e76b4b70aebbca790"
_CLIPPED = re.compile(r"\[\.\.\. \d+ characters removed by emergency truncation \.\.\.\]")
RETENTION = 100_000  # keep every summary of a replay, so they can be counted by kind
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


def resolve_counter(tokenizer: str | None = None,
                    cache_dirs: Sequence[str | Path] = ()) -> tuple[FramedCounter, str]:
    """The provider's prompt counter and how it was obtained.

    o200k from ``tokenizer`` (a ``.tiktoken`` file; an error if unusable),
    else from ``../shared/data/tokenizers`` beside the project, else from a
    tiktoken cache directory in ``cache_dirs``, else chars/4 (said loudly:
    the figures are then estimates).
    """
    if tokenizer is not None:
        try:
            encoding = load_o200k(str(Path(tokenizer).resolve()))
        except (ImportError, OSError, ValueError) as exc:
            raise InvalidInput(f"not a usable o200k_base.tiktoken file: {exc}",
                               field="tokenizer") from None
        return _framed(encoding, "o200k"), f"o200k ({tokenizer})"
    candidates = [DEFAULT_TOKENIZER_PATH] + [Path(d) / TIKTOKEN_O200K_CACHE_NAME
                                             for d in cache_dirs]
    for path in candidates:
        if path.is_file():
            with contextlib.suppress(ImportError, OSError, ValueError):
                return _framed(load_o200k(str(path)), "o200k"), f"o200k ({path})"
    return char_counter(), "chars/4 (no o200k rank file found: figures are estimates)"


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


# -- a whole run --------------------------------------------------------------------------
def _drain(services: Services, store: SessionStore, keys: Sequence[str], timeout: float) -> bool:
    """Wait until no job is queued, pending or running for these sessions."""
    deadline = time.monotonic() + timeout
    quiet = 0
    while time.monotonic() < deadline:
        busy = services.queued_jobs() > 0 or any(
            store.is_pending(k) or store.redis.exists(store.keys(k).lease) for k in keys)
        quiet = 0 if busy else quiet + 1
        if quiet >= 3:
            return True
        time.sleep(0.2)
    return False


def _settle(reports: Sequence[SessionReport], services: Services, store: SessionStore) -> None:
    """Worker jobs and summaries by kind, per session, from the job log and the store."""
    by_session: dict[str, list[dict[str, Any]]] = {}
    for job in services.job_outcomes():
        by_session.setdefault(str(job.get("session_id")), []).append(job)
    for report in reports:
        jobs = by_session.get(report.key, [])
        report.jobs = dict(Counter(str(j.get("status")) for j in jobs))
        compacted = [j for j in jobs if j.get("status") == "compacted"]
        kinds = Counter(str(j.get("summary_kind")) for j in compacted)
        report.summaries_over_truncation = sum(1 for j in compacted if j.get("over_truncation"))
        commits = store.state(report.key).version  # every commit bumps it; replays edit nothing
        truncations = commits - sum(kinds.values())
        report.summaries = {**dict(kinds), "truncation": max(0, truncations)}


def replay_sessions(sessions: Sequence[ReplaySession], options: ReplayOptions, *,
                    services: Services, counter: FramedCounter, policy: CompactionPolicy,
                    store_config: StoreConfig, tenant: str, progress: Progress | None = None,
                    trace: Trace | None = None) -> tuple[list[SessionReport], bool]:
    """Replay ``sessions`` on running services; returns the reports and whether workers drained."""
    store = SessionStore(services.store_client, store_config, tenant=tenant)
    responder = ReplayResponder(counter)
    overrides = None if options.learn_window else {options.model: options.window}
    with FakeOpenAIServer(window=options.window, responder=responder, counter=counter,
                          latency=options.latency, model=options.model) as agent:
        client = openai.OpenAI(base_url=agent.base_url, api_key="replay", max_retries=0,
                               timeout=120)

        def one(session: ReplaySession) -> SessionReport:
            responder.add(session.key, session.turns())
            guard = ContextGuard(store, services.enqueuer, policy=policy, overrides=overrides)
            try:
                report = SessionRunner(session, guard, client, responder, counter,
                                       options, trace).run()
            finally:
                responder.discard(session.key)
                agent.reset()  # the request log is not needed; keep memory flat
            if progress is not None:
                progress(report)
            return report

        with ThreadPoolExecutor(max_workers=options.parallel) as pool:
            reports = list(pool.map(one, sessions))
        client.close()
    keys = [s.key for s in sessions]
    drained = _drain(services, store, keys, options.drain_timeout)
    _settle(reports, services, store)
    if not options.keep_data:
        for key in keys:
            with contextlib.suppress(CompactionError):
                store.delete_session(key)
    return reports, drained


@contextlib.contextmanager
def _summarizer(options: ReplayOptions, counter: FramedCounter) -> Iterator[dict[str, str]]:
    """The summarizer fake (if any) and the worker settings that point at it."""
    base = {"COMPACTION_SUMMARY_RETENTION": str(RETENTION)}
    if options.summarizer == "offline":
        yield {**base, "COMPACTION_SUMMARIZER": "offline"}
        return
    with FakeOpenAIServer(window=options.summarizer_window, responder=SummarizerResponder(),
                          counter=counter, latency=options.summarizer_latency,
                          model="gpt-4o-mini") as fake:
        yield {**base, "COMPACTION_SUMMARIZER": "openai",
               "COMPACTION_SUMMARIZER_BASE_URL": fake.base_url,
               "COMPACTION_SUMMARIZER_API_KEY": "replay",
               "COMPACTION_SUMMARIZER_MODEL": "gpt-4o-mini"}


def run_replay(source: str | Path, options: ReplayOptions, settings: Settings, *,
               base_env: Mapping[str, str], configured: bool = False,
               counter: tuple[FramedCounter, str] | None = None,
               limit: int | None = None, max_messages: int | None = None,
               redis_server: str | None = None, force_in_process: bool = False,
               select: Sequence[str] = (), progress: Progress | None = None,
               trace: Trace | None = None) -> RunReport:
    """Load ``source``, start fakes, Redis and workers, replay, and report.

    ``configured``: use ``settings.redis_url``/``broker_url`` (the operator
    set them) instead of an embedded Redis. Raises InvalidInput when the
    file has no usable session.
    """
    started = time.monotonic()
    loaded = load_sessions(source, limit=limit, max_messages=max_messages, select=select)
    skipped = [SkippedReport(line=s.line, source_id=s.source_id, reason=s.reason)
               for s in loaded.skipped]
    if not loaded.sessions:
        reasons = "; ".join(f"line {s.line}: {s.reason}" for s in loaded.skipped[:3])
        raise InvalidInput(f"no usable session in {source} ({reasons or 'empty file'})",
                           field="sessions")
    framed, counter_name = counter or resolve_counter()
    tenant = f"replay-{secrets.token_hex(4)}"
    policy = settings.policy()
    store_config = settings.store_config().model_copy(update={"summary_retention": RETENTION})
    with _summarizer(options, framed) as overrides, start_services(
            settings, base_env=base_env, overrides=overrides, workers=options.workers,
            concurrency=options.concurrency, configured=configured,
            redis_server=redis_server, force_in_process=force_in_process) as services:
        reports, drained = replay_sessions(
            loaded.sessions, options, services=services, counter=framed, policy=policy,
            store_config=store_config, tenant=tenant, progress=progress, trace=trace)
        logs = services.worker_logs()
        infrastructure = services.description
    summarizer = ("offline summarizer in the workers" if options.summarizer == "offline" else
                  f"fake gpt-4o-mini (SummarizerResponder, {options.summarizer_window:,}-token "
                  "window) over HTTP")
    return RunReport(
        window=options.window, max_tokens=options.max_tokens, model=options.model,
        source=str(source), infrastructure=infrastructure, counter=counter_name,
        summarizer=summarizer, options={
            "parallel": options.parallel, "workers": options.workers,
            "concurrency": options.concurrency, "latency": options.latency,
            "learn_window": options.learn_window, "sessions": limit,
            "max_messages": max_messages, "trigger_ratio": policy.trigger_ratio,
            "target_ratio": policy.target_ratio, "tenant": tenant},
        sessions=reports, skipped=skipped, drained=drained,
        elapsed_s=round(time.monotonic() - started, 2), worker_logs=logs)


__all__ = [
    "ReplayOptions",
    "ReplayResponder",
    "SessionRunner",
    "replay_sessions",
    "resolve_counter",
    "run_replay",
]
