"""Cancellations that a library swallowed, raised again (asyncio, Python 3.11).

Python 3.11's ``asyncio.wait_for`` (redis-py sends every command through it) returns
the inner result when the cancellation lands as the send completes (CPython gh-86296,
fixed in 3.12): the request is lost. The call goes on and returns, an
``asyncio.timeout`` block overruns, a framework's cancelled run keeps going. The
task's ``cancelling()`` count still shows the request: the async store and the async
guard take a mark before each awaited step and raise what was requested since after
it.
"""

from __future__ import annotations

import asyncio
from typing import Any

CancelMark = tuple["asyncio.Task[Any] | None", int]


def swallowed() -> asyncio.CancelledError:
    """The cancellation a step's library swallowed (see the module's docstring)."""
    return asyncio.CancelledError("cancelled during a step that did not raise it")


def cancel_mark() -> CancelMark:
    """The running task and its pending cancellation requests, before awaiting a library."""
    task = asyncio.current_task()
    return task, task.cancelling() if task is not None else 0


def raise_swallowed(mark: CancelMark) -> None:
    """Raise the cancellation requested since ``mark`` that an awaited library swallowed
    (:func:`swallowed`)."""
    task, before = mark
    if task is not None and task.cancelling() > before:
        raise swallowed()


__all__ = ["CancelMark", "cancel_mark", "raise_swallowed", "swallowed"]
