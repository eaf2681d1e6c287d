"""Where one job's CPU goes: cProfile in-process, or py-spy on a worker."""

from __future__ import annotations

import cProfile
import pstats
import time
from pathlib import Path
from typing import Any

from _timing import ROOT
from _workers_fake import SUMMARIZER_MODEL
from _workers_pool import Bench
from _workers_sessions import copy_sessions, delete_sessions

from shared.core.config import CompactionPolicy
from workers.compactor import Compactor, index_inline
from workers.summarizer.engine import SummaryEngine
from workers.summarizer.providers import OpenAIClient

# -- where one job's CPU goes ----------------------------------------------------------------
PROFILE_PARTS: list[tuple[str, str, str]] = [
    ("Compactor.run (one job, in-process, no Celery)", "compactor.py", "run"),
    ("store.load_view (EVALSHA, reply parsing, state/summary models, per-message counts)",
     "sessions.py", "load_view"),
    ("ViewData.messages (decoding the session's messages)", "records.py", "messages"),
    ("Compactor.plan (trigger, find_cut_point, tokens freed)", "compactor.py", "plan"),
    ("  find_cut_point", "turns.py", "find_cut_point"),
    ("extract_facts (ledger)", "facts.py", "extract_facts"),
    ("SummaryEngine.summarize (prompt + LLM call + quality check)", "engine.py", "summarize"),
    ("  chunk_for_window (sizes the request)", "chunking.py", "chunk_for_window"),
    ("  render_messages (renders the transcript, once)", "prompts.py", "render_messages"),
    ("  build_summary_request (assembles the request)", "prompts.py", "build_summary_request"),
    ("  OpenAIClient.complete (openai SDK, httpx2, JSON both ways)", "providers.py", "complete"),
    ("  check_summary (quality gate)", "quality.py", "check_summary"),
    ("the store's per-message counts handed to the job's counter", "compactor.py",
     "_seed_counts"),
    ("message token estimates (messages the store did not count)", "tokens.py",
     "estimate_message_tokens"),
    ("Ledger.missing_from / render / to_json", "ledger.py", "missing_from"),
    ("store.commit_summary (Lua CAS)", "sessions.py", "commit_summary"),
    ("recall indexing in the job (`index_compacted`; COMPACTION_RECALL_INDEX=job only)",
     "recall_index.py", "index_compacted"),
    ("logging (json.dumps of the outcome)", "compactor.py", "as_dict"),
]


def profile_jobs(bench: Bench, jobs: int, top: int, *, index_in_job: bool = False,
                 ) -> tuple[float, list[tuple[str, float]], list[str]]:
    """CPU ms per job in-process, and a cProfile breakdown (shares) on the thread's CPU clock.

    The job as a worker runs it by default: recall indexing is its own job
    (``index_in_job``: as ``COMPACTION_RECALL_INDEX=job`` runs it, in the job).
    """
    if jobs < 1:
        return 0.0, [], []
    store = bench.store
    client = OpenAIClient(SUMMARIZER_MODEL, base_url=bench.fake.base_url, api_key="bench",
                          timeout=30)
    compactor = Compactor(store, SummaryEngine(client, counter=store.counter),
                          policy=CompactionPolicy(), counter=store.counter,
                          recall_indexer=index_inline if index_in_job else None)
    bench.fake.ask("latency", 0.0)
    ids = [f"prof-{i}" for i in range(2 * jobs + 5)]
    copy_sessions(store, bench.template.session_id, ids)
    try:
        for sid in ids[:5]:  # warm the client's connection and the scripts
            compactor.run(sid)
        cpu0 = time.thread_time()
        for sid in ids[5:5 + jobs]:
            outcome = compactor.run(sid)
            if outcome.status != "compacted" or "turn_prefix_summary" in outcome.stages:
                raise SystemExit(f"profiled job did not compact in one call: {outcome}")
        per_job = (time.thread_time() - cpu0) / jobs * 1000
        profiler = cProfile.Profile(time.thread_time)
        profiler.enable()
        for sid in ids[5 + jobs:]:
            compactor.run(sid)
        profiler.disable()
    finally:
        bench.fake.ask("latency", bench.args.latency)
        delete_sessions(store, ids)
    raw: dict[Any, Any] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    whole = sum(ct for (filename, _line, name), (_cc, _nc, _tt, ct, _c) in raw.items()
                if name == "run" and filename.endswith("compactor.py"))
    parts = []
    for label, file_part, func in PROFILE_PARTS:
        total = sum(ct for (filename, _line, name), (_cc, _nc, _tt, ct, _c) in raw.items()
                    if name == func and filename.endswith(file_part))
        parts.append((label, total / whole if whole else 0.0))
    rows = sorted(((tt, nc, f"{fn.split('site-packages/')[-1].replace(str(ROOT) + '/', '')}"
                    f":{line}({name})") for (fn, line, name), (_cc, nc, tt, _ct, _c)
                   in raw.items()), reverse=True)
    table = ["| function | calls per job | share of own CPU |", "|---|---|---|"]
    total_own = sum(r[0] for r in rows) or 1.0
    table += [f"| `{where}` | {nc / jobs:.1f} | {tt / total_own:.1%} |"
              for tt, nc, where in rows[:top]]
    return per_job, parts, table


