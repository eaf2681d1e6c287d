"""How much load the fake provider servers take, printed as markdown.

Worker tests run Celery thread pools against the fakes, so the fakes must not
be the bottleneck: this measures (1) 32 concurrent real-SDK clients against a
fixed per-request latency (does the latency overlap?), (2) raw throughput with
no latency, and (3) the cost of the default o200k prompt count on real
sessions (the fake counts every request).

    .venv/bin/python scripts/bench_fakes.py [--data ../shared/data]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import statistics
import time
from pathlib import Path
from typing import Any

import _timing  # noqa: F401  (puts this checkout first on sys.path)
import openai

from workers.harness.fakes import FakeOpenAIServer, char_counter, default_counter
from workers.harness.transcripts import DATA_DIR


def _client(server: FakeOpenAIServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="bench", max_retries=0, timeout=30)


def concurrent_calls(threads: int, calls: int, latency: float) -> tuple[float, float]:
    """Wall seconds and requests per second for ``calls`` requests over ``threads`` threads."""
    with FakeOpenAIServer(counter=char_counter(), latency=latency) as server:
        client = _client(server)

        def one(i: int) -> Any:
            return client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": f"ping {i}"}]
            )

        started = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, range(calls)))
        wall = time.perf_counter() - started
    return wall, calls / wall


def counting_cost(transcripts: Path) -> tuple[int, float, float] | None:
    """Sessions counted, median ms per session and the largest session's tokens."""
    tokenizer = transcripts.parent / "tokenizers" / "o200k_base.tiktoken"
    if not transcripts.exists() or not tokenizer.exists():
        return None
    counter = default_counter(str(tokenizer))
    sessions = [json.loads(line) for line in transcripts.read_text(encoding="utf-8").splitlines()]
    times: list[float] = []
    largest = 0
    for session in sessions:
        started = time.perf_counter()
        tokens = counter(session["messages"], None)
        times.append((time.perf_counter() - started) * 1000)
        largest = max(largest, tokens)
    return len(sessions), statistics.median(times), float(largest)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_data = DATA_DIR
    parser.add_argument("--data", type=Path, default=default_data)
    args = parser.parse_args()

    print("| scenario | requests | wall (s) | requests/s |")
    print("|---|---|---|---|")
    for threads, calls, latency in ((32, 32, 0.2), (32, 320, 0.2), (32, 2000, 0.0), (1, 500, 0.0)):
        wall, rate = concurrent_calls(threads, calls, latency)
        label = f"{threads} threads, {latency * 1000:.0f} ms latency"
        print(f"| {label} | {calls} | {wall:.2f} | {rate:.0f} |")
    cost = counting_cost(args.data / "transcripts.dev.jsonl")
    print()
    if cost is None:
        print(f"(o200k counting cost skipped: no transcripts/tokenizer under {args.data})")
    else:
        sessions, median_ms, largest = cost
        print(f"o200k prompt count per request: median {median_ms:.1f} ms over {sessions} real "
              f"sessions (largest {largest:.0f} tokens).")


if __name__ == "__main__":
    main()
