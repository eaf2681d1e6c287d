"""Timing and machine helpers shared by every script: one of each.

- :func:`percentile`: nearest rank (the harness's, so scripts, replay and
  the CLI report the same statistic); :func:`interpolated` for the accuracy
  tables that want a linear-interpolated quantile (``q`` in [0, 1]).
- :func:`timed` (wall and thread-CPU ms of each call), :func:`best_of`
  (best wall ms over a few runs, with the result), :func:`wait_for`.
- :func:`machine_busy`, :func:`wait_for_quiet`, :func:`loadavg`: the other
  load on the machine, so figures are taken (and reported) under known load.
- :func:`proc_cpu`, :func:`proc_memory`, :func:`children_of`: per-process
  accounting from ``/proc``.

Scripts import it as ``from _timing import ...`` (``scripts/`` is on
``sys.path`` when a script runs), before the project's modules: importing it
puts the repository root on ``sys.path`` too, so a script runs from a
checkout without ``PYTHONPATH``. Tests never import scripts.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from workers.harness.timing import percentile, wait_for  # noqa: E402

__all__ = ["ROOT", "TICK", "best_of", "children_of", "cpu_ticks", "interpolated", "loadavg",
           "machine_busy", "percentile", "proc_cpu", "proc_memory", "timed", "wait_for",
           "wait_for_quiet"]

T = TypeVar("T")
TICK = os.sysconf("SC_CLK_TCK")


# -- statistics ---------------------------------------------------------------------
def interpolated(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile (``q`` in [0, 1]); NaN for no values."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = q * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


# -- timed loops --------------------------------------------------------------------
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


# -- the machine --------------------------------------------------------------------
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


def wait_for_quiet(threshold: float, timeout: float) -> float:
    """Wait (at most ``timeout`` s) for other load under ``threshold``; the last reading."""
    deadline = time.monotonic() + timeout
    busy = machine_busy()
    while busy > threshold and time.monotonic() < deadline:
        busy = machine_busy()
    return busy


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages, or ``n/a``."""
    try:
        with open("/proc/loadavg", encoding="ascii") as handle:
            return " ".join(handle.read().split()[:3])
    except OSError:
        return "n/a"


# -- processes ----------------------------------------------------------------------
def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of one live process; 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def proc_memory(pid: int) -> tuple[float, float]:
    """(RSS, PSS) in MiB of one process (PSS shares copy-on-write pages fairly)."""
    rss = pss = 0.0
    with suppress(OSError), open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("Rss:"):
                rss = int(line.split()[1]) / 1024
            elif line.startswith("Pss:"):
                pss = int(line.split()[1]) / 1024
    return rss, pss


def children_of(pid: int) -> list[int]:
    """Pids whose parent is ``pid``."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with suppress(OSError), open(f"/proc/{entry}/stat", encoding="ascii") as handle:
            if int(handle.read().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out
