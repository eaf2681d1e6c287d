"""Without its extra, an optional module says which extra to install (as the Agents SDK
adapter does), not a bare ``No module named ...``. Each case runs in a fresh interpreter
where the framework's import fails (``sys.modules[name] = None``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import sys
for blocked in sys.argv[2].split(","):
    sys.modules[blocked] = None
try:
    exec(sys.argv[1])
except ModuleNotFoundError as exc:
    print(f"{exc.name}|{exc}")
else:
    print("no error")
"""


def missing(code: str, *blocked: str) -> tuple[str, str]:
    done = subprocess.run([sys.executable, "-c", PROBE, code, ",".join(blocked)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=True)
    name, _, message = done.stdout.strip().partition("|")
    return name, message


@pytest.mark.parametrize(("code", "blocked", "extra"), [
    ("import shared.integrations.langchain", ("langchain",), "langchain"),
    ("import shared.integrations.langchain", ("langgraph",), "langchain"),
    ("import shared.integrations.pydantic_ai", ("pydantic_ai",), "pydantic-ai"),
    ("import shared.integrations.agents_sdk", ("agents",), "openai-agents"),
    ("from shared.telemetry.metrics import metrics_app; metrics_app()",
     ("prometheus_client",), "metrics"),
    ("from shared.telemetry.metrics import PrometheusMetrics; PrometheusMetrics()",
     ("prometheus_client",), "metrics"),
])
def test_a_missing_extra_is_named(code: str, blocked: tuple[str, ...], extra: str) -> None:
    name, message = missing(code, *blocked)
    assert f"'{extra}' extra" in message, message
    assert f"pip install 'context-compaction[{extra}]'" in message
    assert name.split(".")[0] in blocked  # the missing module stays named (test_install.py)
