"""Build the app from settings: what ``compaction serve`` and ``uvicorn --factory`` run.

``uvicorn --factory workers.server.main:app_from_env`` (several worker
processes) and ``compaction serve`` (one) build the same app: the store of
``COMPACTION_REDIS_URL`` with the configured token counter, the Celery
publisher of ``COMPACTION_BROKER_URL`` for ``maybe_summarize`` and
``compaction.compact`` (on ``COMPACTION_QUEUE``), the guard policy of
``COMPACTION_*``.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from shared.enqueue import QUEUE, TASK_COMPACT, CeleryEnqueuer, publisher_app
from workers.server.app import CompactPublisher, create_app
from workers.server.config import ServerConfig, load_server_config
from workers.settings import Settings, load_settings


def compact_publisher(app: Any, queue: str = QUEUE) -> CompactPublisher:
    """Publishes ``compaction.compact`` by name on ``queue``; the task id back."""

    def publish(tenant: str, session_id: str, keep_recent: int | None, force: bool) -> str:
        kwargs = {"keep_recent": keep_recent, "force": force, "tenant": tenant}
        result = app.send_task(TASK_COMPACT, args=[session_id], kwargs=kwargs, queue=queue)
        return str(result.id)

    return publish


def build_app(settings: Settings, config: ServerConfig) -> FastAPI:
    from workers.cli._common import open_store  # one PING: a clear error when Redis is down

    store = open_store(settings)
    publisher = publisher_app(settings.broker_url, timeout=2.0,
                              sentinel_master=settings.broker_sentinel_master)
    return create_app(config, store, CeleryEnqueuer(publisher, queue=settings.queue),
                      policy=settings.policy(),
                      compact=compact_publisher(publisher, settings.queue))


def app_from_env() -> FastAPI:
    """For ``uvicorn --factory workers.server.main:app_from_env``."""
    return build_app(load_settings(), load_server_config())


__all__ = ["app_from_env", "build_app", "compact_publisher"]
