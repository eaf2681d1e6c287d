"""``compaction show SESSION``: the view the guard would send now.

A dry run of ``ContextGuard.prepare`` on a store that drops writes: the
same summary, cheap-stage placeholders and (if over budget) truncation the
agent's next call would get, without recording anything. The system prompt
and tool definitions are not stored with the session; pass them to see the
exact request (``--system-prompt``, ``--tools``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.rule import Rule

from shared.core.errors import InvalidInput
from shared.core.messages import Message
from shared.guard import PreparedView
from workers.cli._common import (
    DryRunStore,
    add_json,
    add_session,
    guard_for,
    load_session,
    open_store,
    store_errors,
    whole_number,
    window_source,
)
from workers.cli._format import human, pct
from workers.settings import Settings

ROLE_STYLES = {"system": "blue", "user": "green", "assistant": "magenta", "tool": "cyan"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_session(parser)
    parser.add_argument("--system-prompt", default="", metavar="TEXT",
                        help="the agent's system prompt (not stored with the session)")
    parser.add_argument("--tools", type=Path, metavar="FILE",
                        help="JSON file with the agent's tool definitions (OpenAI format)")
    parser.add_argument("--model", help="model of the call (default: the agent's last)")
    parser.add_argument("--max-tokens", type=int, metavar="N",
                        help="output reserve (default: the agent's last)")
    parser.add_argument("--chars", type=whole_number(0), default=600, metavar="N",
                        help="show at most N characters per message (0: everything)")
    add_json(parser)


def _tools(path: Path | None) -> list[dict[str, Any]] | None:
    if path is None:
        return None
    try:
        tools = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidInput(f"cannot read tool definitions: {exc}", field="--tools") from None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise InvalidInput("expected a JSON list of tool definitions", field="--tools")
    return tools


def prepare_view(args: argparse.Namespace, settings: Settings) -> PreparedView:
    """The view of the next call, computed without writing anything."""
    if args.max_tokens is not None and args.max_tokens < 1:
        raise InvalidInput("must be >= 1", field="--max-tokens")
    tools = _tools(args.tools)
    with store_errors(settings.redis_url):
        store = open_store(settings, args.tenant)
        data = load_session(store, args.session)
        dry = DryRunStore(store.redis, store.config, tenant=store.tenant, counter=store.counter)
        state = data.state
        model = args.model or state.model or "gpt-4o"
        max_tokens = args.max_tokens or state.max_tokens or None
        guard = guard_for(dry, settings, data, model)
        return guard.prepare(args.session, args.system_prompt, tools, max_tokens, model)


def run(args: argparse.Namespace, settings: Settings) -> int:
    view = prepare_view(args, settings)
    report = view.report
    if args.json:
        body: dict[str, Any] = {"model": report.model, "max_tokens": report.budget.reserve,
                                "messages": view.openai()}
        tools = _tools(args.tools)
        if tools:
            body["tools"] = tools
        print(json.dumps(body, indent=2, ensure_ascii=False))
        return 0
    console = Console()
    budget = report.budget
    estimated = human(report.estimated_prompt_tokens)
    console.print(
        f"[bold]{escape(args.session)}[/]: {len(view.messages)} messages, ~{estimated} "
        "prompt tokens"
        f" of {human(budget.input_budget)} ({pct(budget.usage_ratio)}), model "
        f"{escape(report.model)} (window {human(budget.window)}: "
        f"{window_source(report.limits_source)}), watermark "
        f"{report.watermark}, {report.cheap_applied} cheap-stage placeholders")
    state_note = _missing_regions(args, view)
    if state_note:
        console.print(f"[grey70]{state_note}[/]")
    if args.max_tokens is not None and budget.reserve < args.max_tokens:
        console.print(f"[yellow]--max-tokens {args.max_tokens} leaves no input budget in a "
                      f"window of {budget.window}: the reserve is capped to {budget.reserve} "
                      "(the call must send that as max_tokens)[/]")
    if report.truncated:
        said = report.note.strip() or (f"{report.dropped_messages} messages dropped"
                                       if report.dropped_messages else "")
        note = f" ({escape(said)})" if said else ""
        console.print(f"[yellow]over budget: the next call truncates{note}[/]")
    for i, message in enumerate(view.messages):
        console.print(Rule(_title(i, message), align="left", style="grey50"))
        console.print(escape(_body(message, args.chars)), highlight=False)
    return 0


def _missing_regions(args: argparse.Namespace, view: PreparedView) -> str:
    """Say which regions of the agent's request this view leaves out."""
    missing = []
    if not args.system_prompt:
        missing.append("--system-prompt")
    if args.tools is None:
        missing.append("--tools")
    if not missing:
        return ""
    return (f"not stored with the session, so not in this view: {' and '.join(missing)} "
            "(the agent's own are counted in `compaction stats`)")


def _title(index: int, message: Message) -> str:
    style = ROLE_STYLES.get(message.role, "white")
    extra = f" ← {message.tool_call_id}" if message.tool_call_id else ""
    if message.metadata.get("compaction") == "summary":
        extra += " (summary)"
    return f"[{style}]#{index} {message.role}[/]{escape(extra)}"


def _clip(text: str, limit: int) -> str:
    if limit <= 0 or len(text) <= limit:
        return text
    return f"{text[:limit]}… [{len(text) - limit} more characters]"


def _body(message: Message, limit: int) -> str:
    lines = [_clip(message.text(), limit)] if message.text() else []
    if message.media_count():
        lines.append(f"[{message.media_count()} image/file part(s)]")
    for call in message.tool_calls:
        lines.append(f"→ {call.name}({_clip(call.arguments, max(limit // 2, 80) if limit else 0)})"
                     f"  [{call.id}]")
    return "\n".join(lines) or "(empty)"


__all__ = ["add_arguments", "prepare_view", "run"]
