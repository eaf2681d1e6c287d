"""A rate-limited summarizer is retried no sooner than it asked (Retry-After).

The Celery task (eager) with the real openai SDK against the fake server, whose
429 carries ``Retry-After`` / ``retry-after-ms``. The countdown every retry is
given (``Task.retry``, Celery's own) is recorded: at least the stated wait, at
most what a retry may wait (``longest_wait``); a wait longer than that falls
back to the offline summarizer at once instead of retrying early.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest

from shared.core.config import StoreConfig
from shared.store.sessions import SessionStore
from workers.compactor import FALLBACK_STAGE
from workers.harness.demo_session import demo_turns
from workers.harness.fakes.behaviour import Fault
from workers.harness.fakes.openai_server import FakeOpenAIServer
from workers.runtime import Runtime, set_runtime
from workers.settings import Settings
from workers.summarizer.engine import SummaryEngine
from workers.summarizer.providers import OpenAIClient
from workers.tasks import _settings, compact, longest_wait, retry_countdown


@pytest.fixture
def store() -> Iterator[SessionStore]:
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig())
    for turn in demo_turns(12):
        store.append("s", turn)
    yield store
    set_runtime(None)


@pytest.fixture
def countdowns(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The countdown of every retry the task asks Celery for (autoretry's included)."""
    seen: list[float] = []
    original = compact.retry

    def retry(*args: Any, **kwargs: Any) -> Any:
        seen.append(float(kwargs.get("countdown") or 0))
        return original(*args, **kwargs)

    monkeypatch.setattr(compact, "retry", retry)
    return seen


def _run(store: SessionStore, fault: Fault) -> tuple[dict[str, Any], int]:
    with FakeOpenAIServer() as server:
        server.faults.always(fault)
        client = OpenAIClient("gpt-4o-mini", api_key="k", base_url=server.base_url, timeout=5)
        set_runtime(Runtime(settings=_settings(), store=store, engine=SummaryEngine(client)))
        result = compact.apply(args=["s"], kwargs={"keep_recent": 2000}).get()
        sent = len([r for r in server.requests if r.path.endswith("/chat/completions")])
    return result, sent


def test_a_rate_limited_job_retries_no_sooner_than_the_provider_asked(
        store: SessionStore, countdowns: list[float]) -> None:
    settings = _settings()
    assert longest_wait(settings) >= 10  # the defaults: COMPACTION_RETRY_BACKOFF_MAX=30
    result, sent = _run(store, Fault.rate_limit(5))
    assert sent == settings.max_retries + 1 and len(countdowns) == settings.max_retries
    assert all(5 <= c <= longest_wait(settings) for c in countdowns), countdowns
    assert result["summary_kind"] == "offline" and "last attempt" in result["reason"]


def test_a_wait_longer_than_a_retry_may_take_falls_back_at_once(
        store: SessionStore, countdowns: list[float],
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="compaction.tasks"):
        result, sent = _run(store, Fault.rate_limit(3600))
    assert sent == 1 and countdowns == []  # no early retry into the rate limit
    assert result["summary_kind"] == "offline"
    assert "asks to wait 3600 s" in result["reason"], result["reason"]
    assert any("asks to wait 3600 s" in r.getMessage() for r in caplog.records)
    # unreachable, not refused: the offline summary is rebuilt once the LLM answers
    assert FALLBACK_STAGE not in store.summaries("s")[-1].stages


def test_a_failure_without_a_stated_wait_keeps_celerys_backoff(
        store: SessionStore, countdowns: list[float]) -> None:
    settings = _settings()
    result, sent = _run(store, Fault.server_error())
    assert sent == settings.max_retries + 1
    assert all(0 <= c <= min(2 << i, settings.retry_backoff_max)
               for i, c in enumerate(countdowns)), countdowns
    assert result["summary_kind"] == "offline"


def test_the_countdown_is_the_stated_wait_plus_jitter_within_the_bound() -> None:
    settings = _settings()
    longest = longest_wait(settings)
    for retries in range(4):
        for _ in range(50):
            assert 10 <= retry_countdown(retries, 10, settings) <= longest
            assert 0 <= retry_countdown(retries, None, settings) <= min(2 << retries, 30)
    # a retry's message waits unacknowledged for its countdown, then its run: the bound
    # leaves that inside the visibility timeout
    tight = Settings(broker_visibility_timeout=240, retry_backoff_max=600)
    assert longest_wait(tight) == tight.visibility_timeout - tight.lease_seconds
    assert longest_wait(Settings(retry_backoff_max=12)) == 12


def test_a_wait_as_long_as_the_cap_is_never_cut_short() -> None:
    """QA: a spread below the cap for a stated wait equal to it brought every retry back
    before the provider's wait ended: it met the cooldown, made no call and spent a
    retry (the last one fell back to the offline summary; from the fifth retry the
    countdown could be ~0 s). The cap itself, as long as the wait."""
    settings = Settings(max_retries=6)
    longest = longest_wait(settings)
    assert longest == 30  # the defaults: COMPACTION_RETRY_BACKOFF_MAX=30
    for retries in range(settings.max_retries):
        assert {retry_countdown(retries, 30, settings) for _ in range(50)} == {longest}


def test_a_wait_just_under_the_cap_is_honoured_without_piling_up_at_the_cap() -> None:
    """Never sooner than a wait under the cap, and the jitter on top is not clamped onto
    the cap (25 s + up to 8 s put three in eight countdowns at exactly 30 s)."""
    settings = _settings()
    longest = longest_wait(settings)
    for stated in (25, 29, 29.5):
        seen = [retry_countdown(2, stated, settings) for _ in range(400)]
        assert all(stated <= c <= longest for c in seen), seen
        assert seen.count(longest) < 10 and len(set(seen)) > 200, sorted(seen)[-20:]
