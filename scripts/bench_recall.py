"""Recall figures: quality on real sessions compacted by the real worker path, and scale.

1. Quality and fidelity. Every dev session (``transcripts.dev.jsonl``) is fed in
   20 chunks; after each chunk the real :class:`Compactor` (offline summarizer)
   runs a manual compaction, and its post-commit hook indexes the range. Probes
   are built deterministically from the compacted range: the fact ledger's
   paths, identifiers, numbers, commands and URLs (``extract_facts``) plus error
   lines of tool results, each kept only if it occurs verbatim in at most 3
   messages (the targets: in a message's text, its tool calls' raw JSON arguments,
   or a string value of them: the ledger reads the decoded values, so a command
   holding a ``\\n`` is verbatim in a call that wrote it into a file too). A
   probe is answered by recall@k when a target is in the top k; by the view
   alone when the text is verbatim in the current summary block (summary plus
   ledger). Fidelity is reported after 1, 5 and 20
   compactions, over the probes of the range compacted so far.
2. Scale. Sessions of N messages (dev messages cycled, each copy tagged) are
   indexed through ``index_compacted``; query latency p50/p99 over probe texts,
   index bytes per message (``MEMORY USAGE`` of every index key), indexing cost.

    PYTHONPATH=. .venv/bin/python scripts/bench_recall.py [--scale 10000 100000]
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import secrets
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

import workers.compactor as compactor_module
from shared.core.config import StoreConfig
from shared.core.errors import InvalidInput
from shared.core.facts import extract_facts
from shared.core.messages import Message
from shared.core.recall import index_text, validate_query
from shared.core.records import SummaryRecord
from shared.store.recall_index import IndexReport, drop_index, index_compacted
from shared.store.recall_query import recall
from shared.store.sessions import SessionStore
from workers.compactor import Compactor
from workers.harness.replay.sessions import load_sessions
from workers.summarizer.engine import SummaryEngine

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "transcripts.dev.jsonl"
KINDS = ("path", "identifier", "number", "command", "url")
CHUNKS = 20
CHECKPOINTS = (1, 5, 20)
MAX_TARGETS = 3
REPEATS = 3
_ERROR_LINE = re.compile(r"^.*(?:Error|error:|ERROR|Exception|FAILED|Traceback|errno).*$",
                         re.M)


# -- timing (scripts/_timing.py did not exist when this was written) -------------------
def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    k = (len(ordered) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    result = fn()
    return result, (time.perf_counter() - started) * 1000


# -- probes ----------------------------------------------------------------------------
def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    return [s for v in value for s in _strings(v)] if isinstance(value, list) else []


def verbatim_texts(message: Message) -> list[str]:
    """Where a probe counts as verbatim in ``message``: its index text (the raw JSON of
    its tool calls' arguments) and every string value of those arguments, decoded."""
    out = [index_text(message)]
    for call in message.tool_calls:  # always a JSON object (ToolCall validates it)
        out += _strings(json.loads(call.arguments))
    return out

@dataclass(frozen=True, slots=True)
class Probe:
    kind: str
    text: str
    targets: frozenset[int]


def build_probes(messages: Sequence[Message], end: int) -> list[Probe]:
    """Deterministic probes of messages ``[0, end)``: distinctive facts and error lines."""
    texts = [index_text(m) for m in messages[:end]]
    verbatim = [verbatim_texts(m) for m in messages[:end]]
    candidates: list[tuple[str, str]] = []
    ledger = extract_facts(messages[:end])
    candidates += [(f.kind, f.text) for f in ledger.facts if f.kind in KINDS]
    for m, text in zip(messages[:end], texts, strict=True):
        if m.role == "tool":
            candidates += [("error", line.strip()[:160]) for line in _ERROR_LINE.findall(text)
                           if len(line.strip()) >= 12]
    probes: dict[str, Probe] = {}
    for kind, text in candidates:
        if text in probes:
            continue
        try:
            validate_query(text)
        except InvalidInput:
            continue  # nothing searchable (a bare symbol): not a recall question
        targets = frozenset(i for i, texts_i in enumerate(verbatim)
                            if any(text in t for t in texts_i))
        if 0 < len(targets) <= MAX_TARGETS:
            probes[text] = Probe(kind, text, targets)
    return list(probes.values())


# -- part 1: real worker path ------------------------------------------------------------
@dataclass
class Quality:
    probes: int = 0
    at1: int = 0
    at5: int = 0
    by_kind: dict[str, list[int]] = field(default_factory=dict)
    fidelity: dict[int, list[int]] = field(default_factory=dict)  # c -> [probes, view, both]
    sessions_at: dict[int, int] = field(default_factory=dict)
    index_ms: list[float] = field(default_factory=list)
    index_messages: list[int] = field(default_factory=list)
    compactions: int = 0


def chunks(n: int, parts: int) -> list[tuple[int, int]]:
    bounds = [round(i * n / parts) for i in range(parts + 1)]
    return [(a, b) for a, b in itertools.pairwise(bounds) if b > a]


def view_text(store: SessionStore, sid: str) -> str:
    state = store.state(sid)
    record = store.summary(sid, state.watermark) if state.watermark else None
    return record.injected_text() if record else ""


def quality(client: redis.Redis, data: Path, sessions: int | None, prefix: str) -> Quality:
    out = Quality()
    reports: list[IndexReport] = []
    hooks = vars(compactor_module)  # the compactor's post-commit hook calls this name
    real: Callable[..., IndexReport] = hooks["index_compacted"]

    def recorded(store: SessionStore, session_id: str, end: int | None = None) -> IndexReport:
        report = real(store, session_id, end)
        reports.append(report)
        return report

    hooks["index_compacted"] = recorded  # the real hook, timed
    store = SessionStore(client, StoreConfig(key_prefix=prefix))
    compactor = Compactor(store, SummaryEngine(None))
    try:
        for n, session in enumerate(load_sessions(data, limit=sessions).sessions):
            sid = f"q{n}"
            messages = list(session.messages)
            done = 0
            for a, b in chunks(len(messages), CHUNKS):
                store.append(sid, messages[a:b])
                outcome = compactor.run(sid, manual=True, force=True, keep_recent=0)
                if outcome.status != "compacted":
                    continue
                done += 1
                out.compactions += 1
                if done in CHECKPOINTS:
                    _fidelity(out, store, sid, messages, done)
            for c in CHECKPOINTS:
                out.sessions_at[c] = out.sessions_at.get(c, 0) + (done >= c)
            _recall_at_k(out, store, sid, messages)
            drop_index(store, sid)
            store.delete_session(sid)
    finally:
        hooks["index_compacted"] = real
    out.index_ms = [r.ms for r in reports if r.messages]
    out.index_messages = [r.messages for r in reports if r.messages]
    return out


def _fidelity(out: Quality, store: SessionStore, sid: str, messages: list[Message],
              c: int) -> None:
    w = store.state(sid).watermark
    view = view_text(store, sid)
    row = out.fidelity.setdefault(c, [0, 0, 0])
    for probe in build_probes(messages, w):
        in_view = probe.text in view
        hits = recall(store, sid, probe.text, limit=5)
        row[0] += 1
        row[1] += in_view
        row[2] += in_view or any(h.index in probe.targets for h in hits)


def _recall_at_k(out: Quality, store: SessionStore, sid: str, messages: list[Message]) -> None:
    for probe in build_probes(messages, store.state(sid).watermark):
        ranked = [h.index for h in recall(store, sid, probe.text, limit=5)]
        at1 = bool(ranked) and ranked[0] in probe.targets
        at5 = any(i in probe.targets for i in ranked)
        out.probes += 1
        out.at1 += at1
        out.at5 += at5
        kind = out.by_kind.setdefault(probe.kind, [0, 0, 0])
        kind[0] += 1
        kind[1] += at1
        kind[2] += at5


# -- part 2: scale ---------------------------------------------------------------------
@dataclass
class Scale:
    messages: int
    index_s: float
    per_message_us: float
    bytes_per_message: float
    log_bytes_per_message: float
    p50_ms: float
    p99_ms: float
    cpu_p99_ms: float
    best_p99_ms: float
    queries: int
    hit_rate: float


def memory(client: redis.Redis, pattern: str) -> int:
    total, batch = 0, []
    for key in client.scan_iter(match=pattern, count=2000):
        batch.append(key)
        if len(batch) >= 1000:
            total += _usage(client, batch)
            batch = []
    return total + _usage(client, batch)


def _usage(client: redis.Redis, keys: list[Any]) -> int:
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.memory_usage(key, samples=0)
    return sum(int(v or 0) for v in pipe.execute())


def scale(client: redis.Redis, data: Path, n: int, queries: int, prefix: str,
          lag: int = 0) -> Scale:
    """Index size and query latency at ``n`` messages; ``lag``: the newest messages below
    the watermark are left unindexed (an index job still queued), so queries scan them."""
    source = [m for s in load_sessions(data).sessions for m in s.messages]
    store = SessionStore(client, StoreConfig(key_prefix=prefix, max_messages_per_session=n))
    sid = f"scale{n}"
    copies: list[Message] = []
    for i in range(n):
        m = source[i % len(source)]
        tag = f"\n[copy {i // len(source)}]"
        copies.append(m.model_copy(update={"content": m.text() + tag})
                      if isinstance(m.content, str) else m)
    for a in range(0, n, 500):
        store.append(sid, copies[a:a + 500])
    record = SummaryRecord(watermark=n, kind="offline", text="scale", tokens=1)
    assert store.commit_summary(sid, record, store.state(sid).version).ok
    report, ms = timed(lambda: index_compacted(store, sid, n - lag, max_messages=n))
    assert report.end == n - lag, report
    probes = build_probes(source, len(source))
    step = max(1, len(probes) // queries)
    picked = probes[::step][:queries]
    latencies: list[float] = []
    cpu: list[float] = []
    best: list[float] = []  # per query, the fastest of REPEATS runs: scheduling noise removed
    found = 0
    for probe in picked:
        runs = []
        for _ in range(REPEATS):
            started = time.process_time()
            hits, q_ms = timed(lambda p=probe: recall(store, sid, p.text, limit=5))  # type: ignore[misc]
            cpu.append((time.process_time() - started) * 1000)
            runs.append(q_ms)
        latencies.append(runs[0])
        best.append(min(runs))
        found += any(h.index % len(source) in probe.targets for h in hits)
    index_bytes = memory(client, f"{store.keys(sid).recall}:*")
    log_bytes = memory(client, store.keys(sid).log)
    drop_index(store, sid)
    store.delete_session(sid)
    return Scale(n, ms / 1000, ms * 1000 / n, index_bytes / n, log_bytes / n,
                 percentile(latencies, 0.5), percentile(latencies, 0.99),
                 percentile(cpu, 0.99), percentile(best, 0.99), len(picked),
                 found / max(len(picked), 1))


# -- report ----------------------------------------------------------------------------
def pct(a: int, b: int) -> str:
    return f"{a / b:.1%}" if b else "-"


def report_quality(q: Quality) -> None:
    print(f"## Recall quality ({q.compactions} real compactions, offline summarizer)\n")
    print(f"probes {q.probes}: recall@1 {pct(q.at1, q.probes)}, "
          f"recall@5 {pct(q.at5, q.probes)}\n")
    print("| probe kind | probes | recall@1 | recall@5 |\n|---|---|---|---|")
    for kind, (total, a1, a5) in sorted(q.by_kind.items()):
        print(f"| {kind} | {total} | {pct(a1, total)} | {pct(a5, total)} |")
    print("\n| after compactions | sessions | probes | view alone | view + recall |")
    print("|---|---|---|---|---|")
    for c in CHECKPOINTS:
        total, view, both = q.fidelity.get(c, [0, 0, 0])
        print(f"| {c} | {q.sessions_at.get(c, 0)} | {total} | {pct(view, total)} | "
              f"{pct(both, total)} |")
    if q.index_ms:
        print(f"\nindexing per compaction (worker hook): median "
              f"{statistics.median(q.index_ms):.2f} ms, p99 "
              f"{percentile(q.index_ms, 0.99):.2f} ms, for a median of "
              f"{statistics.median(q.index_messages):.0f} messages", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--sessions", type=int, default=None, help="first N dev sessions")
    parser.add_argument("--scale", type=int, nargs="*", default=[10_000, 100_000])
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--lag", type=int, nargs="*", default=[0],
                        help="also measure with the newest N summarized messages not indexed "
                             "yet (queries scan them)")
    parser.add_argument("--skip-quality", action="store_true", help="scale figures only")
    parser.add_argument("--private-redis", action="store_true",
                        help="start a redis-server of its own (a shared one queues our "
                             "commands behind everyone else's)")
    args = parser.parse_args()
    server = None
    if args.private_redis:
        from workers.harness.stack.redis_server import start_server

        server = start_server()
        args.redis = server.url
    client = redis.Redis.from_url(args.redis)
    prefix = "bench" + secrets.token_hex(3)
    try:
        if not args.skip_quality:
            report_quality(quality(client, args.data, args.sessions, prefix))
        print("\n| messages | not indexed | query p50 | query p99 | p99, best of 3 | "
              "client CPU p99 | index bytes/msg | log bytes/msg | indexing | per message | "
              "probe hit@5 |\n|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
        for n, lag in ((n, lag) for n in args.scale for lag in args.lag):
            s = scale(client, args.data, n, args.queries, prefix, lag)
            print(f"| {s.messages:,} | {lag} | {s.p50_ms:.2f} ms | {s.p99_ms:.2f} ms | "
                  f"{s.best_p99_ms:.2f} ms | {s.cpu_p99_ms:.2f} ms | {s.bytes_per_message:,.0f} | "
                  f"{s.log_bytes_per_message:,.0f} | {s.index_s:.1f} s | "
                  f"{s.per_message_us:.0f} us | {s.hit_rate:.1%} ({s.queries} q) |", flush=True)
        load = Path("/proc/loadavg")
        if load.exists():
            print(f"\nload average during the run: {load.read_text().split()[:3]}")
    finally:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=5000))
        for i in range(0, len(keys), 1000):
            client.delete(*keys[i:i + 1000])
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
