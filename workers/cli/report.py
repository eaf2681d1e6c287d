"""``compaction report SESSION -o report.html``: a session's life on one self-contained page.

Drawn only from what the store keeps, no extra bookkeeping: the log (turn
boundaries), the running token totals parallel to it, every summary by
watermark (kind, tokens, the version it replaced, summarizer usage) and the
state (window, output reserve, system and tool tokens, learned limits,
silent-truncation flags, the last provider usage report).

What is exact and what is reconstructed:

- the log's growth (messages, tokens) per turn is exact;
- compactions are placed in commit order (each record names the version it
  replaced); the turn each took effect is not stored, so it is placed where
  it became due: a truncation where the view no longer fit the input
  budget, a summary where the view reached the trigger ratio, never before
  the turn that completed the messages it covers;
- tokens sent per turn are the estimate of that view (fixed parts +
  summary + history since its watermark, the estimator's units, before
  cheap-stage placeholders); tokens saved are the whole log's tokens minus
  that, summed over turns.

The page has no script and loads nothing: inline SVG and CSS only.
"""

from __future__ import annotations

import argparse
import html
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from shared.core.errors import CompactionError, InvalidInput
from shared.core.limits import model_limits, output_reserve
from shared.core.records import SessionState, SummaryRecord
from shared.core.turns import turn_starts
from shared.store.sessions import SessionStore, redis_errors
from workers.cli._common import add_session, human, load_session, open_store, store_errors
from workers.settings import Settings

