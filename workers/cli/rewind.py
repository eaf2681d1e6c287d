"""``compaction rewind SESSION WATERMARK``: make an earlier summary current again.

Goes through the store's ``rewind`` script (it bumps the version, so any
compaction in flight loses its compare-and-swap). Watermark 0 means no
summary: the whole log is sent again (and compacted again when due).
"""

from __future__ import annotations

import argparse

from rich.console import Console

from workers.cli._common import add_session, load_session, open_store, store_errors
from workers.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_session(parser)
    parser.add_argument("watermark", type=int, metavar="WATERMARK",
                        help="watermark of a kept summary (see `compaction history`), 0 for none")


def run(args: argparse.Namespace, settings: Settings) -> int:
    with store_errors(settings.redis_url):
        store = open_store(settings, args.tenant)
        before = load_session(store, args.session).state
        state = store.rewind(args.session, args.watermark)
    what = (f"the summary at watermark {state.watermark} ({state.summary_kind}) is current"
            if state.watermark else "no summary is current: the whole log is in the view")
    Console().print(f"[cyan]{args.session}[/]: {what} (was watermark {before.watermark}, "
                    f"version {before.version} → {state.version})")
    return 0


__all__ = ["add_arguments", "run"]
