"""The exact counter (tiktoken) as the estimator: accuracy, speed and load cost."""

from __future__ import annotations

import functools
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from _calibration_pieces import message_texts
from _calibration_rules import (
    EARLY,
    TARGET,
    Hindsight,
    Trace,
    cells,
    counter_traces,
    reported_traces,
    signed_errors,
    single_ratio,
    whole_session_errors,
)
from _timing import ROOT, interpolated
from _token_data import (
    Session,
    pct,
)

from shared.core.calibration import prior_ratio
from shared.core.messages import Message
from shared.core.tokens import (
    HeuristicCounter,
    TokenCounter,
)
from shared.core.tokens_exact import TiktokenCounter

GEMINI = "gemini-3-pro-preview"  # the model of the 28 coding sessions


class Scaled:
    """A counter's message counts times a fixed ratio (a model family's prior)."""

    def __init__(self, counter: TokenCounter, ratio: float) -> None:
        self.counter, self.ratio = counter, ratio

    def message(self, message: Message) -> int:
        return math.ceil(self.counter.message(message) * self.ratio)


def exact_table(rows: Sequence[tuple[str, str, Sequence[Trace]]]) -> list[str]:
    """Uncalibrated and one-early-report figures of estimator / truth pairs."""
    out = [
        "| estimator | truth | sessions | uncalibrated worst / median (all) "
        f"| one report after assistant message {EARLY}: p95 / max, fit | held-out | all "
        "| later prefixes under by > 3% | hindsight best ratio, p95 (all) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for estimator, truth, traces in rows:
        errors = whole_session_errors(traces)
        signed = signed_errors(traces, single_ratio, EARLY)
        hindsight = [abs(e) for e in signed_errors(traces, Hindsight(), EARLY)]
        out.append(
            f"| {estimator} | {truth} | {len(traces)} "
            f"| {pct(min(errors))} / {pct(statistics.median(errors))} "
            f"| {' | '.join(cells(traces, single_ratio))} "
            f"| {sum(e < -TARGET for e in signed) / len(signed):.0%} "
            f"| {pct(interpolated(hindsight, 0.95))} |"
        )
    return out


def count_messages(counter: TokenCounter, messages: Sequence[Message]) -> int:
    return sum(counter.message(m) for m in messages)


def counter_speed_lines(
    sessions: Sequence[Session], counters: Sequence[tuple[str, TokenCounter]]
) -> list[str]:
    """Per short message, per message and per MB of text, every counter in the same run."""
    messages = [m for s in sessions for m in s.messages]
    short = [m for m in messages if len(m.text()) <= 300 and not m.tool_calls]
    text = "".join(t for m in messages for t in message_texts(m))
    megabytes = len(text.encode()) / 1e6

    def best(fn: Callable[[], object], runs: int) -> float:
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    out = [
        f"| counter | µs per short message (<= 300 chars, {len(short):,}, best of 5) "
        f"| µs per message (all {len(messages):,}, best of 3) "
        f"| ms per MB ({megabytes:.1f} MB of message text as one string, best of 3) |",
        "|---|---:|---:|---:|",
    ]
    for name, counter in counters:
        per_short = best(functools.partial(count_messages, counter, short), 5) / len(short)
        per_any = best(functools.partial(count_messages, counter, messages), 3) / len(messages)
        per_mb = best(functools.partial(counter.text, text), 3) / megabytes
        out.append(
            f"| {name} | {per_short * 1e6:.1f} | {per_any * 1e6:.1f} | {per_mb * 1e3:.0f} |"
        )
    return out


LOAD_PROBE = """
import sys, time
from shared.core.tokens_exact import TiktokenCounter
start = time.perf_counter()
counter = TiktokenCounter(sys.argv[1], sys.argv[2]) if len(sys.argv) > 1 else None
if counter is not None:
    counter.text("warm")
seconds = time.perf_counter() - start
with open("/proc/self/status") as status:
    peak = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
print(seconds, peak)
"""
"""Run in a fresh interpreter: seconds to load the encoding, and peak RSS in kB (Linux:
``VmHWM`` starts afresh at exec, unlike ``ru_maxrss``, which keeps the forking parent's)."""


def load_cost_line(tokenizers: Path, encodings: Sequence[str]) -> str:
    """What choosing tiktoken costs a process at start-up: load time and memory."""

    if not Path("/proc/self/status").is_file():
        return "Start-up cost: not measured (needs Linux's /proc)."

    def probe(*args: str) -> tuple[float, int]:
        done = subprocess.run(
            [sys.executable, "-c", LOAD_PROBE, *args],
            cwd=ROOT, capture_output=True, text=True, check=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        seconds, rss = done.stdout.split()
        return float(seconds), int(rss)

    base_rss = probe()[1]
    parts = []
    for name in encodings:
        runs = [probe(name, str(tokenizers.resolve())) for _ in range(3)]
        seconds, rss = min(r[0] for r in runs), max(r[1] for r in runs)
        parts.append(f"{name} {seconds:.2f} s and {(rss - base_rss) / 1024:.0f} MB")
    return (
        "Start-up cost of `COMPACTION_TOKEN_COUNTER=tiktoken` per process (fresh "
        "interpreter, file read from `COMPACTION_TIKTOKEN_DIR` and its sha256 checked, best "
        f"of 3; memory: peak RSS beyond importing the counter module): {'; '.join(parts)}."
    )


def exact_lines(
    sessions: Sequence[Session], tokenizers: Path, margin: float
) -> list[str]:
    """The optional exact counter against the same targets and protocol as the heuristic."""
    o200k = TiktokenCounter("o200k_base", tokenizers)
    cl100k = TiktokenCounter("cl100k_base", tokenizers)
    heuristic = HeuristicCounter("openai", safety_margin=margin)
    gemini = HeuristicCounter("gemini", safety_margin=margin)
    heur_name = f"heuristic, openai, margin {margin:g}"
    rows: list[tuple[str, str, Sequence[Trace]]] = [
        (heur_name, "o200k", counter_traces(sessions, heuristic, o200k)),
        ("tiktoken o200k", "o200k", counter_traces(sessions, o200k, o200k)),
        (heur_name, "cl100k", counter_traces(sessions, heuristic, cl100k)),
        ("tiktoken o200k", "cl100k", counter_traces(sessions, o200k, cl100k)),
        (f"heuristic, gemini, margin {margin:g}", "Gemini-reported",
         reported_traces(sessions, gemini)),
        ("tiktoken o200k", "Gemini-reported", reported_traces(sessions, o200k)),
        (heur_name, "Gemini-reported", reported_traces(sessions, heuristic)),
        # what a deployment does with a Gemini model: the stored o200k-baseline counts times
        # the family's prior (shared.core.calibration.prior_ratio) until the first report
        (f"{heur_name} x Gemini's prior", "Gemini-reported",
         reported_traces(sessions, Scaled(heuristic, prior_ratio(GEMINI, heuristic)))),
        ("tiktoken o200k x Gemini's prior", "Gemini-reported",
         reported_traces(sessions, Scaled(o200k, prior_ratio(GEMINI, o200k)))),
    ]
    return [
        "Exact counter (`TiktokenCounter`, what `COMPACTION_TOKEN_COUNTER=tiktoken` selects) "
        "as the estimator, next to the heuristic, on the same sessions and with the same "
        f"protocol: one `Calibration.update` with the true prompt tokens of the prefix ending "
        f"at assistant message {EARLY}, then `hybrid_estimate` for every later prefix "
        "(Gemini-reported: the first reported call at or after it, errors at every later "
        "reported call). Truth: tiktoken with OpenAI chat framing, or the prompt tokens "
        "Gemini reported (28 coding sessions).",
        "",
        *exact_table(rows),
        "",
        *counter_speed_lines(
            sessions,
            [(heur_name, heuristic), ("tiktoken o200k", o200k), ("tiktoken cl100k", cl100k)],
        ),
        "",
        load_cost_line(tokenizers, ("o200k_base", "cl100k_base")),
    ]