COLOURS = {"llm": "#7b3fbf", "offline": "#2f8f6f", "truncation": "#d9480f",
           "sent": "#1c6dd0", "log": "#9aa4b1", "window": "#c92a2a", "budget": "#e8590c",
           "trigger": "#f08c00", "watermark": "#7b3fbf"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_session(parser)
    parser.add_argument("-o", "--output", type=Path, default=None,
                        help="HTML file to write (default: report-SESSION.html)")


@dataclass(frozen=True, slots=True)
class Compaction:
    """One stored summary, placed on the turn axis."""

    record: SummaryRecord
    turn: int
    before: int
    after: int


@dataclass(slots=True)
class SessionReport:
    """Everything the page shows, per turn and per compaction."""

    session_id: str
    tenant: str
    model: str
    window: int
    reserve: int
    fixed: int
    trigger_ratio: float
    state: SessionState
    messages: list[int] = field(default_factory=list)
    """Log length at the end of each turn."""
    log_tokens: list[int] = field(default_factory=list)
    """Fixed parts + the whole log at the end of each turn (no compaction)."""
    sent: list[int] = field(default_factory=list)
    watermarks: list[int] = field(default_factory=list)
    compactions: list[Compaction] = field(default_factory=list)
    cheap_placeholders: int = 0
    cheap_saved: int = 0
    """Cheap-stage decisions kept now (those below the watermark are dropped at commit)."""
    unrecorded_versions: list[int] = field(default_factory=list)
    """Versions no kept summary replaced: an edit, a rewind, or a record overwritten
    by a later summary at the same watermark (or dropped by retention)."""

    @property
    def budget(self) -> int:
        return max(1, self.window - self.reserve)

    @property
    def saved(self) -> int:
        return sum(max(0, a - b) for a, b in zip(self.log_tokens, self.sent, strict=True))

    @property
    def over_window_without(self) -> int:
        return sum(1 for t in self.log_tokens if t > self.budget)


def collect(store: SessionStore, session_id: str, *, trigger_ratio: float = 0.8) -> SessionReport:
    """Read the session once and reconstruct its turns (see the module docstring)."""
    data = load_session(store, session_id)
    state = data.state
    log = store.messages(session_id)
    keys = store.keys(session_id)
    with redis_errors("read cum"):
        cum = [int(v) for v in store.redis.lrange(keys.cum, 0, -1)]
    records = sorted(store.summaries(session_id), key=lambda r: (r.source_version, r.watermark))
    model = state.model or "gpt-4o"
    learned = state.stored_learned() if model == state.model else 0
    limits = model_limits(model, learned={model: learned} if learned else None)
    window = state.window or limits.context_window
    reserve = state.max_tokens or output_reserve(limits, None)
    report = SessionReport(session_id=session_id, tenant=store.tenant, model=model,
                           window=window, reserve=reserve,
                           fixed=state.system_tokens + state.tool_tokens,
                           trigger_ratio=trigger_ratio, state=state)
    starts = turn_starts(log) or [0]
    ends = [*starts[1:], len(log)] if log else []
    ends = [e for e in ends if e > 0]

    def tokens(end: int, start: int = 0) -> int:
        if end <= start or not cum:
            return 0
        return cum[min(end, len(cum)) - 1] - (cum[start - 1] if start > 0 else 0)

    def view(end: int, summary: SummaryRecord | None) -> int:
        w = summary.watermark if summary else 0
        return report.fixed + (summary.tokens if summary else 0) + tokens(end, w)

    current: SummaryRecord | None = None
    pending = list(records)
    for turn, end in enumerate(ends):
        before = view(end, current)
        # Every commit that became due by this turn takes effect here, in commit order.
        while pending and _due(pending[0], end, before, report):
            record = pending.pop(0)
            after = view(end, record)
            report.compactions.append(Compaction(record, turn, before, after))
            current, before = record, after
        report.messages.append(end)
        report.log_tokens.append(report.fixed + tokens(end))
        report.sent.append(view(end, current))
        report.watermarks.append(current.watermark if current else 0)
    for record in pending:  # covers messages past the last turn's end: a rewind or an edit
        report.compactions.append(Compaction(record, max(0, len(ends) - 1), 0, 0))
    report.cheap_placeholders = len(data.cheap)
    report.cheap_saved = sum(d.saved_tokens for d in data.cheap.values())
    kept = {r.source_version for r in records}
    report.unrecorded_versions = [v for v in range(state.version) if v not in kept]
    return report


def _due(record: SummaryRecord, end: int, view_tokens: int, report: SessionReport) -> bool:
    if end < record.watermark:
        return False
    if record.kind == "truncation":
        return view_tokens > report.budget * 0.95 or end > record.watermark
    return view_tokens >= report.budget * report.trigger_ratio


# -- drawing ---------------------------------------------------------------------------
W, H, LEFT, RIGHT, TOP, BOTTOM = 960, 360, 64, 16, 20, 36


def _scale(value: float, top: float, height: float) -> float:
    return TOP + (height - TOP - BOTTOM) * (1 - value / top) if top else height - BOTTOM


def _x(turn: int, turns: int) -> float:
    return LEFT + (W - LEFT - RIGHT) * (turn / max(1, turns - 1))


def _polyline(values: list[int], top: float, height: float, colour: str, width: float = 2,
              dash: str = "") -> str:
    points = " ".join(f"{_x(i, len(values)):.1f},{_scale(v, top, height):.1f}"
                      for i, v in enumerate(values))
    extra = f' stroke-dasharray="{dash}"' if dash else ""
    return (f'<polyline fill="none" stroke="{colour}" stroke-width="{width}"{extra} '
            f'points="{points}"/>')


def _axes(top: float, height: float, turns: int, unit: str) -> list[str]:
    parts = [f'<line x1="{LEFT}" y1="{height - BOTTOM}" x2="{W - RIGHT}" '
             f'y2="{height - BOTTOM}" stroke="#333"/>',
             f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{height - BOTTOM}" stroke="#333"/>']
    for i in range(5):
        value = top * i / 4
        y = _scale(value, top, height)
        parts.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{W - RIGHT}" y2="{y:.1f}" '
                     f'stroke="#e9ecef"/><text x="{LEFT - 6}" y="{y + 4:.1f}" '
                     f'text-anchor="end">{human(value)}</text>')
    step = max(1, turns // 10)
    for t in range(0, turns, step):
        parts.append(f'<text x="{_x(t, turns):.1f}" y="{height - BOTTOM + 16}" '
                     f'text-anchor="middle">{t + 1}</text>')
    parts.append(f'<text x="{(W + LEFT) / 2}" y="{height - 4}" text-anchor="middle">turn</text>'
                 f'<text x="14" y="{TOP + (height - TOP - BOTTOM) / 2}" text-anchor="middle" '
                 f'transform="rotate(-90 14 {TOP + (height - TOP - BOTTOM) / 2})">{unit}</text>')
    return parts


def _hline(value: float, top: float, height: float, colour: str, label: str,
           slot: int) -> str:
    """A dashed level across the chart, labelled at the left (``slot``: label column)."""
    y = _scale(value, top, height)
    x = LEFT + 6 + slot * 230
    return (f'<line x1="{LEFT}" y1="{y:.1f}" x2="{W - RIGHT}" y2="{y:.1f}" stroke="{colour}" '
            f'stroke-dasharray="6 4"/><text x="{x}" y="{y - 4:.1f}" '
            f'fill="{colour}">{html.escape(label)}</text>')


def tokens_chart(r: SessionReport) -> str:
    turns = len(r.sent)
    # The scale is the window's, not the log's (which may be 100x larger): the log's line
    # is clipped at the top and its last value written there.
    top = max([r.window * 1.5, *(t * 1.1 for t in r.sent), 1])
    parts = _axes(top, H, turns, "tokens")
    parts += [_hline(r.window, top, H, COLOURS["window"], f"window {human(r.window)}", 0),
              _hline(r.budget, top, H, COLOURS["budget"],
                     f"input budget {human(r.budget)} (window - reserve)", 1),
              _hline(r.budget * r.trigger_ratio, top, H, COLOURS["trigger"],
                     f"trigger {r.trigger_ratio:.0%} of the budget", 2)]
    if r.log_tokens and r.log_tokens[-1] > top:
        parts.append(f'<text x="{W - RIGHT - 4}" y="{TOP + 12}" text-anchor="end" '
                     f'fill="#6c757d">whole log: {human(r.log_tokens[-1])} tokens at the end '
                     f"(off the scale)</text>")
    for c in r.compactions:
        x = _x(c.turn, turns)
        colour = COLOURS.get(c.record.kind, "#555")
        parts.append(f'<g class="compaction"><title>{html.escape(_describe(c))}</title>'
                     f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{H - BOTTOM}" '
                     f'stroke="{colour}" stroke-opacity="0.45"/>'
                     f'<circle cx="{x:.1f}" cy="{_scale(c.after, top, H):.1f}" r="4" '
                     f'fill="{colour}"/></g>')
    parts.append(_polyline([min(t, int(top)) for t in r.log_tokens], top, H, COLOURS["log"],
                           2, "4 3"))
    parts.append(_polyline(r.sent, top, H, COLOURS["sent"], 2.5))
    return _svg(parts, H, "tokens sent against the window per turn")


def growth_chart(r: SessionReport) -> str:
    height = 240
    turns = len(r.messages)
    top = max([*r.messages, 1]) * 1.05
    parts = _axes(top, height, turns, "messages")
    parts.append(_polyline(r.messages, top, height, COLOURS["log"], 2.5))
    parts.append(_polyline(r.watermarks, top, height, COLOURS["watermark"], 2))
    return _svg(parts, height, "log length and watermark per turn")


def _svg(parts: list[str], height: int, label: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {height}" '
            f'width="{W}" height="{height}" role="img" aria-label="{html.escape(label)}" '
            f'font-family="system-ui, sans-serif" font-size="11">{"".join(parts)}</svg>')


def _describe(c: Compaction) -> str:
    r = c.record
    return (f"{r.kind} at turn {c.turn + 1}: watermark {r.watermark} (covers "
            f"[{r.covers_from}, {r.watermark})), view {c.before} → {c.after} tokens")


def _when(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S")


def render(r: SessionReport) -> str:
    """The whole page (HTML with inline CSS and SVG, no script, no external resource)."""
    kinds = {k: sum(1 for c in r.compactions if c.record.kind == k)
             for k in ("llm", "offline", "truncation")}
    total_log = sum(r.log_tokens)
    saved_share = r.saved / total_log if total_log else 0.0
    over_with = sum(1 for t in r.sent if t > r.budget)
    state = r.state
    tiles = [
        ("turns", f"{len(r.sent)}"),
        ("messages in the log", f"{r.messages[-1] if r.messages else 0}"),
        ("window", f"{human(r.window)} ({html.escape(r.model)})"),
        ("tokens saved", f"{human(r.saved)} ({saved_share:.0%})"),
        ("compactions", " · ".join(f"{k} {n}" for k, n in kinds.items())),
        ("turns over the input budget",
         f"{r.over_window_without} without compaction · {over_with} reconstructed with"),
        ("recoveries", _recoveries(state)),
        ("silent truncations suspected", f"{state.silent_truncation_flags}"),
        ("cheap-stage placeholders now",
         f"{r.cheap_placeholders} ({human(r.cheap_saved)} tokens)"),
        ("summarizer tokens in / out", f"{human(sum(c.record.input_tokens for c in r.compactions))}"
         f" / {human(sum(c.record.output_tokens for c in r.compactions))}"),
    ]
    rows = "".join(
        f"<tr><td><span class='dot' style='background:{COLOURS.get(c.record.kind, '#555')}'>"
        f"</span>{c.record.kind}</td><td>{c.turn + 1}</td><td>{c.record.watermark}</td>"
        f"<td>[{c.record.covers_from}, {c.record.watermark})</td><td>{human(c.before)} → "
        f"{human(c.after)}</td><td>{c.record.tokens}</td><td>"
        f"{html.escape(c.record.model or '-')}</td><td>{human(c.record.input_tokens)} / "
        f"{human(c.record.output_tokens)}</td><td>{html.escape(', '.join(c.record.stages))}"
        f"</td><td>{_when(c.record.created_at)}</td></tr>" for c in r.compactions)
    legend = "".join(f"<span><span class='dot' style='background:{COLOURS[k]}'></span>{label}"
                     f"</span>" for k, label in (
                         ("sent", "tokens sent (reconstructed view)"),
                         ("log", "whole log (no compaction)"), ("llm", "LLM summary"),
                         ("offline", "offline summary"), ("truncation", "truncation")))
    tile_html = "".join(f"<div class='tile'><div class='k'>{k}</div><div class='v'>{v}</div>"
                        f"</div>" for k, v in tiles)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>compaction report: {html.escape(r.session_id)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 24px; color: #212529; max-width: 1000px; }}
h1 {{ font-size: 20px; margin: 0 0 4px; }} h2 {{ font-size: 15px; margin: 28px 0 8px; }}
.sub {{ color: #6c757d; font-size: 12px; }}
.tiles {{ display: grid; grid-template-columns: repeat(5, 1fr); gap: 8px; margin: 16px 0; }}
.tile {{ border: 1px solid #dee2e6; border-radius: 6px; padding: 8px 10px; }}
.k {{ color: #6c757d; font-size: 11px; }} .v {{ font-size: 15px; font-weight: 600; }}
.legend span {{ margin-right: 14px; font-size: 12px; }}
.dot {{ display: inline-block; width: 10px; height: 10px; border-radius: 50%;
        margin-right: 4px; vertical-align: middle; }}
table {{ border-collapse: collapse; font-size: 12px; width: 100%; }}
td, th {{ border-bottom: 1px solid #e9ecef; padding: 4px 6px; text-align: left; }}
</style></head><body>
<h1>Session {html.escape(r.session_id)}</h1>
<div class="sub">tenant {html.escape(r.tenant)} · reserve {human(r.reserve)} · system + tools
{human(r.fixed)} · calibration x{state.calibration_ratio:.3f} ({state.calibration_samples}
samples){_anchor(state)} · written {_when(datetime.now(UTC).timestamp())} UTC</div>
<div class="tiles">{tile_html}</div>
<h2>Tokens sent against the window, per turn</h2>
<div class="legend">{legend}</div>
{tokens_chart(r)}
<h2>The log's growth and the watermark</h2>
<div class="legend"><span><span class="dot" style="background:{COLOURS['log']}"></span>messages
in the log (append-only)</span><span><span class="dot" style="background:{COLOURS['watermark']}">
</span>watermark (messages covered by the summary in effect)</span></div>
{growth_chart(r)}
<h2>Compactions ({len(r.compactions)})</h2>
<table><tr><th>kind</th><th>turn</th><th>watermark</th><th>covers</th><th>view before →
after</th><th>summary tokens</th><th>model</th><th>summarizer in / out</th><th>stages</th>
<th>committed (UTC)</th></tr>{rows}</table>
{_gaps(r)}
<p class="sub">Drawn from the store alone: the log and its running token totals are exact;
each compaction is placed at the turn where it became due (the store keeps when it was
committed, not at which turn); token figures are the project's estimator's, before
cheap-stage placeholders.</p>
</body></html>
"""


def _gaps(r: SessionReport) -> str:
    if not r.unrecorded_versions:
        return ""
    versions = ", ".join(map(str, r.unrecorded_versions[:20]))
    more = " ..." if len(r.unrecorded_versions) > 20 else ""
    return (f'<p class="sub">Versions with no kept record: {versions}{more} (a history edit, '
            f"a rewind, or a summary overwritten by a later one at the same watermark or "
            f"dropped by retention).</p>")


def _recoveries(state: SessionState) -> str:
    if state.last_overflow_at is None:
        return "none"
    owner = state.learned_model or state.model
    learned = (f", learned window {human(state.learned_window)} ({owner})"
               if state.learned_window else "")
    return f"last overflow {_when(state.last_overflow_at)}{learned}"


def _anchor(state: SessionState) -> str:
    anchor = state.anchor()
    if anchor is None:
        return ""
    return (f" · last provider report {human(anchor.reported)} prompt tokens for "
            f"{human(anchor.estimated)} estimated")


def check_writable(path: Path, option: str = "--output") -> None:
    """Refuse a path the page cannot be written to, naming ``option``: before the work
    that fills it (the demo runs for minutes), not after."""
    if path.is_dir():
        raise InvalidInput(f"{path} is a directory, not a file", field=option)
    if not path.parent.is_dir():
        raise InvalidInput(f"cannot write {path}: no directory {path.parent}", field=option)
    if not os.access(path if path.exists() else path.parent, os.W_OK):
        raise InvalidInput(f"cannot write {path}: permission denied", field=option)


def write_report(store: SessionStore, session_id: str, path: Path, *,
                 trigger_ratio: float = 0.8, option: str = "--output") -> Path:
    """Write the page for ``session_id`` to ``path``; returns the path.

    A path that cannot be written is :class:`InvalidInput` naming ``option``
    (a bad argument); any other write failure (a full disk) a CompactionError.
    """
    page = render(collect(store, session_id, trigger_ratio=trigger_ratio))
    try:
        path.write_text(page, encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError,
            PermissionError) as exc:
        raise InvalidInput(f"cannot write {path}: {exc.strerror or exc}", field=option) from None
    except OSError as exc:
        raise CompactionError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path


def run(args: argparse.Namespace, settings: Settings) -> int:
    output: Path = args.output or Path(f"report-{args.session}.html")
    check_writable(output)
    with store_errors(settings.redis_url):
        store = open_store(settings, args.tenant)
        write_report(store, args.session, output, trigger_ratio=settings.trigger_ratio)
    print(f"wrote {output}")
    return 0


__all__ = ["SessionReport", "add_arguments", "check_writable", "collect", "render", "run",
           "write_report"]
