"""Bounded connection pools whose callers wait their turn, and fail only when Redis does.

Why not redis-py's blocking pools as they are (8.1): a call beyond ``max_connections``
waits at most ``timeout`` seconds *of its own wait*, and a released connection goes to
whichever caller asks first, not to the one that has waited longest. Under a burst (an
asyncio server with 1,000 conversations on one loop, 128 threads on one guard) a caller
queued behind hundreds of others, or overtaken again and again, ran out of its wait
while Redis answered every call in a millisecond: ``StoreUnavailable: No connection
available`` from a healthy Redis, and the agent sent a view without its history
(``scripts/bench_guard_concurrency.py``: 515 of 5,000 turns). The non-blocking pool
that :func:`shared.store.sessions.connect` used failed such a call at once (``Too many
connections``, 139 of 640 turns with 128 threads).

Here a connection released goes to the caller that has waited longest (first in,
first out), and a waiting caller gives up only after ``timeout`` seconds during which
no connection came back from an answered call: while Redis answers, a queue of any
length drains in order; when it stops answering (calls time out and their
connections come back closed), every waiting caller fails within ``timeout`` of the
last answer, as before. ``timeout=None`` waits for as long as it takes.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import deque
from typing import Any

import redis
import redis.asyncio

NO_CONNECTION = "no connection of the pool's {size} came back from an answered call " \
    "for {timeout:g} s (max_connections, pool_timeout)"


def _no_connection(size: int, timeout: float | None) -> redis.ConnectionError:
    return redis.ConnectionError(NO_CONNECTION.format(size=size, timeout=timeout or 0))


class _Waiter:
    """One caller waiting for a connection, on a thread."""

    __slots__ = ("event", "granted")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.granted = False


class ThreadTurns:
    """``size`` turns handed out first in, first out, across threads."""

    def __init__(self, size: int, timeout: float | None) -> None:
        self.size = size
        self.timeout = timeout
        self.free = size
        self.answered = 0.0  # time.monotonic() of the last answered call's release
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._queue: deque[_Waiter] = deque()

    def take(self) -> None:
        with self._lock:
            if self.free and not self._queue:
                self.free -= 1
                return
            waiter = _Waiter()
            self._queue.append(waiter)
        try:
            self._wait(waiter)
        except BaseException:
            # gave up other than by the timeout (a signal handler's exception in this
            # thread: Celery's soft time limit, a KeyboardInterrupt): out of the queue,
            # or the turn granted meanwhile to the next caller; left in, the next
            # connection released went to no one and the pool was a turn short for good
            with self._lock:
                if waiter.granted:
                    self._hand_on()
                elif waiter in self._queue:
                    self._queue.remove(waiter)
            raise

    def _wait(self, waiter: _Waiter) -> None:
        began = time.monotonic()
        while True:
            left = None if self.timeout is None else \
                max(began, self.answered) + self.timeout - time.monotonic()
            if waiter.event.wait(None if left is None else max(left, 0.0)):
                return
            with self._lock:
                if waiter.granted:
                    return
                if max(began, self.answered) + (self.timeout or 0) <= time.monotonic():
                    self._queue.remove(waiter)
                    raise _no_connection(self.size, self.timeout)

    def give(self, answered: bool) -> None:
        with self._lock:
            if answered:
                self.answered = time.monotonic()
            self._hand_on()

    def _hand_on(self) -> None:
        """A turn back: to the caller that has waited longest, else free (lock held)."""
        if self._queue:
            waiter = self._queue.popleft()
            waiter.granted = True
            waiter.event.set()
        else:
            self.free += 1


class LoopTurns:
    """``size`` turns handed out first in, first out, to the tasks of one event loop at a
    time: used from another loop later on (a test client's ``asyncio.run`` after another,
    each loop closed at its end), a turn handed to a waiter of a loop that closed before
    the waiter ran comes back, and a closed loop's waiters leave the queue; before, each
    such waiter ate a turn for good (the pool failed every call once they were all
    eaten) and a closed loop's waiter handed its turn raised into a release."""

    def __init__(self, size: int, timeout: float | None) -> None:
        self.size = size
        self.timeout = timeout
        self.free = size
        self.answered = 0.0  # time.monotonic() of the last answered call's release
        self._queue: deque[asyncio.Future[None]] = deque()
        self._granted: set[asyncio.Future[None]] = set()  # handed, their waiter not back
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop of the last take

    def _sweep(self) -> None:
        """On a loop other than the last take's: the turns handed to the waiters of a
        closed loop back, and its waiters out of the queue (their tasks never run again).
        Once per change of loop: a long queue is not walked at every call."""
        loop = asyncio.get_running_loop()
        if loop is self._loop:
            return
        self._loop = loop
        self._queue = deque(t for t in self._queue if not t.get_loop().is_closed())
        for turn in [t for t in self._granted if t.get_loop().is_closed()]:
            self._granted.discard(turn)
            self.give(False)

    async def take(self) -> None:
        self._sweep()
        if self.free and not self._queue:
            self.free -= 1
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append(turn)
        began = time.monotonic()
        try:
            while not turn.done():
                if self.timeout is None:
                    await asyncio.wait((turn,))
                    continue
                left = max(began, self.answered) + self.timeout - time.monotonic()
                if left <= 0:
                    raise _no_connection(self.size, self.timeout)
                await asyncio.wait((turn,), timeout=left)
        except BaseException:
            # (a closed loop's task, its coroutine closed when collected: its turn or
            # its place already dealt with by a sweep, not given back twice)
            if turn.done() and not turn.cancelled():
                if turn in self._granted:  # granted as it gave up: the next caller's
                    self._granted.discard(turn)
                    self.give(False)
            else:
                turn.cancel()
                if turn in self._queue:
                    self._queue.remove(turn)
            raise
        self._granted.discard(turn)

    def give(self, answered: bool) -> None:
        if answered:
            self.answered = time.monotonic()
        while self._queue:
            turn = self._queue.popleft()
            if not turn.done() and not turn.get_loop().is_closed():
                self._granted.add(turn)
                turn.set_result(None)
                return
        self.free += 1


