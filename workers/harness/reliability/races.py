"""``races``: workers, appends, history edits and manual compactions at once.

Run long by ``scripts/reliability.py``, at CI size by ``tests/test_reliability.py``.
"""

from __future__ import annotations

import functools
import itertools
import os
import random
import re
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from shared.core.records import SummaryRecord
from shared.enqueue import QUEUE, TASK_COMPACT, CeleryEnqueuer, publisher_app
from shared.guard import ContextGuard
from workers.harness.demo_session import SYSTEM_PROMPT, TOOLS, demo_turns
from workers.harness.reliability.common import (
    MODEL,
    Env,
    ObservedLLM,
    integrity,
    marked,
    start_workers,
    valid_everywhere,
)
from workers.harness.timing import wait_for


@dataclass(frozen=True)
class Edit:
    """A history edit: its version lies in ``[low, high]``, it finished at ``done_at``."""

    low: int
    high: int
    index: int
    done_at: float


@dataclass
class RaceResult:
    seconds: float = 0.0
    sessions: int = 0
    workers: int = 0
    turns: int = 0
    views: int = 0
    edits: int = 0
    edits_exact: int = 0
    manual_compactions: int = 0
    commits: int = 0
    conflicts: int = 0
    busy: int = 0
    watermark_drops: int = 0
    summaries_checked: int = 0
    unhonored: int = 0
    busy_run: int = 0
    drain_seconds: float = 0.0
    violations: list[str] = field(default_factory=list)


BROKEN_CAS = """\
# Loaded by the race workers with --break-cas: the compare-and-swap always "expects"
# the current version, as a careless writer would. The race checks must catch it.
import shared.store.sessions as _store

_commit = _store.SessionStore.commit_summary


def _blind_commit(self, session_id, record, expected_version):
    return _commit(self, session_id, record, self.state(session_id).version)


_store.SessionStore.commit_summary = _blind_commit
"""


