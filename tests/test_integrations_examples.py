"""Every framework adapter's example runs offline, as a user would start it.

Each example is run as a script in a fresh interpreter (no servers, no keys:
fakeredis, the in-memory broker and an in-process Celery worker), and its
final JSON report is checked: the session outgrew the window, the model never
saw an overflowing request, the worker's summaries reached it, and an early
message the worker summarized away came back through the ``recall`` tool.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_example(name: str, *args: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for var in ("COMPACTION_REDIS_URL", "COMPACTION_BROKER_URL", "COMPACTION_SUMMARIZER"):
        env.pop(var, None)
    done = subprocess.run([sys.executable, str(ROOT / "examples" / name), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    report: dict[str, object] = json.loads(out[out.rindex("\n{") + 1:])
    return report


@pytest.mark.parametrize("example, framework, history_key", [
    ("langchain_agent.py", "langchain.agents", "state_messages"),
    ("pydantic_ai_agent.py", "pydantic_ai", "history_messages"),
])
def test_the_example_runs_offline_and_stays_in_the_window(example: str, framework: str,
                                                          history_key: str) -> None:
    pytest.importorskip(framework)
    report = run_example(example, "--turns", "24", "--window", "3000")
    assert report[history_key] == report["log_length"] == 4 * 24  # view, not delete
    assert report["overflows_seen_by_model"] == 0
    assert isinstance(report["max_request_tokens"], int) and report["max_request_tokens"] <= 3000
    assert isinstance(report["summaries"], int) and report["summaries"] >= 1
    assert isinstance(report["requests_with_summary"], int)
    assert report["requests_with_summary"] >= 10
    # question 7, summarized away, recalled verbatim through the adapter's recall tool
    assert report["recalled"] == [4 * 7]


def test_shared_integrations_imports_no_framework() -> None:
    """``import shared`` and ``import shared.integrations`` load no optional framework."""
    code = ("import json, sys, shared, shared.integrations, shared.integrations._common\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('langchain', 'langchain_core', 'langgraph', 'pydantic_ai'))))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
