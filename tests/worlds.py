"""What the guard's differential tests share: two guards over their own keys on one real
Redis take the same calls, one with a shortcut, one without, and every view must match
(tests/test_guard_quiet_delta.py, tests/test_guard_truncation_delta.py)."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable
from typing import Any

import redis

from shared.core.config import StoreConfig
from shared.store.sessions import SessionStore
from tests.guard_shells import make

GREETING: list[dict[str, Any]] = [{"role": "user", "content": "hi"},
                                  {"role": "assistant", "content": "hello"}]
"""A first turn to record: a session with nothing stored has no cached view to plan from."""


def canonical(value: dict[str, Any]) -> str:
    """``value`` as JSON, the random nonce of each renamed call id (the store's, one per
    append: the two worlds draw their own) replaced by its order of appearance."""
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    seen: dict[str, str] = {}
    return re.sub(r"-r([0-9a-f]{6})",
                  lambda m: "-r#" + seen.setdefault(m.group(1), str(len(seen))), text)


def tool_chain(calls: int, output: str, *, call_id: Callable[[int], str] = "k{}".format,
               path: str = "f{}.py") -> list[dict[str, Any]]:
    """A user's request, ``calls`` steps of one call and its result (``output``), and the
    closing answer: one turn, in OpenAI's shape."""
    turn: list[dict[str, Any]] = [{"role": "user", "content": "fix the test"}]
    for c in range(calls):
        cid = call_id(c)
        turn.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": cid, "name": "read_file", "arguments": f'{{"path": "{path.format(c)}"}}'}]})
        turn.append({"role": "tool", "tool_call_id": cid, "content": output})
    turn.append({"role": "assistant", "content": "done"})
    return turn


class KeyedWorld:
    """One guard (``shell``: sync or async) over its own key prefix, the model ``m`` of
    ``window`` tokens; :meth:`close` removes its keys."""

    def __init__(self, client: redis.Redis, shell: str, window: int, letter: str) -> None:
        self.prefix = letter + secrets.token_hex(5)
        self.store = SessionStore(client, StoreConfig(key_prefix=self.prefix))
        self.guard = make(shell, self.store, overrides={"m": window})

    def close(self, client: redis.Redis) -> None:
        self.guard.close()
        keys = list(client.scan_iter(match=f"{self.prefix}:*", count=1000))
        if keys:
            client.delete(*keys)


def recorded_alike(worlds: list[Any], turn: list[dict[str, Any]], *,
                   summaries: bool = False) -> None:
    """``turn`` recorded in every world, and what each stored the same (its log; with
    ``summaries``, its state and summaries too): the append stores the ids the
    prepares sent, however they were planned."""
    for w in worlds:
        w.guard.record_turn("s", turn)
    stored = []
    for w in worlds:
        kept: dict[str, Any] = {"log": [m.model_dump() for m in w.store.messages("s")]}
        if summaries:
            kept["state"] = w.store.state("s").model_dump()
            kept["summaries"] = [r.model_dump(exclude={"created_at"})
                                 for r in w.store.summaries("s")]
        stored.append(canonical(kept))
    assert stored[0] == stored[1]
