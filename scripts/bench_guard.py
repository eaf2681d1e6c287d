"""The guard's hot path on real sessions of 100 to 100,000 messages, against LangChain.

Sessions are real transcripts (``../shared/data/transcripts.dev.jsonl``)
concatenated to ~100, 1k, 10k and 100k messages in a real Redis, the model's
window 1M tokens (the whole log in the view, before the first summary), and
again with an LLM summary committed near the end ("summary"). Per size:

- warm ``prepare`` + the view in OpenAI format (``view.wire("openai")``, shared
  with the cache; and ``view.openai()``, the same as a new list), one real turn
  recorded between prepares as an agent does (that append is not in the
  figure), gc on;
- the same with Gemini-style positional tool-call ids (they repeat every turn);
- the same with the view in Anthropic's and Gemini's formats
  (``view.anthropic(shared=True)``, ``view.gemini(shared=True)``: no copy of the
  history, as ``wire``);
- the async guard (``AsyncContextGuard`` over redis.asyncio), same loop;
- LangChain ``trim_messages`` (langchain-core) trimming the same messages
  to the same input budget; and the same followed by
  ``convert_to_openai_messages`` (the wire conversion ours includes); with a
  summary, "the same messages" are those after it (the view's, the smaller
  work), and, reported apart, the whole log (what LangChain, holding no
  summary, trims for this session);

  ours paired: blocks of 25 calls of each variant in turn, each variant on
  its own copy of the session, so that their ratios compare the same minutes of
  a shared, noisy machine (LangChain runs in two blocks, before our guards
  exist and after they are gone);
- the first prepare (+ wire) of a new process (a subprocess; imports done), in each
  format; at 10k without a summary, also over a real 1M-token window (the log does not
  fit: the view is over the trigger, as while the workers are far behind);
- ``record_turn`` with a real publish (``CeleryEnqueuer`` to a Redis broker,
  pending flag cleared before each call so that every call publishes), after a
  prepare as in the agent loop, the turn with new call ids as a provider's new
  response has (and, apart, the transcript's own ids, which the session holds);
- resident bytes of the guard's cached view per message (tracemalloc);
- growth from 100 to 10k messages: the warm loop on both sizes, paired as above;
- at 10k messages and more, the warm loop while the view is over the trigger and no
  summary has landed (cheap stages re-planned on every new batch of stored messages), in
  the OpenAI format and, at 10k, Anthropic's and Gemini's; and on a log holding one
  interrupted tool call (the view repaired on every prepare).

    PYTHONPATH=. .venv/bin/python scripts/bench_guard.py [--sizes 100,1000,10000,100000]
        [--calls 300] [--growth-calls 1000] [--redis-url redis://127.0.0.1:6379/5]
        [--broker-url redis://127.0.0.1:6379/6]

Per-turn figures on a long session (tool chains, an 8k trigger, LangChain's
middleware): ``scripts/bench_guard_turns.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import subprocess
import sys
import time
import tracemalloc
import uuid
from collections.abc import Callable
from typing import Any

from _guard_sessions import (
    OVERRIDES,
    SYSTEM,
    WINDOW_MODEL,
    Env,
    fresh_ids,
    history,
    lc_messages,
    next_turns,
    seed,
)
from _timing import ROOT, loadavg, percentile

from shared.core.messages import Message
from shared.enqueue import CeleryEnqueuer, NullEnqueuer, publisher_app
from shared.guard import AsyncContextGuard, ContextGuard
from shared.store.aio import AsyncSessionStore, connect_async

USER = {"role": "user", "content": "Continue with the next step."}
ARGS = {"max_tokens": 4000, "model": WINDOW_MODEL}


class SyncArm:
    """One measured variant on the sync guard: its own session, a real turn recorded
    before each timed prepare (that append is not in the figure), then the view in a wire
    format: ``wire`` (OpenAI, shared with the cache), ``list`` (``openai()``: the same as
    a new list, one pointer copy), ``anthropic`` or ``gemini`` (``view.anthropic(shared=True)``
    / ``view.gemini(shared=True)``: kept as folds, the finished turns shared, as ``wire``)."""

    def __init__(self, guard: ContextGuard, sid: str, repeated: bool,
                 fmt: str = "wire") -> None:
        self.guard, self.sid, self.fmt = guard, sid, fmt
        self.turns = next_turns(repeated)
        self.times: list[float] = []
        self._view(guard.prepare(sid, SYSTEM, pending=[USER], **ARGS))  # the cache is warm

    def _view(self, view: Any) -> None:
        if self.fmt == "wire":
            view.wire("openai")
        elif self.fmt == "list":
            view.openai()
        else:
            getattr(view, self.fmt)(shared=True)

    def step(self) -> None:
        self.guard.record_turn(self.sid, next(self.turns))
        started = time.perf_counter()
        self._view(self.guard.prepare(self.sid, SYSTEM, pending=[USER], **ARGS))
        self.times.append((time.perf_counter() - started) * 1000)


class AsyncArm:
    """The same loop on the async guard (``AsyncContextGuard`` over redis.asyncio); each
    step runs on one event loop kept for the whole run, timed inside the coroutine."""

    def __init__(self, guard: AsyncContextGuard, sid: str) -> None:
        self.guard, self.sid = guard, sid
        self.turns = next_turns(False)
        self.times: list[float] = []
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self._warm())

    async def _warm(self) -> None:
        (await self.guard.prepare(self.sid, SYSTEM, pending=[USER], **ARGS)).openai()

    async def _step(self) -> None:
        await self.guard.record_turn(self.sid, next(self.turns))
        started = time.perf_counter()
        (await self.guard.prepare(self.sid, SYSTEM, pending=[USER], **ARGS)).wire("openai")
        self.times.append((time.perf_counter() - started) * 1000)

    def step(self) -> None:
        self.loop.run_until_complete(self._step())

    def close(self) -> None:
        self.loop.run_until_complete(self.guard.store.aclose())
        self.loop.close()


class TrimArm:
    """LangChain ``trim_messages`` to the same budget; ``wire``: then the trimmed list in
    OpenAI format (``convert_to_openai_messages``), as our figure includes the wire."""

    def __init__(self, messages: list[Message], budget: int, wire: bool) -> None:
        self.lc = lc_messages(messages)
        self.budget, self.wire = budget, wire
        self.times: list[float] = []

    def step(self) -> None:
        from langchain_core.messages import convert_to_openai_messages, trim_messages
        from langchain_core.messages.utils import count_tokens_approximately

        started = time.perf_counter()
        kept = trim_messages(self.lc, max_tokens=self.budget,
                             token_counter=count_tokens_approximately,
                             strategy="last", start_on="human", include_system=True)
        if self.wire:
            convert_to_openai_messages(kept)
        self.times.append((time.perf_counter() - started) * 1000)


BLOCK = 25
"""Timed calls of one arm in a row: few enough that the arms share the machine's
minutes, each block after one untimed call, so that an arm runs warm as an agent's
process serving one session does (not just after another session's work)."""


def paired(arms: dict[str, Any], calls: int) -> dict[str, list[float]]:
    """Blocks of :data:`BLOCK` calls of each arm in turn, the order rotating, until each
    made ``calls``: the figures, and the ratios between them, are taken over the same
    minutes of this shared machine. Returns every arm's times so far."""
    names = list(arms)
    for r in range(-(-calls // BLOCK)):
        for k in range(len(names)):
            arm = arms[names[(r + k) % len(names)]]
            arm.step()
            arm.times.pop()  # the block's first call: warm-up
            for _ in range(min(BLOCK, calls - r * BLOCK)):
                arm.step()
    return {name: arm.times for name, arm in arms.items()}


FIRST = """
import sys, time
sys.path.insert(0, {root!r})
from shared.core.config import StoreConfig
from shared.guard import ContextGuard
from shared.store.sessions import SessionStore, connect
cfg = StoreConfig(key_prefix={prefix!r}, max_messages_per_session=400_000, socket_timeout=60.0)
guard = ContextGuard(SessionStore(connect({url!r}, cfg), cfg), overrides={{{model!r}: {window}}})
started = time.perf_counter()
guard.prepare({sid!r}, {system!r}, max_tokens=4000, model={model!r},
              pending=[{{"role": "user", "content": "go"}}]).{call}
print((time.perf_counter() - started) * 1000)
"""


def first_runs(env: Env, sid: str, window: int = OVERRIDES[WINDOW_MODEL],
               call: str = "openai()") -> list[float]:
    """ms of the first prepare (+ wire: ``call`` on the view) of three new processes, one
    after the other."""
    code = FIRST.format(root=str(ROOT), prefix=env.prefix, url=env.url, model=WINDOW_MODEL,
                        sid=sid, system=SYSTEM, window=window, call=call)
    return [float(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                 text=True).stdout.strip()) for _ in range(3)]


def first_prepare(env: Env, sid: str, call: str = "openai()") -> float:
    return sorted(first_runs(env, sid, call=call))[1]


REAL_WINDOW = 1_048_576  # a 1M-token model: 10k messages of these transcripts (~2.6M tokens)
# do not fit, so before the first summary the view is over the trigger (and the window)


def record_publish(env: Env, broker_url: str, sid: str, calls: int,
                   stored_ids: bool = False,
                   timed: Callable[[Callable[[], None]], float] | None = None) -> list[float]:
    """``record_turn`` as the agent loop calls it: after a prepare (untimed, the call
    before the model's answer, the turn so far pending), the job published every time (a
    worker claimed the last one). The turns carry new call ids, as a provider's new
    response does; ``stored_ids``: the transcript's own ids, which the session already
    holds (an ``ID_CONFLICT`` round trip wherever they left the view). ``timed``: runs
    each record and returns its figure (default: its wall ms)."""
    queue = "bench-" + uuid.uuid4().hex[:8]
    store = env.store()
    guard = ContextGuard(store, CeleryEnqueuer(publisher_app(broker_url), queue=queue),
                         overrides=OVERRIDES)
    turns = next_turns(False)
    times = []
    try:
        for _ in range(calls):
            store.clear_pending(sid)
            turn = next(turns)
            turn = turn if stored_ids else fresh_ids(turn)
            answer = max([i for i, m in enumerate(turn) if m.role == "assistant"] or [0])
            view = guard.prepare(sid, SYSTEM, pending=turn[:answer], **ARGS)
            view.openai()
            usage = {"prompt_tokens": view.report.estimated_prompt_tokens}

            def record(turn: list[Message] = turn, usage: dict[str, int] = usage) -> None:
                guard.record_turn(sid, turn, usage=usage)

            times.append(timed(record) if timed is not None else _wall_ms(record))
    finally:
        import redis
        redis.Redis.from_url(broker_url).delete(queue)
    return times


def _wall_ms(run: Callable[[], None]) -> float:
    started = time.perf_counter()
    run()
    return (time.perf_counter() - started) * 1000


def cached_bytes(env: Env, sid: str, fmt: str = "openai") -> float:
    """Bytes the guard's cache holds per message of a session's view (OpenAI wire included;
    ``fmt`` anthropic or gemini: that view's fold too)."""
    gc.collect()
    tracemalloc.start()
    guard = ContextGuard(env.store(), overrides=OVERRIDES)
    before = tracemalloc.get_traced_memory()[0]
    getattr(guard.prepare(sid, SYSTEM, **ARGS), fmt)()
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    entry = guard.views.get(sid)
    return used / max(1, len(entry.history) if entry else 1)


def stats(times: list[float]) -> dict[str, float]:
    return {"p50": percentile(times, 50), "p99": percentile(times, 99)}


def run(size: int, mode: str, env: Env, args: argparse.Namespace) -> dict[str, Any]:
    summary_at = 0.9 if mode == "summary" else None
    row: dict[str, Any] = {"size": size, "mode": mode}
    calls = args.calls if size <= 10_000 else max(50, args.calls // 3)
    sid = f"s{size}{mode}"
    store = env.store()
    messages = history(size)
    w = seed(store, sid, messages, summary_at=summary_at)
    for twin in ("l", "a", "n", "g"):  # the same session: list, async, Anthropic, Gemini
        seed(store, sid + twin, messages, summary_at=summary_at)
    seed(store, sid + "r", history(size, repeated_ids=True), summary_at=summary_at)
    row["view"] = len(messages) - w
    row["first"] = first_prepare(env, sid)
    row["first_anthropic"] = first_prepare(env, sid, "anthropic(shared=True)")
    row["first_gemini"] = first_prepare(env, sid, "gemini(shared=True)")
    budget = ContextGuard(store, overrides=OVERRIDES).prepare(
        sid, SYSTEM, **ARGS).report.budget.input_budget
    lc_calls = 30 if size <= 10_000 else 5
    lc = {"langchain": TrimArm(messages[w:], budget, wire=False),
          "langchain_wire": TrimArm(messages[w:], budget, wire=True)}
    if w:
        lc["langchain_log"] = TrimArm(messages, budget, wire=False)
    # LangChain in two blocks, before our guards exist and after they are gone: its
    # ~10k new objects per call would otherwise make the collector walk our caches on
    # its time (and, between our calls, its garbage on ours)
    gc.collect()
    paired(lc, lc_calls // 2)
    astore = AsyncSessionStore(connect_async(env.url, env.config), env.config)
    arms: dict[str, Any] = {
        "warm": SyncArm(ContextGuard(store, NullEnqueuer(), overrides=OVERRIDES), sid, False),
        "warm_list": SyncArm(ContextGuard(store, overrides=OVERRIDES), sid + "l", False,
                             "list"),
        "anthropic": SyncArm(ContextGuard(store, overrides=OVERRIDES), sid + "n", False,
                             "anthropic"),
        "gemini": SyncArm(ContextGuard(store, overrides=OVERRIDES), sid + "g", False, "gemini"),
        "repeated": SyncArm(ContextGuard(store, overrides=OVERRIDES), sid + "r", True),
        "async": AsyncArm(AsyncContextGuard(astore, overrides=OVERRIDES), sid + "a"),
    }
    try:
        times = paired(arms, calls)
    finally:
        arms["async"].close()
    del arms
    gc.collect()
    times.update(paired(lc, lc_calls - lc_calls // 2))
    row.update({name: stats(t) for name, t in times.items()})
    if size == 10_000 and not w:
        # a new process over a real 1M window, no summary landed (the workers far behind):
        # the first one plans the cheap stages and records them, the next ones re-use them
        seed(store, sid + "m", messages)  # its own copy: the stages it records stay there
        row["first_real"] = first_runs(env, sid + "m", REAL_WINDOW)
    if size >= 10_000:
        row["record"] = stats(record_publish(env, args.broker_url, sid, min(calls, 300)))
        row["record_stored_ids"] = stats(record_publish(env, args.broker_url, sid,
                                                        min(calls, 300), stored_ids=True))
        row["bytes_per_message"] = round(cached_bytes(env, sid))
        row["bytes_per_message_anthropic"] = round(cached_bytes(env, sid, "anthropic"))
    return row


def table(rows: list[dict[str, Any]]) -> str:
    out = ["| messages | mode | view | warm p50 / p99 ms | as list p99 | Anthropic / Gemini "
           "p50 | repeated ids p99 | async p99 | LangChain trim p50 (+ wire) | x LangChain "
           "(+ wire) | first prepare ms | record_turn p99 |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        record = f"{r['record']['p99']:.2f}" if "record" in r else ""
        out.append(
            f"| {r['size']:,} | {r['mode']} | {r['view']:,} | {r['warm']['p50']:.3f} / "
            f"{r['warm']['p99']:.3f} | {r['warm_list']['p99']:.3f} | "
            f"{r['anthropic']['p50']:.3f} / {r['gemini']['p50']:.3f} | "
            f"{r['repeated']['p99']:.3f} | {r['async']['p99']:.3f} | "
            f"{r['langchain']['p50']:.2f} ({r['langchain_wire']['p50']:.2f}) | "
            f"{r['langchain']['p50'] / r['warm']['p50']:.0f}x "
            f"({r['langchain_wire']['p50'] / r['warm']['p50']:.0f}x) | "
            f"{r['first']:.1f} | {record} |")
    return "\n".join(out)


def over_trigger(env: Env, size: int, calls: int, fmt: str = "openai") -> dict[str, Any]:
    """Warm prepare + wire (a turn recorded before each) while the view is over the
    trigger and no summary has landed yet (the worker still summarizing): the window is
    sized so that the view stays at ~85% of it after its cheap stages, which every new
    batch of stored messages re-plans. ``scratch_ms``: the same view planned from scratch
    (what such a prepare cost before planning was incremental)."""
    from shared.core.cheap import plan_cheap_stages
    from shared.core.config import CompactionPolicy

    store = env.store()
    sid = f"trigger{size}{fmt}"
    seed(store, sid, history(size))
    total = store.range_tokens(sid, 0, store.length(sid))
    first = ContextGuard(store, NullEnqueuer(), overrides={"bench-trigger": int(total / 0.85)
                                                           + ARGS["max_tokens"]})
    after = first.prepare(sid, SYSTEM, pending=[USER], max_tokens=ARGS["max_tokens"],
                          model="bench-trigger").report  # cheap decisions recorded
    window = int(after.budget.total_input / 0.85) + ARGS["max_tokens"]
    guard = ContextGuard(store, NullEnqueuer(), overrides={"bench-trigger": window})
    args = {"max_tokens": ARGS["max_tokens"], "model": "bench-trigger"}
    warm = guard.prepare(sid, SYSTEM, pending=[USER], **args)  # its format's view made once
    _ = warm.wire("openai") if fmt == "openai" else getattr(warm, fmt)(shared=True)
    turns = next_turns(False)
    times, over = [], 0
    for _ in range(calls):
        guard.record_turn(sid, next(turns))
        started = time.perf_counter()
        view = guard.prepare(sid, SYSTEM, pending=[USER], **args)
        _ = view.wire("openai") if fmt == "openai" else getattr(view, fmt)(shared=True)
        times.append((time.perf_counter() - started) * 1000)
        over += view.report.budget.should_compact and not view.report.truncated
    data = store.load_view(sid)
    started = time.perf_counter()
    plan_cheap_stages(data.history, data.state.watermark, data.cheap,
                      policy=CompactionPolicy(), counter=store.counter)
    scratch = (time.perf_counter() - started) * 1000
    return {"size": size, "format": fmt, "view": len(data.history), "over": over / calls,
            "warm": stats(times), "scratch_ms": scratch}


def interrupted(env: Env, size: int, calls: int) -> dict[str, Any]:
    """Warm prepare + wire (a turn recorded before each) on a log holding one interrupted
    call (an assistant call whose result never came, then the user goes on): the view
    needs a tool-pair repair on every prepare. ``scratch_ms``: that view repaired whole
    (what each such prepare cost before the repair was kept)."""
    from shared.core.repair import repair_tool_pairs

    store = env.store()
    sid = f"interrupted{size}"
    seed(store, sid, history(size))
    store.append(sid, [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "interrupted-1", "name": "bash", "arguments": '{"command": "make test"}'}]},
        {"role": "user", "content": "That got cut off. Go on with the next step."}])
    guard = ContextGuard(store, NullEnqueuer(), overrides=OVERRIDES)
    guard.prepare(sid, SYSTEM, pending=[USER], **ARGS).wire("openai")
    turns = next_turns(False)
    times = []
    for _ in range(calls):
        guard.record_turn(sid, next(turns))
        started = time.perf_counter()
        guard.prepare(sid, SYSTEM, pending=[USER], **ARGS).wire("openai")
        times.append((time.perf_counter() - started) * 1000)
    messages = store.load_view(sid).history
    started = time.perf_counter()
    repair_tool_pairs(messages)
    scratch = (time.perf_counter() - started) * 1000
    return {"size": size, "view": len(messages), "warm": stats(times), "scratch_ms": scratch}


def growth_paired(env: Env, mode: str, calls: int) -> dict[str, Any]:
    """Warm prepare + wire at 100 and at 10k messages, paired (blocks of 25 in turn, same
    minutes of the machine): the growth ratio is not the drift between two size runs."""
    summary_at = 0.9 if mode == "summary" else None
    store = env.store()
    arms = {}
    for size in (100, 10_000):
        sid = f"growth{size}{mode}"
        seed(store, sid, history(size), summary_at=summary_at)
        arms[size] = SyncArm(ContextGuard(store, NullEnqueuer(), overrides=OVERRIDES), sid,
                             False)
    times = paired(arms, calls)
    small, large = stats(times[100]), stats(times[10_000])
    return {"mode": mode, "small": small, "large": large,
            "p50": large["p50"] / small["p50"], "p99": large["p99"] / small["p99"]}


def targets(rows: list[dict[str, Any]], growth: dict[str, dict[str, Any]]) -> list[str]:
    by = {(r["size"], r["mode"]): r for r in rows}
    lines = []
    for mode in ("none", "summary"):
        r = by.get((10_000, mode))
        if r is None:
            continue
        nan = float("nan")
        found = growth.get(mode)
        growth_ = (found["p50"], found["p99"]) if found else (nan, nan)
        lines.append(
            f"- 10k ({mode}): warm+wire p99 {r['warm']['p99']:.3f} ms (<= 1); "
            f"{r['langchain']['p50'] / r['warm']['p50']:.0f}x LangChain p50 (>= 100; "
            f"{r['langchain_wire']['p50'] / r['warm']['p50']:.0f}x with its wire conversion); "
            f"growth 100->10k (paired) p50 {growth_[0]:.2f}x, p99 {growth_[1]:.2f}x (<= 1.5); "
            f"first {r['first']:.1f} ms (<= 20; in Anthropic's format "
            f"{r['first_anthropic']:.1f}, Gemini's {r['first_gemini']:.1f}); "
            f"repeated/unique p50 {r['repeated']['p50'] / r['warm']['p50']:.2f}, "
            f"p99 {r['repeated']['p99'] / r['warm']['p99']:.2f} (<= 1.2); "
            f"async/sync p50 {r['async']['p50'] / r['warm']['p50']:.2f}, "
            f"p99 {r['async']['p99'] / r['warm']['p99']:.2f} (<= 1.5); "
            f"record_turn p99 {r.get('record', {}).get('p99', float('nan')):.2f} ms (<= 2; "
            f"the transcript's ids, already stored: "
            f"{r.get('record_stored_ids', {}).get('p99', float('nan')):.2f}); "
            f"{r.get('bytes_per_message', 0)} bytes/cached message "
            f"({r.get('bytes_per_message_anthropic', 0)} with Anthropic's view kept)"
            + (f"; {r['langchain_log']['p50'] / r['warm']['p50']:.0f}x LangChain trimming "
               f"the whole log ({r['langchain_log']['p50']:.2f} ms)"
               if "langchain_log" in r else "")
            + (f"; first over a real 1M window, no summary yet (reported): "
               f"{r['first_real'][0]:.0f} ms (plans the cheap stages), then "
               f"{min(r['first_real'][1:]):.0f}-{max(r['first_real'][1:]):.0f} ms"
               if "first_real" in r else ""))
    return lines


def ping_ms(url: str, calls: int = 500) -> float:
    """This machine's Redis round trip through redis-py (the floor under every write)."""
    import redis

    client = redis.Redis.from_url(url)
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        client.ping()
        times.append((time.perf_counter() - started) * 1000)
    client.close()
    return percentile(times, 50)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100,1000,10000,100000")
    parser.add_argument("--modes", default="none,summary")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--growth-calls", type=int, default=1000,
                        help="calls per size of the growth figure (its p99 is a ratio of two "
                             "tails: 300 calls leave it to the 3rd slowest of each)")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/5")
    parser.add_argument("--broker-url", default="redis://127.0.0.1:6379/6")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    env = Env(args.redis_url)
    rows = []
    growth: dict[str, dict[str, Any]] = {}
    sizes = [int(s) for s in args.sizes.split(",")]
    try:
        for size in sizes:
            for mode in args.modes.split(","):
                rows.append(run(size, mode, env, args))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        if 100 in sizes and 10_000 in sizes:
            for mode in args.modes.split(","):
                growth[mode] = growth_paired(env, mode, args.growth_calls)
        trigger = [over_trigger(env, size, min(args.calls, 200), fmt) for size in sizes
                   if size >= 10_000 for fmt in ("openai", "anthropic", "gemini")
                   if fmt == "openai" or size == 10_000]
        broken = [interrupted(env, size, min(args.calls, 200)) for size in sizes
                  if size >= 10_000]
    finally:
        env.cleanup()
    print(f"load average {loadavg()}; gc on; {args.calls} calls per figure (growth: "
          f"{args.growth_calls} per size); Redis PING round "
          f"trip p50 {ping_ms(args.redis_url):.3f} ms (what each round trip costs here)\n")
    print(table(rows))
    print("\n" + "\n".join(targets(rows, growth)))
    for t in trigger:
        print(f"- {t['size']:,} over the trigger ({t['format']}), no summary yet "
              f"({t['view']:,} messages, "
              f"{t['over']:.0%} of calls over it): warm+wire p50 {t['warm']['p50']:.3f} / "
              f"p99 {t['warm']['p99']:.3f} ms; planning that view from scratch: "
              f"{t['scratch_ms']:.0f} ms")
    for b in broken:
        print(f"- {b['size']:,} with one interrupted call in the log ({b['view']:,} messages): "
              f"warm+wire p50 {b['warm']['p50']:.3f} / p99 {b['warm']['p99']:.3f} ms; "
              f"repairing that view whole: {b['scratch_ms']:.0f} ms")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"rows": rows, "growth": growth, "trigger": trigger,
                       "interrupted": broken}, handle, indent=1)


if __name__ == "__main__":
    main()
