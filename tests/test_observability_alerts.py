"""docs/observability.md's alert table queries only what is exported and scraped.

An alert on a metric nobody exports, a job name Prometheus does not scrape or a label
value no code writes never fires: it stays silent exactly when it is needed.
"""

from __future__ import annotations

import re
from pathlib import Path

from shared.telemetry.metrics import METRIC_NAMES

ROOT = Path(__file__).resolve().parents[1]


def alert_rows() -> list[str]:
    text = (ROOT / "docs" / "observability.md").read_text()
    start = text.index("### What to alert on")
    section = text[start:text.index("\n## ", start)]
    return [line for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| alert")]


def test_alerts_name_exported_metrics_and_scraped_jobs() -> None:
    rows = alert_rows()
    assert len(rows) >= 5
    scraped = set(re.findall(r"job_name:\s*(\S+)",
                             (ROOT / "docker" / "prometheus.yml").read_text()))
    for row in rows:
        expression = row.split(" | ")[1]
        for name in re.findall(r"\b(compaction_[a-z_]+)", expression):
            assert name in METRIC_NAMES, (name, row)
        for job in re.findall(r"job=~\"([^\"]+)\"", expression):
            assert set(job.replace("\\|", "|").split("|")) <= scraped, (job, scraped)


def test_alert_label_values_are_ones_the_code_writes() -> None:
    """Each ``label="value"`` (or ``=~"a|b"``) is a value the docs' metric table lists."""
    text = (ROOT / "docs" / "observability.md").read_text()
    table = text[text.index("| metric | type |"):text.index("### In the agent process")]
    for row in alert_rows():
        expression = row.split(" | ")[1]
        for label, values in re.findall(r"(\w+)!?=~?\"([^\"]+)\"", expression):
            if label == "job":
                continue
            for value in values.replace("\\|", "|").split("|"):
                assert f"`{value}`" in table, (label, value, row)
