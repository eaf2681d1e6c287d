"""The operations commands as an operator runs them, against a real Redis.

Found by running every command on a server of its own (sessions recorded by
the store and the guard): a rewind that asked nothing, stray output on
stderr, hints for a TLS mismatch, a meter that wrapped in a narrow terminal.
Each test failed before its fix.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from shared.core.config import StoreConfig
from shared.store.sessions import SessionStore
from workers.cli.demo import split_turns
from workers.cli.main import main
from workers.urls import with_db

ROOT = Path(__file__).resolve().parents[1]
SESSION = "rev-1"
CLEARED = ("COMPACTION_TENANT", "COMPACTION_SUMMARIZER", "COMPACTION_SUMMARIZER_MODEL",
           "COMPACTION_SUMMARIZER_BASE_URL", "COMPACTION_SUMMARIZER_API_KEY", "NO_COLOR",
           "FORCE_COLOR", "COLUMNS")


@pytest.fixture
def urls(own_redis_url: str, key_prefix: str,
         monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    store_url, broker_url = with_db(own_redis_url, 3), with_db(own_redis_url, 4)
    for name in CLEARED:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COMPACTION_REDIS_URL", store_url)
    monkeypatch.setenv("COMPACTION_BROKER_URL", broker_url)
    monkeypatch.setenv("COMPACTION_KEY_PREFIX", key_prefix)
    yield store_url, broker_url
    for url in (store_url, broker_url):
        client = redis.Redis.from_url(url)
        client.flushdb()
        client.close()


@pytest.fixture
def store(urls: tuple[str, str], key_prefix: str) -> Iterator[SessionStore]:
    client = redis.Redis.from_url(urls[0])
    yield SessionStore(client, StoreConfig(key_prefix=key_prefix))
    client.close()


@pytest.fixture
def compacted(store: SessionStore, capsys: pytest.CaptureFixture[str]) -> list[int]:
    """A session with two kept summaries (made by the real task); their watermarks."""
    turns = split_turns(30, seed=3)
    for half in (turns[:15], turns[15:]):
        for turn in half:
            store.append(SESSION, turn)
        assert main(["compact", SESSION, "--wait", "--force", "--keep-recent", "500"]) == 0
    capsys.readouterr()
    watermarks = [r.watermark for r in store.summaries(SESSION)]
    assert len(watermarks) == 2 and store.state(SESSION).watermark == watermarks[-1]
    return watermarks


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


class Terminal(io.StringIO):
    """A stdin that is a terminal, with the operator's answer typed in."""

    def isatty(self) -> bool:
        return True


def run_cli(*argv: str, env: dict[str, str] | None = None,
            stdin: Any = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    """The real console entry point in a subprocess (no terminal: pipes)."""
    return subprocess.run([sys.executable, "-m", "workers.cli.main", *argv],
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
                          capture_output=True, text=True, timeout=120, cwd=ROOT, check=False,
                          stdin=stdin)


# -- rewind: a destructive command asks, or needs --yes --------------------------------------
def test_rewind_without_a_terminal_needs_yes_and_changes_nothing(
        store: SessionStore, compacted: list[int]) -> None:
    """Before: ``compaction rewind S 0`` from a script rewound at once, no question asked."""
    before = store.state(SESSION)
    done = run_cli("rewind", SESSION, "0")
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "compaction: error: --yes: rewind changes what the agent's next call sends: pass "
        "--yes to confirm (no terminal to ask on)"]
    assert store.state(SESSION) == before
    done = run_cli("rewind", SESSION, "0", "--yes")
    assert done.returncode == 0, done.stderr
    assert "no summary is current" in done.stdout
    assert store.state(SESSION).watermark == 0


def test_rewind_on_a_terminal_asks_and_no_keeps_the_session(
        store: SessionStore, compacted: list[int], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    before = store.state(SESSION)
    target = compacted[0]
    monkeypatch.setattr(sys, "stdin", Terminal("n\n"))
    code, out, err = cli(capsys, "rewind", SESSION, str(target))
    assert code == 1 and out == ""
    assert f"make the summary at watermark {target} current instead of watermark " \
           f"{before.watermark}? [y/N]" in err
    assert err.rstrip().endswith("compaction: error: not rewound: nothing changed")
    assert store.state(SESSION) == before
    monkeypatch.setattr(sys, "stdin", Terminal("y\n"))
    code, out, _ = cli(capsys, "rewind", SESSION, str(target))
    assert code == 0 and f"watermark {target}" in out
    assert store.state(SESSION).watermark == target


def test_rewind_checks_the_watermark_before_asking_and_the_current_one_is_a_no_op(
        store: SessionStore, compacted: list[int], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: an unknown watermark was found out after the question (had there been one),
    and rewinding to the current summary bumped the version and dropped the placeholders
    (the agent's cached prefix) for nothing."""
    monkeypatch.setattr(sys, "stdin", Terminal(""))  # would answer no: never asked
    code, _, err = cli(capsys, "rewind", SESSION, str(compacted[-1] + 1))
    assert code == 2 and "[y/N]" not in err and "no kept summary at watermark" in err
    before = store.state(SESSION)
    code, out, err = cli(capsys, "rewind", SESSION, str(before.watermark))
    assert code == 0 and "already current: nothing changed" in out and "[y/N]" not in err
    assert store.state(SESSION).version == before.version


# -- output: stderr, colours, pipes ----------------------------------------------------------
def test_doctor_writes_nothing_to_stderr_without_a_terminal(urls: tuple[str, str]) -> None:
    """Before: its spinner, transient on a terminal, left an empty line on stderr elsewhere
    (a cron job's mail, a CI log)."""
    done = run_cli("doctor", "--timeout", "0.5")
    assert done.returncode == 1  # no worker on this broker
    assert done.stderr == "" and "\x1b" not in done.stdout
    assert done.stdout.splitlines()[-1].startswith("doctor: 1 FAIL")


def test_demo_json_writes_nothing_to_stderr_without_a_terminal(urls: tuple[str, str]) -> None:
    """Before: the --json run's transient progress bar left an empty line on stderr."""
    done = run_cli("demo", "--turns", "6", "--pace", "0", "--worker", "embedded", "--json",
                   "--report", "", "--session", "quiet-1")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert json.loads(done.stdout)["turns"] == 6


@pytest.mark.parametrize("columns", [40, 50, 64, 80])
def test_stats_meter_never_wraps_a_bar_in_a_narrow_terminal(
        store: SessionStore, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, columns: int) -> None:
    """Before: the bars were 40 cells whatever the width: at 40 or 50 columns the usage bar
    and the window split wrapped inside the panel (a bar's tail alone on a line)."""
    for turn in split_turns(8, seed=2):
        store.append(SESSION, turn)
    monkeypatch.setenv("COLUMNS", str(columns))
    code, out, _ = cli(capsys, "stats", SESSION)
    assert code == 0
    lines = out.splitlines()
    meter = lines[1:lines.index(next(line for line in lines if not line[1:-1].strip()))]
    assert all(len(line) <= columns for line in lines)
    assert meter[0].startswith("│ context █") and meter[0].rstrip(" │").endswith("%")
    assert all(line.startswith(("│ context ", "│ window  ", "│         ")) for line in meter), \
        "\n".join(meter)
