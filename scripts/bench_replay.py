"""End to end: every recorded session against a provider that enforces small windows.

Runs ``compaction replay`` once per window (fake OpenAI-compatible provider
counting o200k and rejecting overflows with OpenAI's error, the guard on the
hot path, real Celery workers on an embedded or configured Redis) and prints
the figures side by side as markdown, with the failed turns spelled out and,
from every turn's trace, why the guard truncated and what was rejected.

    .venv/bin/python scripts/bench_replay.py [--data ../shared/data/transcripts.dev.jsonl]
        [--windows 8000,16000,32000] [--latency 0] [--summarizer-latency 0]
        [--parallel 1] [--workers 1] [--concurrency 4] [--json-dir DIR] [--trace-dir DIR]

Redis: ``COMPACTION_REDIS_URL`` / ``COMPACTION_BROKER_URL`` when set, else an
embedded redis-server, else the in-process fallback (the output says which).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import _timing  # noqa: F401  (puts this checkout first on sys.path)

from workers.harness.replay.report import (
    RunReport,
    TraceCauses,
    render_causes,
    render_comparison,
    trace_causes,
)
from workers.harness.replay.run import ReplayOptions, resolve_counter, run_replay
from workers.harness.transcripts import DATA_DIR, TRANSCRIPTS
from workers.settings import load_settings

DEFAULT_DATA = DATA_DIR / TRANSCRIPTS


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="sessions JSONL")
    parser.add_argument("--windows", default="8000,16000,32000",
                        help="comma-separated context windows")
    parser.add_argument("--sessions", type=int, help="only the first N sessions")
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--latency", type=float, default=0.0,
                        help="seconds per agent call at the fake provider")
    parser.add_argument("--summarizer-latency", type=float, default=0.0,
                        help="seconds per summarizer call")
    parser.add_argument("--parallel", type=int, default=1, help="sessions at a time")
    parser.add_argument("--workers", type=int, default=1, help="worker processes")
    parser.add_argument("--concurrency", type=int, default=4, help="threads per worker")
    parser.add_argument("--json-dir", type=Path, help="write one REPORT.json per window here")
    parser.add_argument("--trace-dir", type=Path,
                        help="write one trace (a JSON line per turn) per window here")
    return parser.parse_args(argv)


def command_line(args: argparse.Namespace) -> str:
    parts = ["python scripts/bench_replay.py", f"--windows {args.windows}"]
    for flag in ("sessions", "latency", "summarizer_latency", "parallel", "workers",
                 "concurrency"):
        value = getattr(args, flag)
        default = {"latency": 0.0, "summarizer_latency": 0.0, "parallel": 1, "workers": 1,
                   "concurrency": 4}.get(flag)
        if value is not None and value != default:
            parts.append(f"--{flag.replace('_', '-')} {value}")
    return " ".join(parts)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.data.exists():
        print(f"no sessions at {args.data}: pass --data PATH", file=sys.stderr)
        return 2
    windows = [int(w) for w in args.windows.split(",") if w.strip()]
    settings = load_settings()
    configured = bool({"redis_url", "broker_url"} & settings.model_fields_set)
    cache = os.environ.get("TIKTOKEN_CACHE_DIR")
    counter = resolve_counter(None, [cache] if cache else [])
    reports: list[RunReport] = []
    causes: list[TraceCauses] = []
    for window in windows:
        started = time.monotonic()
        options = ReplayOptions(
            window=window, max_tokens=args.max_tokens, latency=args.latency,
            summarizer_latency=args.summarizer_latency, parallel=args.parallel,
            workers=args.workers, concurrency=args.concurrency)
        rows: list[dict[str, Any]] = []  # list.append is atomic: parallel sessions may share it
        report = run_replay(args.data, options, settings, base_env=dict(os.environ),
                            configured=configured, counter=counter, limit=args.sessions,
                            trace=rows.append)
        reports.append(report)
        causes.append(trace_causes(rows, report.options["trigger_ratio"]))
        if args.trace_dir:
            args.trace_dir.mkdir(parents=True, exist_ok=True)
            with (args.trace_dir / f"trace-{window}.jsonl").open("w") as handle:
                handle.writelines(json.dumps(row) + "\n" for row in rows)
        print(f"window {window}: {time.monotonic() - started:.0f} s", file=sys.stderr)
        if args.json_dir:
            args.json_dir.mkdir(parents=True, exist_ok=True)
            path = args.json_dir / f"replay-{window}.json"
            path.write_text(json.dumps(report.model_dump(mode="json"), indent=1))
    first = reports[0]
    print(f"Command: `{command_line(args)}`\n")
    print(f"- sessions: `{first.source}` ({first.totals['sessions']} replayed, "
          f"{first.totals['skipped']} skipped), {first.totals['turns']} turns per window")
    print(f"- infrastructure: {first.infrastructure.split(' on port')[0]}")
    print(f"- provider: fake OpenAI-compatible, {first.counter.split(' (')[0]} prompt count, "
          f"agent latency {args.latency:g} s; summarizer: {first.summarizer}, latency "
          f"{args.summarizer_latency:g} s; max_tokens {first.max_tokens}")
    print("- wall time per window: " + ", ".join(
        f"{r.window:,}: {r.elapsed_s:.0f} s" for r in reports) + "\n")
    print(render_comparison(reports))
    for report, found in zip(reports, causes, strict=True):
        print(f"From the trace at {report.window:,}:\n")
        print(render_causes(found))
    for report in reports:
        failures = [(s.source_id, f) for s in report.sessions for f in s.failures]
        if failures:
            print(f"Failed turns at {report.window:,}:\n")
            for sid, f in failures:
                print(f"- `{sid}` turn {f.turn} ({f.stage}): {f.error[:240]}")
            print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
