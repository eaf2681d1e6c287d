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
import logging
from typing import Any


class NoColour(logging.Filter):
    """uvicorn logs its start-up lines with ``extra={"color_message": ...}``: the same
    text with ANSI colour codes, for its own coloured formatter. The JSON formatter writes
    every ``extra`` field, so each such line carried the escape codes as a second message."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.__dict__.pop("color_message", None)
        return True


def log_config(log_format: str, level: str = "info") -> dict[str, Any] | None:
    """uvicorn's ``log_config`` for ``log_format`` (None: uvicorn's own default)."""
    if log_format != "json":
        return None
    from uvicorn.config import LOGGING_CONFIG

    config: dict[str, Any] = copy.deepcopy(LOGGING_CONFIG)
    formatter = {"()": "shared.telemetry.logs.JsonFormatter"}
    config["formatters"] = {name: dict(formatter) for name in config["formatters"]}
    config["filters"] = {"ids": {"()": "shared.telemetry.logs.ContextFilter"},
                         "no_colour": {"()": "workers.server.logconfig.NoColour"}}
    for handler in config["handlers"].values():
        handler["filters"] = ["ids", "no_colour"]
    config["root"] = {"handlers": ["default"], "level": level.upper()}
    return config


__all__ = ["NoColour", "log_config"]
