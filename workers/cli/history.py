"""``compaction history SESSION``: every kept summary, by watermark.

The current one is marked; ``compaction rewind SESSION WATERMARK`` makes an
earlier one current again (the raw log is never changed by compaction).
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime

from rich.console import Console
from rich.markup import escape

from shared.core.records import SummaryRecord
from workers.cli._common import add_json, add_session, open_store, session_state, store_errors
from workers.cli._format import clip, human
from workers.settings import Settings

FIRST_LINES = 2
LINE_CHARS = 90


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_session(parser)
    add_json(parser)


def first_lines(text: str, lines: int = FIRST_LINES, width: int = LINE_CHARS) -> str:
    """The first lines of a summary that say something (headings skipped), clipped."""
    kept = [line.strip() for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")][:lines]
    return "\n".join(line if len(line) <= width else line[: width - 1] + "…" for line in kept)


def run(args: argparse.Namespace, settings: Settings) -> int:
    with store_errors(settings.redis_url):
        store = open_store(settings, args.tenant)
        state, length = session_state(store, args.session)  # the log is not read
        records = store.summaries(args.session)
    current = state.watermark
    if args.json:
        print(json.dumps([{**r.model_dump(exclude={"ledger_json"}),
                           "current": r.watermark == current} for r in records], indent=2))
        return 0
    console = Console()
    if not records:
        console.print(f"[bold]{escape(args.session)}[/]: no summaries yet ({length} messages)")
        return 0
    console.print(f"[bold]summaries of {escape(args.session)}[/] (log: {length} messages, "
                  f"{len(records)} kept; [bold green]*[/] = current)")
    width = max(40, console.width)
    for record in records:
        console.print(_line(record, record.watermark == current), highlight=False)
        for line in first_lines(record.text, width=width - 6).splitlines():
            console.print(f"    [grey70]{escape(line)}[/]", highlight=False)
    return 0


def _line(record: SummaryRecord, current: bool) -> str:
    """One line per summary, at most ~75 columns (an 80-column terminal)."""
    created = datetime.fromtimestamp(record.created_at).strftime("%Y-%m-%d %H:%M")
    mark = "[bold green]*[/]" if current else " "
    model = f" · {escape(clip(record.model, 18))}" if record.model else ""
    return (f"{mark} [bold]{record.watermark:>6}[/] {record.kind:<10} {human(record.tokens):>6} "
            f"tokens · covers [{record.covers_from}, {record.watermark}) · {created}{model}")


__all__ = ["add_arguments", "first_lines", "run"]
