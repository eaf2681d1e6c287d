"""The fake LLM of the worker benchmark, in its own process (its CPU is accounted apart)."""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import openai
from _timing import proc_cpu

from workers.harness.fakes.counting import char_counter
from workers.harness.fakes.openai_server import FakeOpenAIServer
from workers.harness.fakes.summaries import SummarizerResponder

SUMMARIZER_MODEL = "gpt-4o-mini"


# -- the fake LLM in its own process -----------------------------------------------------
def _serve_fake(conn: multiprocessing.connection.Connection, latency: float,
                counter_name: str) -> None:
    """Child process: a FakeOpenAIServer answering summaries; commands over the pipe."""
    counter = char_counter() if counter_name == "chars" else None
    server = FakeOpenAIServer(window=4_000_000, responder=SummarizerResponder(),
                              counter=counter, latency=latency)
    with server:
        conn.send(server.base_url)
        while True:
            command, arg = conn.recv()
            if command == "stop":
                break
            if command == "latency":
                server.latency = float(arg)
                conn.send(True)
            elif command == "reset":
                server.reset()
                conn.send(True)
            elif command == "count":
                conn.send(sum(1 for r in server.requests if r.path.endswith("/completions")))
            elif command == "stats":
                chats = [r for r in server.requests if r.path.endswith("/completions")]
                conn.send(([r.timestamp for r in chats], [r.status for r in chats],
                           [r.prompt_tokens or 0 for r in chats]))
    conn.close()


@dataclass
class FakeLLM:
    """Handle on the fake server process."""

    process: multiprocessing.process.BaseProcess
    conn: multiprocessing.connection.Connection
    base_url: str
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ask(self, command: str, arg: Any = None) -> Any:
        with self.lock:
            self.conn.send((command, arg))
            return self.conn.recv()

    def cpu(self) -> float:
        return proc_cpu(self.process.pid or 0)


@contextmanager
def fake_llm(latency: float) -> Iterator[FakeLLM]:
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=_serve_fake, args=(child, latency, "chars"), daemon=True)
    process.start()
    base_url = parent.recv()
    fake = FakeLLM(process, parent, base_url)
    try:
        yield fake
    finally:
        with suppress(OSError, EOFError):
            parent.send(("stop", None))
        process.join(10)
        if process.is_alive():
            process.kill()


def fake_capacity(fake: FakeLLM, request: list[dict[str, str]], clients: int,
                  seconds: float) -> tuple[float, int]:
    """Requests/s the fake serves to ``clients`` concurrent SDK clients (this process)."""
    client = openai.OpenAI(base_url=fake.base_url, api_key="bench", max_retries=0, timeout=30)
    deadline = time.monotonic() + seconds
    done = [0] * clients

    def loop(i: int) -> None:
        while time.monotonic() < deadline:
            client.chat.completions.create(
                model=SUMMARIZER_MODEL, messages=request,  # type: ignore[arg-type]
                max_tokens=2000)
            done[i] += 1

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(loop, range(clients)))
    wall = time.perf_counter() - started
    return sum(done) / wall, sum(done)
