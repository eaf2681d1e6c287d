"""The HTTP plumbing both fake provider servers share.

A fake is a real HTTP server on 127.0.0.1 (ephemeral port by default) so the
real SDKs, with their real HTTP clients, timeouts and error mapping, are
exercised; nothing is mocked. The stdlib ``ThreadingHTTPServer`` serves each
connection in its own thread, so a fixed latency (slept per request thread)
does not serialize concurrent clients. Subclasses implement :meth:`route`;
this module does the lifecycle, request recording, latency, stalls that stop
with the server, connection resets and the reply-level faults.
"""

from __future__ import annotations

import json
import logging
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit

from shared.core.errors import InvalidInput
from workers.harness.fakes.behaviour import (
    ERROR_FAULTS,
    REFUSAL_TEXT,
    Fault,
    FaultPlan,
    Reply,
    Responder,
    Script,
    ScriptExhausted,
    as_responder,
    normalize_reply,
)
from workers.harness.fakes.recording import RecordedRequest, RequestLog, redact_headers

logger = logging.getLogger(__name__)

ENDLESS_DEFAULT_TOKENS = 4096
ENDLESS_MAX_CHARS = 4_000_000
_ENDLESS_FILLER = "and the story goes on "


@dataclass
class Outcome:
    """What to send back for one request."""

    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    reset: bool = False  # reset the connection instead of answering


