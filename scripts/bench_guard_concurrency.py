"""Many agents in one process: the async guard on one loop, the sync guard on threads.

What a server with hundreds of conversations sees, against a real Redis (a redis-server
of the script's own by default, so its client counts are this process's alone):

- ``async``: ``--tasks`` agent tasks on one event loop over ``--sessions`` sessions, each
  doing ``--turns`` turns of the agent loop (``prepare`` -> simulated LLM latency with
  ``asyncio.sleep`` -> ``record_turn``) on one :class:`AsyncContextGuard` over
  ``connect_async``. Prints errors by type, p50/p99/max of ``prepare`` and
  ``record_turn``, the peak of Redis's ``connected_clients`` (sampled every 10 ms, less
  the sampler's own), the pool's connections, the loop's lag (a 1 ms ticker: how late it
  woke), and the RSS growth.
- ``exhausted``: the pool bounded and Redis stopped (SIGSTOP) under ``--tasks`` calls:
  how long until each call fails, and with which error (a typed StoreUnavailable, or a
  hang).
- ``threads``: one :class:`ContextGuard` over ``connect`` shared by 1, 8, 64 and 128
  threads (``--threads``), each running the same agent loop with no latency (the
  guard's throughput: turns/s) and then with latency (connections opened).

Run: ``python scripts/bench_guard_concurrency.py`` (``--url redis://host:port/db`` to use
a running Redis; ``--only async|exhausted|threads``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import redis
import redis.asyncio
from _timing import loadavg, percentile, proc_memory

from shared import AsyncContextGuard, ContextGuard
from shared.core.config import StoreConfig
from shared.store.aio import AsyncSessionStore, connect_async
from shared.store.sessions import SessionStore, connect
from workers.harness.stack.redis_server import RedisServer, start_server

SYSTEM = "You are a helpful agent. " * 20
MODEL = "gpt-4o"


def turn_messages(task: int, i: int) -> tuple[dict[str, Any], dict[str, Any]]:
    user = {"role": "user", "content": f"task {task} turn {i}: " + "please look at this " * 20}
    reply = {"role": "assistant", "content": f"answer {i} " + "here is what I found " * 30}
    return user, reply


class ClientPeak:
    """The peak of Redis's connected_clients, sampled on a thread of its own."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.base = int(self.client.info("clients")["connected_clients"])
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            try:
                now = int(self.client.info("clients")["connected_clients"])
            except redis.RedisError:
                continue
            self.peak = max(self.peak, now)

    def __enter__(self) -> ClientPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.client.close()

    @property
    def opened(self) -> int:
        """Connections above those open before (the sampler's own among them)."""
        return self.peak - self.base


def ms(values: list[float]) -> str:
    if not values:
        return "-"
    return (f"p50 {percentile(values, 50):.2f} p99 {percentile(values, 99):.2f} "
            f"max {max(values):.1f} ms")


def errors_line(errors: Counter[str]) -> str:
    return ", ".join(f"{n} {name}" for name, n in errors.most_common()) or "none"


# -- async ------------------------------------------------------------------------------
async def ticker(stop: asyncio.Event, lags: list[float]) -> None:
    """Sleep 1 ms at a time; how much later than asked each wake came is the loop's lag."""
    while not stop.is_set():
        began = time.perf_counter()
        await asyncio.sleep(0.001)
        lags.append((time.perf_counter() - began) * 1000 - 1.0)


