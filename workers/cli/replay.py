"""``compaction replay SESSIONS.jsonl --window 16000``: the end-to-end proof.

Replays recorded agent sessions (OpenAI chat format, one per line) through
the guard against a fake provider that enforces the window, with real
Celery workers summarizing in the background, and prints the report
(markdown), then why the guard truncated and what the provider rejected,
classified from every turn's trace. Exit status: 0 when every turn got an
answer, 1 when some turn failed even after recovery (or nothing could be
replayed), 2 on a configuration error.

This module is an edge: it is where the environment is read (which Redis
was configured, the tiktoken cache, what the worker processes inherit).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from workers.settings import Settings

if TYPE_CHECKING:  # the harness needs the 'openai' extra: imported when the command runs
    from workers.harness.replay.report import SessionReport

EXTRA = "openai"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sessions_file", metavar="SESSIONS.jsonl",
                        help="sessions in OpenAI chat format, one JSON object per line")
    parser.add_argument("--window", type=int, default=16_000,
                        help="context window the fake provider enforces (default 16000)")
    parser.add_argument("--json", dest="json_path", metavar="REPORT.json",
                        help="also write the full report (every session) as JSON")
    parser.add_argument("--sessions", type=int, metavar="N", help="replay the first N sessions")
    parser.add_argument("--select", action="append", default=[], metavar="TEXT",
                        help="only sessions whose id contains TEXT (repeatable)")
    parser.add_argument("--trace", metavar="TRACE.jsonl",
                        help="write one JSON line per turn (guard report, provider count)")
    parser.add_argument("--max-messages", type=int, metavar="N",
                        help="cut each session after its first N messages")
    parser.add_argument("--max-tokens", type=int, default=1024,
                        help="the agent's max_tokens per call (default 1024)")
    parser.add_argument("--model", default="gpt-4o", help="model name the agent asks for")
    parser.add_argument("--workers", type=int, default=1,
                        help="Celery worker processes to start (default 1)")
    parser.add_argument("--concurrency", type=int, default=4,
                        help="threads per worker process (default 4)")
    parser.add_argument("--parallel", type=int, default=1,
                        help="sessions replayed at the same time (default 1)")
    parser.add_argument("--latency", type=float, default=0.0,
                        help="seconds the fake provider takes per agent call (default 0)")
    parser.add_argument("--summarizer", choices=("fake", "offline"), default="fake",
                        help="fake LLM summarizer over HTTP (default) or the offline one")
    parser.add_argument("--summarizer-window", type=int, default=128_000,
                        help="context window of the fake summarizer model (default 128000)")
    parser.add_argument("--summarizer-latency", type=float, default=0.0,
                        help="seconds the fake summarizer takes per call (default 0)")
    parser.add_argument("--learn-window", action="store_true",
                        help="do not tell the guard the window: it learns it from the first "
                             "overflow error")
    parser.add_argument("--tokenizer", metavar="PATH",
                        help="o200k_base.tiktoken (default: a tokenizers directory beside "
                             "the checkout's data, then the tiktoken cache)")
    parser.add_argument("--redis-server", metavar="PATH",
                        help="redis-server binary for the embedded Redis (default: on PATH)")
    parser.add_argument("--in-process", action="store_true",
                        help="fakeredis + in-memory broker + in-process worker, even if a "
                             "redis-server exists")
    parser.add_argument("--drain-timeout", type=float, default=120.0,
                        help="seconds to wait at the end for queued summaries (default 120)")
    parser.add_argument("--keep-data", action="store_true",
                        help="leave the replayed sessions in Redis")
    parser.add_argument("--per-session", action="store_true",
                        help="print one row per session as well")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def _tiktoken_cache_dirs() -> list[str]:
    """Where tiktoken caches its files (its own rules: two variables, then the temp dir)."""
    dirs = [os.environ.get("TIKTOKEN_CACHE_DIR"), os.environ.get("DATA_GYM_CACHE_DIR")]
    return [d for d in dirs if d] + [str(Path(tempfile.gettempdir()) / "data-gym-cache")]


def _session_count(path: str, limit: int | None) -> int | None:
    """Sessions the file holds (non-empty lines), for the progress bar; None if unreadable."""
    try:
        with Path(path).open(encoding="utf-8") as handle:
            count = sum(1 for line in handle if line.strip())
    except OSError:
        return None
    return min(count, limit) if limit else count


def _progress_line(report: SessionReport) -> str:
    return (f"  {report.source_id[:40]:40} turns {report.turns:4d}  failed "
            f"{report.failed_turns}  rejected {report.rejections}  truncated "
            f"{report.proactive_truncations}  {report.elapsed_s:5.1f}s")


def run(args: argparse.Namespace, settings: Settings) -> int:
    # A missing extra (openai) surfaces as ModuleNotFoundError: main turns it into one line.
    from workers.harness.replay.report import render_causes, render_markdown, trace_causes
    from workers.harness.replay.run import ReplayOptions, resolve_counter, run_replay

    options = ReplayOptions(
        window=args.window, max_tokens=args.max_tokens, model=args.model,
        parallel=args.parallel, workers=args.workers, concurrency=args.concurrency,
        latency=args.latency, summarizer=args.summarizer,
        summarizer_window=args.summarizer_window, summarizer_latency=args.summarizer_latency,
        learn_window=args.learn_window, drain_timeout=args.drain_timeout,
        keep_data=args.keep_data)
    counter = resolve_counter(args.tokenizer, _tiktoken_cache_dirs())
    configured = bool({"redis_url", "broker_url"} & settings.model_fields_set)
    rows: list[dict[str, Any]] = []
    console = Console(stderr=True)
    # the bar on a terminal only: elsewhere (a log, CI) it is left as a line before the
    # outcome or the error; the per-session lines are printed either way
    bar = Progress(TextColumn("[bold]replaying sessions"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=console,
                   disable=args.quiet or not console.is_terminal)
    task = bar.add_task("sessions", total=_session_count(args.sessions_file, args.sessions))

    def progress(report: SessionReport) -> None:
        bar.console.print(_progress_line(report), highlight=False, markup=False)
        bar.advance(task)

    with contextlib.ExitStack() as stack:
        stack.enter_context(bar)
        handle = (stack.enter_context(Path(args.trace).open("w", encoding="utf-8"))
                  if args.trace else None)
        lock = threading.Lock()

        def trace(row: dict[str, Any]) -> None:
            with lock:
                rows.append(row)
                if handle is not None:
                    handle.write(json.dumps(row) + "\n")

        report = run_replay(
            args.sessions_file, options, settings, base_env=dict(os.environ),
            configured=configured, counter=counter, limit=args.sessions,
            max_messages=args.max_messages, redis_server=args.redis_server,
            force_in_process=args.in_process, select=args.select,
            progress=None if args.quiet else progress, trace=trace)
    print(render_markdown(report, per_session=args.per_session))
    print(render_causes(trace_causes(rows, report.options["trigger_ratio"])))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(report.model_dump(mode="json"), indent=1),
                                        encoding="utf-8")
    return 0 if report.totals["failed_turns"] == 0 else 1
