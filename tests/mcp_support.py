"""``compaction mcp --transport http`` in a process of its own, for the MCP tests."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def mcp_http_server(redis_url: str, key_prefix: str,
                    tokens: Mapping[str, str]) -> Iterator[str]:
    """The MCP server over streamable HTTP with ``tokens`` (token -> tenant), until its
    port answers; yields its URL. Server settings of the environment are left out."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_SERVER_")}
    env.update({"PYTHONPATH": ROOT, "COMPACTION_REDIS_URL": redis_url,
                "COMPACTION_KEY_PREFIX": key_prefix,
                "COMPACTION_SERVER_TOKENS": json.dumps(dict(tokens))})
    server = subprocess.Popen([sys.executable, "-m", "workers.cli.mcp", "--transport", "http",
                               "--port", str(port)], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert server.poll() is None, server.stderr.read() if server.stderr else ""
                assert time.monotonic() < deadline, "the MCP HTTP server did not start"
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.terminate()
        server.wait(timeout=10)
        if server.stderr is not None:
            server.stderr.close()
