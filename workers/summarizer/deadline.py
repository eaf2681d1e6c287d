"""An HTTP transport that bounds a whole call, not each socket operation.

The SDKs' timeouts (openai, google-genai, both over httpx) bound each
connect, write and read. A server that sends its headers and then trickles
the body (whitespace padding, as some proxies do to keep a connection
open) never lets one read wait that long, so the call lasts as long as the
server trickles; under the threads pool nothing else stops it, and the
worker thread is lost meanwhile.

:class:`DeadlineTransport` wraps the real transport: every request gets a
deadline of ``timeout`` seconds from its start, its per-operation timeouts
are cut to that, and the response body is read through a stream that
raises :class:`httpx.ReadTimeout` once the deadline has passed. The SDKs
map that exception to their own timeout error (openai: ``APITimeoutError``),
which the provider clients turn into a retried ``SummarizerUnavailable``.

Bound: the deadline is checked between the chunks the server sends, so a
call ends at most one chunk wait (itself at most the read timeout) after
it; a server that trickles its headers is bounded by the read timeout per
header read only.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import httpx

from shared.core.errors import InvalidInput

SDK_CONNECTION_LIMITS = {"max_connections": 1000, "max_keepalive_connections": 100}
"""The openai SDK's own pool size: 32 worker threads never wait for a connection."""


@functools.cache
def _stream_class(http: ModuleType) -> Any:
    """The deadline-checking body stream for one httpx flavour.

    openai 3 sends through ``httpx2``, google-genai through ``httpx``: same
    API, distinct classes, and a response only accepts its own module's
    ``SyncByteStream`` subclasses.
    """

    class DeadlineStream(http.SyncByteStream):  # type: ignore[misc, name-defined]
        """A response body that stops with ``ReadTimeout`` once the deadline passed."""

        def __init__(self, stream: Any, deadline: float, request: Any,
                     timeout: float) -> None:
            self._stream = stream
            self._deadline = deadline
            self._request = request
            self._timeout = timeout

        def __iter__(self) -> Iterator[bytes]:
            for chunk in self._stream:
                self._check()
                yield chunk
            self._check()

        def _check(self) -> None:
            if time.monotonic() > self._deadline:
                raise http.ReadTimeout(f"the whole call took more than {self._timeout:g} s "
                                       "(the reply was still arriving)", request=self._request)

        def close(self) -> None:
            self._stream.close()

    return DeadlineStream


class DeadlineTransport:
    """Wraps ``transport`` so that each request ends within ``timeout`` seconds.

    ``http`` is the httpx flavour of the client it serves (``httpx`` or
    ``httpx2``); ``transport`` defaults to that module's ``HTTPTransport``
    with the openai SDK's pool size.
    """

    def __init__(self, timeout: float, transport: Any = None, *,
                 http: ModuleType = httpx) -> None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
                or not 0 < timeout < float("inf"):
            raise InvalidInput("must be a positive number of seconds", field="timeout")
        self.timeout = float(timeout)
        self._http = http
        self._transport = transport or http.HTTPTransport(
            limits=http.Limits(**SDK_CONNECTION_LIMITS))

    def handle_request(self, request: Any) -> Any:
        deadline = time.monotonic() + self.timeout
        # Each operation may wait at most what the whole call may take.
        ops = dict(request.extensions.get("timeout") or {})
        for key in ("connect", "read", "write", "pool"):
            value = ops.get(key)
            ops[key] = self.timeout if value is None else min(float(value), self.timeout)
        request.extensions["timeout"] = ops
        response = self._transport.handle_request(request)
        stream = _stream_class(self._http)(response.stream, deadline, request, self.timeout)
        return self._http.Response(status_code=response.status_code, headers=response.headers,
                                   stream=stream, extensions=response.extensions,
                                   request=request)

    def close(self) -> None:
        self._transport.close()

    def __enter__(self) -> DeadlineTransport:
        self._transport.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._transport.__exit__(*exc_info)


def deadline_http_client(timeout: float, http: ModuleType = httpx) -> Any:
    """A client of the ``http`` flavour whose every call ends within about ``timeout`` s."""
    return http.Client(transport=DeadlineTransport(timeout, http=http), timeout=timeout,
                       follow_redirects=True)


__all__ = ["SDK_CONNECTION_LIMITS", "DeadlineTransport", "deadline_http_client"]
