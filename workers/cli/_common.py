"""Helpers shared by the ``compaction`` sub-commands.

Building the store and the guard from settings (with clean errors instead
of tracebacks), a read-only store for "what would be sent", and the rich
context meter used by ``stats`` and ``demo``.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import redis
from rich.console import Console, Group, RenderableType
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from shared.core.budget import BudgetReport
from shared.core.errors import ConfigError, SessionNotFound, StoreError, StoreUnavailable
from shared.core.limits import model_limits
from shared.core.records import (
    CheapDecision,
    CommitResult,
    SessionState,
    SummaryRecord,
    ViewData,
)
from shared.core.tokens_exact import build_counter
from shared.guard import ContextGuard
from shared.store.sessions import SessionStore, redis_errors
from workers.cli._format import human, pct
from workers.settings import Settings
from workers.store_client import store_client
from workers.urls import redact_url

GREEN, AMBER, RED = "green", "dark_orange", "red"
UNREACHABLE = "cannot reach Redis at"
LEGEND_WIDTH = 72  # a meter inside a panel on an 80-column terminal
METER_CELLS = 40  # the bars' width where there is room
REGION_STYLES = {"system": "blue", "summary": "magenta", "tools": "cyan", "history": "white"}


# -- arguments -----------------------------------------------------------------------
def add_session(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("session", metavar="SESSION", help="session id")
    parser.add_argument("--tenant", help="tenant of the session (default: COMPACTION_TENANT)")


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")


def whole_number(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type for a whole number in ``[low, high]``: its errors say what is
    expected (argparse names a plain function in its own: "invalid _positive value")."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < low or (high is not None and value > high):
            wanted = f"between {low} and {high}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"must be {wanted} (got {value})")
        return value

    return parse


@contextlib.contextmanager
def working(what: str) -> Iterator[None]:
    """A spinner with the elapsed time on stderr while something slow runs (transient; on
    a terminal only: elsewhere rich leaves an empty line on stderr, before the error or
    the outcome, in a log that collects it)."""
    console = Console(stderr=True)
    if not console.is_terminal:
        yield
        return
    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                        console=console, transient=True)
    with progress:
        progress.add_task(what, total=None)
        yield


# -- store -----------------------------------------------------------------------------
def connection_trouble(url: str, cause: BaseException) -> str:
    """Why a connection to Redis at ``url`` failed, in words an operator can act on: a
    refused login is no unreachable server, and a TLS mismatch says which scheme to try
    (redis-py only says "connection reset" or "timeout" for either)."""
    where = redact_url(url)
    if isinstance(cause, redis.exceptions.AuthenticationError):
        named = urlsplit(url.split(",", 1)[0]).password is not None
        return (f"Redis at {where} refused the login: {cause} "
                + ("(the user and password in the URL)" if named else
                   "(the URL names no password: redis://:PASSWORD@host or USER:PASSWORD@)"))
    text = str(cause)
    lowered = text.lower()
    tls = url.lower().startswith(("rediss://", "rediss+sentinel://"))
    if tls and "certificate verify failed" in lowered:
        return (f"{UNREACHABLE} {where}: {text} (the CA that signed the server's certificate: "
                "?ssl_ca_certs=/path/ca.crt in the URL)")
    if not tls and any(sign in lowered for sign in PLAIN_TO_TLS):
        return (f"{UNREACHABLE} {where}: {text} (a Redis that expects TLS closes a plain "
                "connection: rediss:// in the URL?)")
    if tls and any(sign in lowered for sign in TLS_TO_PLAIN):
        return (f"{UNREACHABLE} {where}: {text} (a Redis without TLS never answers the TLS "
                "handshake: redis:// in the URL?)")
    return f"{UNREACHABLE} {where}: {text}"


PLAIN_TO_TLS = ("connection reset by peer", "connection closed by server")
TLS_TO_PLAIN = ("timeout connecting", "wrong version number", "record layer failure",
                "unexpected eof")


@contextlib.contextmanager
def store_errors(url: str) -> Iterator[None]:
    """Redis trouble as one clean line naming the (redacted) URL."""
    try:
        yield
    except StoreUnavailable as exc:
        if str(exc).startswith((UNREACHABLE, "Redis at ")):
            raise
        cause = exc.__cause__ or exc
        raise StoreUnavailable(connection_trouble(url, cause)) from None
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        # a command the store does not wrap (SCAN, a pipeline): lost, not answered
        raise StoreUnavailable(connection_trouble(url, exc)) from None
    except redis.exceptions.RedisError as exc:
        raise StoreError(f"Redis at {redact_url(url)} answered with an error: {exc}") from None


def open_store(settings: Settings, tenant: str | None = None, *,
               check: bool = True) -> SessionStore:
    """The configured store (``COMPACTION_REDIS_URL``), checked with one PING unless
    ``check`` is false (a server that starts before Redis and serves once it is up)."""
    with store_errors(settings.redis_url):
        try:
            client = store_client(settings)
        except ValueError as exc:
            raise ConfigError(f"COMPACTION_REDIS_URL: {exc}") from None
        if check:
            with redis_errors("ping"):
                client.ping()
    return SessionStore(client, settings.store_config(), tenant=tenant or settings.tenant,
                        counter=build_counter(settings.token_counter,
                                              encoding=settings.tiktoken_encoding,
                                              encoding_dir=settings.tiktoken_dir))


def load_session(store: SessionStore, session_id: str) -> ViewData:
    """One atomic read of the session; SessionNotFound when it has no log."""
    data = store.load_view(session_id)
    if data.length == 0 and data.summary is None:
        raise SessionNotFound(
            f"no session {session_id!r} in tenant {store.tenant!r} "
            f"(key prefix {store.config.key_prefix!r})")
    return data


def session_state(store: SessionStore, session_id: str) -> tuple[SessionState, int]:
    """The session's state and log length, SessionNotFound as :func:`load_session`, without
    reading the log: for commands that need neither messages nor the view (``history``,
    ``rewind``, ``compact``), so a session of 100k messages costs them two small reads."""
    length = store.length(session_id)
    state = store.state(session_id)
    if length == 0 and state.watermark == 0:
        raise SessionNotFound(
            f"no session {session_id!r} in tenant {store.tenant!r} "
            f"(key prefix {store.config.key_prefix!r})")
    return state, length


def guard_for(store: SessionStore, settings: Settings, data: ViewData,
              model: str | None = None) -> ContextGuard:
    """A guard that uses the window the agent last used for this session's model.

    The agent's guard records ``model`` and ``window`` at every call; an
    operator's guard knows no overrides, so it takes them from there.
    """
    state = data.state
    overrides: dict[str, int] = {}
    if state.model and state.window and (model is None or model == state.model):
        window = state.stored_learned()
        learned = {state.model: window} if window else None
        own = model_limits(state.model, learned=learned)
        if own.context_window != state.window:  # the agent's guard had an override
            overrides[state.model] = state.window
    return ContextGuard(store, policy=settings.policy(), overrides=overrides)


WINDOW_SOURCES = {
    "registry": "model registry",
    "provider_default": "provider family default",
    "override": "override given to the agent's guard",
    "learned": "learned from an overflow error",
    "fallback": "default fallback: unknown model",
}


def window_source(source: str) -> str:
    """Where a window came from, in words (``ModelLimits.source``)."""
    return WINDOW_SOURCES.get(source, source)


class DryRunStore(SessionStore):
    """Reads like the store, drops every write: ``prepare`` without side effects.

    The guard records figures, cheap-stage decisions and truncations when it
    prepares a view; an operator looking at "what would be sent" must not
    change what the agent's next call sends.
    """

    def update_state(self, session_id: str, **fields: Any) -> None:
        return None

    def clear_state_flags(self, session_id: str, *names: str) -> None:
        return None

    def record_cheap(self, session_id: str, decisions: Iterable[CheapDecision],
                     expected_version: int | None = None) -> int:
        return 0

    def commit_summary(self, session_id: str, record: SummaryRecord,
                       expected_version: int) -> CommitResult:
        return CommitResult(ok=True, version=expected_version + 1, watermark=record.watermark)

    def mark_pending(self, session_id: str) -> bool:
        return False

    def clear_pending(self, session_id: str) -> None:
        return None


# -- numbers ---------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in [0, 100]); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


# -- the context meter -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Meter:
    """Figures of one request against the window (tokens)."""

    window: int
    reserve: int
    regions: dict[str, int]
    usage_ratio: float
    """Input tokens over the input budget (window - reserve)."""
    trigger_ratio: float

    @classmethod
    def from_report(cls, report: BudgetReport) -> Meter:
        return cls(window=report.window, reserve=report.reserve,
                   regions={"system": report.system, "summary": report.summary,
                            "tools": report.tools, "history": report.history},
                   usage_ratio=report.usage_ratio, trigger_ratio=report.trigger_ratio)

    @property
    def colour(self) -> str:
        """Green below 3/4 of the trigger, amber up to the trigger, red above."""
        if self.usage_ratio < self.trigger_ratio * 0.75:
            return GREEN
        return AMBER if self.usage_ratio < self.trigger_ratio else RED


def render_meter(meter: Meter, columns: int = LEGEND_WIDTH + 4) -> RenderableType:
    """A usage bar coloured by the trigger, and the window split by region.

    ``columns``: the width it may use (a panel's inside, a terminal's width); the bars
    (at most 40 cells) and the legend shrink to it, so a narrow terminal never wraps a bar.
    """
    width = max(10, min(METER_CELLS, columns - 13))  # "context " + bar + " 100%"
    legend_width = max(20, min(LEGEND_WIDTH, columns))
    budget = max(1, meter.window - meter.reserve)
    used = sum(meter.regions.values())
    filled = min(width, round(width * min(meter.usage_ratio, 1.0)))
    trigger_at = min(width - 1, round(width * meter.trigger_ratio))
    bar = Text()
    for i in range(width):
        if i < filled:
            bar.append("█", style=meter.colour)
        elif i == trigger_at:
            bar.append("│", style="bold")
        else:
            bar.append("░", style="grey50")
    usage = Text.assemble(("context ", "bold"), bar,
                          (f" {pct(meter.usage_ratio):>4}", f"bold {meter.colour}"))
    detail = Text(style="grey70")
    line_start = 0
    for part in (f"{human(used)} of {human(budget)} input tokens",
                 f"trigger {pct(meter.trigger_ratio)}", f"window {human(meter.window)}"):
        if line_start == len(detail.plain):
            detail.append(f"        {part}")
        elif len(detail.plain) - line_start + 3 + len(part) > columns:  # wrapped by part
            line_start = len(detail.plain) + 1
            detail.append(f"\n        {part}")
        else:
            detail.append(f" · {part}")
    split = Text("window  ", style="bold")
    cells = 0
    scale = width / max(1, meter.window)
    for name, tokens in [*meter.regions.items(), ("reserve", meter.reserve)]:
        n = min(width - cells, round(tokens * scale))
        split.append(("▒" if name == "reserve" else "█") * n,
                     style=REGION_STYLES.get(name, "grey50"))
        cells += n
    split.append("·" * (width - cells), style="grey35")
    items = [("■ ", REGION_STYLES.get(name, "white"), f"{name} {human(tokens)}")
             for name, tokens in meter.regions.items()]
    items.append(("▒ ", "grey50", f"reserve {human(meter.reserve)}"))
    lines: list[Text] = []
    line = Text("        ")
    for mark, style, label in items:  # wrapped by item, never inside one: fits 76 columns
        if len(line.plain) > 8 and len(line.plain) + 2 + len(mark) + len(label) > legend_width:
            lines.append(line)
            line = Text("        ")
        if len(line.plain) > 8:
            line.append("  ")
        line.append(mark, style=style)
        line.append(label)
    lines.append(line)
    return Group(usage, detail, split, *lines)


__all__ = [
    "DryRunStore",
    "Meter",
    "add_json",
    "add_session",
    "connection_trouble",
    "guard_for",
    "human",
    "load_session",
    "open_store",
    "percentile",
    "render_meter",
    "session_state",
    "store_errors",
    "whole_number",
    "window_source",
    "working",
]
