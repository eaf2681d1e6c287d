"""The benchmark's sessions: one template compacted in one LLM call, copied server-side."""

from __future__ import annotations

from dataclasses import dataclass

import _timing  # noqa: F401  (puts this checkout first on sys.path)
from _workers_fake import SUMMARIZER_MODEL

from shared.core.config import CompactionPolicy
from shared.guard import ContextGuard
from shared.store.recall_index import drop_index, recall_keys
from shared.store.sessions import SessionStore
from workers.compactor import Compactor
from workers.harness.demo_session import SYSTEM_PROMPT, TOOLS, demo_turns
from workers.summarizer.engine import SummaryEngine
from workers.summarizer.prompts import build_summary_request
from workers.summarizer.providers import OpenAIClient

AGENT_MODEL = "gpt-4o"


@dataclass(frozen=True)
class Template:
    session_id: str
    messages: int
    tokens: int
    summarized_messages: int
    summarized_tokens: int
    request: list[dict[str, str]]


def build_template(store: SessionStore, window: int, seed: int) -> Template:
    """Record turns through the guard until a job is due with a whole-turn cut."""
    turns = demo_turns(400, seed)
    planner = Compactor(store, SummaryEngine(OpenAIClient(
        SUMMARIZER_MODEL, base_url="http://127.0.0.1:9/v1", api_key="x")),
        policy=CompactionPolicy())  # only plans: no LLM call is made
    for attempt in range(20):
        sid = f"template-{window}-{attempt}"
        guard = ContextGuard(store, overrides={AGENT_MODEL: window})
        for turn in turns[attempt:]:
            view = guard.prepare(sid, SYSTEM_PROMPT, TOOLS, 2000, AGENT_MODEL, pending=turn[:1])
            if view.report.truncated:
                break
            guard.record_turn(sid, turn)
            plan = planner.plan(sid, store.load_view(sid), force=False, keep_recent=None)
            if isinstance(plan, str):
                continue
            if plan.prefix_start is not None:
                break  # a split turn would add a second call: try another start
            store.clear_pending(sid)
            data = store.load_view(sid)
            messages = data.messages()
            covered = messages[:plan.cut]
            request = build_summary_request(covered, None, start=0, max_summary_tokens=2000)
            return Template(sid, data.length, data.tokens_total, plan.cut,
                            store.range_tokens(sid, 0, plan.cut), request)
        store.delete_session(sid)
    raise SystemExit(f"no due session with a whole-turn cut for window {window}")


def copy_sessions(store: SessionStore, template: str, ids: list[str]) -> None:
    src = store.keys(template)
    client = store.redis
    present = [k for k in src.data_keys() if client.exists(k)]
    pipe = client.pipeline(transaction=False)
    for sid in ids:
        dst = store.keys(sid)
        for key in present:
            pipe.copy(key, key.replace(f"{{{src.tenant}:{src.session_id}}}",
                                       f"{{{dst.tenant}:{dst.session_id}}}"), replace=True)
        pipe.delete(dst.pending, dst.lease, dst.dirty)
    pipe.execute()


def delete_sessions(store: SessionStore, ids: list[str]) -> None:
    delete_index(store, ids)  # the index's term keys are not data keys of the session
    pipe = store.redis.pipeline(transaction=False)
    for sid in ids:
        k = store.keys(sid)
        pipe.delete(*k.data_keys(), k.pending, k.lease, k.dirty)
    pipe.execute()


def indexed_all(store: SessionStore, ids: list[str]) -> bool:
    """Every session's recall index covers its summary (and the session has one)."""
    pipe = store.redis.pipeline(transaction=False)
    for sid in ids:
        pipe.hget(store.keys(sid).state, "watermark")
        pipe.hget(recall_keys(store, sid).meta, "hwm")
    rows = pipe.execute()
    return all(w is not None and int(w) > 0 and h is not None and int(h) >= int(w)
               for w, h in zip(rows[::2], rows[1::2], strict=True))


def delete_index(store: SessionStore, ids: list[str]) -> None:
    for sid in ids:
        drop_index(store, sid)


def committed(store: SessionStore, ids: list[str]) -> tuple[int, int]:
    """(sessions with any summary, sessions with an LLM summary)."""
    pipe = store.redis.pipeline(transaction=False)
    for sid in ids:
        pipe.hmget(store.keys(sid).state, "watermark", "summary_kind")
    rows = pipe.execute()
    any_summary = sum(1 for w, _ in rows if w is not None and int(w) > 0)
    llm = sum(1 for w, kind in rows if w is not None and int(w) > 0 and kind == b"llm")
    return any_summary, llm
