"""The guard's hot path against a real Redis on loopback, printed as markdown.

What it measures, all in one run so the ratios share the machine's load:

- ``ContextGuard.prepare`` on sessions of ~100, ~1,000 and ~10,000 messages
  whose watermark sits near the end (a committed summary record, the same
  recent turns after it), three ways. *Warm*: the guard's process holds the
  session's decoded view and nothing was appended since (one incremental
  read). *After a turn*: ``record_turn`` appended one turn since the last
  call (that turn is read and decoded), the agent loop's steady state.
  *Cold*: no cached view (a new process, or the first call after a
  compaction or an edit): the whole view is read and decoded; that decoding
  is also timed alone.
- A naive guard, as most agents do it: every message of the history
  estimated and summed on each call (once from an in-memory list, once
  loaded from the same Redis list first).
- ``record_turn`` with the real ``CeleryEnqueuer`` publishing to a Redis
  broker: the pending flag cleared before each call (so every call
  publishes; the lean publish and, in the same rounds, ``send_task``) and
  left set (coalesced, no publish), plus its parts.
- Where ``prepare``'s time goes (a stopwatch per step, and cProfile).

Every figure is the median over ``--rounds`` rounds; each round runs every
configuration in turn (interleaved, so background load hits all of them).
Redis keys use a unique prefix in their own databases and are deleted at
the end; the broker queue has a unique name and is deleted too.

    .venv/bin/python scripts/bench_guard.py [--redis-url redis://127.0.0.1:6379/5]
        [--broker-url redis://127.0.0.1:6379/6] [--rounds 5] [--calls 2000]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import redis

from shared.core.config import StoreConfig
from shared.core.facts import extract_facts
from shared.core.messages import Message
from shared.core.records import SummaryRecord
from shared.core.tokens import DEFAULT_COUNTER
from shared.core.turns import turn_starts
from shared.core.view import ViewCache, summary_block
from shared.core.wire import from_openai
from shared.enqueue import CeleryEnqueuer, Enqueuer, publisher_app
from shared.guard import ContextGuard
from shared.store.sessions import SessionStore, connect
from workers.harness.demo_session import SYSTEM_PROMPT, TOOLS, generate_session
from workers.harness.fakes.summaries import SummarizerResponder
from workers.summarizer.prompts import build_summary_request

MODEL = "gpt-4o"
MAX_TOKENS = 2000
PENDING = [{"role": "user", "content": "Continue with the next failing test."}]
USAGE = {"prompt_tokens": 21_000, "completion_tokens": 350, "total_tokens": 21_350}


# -- statistics ---------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sample."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


@dataclass
class Series:
    """Per-call wall and CPU times (ms) of one configuration, one list per round."""

    rounds: list[list[float]] = field(default_factory=list)
    cpu_rounds: list[list[float]] = field(default_factory=list)

    def add(self, sample: tuple[list[float], list[float]]) -> None:
        self.rounds.append(sample[0])
        self.cpu_rounds.append(sample[1])

    def stat(self, fn: Callable[[list[float]], float], *, cpu: bool = False) -> float:
        return statistics.median(fn(r) for r in (self.cpu_rounds if cpu else self.rounds))

    @property
    def p50(self) -> float:
        return self.stat(lambda r: percentile(r, 50))

    @property
    def p99(self) -> float:
        return self.stat(lambda r: percentile(r, 99))

    @property
    def mean(self) -> float:
        return self.stat(statistics.fmean)

    @property
    def cpu_p50(self) -> float:
        return self.stat(lambda r: percentile(r, 50), cpu=True)

    @property
    def cpu_p99(self) -> float:
        return self.stat(lambda r: percentile(r, 99), cpu=True)

    @property
    def p99_spread(self) -> tuple[float, float]:
        values = [percentile(r, 99) for r in self.rounds]
        return min(values), max(values)


def ratio_median(num: Series, den: Series, fn: Callable[[list[float]], float]) -> float:
    """Median over rounds of ``fn(num round) / fn(den round)`` (same round, same load)."""
    return statistics.median(fn(a) / fn(b) for a, b in zip(num.rounds, den.rounds, strict=True))


def timed(fn: Callable[[], Any], calls: int) -> tuple[list[float], list[float]]:
    """Wall and CPU (this thread) milliseconds of each call."""
    wall: list[float] = []
    cpu: list[float] = []
    clock, thread_clock = time.perf_counter_ns, time.thread_time_ns
    for _ in range(calls):
        started, started_cpu = clock(), thread_clock()
        fn()
        cpu.append((thread_clock() - started_cpu) / 1e6)
        wall.append((clock() - started) / 1e6)
    return wall, cpu


def _cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot."""
    with open("/proc/stat", encoding="ascii") as handle:
        fields = [int(x) for x in handle.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def machine_busy(seconds: float = 1.0) -> float:
    """Fraction of all CPUs busy over the next ``seconds`` (other users' load; we sleep)."""
    try:
        busy0, total0 = _cpu_ticks()
        time.sleep(seconds)
        busy1, total1 = _cpu_ticks()
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
    try:
        with open("/proc/loadavg", encoding="ascii") as handle:
            return " ".join(handle.read().split()[:3])
    except OSError:
        return "n/a"


# -- sessions -----------------------------------------------------------------------
def demo_turns(turns: int, seed: int) -> list[list[Message]]:
    body = from_openai(generate_session(turns, seed=seed))[1:]
    starts = turn_starts(body)
    return [body[a:b] for a, b in zip(starts, [*starts[1:], len(body)], strict=True)]


@dataclass(frozen=True)
class SessionShape:
    """History before the watermark, the recent turns after it."""

    prefix: list[Message]
    tail: list[Message]

    @property
    def length(self) -> int:
        return len(self.prefix) + len(self.tail)


def shape(turns: list[list[Message]], tail_turns: int, size: int) -> SessionShape:
    """Whole turns of history up to ~``size`` messages, then the same recent turns."""
    tail = [m for t in turns[-tail_turns:] for m in t]
    prefix: list[Message] = []
    for turn in turns[:-tail_turns]:
        if len(prefix) + len(tail) >= size:
            break
        prefix.extend(turn)
    if len(prefix) + len(tail) < size:
        raise SystemExit(f"not enough generated turns for {size} messages")
    return SessionShape(prefix, tail)


def summary_for(prefix: list[Message]) -> tuple[str, str, str]:
    """A realistic summary of the prefix: the fake summarizer's sections + the fact ledger."""
    recent = prefix[-60:]
    start = len(prefix) - len(recent)
    ledger = extract_facts(prefix).capped(4000)
    request = build_summary_request(recent, None, ledger=ledger, start=start,
                                    max_summary_tokens=2000)
    text = SummarizerResponder().summarize(request[1]["content"])
    return text, ledger.render(), ledger.to_json()


def build_session(store: SessionStore, session_id: str, sess: SessionShape) -> int:
    """Append the log, commit a summary at the watermark; returns the watermark."""
    messages = sess.prefix + sess.tail
    for i in range(0, len(messages), 400):
        store.append(session_id, messages[i:i + 400])
    watermark = len(sess.prefix)
    text, ledger, ledger_json = summary_for(sess.prefix)
    record = SummaryRecord(watermark=watermark, kind="llm", text=text, ledger=ledger,
                           ledger_json=ledger_json, tokens=0, model="gpt-4o-mini")
    record = record.model_copy(update={"tokens": DEFAULT_COUNTER.text(summary_block(record))})
    result = store.commit_summary(session_id, record, store.state(session_id).version)
    if not result.ok:
        raise SystemExit(f"summary commit failed for {session_id}: {result.reason}")
    return watermark


# -- the naive guard ----------------------------------------------------------------------
def naive_total(messages: Sequence[Message]) -> int:
    """What most agents do before each call: estimate every message, sum, add the rest."""
    system = DEFAULT_COUNTER.message(Message(role="system", content=SYSTEM_PROMPT))
    history = sum(DEFAULT_COUNTER.message(m) for m in messages)
    return system + DEFAULT_COUNTER.tools(TOOLS) + history + DEFAULT_COUNTER.messages([])


def naive_from_redis(store: SessionStore, session_id: str) -> int:
    raw = store.redis.lrange(store.keys(session_id).log, 0, -1)
    return naive_total([Message.model_validate_json(r) for r in raw])




# -- the agent loop: record_turn, then prepare ----------------------------------------------
Sample = tuple[list[float], list[float]]  # (wall ms, CPU ms) per call


@dataclass
class LoopBench:
    """The agent loop in a steady state: record_turn, then the next prepare.

    Before each timed pair, untimed: the turn is cut off again
    (``truncate_after``, which bumps the version) and ``prepare`` runs once,
    so the guard holds the view at the current version. The timed
    ``record_turn`` appends one turn; the timed ``prepare`` after it reads
    and decodes just that turn, as in an agent process.
    """

    guard: ContextGuard
    store: SessionStore
    session_id: str
    turn: list[Message]
    next_user: list[Message]
    base_length: int
    version: int = 0  # the session's version after the last reset

    def _reset(self, *, publish: bool) -> None:
        store, sid = self.store, self.session_id
        store.truncate_after(sid, self.base_length)
        if publish:
            store.clear_pending(sid)
        else:
            store.mark_pending(sid)
        self.guard.prepare(sid, SYSTEM_PROMPT, TOOLS, MAX_TOKENS, MODEL, pending=self.turn[:1])

    def run(self, calls: int, *, publish: bool) -> tuple[Sample, Sample]:
        """(record_turn, the prepare right after it), each as (wall, CPU) per call."""
        turn: Sample = ([], [])
        prep: Sample = ([], [])
        sid, clock, cpu_clock = self.session_id, time.perf_counter_ns, time.thread_time_ns
        expected = self.base_length + len(self.turn)
        for _ in range(calls):
            self._reset(publish=publish)
            started, started_cpu = clock(), cpu_clock()
            self.guard.record_turn(sid, self.turn, usage=USAGE)
            turn[1].append((cpu_clock() - started_cpu) / 1e6)
            turn[0].append((clock() - started) / 1e6)
            started, started_cpu = clock(), cpu_clock()
            view = self.guard.prepare(sid, SYSTEM_PROMPT, TOOLS, MAX_TOKENS, MODEL,
                                      pending=self.next_user)
            prep[1].append((cpu_clock() - started_cpu) / 1e6)
            prep[0].append((clock() - started) / 1e6)
            if view.report.truncated or view.report.length != expected:
                raise SystemExit(f"the loop is not in a steady state: {view.report}")
        return turn, prep

    def parts(self, calls: int) -> dict[str, Sample]:
        """The pieces record_turn is made of, timed one by one."""
        store, sid, enqueuer = self.store, self.session_id, self.guard.enqueuer
        encoded: list[list[tuple[str, int]]] = [[]]

        def encode() -> None:
            encoded[0] = store.encode(sid, self.turn)

        calibration = {"anchor_reported": 21_000, "anchor_estimated": 20_000,
                       "anchor_end": self.base_length, "anchor_version": 0,
                       "calibration_ratio": 1.05, "calibration_samples": 3}

        def append(marks: bool) -> Callable[[], None]:
            def run() -> None:
                result = store.append_encoded(sid, encoded[0], request_id=uuid.uuid4().hex,
                                              mark_pending=True, state_fields=calibration,
                                              fields_version=self.version)
                if result.marked != marks:
                    raise SystemExit("the pending flag is not in the state this part expects")
            return run

        steps: list[tuple[str, Callable[[], Any]]] = [
            ("encode", encode), ("append", append(True)),
            ("publish", lambda: publish(enqueuer, store.tenant, sid)),
            ("append_coalesced", append(False))]
        out: dict[str, Sample] = {name: ([], []) for name, _ in steps}
        for _ in range(calls):
            self.version = store.truncate_after(sid, self.base_length).version
            store.clear_pending(sid)
            for name, step in steps:
                started, started_cpu = time.perf_counter_ns(), time.thread_time_ns()
                step()
                out[name][1].append((time.thread_time_ns() - started_cpu) / 1e6)
                out[name][0].append((time.perf_counter_ns() - started) / 1e6)
        return out


def publish(enqueuer: Enqueuer, tenant: str, session_id: str) -> None:
    enqueuer.enqueue(tenant, session_id)


# -- where the time goes ------------------------------------------------------------------
GUARD_FUNCTIONS = ("validate_messages", "model_limits", "output_reserve", "check_budget",
                   "calibrated_total", "cheap_savings", "apply_cheap", "pairs_intact",
                   "repair_tool_pairs", "assemble", "decode_view")
GUARD_METHODS = ("_system_tokens", "_tool_tokens", "_remember_figures", "model_limits")


@contextmanager
def stopwatches(guard: ContextGuard, totals: dict[str, int]) -> Iterator[None]:
    """Accumulate the wall time of each step prepare() calls (wrappers cost ~0.3 µs each)."""
    import shared.guard as guard_module

    def wrap(fn: Callable[..., Any], label: str) -> Callable[..., Any]:
        def timed_call(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                totals[label] = totals.get(label, 0) + time.perf_counter_ns() - started
        return timed_call

    saved_module = {n: getattr(guard_module, n) for n in GUARD_FUNCTIONS}
    for name, fn in saved_module.items():
        setattr(guard_module, name, wrap(fn, name))
    for name in GUARD_METHODS:
        setattr(guard, name, wrap(getattr(guard, name), f"ContextGuard.{name}"))
    guard.store.read_view = wrap(guard.store.read_view,  # type: ignore[method-assign]
                                 "store.read_view (one EVALSHA + reply parsing)")
    try:
        yield
    finally:
        for name, fn in saved_module.items():
            setattr(guard_module, name, fn)
        for name in GUARD_METHODS:
            guard.__dict__.pop(name, None)
        guard.store.__dict__.pop("read_view", None)


def evalsha_stats(client: redis.Redis) -> tuple[int, int]:
    """(calls, usec) of EVALSHA on the whole Redis server so far."""
    stats = client.info("commandstats").get("cmdstat_evalsha") or {}
    return int(stats.get("calls", 0)), int(stats.get("usec", 0))


def breakdown(guard: ContextGuard, session_id: str, calls: int,
              client: redis.Redis) -> tuple[float, dict[str, float], tuple[int, float]]:
    """Mean µs per prepare by step, and the server's µs per EVALSHA meanwhile."""
    totals: dict[str, int] = {}
    calls_before, usec_before = evalsha_stats(client)
    with stopwatches(guard, totals):
        started = time.perf_counter_ns()
        for _ in range(calls):
            guard.prepare(session_id, SYSTEM_PROMPT, TOOLS, MAX_TOKENS, MODEL, pending=PENDING)
        total = (time.perf_counter_ns() - started) / calls / 1e3
    calls_after, usec_after = evalsha_stats(client)
    server = (calls_after - calls_before,
              (usec_after - usec_before) / max(1, calls_after - calls_before))
    return total, {k: v / calls / 1e3 for k, v in totals.items()}, server


def profile_prepare(guard: ContextGuard, session_id: str, calls: int, top: int) -> str:
    """Top functions by own time under cProfile, per prepare call."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        guard.prepare(session_id, SYSTEM_PROMPT, TOOLS, MAX_TOKENS, MODEL, pending=PENDING)
    profiler.disable()
    raw_stats: dict[Any, Any] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = []
    for (filename, line, name), (_cc, nc, tt, ct, _callers) in raw_stats.items():
        short = filename.split("site-packages/")[-1].replace(os.getcwd() + os.sep, "")
        rows.append((tt, ct, nc, f"{short}:{line}({name})"))
    rows.sort(reverse=True)
    lines = ["| function | calls per prepare | own µs | cumulative µs |", "|---|---|---|---|"]
    for tt, ct, nc, where in rows[:top]:
        lines.append(f"| `{where}` | {nc / calls:.1f} | {tt / calls * 1e6:.1f} | "
                     f"{ct / calls * 1e6:.1f} |")
    return "\n".join(lines)


# -- main -------------------------------------------------------------------------------
@dataclass
class Env:
    store: SessionStore
    broker_url: str
    queue: str
    prefix: str
    client: redis.Redis


def cleanup(env: Env) -> None:
    for key in env.client.scan_iter(match=f"{env.prefix}:*", count=1000):
        env.client.delete(key)
    broker = redis.Redis.from_url(env.broker_url)
    broker.delete(env.queue)
    for key in broker.scan_iter(match=f"_kombu.binding*{env.queue}*", count=100):
        broker.delete(key)
    broker.close()


def fmt(value: float) -> str:
    return f"{value:.3f}" if value < 10 else f"{value:.1f}"


def met(ok: bool) -> str:
    return "met" if ok else "NOT met"




def run(args: argparse.Namespace) -> None:
    prefix = "bg" + uuid.uuid4().hex[:8]
    queue = f"bench_guard_{prefix}"
    config = StoreConfig(key_prefix=prefix, socket_timeout=5, connect_timeout=5)
    client = connect(args.redis_url, config)
    client.ping()
    store = SessionStore(client, config)
    env = Env(store, args.broker_url, queue, prefix, client)
    enqueuer = CeleryEnqueuer(publisher_app(args.broker_url), queue=queue)
    guard = ContextGuard(store, enqueuer)
    load_before = loadavg()
    try:
        report(args, env, guard)
    finally:
        cleanup(env)
    print(f"\nLoad average (1, 5, 15 min): {load_before} before, {loadavg()} after, on "
          f"{os.cpu_count()} CPUs.")


def row(label: str, s: Series, length: int | str | None = None) -> str:
    lo, hi = s.p99_spread
    cells = [label] + ([str(length)] if length is not None else [])
    cells += [fmt(s.p50), fmt(s.p99), f"{fmt(lo)}-{fmt(hi)}", fmt(s.mean), fmt(s.cpu_p50),
              fmt(s.cpu_p99)]
    return "| " + " | ".join(cells) + " |"


def header(with_length: bool) -> str:
    cells = ["configuration"] + (["history (messages)"] if with_length else [])
    cells += ["p50 ms", "p99 ms", "p99 range over rounds", "mean ms", "CPU p50 ms", "CPU p99 ms"]
    return "| " + " | ".join(cells) + " |\n" + "|---" * len(cells) + "|"




def report(args: argparse.Namespace, env: Env, guard: ContextGuard) -> None:
    store = env.store
    sizes = sorted(int(s) for s in args.sizes.split(","))
    turns = demo_turns(max(40, max(sizes) // 5 + 2 * args.tail_turns + 40), seed=args.seed)
    sessions: dict[int, tuple[str, SessionShape]] = {}
    for size in sizes:
        sess = shape(turns, args.tail_turns, size)
        sid = f"prep-{size}"
        build_session(store, sid, sess)
        sessions[size] = (sid, sess)
    big, small = max(sizes), min(sizes)
    big_sid, big_shape = sessions[big]
    cold = ContextGuard(store, guard.enqueuer, view_cache=ViewCache(0, 0))
    for sid, _sess in sessions.values():
        for g in (guard, cold):
            view = g.prepare(sid, SYSTEM_PROMPT, TOOLS, MAX_TOKENS, MODEL, pending=PENDING)
            if view.report.truncated or view.report.enqueued:
                raise SystemExit(f"{sid}: the view is not a steady state: {view.report}")
    sent = guard.prepare(big_sid, SYSTEM_PROMPT, TOOLS, MAX_TOKENS, MODEL, pending=PENDING)
    view_raw = store.read_view(big_sid)
    view_messages = len(view_raw.decode_messages())
    view_bytes = sum(len(m) for m in view_raw.messages)
    in_memory = big_shape.prefix + big_shape.tail

    def prep(g: ContextGuard, sid: str) -> Callable[[], Any]:
        return lambda: g.prepare(sid, SYSTEM_PROMPT, TOOLS, MAX_TOKENS, MODEL, pending=PENDING)

    # The benchmark's own ~20k pre-built messages would otherwise be walked by every full
    # collection and inflate the guard's tail latency; an agent process does not hold them.
    gc.collect()
    gc.freeze()
    warm = {size: Series() for size in sizes}
    cold_s = {size: Series() for size in sizes}
    decode_only, ping = Series(), Series()
    naive_mem, naive_redis = Series(), Series()
    busy: list[float] = []
    for _ in range(args.rounds):
        busy.append(wait_for_quiet(args.quiet, args.quiet_wait))
        for size in sizes:
            warm[size].add(timed(prep(guard, sessions[size][0]), args.calls))
            cold_s[size].add(timed(prep(cold, sessions[size][0]), args.cold_calls))
        decode_only.add(timed(view_raw.decode_messages, args.cold_calls))
        ping.add(timed(env.client.ping, args.calls))
        naive_mem.add(timed(lambda: naive_total(in_memory), args.naive_calls))
        naive_redis.add(timed(lambda: naive_from_redis(store, big_sid), args.naive_calls))

    print("## Guard (hot path)\n")
    command = " ".join(["scripts/bench_guard.py", *sys.argv[1:]])
    print(f"Command: `.venv/bin/python {command}` (real Redis 127.0.0.1:6379, "
          f"store db {args.redis_url.rsplit('/', 1)[-1]}, broker db "
          f"{args.broker_url.rsplit('/', 1)[-1]}, unique key prefix and queue, cleaned up; "
          f"{args.rounds} rounds, every configuration run in each round (interleaved), "
          f"{args.calls} warm calls per round (cold: {args.cold_calls}, naive: "
          f"{args.naive_calls}); each figure is the median over the rounds; CPU = this "
          "thread's CPU time, which scheduling delays on a busy machine do not inflate).\n")
    tail_tokens = sum(DEFAULT_COUNTER.message(m) for m in big_shape.tail)
    print(f"Sessions: `generate_session` (seed {args.seed}) coding-agent turns; a summary "
          f"record ({sent.report.budget.summary} tokens, sections + fact ledger) committed with "
          f"`commit_summary` at the watermark; after it the same {len(big_shape.tail)} recent "
          f"messages ({args.tail_turns} turns, ~{tail_tokens} tokens, "
          f"{view_bytes // 1024} KiB of JSON) in every session. "
          f"`prepare(model='gpt-4o')` gets the system prompt, 4 tools, max_tokens {MAX_TOKENS} "
          "and one pending user message; the view is within budget (no truncation, no "
          "enqueue), as between two compactions. *Warm*: the guard process holds the "
          "session's decoded view (one incremental read, nothing new); *cold*: "
          "`ViewCache(0, 0)`, every call reads and decodes the whole view.\n")
    print("Other load on the machine before each round (share of both CPUs busy over 1 s): "
          + ", ".join(f"{b:.0%}" for b in busy) + ".\n")
    print(header(True))
    for size in sizes:
        print(row("`prepare`, warm", warm[size], sessions[size][1].length))
    for size in sizes:
        print(row("`prepare`, cold (whole view read and decoded)", cold_s[size],
                  sessions[size][1].length))
    for label, s in ((f"decoding the {view_messages} messages of the view alone", decode_only),
                     ("naive guard, messages in memory", naive_mem),
                     ("naive guard, messages loaded from Redis", naive_redis)):
        print(row(label, s, big_shape.length))
    print(row("reference: Redis `PING` round trip", ping, "-"))

    print("\nPer round (other load before it; p99 ms at "
          f"{big_shape.length} messages):\n")
    print("| round | other load | warm p99 | cold p99 | PING p99 |")
    print("|---|---|---|---|---|")
    for i, load in enumerate(busy):
        print(f"| {i + 1} | {load:.0%} | {fmt(percentile(warm[big].rounds[i], 99))} | "
              f"{fmt(percentile(cold_s[big].rounds[i], 99))} | "
              f"{fmt(percentile(ping.rounds[i], 99))} |")

    loop = turn_bench(args, env, guard, turns, big_shape)

    speed_mem = ratio_median(naive_mem, warm[big], statistics.median)
    speed_redis = ratio_median(naive_redis, warm[big], statistics.median)
    speed_cold = ratio_median(naive_mem, cold_s[big], statistics.median)
    growth = ratio_median(warm[big], warm[small], statistics.median)
    growth_p99 = ratio_median(warm[big], warm[small], lambda r: percentile(r, 99))
    growth_cold = ratio_median(cold_s[big], cold_s[small], statistics.median)
    print("\nTargets (ratios taken within each round, then the median over rounds):\n")
    print(f"- `prepare` p99 <= 1 ms at {big_shape.length} messages: warm {fmt(warm[big].p99)} ms "
          f"({met(warm[big].p99 <= 1)}), after a turn {fmt(loop.p99)} ms "
          f"({met(loop.p99 <= 1)}); cold {fmt(cold_s[big].p99)} ms ({met(cold_s[big].p99 <= 1)})"
          f", of which decoding the view's {view_messages} messages is {fmt(decode_only.p99)} ms"
          f" at p99 ({fmt(decode_only.p50)} ms p50). CPU p99: warm {fmt(warm[big].cpu_p99)}, "
          f"after a turn {fmt(loop.cpu_p99)}, cold {fmt(cold_s[big].cpu_p99)} ms. p50: warm "
          f"{fmt(warm[big].p50)}, after a turn {fmt(loop.p50)}, cold {fmt(cold_s[big].p50)} ms.")
    print(f"- >= 50x faster than the naive guard (p50 / p50): warm {speed_mem:.0f}x against the "
          f"naive guard on an in-memory list, {speed_redis:.0f}x against it loading from "
          f"Redis; cold {speed_cold:.0f}x against the in-memory one ({met(speed_cold >= 50)}).")
    print(f"- from {sessions[small][1].length} to {big_shape.length} messages of history the "
          f"time grows < 1.5x: warm p50 {growth:.2f}x, p99 {growth_p99:.2f}x "
          f"({met(growth < 1.5 and growth_p99 < 1.5)}); cold p50 {growth_cold:.2f}x "
          f"({met(growth_cold < 1.5)}).")
    if args.profile_calls:
        where_time_goes(args, env, guard, big_sid, big_shape.length)


def where_time_goes(args: argparse.Namespace, env: Env, guard: ContextGuard, sid: str,
                    length: int) -> None:
    total, parts, (server_calls, server_us) = breakdown(guard, sid, args.profile_calls,
                                                       env.client)
    print(f"\nWhere a warm `prepare` spends its time ({length} messages; {args.profile_calls} "
          "calls with a stopwatch around each step; mean µs per call, so scheduling delays "
          "count too):\n")
    print("| step | µs per prepare | share |")
    print("|---|---|---|")
    for label, value in sorted(parts.items(), key=lambda kv: -kv[1]):
        if value >= 1:
            print(f"| {label} | {value:.0f} | {value / total:.0%} |")
    rest = total - sum(parts.values())
    print(f"| the rest of `prepare` (glue, budget arithmetic, report) | {rest:.0f} | "
          f"{rest / total:.0%} |")
    print(f"| **total** | {total:.0f} | 100% |")
    print(f"\nRedis server side meanwhile: {server_us:.0f} µs per EVALSHA (commandstats over "
          f"{server_calls} EVALSHA calls on the shared server, {args.profile_calls} of them "
          "ours).")
    print(f"\nTop functions by own time (cProfile, {args.profile_calls} warm calls; the "
          "profiler roughly doubles Python-heavy figures, socket waits are real):\n")
    print(profile_prepare(guard, sid, args.profile_calls, args.profile_top))


def turn_bench(args: argparse.Namespace, env: Env, guard: ContextGuard,
               turns: list[list[Message]], big: SessionShape) -> Series:
    """record_turn and the prepare after it; returns the latter's series.

    Publishing is measured both ways in the same rounds: ``guard``'s
    ``CeleryEnqueuer`` publishes the lean way (one LPUSH), a second guard's
    ``CeleryEnqueuer(lean=False)`` through ``send_task`` (the path before).
    """
    store = env.store
    sid = "turn-bench"
    build_session(store, sid, big)
    turn = turns[-args.tail_turns - 1]
    next_user = turns[-args.tail_turns][:1]
    if not isinstance(guard.enqueuer, CeleryEnqueuer) or guard.enqueuer.publisher is None:
        raise SystemExit("the broker must be a plain redis:// URL (the lean publish is measured)")
    classic = ContextGuard(store, CeleryEnqueuer(guard.enqueuer.app, queue=env.queue,
                                                 lean=False))
    bench = LoopBench(guard, store, sid, turn, next_user, big.length)
    before = LoopBench(classic, store, sid, turn, next_user, big.length)
    broker = redis.Redis.from_url(env.broker_url)
    for b in (bench, before):
        b.run(20, publish=True)  # connect the publisher, load the scripts
    queued_before = broker.llen(env.queue)
    publish_s, classic_s, coalesced, after = Series(), Series(), Series(), Series()
    parts: dict[str, Series] = {}
    busy: list[float] = []
    for _ in range(args.rounds):
        busy.append(wait_for_quiet(args.quiet, args.quiet_wait))
        turn_sample, prep_sample = bench.run(args.turn_calls, publish=True)
        publish_s.add(turn_sample)
        after.add(prep_sample)
        classic_s.add(before.run(args.turn_calls, publish=True)[0])
        turn_sample, prep_sample = bench.run(args.turn_calls, publish=False)
        coalesced.add(turn_sample)
        after.rounds[-1].extend(prep_sample[0])
        after.cpu_rounds[-1].extend(prep_sample[1])
        for name, sample in bench.parts(args.turn_calls).items():
            parts.setdefault(name, Series()).add(sample)
        parts.setdefault("send_task", Series()).add(timed(
            lambda: publish(classic.enqueuer, store.tenant, sid), args.turn_calls))
    published = broker.llen(env.queue) - queued_before
    broker.close()
    # the two publishing runs, the lean publish part and the send_task part
    expected = args.rounds * args.turn_calls * 4
    turn_tokens = sum(DEFAULT_COUNTER.message(m) for m in turn)
    print(f"\n`record_turn` and the `prepare` after it ({len(turn)} messages, ~{turn_tokens} "
          "tokens per turn; provider usage passed, so the append also writes the calibration; "
          f"session of {big.length} messages; `CeleryEnqueuer` publishing to the Redis broker, "
          "the lean way (one LPUSH of the message `send_task` writes) and, in the same "
          "rounds, through `send_task` (`lean=False`, the path before); before each pair, "
          "untimed: the turn is cut off again (`truncate_after`) and `prepare` runs once; "
          f"{args.turn_calls} calls per round and case; {published} jobs reached the queue, "
          f"{expected} expected; other load before each round: "
          + ", ".join(f"{b:.0%}" for b in busy) + "):\n")
    print(header(False))
    rows = [("`record_turn`, pending flag cleared: publishes every call (lean)", publish_s),
            ("`record_turn`, the same through `send_task` (before)", classic_s),
            ("`record_turn`, pending flag set: coalesced, no publish", coalesced),
            ("`prepare` right after `record_turn` (reads and decodes that turn)", after)]
    rows += [(f"part: {label}", parts[name]) for name, label in (
        ("encode", "`store.encode` (validate, JSON, estimate)"),
        ("append", "`store.append_encoded` (one script: append, request id, pending flag "
                   "set, calibration fields)"),
        ("append_coalesced", "the same, pending flag already set"),
        ("publish", "`CeleryEnqueuer.enqueue`, lean (`as_task_v2` + one LPUSH)"),
        ("send_task", "`CeleryEnqueuer.enqueue` through `send_task` (before)"))]
    for label, s in rows:
        print(row(label, s))
    print(f"\n- `record_turn` p99 <= 2 ms including the enqueue: publishing "
          f"{fmt(publish_s.p99)} ms ({met(publish_s.p99 <= 2)}; through `send_task` "
          f"{fmt(classic_s.p99)} ms), coalesced {fmt(coalesced.p99)} "
          f"ms ({met(coalesced.p99 <= 2)}); CPU p99 {fmt(publish_s.cpu_p99)} / "
          f"{fmt(coalesced.cpu_p99)} ms; p50 {fmt(publish_s.p50)} / {fmt(coalesced.p50)} ms "
          f"(`send_task`: p50 {fmt(classic_s.p50)}, CPU p99 {fmt(classic_s.cpu_p99)} ms). "
          f"The publish alone: lean {fmt(parts['publish'].p50)} / {fmt(parts['publish'].p99)}"
          f" ms p50 / p99, `send_task` {fmt(parts['send_task'].p50)} / "
          f"{fmt(parts['send_task'].p99)} ms.")
    return after


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/5",
                        help="session store (its own db; keys use a unique prefix)")
    parser.add_argument("--broker-url", default="redis://127.0.0.1:6379/6",
                        help="Celery broker for the enqueue (a unique queue name is used)")
    parser.add_argument("--sizes", default="100,1000,10000", help="history lengths (messages)")
    parser.add_argument("--tail-turns", type=int, default=8,
                        help="recent turns after the watermark")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000, help="warm prepare calls per round")
    parser.add_argument("--cold-calls", type=int, default=300,
                        help="cold prepare calls per round")
    parser.add_argument("--naive-calls", type=int, default=5, help="naive calls per round")
    parser.add_argument("--turn-calls", type=int, default=500,
                        help="record_turn calls per round and case")
    parser.add_argument("--profile-calls", type=int, default=1000, help="0: no breakdown")
    parser.add_argument("--profile-top", type=int, default=12)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quiet", type=float, default=0.5,
                        help="wait before each round until other load is under this share")
    parser.add_argument("--quiet-wait", type=float, default=0.0,
                        help="longest wait for a quiet machine per round, seconds (0: none)")
    run(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
