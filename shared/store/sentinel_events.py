"""Sentinel's own failover events, heard as they happen: what the Sentinel pools add to
their once-a-second check (:mod:`shared.store.sentinel`).

Every Sentinel publishes what it does on pub/sub channels named after the event
(``+try-failover``, ``+switch-master``, ...). The Sentinel leading a failover publishes
its start (``+try-failover``) before it promotes the replica, and ``+switch-master`` once
it names the new primary; the others publish ``+switch-master`` when they hear of it.
A pool subscribed to every Sentinel it knows therefore learns of a failover when it
starts instead of at its next check (up to ``follow_seconds`` later), and may keep its
answer for longer between checks while it hears from all of them.

Three parts: :func:`parse_event` (a message to what it means for one service),
:class:`SentinelEvents` (the state a pool consults: sans-I/O, shared by both shells),
and the listeners that feed it (:class:`EventThread` for the blocking pool, a daemon
thread; :class:`EventTask` for the asyncio pool, a task on the running loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import os
import selectors
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import redis

log = logging.getLogger("shared.store.sentinel")

EVENTS_SECONDS = 15.0
"""How long the pool's answer stays fresh between checks while every Sentinel is heard
(``sentinel_events_seconds`` in the URL; 0 turns the subscription off)."""
FAILOVER_HOLD_SECONDS = 5.0
"""The longest calls wait for a failover reported in progress (see
:data:`shared.store.sentinel.FAILOVER_HOLD_SECONDS`)."""
RETRY_SECONDS = 1.0
"""The first wait before subscribing again to a Sentinel that failed; doubled each time,
up to :data:`RETRY_MAX_SECONDS`."""
RETRY_MAX_SECONDS = 8.0
STOP_SECONDS = 2.0
"""The longest an async pool's close waits for its listener to end."""

START_EVENTS = frozenset({
    "+try-failover", "+elected-leader", "+failover-state-select-slave", "+selected-slave",
    "+failover-state-send-slaveof-noone", "+failover-state-wait-promotion",
    "+promoted-slave", "+failover-state-reconf-slaves", "+failover-detected"})
"""A failover of the service has started (or goes on): the replica is, or is about to
be, promoted; writes to the old primary would be lost."""
ABORT_EVENTS = frozenset({
    "-failover-abort-not-elected", "-failover-abort-no-good-slave",
    "-failover-abort-slave-timeout", "-failover-abort-race"})
"""The failover that Sentinel started is given up: the primary stays."""
SWITCH_EVENT = "+switch-master"
STALE_EVENTS = frozenset({
    "+odown", "+sdown", "+config-update-from", "+reset-master", "+monitor", "-monitor",
    "+failover-end", "+failover-end-for-timeout"})
"""The primary may be down or renamed: the pool asks the Sentinels at its next call
(``+sdown`` / ``+odown`` of the primary only, not of a replica or a Sentinel)."""
CHANNELS = tuple(sorted(START_EVENTS | ABORT_EVENTS | STALE_EVENTS | {SWITCH_EVENT}))

Kind = Literal["start", "abort", "switch", "stale"]


@dataclass(frozen=True)
class Event:
    """One Sentinel event about our service: what kind, and for a switch the new
    primary's address."""

    kind: Kind
    primary: tuple[str, int] | None = None


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else ""


def _service_of(words: list[str]) -> tuple[str, str] | None:
    """(instance type, master name) of an ``<type> <name> <ip> <port> [@ <master-name>
    <master-ip> <master-port>]`` payload; None for anything else."""
    if "@" in words:
        at = words.index("@")
        return (words[0], words[at + 1]) if 0 < at < len(words) - 1 else None
    if len(words) >= 4 and words[0] == "master":
        return "master", words[1]
    return None


def parse_event(channel: Any, data: Any, service: str) -> Event | None:
    """What a message on ``channel`` means for ``service``; None when it is about
    another service, none at all, or cannot be read."""
    name, words = _text(channel), _text(data).split()
    if name == SWITCH_EVENT:
        if len(words) != 5 or words[0] != service or not words[4].isdigit():
            return None
        return Event("switch", (words[3], int(words[4])))
    about = _service_of(words)
    if about is None or about[1] != service:
        return None
    if name in START_EVENTS:
        return Event("start")
    if name in ABORT_EVENTS:
        return Event("abort")
    if name in STALE_EVENTS and (name not in ("+sdown", "+odown") or about[0] == "master"):
        return Event("stale")
    return None


