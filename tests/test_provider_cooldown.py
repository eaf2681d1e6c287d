"""A wait the provider states to one call holds back every job (workers.summarizer.cooldown).

QA (notes item 3): a 429 with ``Retry-After`` was honoured by the job that got it only;
the session's later turns and every other session kept calling the rate-limited provider
(six turns of one session: four retry chains, 14 requests). The Celery task (eager) with
the real openai / google-genai SDKs against the fake servers, on a real Redis: the
countdown every retry asks Celery for is recorded and the retry is not run at once (as
Celery would not before its countdown), so what a job does during the cooldown is seen.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery.exceptions import Retry
from pydantic import SecretStr

from shared.core.config import StoreConfig
from shared.store.sessions import SessionStore
from shared.telemetry.metrics import PrometheusMetrics, set_metrics
from workers.harness.demo_session import demo_turns
from workers.harness.fakes.behaviour import Fault
from workers.harness.fakes.gemini_server import FakeGeminiServer
from workers.harness.fakes.http_base import Exchange
from workers.harness.fakes.openai_server import FakeOpenAIServer
from workers.harness.fakes.summaries import SummarizerResponder
from workers.runtime import Runtime, build_runtime, provider_cooldown, set_runtime
from workers.summarizer.cooldown import ProviderCooldown, cooldown_key
from workers.summarizer.engine import LLMClient, SummaryEngine
from workers.summarizer.providers import GeminiClient, OpenAIClient
from workers.tasks import _settings, compact, longest_wait


@pytest.fixture
def store(real_redis: redis.Redis, key_prefix: str) -> Iterator[SessionStore]:
    store = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix))
    for session in ("a", "b"):
        for turn in demo_turns(12):
            store.append(session, turn)
    yield store
    set_runtime(None)


@pytest.fixture
def metrics() -> Iterator[PrometheusMetrics]:
    installed = set_metrics(PrometheusMetrics(role="worker"))
    assert isinstance(installed, PrometheusMetrics)
    yield installed
    set_metrics(None)


@pytest.fixture
def countdowns(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The countdown of every retry the task asks Celery for; the retry is not run (an
    eager task's would be, at once, whatever its countdown)."""
    seen: list[float] = []

    def retry(*args: Any, **kwargs: Any) -> Any:
        seen.append(float(kwargs.get("countdown") or 0))
        raise Retry("recorded", when=kwargs.get("countdown"))

    monkeypatch.setattr(compact, "retry", retry)
    return seen


def _install(store: SessionStore, provider: str, client: LLMClient, base_url: str) -> Runtime:
    settings = _settings().model_copy(update={
        "summarizer": provider, "summarizer_base_url": base_url, "vertex_project": None})
    engine = SummaryEngine(client, counter=store.counter,
                           cooldown=provider_cooldown(settings, store, client))
    runtime = Runtime(settings=_settings(), store=store, engine=engine)
    set_runtime(runtime)
    return runtime


def _job(session: str, retries: int = 0) -> Any:
    return compact.apply(args=[session], kwargs={"keep_recent": 2000}, retries=retries)


