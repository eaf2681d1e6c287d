"""One exception tree for the whole project.

Callers catch the branch they can act on; everything raised on purpose by
this project derives from :class:`CompactionError`::

    CompactionError
    ├── InvalidInput            (also a ValueError) bad caller input; names field and index
    │   └── LimitExceeded       a configured size/count limit was hit
    ├── IrreducibleOverflow     system + tools + reserve + newest message alone exceed the window
    ├── StoreError              the session store failed
    │   ├── StoreUnavailable    Redis down, refused or slower than its timeout
    │   ├── SessionNotFound     no such session
    │   └── SessionDamaged      part of a session's keys is gone (evicted, deleted by hand)
    ├── SummarizerError         a summarizer call failed or answered unusably
    │   ├── SummarizerUnavailable   transport error, timeout, 429/5xx: retry later
    │   └── BadSummary          empty, refusal, error text, longer than its input
    └── ConfigError             a setting is invalid (names the variable)

A compare-and-swap that loses is *not* an exception: the store returns a
typed conflict result, because losing a race is an expected outcome.
"""

from __future__ import annotations


class CompactionError(Exception):
    """Root of every error this project raises on purpose."""


class InvalidInput(CompactionError, ValueError):
    """Bad input. ``field`` is a dotted path such as ``messages[3].tool_call_id``."""

    def __init__(self, message: str, *, field: str | None = None, index: int | None = None) -> None:
        self.field = field
        self.index = index
        where = field if field is not None else (f"messages[{index}]" if index is not None else "")
        super().__init__(f"{where}: {message}" if where else message)


class LimitExceeded(InvalidInput):
    """A configured limit (bytes per message, messages per call or session) was exceeded."""


class IrreducibleOverflow(CompactionError):
    """The fixed part of the request alone does not fit: no compaction can help.

    ``fixed_tokens`` counts system prompt, tool definitions, output reserve and
    the newest user message; ``window`` is the model's context window.
    """

    def __init__(self, message: str, *, fixed_tokens: int, window: int) -> None:
        self.fixed_tokens = fixed_tokens
        self.window = window
        super().__init__(message)


class StoreError(CompactionError):
    """The session store failed."""


class StoreUnavailable(StoreError):
    """Redis could not be reached or did not answer within its timeout."""


class SlotMoved(StoreUnavailable):
    """A Redis Cluster answered a transaction with a redirection (``MOVED``, ``ASK``,
    ``TRYAGAIN``): its slot was moving to another master while it was sent. Nothing of
    it ran; a single script over the same keys waits the move out where a transaction
    cannot (its keys may be on two nodes until the slot is assigned)."""


class SessionNotFound(StoreError):
    """The session has no log."""


class SessionDamaged(StoreError):
    """Some of a session's keys are gone and the rest no longer agree: its log is shorter
    than its watermark, or its running token totals and its log differ in length.

    A healthy session never gets there (one script writes the log and its totals
    together), but Redis evicting keys one at a time under memory pressure (any
    ``maxmemory-policy`` but ``noeviction``), or a hand-made ``DEL``, leaves it so. The
    guard starts such a session afresh, as it would an expired one; other readers raise
    this. ``key`` names the session's log key."""

    def __init__(self, key: str, *, log_length: int, totals_length: int,
                 watermark: int) -> None:
        self.key = key
        self.log_length = log_length
        self.totals_length = totals_length
        self.watermark = watermark
        super().__init__(
            f"session damaged ({key}): its log holds {log_length} messages, its running "
            f"token totals {totals_length}, its watermark is {watermark}. Part of it was "
            "evicted or deleted: the store's Redis needs maxmemory-policy noeviction")


class SummarizerError(CompactionError):
    """A summarizer call failed or produced something that must not be stored."""


class SummarizerUnavailable(SummarizerError):
    """Transport error, timeout, rate limit or server error: worth retrying later."""


class BadSummary(SummarizerError):
    """The reply is empty, a refusal, an error text, or longer than its input."""


class ConfigError(CompactionError, ValueError):
    """A setting is invalid; the message names the environment variable."""


__all__ = [
    "BadSummary",
    "CompactionError",
    "ConfigError",
    "InvalidInput",
    "IrreducibleOverflow",
    "LimitExceeded",
    "SessionNotFound",
    "SlotMoved",
    "StoreError",
    "StoreUnavailable",
    "SummarizerError",
    "SummarizerUnavailable",
]
