"""Measure cut points, repair and emergency truncation on the 40 real sessions.

Prints markdown: for ``find_cut_point`` how often a cut splits a turn and how
far the kept tokens overshoot the request; for ``repair_tool_pairs`` what it
changes; for ``emergency_truncate`` whether results fit, stay valid for all
three providers, and what they drop; timings per call (the project's default
token estimator included), and the same on one history made of all sessions
back to back.

    .venv/bin/python scripts/bench_structure.py [--data ../shared/data]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from _timing import best_of

from shared.core.messages import Message
from shared.core.repair import PROVIDERS, repair_tool_pairs_with_report, validate_view
from shared.core.tokens import DEFAULT_COUNTER
from shared.core.truncation import emergency_truncate
from shared.core.turns import find_cut_point
from workers.harness.transcripts import DATA_DIR, load_transcripts


def tokens(messages: list[Message]) -> int:
    return sum(DEFAULT_COUNTER.message(m) for m in messages)


def cut_rows(sessions: list[tuple[str, list[Message]]]) -> list[str]:
    rows = ["| keep_recent | sessions cut | split turns | kept / keep (median, max) | "
            "ms per call (median, max) |", "|---|---|---|---|---|"]
    for keep in (2_000, 8_000, 20_000):
        cut = split = 0
        ratios: list[float] = []
        times: list[float] = []
        for _, messages in sessions:
            point, ms = best_of(lambda m=messages, k=keep: find_cut_point(m, k))  # type: ignore[misc]
            times.append(ms)
            if point.index > point.head:
                cut += 1
                split += point.split_turn
                ratios.append(point.kept_tokens / keep)
        ratio = f"{statistics.median(ratios):.2f}, {max(ratios):.2f}" if ratios else "-"
        rows.append(f"| {keep} | {cut}/{len(sessions)} | {split}/{cut} | {ratio} | "
                    f"{statistics.median(times):.2f}, {max(times):.2f} |")
    return rows


def repair_lines(sessions: list[tuple[str, list[Message]]]) -> list[str]:
    changed, renamed, invalid = 0, 0, 0
    times: list[float] = []
    for _, messages in sessions:
        (_, report), ms = best_of(lambda m=messages: repair_tool_pairs_with_report(m))  # type: ignore[misc]
        times.append(ms)
        changed += report.changed
        renamed += len(report.renamed_calls)
        invalid += bool(validate_view(messages, "anthropic"))
    return [f"- `repair_tool_pairs`: {changed}/{len(sessions)} sessions changed "
            f"({renamed} reused tool-call ids renamed; {invalid} sessions as recorded are "
            f"invalid for Anthropic because of them); median {statistics.median(times):.2f} ms, "
            f"max {max(times):.2f} ms per session"]


def truncation_rows(sessions: list[tuple[str, list[Message]]]) -> list[str]:
    rows = ["| budget | fit | system prompt alone over budget | valid (3 providers) | "
            "dropped msgs (median) | clipped msgs | ms per call (median, max) |",
            "|---|---|---|---|---|---|---|"]
    budgets: list[tuple[str, Callable[[int], int]]] = [
        ("50% of session", lambda total: total // 2), ("20% of session", lambda total: total // 5),
        ("4,000 tokens", lambda total: 4_000), ("1,000 tokens", lambda total: 1_000)]
    for label, budget_of in budgets:
        fit = valid = clipped = hopeless = 0
        dropped: list[int] = []
        times: list[float] = []
        for _, messages in sessions:
            budget = budget_of(tokens(messages))
            result, ms = best_of(lambda m=messages, b=budget: emergency_truncate(m, b))  # type: ignore[misc]
            times.append(ms)
            fit += result.within_budget
            hopeless += tokens([m for m in messages[:1] if m.role == "system"]) > budget
            valid += all(not validate_view(result.messages, p) for p in PROVIDERS)
            dropped.append(result.dropped)
            clipped += len(result.truncated)
        rows.append(f"| {label} | {fit}/{len(sessions)} | {hopeless} | {valid}/{len(sessions)} | "
                    f"{statistics.median(dropped):.0f} | {clipped} | "
                    f"{statistics.median(times):.1f}, {max(times):.1f} |")
    return rows


def scale_lines(sessions: list[tuple[str, list[Message]]]) -> list[str]:
    history = [sessions[0][1][0]] + [m for _, ms in sessions for m in ms if m.role != "system"]
    total = tokens(history)
    point, cut_ms = best_of(lambda: find_cut_point(history, 32_000))
    (_, report), repair_ms = best_of(lambda: repair_tool_pairs_with_report(history))
    result, trunc_ms = best_of(lambda: emergency_truncate(history, 32_000))
    return [f"- all 40 sessions back to back ({len(history)} messages, {total} tokens): "
            f"`find_cut_point(keep=32k)` {cut_ms:.1f} ms (cut at {point.index}), "
            f"`repair_tool_pairs` {repair_ms:.1f} ms ({len(report.renamed_calls)} ids renamed), "
            f"`emergency_truncate(32k)` {trunc_ms:.1f} ms ({result.dropped} dropped, "
            f"{result.tokens_after} tokens, fits: {result.within_budget})",
            f"- note on that history: `{result.note[:160]}...`"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA_DIR)
    args = parser.parse_args()
    if not (args.data / "transcripts.dev.jsonl").exists():
        sys.exit(f"no transcripts.dev.jsonl under {args.data}")
    sessions = load_transcripts(args.data)
    print(f"Data: {len(sessions)} sessions, {sum(len(m) for _, m in sessions)} messages, "
          f"token counts by the default estimator.\n")
    print("`find_cut_point` (cut = something to compact; kept / keep >= 1 by construction):\n")
    print("\n".join(cut_rows(sessions)) + "\n")
    print("\n".join(repair_lines(sessions)) + "\n")
    print("`emergency_truncate`:\n")
    print("\n".join(truncation_rows(sessions)) + "\n")
    print("\n".join(scale_lines(sessions)))


if __name__ == "__main__":
    main()
