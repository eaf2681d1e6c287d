"""Workers, CLI and doctor on a real Redis Cluster (``COMPACTION_REDIS_CLUSTER``).

The store itself is checked on a cluster in ``test_store_cluster.py``; here
the settings reach it: the worker's runtime (a compaction job run by the
real Celery task, eagerly), the operations commands and ``doctor``, on a
three-primary cluster started from the local binary, with sessions spread
over the primaries.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import ValidationError
from redis.cluster import RedisCluster

from shared.store.sessions import SessionStore
from workers.cli.demo import split_turns
from workers.cli.main import main
from workers.harness.stack.redis_server import LocalCluster
from workers.runtime import get_runtime, set_runtime
from workers.settings import Settings

SESSIONS = [f"user:{n}" for n in range(6)]


@pytest.fixture
def env(cluster: LocalCluster, key_prefix: str,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    """The cluster named by the environment, as a deployment names it."""
    for name in ("COMPACTION_TENANT", "COMPACTION_SUMMARIZER", "COMPACTION_TRIGGER_RATIO"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COMPACTION_REDIS_URL", cluster.url)
    monkeypatch.setenv("COMPACTION_REDIS_CLUSTER", "true")
    monkeypatch.setenv("COMPACTION_KEY_PREFIX", key_prefix)
    settings = Settings()
    yield settings
    client = RedisCluster.from_url(cluster.url)
    keys = list(client.scan_iter(match=f"{key_prefix}:*", count=1000,
                                 target_nodes=RedisCluster.PRIMARIES))
    if keys:  # one DEL per slot (a session's keys share one), not one per key
        client.delete(*keys)
    client.close()


@pytest.fixture
def filled(env: Settings) -> Iterator[SessionStore]:
    """Six 30-turn sessions in the worker runtime's own store."""
    set_runtime(None)
    store = get_runtime(env).store
    for sid in SESSIONS:
        for turn in split_turns(30, seed=5):
            store.append(sid, turn)
    yield store
    set_runtime(None)


def primaries_of(store: SessionStore, sessions: list[str]) -> set[str]:
    client: Any = store.redis
    return {client.get_node_from_key(store.keys(sid).log).name for sid in sessions}


@pytest.mark.parametrize(("url", "needle"), [
    ("redis://127.0.0.1:7000/2", "only database 0"),
    ("unix:///tmp/redis.sock", "needs a redis:// or rediss://"),
])
def test_the_setting_refuses_what_a_cluster_cannot_be(url: str, needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        Settings(redis_url=url, redis_cluster=True)


def test_a_compaction_job_runs_on_the_cluster(filled: SessionStore, env: Settings) -> None:
    """The real task, on the runtime the settings build: a cluster client, summaries
    committed for sessions on every primary."""
    from workers.app import app
    from workers.tasks import compact

    before = app.conf.compaction_settings
    app.conf.compaction_settings = env
    try:
        assert isinstance(filled.redis, RedisCluster)
        assert len(primaries_of(filled, SESSIONS)) >= 2, "the sessions should span primaries"
        for sid in SESSIONS:
            result = compact.apply(args=[sid], kwargs={"keep_recent": 1500}).get()
            assert result["status"] == "compacted", result
            view = filled.load_view(sid)
            assert view.summary is not None
            assert view.summary.watermark == result["watermark_after"] > 0
            assert len(view.history) == result["messages_after"] < result["messages_before"]
    finally:
        app.conf.compaction_settings = before


def test_cli_and_doctor_on_the_cluster(filled: SessionStore,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sessions", "--json"]) == 0
    listed = {row["session_id"] for row in json.loads(capsys.readouterr().out)["sessions"]}
    assert listed == set(SESSIONS)
    assert main(["show", SESSIONS[3], "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["messages"][-1]["role"] == "assistant"
    main(["doctor", "--timeout", "0.5", "--json"])  # no workers here: the exit code says so
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
    assert checks["redis store"]["verdict"] == "OK", checks["redis store"]
    assert "Cluster, 3 primaries" in checks["redis store"]["detail"]


def test_an_unreachable_cluster_is_one_clean_line(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COMPACTION_REDIS_URL", "redis://:hunter2@127.0.0.1:1")
    monkeypatch.setenv("COMPACTION_REDIS_CLUSTER", "true")
    assert main(["sessions"]) != 0
    err = capsys.readouterr().err
    assert "127.0.0.1:1" in err and "hunter2" not in err and "Traceback" not in err