class SentinelEvents:
    """What the events heard so far say, for one pool: sans-I/O, the listeners feed it
    (:meth:`heard`), the pool's :class:`~shared.store.sentinel._Follow` consults it.

    - :meth:`live`: every Sentinel answered within ``live_seconds`` (a message or the
      reply to a PING on its subscription): nothing it published before then was
      missed. One not heard could be the one leading a failover (only the leader
      publishes its start), so all must be, not a majority.
    - :meth:`holding`: a Sentinel reported a failover starting, not given up nor ended
      by ``+switch-master`` since, for at most :data:`FAILOVER_HOLD_SECONDS`.
    - ``changed``: when an event last made the pool's answer stale.
    """

    def __init__(self, service: str, count: int, *, fresh_seconds: float,
                 live_seconds: float) -> None:
        self.service = service
        self.fresh_seconds = fresh_seconds
        self.live_seconds = live_seconds
        self.pid = os.getpid()
        self.last_heard = [-math.inf] * count
        self.holds: dict[int, float] = {}  # Sentinel (its index) -> when it started one
        # (replaced, never changed in place: other threads read it while the listener
        # writes)
        self.changed = -math.inf
        self.used = time.monotonic()

    def live(self) -> bool:
        """Every Sentinel heard within ``live_seconds``, in the process that listens."""
        if not self.last_heard or self.pid != os.getpid():
            return False
        since = time.monotonic() - self.live_seconds
        return all(heard >= since for heard in self.last_heard)

    def holding(self) -> bool:
        now = time.monotonic()
        return any(now - since < FAILOVER_HOLD_SECONDS for since in self.holds.values())

    def lost(self, index: int) -> None:
        """The subscription to that Sentinel is down: not live until it is back."""
        self.last_heard[index] = -math.inf

    def heard(self, index: int, message: Any) -> Event | None:
        """A message from Sentinel ``index`` (a redis-py pub/sub message: the reply to
        SUBSCRIBE or PING too, which prove it is there); applies what it means."""
        now = time.monotonic()
        self.last_heard[index] = now
        if not isinstance(message, dict) or message.get("type") != "message":
            return None
        event = parse_event(message.get("channel"), message.get("data"), self.service)
        if event is None:
            return None
        log.debug("Sentinel %d: %s %s", index, _text(message.get("channel")),
                  _text(message.get("data")))
        if event.kind == "start":
            self.holds = {index: now, **self.holds}
        elif event.kind == "abort":
            self.holds = {i: t for i, t in self.holds.items() if i != index}
        elif event.kind == "switch":
            self.holds = {}
        self.changed = now
        return event

    def touch(self) -> None:
        """The pool is used: the listeners keep proving the Sentinels are there."""
        self.used = time.monotonic()

    def in_use(self) -> bool:
        """Used lately (within ``fresh_seconds``): an idle pool's listener stops its
        PINGs (events still arrive); its next call asks the Sentinels as before."""
        return time.monotonic() - self.used < max(self.fresh_seconds, self.live_seconds)

    def ping_every(self) -> float:
        return self.live_seconds / 4


def _subscribe(sentinel: Any) -> Any:
    pubsub = sentinel.pubsub()
    try:
        pubsub.subscribe(*CHANNELS)
        pubsub.ping()
    except BaseException:
        pubsub.close()
        raise
    return pubsub


_LOST = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError,
         ValueError, redis.exceptions.ResponseError)
"""A subscription that failed (refused, reset, timed out, or garbage on the wire)."""


class EventThread:
    """The blocking pool's listener: one daemon thread subscribed to every Sentinel,
    waiting on their sockets together. Started by the pool's first call, stopped by its
    close (or when the pool is collected)."""

    def __init__(self, events: SentinelEvents, sentinels: Sequence[Any]) -> None:
        self.events = events
        self.sentinels = list(sentinels)
        self.pid = events.pid
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name=f"sentinel-events-{events.service}")

    def start(self) -> EventThread:
        self.thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        self.stopping.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout)

    def alive(self) -> bool:
        return self.pid == os.getpid() and self.thread.is_alive() \
            and not self.stopping.is_set()

    def _run(self) -> None:
        subs: dict[int, Any] = {}
        retry_at = [0.0] * len(self.sentinels)
        waits = [RETRY_SECONDS] * len(self.sentinels)
        pinged = [0.0] * len(self.sentinels)
        selector = selectors.DefaultSelector()

        def drop(i: int, exc: BaseException) -> None:
            log.debug("Sentinel %d subscription lost: %s", i, exc)
            self.events.lost(i)
            pubsub = subs.pop(i, None)
            if pubsub is not None:
                with contextlib.suppress(Exception):
                    selector.unregister(pubsub.connection._sock)
                with contextlib.suppress(Exception):
                    pubsub.close()
            retry_at[i] = time.monotonic() + waits[i]
            waits[i] = min(waits[i] * 2, RETRY_MAX_SECONDS)

        try:
            while not self.stopping.is_set():
                now = time.monotonic()
                for i, sentinel in enumerate(self.sentinels):
                    if i in subs or now < retry_at[i]:
                        continue
                    try:
                        subs[i] = _subscribe(sentinel)
                        selector.register(subs[i].connection._sock, selectors.EVENT_READ, i)
                        pinged[i], waits[i] = time.monotonic(), RETRY_SECONDS
                    except _LOST as exc:
                        drop(i, exc)
                using = self.events.in_use()
                for i, pubsub in list(subs.items()):
                    try:
                        if using and now - pinged[i] >= self.events.ping_every():
                            pubsub.ping()
                            pinged[i] = now
                        while (message := pubsub.get_message(timeout=0.0)) is not None:
                            self.events.heard(i, message)
                    except _LOST as exc:
                        drop(i, exc)
                if subs:
                    selector.select(min(0.1, self.events.ping_every()))
                else:
                    self.stopping.wait(0.1)
        finally:
            for i in list(subs):
                drop(i, RuntimeError("stopped"))
            selector.close()


