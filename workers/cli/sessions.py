"""``compaction sessions``: the sessions in Redis, one page at a time.

Walks the state keys with ``SCAN`` (never ``KEYS``: a store with millions
of keys must not be blocked), then reads each session's figures in one
pipeline per page: messages in the log, tokens in the log (the running
total), watermark, model, and the last activity (Redis's idle time of the
log key: any read or write of the session; unknown under an LFU eviction
policy). A page ends on a ``SCAN`` cursor boundary, so it may hold a few
more sessions than ``--limit``; the next page starts at ``--cursor``. On a
Redis Cluster the primaries are scanned one after another.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from typing import Any

import redis
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from shared.core.errors import InvalidInput
from shared.store.keys import SessionKeys, validate_session_id, validate_tenant
from shared.store.sessions import SessionStore
from workers.cli._common import open_store, store_errors, whole_number
from workers.cli._format import clip, human
from workers.settings import Settings

SCAN_KEYS_PER_ROW = 2  # SCAN COUNT per requested row: a session has ~6 keys, one of them
# its state key, so a page takes a few SCAN calls and overshoots --limit by about a third.
SCAN_COUNT_MAX = 5_000


@dataclass(frozen=True, slots=True)
class SessionRow:
    tenant: str
    session_id: str
    messages: int
    tokens: int
    watermark: int
    model: str
    idle_seconds: int | None
    """Seconds since the log was last read or written; None when Redis cannot say."""


@dataclass(frozen=True, slots=True)
class Page:
    sessions: list[SessionRow]
    cursor: int
    """Where the next page starts; 0: this was the last page."""


DEFAULT_LIMIT = 50
"""Sessions per page when ``--limit`` is not given."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tenant", help="only this tenant's sessions (default: every tenant)")
    parser.add_argument("--prefix", default="", metavar="TEXT",
                        help="only sessions whose id starts with TEXT")
    parser.add_argument("--limit", type=whole_number(1, 10_000), default=DEFAULT_LIMIT,
                        metavar="N", help=f"sessions per page (default {DEFAULT_LIMIT}; a page "
                        "may hold a few more)")
    parser.add_argument("--cursor", type=whole_number(0), default=0, metavar="C",
                        help="where the page starts (printed at the end of the previous page)")
    parser.add_argument("--json", action="store_true",
                        help='print {"sessions": [...], "cursor": C} instead of a table')


def scan_pattern(key_prefix: str, tenant: str | None, prefix: str) -> str:
    """SCAN pattern of the state keys; tenant and prefix are validated (no glob characters)."""
    if tenant is not None:
        validate_tenant(tenant)
    if prefix:
        try:
            validate_session_id(prefix)
        except InvalidInput as exc:
            raise InvalidInput(str(exc).split(": ", 1)[-1], field="--prefix") from None
    return f"{key_prefix}:{{{tenant if tenant is not None else '*'}:{prefix}*}}:state"


def _parse_state_key(key: str, key_prefix: str) -> tuple[str, str] | None:
    """(tenant, session id) of ``<prefix>:{tenant:session}:state``."""
    head = f"{key_prefix}:{{"
    if not key.startswith(head) or not key.endswith("}:state"):
        return None
    tenant, sep, session = key[len(head):-len("}:state")].partition(":")
    return (tenant, session) if sep and tenant and session else None


def list_page(store: SessionStore, *, tenant: str | None = None, prefix: str = "",
              limit: int = 50, cursor: int = 0) -> Page:
    """One page of sessions: SCAN from ``cursor`` until at least ``limit`` are found."""
    key_prefix = store.config.key_prefix
    pattern = scan_pattern(key_prefix, tenant, prefix)
    client = store.redis
    rows: list[SessionRow] = []
    count = max(20, min(SCAN_COUNT_MAX, limit * SCAN_KEYS_PER_ROW))
    while True:
        cursor, keys = scan_step(client, cursor, pattern, count)
        found = []
        for raw in keys:
            key = raw.decode() if isinstance(raw, bytes) else str(raw)
            parsed = _parse_state_key(key, key_prefix)
            # the pattern's tenant ``*`` also matches a session id's start up to a ``:``
            # (tenant a's ``x:b1`` matches ``{*:b*}``): the parsed names decide
            if parsed is not None and parsed[1].startswith(prefix) \
                    and tenant in (None, parsed[0]):
                found.append(parsed)
        # counted once read: a state without a log is no session, and must not end a page
        rows.extend(_figures(client, key_prefix, found))
        if cursor == 0 or len(rows) >= limit:
            break
    rows.sort(key=lambda r: (r.tenant, r.session_id))
    return Page(rows, int(cursor))


def scan_step(client: Any, cursor: int, pattern: str, count: int) -> tuple[int, list[Any]]:
    """One ``SCAN`` call. On a Redis Cluster the primaries are walked in turn (ordered by
    name), and the cursor carries which: node cursor x primaries + node index, so a page
    goes on where the last one stopped while the cluster keeps its primaries."""
    get_primaries = getattr(client, "get_primaries", None)
    if get_primaries is None:
        next_cursor, keys = client.scan(cursor=cursor, match=pattern, count=count)
        return int(next_cursor), list(keys)
    nodes = sorted(get_primaries(), key=lambda node: node.name)
    at, node_cursor = cursor % len(nodes), cursor // len(nodes)
    next_cursor, keys = client.scan(cursor=node_cursor, match=pattern, count=count,
                                    target_nodes=nodes[at])
    if isinstance(next_cursor, dict):  # redis-py gives the cursor by node name
        (next_cursor,) = next_cursor.values()
    if int(next_cursor):
        return int(next_cursor) * len(nodes) + at, list(keys)
    return (at + 1 if at + 1 < len(nodes) else 0), list(keys)  # this node is done


