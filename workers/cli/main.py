"""The ``compaction`` console script: one sub-command per module in ``workers.cli``.

Settings are read once here (``COMPACTION_*``), at the edge; commands get
them as an argument. A configuration error exits with status 2 and a
message naming the variable.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from shared.core.errors import CompactionError, ConfigError
from workers.settings import load_settings

COMMANDS = {
    "demo": "Replay a long generated agent session through the guard and workers (embedded).",
    "stats": "Context meter of a session: tokens by region, usage ratio, summaries.",
    "show": "The view that would be sent for a session now.",
    "compact": "Enqueue a manual compaction (/compact) of a session.",
    "history": "The summaries of a session, by watermark.",
    "rewind": "Make an earlier summary of a session current again.",
    "doctor": "Check Redis, the broker, the workers and the summarizer.",
    "replay": "Replay JSONL sessions against a fake provider that enforces the window.",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="compaction", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        module = importlib.import_module(f"workers.cli.{name}")
        command = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(command)
        command.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings()
        code: int = args.run(args, settings)
        return code
    except ConfigError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return 2
    except CompactionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
