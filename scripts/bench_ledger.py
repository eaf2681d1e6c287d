"""CPU per ``extract_facts`` call, this tree against an earlier revision, as markdown.

The baseline is ``shared/ledger.py`` and ``shared/fileops.py`` as they were at
``--baseline`` (read with ``git show``, loaded as private modules), so the
figures compare the whole extraction, not only the part that changed. Inputs:

- the demo range the worker benchmark uses (``generate_session(400,
  seed=11)`` through ``from_openai``, messages ``[1:47]``, start 1), called
  ``--calls`` times per repetition;
- the 40 real sessions of ``transcripts.dev.jsonl``, cut into the
  consecutive 46-message ranges a worker would extract (from message 1), all
  ranges once per repetition.

Before timing, both versions must give byte-identical ledger JSON on every
input (the script stops otherwise). Times are thread CPU time
(``time.thread_time``), old and new alternate within every repetition and
swap order each time, so a noisy, shared machine slows both alike; the
ratio of medians is the figure to quote.

    .venv/bin/python scripts/bench_ledger.py [--data ../shared/data] [--baseline 7a4a94e]
        [--reps 15] [--calls 50]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

from _timing import ROOT

from shared.core.facts import extract_facts
from shared.core.ledger import Ledger
from shared.core.messages import Message
from shared.core.wire import from_openai
from workers.harness.demo_session import generate_session
from workers.harness.transcripts import DATA_DIR, to_message, transcript_records

Extract = Callable[..., Ledger]
Ranges = list[tuple[Sequence[Message], int]]
RANGE = 46


def load_baseline(revision: str) -> Extract:
    """``extract_facts`` of ``revision``, importing that revision's fileops too."""
    def source(path: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), "show", f"{revision}:{path}"],
                              check=True, capture_output=True, text=True).stdout

    def load(name: str, code: str) -> ModuleType:
        spec = importlib.util.spec_from_loader(name, loader=None)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # pydantic resolves the models' annotations through it
        exec(compile(code, f"{revision}:{name}", "exec"), module.__dict__)
        return module

    load("_baseline_fileops", source("shared/fileops.py"))
    code = source("shared/ledger.py")  # the pre-layout tree: shared/*.py, not shared/core/
    for old, new in (("from shared.fileops import", "from _baseline_fileops import"),
                     ("from shared.errors import", "from shared.core.errors import"),
                     ("from shared.messages import", "from shared.core.messages import")):
        code = code.replace(old, new)
    ledger = load("_baseline_ledger", code)
    extract: Extract = ledger.extract_facts
    return extract


def real_ranges(path: Path) -> Ranges:
    ranges: Ranges = []
    for record in transcript_records(path):
        messages = [to_message(m) for m in record["messages"]]
        ranges += [(messages[lo:lo + RANGE], lo) for lo in range(1, len(messages), RANGE)]
    return ranges


def timed(extract: Extract, ranges: Ranges, calls: int) -> float:
    """Thread CPU seconds for ``calls`` passes over ``ranges``."""
    t0 = time.thread_time()
    for _ in range(calls):
        for messages, start in ranges:
            extract(messages, start=start)
    return time.thread_time() - t0


def compare(old: Extract, ranges: Ranges, calls: int, reps: int) -> tuple[list[float], ...]:
    for messages, start in ranges:
        if old(messages, start=start).to_json() != extract_facts(messages, start=start).to_json():
            sys.exit(f"ledgers differ on the range starting at {start}")
    timed(old, ranges, 1)
    timed(extract_facts, ranges, 1)
    olds: list[float] = []
    news: list[float] = []
    for rep in range(reps):
        pair = [(old, olds), (extract_facts, news)]
        for fn, into in pair if rep % 2 == 0 else pair[::-1]:
            into.append(timed(fn, ranges, calls))
    return olds, news


def row(label: str, olds: list[float], news: list[float], per: int, unit: str) -> str:
    scale = {"us": 1e6, "ms": 1e3}[unit] / per
    o, n = statistics.median(olds) * scale, statistics.median(news) * scale
    return (f"| {label} | {o:.{0 if unit == 'us' else 1}f} {unit} | "
            f"{n:.{0 if unit == 'us' else 1}f} {unit} | {o / n:.2f}x | "
            f"{min(olds) / min(news):.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA_DIR)
    parser.add_argument("--baseline", default="7a4a94e",
                        help="revision before the batched extraction (default: 7a4a94e)")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--calls", type=int, default=50, help="demo-range calls per repetition")
    args = parser.parse_args()
    old = load_baseline(args.baseline)
    demo: Ranges = [(from_openai(generate_session(400, seed=11))[1:47], 1)]
    print(f"Baseline {args.baseline}; thread CPU time, median of {args.reps} interleaved "
          "repetitions; identical ledger JSON checked on every input first.\n")
    print("| input | baseline | now | speedup (medians) | speedup (best runs) |")
    print("|---|---|---|---|---|")
    olds, news = compare(old, demo, args.calls, args.reps)
    print(row("demo range (46 messages), per call", olds, news, args.calls, "us"))
    path = args.data / "transcripts.dev.jsonl"
    if path.exists():
        ranges = real_ranges(path)
        olds, news = compare(old, ranges, 1, max(3, args.reps // 3))
        print(row(f"40 real sessions, all {len(ranges)} ranges of {RANGE} messages", olds, news,
                  1, "ms"))
    else:
        print(f"\n(real sessions skipped: {path} not found)")


if __name__ == "__main__":
    main()
