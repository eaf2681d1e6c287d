"""The LLM-only job: same worker, broker and LLM call, no compaction work.

Loaded by its worker processes as ``celery -A _workers_llm_only:llm_only_app``
(``scripts/`` on their ``PYTHONPATH``).
"""

from __future__ import annotations

import json
from typing import Any

import _timing  # noqa: F401  (puts this checkout first on sys.path)
from _workers_sessions import Template

from shared.enqueue import (
    TASK_MAYBE_SUMMARIZE,
)
from shared.store.sessions import SessionStore

# -- the LLM-only job: same worker, broker and LLM call, no compaction work --------------------
WORKER_APP = "workers.app"


LLM_ONLY_APP = "_workers_llm_only:llm_only_app"


REQUEST_KEY = "bench:request"
"""Under the store's key prefix: the template's LLM request and cut, for the LLM-only job."""


def store_request(store: SessionStore, template: Template) -> None:
    store.redis.set(f"{store.config.key_prefix}:{REQUEST_KEY}",
                    json.dumps({"request": template.request,
                                "cut": template.summarized_messages}))


def _build_llm_only_app() -> Any:
    """A worker app whose ``compaction.maybe_summarize`` only makes the job's LLM call.

    Same Celery configuration (``workers.app.celery_config``), same runtime
    (store client, ``OpenAIClient``), same publish path and task name; the job
    clears the pending flag, sends the template's request (the one a real job
    sends) and marks the session summarized. It skips what the real job adds:
    lease, view loads, plan, transcript rendering, token counts, ledger, commit.
    The gap between the two is the job's own work; this one is the ceiling of
    the pool, the broker and the SDK.
    """
    from celery import Celery

    from workers.app import celery_config
    from workers.runtime import get_runtime
    from workers.settings import load_settings

    settings = load_settings()
    app = Celery("compaction-bench-llm-only", set_as_current=False)
    app.conf.update(celery_config(settings))
    cache: dict[str, Any] = {}

    @app.task(name=TASK_MAYBE_SUMMARIZE)  # type: ignore[untyped-decorator]
    def llm_only(session_id: str, tenant: str = "default") -> dict[str, Any]:
        runtime = get_runtime(settings)
        store = runtime.store.for_tenant(tenant)
        redis = runtime.store.redis  # a tenant's handle has no raw client
        store.clear_pending(session_id)
        if "request" not in cache:
            raw = redis.get(f"{settings.key_prefix}:{REQUEST_KEY}")
            cache.update(json.loads(raw))
        client = runtime.engine.client
        if client is None:
            raise RuntimeError("the LLM-only job needs COMPACTION_SUMMARIZER=openai")
        completion = client.complete(cache["request"], 2000)
        redis.hset(store.keys(session_id).state,
                         mapping={"watermark": cache["cut"], "summary_kind": "llm"})
        return {"session_id": session_id, "status": "compacted",
                "summarizer_input_tokens": completion.input_tokens}

    return app


def __getattr__(name: str) -> Any:
    """``llm_only_app`` is built on first access: only the LLM-only worker builds it."""
    if name == "llm_only_app":
        app = _build_llm_only_app()
        globals()[name] = app
        return app
    raise AttributeError(name)
