"""The examples of the Agents SDK integration and the HTTP server run offline."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_example(name: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / name), *args], env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_agents_sdk_agent_runs_past_its_window() -> None:
    pytest.importorskip("agents")
    out = run_example("agents_sdk_agent.py", "--files", "24", "--window", "8192")
    assert "Audited 24 files" in out
    largest = int(re.search(r"largest prompt (\d+) tokens", out).group(1))  # type: ignore[union-attr]
    tool_tokens = int(re.search(r"~(\d+) tokens", out).group(1))  # type: ignore[union-attr]
    assert largest < 8192 < tool_tokens
    assert "0 refused for overflow" in out


def test_http_client_keeps_a_long_session_inside_the_window() -> None:
    pytest.importorskip("fastapi")
    out = run_example("http_client.py", "--turns", "80")
    match = re.search(r"80 turns, 160 messages stored, view at (\d+)% of the input budget, "
                      r"watermark (\d+)", out)
    assert match, out
    assert int(match.group(1)) <= 100 and int(match.group(2)) > 0
