"""The pushes waiting on a RESP3 connection, read with one ``poll`` when there are none.

The change feed and the own-writes connection look for invalidation pushes before
every use, usually to find none. redis-py's ``can_read(0)`` makes a poll object and
its host string each time: ~2 µs back to back, but ~70 µs for a guard's first call
after a model call (the process idle for a while), where one poll of the socket on a
kept poll object costs ~20. Nothing buffered in the parser and nothing on the socket
is exactly when ``can_read(0)`` says no; anything else takes redis-py's own path.
"""

from __future__ import annotations

import select
from typing import Any


class Pushes:
    """The waiting pushes of one connection (its parser's handler takes each)."""

    __slots__ = ("_poll", "_reader", "conn")

    def __init__(self, conn: Any, *, tls: bool = False) -> None:
        self.conn = conn
        reader = getattr(getattr(conn, "_parser", None), "_reader", None)
        sock = getattr(conn, "_sock", None)
        self._reader: Any = reader if hasattr(reader, "has_data") else None
        self._poll: Any = None
        # TLS keeps decrypted bytes above the socket; the pure-Python parser buffers its
        # own way: there, and without poll(), redis-py's check alone can say
        if self._reader is not None and sock is not None and not tls \
                and hasattr(select, "poll"):
            self._poll = select.poll()
            self._poll.register(sock, select.POLLIN)  # a hang-up or a closed fd reports too

    def drain(self) -> None:
        """Read every push waiting (redis-py raises if the connection is gone)."""
        if self._poll is not None and not self._reader.has_data() \
                and not self._poll.poll(0):
            return
        while self.conn.can_read(0):
            self.conn.read_response(push_request=True, timeout=0)


__all__ = ["Pushes"]
