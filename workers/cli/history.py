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
from rich.table import Table

from shared.core.records import SummaryRecord
from workers.cli._common import add_json, add_session, load_session, open_store, store_errors
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
        data = load_session(store, args.session)
        records = store.summaries(args.session)
    current = data.state.watermark
    if args.json:
        print(json.dumps([{**r.model_dump(exclude={"ledger_json"}),
                           "current": r.watermark == current} for r in records], indent=2))
        return 0
    console = Console()
    if not records:
        console.print(f"[bold]{args.session}[/]: no summaries yet ({data.length} messages)")
        return 0
    table = Table(title=f"summaries of {args.session} (log: {data.length} messages)",
                  title_justify="left")
    for column in ("", "watermark", "kind", "tokens", "covers", "created", "model", "begins"):
        table.add_column(column, no_wrap=column != "begins")
    for record in records:
        table.add_row(*_row(record, record.watermark == current))
    console.print(table)
    return 0


def _row(record: SummaryRecord, current: bool) -> list[str]:
    created = datetime.fromtimestamp(record.created_at).strftime("%Y-%m-%d %H:%M:%S")
    return ["[bold green]*[/]" if current else "", str(record.watermark), record.kind,
            str(record.tokens), f"[{record.covers_from}, {record.watermark})", created,
            escape(record.model or "-"), escape(first_lines(record.text))]


__all__ = ["add_arguments", "first_lines", "run"]
