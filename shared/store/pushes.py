"""The pushes waiting on a RESP3 connection: one ``poll`` when there are none, one read
when some arrived.

The change feed and the own-writes connection look for invalidation pushes before
every use, usually to find none. redis-py's ``can_read(0)`` makes a poll object and
its host string each time: ~2 µs back to back, but ~70 µs for a guard's first call
after a model call (the process idle for a while), where one poll of the socket on a
kept poll object costs ~20. Nothing buffered in the parser and nothing on the socket
is exactly when ``can_read(0)`` says no.

Pushes do arrive during a model call: a worker summarizing the session claims its job,
takes a lease, commits. redis-py drains them with ~8 system calls a push (a readiness
poll, a closed-socket poll and peek, a timeout set and restored around each read, a
poll to see the end): ~110 µs after an idle spell. Read here instead with one
``readv`` of what the socket holds, parsed by the connection's own hiredis reader and
handed push by push to its own handler, as redis-py's read does. Anything unusual
(the socket gone or replaced, end of file, an error, a reply cut short) takes redis-py's
path, which raises or reads on as it always did.
"""

from __future__ import annotations

import os
import select
import time
from typing import Any

from redis.exceptions import ConnectionError as Disconnected

try:  # the sentinel redis-py's hiredis reader returns for "not a whole reply yet"
    from redis._parsers.hiredis import NOT_ENOUGH_DATA as _PARTIAL
except ImportError:  # pragma: no cover - another redis-py: its own path only
    _PARTIAL = None


class Pushes:
    """The waiting pushes of one connection (its parser's handler takes each)."""

    __slots__ = ("_buffer", "_fd", "_poll", "_push_type", "_reader", "_sock", "conn")

    def __init__(self, conn: Any, *, tls: bool = False) -> None:
        self.conn = conn
        parser = getattr(conn, "_parser", None)
        reader = getattr(parser, "_reader", None)
        sock = getattr(conn, "_sock", None)
        self._reader: Any = reader if hasattr(reader, "has_data") else None
        self._sock: Any = sock
        self._poll: Any = None
        self._buffer: Any = None
        self._push_type: Any = getattr(parser, "_hiredis_PushNotificationType", None)
        self._fd = -1
        # TLS keeps decrypted bytes above the socket; the pure-Python parser buffers its
        # own way: there, and without poll(), redis-py's check alone can say
        if self._reader is not None and sock is not None and not tls \
                and hasattr(select, "poll"):
            self._poll = select.poll()
            self._poll.register(sock, select.POLLIN)  # a hang-up or a closed fd reports too
            buffer = getattr(parser, "_buffer", None)
            if isinstance(buffer, bytearray) and buffer and _PARTIAL is not None \
                    and self._push_type is not None and hasattr(os, "readv"):
                self._buffer, self._fd = buffer, sock.fileno()

    def drain(self) -> None:
        """Read every push waiting (redis-py raises if the connection is gone)."""
        if self._poll is not None and not self._reader.has_data():
            if not self._poll.poll(0):
                return
            if self._buffer is not None and self._read_once():
                return
        while self.conn.can_read(0):
            self.conn.read_response(push_request=True, timeout=0)

    def _read_once(self) -> bool:
        """What the socket holds, read with one system call and handed to the parser
        reply by reply as redis-py's read would (pushes to its handler, an error raised
        and the connection closed, any other reply dropped, as a drain always has); False
        where redis-py's path must go on."""
        conn = self.conn
        parser = conn._parser
        if conn._sock is not self._sock or parser._reader is not self._reader:
            return False  # disconnected or reconnected: the descriptor is not ours now
        try:
            size = os.readv(self._fd, [self._buffer])
        except OSError:  # would block, or failed: redis-py's path says which
            return False
        if size == 0:  # end of file: redis-py's path reports the closed connection
            return False
        reader = self._reader
        reader.feed(self._buffer, 0, size)
        try:
            while True:
                reply = reader.gets()
                if reply is _PARTIAL:
                    break
                if isinstance(reply, self._push_type):
                    parser.handle_push_response(reply)
                elif isinstance(reply, Exception):  # raised by redis-py's read too
                    raise reply
                elif isinstance(reply, list) and reply and isinstance(reply[0], Disconnected):
                    raise reply[0]
        except BaseException:
            conn.disconnect()  # as redis-py's read does on any failure
            raise
        if conn.health_check_interval:
            conn.next_health_check = time.monotonic() + conn.health_check_interval
        return not reader.has_data()  # a reply cut short: redis-py's path reads the rest


__all__ = ["Pushes"]
