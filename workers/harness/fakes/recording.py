"""The fakes' request log: what each request looked like and how it was answered.

Tests assert on it (which request got which fault, how many prompt tokens the
fake counted, what the client sent); credentials in headers are redacted on
the way in so a log printed in a failing test never shows a key.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the fake saw it; secrets in headers are redacted."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    status: int
    timestamp: float
    index: int | None = None  # sequence number of a completion request
    prompt_tokens: int | None = None
    fault: str | None = None
    dropped_messages: int = 0  # silent truncation only


SECRET_HEADERS = frozenset({"authorization", "x-goog-api-key", "api-key", "x-api-key"})


def redact_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Header names lower-cased; the values of credential headers replaced."""
    return {
        k.lower(): ("<redacted>" if k.lower() in SECRET_HEADERS else v) for k, v in headers
    }


@dataclass
class RequestLog:
    """Thread-safe list of :class:`RecordedRequest`."""

    _items: list[RecordedRequest] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def append(self, record: RecordedRequest) -> None:
        with self._lock:
            self._items.append(record)

    def snapshot(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._items)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


__all__ = ["SECRET_HEADERS", "RecordedRequest", "RequestLog", "redact_headers"]
