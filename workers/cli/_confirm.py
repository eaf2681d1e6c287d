"""Confirmation of the commands that change what an agent sends (``rewind``, ``delete``).

On a terminal they ask ``[y/N]`` on stderr; ``--yes`` skips the question; without a
terminal to ask on (a script, a pipe, cron) ``--yes`` is required (a usage error, exit
2), checked once the command knows there is something to change (an unknown session is
still "no session", exit 1) and before anything is written.
"""

from __future__ import annotations

import argparse
import sys

from shared.core.errors import CompactionError, InvalidInput


class NotConfirmed(CompactionError):
    """The operator answered no at the prompt: nothing was changed."""


def add_yes(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-y", "--yes", action="store_true",
                        help="do not ask (required without a terminal, e.g. in a script)")


def interactive() -> bool:
    """Whether there is a terminal to ask on (stdin)."""
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False


def require_yes(args: argparse.Namespace, what: str) -> None:
    """Usage error (exit 2) when there is no terminal to ask on and no ``--yes``."""
    if not args.yes and not interactive():
        raise InvalidInput(f"{what}: pass --yes to confirm (no terminal to ask on)",
                           field="--yes")


def confirm(question: str) -> bool:
    """Ask on the terminal; False for anything but y/yes (and for end of input)."""
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    try:
        answer = sys.stdin.readline()
    except (OSError, ValueError):
        return False
    return answer.strip().lower() in ("y", "yes")


def confirmed_or_stop(args: argparse.Namespace, question: str, refused: str) -> None:
    """Ask unless ``--yes``; :class:`NotConfirmed` (exit 1, ``refused``) on a no."""
    if not args.yes and not confirm(question):
        raise NotConfirmed(refused)


__all__ = ["NotConfirmed", "add_yes", "confirm", "confirmed_or_stop", "interactive",
           "require_yes"]
