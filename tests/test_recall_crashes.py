"""The recall index under a random life: appends, commits, index jobs and edits' cuts that
die after any script call, a second indexer starting inside another's call, queries
between. After one clean index job the index is exactly the log's: every message below the
watermark has its passages once (no duplicate from a retried part, none missing), the
counts match, the message map points at each message's first passage; every message's
own token finds it and no removed message's token finds anything. Redis and fakeredis
(which accepts an HINCRBY of "-0" the server refuses: found here)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shared.store.recall_index as recall_index_module
from shared.core.config import StoreConfig
from shared.core.messages import Message
from shared.core.recall import checksum, split_passages
from shared.core.records import SummaryRecord
from shared.store.recall_index import index_compacted, recall_keys
from shared.store.recall_query import recall
from shared.store.sessions import SessionStore


class Died(Exception):
    """The worker running an index job or an edit's cut died here."""


def _message(rnd: random.Random, n: int) -> tuple[dict[str, Any], str | None]:
    """A message carrying its own token (None: a message with no passage or no terms)."""
    kind = rnd.choice(["plain", "plain", "wide", "empty", "mark"])
    if kind == "empty":
        return {"role": "user", "content": ""}, None
    if kind == "mark":
        return {"role": "user", "content": "?"}, None
    words = rnd.choice([1, 3]) if kind == "plain" else 14
    token = f"tok{n}q"
    return {"role": rnd.choice(["user", "assistant"]),
            "content": " ".join([token, *(f"w{n}z{j}" for j in range(words)), "common"])}, token


def _life(store: SessionStore, rnd: random.Random, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recall_index_module, "BATCH_TERMS", rnd.choice([4, 8, 64]))
    monkeypatch.setattr(recall_index_module, "BATCH_DOCS", rnd.choice([1, 3, 128]))
    monkeypatch.setattr(recall_index_module, "CUT_PASSAGES", rnd.choice([1, 3, 64]))
    monkeypatch.setattr(recall_index_module, "BATCH_MESSAGES", rnd.choice([3, 500]))
    real = recall_index_module._script
    hooks: dict[str, Any] = {"die_after": None, "second": False}

    def spied(st_: SessionStore, name: str) -> Any:
        script = real(st_, name)
        if name not in ("recall_add", "recall_cut"):
            return script

        def call(*, keys: list[str], args: list[Any]) -> Any:
            if hooks["die_after"] is not None:
                if hooks["die_after"] == 0:
                    hooks["die_after"] = None
                    raise Died(name)
                hooks["die_after"] -= 1
            if name == "recall_add" and hooks["second"]:
                hooks["second"] = False  # another job, started while this one runs
                index_compacted(store, "s")
            return script(keys=keys, args=args)
        return call

    monkeypatch.setattr(recall_index_module, "_script", spied)
    log: list[str | None] = []
    removed: set[str] = set()
    for step in range(40):
        op = rnd.choice(["append", "append", "commit", "index", "index", "edit", "query"])
        if op == "append":
            batch = [_message(rnd, 100 * step + j) for j in range(rnd.randint(1, 6))]
            store.append("s", [m for m, _ in batch])
            log.extend(t for _, t in batch)
        elif not log:
            continue
        elif op == "commit":
            state = store.state("s")
            record = SummaryRecord(watermark=rnd.randint(state.watermark, len(log)),
                                   kind="offline", text="s", tokens=1)
            assert store.commit_summary("s", record, state.version).ok
        elif op in ("index", "edit"):
            hooks["die_after"] = rnd.choice([None, None, 0, 1, 2, 5])
            hooks["second"] = op == "index" and rnd.random() < 0.3
            try:
                if op == "index":
                    index_compacted(store, "s")
                else:
                    at = rnd.randint(0, len(log))
                    store.truncate_after("s", at)
            except Died:
                pass
            hooks["die_after"], hooks["second"] = None, False
            if op == "edit":
                removed.update(t for t in log[at:] if t)
                del log[at:]
        else:
            for token in sorted(removed)[:3]:
                assert all(token not in h.text
                           for h in recall(store, "s", token, end=len(log) or 1, limit=3))
    monkeypatch.setattr(recall_index_module, "_script", real)
    _check_settled(store, log, removed)


def _check_settled(store: SessionStore, log: list[str | None], removed: set[str]) -> None:
    watermark = store.state("s").watermark if log else 0
    while index_compacted(store, "s").left:
        pass
    k = recall_keys(store, "s")
    client = store.redis
    meta = {a.decode(): b.decode() for a, b in client.hgetall(k.meta).items()}
    hwm = int(meta.get("hwm", 0))
    assert watermark <= hwm <= len(log)
    if "hwm" in meta:
        assert meta["gen"] == (client.hget(k.state, "gen") or b"0").decode()
    raw = client.lrange(k.log, 0, -1)
    docs = {int(a): b.decode() for a, b in client.hgetall(k.doc).items()}
    assert int(meta.get("n_docs", 0)) == len(docs)
    lengths = 0
    per: dict[int, list[int]] = {}
    for pid, doc in docs.items():
        index, _, _, crc, length = (int(x) for x in doc.split(":"))
        assert index < hwm and crc == checksum(raw[index])
        per.setdefault(index, []).append(pid)
        lengths += length
    assert int(meta.get("total_len", 0)) == lengths
    firsts = [int(x) for x in client.lrange(k.mp, 0, -1)]
    assert len(firsts) == hwm
    for index in range(hwm):
        passages = list(split_passages(index, Message.model_validate_json(raw[index])))
        assert len(per.get(index, [])) == len(passages)
        assert not passages or firsts[index] == min(per[index])
    for index, token in enumerate(log[:watermark]):
        if token:
            assert recall(store, "s", token, limit=1)[0].index == index
    for token in removed:
        assert all(token not in h.text for h in recall(store, "s", token, limit=3))


@pytest.mark.parametrize("backend", ["fakeredis", "redis"])
@settings(max_examples=25, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))
def test_the_index_is_the_logs_after_any_crashes(
        request: pytest.FixtureRequest, key_prefix: str, backend: str, seed: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    client = request.getfixturevalue("real_redis" if backend == "redis" else "fake_redis")
    store = SessionStore(client, StoreConfig(key_prefix=key_prefix))
    store.delete_session("s")
    with monkeypatch.context() as m:
        _life(store, random.Random(seed), m)
