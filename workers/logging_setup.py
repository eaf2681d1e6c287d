"""``COMPACTION_LOG_FORMAT=json``: the worker's log lines as JSON objects.

Celery configures the worker's logging itself (its ``--loglevel``, its
handlers on the root and task loggers) and then sends
``after_setup_logger`` / ``after_setup_task_logger``: here every handler it
set up gets :class:`shared.telemetry.logs.JsonFormatter` and the filter that
adds the session, tenant, job and trace ids bound by
:func:`workers.metrics.observed`. With ``text`` (the default) nothing
changes.

Celery logs a job's end itself, after the task body returned or raised: the
"succeeded" line, and the "raised unexpected" one with the traceback. Those are
written outside :func:`~workers.metrics.observed`, so the job's ids are bound
from ``task_prerun`` to ``task_postrun`` too (both sent on the thread that runs
the job, around every line Celery writes about it), and released at
``task_postrun`` so that nothing is left for the next job on that thread.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    task_postrun,
    task_prerun,
)

from shared.telemetry.logs import configure_json, log_context

OUR_TASKS = "compaction."  # the prefix of this project's task names (shared.enqueue)
_jobs: dict[str, contextlib.ExitStack] = {}  # task id -> its bound ids, until its postrun
_jobs_lock = threading.Lock()


def json_logs_wanted() -> bool:
    from workers.app import app

    return bool(app.conf.compaction_settings.log_format == "json")


def use_json(logger: logging.Logger) -> int:
    """JSON on every handler of ``logger``; how many handlers were changed."""
    for handler in logger.handlers:
        configure_json(handler)
    return len(logger.handlers)


def _json_handlers(logger: logging.Logger | None = None, **_: Any) -> None:
    if logger is not None and json_logs_wanted():
        use_json(logger)


def job_ids(task_id: str, name: str, args: Sequence[Any] | None,
            kwargs: Mapping[str, Any] | None) -> dict[str, str | None]:
    """The log ids of a job of ours: its id and task, its session (the first argument)
    and its tenant (the ``tenant`` keyword, else the tasks' default)."""
    args, kwargs = list(args or ()), dict(kwargs or {})
    session = kwargs.get("session_id", args[0] if args else None)
    tenant = kwargs.get("tenant", "default")
    return {"job_id": task_id, "task": name.rsplit(".", 1)[-1],
            "session_id": session if isinstance(session, str) else None,
            "tenant": tenant if isinstance(tenant, str) else None}


def _bind_job(task_id: str | None = None, task: Any = None, args: Any = None,
              kwargs: Any = None, **_: Any) -> None:
    name = str(getattr(task, "name", ""))
    if task_id is None or not name.startswith(OUR_TASKS):
        return
    ids = job_ids(task_id, name, args, kwargs)
    bound = contextlib.ExitStack()
    bound.enter_context(log_context(**ids))
    with _jobs_lock:
        _jobs[task_id] = bound


def _release_job(task_id: str | None = None, **_: Any) -> None:
    with _jobs_lock:
        bound = _jobs.pop(task_id, None) if task_id is not None else None
    if bound is not None:
        # a token of another context (a pool that moved the job) cannot be reset: dropped
        with contextlib.suppress(ValueError):
            bound.close()


# Celery's signals are untyped: connected by call, not as decorators (mypy --strict).
after_setup_logger.connect(_json_handlers, weak=False)
after_setup_task_logger.connect(_json_handlers, weak=False)
task_prerun.connect(_bind_job, weak=False)
task_postrun.connect(_release_job, weak=False)


__all__ = ["job_ids", "json_logs_wanted", "use_json"]
