"""``compaction serve``: the guard over HTTP (FastAPI + uvicorn, the ``server`` extra).

Bearer tokens map to tenants (``COMPACTION_SERVER_TOKENS_FILE``: a JSON
object ``{token: tenant}``, or ``COMPACTION_SERVER_TOKENS`` inline); the
server refuses to start without one. See docs/server.md.
fastapi and uvicorn are imported only in :func:`run`, so the CLI works
without the extra.

With ``--workers N`` (N > 1) every uvicorn process counts its own requests:
``serve`` points ``PROMETHEUS_MULTIPROC_DIR`` at a fresh temporary directory
for its children (prometheus_client's multiprocess mode, read at import in
each child), so each process's ``/metrics`` serves the sum over all of them,
and removes the directory on exit. A directory the environment already names
is used as is (empty it before each start).

On SIGTERM uvicorn stops accepting connections and lets the requests in
flight finish, for ``COMPACTION_SERVER_SHUTDOWN_GRACE_SECONDS`` at most:
without a bound, one client holding a request open (a body sent part-way)
kept the server up until the orchestrator killed it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

from shared.core.errors import ConfigError
from workers.cli._format import needs_extra
from workers.settings import Settings

MISSING = needs_extra("serve", "server")
FLAGS = {"host": "--host", "port": "--port", "workers": "--workers"}  # named in errors


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help="bind address (default: COMPACTION_SERVER_HOST, "
                                       "127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default: COMPACTION_SERVER_PORT, 8080)")
    parser.add_argument("--workers", type=int, help="uvicorn worker processes "
                                                    "(default: COMPACTION_SERVER_WORKERS, 1)")
    parser.add_argument("--log-level", default="info",
                        choices=["critical", "error", "warning", "info", "debug"])


def run(args: argparse.Namespace, settings: Settings) -> int:
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError:
        raise ConfigError(MISSING) from None  # one line, exit status 2, as every command
    from workers.server.config import load_server_config, require_tokens
    from workers.server.logconfig import log_config
    from workers.server.main import build_app

    overrides = {k: v for k, v in (("host", args.host), ("port", args.port),
                                   ("workers", args.workers)) if v is not None}
    config = load_server_config(flags=FLAGS, **overrides)
    require_tokens(config)  # before any worker process starts, one line instead of N
    logs = log_config(settings.log_format, args.log_level)  # COMPACTION_LOG_FORMAT
    logging_kw: dict[str, Any] = {} if logs is None else {"log_config": logs}
    if config.workers > 1:  # each process builds its own app from the environment
        with shared_metrics_dir():
            uvicorn.run("workers.server.main:app_from_env", factory=True, host=config.host,
                        port=config.port, workers=config.workers, log_level=args.log_level,
                        timeout_graceful_shutdown=config.shutdown_grace_seconds, **logging_kw)
        return 0
    app = build_app(settings, config)
    uvicorn.run(app, host=config.host, port=config.port, log_level=args.log_level,
                timeout_graceful_shutdown=config.shutdown_grace_seconds, **logging_kw)
    return 0


@contextlib.contextmanager
def shared_metrics_dir() -> Iterator[str]:
    """``PROMETHEUS_MULTIPROC_DIR`` for the worker processes started inside the block.

    The environment's own directory if it names one; otherwise a new
    temporary directory, set for the children and removed afterwards.
    """
    from shared.telemetry.metrics import MULTIPROC_ENV

    given = os.environ.get(MULTIPROC_ENV)
    if given:
        yield given
        return
    path = tempfile.mkdtemp(prefix="compaction-metrics-")
    os.environ[MULTIPROC_ENV] = path
    try:
        yield path
    finally:
        os.environ.pop(MULTIPROC_ENV, None)
        shutil.rmtree(path, ignore_errors=True)


__all__ = ["MISSING", "add_arguments", "run", "shared_metrics_dir"]
