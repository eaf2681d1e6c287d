"""``compaction stats SESSION``: the context meter of a session and its figures.

Read-only: the figures come from one atomic read of the session and the
request figures the agent's guard recorded at its last call (model, window,
system and tool tokens, output reserve).
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime

from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from workers.cli._common import (
    Meter,
    add_json,
    add_session,
    guard_for,
    load_session,
    open_store,
    render_meter,
    store_errors,
    window_source,
)
from workers.cli._format import human, pct, terminal_width
from workers.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_session(parser)
    add_json(parser)


def run(args: argparse.Namespace, settings: Settings) -> int:
    with store_errors(settings.redis_url):
        store = open_store(settings, args.tenant)
        data = load_session(store, args.session)
        guard = guard_for(store, settings, data)
        figures = guard.stats(args.session)
        limits = guard.model_limits(data.state.model or "gpt-4o", data.state)
    figures["limits_detail"] = limits.detail
    if args.json:
        print(json.dumps(figures, indent=2, default=str))
        return 0
    regions = figures["regions"]
    meter = Meter(window=figures["window"], reserve=figures["reserve"], regions=regions,
                  usage_ratio=figures["usage_ratio"], trigger_ratio=settings.trigger_ratio)
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    summaries = figures["summaries"]
    current = next((s for s in summaries if s["watermark"] == figures["watermark"]), None)
    verdict = ("[red]over the input budget: the next call truncates[/]"
               if not figures["within_budget"] else
               "[dark_orange]compaction due[/]" if figures["should_compact"] else "[green]ok[/]")
    rows = [
        ("messages", f"{figures['length']} in the log, {figures['length'] - figures['watermark']} "
                     "since the watermark"),
        ("watermark", f"{figures['watermark']} (version {figures['version']})"),
        ("summary", (f"{current['kind']}, {human(current['tokens'])} tokens, "
                     f"{_when(current['created_at'])}") if current else "none"),
        ("summaries kept", str(len(summaries))),
        ("model", f"{escape(figures['model'] or '? (no call recorded: gpt-4o assumed)')}, "
                  f"reserve {human(figures['reserve'])}"),
        ("window", f"{human(figures['window'])} ({window_source(figures['limits_source'])})"),
        ("estimated prompt", f"{human(figures['estimated_prompt_tokens'])} tokens — {verdict}"),
        ("placeholders", str(figures["cheap_decisions"])),
        ("pending job", "yes" if figures["pending_job"] else "no"),
        ("calibration", f"x{figures['calibration_ratio']:.3f} from "
                        f"{figures['calibration_samples']} reported usages"
                        + ("" if figures["calibration_samples"] else " (the model's prior)")),
        ("usage", f"{pct(figures['usage_ratio'])} of the input budget"),
    ]
    if figures["silent_truncation_flags"]:
        rows.append(("silent truncations", f"[red]{figures['silent_truncation_flags']}[/]"))
    if figures.get("requests_failed"):
        rows.append(("failed compaction requests",
                     f"[red]{figures['requests_failed']}[/] (last: "
                     f"{escape(str(figures['last_request_failure']))})"))
    for name, value in rows:
        table.add_row(name, value)
    title = f"session [cyan]{escape(args.session)}[/] (tenant {figures['tenant']})"
    console = Console(width=min(terminal_width(), 100))
    meter_view = render_meter(meter, columns=console.width - 4)  # inside the panel's borders
    console.print(Panel(Group(meter_view, "", table), title=title, title_align="left"))
    return 0


def _when(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S")


__all__ = ["add_arguments", "run"]
