"""What one hung Sentinel costs the store's calls.

A Sentinel deployment on loopback (a primary, a replica, three Sentinels: the
harness's); one of the Sentinels is stopped with SIGSTOP, so its port stays open and
nothing answers, as a host that hangs or a network that drops packets would. One
client of the store (``connect_sentinel``, the store's timeouts: 0.5 s) then writes
every 10 ms for ``--seconds``; reported: the calls' p50 / p99 / max and every call
over 5 ms, with its time into the run.

``--no-skip`` asks every Sentinel at every check, as the pool did before a Sentinel
that does not answer was left out for a while (``QUIET_SECONDS``): the baseline.

    PYTHONPATH=. .venv/bin/python scripts/bench_sentinel_hung.py [--seconds 30] [--no-skip]
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import shared.store.sentinel as sentinel_module
from shared.core.config import StoreConfig
from shared.store.sentinel import connect_sentinel
from workers.harness.stack.sentinel_pair import start_sentinel_deployment


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--no-skip", action="store_true",
                        help="ask every Sentinel at every check (the pool before)")
    args = parser.parse_args()
    if args.no_skip:
        sentinel_module.QUIET_SECONDS = sentinel_module.QUIET_MAX_SECONDS = 0.0
    with start_sentinel_deployment() as deployment:
        deployment.wait_ready()
        client = connect_sentinel(deployment.url(), StoreConfig(key_prefix="hung"))
        client.set("k", "v")
        hung = deployment.sentinels[0].process
        assert hung is not None
        os.kill(hung.pid, signal.SIGSTOP)
        times: list[tuple[float, float]] = []
        try:
            began = time.perf_counter()
            while time.perf_counter() - began < args.seconds:
                started = time.perf_counter()
                client.set("k", "v")
                ended = time.perf_counter()
                times.append((started - began, (ended - started) * 1000))
                time.sleep(0.01)
        finally:
            os.kill(hung.pid, signal.SIGCONT)
            client.close()
    ms = sorted(t for _, t in times)
    slow = [f"{at:.1f} s: {took:.0f} ms" for at, took in times if took > 5]
    print(f"{'every Sentinel asked at every check' if args.no_skip else 'quiet Sentinels left out'}"
          f"; {len(ms)} calls in {args.seconds:g} s with one Sentinel hung: p50 "
          f"{ms[len(ms) // 2]:.3f} ms, p99 {ms[int(len(ms) * 0.99)]:.3f} ms, max {ms[-1]:.1f} ms")
    print(f"calls over 5 ms: {len(slow)} ({', '.join(slow)})")


if __name__ == "__main__":
    main()
