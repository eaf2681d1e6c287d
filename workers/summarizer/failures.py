"""What a failed summarizer call was: a bounded class, the HTTP status, the wait asked.

The provider clients (:mod:`workers.summarizer.providers`) tag the project's
exception with it, so that the GenAI span and the error counter
(:mod:`shared.telemetry.genai`) tell a rate limit from an outage or a
timeout, and the Celery task (:mod:`workers.tasks`) waits at least as long
as the provider asked before it retries.

The exception keeps its class (``SummarizerUnavailable`` is retried,
``SummarizerError`` falls back at once, ...); the tags are plain attributes
(``error_class``, ``http_status``, ``retry_after``) read with :func:`failure_of`,
``shared.telemetry.genai`` reads the first two by name.
"""

from __future__ import annotations

import email.utils
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from shared.telemetry.genai import ERROR_CLASSES

E = TypeVar("E", bound=BaseException)
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)s\s*$")  # google.protobuf.Duration in JSON: "30s"
MAX_STATED_WAIT = 86_400.0
"""A stated wait is read up to a day (a longer one is taken as a day: never retried in time)."""


@dataclass(frozen=True, slots=True)
class Failure:
    error_class: str
    http_status: int | None = None
    retry_after: float | None = None
    """Seconds the provider asked to wait before the next request (Retry-After,
    retry-after-ms, google.rpc.RetryInfo), when it said."""


def status_class(status: int | None) -> str:
    """The error class of an HTTP error status."""
    if status is None:
        return "other"
    if status == 429:
        return "rate_limited"
    if status == 408:
        return "timeout"
    if status >= 500:
        return "server_error"
    if status in (401, 403):
        return "auth"
    if status == 404:
        return "not_found"
    return "bad_request" if 400 <= status < 500 else "other"


def tag(exc: E, error_class: str, *, status: int | None = None,
        retry_after: float | None = None) -> E:
    """``exc`` tagged with what the call's failure was (returns ``exc``)."""
    if error_class not in ERROR_CLASSES:
        raise ValueError(f"unknown summarizer error class {error_class!r}")
    exc.error_class = error_class  # type: ignore[attr-defined]
    exc.http_status = status  # type: ignore[attr-defined]
    exc.retry_after = retry_after  # type: ignore[attr-defined]
    return exc


def failure_of(exc: BaseException) -> Failure | None:
    """The tags of ``exc``, or None for an exception no provider client tagged."""
    error_class = getattr(exc, "error_class", None)
    if not isinstance(error_class, str):
        return None
    status = getattr(exc, "http_status", None)
    wait = getattr(exc, "retry_after", None)
    return Failure(error_class, status if isinstance(status, int) else None,
                   float(wait) if isinstance(wait, (int, float)) else None)


def retry_after_of(exc: BaseException) -> float | None:
    failure = failure_of(exc)
    return failure.retry_after if failure is not None else None


def _seconds(value: float) -> float | None:
    if not math.isfinite(value) or value < 0:
        return None
    return min(value, MAX_STATED_WAIT)


def wait_from_headers(headers: Mapping[str, str] | Any) -> float | None:
    """The wait an HTTP answer asks for: ``retry-after-ms`` (OpenAI, Azure), else
    ``Retry-After`` in seconds or as an HTTP date; None when neither is readable."""
    if headers is None:
        return None
    try:
        millis = headers.get("retry-after-ms")
        if millis is not None:
            return _seconds(float(millis) / 1000)
    except (TypeError, ValueError):
        pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return _seconds(float(value))
    except (TypeError, ValueError):
        pass
    try:
        when = email.utils.parsedate_to_datetime(str(value))
    except (TypeError, ValueError, IndexError):
        return None
    return _seconds(max(0.0, when.timestamp() - time.time()))


def wait_from_retry_info(body: Any) -> float | None:
    """``retryDelay`` of a ``google.rpc.RetryInfo`` in a Google API error body (Gemini,
    Vertex AI: 429 RESOURCE_EXHAUSTED), or None."""
    error = body.get("error", body) if isinstance(body, dict) else None
    details = error.get("details") if isinstance(error, dict) else None
    for detail in details if isinstance(details, list) else []:
        if isinstance(detail, dict) and str(detail.get("@type", "")).endswith(
                "google.rpc.RetryInfo"):
            match = _DURATION.match(str(detail.get("retryDelay", "")))
            if match:
                return _seconds(float(match.group(1)))
    return None


__all__ = ["MAX_STATED_WAIT", "Failure", "failure_of", "retry_after_of", "status_class", "tag",
           "wait_from_headers", "wait_from_retry_info"]
