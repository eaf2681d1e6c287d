"""Reliability runs against real Redis and real Celery workers, printed as markdown.

Each scenario is one function in ``workers/harness/reliability/<scenario>.py``
that returns its figures and the list of invariant violations it found;
``tests/test_reliability.py`` runs the same functions at CI size and
asserts that the list is empty, this script runs them long and prints the
figures (BENCHMARKS.md, "Reliability"):

- ``kill9``: a worker is SIGKILLed while summarizing (the fake LLM holds each
  call for ``--llm-seconds``); the job is redelivered to a fresh worker and
  must complete with exactly one stored summary per watermark.
- ``restart``: appends race a Redis (AOF, ``appendfsync always``) that is
  SIGKILLed and restarted, then frozen (SIGSTOP); every acknowledged append
  must survive, the guard must fail fast with ``StoreUnavailable`` and
  recover on its own; a worker on the same Redis keeps working afterwards.
- ``races``: 4 workers, 50 sessions, appends, history edits and manual
  compactions at once: no stale summary, watermarks move back only through
  an edit, every view valid for OpenAI, Anthropic and Gemini.
- ``load``: 1,000 sessions x 100 turns fed by agent processes as fast as
  they go while workers compact: the queue drains, no job is lost, guard
  latency under load, Redis memory per session, throughput.
- ``failures``: the summarizer times out, rate-limits, errors, answers
  garbage, nothing, a refusal or endless text: no bad summary is stored,
  retries are bounded, the offline fallback runs on the last attempt, and
  every failure shows in the log and in the task events.

Every scenario starts its own ``redis-server`` (``--redis-url`` uses an
existing one instead: store in db 7, broker in db 8) and its own workers.

    .venv/bin/python scripts/reliability.py all [--quick]
    .venv/bin/python scripts/reliability.py kill9 --trials 20
    .venv/bin/python scripts/reliability.py load --sessions 1000 --turns 100
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence

from _timing import percentile

from workers.harness.reliability.common import environment
from workers.harness.reliability.failures import FailureResult, run_failures
from workers.harness.reliability.kill9 import Kill9Result, run_kill9
from workers.harness.reliability.load import LoadResult, run_load
from workers.harness.reliability.races import RaceResult, run_races
from workers.harness.reliability.restart import RestartResult, run_restart
from workers.settings import load_settings


def fmt_ms(values: Sequence[float]) -> str:
    if not values:
        return "-"
    return (f"{percentile(values, 50):.1f} / {percentile(values, 99):.1f} / "
            f"{max(values):.1f}")


def report_kill9(r: Kill9Result, args: argparse.Namespace) -> list[str]:
    rec = r.recovery_seconds
    return [
        "### Worker killed (SIGKILL) during summarization",
        "",
        f"{r.trials} trials x {args.sessions_per_trial} sessions: each kill takes down the "
        f"worker while its jobs wait on the fake LLM ({args.llm_seconds:g} s per call); a new "
        "worker gets them back after the visibility timeout ("
        + (f"{args.visibility} s here)." if args.visibility else
           f"the default, {load_settings().visibility_timeout} s)."),
        "",
        "| jobs | killed before the commit | killed after the commit | redelivered | "
        "commits | LLM requests | kill -> all done (s, median / max) |",
        "|---|---|---|---|---|---|---|",
        f"| {r.jobs} | {r.killed_before_commit} | {r.killed_after_commit} | {r.redelivered} | "
        f"{r.commits} | {r.llm_requests} | "
        f"{statistics.median(rec) if rec else 0:.1f} / {max(rec) if rec else 0:.1f} |",
        "",
        f"Violations: {len(r.violations)}" + _first(r.violations),
    ]


def report_restart(r: RestartResult) -> list[str]:
    return [
        "### Redis killed and restarted (AOF, fsync always), then frozen",
        "",
        "| cycles | appends acknowledged | acknowledged and lost | appends that raised "
        "(of which applied) | Redis down (s) | guard: StoreUnavailable while down, ms p50/p99/max "
        "| while frozen (timeout "
        f"{r.timeout_s * 1000:.0f} ms) | back to a working prepare (ms, max) |",
        "|---|---|---|---|---|---|---|---|",
        f"| {r.cycles} | {r.acknowledged} | {r.lost} | {r.failed_appends} "
        f"({r.failed_applied}) | {max(r.down_seconds, default=0):.2f} | {fmt_ms(r.refused_ms)} "
        f"| {fmt_ms(r.hung_ms)} | {max(r.recovery_ms, default=0):.0f} |",
        "",
        f"Worker on the same Redis: {r.worker_jobs_after} jobs published after the restarts "
        "completed (no worker restart)." if r.worker_jobs_after else "",
        f"Violations: {len(r.violations)}" + _first(r.violations),
    ]


def report_races(r: RaceResult) -> list[str]:
    return [
        "### Races: appends, history edits, manual compactions",
        "",
        f"{r.workers} workers x 2 threads, {r.sessions} sessions, {r.seconds:.0f} s.",
        "",
        "| turns appended | views checked (3 providers) | history edits (version exact) | "
        "manual compactions sent | summaries committed | CAS lost | lease busy | "
        "watermark drops (all by edits) | summaries checked for staleness | drain (s) | "
        "requests run from the dirty flag | busy requests left unhonored |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        f"| {r.turns} | {r.views} | {r.edits} ({r.edits_exact}) | {r.manual_compactions} | "
        f"{r.commits} | {r.conflicts} | {r.busy} | {r.watermark_drops} | "
        f"{r.summaries_checked} | {r.drain_seconds:.1f} | {r.busy_run} | {r.unhonored} |",
        "",
        f"Violations: {len(r.violations)}" + _first(r.violations),
    ]


def report_load(r: LoadResult) -> list[str]:
    turns_s = r.turns / r.feed_seconds if r.feed_seconds else 0
    total = r.feed_seconds + r.drain_seconds
    return [
        "### Load",
        "",
        f"{r.sessions} sessions x {r.turns_per_session} turns ({r.messages} messages) fed by "
        f"{r.feeders} agent processes (prepare + record_turn per turn, round robin over "
        f"sessions), {r.workers} workers x {r.concurrency} threads, fake LLM with "
        "latency.",
        "",
        "| feed (s) | turns/s | messages/s | drain after feed (s) | summaries committed | "
        "commits/s | max queue | sessions compacted | under the trigger by "
        "cheap stages alone | still due at the end | views truncated by the guard |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        f"| {r.feed_seconds:.0f} | {turns_s:.0f} | {r.messages / r.feed_seconds:.0f} | "
        f"{r.drain_seconds:.1f} | {r.commits} | {r.commits / total:.1f} | {r.max_queue} | "
        f"{r.sessions_compacted} | {r.sessions_cheap_only} | "
        f"{r.still_due} | {r.truncated_views} |",
        "",
        "| call under load | p50 / p99 / max (ms) | samples |",
        "|---|---|---|",
        f"| `prepare` | {fmt_ms(r.prepare_ms)} | {len(r.prepare_ms)} |",
        f"| `record_turn` (append + coalesced enqueue) | {fmt_ms(r.record_ms)} | "
        f"{len(r.record_ms)} |",
        "",
        f"Redis memory: {r.used_memory_bytes / r.sessions / 1024:.0f} KiB per session "
        f"(`INFO memory` used_memory delta / sessions); `MEMORY USAGE` of a session's keys: "
        f"{r.key_bytes_per_session / 1024:.0f} KiB for {r.raw_bytes_per_session / 1024:.0f} KiB "
        f"of message JSON. LLM requests: {r.llm_requests}.",
        "",
        f"Violations: {len(r.violations)}" + _first(r.violations),
    ]


def report_failures(r: FailureResult) -> list[str]:
    lines = [
        "### Summarizer failures",
        "",
        f"`COMPACTION_MAX_RETRIES={r.max_retries}`, backoff cap 1 s, client timeout 1 s; "
        "one session per failure, one real worker.",
        "",
        "| failure | stored | LLM requests | 'will retry' logged | fallback logged | "
        "task events | logged reason | publish -> commit (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in r.cases:
        events = ", ".join(f"{k.removeprefix('task-')} {v}" for k, v in sorted(c.events.items())
                           if k in ("task-retried", "task-succeeded", "task-failed"))
        reason = c.reason.replace("|", "/")[:70]
        lines.append(f"| {c.session_id} | {c.kind} | {c.llm_requests} | {c.retries_logged} | "
                     f"{c.fallbacks_logged} | {events} | {reason} | {c.seconds:.1f} |")
    lines += ["", f"Violations: {len(r.violations)}" + _first(r.violations)]
    return lines


def _first(violations: Sequence[str]) -> str:
    return "".join(f"\n- {v}" for v in violations[:10])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", choices=["kill9", "restart", "races", "load", "failures",
                                             "all"])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--redis-url", default=None,
                        help="use this Redis (store db 7, broker db 8) instead of starting one")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--sessions-per-trial", type=int, default=2)
    parser.add_argument("--llm-seconds", type=float, default=1.0)
    parser.add_argument("--visibility", type=int, default=5,
                        help="kill9: visibility timeout; 0 runs the default timing settings")
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--feeders", type=int, default=2)
    parser.add_argument("--break-cas", action="store_true",
                        help="races: workers with a blind compare-and-swap (the checks must fail)")
    args = parser.parse_args(argv)
    if args.quick:
        args.trials, args.cycles, args.seconds = 3, 1, 15.0
        args.sessions, args.turns = 40, 20

    def progress(text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)

    chosen = ["kill9", "restart", "races", "failures", "load"] if args.scenario == "all" \
        else [args.scenario]
    out: list[str] = []
    failed = 0
    for name in chosen:
        progress(f"{name}: starting")
        lines: list[str]
        violations: list[str]
        if name == "kill9":
            with environment(args.redis_url) as env:
                k = run_kill9(env, trials=args.trials, sessions_per_trial=args.sessions_per_trial,
                              llm_seconds=args.llm_seconds,
                              visibility=args.visibility or None,
                              progress=progress)
            lines, violations = report_kill9(k, args), k.violations
        elif name == "restart":
            r = run_restart(cycles=args.cycles, with_worker=True, progress=progress)
            lines, violations = report_restart(r), r.violations
        elif name == "races":
            with environment(args.redis_url) as env:
                c = run_races(env, seconds=args.seconds, workers=args.workers,
                              break_cas=args.break_cas, progress=progress)
            lines, violations = report_races(c), c.violations
        elif name == "failures":
            with environment(args.redis_url) as env:
                f = run_failures(env, progress=progress)
            lines, violations = report_failures(f), f.violations
        else:
            load = run_load(sessions=args.sessions, turns=args.turns, feeders=args.feeders,
                            redis_url=args.redis_url, progress=progress)
            lines, violations = report_load(load), load.violations
        failed += len(violations)
        out += [*lines, ""]
        print("\n".join(lines) + "\n", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
