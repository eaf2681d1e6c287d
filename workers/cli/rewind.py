"""``compaction rewind SESSION WATERMARK``: make an earlier summary current again.

Goes through the store's ``rewind`` script (one atomic step: it bumps the
version, so any compaction in flight loses its compare-and-swap, and clears
the cheap-stage placeholders). Watermark 0 means no summary: the whole log is
sent again (and compacted again when due).

It changes what the agent's next call sends, so it asks first on a terminal;
``--yes`` skips the question, and without a terminal to ask on (a script, a
pipe) ``--yes`` is required (``_confirm``). The session and the watermark are
checked first; a watermark that is already current changes nothing (no version
bump, the placeholders stay) and needs no confirmation.
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.markup import escape

from shared.core.errors import InvalidInput
from workers.cli._common import add_session, open_store, session_state, store_errors
from workers.cli._confirm import add_yes, confirmed_or_stop, require_yes
from workers.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_session(parser)
    parser.add_argument("watermark", type=int, metavar="WATERMARK",
                        help="watermark of a kept summary (see `compaction history`), 0 for none")
    add_yes(parser)


def run(args: argparse.Namespace, settings: Settings) -> int:
    if args.watermark < 0:
        raise InvalidInput("must be a non-negative integer", field="watermark")
    with store_errors(settings.redis_url):
        store = open_store(settings, args.tenant)
        before, _ = session_state(store, args.session)  # the log is not read
        if args.watermark and args.watermark not in {r.watermark for r in
                                                     store.summaries(args.session)}:
            raise InvalidInput(f"no kept summary at watermark {args.watermark} (see "
                               f"`compaction history {args.session}`)", field="watermark")
        if args.watermark == before.watermark:
            Console().print(f"[cyan]{escape(args.session)}[/]: watermark {before.watermark} "
                            "is already current: nothing changed", highlight=False)
            return 0
        require_yes(args, "rewind changes what the agent's next call sends")
        target = (f"the summary at watermark {args.watermark}" if args.watermark
                  else "no summary (the whole log)")
        confirmed_or_stop(args, f"{args.session}: make {target} current instead of watermark "
                                f"{before.watermark}?", "not rewound: nothing changed")
        state = store.rewind(args.session, args.watermark)
    what = (f"the summary at watermark {state.watermark} ({state.summary_kind}) is current"
            if state.watermark else "no summary is current: the whole log is in the view")
    Console().print(f"[cyan]{escape(args.session)}[/]: {what} (was watermark "
                    f"{before.watermark}, version {before.version} → {state.version})",
                    highlight=False)
    return 0


__all__ = ["add_arguments", "run"]
