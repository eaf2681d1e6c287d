"""How often the change feed learns of a write only after the writer got its reply.

Redis queues the broadcast push before the writer's reply, but the two leave on
different connections; the guard skips its read on what the feed says, so a push
that arrives after the reply means a call made at once after that write could
serve the view without it (``prepare(min_length=)`` covers the hand-over case).

For each transport (TCP on 127.0.0.1, a Unix socket) and background (quiet; busy:
another client writing to another session of the same prefix without pause; paused:
``CLIENT PAUSE 5 WRITE`` every 7 ms, as a failover holds writes), the
script writes N times from a second client and checks the feed right after each
reply. It reports how many pushes were late and by how much (spinning on the
feed until the push shows). It starts a redis-server of its own.

    .venv/bin/python scripts/bench_feed_order.py --writes 20000 --runs 3
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import redis
from _timing import loadavg

from shared.store.changes import CHANGED, ChangeFeed
from workers.harness.stack.redis_server import start_server

PREFIX = "order:"


def busy_writer(kwargs: dict[str, object], stop: threading.Event) -> None:
    client = redis.Redis(**kwargs)  # type: ignore[arg-type]
    i = 0
    while not stop.is_set():
        client.hset(f"{PREFIX}{{t:other}}:state", "i", i)
        i += 1
    client.close()


def pauser(kwargs: dict[str, object], stop: threading.Event) -> None:
    """Writes held for 5 ms every 7 ms, server-wide (as Redis's own FAILOVER holds them)."""
    client = redis.Redis(**kwargs)  # type: ignore[arg-type]
    while not stop.is_set():
        client.execute_command("CLIENT", "PAUSE", 5, "WRITE")
        time.sleep(0.007)
    client.close()


BACKGROUNDS = {"quiet": None, "busy": busy_writer, "paused": pauser}


def one_run(kwargs: dict[str, object], feed_kwargs: dict[str, object], conn_class: str,
            writes: int, background: str) -> list[float]:
    """The lateness (µs) of each push that arrived after its writer's reply."""
    feed = ChangeFeed(feed_kwargs, PREFIX, connection_class=conn_class)
    writer = redis.Redis(**kwargs)  # type: ignore[arg-type]
    stop = threading.Event()
    target = BACKGROUNDS[background]
    noise = threading.Thread(target=target, args=(kwargs, stop), daemon=True)
    if target is not None:
        noise.start()
    late: list[float] = []
    try:
        for i in range(writes):
            base = f"{PREFIX}{{t:s{i % 64}}}"
            mark = feed.mark()
            if mark is None:
                raise RuntimeError("the change feed is unavailable on this server")
            writer.hset(f"{base}:state", "i", i)
            if feed.since(base, mark) == CHANGED:
                continue
            t0 = time.perf_counter()
            while feed.since(base, mark) != CHANGED and time.perf_counter() - t0 < 0.05:
                pass
            late.append((time.perf_counter() - t0) * 1e6)
    finally:
        stop.set()
        if target is not None:
            noise.join()
        writer.close()
        feed.close()
    return late


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writes", type=int, default=20_000, help="writes per run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--paused-writes", type=int, default=2_000,
                        help="writes per run while writes are paused (each waits ~5 ms)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sock = str(Path(tmp) / "redis.sock")
        server = start_server("--unixsocket", sock, "--unixsocketperm", "700")
        try:
            tcp = {"host": "127.0.0.1", "port": server.port, "db": 0, "socket_timeout": 5}
            unix = {"unix_socket_path": sock, "db": 0, "socket_timeout": 5}
            transports = (("TCP", tcp, tcp, "Connection"),
                          ("Unix socket", unix, {"path": sock, "db": 0},
                           "UnixDomainSocketConnection"))
            print(f"load average before: {loadavg()}; {args.runs} runs of "
                  f"{args.writes:,} writes each\n")
            print("| transport | background | late pushes | per run | lateness, µs |")
            print("|---|---|---|---|---|")
            for name, kwargs, feed_kwargs, cls in transports:
                for background in BACKGROUNDS:
                    writes = args.paused_writes if background == "paused" else args.writes
                    runs = [one_run(kwargs, feed_kwargs, cls, writes, background)
                            for _ in range(args.runs)]
                    late = sorted(x for run in runs for x in run)
                    span = f"{late[0]:.0f}-{late[-1]:.0f}" if late else "-"
                    print(f"| {name} | {background} | "
                          f"{len(late)} of {writes * args.runs:,} | "
                          f"{', '.join(str(len(r)) for r in runs)} | {span} |")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
