"""Per-process objects of a worker, built once from settings.

The store client and the summarizer are built lazily the first time a job
runs in a process (after prefork's fork, so no socket is shared between
children) and reused by every thread. The token counter is built once here
(``COMPACTION_TOKEN_COUNTER``) and handed to the store, the compactor and
the summary engine, so every count a worker makes comes from one object.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

from celery.exceptions import SoftTimeLimitExceeded

from shared.core.tokens import TokenCounter
from shared.core.tokens_exact import build_counter
from shared.store.sessions import SessionStore
from workers.compactor import Compactor, index_inline
from workers.settings import GENAI_KEY_VARIABLES, Settings
from workers.store_client import store_client
from workers.summarizer.cooldown import ProviderCooldown, cooldown_key
from workers.summarizer.engine import LLMClient, SummaryEngine
from workers.summarizer.providers import client_from_settings

MAX_CACHED_TENANTS = 1024


@dataclass(frozen=True, slots=True)
class Runtime:
    settings: Settings
    store: SessionStore
    engine: SummaryEngine
    _compactors: dict[str, Compactor] = field(default_factory=dict, repr=False)

    def compactor(self, tenant: str) -> Compactor:
        """The tenant's compactor, built once per process (a job runs in a few ms: the
        policy model and the tenant's store are not rebuilt for each one)."""
        compactor = self._compactors.get(tenant)
        if compactor is None:
            compactor = Compactor(self.store.for_tenant(tenant), self.engine,
                                  policy=self.settings.policy(), counter=self.store.counter,
                                  # "task": workers.tasks asks for an index job instead
                                  recall_indexer=(index_inline if self.settings.recall_index
                                                  == "job" else None))
            if len(self._compactors) >= MAX_CACHED_TENANTS:
                self._compactors.clear()  # many tenants: rebuilding is cheap, memory is not
            self._compactors[tenant] = compactor
        return compactor


def token_counter(settings: Settings) -> TokenCounter:
    """The counter ``COMPACTION_TOKEN_COUNTER`` names (the agent's guard must use the same).

    Settings already loaded the encoding once to validate it; tiktoken's
    encodings are cached per process, so this does not load it again.
    """
    return build_counter(settings.token_counter, encoding=settings.tiktoken_encoding,
                         encoding_dir=settings.tiktoken_dir)


def provider_cooldown(settings: Settings, store: SessionStore,
                      client: LLMClient | None) -> ProviderCooldown | None:
    """The cooldown of the configured summarizer, over the store's client and under its key
    prefix (None for the offline summarizer, or with ``COMPACTION_SUMMARIZER_COOLDOWN`` off)."""
    if client is None or not settings.summarizer_cooldown:
        return None
    endpoint = settings.summarizer_base_url or ""
    if settings.summarizer == "vertex":
        endpoint += f"|{settings.vertex_project}|{settings.vertex_location}"
    key = cooldown_key(store.config.key_prefix, settings.summarizer, client.model, endpoint,
                       summarizer_credential(settings))
    return ProviderCooldown(store.redis, key, client.name)


def summarizer_credential(settings: Settings) -> str | None:
    """The API key the summarizer calls with, whose rate limit a stated wait is (None:
    keyless, or Vertex AI, whose quota is the project's): ``COMPACTION_SUMMARIZER_API_KEY``,
    or for Gemini google-genai's own variables, read in its order. Only fingerprinted."""
    if settings.summarizer == "vertex":
        return None
    if settings.summarizer_api_key is not None:
        key = settings.summarizer_api_key.get_secret_value()
        if key:
            return key
    if settings.summarizer == "gemini":
        return next((os.environ[name] for name in GENAI_KEY_VARIABLES
                     if os.environ.get(name)), None)
    return None


def build_runtime(settings: Settings, store: SessionStore | None = None) -> Runtime:
    """The worker's objects; ``store``: one of the caller's (the in-process harness), else
    one on ``COMPACTION_REDIS_URL``."""
    if store is None:
        store = SessionStore(store_client(settings), settings.store_config(),
                             tenant=settings.tenant, counter=token_counter(settings))
    client = client_from_settings(settings)
    engine = SummaryEngine(client, counter=store.counter,
                           max_summary_tokens=settings.max_summary_tokens,
                           max_input_tokens=settings.summarizer_max_input_tokens,
                           cooldown=provider_cooldown(settings, store, client),
                           # prefork raises it into the call running at the soft time limit
                           interruptions=(SoftTimeLimitExceeded,))
    return Runtime(settings=settings, store=store, engine=engine)


_lock = threading.Lock()
_runtime: Runtime | None = None


def get_runtime(settings: Settings) -> Runtime:
    global _runtime
    with _lock:
        if _runtime is None or _runtime.settings is not settings:
            _runtime = build_runtime(settings)
        return _runtime


def set_runtime(runtime: Runtime | None) -> None:
    """Install a runtime explicitly (the embedded demo, tests)."""
    global _runtime
    with _lock:
        _runtime = runtime


__all__ = ["Runtime", "build_runtime", "get_runtime", "provider_cooldown", "set_runtime",
           "summarizer_credential", "token_counter"]
