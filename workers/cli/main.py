"""The ``compaction`` console script: one sub-command per module in ``workers.cli``.

Settings are read once here (``COMPACTION_*``), at the edge; commands get
them as an argument. Only the module of the command that runs is imported,
and no command module imports an optional extra at module level: a command
that needs one says which, in one line, when it runs.

Every failure is one line on stderr with one prefix, ``compaction: error:``.
Exit status: 0 ok, 1 the command failed (Redis down, no such session, a
failed job), 2 bad usage or input (arguments, ``COMPACTION_*`` settings,
invalid values, a missing extra), 130 interrupted, 141 the reader of the
output went away (``compaction show S | head``: quiet, like a program that
SIGPIPE ends).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from pydantic import ValidationError

from shared.core.errors import CompactionError, ConfigError, InvalidInput
from workers.cli._format import DISTRIBUTION, extra_for, needs_extra, unreadable

PROG = "compaction"
PREFIX = f"{PROG}: error: "
BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for `yes | head -1`

COMMANDS = {
    "demo": "Replay a long generated agent session through the guard and workers (embedded).",
    "sessions": "List sessions: tenant, messages, tokens, watermark, last activity (paged).",
    "stats": "Context meter of a session: tokens by region, usage ratio, summaries.",
    "show": "The view that would be sent for a session now.",
    "compact": "Enqueue a manual compaction (/compact) of a session.",
    "history": "The summaries of a session, by watermark.",
    "rewind": "Make an earlier summary of a session current again.",
    "delete": "Remove a session for good: its log, summaries and recall index.",
    "doctor": "Check Redis, the broker, the workers and the summarizer.",
    "replay": "Replay JSONL sessions against a fake provider that enforces the window.",
    "mcp": "Serve recall, context_stats and compact as MCP tools (stdio or streamable HTTP).",
    "serve": "Serve the guard over HTTP (FastAPI + uvicorn; needs the 'server' extra).",
    "report": "A session's life on one self-contained HTML page (tokens per turn, compactions).",
}

DESCRIPTION = ("Keep LLM conversations inside the context window: inspect and operate the "
               "sessions in Redis, or run the embedded demo (`compaction demo`).")

class MissingExtra(CompactionError):
    """A command needs an optional extra that is not installed."""

    def __init__(self, command: str, extra: str) -> None:
        self.command = command
        self.extra = extra
        super().__init__(needs_extra(command, extra))


class Parser(argparse.ArgumentParser):
    """argparse with the one error prefix (``compaction: error:``) for every sub-command."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{PREFIX}{message}\n")


def version() -> str:
    """The installed distribution's version (package metadata)."""
    from importlib import metadata

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def _command_in(argv: Sequence[str]) -> str | None:
    """The sub-command named on the command line (the first non-option word)."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def _missing_extra(exc: ModuleNotFoundError, command: str) -> MissingExtra | None:
    extra = extra_for(exc)
    return MissingExtra(command, extra) if extra else None


def load_command(name: str) -> object:
    """The module of one sub-command (its optional extras are imported when it runs)."""
    try:
        return importlib.import_module(f"workers.cli.{name}")
    except ModuleNotFoundError as exc:
        missing = _missing_extra(exc, name)
        if missing is None:
            raise
        raise missing from None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; ``only``: load the arguments of that command alone ("" for none)."""
    parser = Parser(prog=PROG, description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=Parser)
    for name, help_text in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        if only is None or name == only:
            module = load_command(name)
            module.add_arguments(command)  # type: ignore[attr-defined]
            command.set_defaults(run=module.run)  # type: ignore[attr-defined]
    return parser


def message_of(exc: BaseException) -> str:
    """The error's text without a prefix of its own (never ``error: error:``)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    lowered = text.lower()
    for prefix in ("compaction: error:", "error:", "configuration error:"):
        while lowered.startswith(prefix):
            text = text[len(prefix):].lstrip()
            lowered = text.lower()
    return text


def fail(exc: BaseException | str, code: int) -> int:
    text = exc if isinstance(exc, str) else message_of(exc)
    print(f"{PREFIX}{text}", file=sys.stderr)
    return code


def _reader_gone() -> int:
    """A closed pipe on stdout: point stdout at /dev/null so that nothing raises again
    (not the interpreter's flush at exit either), and end quietly with 128 + SIGPIPE."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # stdout without a descriptor (tests)
        pass
    return BROKEN_PIPE


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _command_in(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format=f"{PROG}: warning: %(message)s")
    try:
        args = build_parser(command or "").parse_args(argv)
        from workers.settings import load_settings

        settings = load_settings()
        code: int = args.run(args, settings)
        return code
    except (ConfigError, InvalidInput, MissingExtra) as exc:
        return fail(exc, 2)
    except CompactionError as exc:
        return fail(exc, 1)
    except ValidationError as exc:
        return fail(unreadable(exc), 1)
    except ModuleNotFoundError as exc:
        missing = _missing_extra(exc, command or PROG)
        if missing is None:
            raise
        return fail(missing, 2)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _reader_gone()
    except SystemExit as stopped:
        # rich's Console ends a closed pipe as SystemExit(1) raised while handling it
        if isinstance(stopped.__context__, BrokenPipeError):
            return _reader_gone()
        raise


if __name__ == "__main__":
    raise SystemExit(main())