def _sample(metrics: PrometheusMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize("provider", ["openai", "gemini"])
def test_a_stated_wait_holds_back_the_other_jobs_until_it_ends(
        store: SessionStore, countdowns: list[float], metrics: PrometheusMetrics,
        provider: str) -> None:
    fake = (FakeOpenAIServer(responder=SummarizerResponder()) if provider == "openai"
            else FakeGeminiServer(responder=SummarizerResponder()))
    with fake as server:
        client: LLMClient
        if provider == "openai":
            client = OpenAIClient("gpt-4o-mini", api_key="k", base_url=server.base_url,
                                  timeout=5)
        else:
            client = GeminiClient("gemini-2.5-flash-lite", vertexai=False, api_key="k",
                                  base_url=server.base_url, timeout=5)
        runtime = _install(store, provider, client, server.base_url)
        cooldown = runtime.engine.cooldown
        assert cooldown is not None

        def calls() -> int:
            return len([r for r in server.requests if r.method == "POST"])

        server.faults.next(Fault.rate_limit(5))  # the first call only
        _job("a")  # told to wait 5 s (429 Retry-After / RetryInfo)
        assert calls() == 1 and len(countdowns) == 1 and countdowns[0] >= 5
        assert 4 < cooldown.remaining() <= 5

        _job("b")  # another session, at once: the provider is not called
        assert calls() == 1, "a job called the provider during its cooldown"
        assert len(countdowns) == 2
        left = countdowns[1]
        assert 4 < left <= longest_wait(_settings()), countdowns
        assert _sample(metrics, "compaction_summarizer_errors_total", provider=client.name,
                       error="cooldown") == 1.0
        assert _sample(metrics, "compaction_summarizer_calls_total", provider=client.name,
                       model=client.model) == 1.0  # a call not made is no call

        while cooldown.remaining() > 0:  # Celery runs the retry after its countdown
            time.sleep(0.1)
        result = _job("b", retries=1).get()  # calls resume (a compaction may make two)
        resumed = calls()
        assert resumed > 1 and result["summary_kind"] == "llm", result
        assert _job("a", retries=1).get()["summary_kind"] == "llm"
        assert calls() > resumed


def test_a_cooldown_is_never_shortened(real_redis: redis.Redis, key_prefix: str) -> None:
    cooldown = ProviderCooldown(real_redis, cooldown_key(key_prefix, "openai", "m", "u"),
                                "openai")
    assert cooldown.remaining() == 0
    assert cooldown.extend(5) == 5
    assert 4.9 < cooldown.extend(1) <= 5  # a shorter wait told later keeps the longer one
    assert 4.9 < cooldown.remaining() <= 5
    assert cooldown.extend(8) == 8  # a longer one extends it
    assert 7.9 < real_redis.pttl(cooldown.key) / 1000 <= 8
    assert real_redis.get(cooldown.key) == b"8"


def test_a_cooldown_longer_than_a_retry_may_wait_falls_back_at_once(
        store: SessionStore, countdowns: list[float]) -> None:
    with FakeOpenAIServer() as server:
        client = OpenAIClient("gpt-4o-mini", api_key="k", base_url=server.base_url, timeout=5)
        runtime = _install(store, "openai", client, server.base_url)
        assert runtime.engine.cooldown is not None
        runtime.engine.cooldown.extend(3600)  # told to another worker's call
        result = _job("a").get()
        assert [r for r in server.requests if r.method == "POST"] == [] and countdowns == []
    assert result["summary_kind"] == "offline"
    assert "asks to wait" in result["reason"] and "cools down" in result["reason"]


def test_the_key_names_no_session_and_no_secret(store: SessionStore, key_prefix: str) -> None:
    settings = _settings().model_copy(update={
        "summarizer": "openai", "summarizer_model": "gpt-4o-mini",
        "summarizer_base_url": "https://user:s3cret@llm.internal.example/v1"})
    engine = build_runtime(settings, store).engine
    assert engine.cooldown is not None
    key = engine.cooldown.key
    assert key.startswith(f"{key_prefix}:cooldown:openai:gpt-4o-mini:"), key
    assert "s3cret" not in key and "internal" not in key and ":a" not in key
    other = provider_cooldown(settings.model_copy(update={
        "summarizer_base_url": "https://other.example/v1"}), store, engine.client)
    assert other is not None and other.key != key  # another endpoint cools down alone
    assert provider_cooldown(settings, store, None) is None  # offline: nothing to cool
    off = settings.model_copy(update={"summarizer_cooldown": False})  # only the job told waits
    assert build_runtime(off, store).engine.cooldown is None


def test_a_redis_that_does_not_answer_lets_the_call_go(caplog: pytest.LogCaptureFixture) -> None:
    down = redis.Redis(port=1, socket_connect_timeout=0.2, socket_timeout=0.2)
    cooldown = ProviderCooldown(down, "cmp:cooldown:openai:m:x", "openai")
    with caplog.at_level("WARNING", logger="compaction.summarizer"):
        cooldown.before_call()  # no raise: called as without a cooldown
    assert any("not checked" in r.getMessage() for r in caplog.records)


class _OneKeyRateLimited(FakeOpenAIServer):
    """One endpoint (api.openai.com, say) serving two tenants' API keys: only ``limited``
    has spent its rate limit (429 with Retry-After); the keys each request carried are
    kept in order (the request log redacts them)."""

    def __init__(self, limited: str) -> None:
        super().__init__(responder=SummarizerResponder())
        self.limited = limited
        self.keys: list[str] = []

    def planned_fault(self, index: int, exchange: Exchange) -> Fault | None:
        key = exchange.headers.get("authorization", "").removeprefix("Bearer ")
        self.keys.append(key)
        return Fault.rate_limit(5) if key == self.limited else None


def _tenant(store: SessionStore, base_url: str, api_key: str) -> Runtime:
    """A worker deployment of its own (settings, openai client, cooldown) on the shared
    Redis and key prefix, as two tenants' worker pools would be."""
    settings = _settings().model_copy(update={
        "summarizer": "openai", "summarizer_model": "gpt-4o-mini",
        "summarizer_base_url": base_url, "summarizer_api_key": SecretStr(api_key)})
    engine = build_runtime(settings, store).engine
    return Runtime(settings=_settings(), store=store, engine=engine)


def test_one_api_keys_wait_does_not_hold_back_another_keys_jobs(
        store: SessionStore, countdowns: list[float]) -> None:
    """QA: the cooldown was keyed by endpoint only, so a 429 told to one tenant's key paused
    every tenant's summaries on the same endpoint (api.openai.com) for the wait."""
    with _OneKeyRateLimited("sk-tenant-a") as server:
        tenant_a = _tenant(store, server.base_url, "sk-tenant-a")
        tenant_b = _tenant(store, server.base_url, "sk-tenant-b")
        assert tenant_a.engine.cooldown is not None and tenant_b.engine.cooldown is not None

        set_runtime(tenant_a)
        _job("a")  # told to wait 5 s
        assert server.keys == ["sk-tenant-a"] and len(countdowns) == 1
        assert 4 < tenant_a.engine.cooldown.remaining() <= 5

        set_runtime(tenant_b)
        result = _job("b").get()  # at once: the other key is under its limit
        assert len(countdowns) == 1, f"the other key's job was delayed: {countdowns}"
        assert result["summary_kind"] == "llm", result
        assert server.keys[1:] and set(server.keys[1:]) == {"sk-tenant-b"}
        assert tenant_b.engine.cooldown.remaining() == 0

        set_runtime(tenant_a)
        calls = len(server.keys)
        _job("a", retries=1)  # the key told to wait still waits, on every worker
        assert len(server.keys) == calls and len(countdowns) == 2


def test_the_key_fingerprints_the_credential_and_never_holds_it(
        store: SessionStore, key_prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Per endpoint and credential: a keyless endpoint keeps the key it always had (a
    running deployment's cooldown carries over), a key is only fingerprinted, Gemini's
    key may come from google-genai's own variables, Vertex AI cools down per project and
    location (its quota's unit, whoever's credentials call it)."""
    base = _settings().model_copy(update={
        "summarizer": "openai", "summarizer_model": "gpt-4o-mini",
        "summarizer_base_url": "http://127.0.0.1:8000/v1"})
    client = OpenAIClient("gpt-4o-mini", api_key="x", base_url="http://127.0.0.1:8000/v1")

    def key(**update: Any) -> str:
        cooldown = provider_cooldown(base.model_copy(update=update), store, client)
        assert cooldown is not None
        return cooldown.key

    keyless = key()
    assert keyless == cooldown_key(key_prefix, "openai", "gpt-4o-mini",
                                   "http://127.0.0.1:8000/v1")  # as before
    secret = "sk-proj-0123456789abcdefSECRET"
    one, other = key(summarizer_api_key=SecretStr(secret)), key(
        summarizer_api_key=SecretStr("sk-proj-other"))
    assert len({keyless, one, other}) == 3
    assert one.startswith(keyless + ":") and secret not in one and "SECRET" not in one
    assert key(summarizer_api_key=SecretStr(secret)) == one  # stable across workers

    for variable in ("GOOGLE_API_KEY", "GEMINI_API_KEY"):
        monkeypatch.delenv(variable, raising=False)
    gemini = {"summarizer": "gemini", "summarizer_base_url": None}
    assert key(**gemini, summarizer_api_key=SecretStr(secret)) != key(
        **gemini, summarizer_api_key=SecretStr("AIza-other"))
    monkeypatch.setenv("GEMINI_API_KEY", secret)  # google-genai's own variable
    from_env = key(**gemini)
    assert from_env == key(**gemini, summarizer_api_key=SecretStr(secret))
    monkeypatch.setenv("GOOGLE_API_KEY", "AIza-first")  # google-genai prefers this one
    assert key(**gemini) == key(**gemini, summarizer_api_key=SecretStr("AIza-first"))

    vertex = {"summarizer": "vertex", "vertex_project": "p1", "summarizer_base_url": None}
    assert key(**vertex) == key(**vertex, summarizer_api_key=SecretStr(secret))
    assert key(**vertex) != key(**{**vertex, "vertex_project": "p2"})
    assert key(**vertex) != key(**vertex, vertex_location="europe-west4")