async def async_agents(url: str, prefix: str, tasks: int, sessions: int, turns: int,
                       latency: tuple[float, float], max_connections: int | None,
                       rounds: int = 1) -> None:
    config = StoreConfig(key_prefix=prefix)
    if max_connections == 0:  # --max-connections 0: redis-py's own client, as users build it
        client: Any = redis.asyncio.Redis.from_url(url, socket_timeout=config.socket_timeout,
                                                   socket_connect_timeout=config.connect_timeout)
    else:
        client = (connect_async(url, config) if max_connections is None
                  else connect_async(url, config, max_connections=max_connections))
    store = AsyncSessionStore(client, config)
    guard = AsyncContextGuard(store)
    await guard.warm_up()
    prepare_ms: list[float] = []
    record_ms: list[float] = []
    errors: Counter[str] = Counter()
    lags: list[float] = []
    rng = random.Random(1)

    async def agent(task: int) -> None:
        sid = f"s{task % sessions}"
        for i in range(turns):
            user, reply = turn_messages(task, i)
            try:
                began = time.perf_counter()
                await guard.prepare(sid, SYSTEM, model=MODEL, max_tokens=1000, pending=[user])
                prepare_ms.append((time.perf_counter() - began) * 1000)
                await asyncio.sleep(rng.uniform(*latency))
                began = time.perf_counter()
                await guard.record_turn(sid, [user, reply], request_id=uuid.uuid4().hex)
                record_ms.append((time.perf_counter() - began) * 1000)
            except Exception as exc:  # counted: the figure is how many, and which
                errors[f"{type(exc).__name__}: {str(exc)[:90]}"] += 1

    rss_before = proc_memory(os.getpid())[0]
    stop = asyncio.Event()
    tick = asyncio.create_task(ticker(stop, lags))
    began, cpu = time.perf_counter(), time.process_time()
    with ClientPeak(url) as peak:
        rss_rounds = []
        for _ in range(rounds):
            await asyncio.gather(*(agent(t) for t in range(tasks)))
            rss_rounds.append(proc_memory(os.getpid())[0])
    took, cpu = time.perf_counter() - began, time.process_time() - cpu
    stop.set()
    await tick
    rss_after = proc_memory(os.getpid())[0]
    pool = client.connection_pool
    bound = getattr(pool, "max_connections", None)
    print(f"  {rounds} x {tasks} tasks x {turns} turns over {sessions} sessions, latency "
          f"{latency[0] * 1000:.0f}-{latency[1] * 1000:.0f} ms, pool bound {bound}: "
          f"{took:.1f} s, {len(record_ms) / took:.0f} turns/s recorded, process CPU "
          f"{cpu * 1000 / max(len(record_ms), 1):.2f} ms a turn")
    print(f"  errors: {errors_line(errors)}")
    print(f"  prepare     {ms(prepare_ms)}")
    print(f"  record_turn {ms(record_ms)}")
    print(f"  loop lag    {ms(lags)} ({len(lags)} ticks)")
    print(f"  connections: {made(client)} made by the pool, {peak.opened} open at the "
          "peak sampled; "
          f"RSS +{rss_after - rss_before:.1f} MiB (after each round: "
          f"{', '.join(f'{r:.0f}' for r in rss_rounds)} MiB)")
    await guard.aclose()
    await store.aclose()


async def async_exhausted(server: RedisServer, prefix: str, tasks: int) -> None:
    """Redis stopped with ``tasks`` calls on a pool of 10: each fails, how and when."""
    assert server.process is not None
    config = StoreConfig(key_prefix=prefix)
    store = AsyncSessionStore(connect_async(server.url, config, max_connections=10), config)
    guard = AsyncContextGuard(store, watch_changes=False)
    await guard.warm_up()
    await guard.record_turn("x", list(turn_messages(0, 0)))
    os.kill(server.process.pid, signal.SIGSTOP)
    done: list[tuple[float, str]] = []

    async def call(task: int) -> None:
        began = time.perf_counter()
        try:
            await guard.record_turn(f"e{task % 50}", list(turn_messages(task, 0)))
            done.append(((time.perf_counter() - began) * 1000, "ok"))
        except Exception as exc:
            done.append(((time.perf_counter() - began) * 1000, type(exc).__name__))

    try:
        await asyncio.wait_for(asyncio.gather(*(call(t) for t in range(tasks))), 30)
        hung = 0
    except TimeoutError:
        hung = tasks - len(done)
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    kinds = Counter(kind for _, kind in done)
    print(f"  pool of 10, Redis stopped, {tasks} record_turn calls: {errors_line(kinds)}; "
          f"{hung} still waiting after 30 s; time to fail {ms([t for t, _ in done])}")
    await guard.aclose()
    await store.aclose()