SPY_PARTS: list[tuple[str, tuple[str, ...], bool]] = [
    # (label, any of these frames, only outside the task body)
    ("outside the task body (Celery and kombu)", (), True),
    ("  task events published (`EventDispatcher`, Flower's feed)", ("EventDispatcher.send",
                                                                    "EventDispatcher.flush",
                                                                    "EventDispatcher.publish"),
     True),
    ("  receiving jobs (BRPOP, QoS bookkeeping, request objects)", (
        "Channel._brpop_read", "Channel._brpop_start", "MultiChannelPoller.on_poll_start"),
     True),
    ("  acknowledging jobs (`basic_ack`, unacked index)", ("Message.ack",), True),
    ("  task tracing around the body (result repr, success log, request stack)",
     ("fast_trace_task",), True),
    ("task body (`run_job`)", ("run_job",), False),
    ("  lease, pending and dirty flags (Redis)", (
        "SessionStore.claim", "SessionStore.finish_lease", "SessionStore.acquire_lease",
        "SessionStore.release_lease", "SessionStore.take_dirty"), False),
    ("  `store.load_view`", ("load_view",), False),
    ("  decoding messages (`ViewData.messages`, `store.messages`)", ("ViewData.messages",),
     False),
    ("  `Compactor.plan`", ("Compactor.plan",), False),
    ("    `find_cut_point`", ("find_cut_point",), False),
    ("  `extract_facts`", ("extract_facts",), False),
    ("  `SummaryEngine.summarize`", ("SummaryEngine.summarize",), False),
    ("    `chunk_for_window`", ("chunk_for_window",), False),
    ("    `build_summary_request`", ("build_summary_request",), False),
    ("    `OpenAIClient.complete` (openai SDK, httpx)", ("OpenAIClient.complete",), False),
    ("    `check_summary`", ("check_summary",), False),
    ("  token estimation, anywhere in the job", (
        "estimate_messages_tokens", "estimate_message_tokens", "estimate_tokens"), False),
    ("  `commit_summary`", ("commit_summary",), False),
    ("  logging in the job", ("Logger.info", "Logger.warning"), False),
]


def spy_breakdown(path: Path, top: int) -> tuple[int, list[tuple[str, float]], list[str]]:
    """Shares of GIL-holding samples by part (inclusive) and the top leaf functions."""
    stacks: list[tuple[list[str], int]] = []
    for line in path.read_text(errors="replace").splitlines():
        frames, _, count = line.rpartition(" ")
        if frames and count.isdigit():
            stacks.append(([f.split(" (", 1)[0] for f in frames.split(";")], int(count)))
    total = sum(n for _, n in stacks) or 1

    def has(names: list[str], wanted: str) -> bool:
        return any(n == wanted or n.endswith("." + wanted) for n in names)

    parts = []
    for label, markers, outside in SPY_PARTS:
        hit = sum(n for names, n in stacks
                  if (not outside or not has(names, "run_job"))
                  and (not markers or any(has(names, m) for m in markers)))
        parts.append((label, hit / total))
    leaves: dict[str, int] = {}
    for line in path.read_text(errors="replace").splitlines():
        frames, _, count = line.rpartition(" ")
        if frames and count.isdigit():
            leaf = frames.split(";")[-1].replace(str(ROOT) + "/", "")
            leaves[leaf] = leaves.get(leaf, 0) + int(count)
    table = ["| leaf function (GIL held) | share |", "|---|---|"]
    table += [f"| `{leaf}` | {n / total:.1%} |"
              for leaf, n in sorted(leaves.items(), key=lambda kv: -kv[1])[:top]]
    return total, parts, table
