"""``compaction demo``: a long agent session replayed through the guard while workers compact.

Each turn of a generated coding session (``workers.harness.demo_session``) goes
through the real agent-side path: ``guard.prepare`` with the user message
pending, a simulated provider call (the view counted with the provider's
tokenizer and checked against the window, exactly as the fake OpenAI
server decides; an overflow goes through ``guard.recover`` and one retry),
then ``guard.record_turn`` with the turn's messages and the reported
usage. Celery workers compact in the background (see ``workers.harness.stack.demo``
for what runs where). The figures at the end compare every call with the
same call made with the full history and no compaction. The simulated
provider is in ``workers.cli.demo_provider``.
"""

from __future__ import annotations

import argparse
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from shared.core.limits import model_limits, output_reserve
from shared.core.messages import Message
from shared.core.turns import turn_starts
from shared.core.wire import from_openai, to_openai
from shared.guard import ContextGuard, PreparedView
from workers.cli._common import Meter, percentile, render_meter, store_errors, whole_number
from workers.cli._format import human, pct
from workers.cli.demo_provider import ProviderSim
from workers.cli.report import check_writable, write_report
from workers.settings import Settings

if TYPE_CHECKING:  # the harness is imported when the demo runs, not with the CLI
    from workers.harness.stack.demo import Landing, Stack

IDLE_TIMEOUT = 60.0


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 <= value <= 10:
        raise argparse.ArgumentTypeError(f"must be between 0 and 10 seconds (got {value})")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--turns", type=whole_number(1), default=120,
                        help="turns of the generated session (default 120)")
    parser.add_argument("--seed", type=int, default=7, help="seed of the generated session")
    parser.add_argument("--window", type=whole_number(1), default=16_000,
                        help="context window of the simulated model in tokens (default 16000, "
                             "small enough that compaction fires many times)")
    parser.add_argument("--max-tokens", type=whole_number(1), default=2_000,
                        help="output reserve of every call (default 2000)")
    parser.add_argument("--model", default="gpt-4o", help="model name the guard is told")
    parser.add_argument("--pace", type=_seconds, default=0.03,
                        help="simulated provider latency per call, seconds (default 0.03)")
    parser.add_argument("--worker", choices=["auto", "embedded", "deployed"], default="auto",
                        help="auto: deployed workers when COMPACTION_BROKER_URL is set, "
                             "else a Celery worker in this process")
    parser.add_argument("--concurrency", type=whole_number(1), default=4,
                        help="threads of the in-process worker (default 4)")
    parser.add_argument("--session", help="session id (default: demo-<random>)")
    parser.add_argument("--report", default="compaction-report.html", metavar="FILE",
                        help="write the session's report there at the end "
                             "(default compaction-report.html; '' for none)")
    parser.add_argument("--json", action="store_true",
                        help="no live display: print the final figures as JSON")


@dataclass
class Figures:
    """The demo's results (``--json`` prints these)."""

    session_id: str
    turns: int
    messages: int
    window: int
    max_tokens: int
    model: str
    provider_counter: str
    overflowing_calls_without_compaction: int = 0
    overflowing_calls_with_compaction: int = 0
    recoveries: int = 0
    failed_calls: int = 0
    compactions: int = 0
    summary_kinds: dict[str, int] = field(default_factory=dict)
    truncations: int = 0
    jobs: dict[str, int] = field(default_factory=dict)
    tokens_sent: int = 0
    tokens_without_compaction: int = 0
    saved_ratio: float = 0.0
    prepare_ms_p50: float = 0.0
    prepare_ms_p99: float = 0.0
    record_turn_ms_p50: float = 0.0
    record_turn_ms_p99: float = 0.0
    final_usage_ratio: float = 0.0
    wall_seconds: float = 0.0
    backends: dict[str, str] = field(default_factory=dict)
    worker_errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def split_turns(turns: int, seed: int = 7) -> list[list[Message]]:
    """The generated session without its system prompt, one list per turn."""
    from workers.harness.demo_session import generate_session

    body = from_openai(generate_session(turns, seed))[1:]
    starts = turn_starts(body)
    return [body[a:b] for a, b in zip(starts, [*starts[1:], len(body)], strict=True)]