# -- threads ----------------------------------------------------------------------------
def thread_agents(guard: ContextGuard, threads: int, sessions: int, turns: int,
                  latency: tuple[float, float]) -> tuple[float, Counter[str], list[float],
                                                         list[float]]:
    errors: Counter[str] = Counter()
    prepare_ms: list[float] = []
    record_ms: list[float] = []
    lock = threading.Lock()
    start = threading.Barrier(threads + 1)

    def agent(task: int) -> None:
        rng = random.Random(task)
        sid = f"t{task % sessions}"
        mine_p: list[float] = []
        mine_r: list[float] = []
        start.wait()
        for i in range(turns):
            user, reply = turn_messages(task, i)
            try:
                began = time.perf_counter()
                guard.prepare(sid, SYSTEM, model=MODEL, max_tokens=1000, pending=[user])
                mine_p.append((time.perf_counter() - began) * 1000)
                if latency[1]:
                    time.sleep(rng.uniform(*latency))
                began = time.perf_counter()
                guard.record_turn(sid, [user, reply], request_id=uuid.uuid4().hex)
                mine_r.append((time.perf_counter() - began) * 1000)
            except Exception as exc:
                with lock:
                    errors[f"{type(exc).__name__}: {str(exc)[:90]}"] += 1
        with lock:
            prepare_ms.extend(mine_p)
            record_ms.extend(mine_r)

    workers = [threading.Thread(target=agent, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    start.wait()
    began = time.perf_counter()
    for worker in workers:
        worker.join()
    return time.perf_counter() - began, errors, prepare_ms, record_ms


def threaded(url: str, prefix: str, counts: list[int], sessions: int, turns: int,
             latency: tuple[float, float], max_connections: int | None) -> None:
    for latent in ((0.0, 0.0), latency):
        label = ("no latency (throughput)" if not latent[1]
                 else f"latency {latent[0] * 1000:.0f}-{latent[1] * 1000:.0f} ms")
        print(f"  {label}:")
        for threads in counts:
            config = StoreConfig(key_prefix=f"{prefix}{threads}{int(bool(latent[1]))}")
            client = connect_client(url, config, max_connections)
            guard = ContextGuard(SessionStore(client, config))
            guard.warm_up()
            with ClientPeak(url) as peak:
                took, errors, prep, rec = thread_agents(guard, threads, sessions, turns,
                                                        latent)
            done = len(rec)
            print(f"    {threads:>3} threads: {done / took:7.0f} turns/s, errors "
                  f"{errors_line(errors)}; prepare {ms(prep)}; record_turn {ms(rec)}; "
                  f"connections: {made(client)} made by the pool, {peak.opened} open at the "
                  "peak sampled")
            guard.close()
            client.close()


def made(client: Any) -> int:
    """How many connections the client's pool made (sync or asyncio, redis-py's or ours)."""
    pool = client.connection_pool
    made = getattr(pool, "_connections", None)
    if made is not None:
        return len(made)
    return len(pool._available_connections) + len(pool._in_use_connections)


def connect_client(url: str, config: StoreConfig, max_connections: int | None) -> Any:
    if max_connections is None:
        return connect(url, config)
    return connect(url, config, max_connections=max_connections)


@contextmanager
def redis_for(url: str | None) -> Iterator[tuple[str, RedisServer | None]]:
    if url:
        yield url, None
        return
    server = start_server("--maxclients", "20000")
    try:
        yield server.url, server
    finally:
        server.remove()


def cleanup(url: str, prefix: str) -> None:
    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    for i in range(0, len(keys), 500):
        client.delete(*keys[i:i + 500])
    client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running Redis (default: start one of our own)")
    parser.add_argument("--only", choices=["async", "exhausted", "threads"])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--sessions", type=int, default=300)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1,
                        help="async: run the tasks this many times (memory growth)")
    parser.add_argument("--latency-ms", type=float, nargs=2, default=(5.0, 50.0))
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 8, 64, 128])
    parser.add_argument("--max-connections", type=int, default=None,
                        help="the pool's bound (default: the connector's default; async: 0 "
                        "for redis.asyncio.Redis.from_url(url), redis-py's own pool)")
    args = parser.parse_args()
    latency = (args.latency_ms[0] / 1000, args.latency_ms[1] / 1000)
    prefix = f"bcc{uuid.uuid4().hex[:6]}"
    runs: dict[str, Callable[[str, RedisServer | None], None]] = {
        "async": lambda url, _: asyncio.run(async_agents(
            url, f"{prefix}a", args.tasks, args.sessions, args.turns, latency,
            args.max_connections, args.rounds)),
        "exhausted": lambda _, server: asyncio.run(async_exhausted(
            server, f"{prefix}e", args.tasks)) if server else print(
            "  skipped: needs a Redis of the script's own (no --url)"),
        "threads": lambda url, _: threaded(url, f"{prefix}t", args.threads,
                                           args.sessions, args.turns, latency,
                                           args.max_connections),
    }
    print(f"load average before: {loadavg()}")
    with redis_for(args.url) as (url, server):
        try:
            for name, run in runs.items():
                if args.only in (None, name):
                    print(f"{name}:")
                    run(url, server)
        finally:
            cleanup(url, prefix)
    print(f"load average after: {loadavg()}")


if __name__ == "__main__":
    main()
