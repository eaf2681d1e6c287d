"""How long one call holds Redis, server side: every script and large command of the
guard's and the workers' paths, on real sessions, by SLOWLOG.

Redis runs one command at a time for every agent and worker: a script that runs
for milliseconds stalls every guard call queued behind it. This measures each
call's time inside Redis (SLOWLOG, threshold 0, only this run's connections by
client name), per phase and script, on sessions of real turns
(``_guard_sessions.history``) of each ``--sizes``:

- ``seed``: the session imported in appends of 500 messages (the most one append takes);
- ``append``: ``--appends`` guard turns (a request id, the pending flag), as ``record_turn``;
- ``commit``: a summary at ~95% of the log; ``index``: the worker's recall indexing
  of everything below it (``index_compacted`` until nothing is left);
- with ``--audit``: a cold view read, the worker's view read (with counts), a rewind and
  back, an edit of the last tool call (``truncate_after``, with its recall cut), a deep
  edit at half the log, and ``delete_session`` (with the index).

Arms: ``--arms before=/work/wt-main,after=.`` runs each arm's code (its checkout first
on ``sys.path``) in alternation, ``--rounds`` times, so that both see the same minutes
of a noisy machine; the figures are pooled per arm. SLOWLOG is server-wide: it is
reset before each phase and read after it, and its two settings are restored at the
end (the log is reset then too: it holds nothing but this run's flood). SLOWLOG
durations are wall time of the command inside Redis: CPU contention inflates them,
so compare arms run together, on p50 first.

    PYTHONPATH=.:scripts .venv/bin/python scripts/bench_redis_blocking.py \\
        [--url redis://127.0.0.1:6379/11] [--sizes 1000,10000] [--appends 200] \\
        [--arms before=../wt-main,after=.] [--rounds 2] [--audit] [--json out.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CLIENT = "bench-redis-blocking"


def _arm_path() -> None:
    """In a child, the arm's checkout (``BENCH_ARM``) comes first on ``sys.path``."""
    arm = os.environ.get("BENCH_ARM")
    if not arm:
        return
    root = Path(arm).resolve()
    sys.path[:0] = [str(root), str(root / "scripts")]
    # _timing puts its own checkout first unless it is on the path already: last, then
    sys.path.append(str(HERE.parent))


# -- the child: one arm's code, one run of every phase ---------------------------------
def _script_names() -> dict[str, str]:
    from importlib import resources

    folder = resources.files("shared.store").joinpath("lua")
    out = {}
    for item in folder.iterdir():
        if item.name.endswith(".lua"):
            sha = hashlib.sha1(item.read_text(encoding="utf-8").encode()).hexdigest()
            out[sha] = item.name
    return out


