"""``compaction compact SESSION``: a manual /compact.

By default the ``compaction.compact`` task is published through the
broker (``COMPACTION_BROKER_URL``) for the deployed workers and its task id
printed; ``--wait`` runs the same task inline in this process instead
(lease, compare-and-swap, offline fallback: everything a worker does) and
prints its outcome.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
from collections.abc import Iterator
from typing import Any

from pydantic import ValidationError
from rich.console import Console

from shared.core.errors import CompactionError, InvalidInput
from shared.enqueue import TASK_COMPACT, publisher_app
from workers.cli._common import (
    add_json,
    add_session,
    open_store,
    session_state,
    store_errors,
    working,
)
from workers.cli._format import human, unreadable
from workers.settings import Settings
from workers.urls import redact_url

# Celery logs a failed task with its traceback ("raised unexpected") before apply() returns
TRACE_LOGGER = "celery.app.trace"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_session(parser)
    parser.add_argument("--keep-recent", type=int, metavar="N",
                        help="tokens of recent history to keep verbatim (default: the policy's)")
    parser.add_argument("--force", action="store_true",
                        help="compact even when it frees less than the minimum saving")
    parser.add_argument("--wait", action="store_true",
                        help="run the job inline in this process and print its outcome")
    add_json(parser)


def run(args: argparse.Namespace, settings: Settings) -> int:
    if args.keep_recent is not None and args.keep_recent < 0:
        raise InvalidInput("must be >= 0", field="--keep-recent")
    tenant = args.tenant or settings.tenant
    with store_errors(settings.redis_url):
        session_state(open_store(settings, tenant), args.session)  # it exists
    kwargs: dict[str, Any] = {"keep_recent": args.keep_recent, "force": args.force,
                              "tenant": tenant}
    if args.wait:
        with working(f"compacting {args.session}"):
            outcome = run_inline(settings, args.session, kwargs)
        if args.json:
            print(json.dumps(outcome, indent=2))
        else:
            Console().print(describe(outcome))
        return 0
    task_id = publish(settings, args.session, kwargs)
    if args.json:
        print(json.dumps({"task_id": task_id, "task": TASK_COMPACT, "session_id": args.session}))
    else:
        Console().print(f"queued {TASK_COMPACT} for [cyan]{args.session}[/] "
                        f"(tenant {tenant}): task id [bold]{task_id}[/]")
    return 0


def publish(settings: Settings, session_id: str, kwargs: dict[str, Any]) -> str:
    """Publish the task by name (as the agent side does) on ``COMPACTION_QUEUE``; returns
    the task id."""
    app = publisher_app(settings.broker_url, timeout=2.0,
                        sentinel_master=settings.broker_sentinel_master)
    try:
        result = app.send_task(TASK_COMPACT, args=[session_id], kwargs=kwargs,
                               queue=settings.queue)
    except Exception as exc:  # kombu's OperationalError and transport errors
        raise CompactionError(f"cannot reach the broker at {redact_url(settings.broker_url)}: "
                              f"{exc}") from None
    finally:
        app.close()
    return str(result.id)


def run_inline(settings: Settings, session_id: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The real task, applied in this process (Celery's eager ``apply``)."""
    from workers.harness.stack.in_process import worker_app_with
    from workers.tasks import compact

    with store_errors(settings.redis_url), worker_app_with(settings), _silenced(TRACE_LOGGER):
        result = compact.apply(args=[session_id], kwargs=kwargs)
    if not result.successful():
        error = result.result
        if isinstance(error, CompactionError):
            raise error
        if isinstance(error, ValidationError):  # a record in Redis this version cannot read
            raise CompactionError(f"the compaction job failed: {unreadable(error)}")
        raise CompactionError(f"the compaction job failed: {type(error).__name__}: {error}")
    outcome: dict[str, Any] = result.result
    return outcome


@contextlib.contextmanager
def _silenced(name: str) -> Iterator[None]:
    """Mute a logger for the block: the failure is raised here as one line."""
    logger = logging.getLogger(name)
    before, logger.disabled = logger.disabled, True
    try:
        yield
    finally:
        logger.disabled = before


def describe(outcome: dict[str, Any]) -> str:
    status = outcome.get("status")
    if status != "compacted":
        return f"[yellow]{status}[/]: {outcome.get('reason') or 'no reason given'}"
    stages = ", ".join(outcome.get("stages") or []) or "-"
    return (f"[green]compacted[/]: {human(outcome['tokens_before'])} → "
            f"{human(outcome['tokens_after'])} tokens, watermark {outcome['watermark_before']} → "
            f"{outcome['watermark_after']}, {outcome['summary_kind']} ({stages}), "
            f"{outcome['latency_ms']:.0f} ms")


__all__ = ["add_arguments", "describe", "publish", "run", "run_inline"]