class EventTask:
    """The asyncio pool's listener: a task on the running loop, one subscription per
    Sentinel (a coroutine each). Started by the pool's first call, cancelled by its
    close."""

    def __init__(self, events: SentinelEvents, sentinels: Sequence[Any]) -> None:
        self.events = events
        self.sentinels = list(sentinels)
        self.pid = events.pid
        self.task: asyncio.Task[Any] | None = None
        self.stopping = False  # read by each subscription's loop, whatever a library swallowed

    def start(self) -> EventTask:
        self.task = asyncio.get_running_loop().create_task(
            self._run(), name=f"sentinel-events-{self.events.service}")
        return self

    def alive(self) -> bool:
        """Running, in this process, on the running loop (if any: a pool may outlive the
        loop it was first used on)."""
        if self.task is None or self.task.done() or self.pid != os.getpid():
            return False
        try:
            return self.task.get_loop() is asyncio.get_running_loop()
        except RuntimeError:
            return True

    async def stop(self) -> None:
        """Cancel the listener and wait for it, at most :data:`STOP_SECONDS`: redis-py can
        swallow a cancellation (Python 3.11's ``wait_for``, :mod:`shared.store.cancelled`),
        and a close that waited on it for good hung the client's ``aclose()``. The loops
        also end at their next turn by ``stopping``."""
        self.stopping = True
        task, self.task = self.task, None
        if task is None or task.done():
            return
        task.cancel()
        if task.get_loop() is asyncio.get_running_loop():
            done, _ = await asyncio.wait({task}, timeout=STOP_SECONDS)
            if not done:
                log.warning("Sentinel events listener of %s did not stop within %g s",
                            self.events.service, STOP_SECONDS)
            elif not task.cancelled() and task.exception() is not None:
                log.debug("Sentinel events listener ended with %r", task.exception())

    async def _run(self) -> None:
        await asyncio.gather(*(self._one(i, s) for i, s in enumerate(self.sentinels)))

    def _go_on(self) -> None:
        """Raise a cancellation the last awaited call swallowed, or a stop."""
        task = asyncio.current_task()
        if self.stopping or (task is not None and task.cancelling()):
            raise asyncio.CancelledError("the Sentinel events listener is stopping")

    async def _one(self, index: int, sentinel: Any) -> None:
        wait = RETRY_SECONDS
        while not self.stopping:
            pubsub = sentinel.pubsub()
            try:
                await pubsub.subscribe(*CHANNELS)
                await pubsub.ping()
                pinged = time.monotonic()
                while True:
                    self._go_on()
                    message = await pubsub.get_message(timeout=self.events.ping_every())
                    if message is not None:
                        self.events.heard(index, message)
                        wait = RETRY_SECONDS
                    now = time.monotonic()
                    if self.events.in_use() and now - pinged >= self.events.ping_every():
                        await pubsub.ping()
                        pinged = now
            except _LOST as exc:
                log.debug("Sentinel %d subscription lost: %s", index, exc)
            except Exception:  # a task that died would leave the others running alone
                log.warning("Sentinel %d subscription failed", index, exc_info=True)
            finally:
                self.events.lost(index)
                await _close_quietly(pubsub)
            self._go_on()
            await asyncio.sleep(wait)
            wait = min(wait * 2, RETRY_MAX_SECONDS)


async def _close_quietly(pubsub: Any) -> None:
    """Close a subscription, also from a task being cancelled (shielded) or on a loop
    being closed, where the close cannot be scheduled: then it is dropped unstarted
    (else Python warns that it was never awaited)."""
    closing = pubsub.aclose()
    try:
        await asyncio.shield(closing)
    except BaseException as exc:
        if inspect.getcoroutinestate(closing) == inspect.CORO_CREATED:
            closing.close()
        if not isinstance(exc, Exception):
            raise


__all__ = ["CHANNELS", "EVENTS_SECONDS", "Event", "EventTask", "EventThread",
           "SentinelEvents", "parse_event"]
