"""Rolling-upgrade check: REAL old code beside the new code, on one Redis and one broker.

docs/upgrading.md promises that old and new guards and workers run together during a
rolling upgrade ("compatible both ways"). This runs it: the old commit's tree is
extracted with ``git archive <commit> | tar -x`` into a temporary directory (the
checkout is not touched), and its guards and ``celery worker`` processes run from it
(``PYTHONPATH`` and working directory = that tree, the same virtualenv); the new ones
run from this checkout. Scenarios, each on Redis databases of their own (a
``redis-server`` this script starts on a free port) and real workers (threads pool)
summarizing through the real ``openai`` client against the fake OpenAI server:

- ``a``: new guards, old workers;
- ``b``: old guards, new workers;
- ``c``: mixed: one old and one new worker, and each session's turns alternating
  between an old and a new guard process;
- ``d``: rollback: new guards and workers for the first half of the turns, then (after
  the queue drained) old guards and workers on the same sessions.

The agent is this process: it makes each turn (a user message, tool calls with bulky
results, an answer) and sends it to a guard process (``--serve-guard``, one JSON line per
request), which calls ``prepare`` and ``record_turn`` with the tree it runs. Now and then
the turn is sent again with the same request id through another guard (an agent's
retry after a lost reply, perhaps on the other version). Checked, with the new code:

- no job fails or raises (each worker's ``compaction.end`` lines, ERROR lines of every log,
  errors a guard raised);
- every view is valid for OpenAI (``validate_view``: tool pairs intact) and fits the
  window (estimate + reserve);
- the log holds every acknowledged turn once, in order (read by the new and the old code);
- the view's watermark and version, and the stored state's, never move back;
- after the drain, no session is still due (the new compactor's plan) and every session
  that became due was compacted;

Exceptions docs/upgrading.md lists are reported as ``expected`` (with the paragraph they
come from); anything else is a finding, and the exit status is 1.

    PYTHONPATH=. .venv/bin/python scripts/upgrade_check.py --old 02f23f1
    PYTHONPATH=. .venv/bin/python scripts/upgrade_check.py --old b6a157e --minutes 2 --scenarios ad
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
MODEL = "gpt-4o"
WINDOW = 12_000
RESERVE = 1_000
SCENARIOS = {
    "n": "baseline: new guards + new workers (figures to compare with)",
    "a": "new guards + old workers",
    "b": "old guards + new workers",
    "c": "mixed guards (alternating per turn) + old and new workers",
    "d": "rollback: new guards + workers, then old ones on the same sessions"}
TREES = {"n": ("new", "new"), "a": ("new", "old"), "b": ("old", "new"), "c": ("mixed", "mixed"),
         "d": ("new", "new")}
"""Each scenario's guards and workers (``d`` turns to old ones for its second half)."""