class Replay:
    """Plays the session turn by turn; the caller renders what happens."""

    def __init__(self, stack: Stack, settings: Settings, args: argparse.Namespace,
                 session_id: str) -> None:
        from workers.harness.demo_session import SYSTEM_PROMPT, TOOLS

        self.system_prompt, self.tools = SYSTEM_PROMPT, TOOLS
        self.stack = stack
        self.args = args
        self.session_id = session_id
        self.turns = split_turns(args.turns, args.seed)
        # What an agent sends: the guard caps a reserve that leaves no input budget, and the
        # provider would refuse prompt + the larger value (output_reserve).
        self.max_tokens = output_reserve(
            model_limits(args.model, overrides={args.model: args.window}), args.max_tokens)
        self.provider = ProviderSim(args.window, self.max_tokens, TOOLS)
        self.guard = ContextGuard(stack.store, stack.enqueuer, policy=settings.policy(),
                                  overrides={args.model: args.window})
        self.figures = Figures(
            session_id=session_id, turns=len(self.turns),
            messages=sum(len(t) for t in self.turns), window=args.window,
            max_tokens=self.max_tokens, model=args.model, provider_counter=self.provider.name,
            backends=stack.backends.describe())
        system = {"role": "system", "content": SYSTEM_PROMPT}
        self._full = self.provider.message_cost(system)  # history cost without compaction
        self._prepare_ms: list[float] = []
        self._record_ms: list[float] = []
        self.last_view: PreparedView | None = None

    def _prepare(self, user: Message) -> PreparedView:
        started = time.perf_counter()
        view = self.guard.prepare(self.session_id, self.system_prompt, self.tools,
                                  self.max_tokens, self.args.model, pending=[user])
        self._prepare_ms.append((time.perf_counter() - started) * 1000)
        return view

    def step(self, index: int) -> tuple[PreparedView, bool]:
        """One turn; returns the view sent and whether the first attempt overflowed."""
        turn = self.turns[index]
        user = turn[0]
        figures = self.figures
        full = self.provider.prompt_tokens([]) + self._full + sum(
            self.provider.message_cost(m) for m in to_openai([user]))
        figures.tokens_without_compaction += full
        if not self.provider.fits(full):
            figures.overflowing_calls_without_compaction += 1

        view = self._prepare(user)
        figures.truncations += int(view.report.truncated)
        sent = self.provider.prompt_tokens(view.openai())
        overflowed = not self.provider.fits(sent)
        if overflowed:  # the provider rejects it: recover and retry once, like an agent
            figures.overflowing_calls_with_compaction += 1
            retry = self.guard.recover(self.session_id, self.provider.overflow_error(sent),
                                       self.system_prompt, self.tools, self.max_tokens,
                                       self.args.model, pending=[user])
            if retry is not None:
                figures.recoveries += 1
                view = retry
                sent = self.provider.prompt_tokens(view.openai())
            figures.failed_calls += int(not self.provider.fits(sent))
        figures.tokens_sent += sent
        if self.args.pace:
            time.sleep(self.args.pace)
        completion = sum(self.provider.message_cost(m) for m in to_openai(turn[1:])
                         if m["role"] == "assistant")
        started = time.perf_counter()
        self.guard.record_turn(self.session_id, turn,
                               usage={"prompt_tokens": sent, "completion_tokens": completion})
        self._record_ms.append((time.perf_counter() - started) * 1000)
        self._full += sum(self.provider.message_cost(m) for m in to_openai(turn))
        self.last_view = view
        return view, overflowed

    def landed(self) -> list[Landing]:
        found = self.stack.landed(self.session_id)
        self.figures.compactions += len(found)
        for landing in found:
            kinds = self.figures.summary_kinds
            kinds[landing.kind] = kinds.get(landing.kind, 0) + 1
        return found

    def finish(self, started: float) -> Figures:
        f = self.figures
        f.jobs = dict(sorted(self.stack.jobs.items()))
        f.worker_errors = list(self.stack.failures)
        f.saved_ratio = round(1 - f.tokens_sent / f.tokens_without_compaction, 4) \
            if f.tokens_without_compaction else 0.0
        f.prepare_ms_p50 = round(percentile(self._prepare_ms, 50), 3)
        f.prepare_ms_p99 = round(percentile(self._prepare_ms, 99), 3)
        f.record_turn_ms_p50 = round(percentile(self._record_ms, 50), 3)
        f.record_turn_ms_p99 = round(percentile(self._record_ms, 99), 3)
        f.final_usage_ratio = round(self.guard.stats(self.session_id)["usage_ratio"], 4)
        f.wall_seconds = round(time.perf_counter() - started, 2)
        return f


