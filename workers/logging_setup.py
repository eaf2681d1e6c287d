"""``COMPACTION_LOG_FORMAT=json``: the worker's log lines as JSON objects.

Celery configures the worker's logging itself (its ``--loglevel``, its
handlers on the root and task loggers) and then sends
``after_setup_logger`` / ``after_setup_task_logger``: here every handler it
set up gets :class:`shared.telemetry.logs.JsonFormatter` and the filter that
adds the session, tenant, job and trace ids bound by
:func:`workers.metrics.observed`. With ``text`` (the default) nothing
changes.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.signals import after_setup_logger, after_setup_task_logger

from shared.telemetry.logs import configure_json


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


# Celery's signals are untyped: connected by call, not as decorators (mypy --strict).
after_setup_logger.connect(_json_handlers, weak=False)
after_setup_task_logger.connect(_json_handlers, weak=False)


__all__ = ["json_logs_wanted", "use_json"]
