"""What a replay measured, per session and per run, and how it is printed.

The figures answer one question: does the guard keep every request of a
real agent session inside a window the provider enforces, and at what cost?

- *failed turns*: turns with no successful provider answer even after the
  guard's recovery (the goal is zero);
- *rejections*: the provider's HTTP 400 ``context_length_exceeded``
  answers; each one costs a round trip even when recovery then succeeds;
  those of views the guard had already truncated are counted apart (the
  truncation was sized wrong, not merely the estimate at the edge);
- *proactive truncations* (the guard cut the view before sending because
  it would not fit) and *reactive recoveries* (after a rejection) are
  counted apart: the first is the guard working as designed when workers
  lag, the second means the estimate was wrong;
- *summaries*: commits by kind (``llm``/``offline`` from the workers' job
  log, ``truncation`` written by the guard itself); of the worker summaries,
  how many lost their compare-and-swap to a guard truncation and were kept
  anyway (committed over it, or with the dropped range merged on);
- *tokens sent* (the provider's count of every accepted prompt) against
  the full history each turn would have sent without compaction;
- *worker lag*: turns (and seconds) between a compaction falling due (the
  guard's report said ``should_compact`` or it had to truncate) and a
  worker summary being in place.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, computed_field

from workers.harness.timing import percentile

MAX_FAILURES_KEPT = 5


class Distribution(BaseModel):
    """p50 / p99 / max of a list of samples."""

    model_config = ConfigDict(frozen=True)

    count: int
    p50: float
    p99: float
    max: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> Distribution:
        return cls(count=len(samples), p50=round(percentile(samples, 50), 3),
                   p99=round(percentile(samples, 99), 3),
                   max=round(max(samples), 3) if samples else 0.0)


class FailedTurn(BaseModel):
    """A turn that got no answer after recovery: where and why."""

    turn: int
    stage: str
    error: str


class SessionReport(BaseModel):
    """Everything measured on one session."""

    key: str
    source_id: str
    line: int
    messages: int
    turns: int = 0
    tools_source: str = "none"
    repairs: int = 0
    reused_tool_ids: int = 0
    failed_turns: int = 0
    failures: list[FailedTurn] = Field(default_factory=list)
    rejections: int = 0
    rejected_truncated: int = 0
    other_errors: int = 0
    proactive_truncations: int = 0
    flagged_recoveries: int = 0
    reactive_recoveries: int = 0
    recovered_turns: int = 0
    clipped_turns: int = 0
    clipped_messages: int = 0
    oversized_messages: int = 0
    replies_over_max_tokens: int = 0
    calls_without_input: int = 0
    dues: int = 0
    unresolved_dues: int = 0
    enqueued: int = 0
    summaries: dict[str, int] = Field(default_factory=dict)
    summaries_over_truncation: int = 0
    jobs: dict[str, int] = Field(default_factory=dict)
    tokens_sent: int = 0
    tokens_full: int = 0
    turns_over_window_without_compaction: int = 0
    max_prompt_ratio: float = 0.0
    max_request_ratio: float = 0.0
    elapsed_s: float = 0.0
    prepare_ms: list[float] = Field(default_factory=list, exclude=True)
    record_ms: list[float] = Field(default_factory=list, exclude=True)
    lag_turns: list[int] = Field(default_factory=list)
    lag_seconds: list[float] = Field(default_factory=list, exclude=True)

    def fail(self, turn: int, stage: str, error: BaseException | str) -> None:
        self.failed_turns += 1
        if len(self.failures) < MAX_FAILURES_KEPT:
            text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
            self.failures.append(FailedTurn(turn=turn, stage=stage, error=text[:500]))

    @computed_field  # type: ignore[prop-decorator]
    @property
    def prepare_latency_ms(self) -> Distribution:
        return Distribution.of(self.prepare_ms)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def worker_lag_seconds(self) -> Distribution:
        return Distribution.of(self.lag_seconds)


class SkippedReport(BaseModel):
    line: int
    source_id: str
    reason: str


def _merge(counters: Iterable[dict[str, int]]) -> dict[str, int]:
    total: Counter[str] = Counter()
    for item in counters:
        total.update(item)
    return dict(sorted(total.items()))


class RunReport(BaseModel):
    """One replay run: its set-up, every session, and the totals."""

    window: int
    max_tokens: int
    model: str
    source: str
    infrastructure: str
    counter: str
    summarizer: str
    options: dict[str, Any] = Field(default_factory=dict)
    sessions: list[SessionReport] = Field(default_factory=list)
    skipped: list[SkippedReport] = Field(default_factory=list)
    drained: bool = True
    elapsed_s: float = 0.0
    worker_logs: dict[str, str] = Field(default_factory=dict)

    def _sum(self, name: str) -> int:
        return sum(int(getattr(s, name)) for s in self.sessions)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def totals(self) -> dict[str, Any]:
        s = self.sessions
        sent, full = self._sum("tokens_sent"), self._sum("tokens_full")
        names = ("turns", "failed_turns", "rejections", "rejected_truncated", "other_errors",
                 "proactive_truncations",
                 "flagged_recoveries", "reactive_recoveries", "recovered_turns",
                 "clipped_turns", "clipped_messages", "oversized_messages",
                 "replies_over_max_tokens", "calls_without_input", "dues", "unresolved_dues",
                 "enqueued", "turns_over_window_without_compaction", "repairs", "reused_tool_ids",
                 "summaries_over_truncation")
        out: dict[str, Any] = {name: self._sum(name) for name in names}
        out.update(
            sessions=len(s), skipped=len(self.skipped),
            messages=self._sum("messages"),
            summaries=_merge(x.summaries for x in s), jobs=_merge(x.jobs for x in s),
            tokens_sent=sent, tokens_full=full,
            tokens_saved_ratio=round(1 - sent / full, 4) if full else 0.0,
            max_prompt_ratio=max((x.max_prompt_ratio for x in s), default=0.0),
            max_request_ratio=max((x.max_request_ratio for x in s), default=0.0),
            prepare_latency_ms=Distribution.of([v for x in s for v in x.prepare_ms]),
            record_latency_ms=Distribution.of([v for x in s for v in x.record_ms]),
            worker_lag_turns=Distribution.of([float(v) for x in s for v in x.lag_turns]),
            worker_lag_seconds=Distribution.of([v for x in s for v in x.lag_seconds]),
        )
        return out


def _lines(report: RunReport) -> list[tuple[str, str]]:
    t = report.totals
    summaries = t["summaries"]
    jobs = t["jobs"]
    lat, rec = t["prepare_latency_ms"], t["record_latency_ms"]
    lag, lag_s = t["worker_lag_turns"], t["worker_lag_seconds"]
    return [
        ("sessions replayed (skipped)", f"{t['sessions']} ({t['skipped']})"),
        ("turns (assistant replies)", f"{t['turns']}"),
        ("**failed turns (after recovery)**", f"**{t['failed_turns']}**"),
        ("provider rejections (400 context_length_exceeded)", f"{t['rejections']}"),
        ("of which views the guard had truncated", f"{t['rejected_truncated']}"),
        ("other provider errors", f"{t['other_errors']}"),
        ("proactive truncations (guard, before sending)", f"{t['proactive_truncations']}"),
        ("reactive recoveries (after a rejection) / retries answered",
         f"{t['reactive_recoveries']} / {t['recovered_turns']}"),
        ("recoveries flagged by usage (silent truncation suspected)",
         f"{t['flagged_recoveries']}"),
        ("summaries written: llm / offline / truncation",
         f"{summaries.get('llm', 0)} / {summaries.get('offline', 0)} / "
         f"{summaries.get('truncation', 0)}"),
        ("worker summaries that lost their swap to a truncation and replaced it",
         f"{t['summaries_over_truncation']}"),
        ("worker jobs by outcome", ", ".join(f"{k} {v}" for k, v in jobs.items()) or "none"),
        ("tokens sent (provider count) / without compaction",
         f"{t['tokens_sent']:,} / {t['tokens_full']:,} ({t['tokens_saved_ratio']:.1%} saved)"),
        ("turns whose full history would not fit the window",
         f"{t['turns_over_window_without_compaction']}"),
        ("highest prompt / window (provider count)", f"{t['max_prompt_ratio']:.3f}"),
        ("highest (prompt + max_tokens) / window", f"{t['max_request_ratio']:.3f}"),
        ("guard prepare p50 / p99 / max (ms)", f"{lat.p50:.2f} / {lat.p99:.2f} / {lat.max:.2f}"),
        ("guard record_turn p50 / p99 (ms)", f"{rec.p50:.2f} / {rec.p99:.2f}"),
        ("compactions due / never in place before the session ended",
         f"{t['dues']} / {t['unresolved_dues']}"),
        ("worker lag in turns p50 / p99 / max",
         f"{lag.p50:g} / {lag.p99:g} / {lag.max:g} (n={lag.count})"),
        ("worker lag in seconds p50 / p99 / max",
         f"{lag_s.p50:.2f} / {lag_s.p99:.2f} / {lag_s.max:.2f}"),
        ("recorded messages larger than the input budget alone", f"{t['oversized_messages']}"),
        ("turns sent with a clipped message / distinct messages clipped",
         f"{t['clipped_turns']} / {t['clipped_messages']}"),
        ("recorded replies longer than max_tokens (delivered whole)",
         f"{t['replies_over_max_tokens']}"),
        ("recorded replies with no input before them (recorded without a call)",
         f"{t['calls_without_input']}"),
    ]


def render_markdown(report: RunReport, *, per_session: bool = False) -> str:
    """The run as markdown: set-up, the figures table, failures, optionally every session."""
    t = report.totals
    out = [
        f"### Replay: window {report.window:,} tokens, {t['sessions']} sessions, "
        f"{t['turns']} turns",
        "",
        f"- source: `{report.source}`; model `{report.model}`, max_tokens {report.max_tokens}",
        f"- infrastructure: {report.infrastructure}",
        f"- provider token count: {report.counter}; summarizer: {report.summarizer}",
        f"- elapsed: {report.elapsed_s:.1f} s; workers drained at the end: "
        f"{'yes' if report.drained else 'no (timed out)'}",
        "",
        "| figure | value |",
        "|---|---|",
        *(f"| {name} | {value} |" for name, value in _lines(report)),
    ]
    failures = [(s.source_id, f) for s in report.sessions for f in s.failures]
    if failures:
        out += ["", "Failed turns:", ""]
        out += [f"- `{sid}` turn {f.turn} ({f.stage}): {f.error}" for sid, f in failures]
    if report.skipped:
        out += ["", "Skipped sessions:", ""]
        out += [f"- line {s.line} `{s.source_id}`: {s.reason}" for s in report.skipped]
    if per_session:
        out += ["", render_sessions(report.sessions)]
    return "\n".join(out) + "\n"


def render_sessions(sessions: Sequence[SessionReport]) -> str:
    """One row per session."""
    rows = ["| session | msgs | turns | failed | rejected | trunc. | recov. | summaries "
            "(llm/off/trunc) | sent / full tokens | max ratio | lag turns p50/max |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in sessions:
        lag = Distribution.of([float(v) for v in s.lag_turns])
        rows.append(
            f"| `{s.source_id[:48]}` | {s.messages} | {s.turns} | {s.failed_turns} | "
            f"{s.rejections} | {s.proactive_truncations} | {s.reactive_recoveries} | "
            f"{s.summaries.get('llm', 0)}/{s.summaries.get('offline', 0)}/"
            f"{s.summaries.get('truncation', 0)} | {s.tokens_sent:,} / {s.tokens_full:,} | "
            f"{s.max_prompt_ratio:.3f} | {lag.p50:g}/{lag.max:g} |")
    return "\n".join(rows)


_PROVIDER_COUNT = re.compile(r"\((\d+) in the messages")
CAUSES = ("worker late", "after a truncation", "new input", "first turn")


class TraceCauses(BaseModel):
    """Why the guard truncated, and what the rejected views were, from a ``--trace`` file.

    A truncation is classified by the turn before it: its view was at the
    trigger (a compaction was due and not in place yet: *worker late*), it
    was truncated too (truncation fills the budget, so the next turn's
    input overflows again until a summary lands: *after a truncation*), or
    it was below the trigger and this turn's input alone pushed the view
    over (*new input*: no worker could have prevented it).
    """

    truncations: dict[str, int] = Field(default_factory=dict)
    rejected_truncated: int = 0
    rejected_untruncated: int = 0
    excess: list[float] = Field(default_factory=list)
    """Per rejection: the provider's message count over the guard's estimate, minus 1."""
    usage_at_rejection: list[float] = Field(default_factory=list)
    """Per rejection: the usage ratio the guard reported for the view it sent."""


def trace_causes(rows: Iterable[Mapping[str, Any]], trigger_ratio: float) -> TraceCauses:
    """Classify the truncations and rejections of a trace (rows in session order)."""
    causes: Counter[str] = Counter()
    out = TraceCauses()
    previous: dict[str, Mapping[str, Any]] = {}
    for row in rows:
        session = str(row.get("session"))
        view = row.get("prepare") or {}
        before = previous.get(session)
        previous[session] = view
        if view.get("truncated"):
            if before is None:
                causes["first turn"] += 1
            elif before.get("truncated"):
                causes["after a truncation"] += 1
            elif float(before.get("usage_ratio", 0.0)) >= trigger_ratio:
                causes["worker late"] += 1
            else:
                causes["new input"] += 1
        rejected = row.get("rejected")
        if not isinstance(rejected, str):
            continue
        if view.get("truncated"):
            out.rejected_truncated += 1
        else:
            out.rejected_untruncated += 1
        found = _PROVIDER_COUNT.search(rejected)
        estimated = int(view.get("estimated") or 0)
        if found and estimated:
            out.excess.append(round(int(found.group(1)) / estimated - 1, 4))
        out.usage_at_rejection.append(float(view.get("usage_ratio", 0.0)))
    out.truncations = {name: causes[name] for name in CAUSES if causes[name]}
    return out


def render_causes(causes: TraceCauses) -> str:
    """Two markdown lines: truncations by cause, rejections by kind."""
    total = sum(causes.truncations.values())
    parts = ", ".join(f"{name} {n}" for name, n in causes.truncations.items()) or "none"
    line = f"- proactive truncations ({total}) by the turn before: {parts}"
    rejected = causes.rejected_truncated + causes.rejected_untruncated
    if not rejected:
        return f"{line}\n- rejections: none\n"
    excess = (f"; the provider counted {min(causes.excess):+.1%} to {max(causes.excess):+.1%} "
              "against the guard's estimate" if causes.excess else "")
    usage = (f", sent at {min(causes.usage_at_rejection):.1%}-"
             f"{max(causes.usage_at_rejection):.1%} of the input budget by that estimate")
    return (f"{line}\n- rejections ({rejected}): {causes.rejected_truncated} of truncated "
            f"views, {causes.rejected_untruncated} of untruncated views{usage}{excess}\n")


def render_comparison(reports: Sequence[RunReport]) -> str:
    """Several runs (e.g. one per window) side by side, one column each."""
    if not reports:
        return ""
    header = "| figure | " + " | ".join(f"{r.window:,}" for r in reports) + " |"
    rows = [header, "|---|" + "---|" * len(reports)]
    columns = [_lines(r) for r in reports]
    for i, (name, _) in enumerate(columns[0]):
        rows.append(f"| {name} | " + " | ".join(c[i][1] for c in columns) + " |")
    return "\n".join(rows) + "\n"


__all__ = [
    "CAUSES",
    "Distribution",
    "FailedTurn",
    "RunReport",
    "SessionReport",
    "SkippedReport",
    "TraceCauses",
    "percentile",
    "render_causes",
    "render_comparison",
    "render_markdown",
    "render_sessions",
    "trace_causes",
]