class TurnTakingPool(redis.ConnectionPool):
    """The turn-taking both blocking pools share (:class:`FairConnectionPool`, the
    Sentinel pool :class:`shared.store.sentinel.FollowingSentinelPool`), mixed in before
    redis-py's pool class: a call takes a turn (:class:`ThreadTurns`) before the pool
    under it hands out a connection, so that pool never runs out nor makes a caller wait
    unfairly, and gives it back when its connection comes back. One copy: the two pools'
    copies had drifted apart before."""

    turns: ThreadTurns
    _holding: dict[int, int]  # the connections handed out with a turn -> generation
    _generation = 0  # how many times the pool was reset in this process

    def _start_turns(self, size: int, timeout: float | None) -> None:
        self.turns = ThreadTurns(size, timeout)
        self._holding = {}

    def reset(self) -> None:
        """A forked child starts with every turn free (the parent's threads are not
        there to give theirs back). In the same process the turns stay (the calls
        holding them give them back), and the connections they hold are the pool's no
        more: closed as they come back (:meth:`release`)."""
        super().reset()
        self._generation += 1
        turns = getattr(self, "turns", None)
        if turns is not None and turns.pid != os.getpid():
            self._start_turns(turns.size, turns.timeout)

    def _in_turn(self) -> None:
        """What a call does once its turn came, before the pool under it hands out a
        connection (nothing here; the Sentinel pool asks the Sentinels)."""

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        self._checkpid()
        self.turns.take()
        try:
            self._in_turn()
            connection = super().get_connection(*args, **kwargs)
        except BaseException:
            self.turns.give(False)
            raise
        self._holding[id(connection)] = self._generation
        return connection

    def release(self, connection: Any) -> None:
        """The connection back to redis-py's pool and its turn to the caller that has
        waited longest; one the pool no longer knows (handed out before a reset, or by
        the parent process) is closed instead: redis-py put it back into a queue that
        did not count it (left open by :meth:`disconnect`), or raised ``queue.Full``."""
        self._checkpid()  # in a forked child, its own turns: not the parent's to give
        answered = bool(getattr(connection, "is_connected", False))
        generation = self._holding.pop(id(connection), None)
        try:
            if generation not in (None, self._generation) \
                    or getattr(connection, "pid", self.pid) != self.pid:
                connection.disconnect()
            else:
                super().release(connection)
        finally:
            if generation is not None:
                self.turns.give(answered)


class FairConnectionPool(TurnTakingPool, redis.BlockingConnectionPool):
    """redis-py's blocking pool, its waits first in, first out and bounded by Redis's
    silence (the module's docstring)."""

    def __init__(self, max_connections: int = 100, timeout: float | None = 1.0,
                 **kwargs: Any) -> None:
        super().__init__(max_connections=max_connections,  # type: ignore[no-untyped-call]
                         timeout=timeout, **kwargs)
        self._start_turns(max_connections, timeout)


class AsyncFairConnectionPool(redis.asyncio.BlockingConnectionPool):
    """The asyncio twin of :class:`FairConnectionPool`."""

    _generation = 0  # how many times the pool was reset

    def __init__(self, max_connections: int = 100, timeout: float | None = 1.0,
                 **kwargs: Any) -> None:
        self.turns = LoopTurns(max_connections, timeout)
        self._holding: dict[int, int] = {}  # handed out with a turn -> generation
        super().__init__(max_connections=max_connections, timeout=timeout, **kwargs)

    def reset(self) -> None:
        """The turns stay (the calls holding them give them back); the connections
        they hold are the pool's no more: closed as they come back (:meth:`release`)."""
        super().reset()  # type: ignore[no-untyped-call]
        self._generation += 1

    async def _in_turn(self) -> None:
        """See :meth:`TurnTakingPool._in_turn`: after the wait, so a call that waited
        decides on what is true when its turn came, not before."""

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        await self.turns.take()
        try:
            await self._in_turn()
            connection = await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
        except BaseException:
            self.turns.give(False)
            raise
        self._holding[id(connection)] = self._generation
        return connection

    async def release(self, connection: Any) -> None:
        """The connection back (:meth:`_put_back`) and its turn to the task that has
        waited longest; one handed out before a :meth:`reset` is closed instead
        (redis.asyncio's pool no longer knows it: its release raised KeyError into the
        call that had succeeded)."""
        answered = bool(getattr(connection, "is_connected", False))
        generation = self._holding.pop(id(connection), None)
        try:
            if generation not in (None, self._generation):
                await connection.disconnect()
            else:
                await self._put_back(connection)
        finally:
            if generation is not None:
                self.turns.give(answered)

    async def _put_back(self, connection: Any) -> None:
        """redis.asyncio's release (the Sentinel pool closes a connection to an old
        primary first)."""
        await super().release(connection)


__all__ = ["AsyncFairConnectionPool", "FairConnectionPool", "LoopTurns", "ThreadTurns",
           "TurnTakingPool"]
