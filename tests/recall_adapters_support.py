"""What the adapters' recall tests share: a distinctive fact early in a session,
the real compaction job (summary + recall index), and reading the tool result.

The fact sits in the second turn's user message, so its log index is not 0
(each adapter maps that message to one log message: the index checks the
mapping too). Compaction is ``workers.compactor.Compactor`` with the offline
summarizer (no LLM), forced with ``keep_recent=0``-ish room, which commits
the summary and indexes the range it summarized away, as a worker's job does.
"""

from __future__ import annotations

import re
from typing import Any

from shared.store.sessions import SessionStore
from workers.compactor import Compactor
from workers.summarizer.engine import SummaryEngine

PATH = "src/billing/ledger_v2.py"
CODE = "ERR_LEDGER_7731"
FACT = (f"The nightly job crashed in {PATH} with {CODE} while posting the refund batch; "
        "the stack trace ends in apply_credit().")
QUERY = f"{CODE} {PATH}"
ASK = "What was the error code and file of the ledger crash? Use recall."
_HIT = re.compile(r"\[message (\d+), (\w+), score [0-9.]+\]\n")


def filler(i: int) -> str:
    """A user turn with nothing to recall: enough text that compaction has work."""
    return (f"Turn {i}: please review the deployment checklist, item {i}, and confirm the "
            "rollout order for the web tier. " * 3)


def opening(i: int) -> str:
    """The ``i``-th user message of the session: the fact in turn 1, filler otherwise."""
    return FACT if i == 1 else filler(i)


def compact(store: SessionStore, session_id: str) -> int:
    """The real job, forced: summary committed, summarized range indexed. The watermark."""
    outcome = Compactor(store, SummaryEngine(None)).run(session_id, force=True, keep_recent=0)
    assert outcome.status == "compacted", outcome.reason
    return outcome.watermark_after


def fact_index(store: SessionStore, session_id: str) -> int:
    """The log index of the message holding the fact (the one recall must name)."""
    found = [i for i, m in enumerate(store.messages(session_id)) if CODE in m.text()]
    assert found, "the fact is not in the log"
    return found[0]


def hits_of(text: str) -> list[tuple[int, str, str]]:
    """(message index, role, passage) of each block of a rendered recall result."""
    parts = _HIT.split(text)
    return [(int(parts[i]), parts[i + 1], parts[i + 2].strip())
            for i in range(1, len(parts) - 2, 3)]


def assert_recalled(text: Any, index: int) -> None:
    """``text`` (a tool result the model got) holds the fact verbatim, at ``index``."""
    hits = hits_of(str(text))
    assert hits, f"not a rendered recall result: {text!r}"
    first_index, role, passage = hits[0]
    assert (first_index, role) == (index, "user"), hits
    assert PATH in passage and CODE in passage and FACT in passage
