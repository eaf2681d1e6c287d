"""``compaction delete SESSION``: remove a session for good (a user's erasure request, a
session to start afresh).

Every key of the session goes in one ``UNLINK`` (one hash tag, one slot: atomic, its
memory freed off Redis's main thread), then its recall index. Nothing of it can be
rewound afterwards; an agent still using the session id starts a new session on its next
turn. It asks first on a terminal; ``--yes`` without one.
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.markup import escape

from workers.cli._common import add_session, open_store, session_state, store_errors
from workers.cli._confirm import add_yes, confirmed_or_stop, require_yes
from workers.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_session(parser)
    add_yes(parser)


def run(args: argparse.Namespace, settings: Settings) -> int:
    with store_errors(settings.redis_url):
        store = open_store(settings, args.tenant)
        _, length = session_state(store, args.session)  # SessionNotFound: nothing to delete
        require_yes(args, "delete removes the session for good")
        kept = len(store.summaries(args.session))
        confirmed_or_stop(args, f"{args.session} (tenant {store.tenant}): delete its "
                                f"{length} messages and {kept} summaries for good?",
                          "not deleted: nothing changed")
        store.delete_session(args.session)
    Console().print(f"[cyan]{escape(args.session)}[/] (tenant {escape(store.tenant)}): "
                    f"deleted, {length} messages and {kept} summaries", highlight=False)
    return 0


__all__ = ["add_arguments", "run"]