class Slowlog:
    """This run's calls as SLOWLOG saw them, by phase and script (or command)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.names = _script_names()
        self.figures: dict[str, list[int]] = defaultdict(list)
        self.lost: list[str] = []
        self.slowest: dict[str, tuple[int, str]] = {}

    def start(self) -> None:
        self.client.slowlog_reset()

    def read(self, phase: str) -> None:
        count = int(self.client.slowlog_len())
        max_len = int(self.client.config_get("slowlog-max-len")["slowlog-max-len"])
        if count >= max_len:
            self.lost.append(phase)  # entries fell off the end: its figures are partial
        for entry in self.client.slowlog_get(count):
            if entry["client_name"] != CLIENT.encode():
                continue
            words = entry["command"].split(b" ", 2)
            name = words[0].decode().upper()
            if name in {"SLOWLOG", "CONFIG", "CLIENT", "HELLO", "PING", "SCRIPT", "SELECT"}:
                continue
            if name in {"EVALSHA", "EVAL"} and len(words) > 1:
                name = self.names.get(words[1].decode(), "script?" + words[1][:8].decode())
            key, took = f"{phase}|{name}", int(entry["duration"])
            self.figures[key].append(took)
            if took > self.slowest.get(key, (0, ""))[0]:
                self.slowest[key] = (took, entry["command"][:100].decode(errors="replace"))
        self.client.slowlog_reset()


def _last_call_index(messages: list[Any]) -> int:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].tool_calls:
            return i
    return len(messages) - 1


def child(url: str, sizes: list[int], appends: int, audit: bool, summary_at: float,
          skip: set[str]) -> dict[str, Any]:
    import redis
    from _guard_sessions import Env, history, next_turns, seed

    import shared
    from shared.core.config import StoreConfig
    from shared.core.records import SummaryRecord
    from shared.core.turns import turn_starts
    from shared.store.recall_index import index_compacted
    from shared.store.sessions import SessionStore, connect

    sep = "&" if "?" in url else "?"
    named = f"{url}{sep}client_name={CLIENT}"
    env = Env(named)
    probe = redis.Redis.from_url(named)
    slow = Slowlog(probe)
    out: dict[str, Any] = {"code": str(Path(shared.__file__).parent.parent)}
    try:
        for n in sizes:
            cfg = StoreConfig(key_prefix=env.prefix, max_messages_per_session=400_000,
                              socket_timeout=60.0, ttl_seconds=86_400)
            store = SessionStore(connect(named, cfg), cfg)
            sid = f"blk{n}-{uuid.uuid4().hex[:6]}"
            messages = history(n)
            tag = f"{n // 1000}k"

            slow.start()
            seed(store, sid, messages)
            slow.read(f"{tag} seed")

            turns = next_turns()
            slow.start()
            for i in range(appends):
                store.append_encoded(sid, store.encode(sid, next(turns)),
                                     request_id=f"r{i}", mark_pending=True)
            slow.read(f"{tag} append")

            length = store.length(sid)
            starts = [s for s in turn_starts(messages) if s <= len(messages) * summary_at]
            w = starts[-1] if starts else 0
            record = SummaryRecord(watermark=w, kind="llm", tokens=400,
                                   text="Summary of the work so far. " * 40)
            slow.start()
            assert store.commit_summary(sid, record, store.state(sid).version).ok
            slow.read(f"{tag} commit")

            slow.start()
            while index_compacted(store, sid, max_messages=2000).left:
                slow.read(f"{tag} index")  # read often: SLOWLOG is the whole server's
            slow.read(f"{tag} index")

            if audit:
                slow.start()
                store.read_view(sid)
                slow.read(f"{tag} view-cold")
                slow.start()
                store.load_view(sid, with_counts=True)
                slow.read(f"{tag} view-worker")
                slow.start()
                store.rewind(sid, 0)
                store.rewind(sid, w)
                slow.read(f"{tag} rewind")
                log = store.messages(sid, length - 200)
                at = length - 200 + _last_call_index(log)
                if "edits" not in skip:  # main's edit at half a 10k log: 37 s in one script
                    slow.start()
                    store.truncate_after(sid, at)
                    slow.read(f"{tag} edit-last-call")
                    slow.start()
                    store.truncate_after(sid, at // 2)
                    slow.read(f"{tag} edit-half")
                slow.start()
                store.delete_session(sid)
                slow.read(f"{tag} delete")
            else:
                store.delete_session(sid)
    finally:
        env.cleanup()
    out["figures"] = dict(slow.figures)
    out["lost_phases"] = slow.lost
    out["slowest"] = slow.slowest
    return out


# -- the parent: arms in alternation, SLOWLOG settings kept ----------------------------
def _pct(values: list[int], q: float) -> float:
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[min(int(rank), len(ordered)) - 1] / 1000


def _run_arm(arm: str, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        path = handle.name
    env = {**os.environ, "BENCH_ARM": arm, "PYTHONPATH": f"{arm}:{arm}/scripts"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", path, "--url", args.url,
           "--sizes", args.sizes, "--appends", str(args.appends), "--summary-at",
           str(args.summary_at), "--skip", args.skip]
    if args.audit:
        cmd.append("--audit")
    subprocess.run(cmd, env=env, check=True)
    data: dict[str, Any] = json.loads(Path(path).read_text())
    Path(path).unlink()
    return data


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default="redis://127.0.0.1:6379/11")
    p.add_argument("--sizes", default="1000,10000")
    p.add_argument("--appends", type=int, default=200)
    p.add_argument("--arms", default=f"this={HERE.parent}",
                   help="name=checkout,...: each arm's code, run in alternation")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--audit", action="store_true")
    p.add_argument("--json", default="")
    p.add_argument("--slowest", action="store_true",
                   help="print the slowest call (over 1 ms) of each phase and script")
    p.add_argument("--summary-at", type=float, default=0.95,
                   help="where the summary goes, a fraction of the log (the view: the rest)")
    p.add_argument("--skip", default="", help="'edits': no edit phases in --audit")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if args.child:
        Path(args.child).write_text(json.dumps(child(
            args.url, sizes, args.appends, args.audit, args.summary_at,
            set(args.skip.split(",")))))
        return

    import redis

    admin = redis.Redis.from_url(args.url)
    saved = admin.config_get("slowlog-*")
    arms = [a.split("=", 1) for a in args.arms.split(",")]
    pooled: dict[str, dict[str, list[int]]] = {name: defaultdict(list) for name, _ in arms}
    code: dict[str, str] = {}
    started = time.time()
    try:
        admin.config_set("slowlog-log-slower-than", 0)
        admin.config_set("slowlog-max-len", 100_000)
        for r in range(args.rounds):
            order = arms if r % 2 == 0 else arms[::-1]
            for name, root in order:
                data = _run_arm(root, args)
                code[name] = data["code"]
                if data["lost_phases"]:
                    print(f"warning: {name}: SLOWLOG overflowed in {data['lost_phases']}")
                for key, values in data["figures"].items():
                    pooled[name][key].extend(values)
                for key, (took, command) in data["slowest"].items():
                    if took > 1000 and args.slowest:
                        print(f"slowest {name} {key}: {took / 1000:.3f} ms {command}")
    finally:
        admin.slowlog_reset()
        for key, value in saved.items():
            admin.config_set(key, value)
    print(f"# {args.rounds} round(s), {time.time() - started:.0f} s, load {os.getloadavg()}")
    for name, root in code.items():
        print(f"# arm {name}: {root}")
    keys = sorted({k for figs in pooled.values() for k in figs},
                  key=lambda k: (int(k.split("k ")[0]), k))
    print(f"{'phase | script or command':44} {'arm':7} {'calls':>6} {'p50 ms':>8} "
          f"{'p99 ms':>8} {'max ms':>8} {'sum ms':>9}")
    table = []
    for key in keys:
        for name, _ in arms:
            values = pooled[name].get(key)
            if not values:
                continue
            row = {"key": key, "arm": name, "calls": len(values), "p50": _pct(values, 50),
                   "p99": _pct(values, 99), "max": max(values) / 1000,
                   "sum": sum(values) / 1000}
            table.append(row)
            print(f"{key:44} {name:7} {row['calls']:>6} {row['p50']:>8.3f} {row['p99']:>8.3f} "
                  f"{row['max']:>8.3f} {row['sum']:>9.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    _arm_path()
    main()