def _figures(client: Any, key_prefix: str, found: list[tuple[str, str]]) -> list[SessionRow]:
    if not found:
        return []
    pipe = client.pipeline(transaction=False)
    for tenant, session in found:
        keys = SessionKeys.for_session(key_prefix, tenant, session)
        # the log's idle time is the session's last activity: nothing here reads the log
        # itself (a read would reset it), its length is that of the totals beside it
        pipe.object("idletime", keys.log)
        pipe.llen(keys.cum)
        pipe.lindex(keys.cum, -1)
        pipe.hmget(keys.state, ["watermark", "model"])
    replies = pipe.execute(raise_on_error=False)
    rows = []
    for i, (tenant, session) in enumerate(found):
        idle, length, total, (watermark, model) = replies[4 * i: 4 * i + 4]
        if not _int(length) and not _int(watermark):
            # a state without a log (a guard's prepare of a session never recorded wrote
            # its request figures): no session to `stats` either
            continue
        rows.append(SessionRow(
            tenant=tenant, session_id=session, messages=_int(length), tokens=_int(total),
            watermark=_int(watermark), model=_text(model),
            idle_seconds=None if isinstance(idle, Exception) or idle is None else _int(idle)))
    return rows


def _int(value: Any) -> int:
    if isinstance(value, Exception) or value is None:
        return 0
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None or isinstance(value, Exception) else str(value)


def ago(seconds: int | None) -> str:
    """'42 s ago', '3 min ago', '5 h ago', '2 d ago'; '?' when unknown."""
    if seconds is None:
        return "?"
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit} ago"
    return f"{seconds} s ago"


NARROW_DROPS = ("last activity", "watermark")
"""Figures left out, in this order, where the terminal is too narrow for them all (the
session id then gets at least 8 columns; ``--json`` has every figure)."""


def render(page: Page, width: int = 80) -> Table:
    """The page as a table of at most ``width`` columns: the session id gives way
    (ellipsis), a figure is never cut; too narrow for them all, the least needed figures
    are left out (named in the title)."""
    figures = {
        "messages": [str(r.messages) for r in page.sessions],
        "tokens": [human(r.tokens) for r in page.sessions],
        "watermark": [str(r.watermark) for r in page.sessions],
        "last activity": [ago(r.idle_seconds) for r in page.sessions],
    }
    sizes = {name: max(len(name), *(len(v) for v in values)) for name, values in figures.items()}
    tenant_width = min(12, max([6, *(len(r.tenant) for r in page.sessions)]))

    def fixed(names: list[str]) -> int:  # every column but the session id, with the gaps
        return tenant_width + sum(sizes[n] for n in names) + 2 * (len(names) + 1)

    shown = list(figures)
    for name in NARROW_DROPS:
        if fixed(shown) + 8 > width:
            shown.remove(name)
    left_out = [name for name in figures if name not in shown]
    title = f"{len(page.sessions)} session(s)" + (f", no {' or '.join(left_out)} (narrow)"
                                                   if left_out else "")
    session_width = max(8, min(max([7, *(len(r.session_id) for r in page.sessions)]),
                               width - fixed(shown)))
    table = Table(box=None, pad_edge=False, title_justify="left", title=title)
    table.add_column("tenant", overflow="ellipsis", no_wrap=True, max_width=tenant_width)
    table.add_column("session", overflow="ellipsis", no_wrap=True, max_width=session_width)
    for name in shown:
        table.add_column(name, justify="left" if name == "last activity" else "right",
                         no_wrap=True, min_width=sizes[name])
    for i, row in enumerate(page.sessions):
        table.add_row(clip(row.tenant, tenant_width), escape(clip(row.session_id, session_width)),
                      *(figures[name][i] for name in shown))
    return table


def run(args: argparse.Namespace, settings: Settings) -> int:
    started = time.perf_counter()
    with store_errors(settings.redis_url):
        store = open_store(settings)
        try:
            page = list_page(store, tenant=args.tenant, prefix=args.prefix, limit=args.limit,
                             cursor=args.cursor)
        except redis.exceptions.ResponseError as exc:
            raise InvalidInput(f"Redis refused the cursor: {exc}", field="--cursor") from None
    if args.json:
        print(json.dumps({"sessions": [asdict(r) for r in page.sessions],
                          "cursor": page.cursor}, indent=2))
        return 0
    console = Console()
    if page.sessions:
        console.print(render(page, console.width))
    else:
        console.print("no sessions found" + (f" in tenant {args.tenant!r}" if args.tenant else "")
                      + (f" starting with {args.prefix!r}" if args.prefix else ""))
    if page.cursor:
        more = [f"--cursor {page.cursor}"]
        if args.tenant:
            more.append(f"--tenant {args.tenant}")
        if args.prefix:
            more.append(f"--prefix {args.prefix}")
        if args.limit != DEFAULT_LIMIT:  # the next page as long as this one
            more.append(f"--limit {args.limit}")
        console.print(f"[grey70]next page: compaction sessions {' '.join(more)}[/]")
    elif args.cursor or page.sessions:
        console.print(f"[grey70]last page ({time.perf_counter() - started:.2f} s)[/]")
    return 0


__all__ = ["Page", "SessionRow", "add_arguments", "ago", "list_page", "render", "run",
           "scan_pattern"]
