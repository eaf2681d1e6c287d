"""``COMPACTION_LOG_FORMAT=json`` for ``compaction serve``: uvicorn's logging, as JSON.

uvicorn configures its own loggers only (``uvicorn``, ``uvicorn.error``,
``uvicorn.access``); the lines of the guard and of the app (``shared.*``,
``workers.*``: an enqueue outage, an unexpected error's traceback) reach the root
logger, where the CLI's text handler writes them without the request's tenant.
With ``json`` every handler writes :class:`shared.telemetry.logs.JsonFormatter`
objects with the ids bound for the request (:mod:`workers.server.logids`: tenant,
session id), and the root logger gets uvicorn's stderr handler instead. With
``text`` nothing changes.
"""

from __future__ import annotations

import copy
from typing import Any


def log_config(log_format: str, level: str = "info") -> dict[str, Any] | None:
    """uvicorn's ``log_config`` for ``log_format`` (None: uvicorn's own default)."""
    if log_format != "json":
        return None
    from uvicorn.config import LOGGING_CONFIG

    config: dict[str, Any] = copy.deepcopy(LOGGING_CONFIG)
    formatter = {"()": "shared.telemetry.logs.JsonFormatter"}
    config["formatters"] = {name: dict(formatter) for name in config["formatters"]}
    config["filters"] = {"ids": {"()": "shared.telemetry.logs.ContextFilter"}}
    for handler in config["handlers"].values():
        handler["filters"] = ["ids"]
    config["root"] = {"handlers": ["default"], "level": level.upper()}
    return config


__all__ = ["log_config"]
