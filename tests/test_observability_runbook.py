"""The README's runbook for lost job messages deletes the keys the store really uses.

After ``celery purge`` or a broker losing its lists, a session's pending flag
(and the recall index's queued flag) outlives the lost job and the guard only
truncates until it expires (audit-ops 6); the runbook's patterns must match
those keys and nothing else of a session.
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase
from pathlib import Path

import fakeredis

from shared.core.config import StoreConfig
from shared.store.recall_index import recall_keys
from shared.store.sessions import SessionStore

ROOT = Path(__file__).resolve().parents[1]


def runbook() -> str:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("- Runbook, lost job messages")
    return readme[start:readme.index("\n- ", start + 1)]


def test_the_runbook_patterns_match_the_flags_and_nothing_else() -> None:
    text = runbook()
    patterns = re.findall(r"'(cmp:[^']+)'", text)
    assert len(patterns) == 2, patterns
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="cmp"), tenant="acme")
    keys, recall = store.keys("s-1"), recall_keys(store, "s-1")
    flags = {keys.pending, recall.queued}
    every = {str(v) for obj in (keys, recall) for v in (
        getattr(obj, f) for f in dir(obj) if not f.startswith("_"))
        if isinstance(v, str) and v.startswith("cmp:")}
    others = every - flags
    assert len(others) > 5  # log, state, summaries, lease...
    for pattern in patterns:
        # redis-cli --scan --pattern is glob-style, as fnmatch (no [] in the pattern)
        assert "[" not in pattern
        assert {k for k in every if fnmatchcase(k, pattern)} in (
            {keys.pending}, {recall.queued}), pattern
    assert {k for k in flags if any(fnmatchcase(k, p) for p in patterns)} == flags
    assert "600" in text  # the flag's lifetime (StoreConfig.pending_ttl_seconds)
