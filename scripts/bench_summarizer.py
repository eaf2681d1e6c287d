"""Measure the deterministic summarization parts on the 40 real sessions.

Prints markdown: facts the ledger extracts (by kind, files read/modified,
rendered size), the offline summarizer's output size and compression ratio
(whole session at once, and folded incrementally in four ranges), whether its
output passes the quality check, and what the LLM summary request costs after
clipping (tokens, chunks for a 32k summarizer window). The system prompt
(message 0) is never summarized, so it is left out of every input figure.

    .venv/bin/python scripts/bench_summarizer.py [--data ../shared/data]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

from shared.core.errors import BadSummary
from shared.core.facts import extract_facts
from shared.core.ledger import Ledger
from shared.core.messages import Message
from shared.core.tokens import DEFAULT_COUNTER
from workers.harness.transcripts import DATA_DIR, to_message, transcript_records
from workers.summarizer.chunking import chunk_for_window
from workers.summarizer.offline import OfflineSummarizer
from workers.summarizer.prompts import build_summary_request, request_tokens
from workers.summarizer.quality import check_summary

KINDS = ("constraint", "identifier", "path", "url", "command", "number")


def load(path: Path) -> list[tuple[str, str, list[Message]]]:
    out = []
    for record in transcript_records(path):
        messages = [to_message(m) for m in record["messages"]]
        domain = "coding" if record["domain"].startswith("coding") else "customer service"
        out.append((record["id"], domain, messages[1:]))
    return out


def chars(messages: list[Message]) -> int:
    return sum(len(m.text()) + sum(len(t.arguments) for t in m.tool_calls) for m in messages)


def med(values: list[float]) -> str:
    return f"{statistics.median(values):.0f}"


def span(values: list[float], fmt: str = "{:.0f}") -> str:
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-" \
           f"{fmt.format(max(values))})"


def fold(summarizer: OfflineSummarizer, messages: list[Message], parts: int) -> str:
    previous: str | None = None
    step = max(1, -(-len(messages) // parts))
    for lo in range(0, len(messages), step):
        part = messages[lo:lo + step]
        previous = summarizer.summarize(part, previous, extract_facts(part, start=1 + lo),
                                        start=1 + lo)
    return previous or ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA_DIR)
    parser.add_argument("--max-chars", type=int, default=8000)
    args = parser.parse_args()
    path = args.data / "transcripts.dev.jsonl"
    if not path.exists():
        sys.exit(f"no transcripts at {path}: pass --data <folder with transcripts.dev.jsonl>")
    sessions = load(path)
    summarizer = OfflineSummarizer(max_chars=args.max_chars)
    rows: dict[str, dict[str, list[float]]] = {}
    kinds: dict[str, Counter[str]] = {}
    passed = total = 0
    for _, domain, messages in sessions:
        r = rows.setdefault(domain, {})
        k = kinds.setdefault(domain, Counter())
        start = time.perf_counter()
        ledger: Ledger = extract_facts(messages, start=1)
        extract_ms = (time.perf_counter() - start) * 1000
        start = time.perf_counter()
        whole = summarizer.summarize(messages, None, ledger, start=1)
        summarize_ms = (time.perf_counter() - start) * 1000
        folded = fold(summarizer, messages, 4)
        n_chars = chars(messages)
        n_tokens = DEFAULT_COUNTER.messages(messages)
        request = build_summary_request(messages, None, ledger=ledger, max_summary_tokens=2000)
        chunks = chunk_for_window(messages, 32_000, previous_summary_tokens=2000, ledger=ledger)
        for name, value in (
            ("input chars", n_chars), ("input tokens", n_tokens), ("facts", len(ledger.facts)),
            ("files read", len(ledger.files_read)), ("files modified", len(ledger.files_modified)),
            ("ledger chars", len(ledger.render())), ("summary chars", len(whole)),
            ("ratio", n_chars / len(whole)), ("folded chars", len(folded)),
            ("folded ratio", n_chars / len(folded)), ("extract ms", extract_ms),
            ("summarize ms", summarize_ms), ("request tokens", request_tokens(request)),
            ("chunks", len(chunks)),
        ):
            r.setdefault(name, []).append(value)
        k.update(f.kind for f in ledger.facts)
        for text in (whole, folded):
            total += 1
            try:
                check_summary(text, input_tokens=n_tokens)
                passed += 1
            except BadSummary:
                pass

    domains = sorted(rows)
    counts = ", ".join(f"{len(rows[d]['facts'])} {d}" for d in domains)
    print(f"Sessions: {len(sessions)} ({counts}); offline summarizer max_chars={args.max_chars}."
          " Median (min-max) per session.\n")
    print("| | " + " | ".join(domains) + " |")
    print("|---|" + "---|" * len(domains))
    for name, fmt in (("input chars", "{:.0f}"), ("input tokens", "{:.0f}"),
                      ("facts", "{:.0f}"), ("files read", "{:.0f}"), ("files modified", "{:.0f}"),
                      ("ledger chars", "{:.0f}"), ("summary chars", "{:.0f}"),
                      ("ratio", "{:.1f}"), ("folded chars", "{:.0f}"),
                      ("folded ratio", "{:.1f}"), ("extract ms", "{:.1f}"),
                      ("summarize ms", "{:.1f}"), ("request tokens", "{:.0f}"),
                      ("chunks", "{:.0f}")):
        label = {"ratio": "compression (input chars / summary chars)",
                 "folded chars": "summary chars, folded in 4 ranges",
                 "folded ratio": "compression, folded in 4 ranges",
                 "request tokens": "LLM request tokens (whole session, clipped)",
                 "chunks": "chunks for a 32k summarizer window"}.get(name, name)
        print(f"| {label} | " + " | ".join(span(rows[d][name], fmt) for d in domains) + " |")
    print("\nFacts by kind (total over sessions):\n")
    print("| kind | " + " | ".join(domains) + " |")
    print("|---|" + "---|" * len(domains))
    for kind in KINDS:
        print(f"| {kind} | " + " | ".join(str(kinds[d][kind]) for d in domains) + " |")
    print(f"\nOffline summaries passing `check_summary`: {passed}/{total}.")


if __name__ == "__main__":
    main()
