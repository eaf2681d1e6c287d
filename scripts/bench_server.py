"""``compaction serve`` over a real socket: prepare latency at 10k messages, requests/s.

What it measures (a real uvicorn process on loopback, one worker process,
the real Redis; an httpx client with keep-alive):

- *prepare, warm*: ``POST /v1/sessions/{id}/prepare`` on a 10,000-message
  session (real transcripts from ``shared/data/transcripts.dev.jsonl``
  concatenated, system messages dropped; a summary committed at a turn
  boundary ~60 messages before the end, as a worker would leave it),
  nothing appended between calls;
- *agent loop*: record a turn (user + assistant), then prepare, repeated:
  the latency of each prepare (it reads and decodes the appended turn) and
  of each record, and the requests per second of the loop;
- *concurrent loop*: the same with ``--clients`` threads, each on its own
  copy of the session: requests per second of the one server process;
- *in-process*: ``guard.prepare`` on the same session without HTTP, for the
  share of the figure that is HTTP, JSON and FastAPI.

Keys use a unique prefix and are deleted at the end; the server publishes
its jobs to ``memory://`` (no worker consumes them here).

    .venv/bin/python scripts/bench_server.py [--redis-url redis://127.0.0.1:6379/0]
        [--messages 10000] [--calls 2000] [--clients 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shared.core.config import StoreConfig
from shared.core.messages import Message
from shared.core.records import SummaryRecord
from shared.core.tokens import DEFAULT_COUNTER
from shared.core.turns import turn_starts
from shared.core.view import summary_block
from shared.core.wire import from_openai
from shared.guard import ContextGuard
from shared.store.sessions import SessionStore
from workers.server.process import ServerProcess

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "transcripts.dev.jsonl"
TOKEN = "bench-token-" + uuid.uuid4().hex
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TENANT = "bench"
SYSTEM = "You are a careful agent. Use the tools; keep answers short."
RECENT = 60  # messages after the summary's watermark


def transcripts(path: Path) -> list[list[Message]]:
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            messages = from_openai(json.loads(line)["messages"])
            out.append([m for m in messages if m.role != "system"])
    return out


def session_messages(n: int, path: Path) -> list[Message]:
    """Real sessions concatenated (repeated as needed), cut at a turn start to ~``n``."""
    sessions = transcripts(path)
    out: list[Message] = []
    while len(out) < n:
        for s in sessions:
            out.extend(s)
            if len(out) >= n:
                break
    starts = [i for i in turn_starts(out) if i <= n]
    return out[: starts[-1] if starts and starts[-1] > n * 0.95 else n]


def build(store: SessionStore, sid: str, messages: list[Message]) -> int:
    """Append in chunks, commit a summary ~RECENT messages before the end; the watermark."""
    for i in range(0, len(messages), 500):
        store.append(sid, messages[i:i + 500])
    watermark = max(i for i in turn_starts(messages) if i <= len(messages) - RECENT)
    text = ("## Goal\nResolve the customers' requests per policy.\n## Progress\n"
            + "\n".join(f"- handled request {k}" for k in range(40)))
    record = SummaryRecord(watermark=watermark, kind="llm", text=text, tokens=0)
    record = record.model_copy(update={"tokens": DEFAULT_COUNTER.text(summary_block(record))})
    result = store.commit_summary(sid, record, store.state(sid).version)
    if not result.ok:
        raise SystemExit(f"summary commit failed: {result.reason}")
    return watermark


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, int(-(-q * len(ordered) // 100)) - 1))]


def ms(values: list[float]) -> str:
    return (f"{statistics.median(values):.2f} | {pct(values, 95):.2f} | {pct(values, 99):.2f} | "
            f"{max(values):.2f}")


def turn(k: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"Next, check booking #{k} and tell me its status."},
            {"role": "assistant", "content": f"Booking #{k} is confirmed for May {k % 28 + 1}."}]


PENDING: list[dict[str, Any]] = [{"role": "user", "content": "What next?"}]
PREPARE = {"system_prompt": SYSTEM, "model": "gpt-4o", "max_tokens": 1024, "pending": PENDING}


def warm_prepares(http: httpx.Client, sid: str, calls: int,
                  failed: list[str] | None = None) -> list[float]:
    out = []
    for _ in range(calls):
        t = time.perf_counter()
        r = http.post(f"/v1/sessions/{sid}/prepare", json=PREPARE, headers=AUTH)
        out.append((time.perf_counter() - t) * 1000)
        if r.status_code != 200 and failed is not None:
            failed.append(f"prepare {r.status_code} {r.json()['error']['code']}")
    return out


def loop(http: httpx.Client, sid: str, calls: int, start: int = 0
         ) -> tuple[list[float], list[float], float, list[str]]:
    """record + prepare, ``calls`` times: (prepare ms, record ms, wall s, failures)."""
    prep, rec, failed = [], [], []
    began = time.perf_counter()
    for k in range(start, start + calls):
        t = time.perf_counter()
        r = http.post(f"/v1/sessions/{sid}/record", json={"messages": turn(k)}, headers=AUTH)
        rec.append((time.perf_counter() - t) * 1000)
        if r.status_code != 200:  # e.g. 503 when Redis misses its socket timeout
            failed.append(f"record {r.status_code} {r.json()['error']['code']}")
        t = time.perf_counter()
        r = http.post(f"/v1/sessions/{sid}/prepare", json=PREPARE, headers=AUTH)
        prep.append((time.perf_counter() - t) * 1000)
        if r.status_code != 200:
            failed.append(f"prepare {r.status_code} {r.json()['error']['code']}")
        elif not r.json()["report"]["budget"]["within_budget"]:
            raise SystemExit("the view went over budget: the benchmark's session is wrong")
    return prep, rec, time.perf_counter() - began, failed


def concurrent(url: str, sids: list[str], calls: int
               ) -> tuple[float, list[float], list[str]]:
    """Each thread runs the loop on its own session: (requests/s, prepare ms, failures)."""
    results: list[tuple[list[float], list[float], float, list[str]]] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(sids))

    def worker(sid: str) -> None:
        with httpx.Client(base_url=url, timeout=30) as http:
            http.post(f"/v1/sessions/{sid}/prepare", json=PREPARE, headers=AUTH)
            barrier.wait()
            try:
                results.append(loop(http, sid, calls, start=100_000))
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in sids]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - began
    prepares = [x for r in results for x in r[0]]
    failed = [f for r in results for f in r[3]] + [repr(e) for e in errors]
    return 2 * calls * len(results) / wall, prepares, failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--socket-timeout", type=float, default=None,
                        help="the server's COMPACTION_REDIS_SOCKET_TIMEOUT (default: 0.5 s)")
    args = parser.parse_args()

    prefix = f"bsrv_{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(args.redis_url)
    store = SessionStore(client, StoreConfig(key_prefix=prefix), tenant=TENANT)
    messages = session_messages(args.messages, args.data)
    sids = ["s0", *(f"c{i}" for i in range(args.clients))]
    t = time.perf_counter()
    watermark = 0
    for sid in sids:
        watermark = build(store, sid, messages)
    print(f"built {len(sids)} sessions of {len(messages)} messages (watermark {watermark}) "
          f"in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    env = {"COMPACTION_REDIS_URL": args.redis_url, "COMPACTION_KEY_PREFIX": prefix,
           "COMPACTION_BROKER_URL": "memory://",
           "COMPACTION_SERVER_TOKENS": json.dumps({TOKEN: TENANT}),
           "COMPACTION_SERVER_MAX_BODY_BYTES": str(16 * 1024 * 1024)}
    if args.socket_timeout is not None:
        env["COMPACTION_REDIS_SOCKET_TIMEOUT"] = str(args.socket_timeout)
    try:
        with ServerProcess(env) as server, \
                httpx.Client(base_url=server.url, timeout=30) as http:
            cold_t = time.perf_counter()
            first = http.post("/v1/sessions/s0/prepare", json=PREPARE, headers=AUTH)
            cold = (time.perf_counter() - cold_t) * 1000
            first.raise_for_status()
            report = first.json()["report"]
            warm_prepares(http, "s0", 200)  # warm-up
            wfailed: list[str] = []
            warm = warm_prepares(http, "s0", args.calls, wfailed)
            prep, rec, wall, failed = loop(http, "s0", args.calls)
            failed += wfailed
            rps, cprep, cfailed = concurrent(server.url, sids[1:], args.calls // 2)

        guard = ContextGuard(store)
        guard.prepare("s0", SYSTEM, None, 1024, "gpt-4o", pending=PENDING)
        local = []
        for _ in range(args.calls):
            t = time.perf_counter()
            guard.prepare("s0", SYSTEM, None, 1024, "gpt-4o", pending=PENDING)
            local.append((time.perf_counter() - t) * 1000)
    finally:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i:i + 500])

    print(f"### `compaction serve`: {len(messages)}-message session, {report['length']} in the "
          f"log, {len(messages) - watermark} after the watermark\n")
    print(f"uvicorn, 1 process, loopback; httpx keep-alive; {args.calls} calls per row; "
          f"{os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}\n")
    print("| what | median ms | p95 | p99 | max |\n|---|---|---|---|---|")
    print(f"| prepare, warm (HTTP) | {ms(warm)} |")
    print(f"| prepare after a recorded turn (HTTP) | {ms(prep)} |")
    print(f"| record a turn (HTTP) | {ms(rec)} |")
    print(f"| prepare, {args.clients} concurrent clients (HTTP) | {ms(cprep)} |")
    print(f"| guard.prepare in-process, warm | {ms(local)} |")
    print(f"\nfirst (cold) prepare over HTTP: {cold:.1f} ms; view sent: "
          f"{report['estimated_prompt_tokens']} tokens\n")
    print("| loop (record + prepare) | requests/s | failed requests |\n|---|---|---|")
    print(f"| 1 client | {2 * args.calls / wall:.0f} | {len(failed)} |")
    print(f"| {args.clients} clients | {rps:.0f} | {len(cfailed)} |")
    for what in sorted(set(failed + cfailed)):
        print(f"\nfailed requests: {what} x{(failed + cfailed).count(what)}")


if __name__ == "__main__":
    main()
