"""``celery -A _worker_memory_app`` : the production app, plus snapshots on request.

For ``bench_worker_memory.py``: the worker runs ``workers.app`` unchanged; when the
worker is ready, a thread watches ``WORKER_MEMORY_SNAP_DIR`` and answers each
``<name>.req`` file with ``<name>.json``: the process's RSS, the collector's objects
(by type, the commonest), the sizes of the module-level caches a long run could grow,
and, with ``WORKER_MEMORY_TRACEMALLOC=1`` (traced from the worker's start), the
traced memory and the lines that allocated most since the first snapshot.
"""

from __future__ import annotations

import collections
import gc
import json
import os
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

from celery.signals import worker_ready

from workers.app import app

__all__ = ["app"]

_first: Any = None


def _cache_sizes() -> dict[str, int]:
    """Entries of the process-wide maps and LRU caches that hold per-session or per-tenant
    data (what would grow over weeks if one were unbounded)."""
    from shared.core import limits
    from shared.store import keys
    from workers import runtime

    sizes: dict[str, int] = {"limits._warned": len(limits._warned)}
    current = runtime._runtime
    sizes["runtime._compactors"] = len(current._compactors) if current is not None else 0
    sizes["keys._session_id"] = keys._session_id.cache_info().currsize
    from shared.telemetry import metrics

    prom = metrics.get_metrics()
    registry = getattr(prom, "registry", None)
    if registry is not None:
        sizes["metrics.series"] = sum(len(family.samples) for family in registry.collect())
    return sizes


def _snapshot() -> dict[str, Any]:
    global _first
    gc.collect()
    counts = collections.Counter(type(o).__name__ for o in gc.get_objects())
    out: dict[str, Any] = {"objects": sum(counts.values()),
                           "top_types": counts.most_common(15),
                           "caches": _cache_sizes(), "threads": threading.active_count()}
    with open(f"/proc/{os.getpid()}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                out["rss_mib"] = int(line.split()[1]) / 1024
    if tracemalloc.is_tracing():
        snap = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(False, tracemalloc.__file__)])
        out["traced_mb"] = tracemalloc.get_traced_memory()[0] / 1e6
        if _first is None:
            _first = snap
        out["grown"] = [(str(stat.traceback), stat.size_diff, stat.count_diff)
                        for stat in snap.compare_to(_first, "lineno")[:15]]
    return out


def _watch(where: Path) -> None:
    while True:
        for request in sorted(where.glob("*.req")):
            data = _snapshot()
            target = request.with_suffix(".json")
            target.with_suffix(".tmp").write_text(json.dumps(data))
            target.with_suffix(".tmp").rename(target)
            request.unlink()
        time.sleep(0.2)


def _ready(**_: Any) -> None:
    where = os.environ.get("WORKER_MEMORY_SNAP_DIR")
    if where:
        threading.Thread(target=_watch, args=(Path(where),), daemon=True,
                         name="bench-snapshots").start()


if os.environ.get("WORKER_MEMORY_TRACEMALLOC") == "1":
    tracemalloc.start(1)
worker_ready.connect(_ready, weak=False)
