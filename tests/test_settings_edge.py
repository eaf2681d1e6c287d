"""Settings checked at the edge: ``COMPACTION_PENDING_TTL_SECONDS`` (how long a queued job
holds the session's next one) and ``COMPACTION_SUMMARIZER_BASE_URL``.

The pending flag stops a guard from publishing a second job while one is queued; a job
message lost on the way (a purge, a broker that lost its lists) holds the session back
until the flag expires. The setting reaches the store config every process builds, and
the flag the guard sets lives that long.
"""

from __future__ import annotations

import re

import fakeredis
import pytest

from shared.core.errors import ConfigError
from shared.core.messages import Message
from shared.enqueue import NullEnqueuer
from shared.guard import ContextGuard
from shared.store.sessions import SessionStore
from workers.settings import load_settings


def test_the_default_is_ten_minutes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COMPACTION_PENDING_TTL_SECONDS", raising=False)
    assert load_settings().store_config().pending_ttl_seconds == 600


def test_the_flag_the_guard_sets_lives_as_long_as_the_setting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPACTION_PENDING_TTL_SECONDS", "90")
    config = load_settings().store_config()
    assert config.pending_ttl_seconds == 90
    client = fakeredis.FakeRedis()
    store = SessionStore(client, config)
    guard = ContextGuard(store, NullEnqueuer(), overrides={"m": 2_000})
    turn = [Message(role="user", content="word " * 400),
            Message(role="assistant", content="answer " * 400)]
    for _ in range(3):  # over the trigger: a job is asked for
        guard.record_turn("s", turn)
    assert store.is_pending("s")
    assert 85 <= client.ttl(store.keys("s").pending) <= 90


@pytest.mark.parametrize("value", ["0", "-5", "soon"])
def test_a_bad_value_names_the_variable(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("COMPACTION_PENDING_TTL_SECONDS", value)
    with pytest.raises(ConfigError, match="COMPACTION_PENDING_TTL_SECONDS"):
        load_settings()


def test_a_stale_age_at_the_ttl_is_one_line_naming_both_variables(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The line names the settings a reader can change, not the store's field names, and
    carries no pydantic "Value error," prefix (the README's promise: one line naming the
    variable and the value)."""
    monkeypatch.setenv("COMPACTION_PENDING_STALE_SECONDS", "600")
    monkeypatch.delenv("COMPACTION_PENDING_TTL_SECONDS", raising=False)
    with pytest.raises(ConfigError) as info:
        load_settings().store_config()
    assert str(info.value) == (
        "COMPACTION_PENDING_STALE_SECONDS=600: must be below COMPACTION_PENDING_TTL_SECONDS "
        "(600), or 0 to never publish a pending job again")


@pytest.mark.parametrize("value", ["not-a-url", "ftp://host/v1", "http://", "127.0.0.1:8000",
                                   "http://127.0.0.1:99999/v1"])
def test_a_summarizer_base_url_that_is_no_url_stops_start_up(monkeypatch: pytest.MonkeyPatch,
                                                             value: str) -> None:
    """It was accepted, then every job failed as an unreachable summarizer."""
    monkeypatch.setenv("COMPACTION_SUMMARIZER", "openai")
    monkeypatch.setenv("COMPACTION_SUMMARIZER_BASE_URL", value)
    with pytest.raises(ConfigError, match="COMPACTION_SUMMARIZER_BASE_URL"):
        load_settings()


def test_a_summarizer_base_url_of_a_local_server_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPACTION_SUMMARIZER", "openai")
    monkeypatch.setenv("COMPACTION_SUMMARIZER_BASE_URL", " http://127.0.0.1:8000/v1 ")
    assert load_settings().summarizer_base_url == "http://127.0.0.1:8000/v1"


@pytest.mark.parametrize(("url", "cluster", "refused"), [
    ("redis://127.0.0.1:7000,127.0.0.1:7001,[::1]:7002", "true", None),
    ("redis://user:pw@h1:7000,h2/0", "true", None),
    ("redis://h1:7000,h2:7001", "false", "COMPACTION_REDIS_CLUSTER=true"),
    ("redis://h1:7000,h2:port", "true", "'h2:port'"),
    ("redis://h1:7000,h2:70000", "true", "out of range"),
    ("redis+sentinel://s1:26379,s2:26379/store", "false", None),  # Sentinels, not nodes
])
def test_a_cluster_url_may_name_several_nodes(monkeypatch: pytest.MonkeyPatch, url: str,
                                              cluster: str, refused: str | None) -> None:
    """One named node is one point of failure for every worker, CLI and server started
    while it is down: ``COMPACTION_REDIS_URL`` takes the list ``connect_cluster`` takes."""
    monkeypatch.setenv("COMPACTION_REDIS_URL", url)
    monkeypatch.setenv("COMPACTION_REDIS_CLUSTER", cluster)
    if refused is None:
        assert load_settings().redis_url == url
        return
    with pytest.raises(ConfigError, match=re.escape(refused)):
        load_settings()
