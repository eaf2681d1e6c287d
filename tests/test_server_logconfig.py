"""``COMPACTION_LOG_FORMAT=json`` for ``compaction serve``: uvicorn's lines as plain JSON.

uvicorn logs its start-up lines with ``extra={"color_message": ...}``, the same text
with ANSI colour codes for its own coloured formatter; the JSON formatter writes every
``extra`` field, so each such line carried the escape codes as a second message.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("uvicorn")

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import logging, logging.config
from workers.server.logconfig import log_config
logging.config.dictConfig(log_config("json"))
logging.getLogger("uvicorn.error").info(
    "Uvicorn running on %s", "http://127.0.0.1:8080",
    extra={"color_message": "Uvicorn running on \\x1b[1m%s\\x1b[0m"})
logging.getLogger("shared.enqueue").warning("enqueue failed for s9", extra={"attempt": 2})
"""


def test_json_lines_carry_no_colour_codes() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    records = [json.loads(line) for line in done.stderr.splitlines() if line.strip()]
    assert [r["message"] for r in records] == [
        "Uvicorn running on http://127.0.0.1:8080", "enqueue failed for s9"]
    assert "\x1b" not in done.stderr
    assert all("color_message" not in r for r in records)
    assert records[1]["attempt"] == 2  # other extra fields are still written