def sabotaged(env: dict[str, str]) -> dict[str, str]:
    """Worker environment whose interpreter loads BROKEN_CAS at start (sitecustomize)."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="rel-broken-cas-"))
    (folder / "sitecustomize.py").write_text(BROKEN_CAS, encoding="utf-8")
    path = os.environ.get("PYTHONPATH")
    return {**env, "PYTHONPATH": f"{folder}{os.pathsep}{path}" if path else str(folder)}


def run_races(env: Env, *, seconds: float, workers: int = 4, sessions: int = 50,
              appenders: int = 3, window: int = 12_000, seed: int = 2, break_cas: bool = False,
              llm_seconds: float = 0.3,
              progress: Callable[[str], None] = lambda _: None) -> RaceResult:
    """Appends, history edits and manual compactions on the same sessions, 4+ workers.

    Checked: every view the guard returns is valid for the three providers;
    between two observations of a session (by the thread that feeds it, and
    by a poller reading the state hash), the watermark goes down only if a
    history edit happened in between (by version); no kept summary covers
    a position an edit removed unless it was computed after that edit
    (``source_version`` >= the edit's version); the stored structure is
    intact and every pending flag, lease and job is gone at the end.
    ``break_cas`` runs the workers with a blind compare-and-swap (see
    BROKEN_CAS), to show that these checks do catch stale writers.
    """
    rng = random.Random(seed)
    result = RaceResult(sessions=sessions, workers=workers)
    store = env.store(socket_timeout=2.0, connect_timeout=2.0)
    publisher = publisher_app(env.broker_url)
    sids = [f"race{i}" for i in range(sessions)]
    base_turns = demo_turns(160)
    stop = threading.Event()
    lock = threading.Lock()
    edits: dict[str, list[Edit]] = defaultdict(list)
    seen_feed: dict[str, list[tuple[int, int]]] = defaultdict(list)
    seen_poll: dict[str, list[tuple[int, int]]] = defaultdict(list)
    seen_records: dict[str, list[tuple[float, SummaryRecord]]] = defaultdict(list)
    counts: Counter[str] = Counter()
    violations: list[str] = []

    def guarded(name: str, body: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                body()
            except BaseException as exc:  # a crash of a harness thread is a finding too
                with lock:
                    violations.append(f"{name} thread crashed: {type(exc).__name__}: {exc}")
        return run

    def feeder(mine: list[str]) -> None:
        guard = ContextGuard(store, CeleryEnqueuer(publisher), overrides={MODEL: window})
        cursor = dict.fromkeys(mine, 0)
        turns = {sid: marked(base_turns, sid) for sid in mine}
        while not stop.is_set():
            for sid in mine:
                turn = turns[sid][cursor[sid] % len(turns[sid])]
                cursor[sid] += 1
                view = guard.prepare(sid, SYSTEM_PROMPT, TOOLS, 1500, MODEL, pending=turn[:1])
                problems = valid_everywhere(view)
                with lock:
                    # A truncated view reports the watermark of its own truncation record,
                    # which is not stored when its compare-and-swap lost: only untruncated
                    # views say what the store held.
                    if not view.report.truncated:
                        seen_feed[sid].append((view.report.version, view.report.watermark))
                    counts["views"] += 1
                    violations.extend(f"{sid} view: {p}" for p in problems[:3])
                guard.record_turn(sid, turn)
                with lock:
                    counts["turns"] += 1
                if stop.is_set():
                    return

    def editor() -> None:
        while not stop.wait(0.05):
            sid = rng.choice(sids)
            length = store.length(sid)
            if length < 4:
                continue
            state = store.state(sid)
            before = state.version
            # Mostly regenerations near the end; some edits inside the range a job
            # in flight may be summarizing; a few deep ones (fallback to old summaries).
            where = rng.random()
            low = (max(0, length - 8) if where < 0.5
                   else min(state.watermark, length) if where < 0.85 else 0)
            index = rng.randint(low, length)
            after = store.truncate_after(sid, index).version
            with lock:
                edits[sid].append(Edit(before + 1, after, index, time.monotonic()))
                counts["edits"] += 1
                counts["edits_exact"] += int(after == before + 1)

    def compactor() -> None:
        while not stop.wait(0.1):
            keep = rng.choice([None, 800, 2500])
            publisher.send_task(TASK_COMPACT, args=[rng.choice(sids)], kwargs={
                "tenant": "default", "keep_recent": keep, "force": rng.random() < 0.3},
                queue=QUEUE)
            with lock:
                counts["manual"] += 1

    def poller() -> None:
        while not stop.is_set():
            for sid in sids:
                at = time.monotonic()
                state = store.state(sid)
                seen_poll[sid].append((state.version, state.watermark))
                record = store.summary(sid, state.watermark) if state.watermark else None
                if record is not None:
                    seen_records[sid].append((at, record))

    with ObservedLLM(latency=llm_seconds) as llm:
        wenv = env.workers(summarizer="openai", summarizer_base_url=llm.base_url,
                           summarizer_api_key="k", summarizer_timeout="20")
        pool = start_workers("race", sabotaged(wenv) if break_cas else wenv, workers,
                             concurrency=2)
        try:
            parts = [sids[i::appenders] for i in range(appenders)]
            threads = [threading.Thread(target=guarded("feeder", functools.partial(feeder, p)))
                       for p in parts]
            threads += [threading.Thread(target=guarded(n, f)) for n, f in
                        (("editor", editor), ("compactor", compactor), ("poller", poller))]
            started = time.monotonic()
            for t in threads:
                t.start()
            while time.monotonic() - started < seconds and (break_cas or not violations):
                time.sleep(0.2)
            stop.set()
            for t in threads:
                t.join(timeout=60)
            result.seconds = time.monotonic() - started
            progress(f"races: fed {counts['turns']} turns, {counts['edits']} edits; draining")
            drain_started = time.monotonic()
            settled = wait_for(lambda: env.drained() and not env.keys_matching("pending")
                               and not env.keys_matching("lease"), 120, 0.2)
            result.drain_seconds = time.monotonic() - drain_started
            if not settled:
                violations.append("the queue did not drain / pending flags stayed set")
        finally:
            for w in pool:
                w.stop()
    logs = "\n".join(w.log() for w in pool)
    result.conflicts = logs.count("compare-and-swap lost")
    result.busy = logs.count("'status': 'busy'")
    result.busy_run = sum(len(re.findall(r"'(?:compacted|skipped|covered|conflict)'", found))
                          for found in re.findall(r"'reruns': \[([^\]]*)\]", logs))
    result.turns, result.views = counts["turns"], counts["views"]
    result.edits, result.edits_exact = counts["edits"], counts["edits_exact"]
    result.manual_compactions = counts["manual"]
    for sid in sids:
        for seq in (seen_feed[sid], seen_poll[sid]):
            violations += _watermark_drops(sid, seq, edits[sid], result)
        kept = [(time.monotonic(), record) for record in store.summaries(sid)]
        violations += _stale_summaries(sid, seen_records[sid] + kept, edits[sid], result)
        violations += integrity(store, sid)
        result.unhonored += int(bool(store.redis.exists(store.keys(sid).dirty)))
        final = ContextGuard(store, overrides={MODEL: window}).prepare(
            sid, SYSTEM_PROMPT, TOOLS, 1500, MODEL)
        violations += [f"{sid} final view: {p}" for p in valid_everywhere(final)]
        result.commits += store.state(sid).version
    result.commits -= result.edits  # versions count edits too
    result.violations = violations
    return result


def _watermark_drops(sid: str, seq: list[tuple[int, int]], edits: list[Edit],
                     result: RaceResult) -> list[str]:
    """A watermark may go down between two observations only if an edit's version lies between."""
    problems = []
    for (v1, w1), (v2, w2) in itertools.pairwise(seq):
        if v2 < v1:
            problems.append(f"{sid}: version went back {v1} -> {v2}")
        if w2 < w1:
            result.watermark_drops += 1
            if not any(e.low <= v2 and e.high > v1 for e in edits):
                problems.append(f"{sid}: watermark {w1} -> {w2} between versions {v1} and {v2} "
                                "without a history edit")
    return problems


def _stale_summaries(sid: str, seen: list[tuple[float, SummaryRecord]], edits: list[Edit],
                     result: RaceResult) -> list[str]:
    """No summary seen after an edit covers the edited position unless computed after it.

    An edit at ``index`` deletes every summary whose watermark is past it,
    so a summary seen later with such a watermark was committed after the
    edit, through a compare-and-swap on a version >= the edit's: its
    ``source_version`` cannot be below the edit's version.
    """
    problems: list[str] = []
    checked: set[tuple[int, float]] = set()
    for at, record in seen:
        if (record.watermark, record.created_at) not in checked:
            checked.add((record.watermark, record.created_at))
            result.summaries_checked += 1
        for e in edits:
            if e.done_at < at and e.index < record.watermark \
                    and record.source_version < e.low:
                problems.append(
                    f"{sid}: summary at watermark {record.watermark} computed at version "
                    f"{record.source_version}, seen after an edit at index {e.index} "
                    f"(version >= {e.low})")
    return sorted(set(problems))


# ======================================================================== load