def landing_line(turn: int, number: int, landing: Landing) -> str:
    """Lines of at most 80 columns: what the compaction saved, what it summarized and by
    what, and how, when that is not the summarizer's plain way (its stages)."""
    tokens = (f"  {human(landing.tokens_before)} → {human(landing.tokens_after)} tokens"
              if landing.tokens_before is not None and landing.tokens_after is not None else "")
    timing = f", {landing.latency_ms:.0f} ms" if landing.latency_ms is not None else ""
    model = f" by {landing.model}" if landing.model else ""
    stages = [s for s in landing.stages if s != f"{landing.kind}_summary"]
    how = f"\n          {', '.join(stages)}" if stages else ""
    return (f"[cyan]turn {turn + 1:>3}[/]  [bold green]compaction #{number}[/]{tokens}\n"
            f"          messages {landing.watermark_before}-{landing.watermark_after - 1} → "
            f"{human(landing.summary_tokens)}-token summary, [magenta]{landing.kind}[/]{model}"
            f"{timing}[grey70]{how}[/]")


_EMBEDDED_NOTE = "  [grey70](on the in-process fake Redis)[/]"  # a real one: BENCHMARKS.md


def results_table(f: Figures) -> Table:
    table = Table(title="compaction demo: results", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    ok = "[green]0 ✓[/]" if f.overflowing_calls_with_compaction == 0 \
        else f"[red]{f.overflowing_calls_with_compaction}[/] (recovered {f.recoveries})"
    jobs = ", ".join(f"{k} {v}" for k, v in f.jobs.items())
    embedded = _EMBEDDED_NOTE if f.backends.get("store", "").startswith("fakeredis") else ""
    kinds = ("(" + ", ".join(f"{k} {v}" for k, v in f.summary_kinds.items()) + ")"
             if f.summary_kinds else "")
    rows = [
        ("turns replayed", f"{f.turns} ({f.messages} messages)"),
        ("model window / reserve", f"{human(f.window)} / {human(f.max_tokens)} ({f.model}; "
                                   f"provider counts with {f.provider_counter})"),
        ("calls over the window without compaction",
         f"[red]{f.overflowing_calls_without_compaction}[/] of {f.turns}"),
        ("calls over the window with compaction", ok),
        ("compactions (workers)", f"{f.compactions} {kinds}".rstrip()
         + (f"  [grey70](jobs: {jobs})[/]" if jobs else "")),
        ("truncations (guard, no LLM)", str(f.truncations)),
        ("tokens sent", f"{human(f.tokens_sent)} vs {human(f.tokens_without_compaction)} "
                        f"without compaction ([green]{pct(f.saved_ratio, 1)} saved[/])"),
        ("guard.prepare latency", f"p50 {f.prepare_ms_p50:.2f} ms, p99 {f.prepare_ms_p99:.2f} ms"
                                  + embedded),
        ("guard.record_turn latency",
         f"p50 {f.record_turn_ms_p50:.2f} ms, p99 {f.record_turn_ms_p99:.2f} ms"
         + embedded),
        ("wall time", f"{f.wall_seconds:.1f} s"),
    ]
    if f.worker_errors:
        rows.append(("worker errors", f"[red]{len(f.worker_errors)}[/]: {f.worker_errors[0]}"))
    for name, value in rows:
        table.add_row(name, value)
    return table


def _play(replay: Replay, on_turn: Callable[[int, PreparedView, bool], None]) -> None:
    for index in range(len(replay.turns)):
        view, overflowed = replay.step(index)
        on_turn(index, view, overflowed)


def _play_live(replay: Replay, console: Console) -> None:
    progress = Progress(TextColumn("[bold]replaying turns"), BarColumn(),
                        MofNCompleteColumn(), TimeElapsedColumn(), console=console)
    task = progress.add_task("turns", total=len(replay.turns))
    count = 0

    def frame(view: PreparedView | None) -> Group:
        if view is None:
            return Group(progress)
        return Group(progress, render_meter(Meter.from_report(view.report.budget),
                                            columns=console.width))

    with Live(frame(None), console=console, refresh_per_second=12) as live:
        def on_turn(index: int, view: PreparedView, overflowed: bool) -> None:
            nonlocal count
            if overflowed:
                live.console.print(f"[cyan]turn {index + 1:>3}[/]  [red]provider rejected the "
                                   "call[/]: recovered and retried once")
            if view.report.truncated and not view.report.recovery:
                live.console.print(
                    f"[cyan]turn {index + 1:>3}[/]  [yellow]truncation[/] (guard, no LLM): "
                    f"dropped {view.report.dropped_messages} messages; a worker replaces it "
                    "with a summary")
            for landing in replay.landed():
                count += 1
                live.console.print(landing_line(index, count, landing))
            progress.update(task, completed=index + 1)
            live.update(frame(view))

        _play(replay, on_turn)
        progress.update(task, description="waiting for the workers")
        replay.stack.wait_idle(replay.session_id, IDLE_TIMEOUT)
        for landing in replay.landed():
            count += 1
            live.console.print(landing_line(len(replay.turns) - 1, count, landing))


def run(args: argparse.Namespace, settings: Settings) -> int:
    from workers.harness.stack.demo import choose_backends, open_stack

    if args.report:  # before minutes of replay, not after
        check_writable(Path(args.report), "--report")
    backends = choose_backends(settings, args.worker)
    session_id = args.session or f"demo-{secrets.token_hex(4)}"
    console = Console(stderr=args.json)
    started = time.perf_counter()
    with store_errors(backends.store_url or "fakeredis"), open_stack(
            settings, backends, concurrency=args.concurrency) as stack:
        replay = Replay(stack, settings, args, session_id)
        if replay.max_tokens != args.max_tokens:
            console.print(f"[yellow]--max-tokens {args.max_tokens} leaves no input budget in a "
                          f"{human(args.window)} window: every call sends max_tokens "
                          f"{replay.max_tokens}[/]")
        if args.json:  # stdout is the JSON; a transient progress bar goes to a terminal's
            # stderr (elsewhere rich leaves an empty line there)
            progress = Progress(TextColumn("[bold]replaying turns"), BarColumn(),
                                MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                                transient=True, disable=not console.is_terminal)
            with progress:
                task = progress.add_task("turns", total=len(replay.turns))

                def collect(index: int, *_: object) -> None:
                    replay.landed()
                    progress.update(task, completed=index + 1)

                _play(replay, collect)
                progress.update(task, description="waiting for the workers")
                stack.wait_idle(session_id, IDLE_TIMEOUT)
            replay.landed()
        else:
            console.print(f"[bold]compaction demo[/]: {len(replay.turns)} turns, window "
                          f"{human(args.window)}, session [cyan]{session_id}[/]")
            for name, value in backends.describe().items():
                console.print(f"  {name:<11} {value}")
            _play_live(replay, console)
        figures = replay.finish(started)
        report = (write_report(stack.store, session_id, Path(args.report),
                               trigger_ratio=settings.trigger_ratio, option="--report")
                  if args.report else None)
    if args.json:
        print(json.dumps({**figures.as_dict(),
                          "report": str(report.resolve()) if report else None}, indent=2))
    else:
        console.print()
        console.print(results_table(figures))
        if figures.overflowing_calls_with_compaction:
            console.print("[red]some calls overflowed the window despite the guard[/]")
        if backends.store_url:
            console.print(f"The session stays in Redis: [bold]compaction stats {session_id}"
                          f"[/] / [bold]compaction history {session_id}[/]")
        if report is not None:
            console.print(f"Report of the session (open it in a browser): "
                          f"[bold]{report.resolve()}[/]")
    return 0 if figures.overflowing_calls_with_compaction == 0 else 1


__all__ = ["Figures", "ProviderSim", "Replay", "add_arguments", "run", "split_turns"]