@dataclass
class Exchange:
    """One request in flight; routes fill in what the request log should say about it."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    raw: bytes
    handler: Any = None
    model: str = ""  # the model asked for, once known
    flavor: str = ""  # provider variant serving the request (e.g. "vertex")
    parsed: Any = None
    index: int | None = None
    prompt_tokens: int | None = None
    fault: str | None = None
    dropped_messages: int = 0

    def client_gone(self) -> bool:
        """Whether the client hung up (e.g. its timeout fired during a stall)."""
        sock = getattr(self.handler, "connection", None)
        if sock is None:
            return False
        try:
            readable, _, _ = select.select([sock], [], [], 0)
            return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True


RESET = Outcome(0, reset=True)


def json_outcome(status: int, payload: Any, headers: dict[str, str] | None = None) -> Outcome:
    """An Outcome with ``payload`` serialized as JSON."""
    return Outcome(status, json.dumps(payload).encode(), headers=headers or {})


def apply_content_fault(reply: Reply, fault: Fault | None, max_tokens: int | None) -> Reply:
    """Replace a reply by a refusal, empty or endless one when the fault asks for it."""
    if fault is None:
        return reply
    if fault.kind == "refusal":
        return {"role": "assistant", "content": REFUSAL_TEXT, "finish_reason": "stop"}
    if fault.kind == "empty":
        return {"role": "assistant", "content": "", "finish_reason": "stop"}
    if fault.kind == "endless":
        tokens = fault.tokens or max_tokens or ENDLESS_DEFAULT_TOKENS
        chars = min(tokens * 4, ENDLESS_MAX_CHARS)
        text = (_ENDLESS_FILLER * (chars // len(_ENDLESS_FILLER) + 1))[:chars]
        return {
            "role": "assistant",
            "content": text,
            "finish_reason": "length",
            "completion_tokens": tokens,
        }
    return reply


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: SDK connection pools reuse connections
    # Headers and body go out in separate writes; with Nagle on, each keep-alive response
    # waits for the client's delayed ACK (~40 ms per request).
    disable_nagle_algorithm = True
    server: _Server

    def do_GET(self) -> None:
        self.server.fake._serve(self, "GET")

    def do_POST(self) -> None:
        self.server.fake._serve(self, "POST")

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s", self.address_string(), format % args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # 32+ clients connect at once; the default backlog of 5 drops SYNs
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], fake: FakeServerBase) -> None:
        self.fake = fake
        super().__init__(address, _Handler)


class FakeServerBase:
    """Lifecycle, recording, latency and fault plumbing of a fake provider server."""

    url_prefix = ""  # appended to the root URL to form ``base_url``

    def __init__(
        self,
        *,
        responder: Responder | Script | list[Any] | None = None,
        latency: float = 0.0,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        if latency < 0:
            raise InvalidInput("must be >= 0", field="latency")
        if not 0 <= port <= 65535:
            raise InvalidInput("must be in 0..65535", field="port")
        self.responder = as_responder(responder)
        self.latency = latency
        self.faults = FaultPlan()
        self._host = host
        self._port = port
        self._log = RequestLog()
        self._sequence = 0
        self._sequence_lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------
    def start(self) -> Self:
        if self._httpd is not None:
            return self
        self._stopping.clear()
        self._httpd = _Server((self._host, self._port), self)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"{type(self).__name__}:{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; requests still stalling are released and dropped."""
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("the fake server is not started")
        return int(self._httpd.server_address[1])

    @property
    def root_url(self) -> str:
        return f"http://{self._host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The URL to give the SDK as ``base_url``."""
        return self.root_url + self.url_prefix

    # -- state -----------------------------------------------------------------
    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot of every request received since the last reset."""
        return self._log.snapshot()

    def reset(self) -> None:
        """Forget requests and faults, restart sequence numbers, rewind a script."""
        self._log.clear()
        self.faults.clear()
        with self._sequence_lock:
            self._sequence = 0
        if isinstance(self.responder, Script):
            self.responder.rewind()

    def next_index(self) -> int:
        """The sequence number of a new completion request (faults are pinned to it)."""
        with self._sequence_lock:
            index = self._sequence
            self._sequence += 1
            return index

    def pause(self, seconds: float) -> bool:
        """Sleep ``seconds`` in this request's thread; False when the server is stopping."""
        return not self._stopping.wait(seconds) if seconds > 0 else not self._stopping.is_set()

    def next_reply(self, request: dict[str, Any]) -> Reply | Fault:
        """The responder's answer (a script may answer with a fault)."""
        if isinstance(self.responder, Script):
            return self.responder.next(request)
        return normalize_reply(self.responder(request), where="responder reply")

    # -- provider hooks --------------------------------------------------------
    def route(self, exchange: Exchange) -> Outcome:
        """Answer one request, filling in ``exchange`` for the log."""
        raise NotImplementedError

    def error_outcome(
        self, fault: Fault, exchange: Exchange, message: str | None = None
    ) -> Outcome:
        """The provider's real error response for an error fault (``message`` overrides)."""
        raise NotImplementedError

    garbage_body = b'{"id": "resp-garbage", "choices": [{"mess'  # JSON cut mid-way
    not_completion_body: Any = {"status": "queued", "detail": "try again later"}

    # -- shared fault handling -------------------------------------------------------
    def whole_answer_fault(self, fault: Fault, exchange: Exchange) -> Outcome | None:
        """The answer for faults that replace the whole response; None for the others."""
        if fault.kind in ERROR_FAULTS:
            return self.error_outcome(fault, exchange)
        if fault.kind == "reset":
            return RESET
        if fault.kind == "garbage":
            return Outcome(200, self.garbage_body)
        if fault.kind == "not_completion":
            return json_outcome(200, self.not_completion_body)
        return None

    def planned_fault(self, index: int, exchange: Exchange) -> Fault | None:
        """The fault of request ``index``: the plan's (a subclass may route otherwise)."""
        return self.faults.take(index)

    def take_fault(self, exchange: Exchange) -> tuple[Fault | None, Outcome | None]:
        """Number a completion request and apply its planned fault.

        Returns the fault (content faults are applied to the reply later by the route)
        and, for faults that replace the answer or a stall the client gave up on, the
        outcome to send instead.
        """
        index = exchange.index = self.next_index()
        fault = self.planned_fault(index, exchange)
        if fault is None:
            return None, None
        exchange.fault = fault.kind
        whole = self.whole_answer_fault(fault, exchange)
        if whole is not None:
            return fault, whole
        if fault.kind == "stall" and (not self.pause(fault.seconds) or exchange.client_gone()):
            return fault, RESET
        return fault, None

    def reply_or_outcome(
        self, exchange: Exchange, request: dict[str, Any], max_tokens: int | None
    ) -> Reply | Outcome:
        """The responder's reply, or the outcome of a fault a script put in its place.

        A scripted stall sleeps, then answers with the script's next item; if the client
        hung up meanwhile, nothing more is consumed so its retry gets that item.
        """
        while True:
            try:
                item = self.next_reply(request)
            except ScriptExhausted as exc:
                return self.error_outcome(Fault.server_error(), exchange, str(exc))
            if not isinstance(item, Fault):
                return item
            exchange.fault = item.kind
            whole = self.whole_answer_fault(item, exchange)
            if whole is not None:
                return whole
            if item.kind != "stall":
                return apply_content_fault({"role": "assistant", "content": ""}, item, max_tokens)
            if not self.pause(item.seconds) or exchange.client_gone():
                return RESET

    # -- plumbing ----------------------------------------------------------------
    def _serve(self, handler: _Handler, method: str) -> None:
        started = time.time()
        split = urlsplit(handler.path)
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length > 0 else b""
        headers = {k.lower(): v for k, v in handler.headers.items()}
        if self.latency and not self.pause(self.latency):
            handler.close_connection = True
            return
        exchange = Exchange(method, split.path, split.query, headers, raw, handler)
        try:
            outcome = self.route(exchange)
        except Exception as exc:  # a bug in a responder must not hang the client
            logger.exception("fake server failed to answer %s %s", method, split.path)
            outcome = json_outcome(500, {"error": {"message": f"fake server error: {exc}"}})
        self._log.append(
            RecordedRequest(
                method=method,
                path=split.path,
                headers=redact_headers(handler.headers.items()),
                body=exchange.parsed,
                status=0 if outcome.reset else outcome.status,
                timestamp=started,
                index=exchange.index,
                prompt_tokens=exchange.prompt_tokens,
                fault=exchange.fault,
                dropped_messages=exchange.dropped_messages,
            )
        )
        if outcome.reset or self._stopping.is_set():
            self._reset_connection(handler)
            return
        try:
            handler.send_response(outcome.status)
            handler.send_header("Content-Type", outcome.content_type)
            handler.send_header("Content-Length", str(len(outcome.body)))
            for name, value in outcome.headers.items():
                handler.send_header(name, value)
            handler.end_headers()
            handler.wfile.write(outcome.body)
        except OSError:  # the client left (timeout); nothing to tell it
            handler.close_connection = True

    @staticmethod
    def _reset_connection(handler: _Handler) -> None:
        """Close with SO_LINGER 0 so the peer sees a TCP reset, not a clean close."""
        handler.close_connection = True
        try:
            handler.connection.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
            )
            handler.connection.close()
        except OSError:
            pass


__all__ = ["RESET", "Exchange", "FakeServerBase", "Outcome", "apply_content_fault", "json_outcome"]
