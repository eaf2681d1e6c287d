"""Measure overflow detection on the labelled provider errors (overflow_errors.dev.json),
on the project's own self-hosted-server corpus (tests/data/overflow_errors_selfhosted.json)
and on errors users quoted in public issue threads (tests/data/overflow_errors_issues.json).

Each error is classified in two forms: the bare message string and an
exception carrying the message plus its HTTP status (how SDKs raise). Prints
markdown: precision / recall of ``is_context_overflow`` on the unambiguous
labels and on all of them, agreement of ``classify_error`` with the labelled
kind, how many stated token numbers ``parse_overflow`` recovers, every miss
and false alarm, and the time per classification.

    .venv/bin/python scripts/bench_overflow.py [--data ../shared/data] [--selfhosted PATH]
        [--issues PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shared.core.overflow import ErrorKind, classify_error, parse_overflow  # noqa: E402

K = ErrorKind
OVERFLOW_KINDS = {K.CONTEXT_OVERFLOW, K.PAYLOAD_SIZE}
ACCEPTED: dict[str, set[ErrorKind]] = {
    "context_overflow": OVERFLOW_KINDS, "output_reserve_overflow": {K.CONTEXT_OVERFLOW},
    "payload_size": OVERFLOW_KINDS, "rate_limit": {K.RATE_LIMIT}, "quota": {K.QUOTA},
    "capacity": {K.OVERLOADED, K.QUOTA}, "overloaded": {K.OVERLOADED},
    "server_error": {K.SERVER_ERROR}, "network": {K.SERVER_ERROR}, "auth": {K.AUTH},
    "output_limit": {K.OUTPUT_LIMIT}, "tool_pairing": {K.TOOL_PAIRING},
    "content_filter": {K.CONTENT_FILTER}, "empty": {K.OTHER}, "unknown": {K.OTHER},
}
TOKEN_FIELDS = {"actual": "requested", "limit": "limit", "input": "prompt_tokens",
                "input_at_least": "prompt_tokens", "output_reserved": "output_tokens",
                "excess": "excess"}


class StatusError(Exception):
    def __init__(self, message: str, status_code: int | None) -> None:
        super().__init__(message)
        self.status_code = status_code


def _form(entry: dict[str, Any], form: str) -> object:
    if form == "string":
        return entry["message"]
    return StatusError(entry["message"], entry.get("http_status"))


def _scores(entries: list[dict[str, Any]], form: str) -> tuple[int, int, int, int]:
    tp = fp = fn = tn = 0
    for entry in entries:
        predicted = classify_error(_form(entry, form)) in OVERFLOW_KINDS
        tp += predicted and entry["is_overflow"]
        fp += predicted and not entry["is_overflow"]
        fn += not predicted and entry["is_overflow"]
        tn += not predicted and not entry["is_overflow"]
    return tp, fp, fn, tn


def _ratio(a: int, b: int) -> str:
    return f"{a / b:.3f}" if b else "n/a"


def report(entries: list[dict[str, Any]], path: Path) -> str:
    clear = [e for e in entries if not e.get("ambiguous")]
    lines = [f"Data: `{path.name}`, {len(entries)} errors ({len(clear)} unambiguous, "
             f"{sum(e['is_overflow'] for e in clear)} of them overflows).", "",
             "| labels | input form | TP | FP | FN | TN | precision | recall |",
             "|---|---|---|---|---|---|---|---|"]
    for label, subset in (("unambiguous", clear), ("all (incl. ambiguous)", entries)):
        for form in ("string", "exception + status"):
            tp, fp, fn, tn = _scores(subset, form)
            lines.append(f"| {label} | {form} | {tp} | {fp} | {fn} | {tn} | "
                         f"{_ratio(tp, tp + fp)} | {_ratio(tp, tp + fn)} |")
    kinds_ok = sum(classify_error(_form(e, "status")) in ACCEPTED[e["kind"]] for e in clear)
    stated = recovered = 0
    for entry in entries:
        info = parse_overflow(_form(entry, "status"))
        for key, value in (entry.get("tokens") or {}).items():
            stated += 1
            recovered += info is not None and getattr(info, TOKEN_FIELDS[key]) == value
    lines += ["", f"- kind agrees with the label (unambiguous, exception form): "
              f"{kinds_ok}/{len(clear)}",
              f"- stated token numbers recovered by `parse_overflow`: {recovered}/{stated}"]
    wrong = [(i, e) for i, e in enumerate(entries)
             if (classify_error(_form(e, "status")) in OVERFLOW_KINDS) != e["is_overflow"]]
    for i, entry in wrong:
        tag = "ambiguous" if entry.get("ambiguous") else "UNAMBIGUOUS"
        verdict = "missed" if entry["is_overflow"] else "false alarm"
        lines.append(f"- {verdict} ({tag}) #{i} {entry['provider']}: `{entry['message'][:80]}`")
    timings = []
    for _ in range(5):
        started = time.perf_counter()
        for entry in entries:
            classify_error(_form(entry, "status"))
        timings.append((time.perf_counter() - started) / len(entries) * 1e6)
    lines.append(f"- time per `classify_error` (exception form, median of 5 passes): "
                 f"{statistics.median(timings):.0f} µs")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data",
                        help="folder holding overflow_errors.dev.json")
    parser.add_argument("--selfhosted", type=Path,
                        default=ROOT / "tests" / "data" / "overflow_errors_selfhosted.json",
                        help="the self-hosted servers' labelled errors")
    parser.add_argument("--issues", type=Path,
                        default=ROOT / "tests" / "data" / "overflow_errors_issues.json",
                        help="errors quoted in public issue threads")
    args = parser.parse_args(argv)
    found = 0
    for title, path in (("Kit corpus", args.data / "overflow_errors.dev.json"),
                        ("Self-hosted servers and gateways", args.selfhosted),
                        ("Quoted in issue threads", args.issues)):
        if not path.exists():  # each corpus is optional; report the ones present
            print(f"no labelled errors at {path}", file=sys.stderr)
            continue
        found += 1
        print(f"## {title}\n\n{report(json.loads(path.read_text(encoding='utf-8')), path)}\n")
    return 0 if found else 2


if __name__ == "__main__":
    raise SystemExit(main())
