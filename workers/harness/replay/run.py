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
import secrets
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai

from shared.core.config import CompactionPolicy, StoreConfig
from shared.core.errors import CompactionError, InvalidInput
from shared.guard import ContextGuard
from shared.store.sessions import SessionStore
from workers.harness.fakes.counting import (
    DEFAULT_TOKENIZER_PATH,
    FramedCounter,
    char_counter,
    load_o200k,
)
from workers.harness.fakes.openai_server import FakeOpenAIServer
from workers.harness.fakes.summaries import SummarizerResponder
from workers.harness.replay.report import RunReport, SessionReport, SkippedReport
from workers.harness.replay.runner import (
    Progress,
    ReplayOptions,
    ReplayResponder,
    SessionRunner,
    Trace,
    _framed,
)
from workers.harness.replay.sessions import ReplaySession, load_sessions
from workers.harness.stack.services import Services, start_services
from workers.settings import Settings

TIKTOKEN_O200K_CACHE_NAME = "fb374d419588a4632f3f557e76b4b70aebbca790"


RETENTION = 100_000  # keep every summary of a replay, so they can be counted by kind


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
