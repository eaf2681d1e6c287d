"""Timing helpers shared by the scripts: one percentile, one timed loop, the machine's load.

The same names and semantics as the harness branch's ``scripts/_timing.py``
(nearest-rank :func:`percentile` with ``q`` in [0, 100], :func:`timed`,
:func:`best_of`, :func:`loadavg`, :func:`machine_busy`); when both exist at
merge time, that one (a superset) is kept. Importing it puts the repository
root on ``sys.path``, so a script runs from a checkout without PYTHONPATH.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

T = TypeVar("T")


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in [0, 100]); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return float(ordered[min(rank, len(ordered)) - 1])


def timed(fn: Callable[[], Any], calls: int) -> tuple[list[float], list[float]]:
    """Wall and CPU (this thread) milliseconds of each of ``calls`` calls."""
    wall: list[float] = []
    cpu: list[float] = []
    clock, thread_clock = time.perf_counter_ns, time.thread_time_ns
    for _ in range(calls):
        started, started_cpu = clock(), thread_clock()
        fn()
        cpu.append((thread_clock() - started_cpu) / 1e6)
        wall.append((clock() - started) / 1e6)
    return wall, cpu


def best_of(fn: Callable[[], T], repeat: int = 3) -> tuple[T, float]:
    """The result of ``fn`` and its best wall time in ms over ``repeat`` runs."""
    best = float("inf")
    value: T | None = None
    for _ in range(repeat):
        start = time.perf_counter()
        value = fn()
        best = min(best, (time.perf_counter() - start) * 1000)
    assert value is not None
    return value, best


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot."""
    with open("/proc/stat", encoding="ascii") as handle:
        fields = [int(x) for x in handle.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def machine_busy(seconds: float = 1.0) -> float:
    """Share of all CPUs busy over the next ``seconds`` (other users' load; we sleep)."""
    try:
        busy0, total0 = cpu_ticks()
        time.sleep(seconds)
        busy1, total1 = cpu_ticks()
    except (OSError, ValueError, IndexError):
        return float("nan")
    return (busy1 - busy0) / max(1, total1 - total0)


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages, or ``n/a``."""
    try:
        with open("/proc/loadavg", encoding="ascii") as handle:
            return " ".join(handle.read().split()[:3])
    except OSError:
        return "n/a"


__all__ = ["ROOT", "best_of", "cpu_ticks", "loadavg", "machine_busy", "percentile", "timed"]