# ============================================================== guard process (either tree)
def serve_guard(redis_url: str, broker_url: str, prefix: str, log_path: str) -> int:
    """A guard process of whichever tree ``PYTHONPATH`` names: one JSON request a line on
    stdin, one JSON reply a line on stdout. Uses only APIs every checked build has."""
    import logging

    logging.basicConfig(filename=log_path, level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    import shared
    from shared.core.config import StoreConfig
    from shared.enqueue import CeleryEnqueuer, publisher_app
    from shared.guard import ContextGuard
    from shared.store.sessions import SessionStore, connect

    config = StoreConfig(key_prefix=prefix, socket_timeout=5, connect_timeout=5)
    store = SessionStore(connect(redis_url, config), config)
    publisher = publisher_app(broker_url)
    guard = ContextGuard(store, CeleryEnqueuer(publisher), overrides={MODEL: WINDOW})
    out = sys.stdout
    sys.stdout = sys.stderr  # nothing but replies on the protocol stream
    for line in sys.stdin:
        req = json.loads(line)
        reply: dict[str, Any] = {}
        try:
            if req["op"] == "turn":
                if req.get("prepare", True):
                    view = guard.prepare(req["sid"], req["system"], max_tokens=RESERVE,
                                         model=MODEL, pending=req["pending"],
                                         fallback_messages=[])
                    r = view.report
                    if req.get("overflow"):  # the model refused it: recover, send that
                        view = guard.recover(req["sid"], req["overflow"], req["system"],
                                             max_tokens=RESERVE, model=MODEL,
                                             pending=req["pending"]) or view
                    r = view.report
                    reply["view"] = [m.model_dump(mode="json") for m in view.messages]
                    reply["report"] = {
                        "estimated": r.estimated_prompt_tokens, "reserve": r.budget.reserve,
                        "watermark": r.watermark, "version": r.version, "length": r.length,
                        "degraded": r.degraded, "truncated": r.truncated,
                        "due": r.budget.should_compact}
                reply["length"] = guard.record_turn(req["sid"], req["turn"],
                                                    request_id=req["rid"])
            elif req["op"] == "compact":  # a manual /compact, sent as `serve` sends it
                publisher.send_task("compaction.compact", args=[req["sid"]], queue="compaction",
                                    kwargs={"keep_recent": 4, "force": True,
                                            "tenant": store.tenant})
            elif req["op"] == "recall":
                reply["hits"] = [{"index": h.index, "text": h.text}
                                 for h in guard.recall(req["sid"], req["query"])]
            elif req["op"] == "read":
                state = store.state(req["sid"])
                store.load_view(req["sid"])  # parses summaries and state as this tree does
                reply["messages"] = [shape(m.model_dump(mode="json"))
                                     for m in store.messages(req["sid"])]
                reply["state"] = {"watermark": state.watermark, "version": state.version}
        except Exception as exc:  # the agent reports it (the trace for the curious)
            logging.getLogger("upgrade_check").warning("request %s failed", req.get("op"),
                                                       exc_info=True)
            reply["error"] = f"{type(exc).__name__}: {exc}"[:500]
        reply["origin"] = str(Path(shared.__file__).resolve().parent.parent)
        out.write(json.dumps(reply) + "\n")
        out.flush()
    return 0


def shape(m: dict[str, Any]) -> list[str]:
    """What identifies a stored message here: role, text, call ids (a duplicate differs
    from nothing else: every message of the run is unique)."""
    content = m.get("content") or ""
    text = content if isinstance(content, str) else json.dumps(content, sort_keys=True)
    calls = ",".join(c["id"] for c in m.get("tool_calls") or [])
    return [m["role"], text, calls, m.get("tool_call_id") or ""]


# ============================================================== orchestration (new tree)
@dataclass
class Guard:
    """A guard process (old or new tree) the agent sends turns to."""

    name: str
    tree: Path
    proc: subprocess.Popen[str]
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ask(self, req: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"guard {self.name} exited ({self.proc.poll()})")
        reply: dict[str, Any] = json.loads(line)
        if reply.get("origin") != str(self.tree.resolve()):
            raise RuntimeError(f"guard {self.name} runs {reply.get('origin')}, not {self.tree}")
        return reply

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def tree_env(tree: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment with ``tree`` alone leading ``PYTHONPATH`` (no trace of the other)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(extra or {})
    env["PYTHONPATH"] = str(tree)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def start_guard(name: str, tree: Path, run: Run) -> Guard:
    log = run.out / f"{run.scenario}-guard-{name}.log"
    cmd = [sys.executable, str(ROOT / "scripts" / "upgrade_check.py"), "--serve-guard",
           run.store_url, run.broker_url, run.prefix, str(log)]
    errors = (run.out / f"{run.scenario}-guard-{name}.stderr").open("w")
    proc = subprocess.Popen(cmd, cwd=tree, env=tree_env(tree), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=errors, text=True)
    guard = Guard(name, tree, proc)
    run.guards.append(guard)
    return guard


@dataclass
class Session:
    sid: str
    system: str
    expected: list[list[str]] = field(default_factory=list)
    last: tuple[str, list[dict[str, Any]]] | None = None
    watermark: int = 0
    version: int = 0
    state_version: int = 0
    due: bool = False
    starts: dict[int, int] = field(default_factory=dict)  # turn -> its user message's index
    sent: tuple[int, int, list[dict[str, Any]]] | None = None  # watermark, version, view


@dataclass
class Run:
    scenario: str
    old: Path
    out: Path
    store_url: str
    broker_url: str
    prefix: str
    rng: random.Random
    views: int = 0
    turns: int = 0
    retries: int = 0
    truncated: int = 0
    prefix_changes: int = 0
    overflows: int = 0
    manual: int = 0
    recalls: int = 0
    recall_misses: int = 0
    findings: list[str] = field(default_factory=list)
    expected: list[str] = field(default_factory=list)
    guards: list[Guard] = field(default_factory=list)
    workers: list[Any] = field(default_factory=list)
    retired: list[Any] = field(default_factory=list)
    jobs: dict[str, dict[str, int]] = field(default_factory=dict)

    def finding(self, text: str) -> None:
        if text not in self.findings:
            self.findings.append(text)
            print(f"  [{self.scenario}] FINDING {text}", flush=True)


OVERFLOW = ("Error code: 400 - {'error': {'message': \"This model's maximum context length "
            "is 11500 tokens. However, your messages resulted in 12100 tokens. Please reduce "
            "the length of the messages.\", 'type': 'invalid_request_error', 'param': "
            "'messages', 'code': 'context_length_exceeded'}}")
"""An overflow a turn's first call gets now and then (a stated limit: a learned window)."""


def unique_word(sid: str, k: int) -> str:
    """A word only turn ``k`` of ``sid`` has (in its user message): recall's target."""
    return f"zq{sid}x{k}"


def make_turn(rng: random.Random, sid: str, k: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A user message, then 1-2 tool calls with bulky results, then the answer. Calls
    re-read a few files (cheap stages drop superseded reads); now and then a result is
    huge (two of them outgrow the window: the guard truncates, a worker cuts inside the
    turn)."""
    words = ["alpha", "beta", "config", "retry", "cache", "parser", "token", "worker",
             "session", "budget", "window", "summary", "ledger", "redis", "queue"]
    user = {"role": "user", "content": f"[{sid}] turn {k}: fix issue {unique_word(sid, k)} "
                                       f"in src/mod_{k % 5}.py, keep the API stable"}
    calls = [{"id": f"call_{sid}_{k}_{j}", "name": rng.choice(["read_file", "read_file", "grep"]),
              "arguments": json.dumps({"path": f"src/mod_{rng.randrange(5)}.py"})}
             for j in range(rng.randint(1, 2))]
    out: list[dict[str, Any]] = [{"role": "assistant", "content": "", "tool_calls": calls}]
    for c in calls:
        size = rng.randint(3500, 6000) if rng.random() < 0.06 else rng.randint(150, 500)
        body = " ".join(rng.choice(words) for _ in range(size))
        out.append({"role": "tool", "tool_call_id": c["id"],
                    "content": f"{c['id']} result: {body}"})
    out.append({"role": "assistant", "content": f"[{sid}] done with turn {k}: changed "
                                                f"src/mod_{k % 5}.py ({rng.randint(1, 99)} lines)"})
    return user, out


def check_view(run: Run, s: Session, guard: Guard, reply: dict[str, Any]) -> None:
    from shared.core.messages import Message
    from shared.core.repair import validate_view

    r = reply["report"]
    run.views += 1
    run.truncated += int(r["truncated"])
    s.due = s.due or bool(r["due"])
    if r["estimated"] + r["reserve"] > WINDOW:
        run.finding(f"{guard.name}: view of {r['estimated']} + reserve {r['reserve']} tokens "
                    f"> window {WINDOW}")
    problems = validate_view([Message.model_validate(m) for m in reply["view"]], "openai")
    if problems:
        run.finding(f"{guard.name} ({guard.tree.name}): view not valid for OpenAI: "
                    f"{problems[:2]}")
    if not r["degraded"]:
        if r["watermark"] < s.watermark or r["version"] < s.version:
            run.finding(f"{guard.name}: {s.sid}'s view went back: watermark {s.watermark} -> "
                        f"{r['watermark']}, version {s.version} -> {r['version']}")
        s.watermark, s.version = max(s.watermark, r["watermark"]), max(s.version, r["version"])
    # the prompt prefix: the last view (less its pending turn) leads this one unless a
    # summary moved in between (a cheap-stage decision can change it too: counted)
    view = reply["view"][:-1]
    if s.sent is not None and s.sent[:2] == (r["watermark"], r["version"]) and \
            reply["view"][:len(s.sent[2])] != s.sent[2]:
        run.prefix_changes += 1
    s.sent = (r["watermark"], r["version"], view)


def turn(run: Run, s: Session, k: int, guard: Guard, others: list[Guard], store: Any) -> None:
    user, answer = make_turn(run.rng, s.sid, k)
    rid = secrets.token_hex(8)
    overflow = OVERFLOW if run.rng.random() < 0.03 else None
    run.overflows += int(overflow is not None)
    reply = guard.ask({"op": "turn", "sid": s.sid, "system": s.system, "pending": [user],
                       "turn": [user, *answer], "rid": rid, "overflow": overflow})
    if "error" in reply:
        run.finding(f"{guard.name} ({guard.tree.name}) raised on a turn: {reply['error']}")
        return  # not acknowledged: not expected in the log
    check_view(run, s, guard, reply)
    s.starts[k] = len(s.expected)
    s.expected += [shape(m) for m in [user, *answer]]
    s.last = (rid, [user, *answer])
    run.turns += 1
    if others and run.rng.random() < 0.15:  # the agent's retry: the reply was lost
        retry(run, s, run.rng.choice(others))
    state = store.state(s.sid)
    if run.rng.random() < 0.1:
        recall(run, s, guard, state.watermark)
    if run.rng.random() < 0.03:
        run.manual += 1
        reply = guard.ask({"op": "compact", "sid": s.sid})
        if "error" in reply:
            run.finding(f"{guard.name} ({guard.tree.name}) could not send /compact: "
                        f"{reply['error']}")
    if state.version < s.state_version:
        run.finding(f"{s.sid}: stored version went back {s.state_version} -> {state.version}")
    s.state_version = max(s.state_version, state.version)


def recall(run: Run, s: Session, guard: Guard, watermark: int) -> None:
    """A compacted turn's unique word: recall must bring back its user message."""
    below = [k for k, at in s.starts.items() if at < watermark]
    if not below:
        return
    k = run.rng.choice(below)
    run.recalls += 1
    reply = guard.ask({"op": "recall", "sid": s.sid, "query": unique_word(s.sid, k)})
    if "error" in reply:
        run.finding(f"{guard.name} ({guard.tree.name}) raised on recall: {reply['error']}")
    elif not any(h["index"] == s.starts[k] and unique_word(s.sid, k) in h["text"]
                 for h in reply["hits"]):
        run.recall_misses += 1
        run.finding(f"{guard.name} ({guard.tree.name}): recall of {s.sid}'s turn {k} "
                    f"(message {s.starts[k]}, watermark {watermark}) missed: "
                    f"{[h['index'] for h in reply['hits']]}")


def retry(run: Run, s: Session, guard: Guard) -> None:
    """The last turn again with its request id: stored once, whichever version answers."""
    if s.last is None:
        return
    run.retries += 1
    rid, messages = s.last
    reply = guard.ask({"op": "turn", "sid": s.sid, "system": s.system, "prepare": False,
                       "pending": [], "turn": messages, "rid": rid})
    if "error" in reply:
        text = f"{guard.name} ({guard.tree.name}) raised on a retry with a request id: " \
               f"{reply['error']}"
        if "ValueError" in reply["error"] and guard.tree != ROOT:
            run.expected.append(f"{text} [upgrading.md, Order 2 and Rollback: a request "
                                "id's record written since c56336a]")
        else:
            run.finding(text)


def start_workers(run: Run, tree: Path, names: list[str], llm_url: str) -> list[Any]:
    from workers.harness.stack.worker_process import WorkerProcess

    settings = {"COMPACTION_BROKER_URL": run.broker_url, "COMPACTION_REDIS_URL": run.store_url,
                "COMPACTION_KEY_PREFIX": run.prefix, "COMPACTION_SUMMARIZER": "openai",
                "COMPACTION_SUMMARIZER_BASE_URL": llm_url, "COMPACTION_SUMMARIZER_API_KEY": "k",
                "COMPACTION_SUMMARIZER_MODEL": "gpt-4o-mini",
                "COMPACTION_SUMMARIZER_TIMEOUT": "10", "COMPACTION_SWEEP_SECONDS": "5"}
    probe = subprocess.run([sys.executable, "-c", "import workers.app, shared; "
                            "print(workers.app.__file__); print(shared.__file__)"],
                           cwd=tree, env=tree_env(tree, settings), capture_output=True,
                           text=True, timeout=120)
    if probe.returncode or any(not Path(p).resolve().is_relative_to(tree.resolve())
                               for p in probe.stdout.split()):
        raise RuntimeError(f"workers of {tree} would import {probe.stdout.split()} "
                           f"({probe.stderr[-500:]})")
    started = []
    for name in names:
        w = WorkerProcess(f"{run.scenario}-{name}-{secrets.token_hex(2)}", settings,
                          concurrency=2, log_path=run.out / f"{run.scenario}-worker-{name}.log")
        env = tree_env(tree, settings)
        with w.log_path.open("wb") as log:  # WorkerProcess.launch with the tree's cwd and path
            w.process = subprocess.Popen(w.command(), cwd=tree, env=env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        started.append(w)
    for w in started:
        w.wait_ready(90)
    run.workers += started
    return started


def left_over(run: Run) -> dict[str, Any]:
    """What is left: queued or unacknowledged jobs, pending flags (empty when drained)."""
    import redis

    from shared.enqueue import QUEUE

    broker = redis.Redis.from_url(run.broker_url)
    store = redis.Redis.from_url(run.store_url)
    try:
        queued = sum(int(broker.llen(k)) for k in
                     (QUEUE, *(f"{QUEUE}\x06\x16{p}" for p in (3, 6, 9))))
        flags = list(store.scan_iter(match=f"{run.prefix}:*:pending", count=1000))
        left: dict[str, Any] = {}
        if queued:
            left["queued"] = queued
        if int(broker.hlen("unacked")):
            left["unacked"] = int(broker.hlen("unacked"))
        if flags:
            left["pending"] = len(flags)
        return left
    finally:
        broker.close()
        store.close()


def drain(run: Run, timeout: float = 120) -> None:
    began = time.monotonic()
    while left_over(run) and time.monotonic() - began < timeout:
        time.sleep(0.5)
    left = left_over(run)
    if left:
        run.finding(f"not drained within {timeout:.0f} s: {left}")


def stop_workers(run: Run, workers: list[Any]) -> None:
    for w in workers:
        w.stop()
        run.workers.remove(w)
        run.retired.append(w)


def final_checks(run: Run, sessions: list[Session], store: Any, old_guard: Guard,
                 llm_url: str) -> dict[str, int]:
    from workers.compactor import Compactor
    from workers.harness.reliability.common import integrity
    from workers.summarizer.engine import SummaryEngine
    from workers.summarizer.providers import OpenAIClient

    compactor = Compactor(store, SummaryEngine(OpenAIClient("gpt-4o-mini", base_url=llm_url,
                                                            api_key="k")))
    figures = {"sessions": len(sessions), "compacted": 0, "still_due": 0}
    for s in sessions:
        got = [shape(m.model_dump(mode="json")) for m in store.messages(s.sid)]
        if got != s.expected:
            first = next((i for i, (a, b) in enumerate(zip(got, s.expected, strict=False))
                          if a != b), min(len(got), len(s.expected)))
            run.finding(f"{s.sid}: the log differs from the acknowledged turns at {first} "
                        f"({len(got)} stored, {len(s.expected)} acknowledged)")
        old = old_guard.ask({"op": "read", "sid": s.sid})
        if "error" in old:
            run.finding(f"the old code cannot read {s.sid}: {old['error']}")
        elif old["messages"] != s.expected:
            run.finding(f"the old code reads {s.sid}'s log differently "
                        f"({len(old['messages'])} vs {len(s.expected)})")
        state = store.state(s.sid)
        figures["compacted"] += int(state.watermark > 0)
        plan = compactor.plan(s.sid, store.load_view(s.sid), force=False, keep_recent=None)
        if not isinstance(plan, str):
            figures["still_due"] += 1
            run.finding(f"{s.sid} still due after the drain: watermark {state.watermark}, "
                        f"log {store.length(s.sid)}")
        if s.due and state.watermark == 0:
            run.finding(f"{s.sid} became due and was never compacted")
        for problem in integrity(store, s.sid):
            run.finding(f"{s.sid}: {problem}")
    return figures


def job_outcomes(run: Run) -> None:
    from workers.harness.stack.worker_process import parse_job_lines

    for w in run.retired + run.workers:
        tally: dict[str, int] = {}
        for unknown in sorted(set(re.findall(r"ignoring (COMPACTION_\w+)", w.log()))):
            run.expected.append(f"workers of this build ignore {unknown}, with a warning "
                                "[upgrading.md, What is compatible: Settings]")
        for job in parse_job_lines(w.log().splitlines()):
            status = str(job.get("status"))
            if status == "compacted":  # the fake LLM never fails: an offline summary is news
                status = f"compacted:{job.get('summary_kind')}"
                if job.get("summary_kind") != "llm":
                    run.finding(f"{w.name}: a {job.get('summary_kind')} summary although "
                                f"the LLM answers: {json.dumps(job)[:300]}")
            elif status not in ("skipped", "covered", "conflict", "lease_lost"):
                run.finding(f"{w.name}: job {status}: {json.dumps(job)[:300]}")
            tally[status] = tally.get(status, 0) + 1
        run.jobs[w.name] = tally


def log_errors(run: Run) -> None:
    """ERROR lines of every log of the scenario (a worker's tracebacks too); a guard's
    failed request is reported from its reply, not here."""
    for path in sorted(run.out.glob(f"{run.scenario}-*")):
        pattern = r"\b(ERROR|CRITICAL)\b" if "-guard-" in path.name else \
            r"\b(ERROR|CRITICAL)\b|Traceback"
        with contextlib.suppress(OSError):
            for line in path.read_text(errors="replace").splitlines():
                if re.search(pattern, line):
                    run.finding(f"{path.name}: {line.strip()[:240]}")


def scenario(run: Run, minutes: float, llm_url: str, rounds: int = 36) -> dict[str, Any]:
    from shared.core.config import StoreConfig
    from shared.store.sessions import SessionStore, connect

    config = StoreConfig(key_prefix=run.prefix, socket_timeout=5, connect_timeout=5)
    store = SessionStore(connect(run.store_url, config), config)
    old, new = run.old, ROOT
    pick = {"new": [new, new], "old": [old, old], "mixed": [old, new]}
    guard_trees, worker_trees = (pick[w] for w in TREES[run.scenario])
    guards = [start_guard(f"{i}{'old' if t != ROOT else 'new'}", t, run)
              for i, t in enumerate(guard_trees)]
    workers = [start_workers(run, t, [f"{i}{'old' if t != ROOT else 'new'}"], llm_url)[0]
               for i, t in enumerate(worker_trees)]
    sessions = [Session(f"{run.scenario}s{i}", f"You are agent {i}.") for i in range(6)]
    pause = max(0.0, minutes * 60 / rounds - 0.3)
    for k in range(rounds):
        if run.scenario == "d" and k == rounds // 2:
            drain(run)
            stop_workers(run, workers)
            for g in guards:
                g.stop()
            guards = [start_guard(f"{i}old-after", old, run) for i in range(2)]
            workers = start_workers(run, old, ["0old-after", "1old-after"], llm_url)
            for s in sessions:  # the agent retries its last turn after the switch
                retry(run, s, guards[0])
        for i, s in enumerate(sessions):
            # c: a session's turns alternate between the old and the new guard
            g = guards[(i + k) % 2] if run.scenario == "c" else guards[i % 2]
            others = [x for x in guards if x is not g]
            turn(run, s, k, g, others, store)
        time.sleep(pause)
    drain(run)
    old_reader = start_guard("reader-old", old, run)
    figures = final_checks(run, sessions, store, old_reader, llm_url)
    new_reader = start_guard("reader-new", new, run)
    for reader in (old_reader, new_reader):  # after the drain, every index job done
        for s in sessions:
            recall(run, s, reader, store.state(s.sid).watermark)
        reader.stop()
    for g in guards:
        g.stop()
    stop_workers(run, list(run.workers))
    job_outcomes(run)
    log_errors(run)
    return {**figures, "turns": run.turns, "views": run.views, "truncated": run.truncated,
            "prefix_changes": run.prefix_changes, "overflows": run.overflows,
            "manual_compacts": run.manual,
            "recalls": run.recalls, "recall_misses": run.recall_misses,
            "retries": run.retries, "jobs": run.jobs}


@contextlib.contextmanager
def old_tree(commit: str, repo: Path = ROOT) -> Iterator[Path]:
    """The commit's files in a temporary directory (``git archive``; no checkout)."""
    with tempfile.TemporaryDirectory(prefix=f"upgrade-{commit}-") as tmp:
        archive = subprocess.run(["git", "archive", commit], cwd=repo, capture_output=True,
                                 check=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        yield Path(tmp)


def has_commit(commit: str, repo: Path = ROOT) -> bool:
    """Whether ``repo``'s history holds ``commit`` (a shallow clone, or a copy of the
    tracked files such as .ci/run's, does not)."""
    return subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=repo,
                          capture_output=True).returncode == 0


def run_check(commit: str, minutes: float, scenarios: str, out: Path,
              print_to: IO[str] = sys.stdout, repo: Path = ROOT,
              rounds: int = 36) -> dict[str, Any]:
    """Every scenario asked for against ``commit`` (from ``repo``'s history); what each
    found."""
    from workers.harness.fakes.openai_server import FakeOpenAIServer
    from workers.harness.fakes.summaries import SummarizerResponder
    from workers.harness.stack.redis_server import start_server

    results: dict[str, Any] = {}
    server = start_server()
    llm = FakeOpenAIServer(responder=SummarizerResponder(), latency=0.05)
    llm.start()
    try:
        with old_tree(commit, repo) as tree:
            for n, name in enumerate(scenarios):
                print(f"[{time.strftime('%H:%M:%S')}] {commit} scenario {name}: "
                      f"{SCENARIOS[name]}", file=print_to, flush=True)
                base = server.url.rsplit("/", 1)[0]
                run = Run(name, tree, out, f"{base}/{2 * n}", f"{base}/{2 * n + 1}",
                          "up" + secrets.token_hex(3), random.Random(n))
                began = time.monotonic()
                try:
                    figures = scenario(run, minutes, llm.base_url, rounds)
                finally:  # whatever went wrong: no process of the run is left
                    for g in run.guards:
                        if g.proc.poll() is None:
                            g.stop()
                    for w in list(run.workers):
                        w.stop()
                results[name] = {"what": SCENARIOS[name], **figures,
                                 "seconds": round(time.monotonic() - began, 1),
                                 "findings": run.findings, "expected": sorted(set(run.expected))}
                llm.reset()
    finally:
        llm.stop()
        server.remove()
    return results


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-guard":
        return serve_guard(*sys.argv[2:6])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", required=True, help="the old build's commit (e.g. 02f23f1)")
    ap.add_argument("--minutes", type=float, default=1.0, help="per scenario, turns paced")
    ap.add_argument("--scenarios", default="abcd", help="any of n (baseline), a, b, c, d")
    ap.add_argument("--rounds", type=int, default=36, help="turns per session")
    ap.add_argument("--out", default=None, help="directory for the logs")
    ap.add_argument("--repo", type=Path, default=ROOT,
                    help="the git repository holding the old commit (default: this checkout)")
    args = ap.parse_args()
    if not has_commit(args.old, args.repo):
        print(f"upgrade_check: no commit {args.old} in {args.repo} (fetch the history: "
              "git fetch --unshallow)", file=sys.stderr)
        return 2
    out = Path(args.out or tempfile.mkdtemp(prefix="upgrade-check-"))
    out.mkdir(parents=True, exist_ok=True)
    results = run_check(args.old, args.minutes, args.scenarios, out, repo=args.repo,
                        rounds=args.rounds)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    failed = False
    for name, r in results.items():
        print(f"\n## {args.old} ({name}) {r['what']}: {r['seconds']} s")
        print(f"sessions {r['sessions']}, turns {r['turns']}, views {r['views']} "
              f"(truncated {r['truncated']}, prefix changes without a summary "
              f"{r['prefix_changes']}), retries by request id {r['retries']}, "
              f"compacted {r['compacted']}/{r['sessions']}, still due {r['still_due']}")
        print(f"overflows recovered {r['overflows']}, manual /compact {r['manual_compacts']}, "
              f"recalls {r['recalls']} "
              f"(missed {r['recall_misses']}); jobs per worker: {r['jobs']}")
        for e in r["expected"]:
            print(f"  expected: {e}")
        for f in r["findings"]:
            print(f"  FINDING: {f}")
        failed = failed or bool(r["findings"])
    print(f"\nlogs in {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stops workers and Redis
    sys.exit(main())
