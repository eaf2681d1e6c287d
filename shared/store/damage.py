"""A session Redis damaged (some of its keys evicted), mended where its history is intact.

Redis under memory pressure evicts keys one at a time (any ``maxmemory-policy`` but
``noeviction``), so a session can lose one key and keep the rest. The scripts refuse
such a session (``SESSION_DAMAGED``). When only the running token totals went, the log
is whole: the totals are counted again from it and written back (``retotal.lua``), and
the session goes on with its history, summary and watermark. Anything else (the log
gone, or shorter than the watermark) cannot be mended: the session's keys are removed
and it starts afresh, as an expired one would (``reset_damaged.lua``).

The counts are the store's estimates made again from the stored messages, so a call
whose id was made unique at append counts its stored id, a token or two from what was
counted at append. The totals get a new epoch with them: every cached view is read
again. The recount reads and counts the whole log once: about 1 s per 10,000 real agent
messages (11 MB) on a 2-core machine, in the call that met the damage; the history it
keeps is worth that once.

Sans-I/O steps (:mod:`shared.store.commands`), driven by both stores.
"""

from __future__ import annotations

import secrets
from collections.abc import Generator
from typing import Any, Literal

from shared.core.records import decode_messages
from shared.core.tokens import TokenCounter
from shared.store.commands import Batch, Command, Step, reset_damaged_command
from shared.store.keys import SessionKeys

Mended = Literal["retotaled", "reset", ""]
READ_CHUNK = 500
"""Messages per LRANGE of the recount (the asyncio store's loop runs between chunks)."""
ATTEMPTS = 4
"""Looks at the session before giving up (another process mending or editing it)."""


def _int(value: Any) -> int:
    return int(value) if value is not None else 0


def retotal_command(k: SessionKeys, length: int, totals: list[int]) -> Command[bool]:
    """``retotal.lua``: ``totals`` written as the session's running totals if its log
    still has ``length`` messages and the session is damaged in its totals alone."""
    return Command("retotal", [k.log, k.cum, k.state],
                   [length, secrets.token_hex(8), *totals],
                   lambda raw: bool(int(raw)), "retotal damaged session")


def _count(k: SessionKeys, length: int, counter: TokenCounter,
           ) -> Generator[Step, Any, list[int] | None]:
    """The running totals of the log's ``length`` messages (None: it changed meanwhile)."""
    totals: list[int] = []
    running = 0
    for start in range(0, length, READ_CHUNK):
        rows = yield Batch([("LRANGE", k.log, start, start + READ_CHUNK - 1)],
                           lambda replies: replies[0], "retotal read")
        for message in decode_messages(b"[" + b",".join(rows) + b"]") if rows else ():
            running += counter.message(message)
            totals.append(running)
        if len(rows) < min(READ_CHUNK, length - start):
            return None
    return totals


def mend_steps(k: SessionKeys, counter: TokenCounter) -> Generator[Step, Any, Mended]:
    """Mend the session if it is damaged: "retotaled" (its history kept), "reset" (its
    keys removed), or "" (it is not damaged, or no longer)."""
    for _ in range(ATTEMPTS):
        length, totals_length, watermark = yield Batch(
            [("LLEN", k.log), ("LLEN", k.cum), ("HGET", k.state, "watermark")],
            lambda replies: [_int(value) for value in replies], "damage check")
        if totals_length == length and watermark <= length:
            return ""
        if length == 0 or watermark > length:
            removed = yield reset_damaged_command(k)
            return "reset" if removed else ""
        totals = yield from _count(k, length, counter)
        if totals is not None and (yield retotal_command(k, length, totals)):
            return "retotaled"
    removed = yield reset_damaged_command(k)  # it kept changing: start afresh
    return "reset" if removed else ""


__all__ = ["Mended", "mend_steps", "retotal_command"]
