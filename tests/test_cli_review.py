"""The operations commands as an operator runs them, against a real Redis.

Found by running every command on a server of its own (sessions recorded by
the store and the guard): a rewind that asked nothing, stray output on
stderr, hints for a TLS mismatch, a meter that wrapped in a narrow terminal.
Each test failed before its fix.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from shared.core.config import StoreConfig
from shared.store.sessions import SessionStore
from workers.cli._format import human
from workers.cli.demo import split_turns
from workers.cli.main import main
from workers.harness.stack.redis_server import free_port, redis_binary
from workers.harness.stack.tls_files import make_tls_files
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


# -- a login or TLS mismatch says so, and what to change ---------------------------------------
@contextlib.contextmanager
def server(*args: str, tls_in: Path | None = None) -> Iterator[int]:
    """The port of a redis-server started with ``args`` (TLS only with the certificates in
    ``tls_in``), once it accepts connections."""
    binary = redis_binary()
    assert binary is not None
    port = free_port()
    ports = ["--port", "0", "--tls-port", str(port), "--tls-cert-file", "server.crt",
             "--tls-key-file", "server.key", "--tls-ca-cert-file", "ca.crt",
             "--tls-auth-clients", "no"] if tls_in else ["--port", str(port)]
    process = subprocess.Popen([binary, "--bind", "127.0.0.1", "--save", "", "--appendonly",
                                "no", *ports, *args], cwd=tls_in,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            assert process.poll() is None and time.monotonic() < deadline, "no redis-server"
            time.sleep(0.05)
        yield port
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture(scope="module")
def password_port() -> Iterator[int]:
    with server("--requirepass", "s3cret-pw") as port:
        yield port


@pytest.fixture(scope="module")
def tls_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    with server(tls_in=make_tls_files(tmp_path_factory.mktemp("tls")).directory) as port:
        yield port


def one_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
             url: str) -> str:
    monkeypatch.setenv("COMPACTION_REDIS_URL", url)
    code, out, err = cli(capsys, "stats", SESSION)
    assert code == 1 and out == "" and len(err.splitlines()) == 1, err
    assert "Traceback" not in err and "s3cret" not in err and "wrong-pw" not in err
    return err


def test_a_refused_login_is_not_an_unreachable_server(
        urls: tuple[str, str], password_port: int, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: "cannot reach Redis at ...: Authentication required." for a server that
    answered and refused the login."""
    err = one_line(capsys, monkeypatch, f"redis://127.0.0.1:{password_port}/0")
    assert err.startswith(f"compaction: error: Redis at redis://127.0.0.1:{password_port}/0 "
                          "refused the login: Authentication required")
    assert "the URL names no password" in err
    err = one_line(capsys, monkeypatch, f"redis://:wrong-pw@127.0.0.1:{password_port}/0")
    assert "refused the login" in err and "redis://:***@" in err
    monkeypatch.setenv("COMPACTION_REDIS_URL", f"redis://:s3cret-pw@127.0.0.1:{password_port}/0")
    code, _, err = cli(capsys, "stats", SESSION)
    assert code == 1 and "no session" in err  # logged in: the session is just not there


def test_a_tls_mismatch_names_the_scheme_to_try(
        urls: tuple[str, str], tls_port: int, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: "Connection reset by peer" (redis:// to a TLS server), "Timeout connecting to
    server" (rediss:// to a plain one), a certificate error with no word of ssl_ca_certs."""
    err = one_line(capsys, monkeypatch, f"redis://127.0.0.1:{tls_port}/0")
    assert err.rstrip().endswith("rediss:// in the URL?)")
    err = one_line(capsys, monkeypatch, f"rediss://127.0.0.1:{tls_port}/0")
    assert "certificate verify failed" in err and "?ssl_ca_certs=" in err
    plain = urls[0].replace("redis://", "rediss://")
    err = one_line(capsys, monkeypatch, plain)
    assert err.rstrip().endswith("redis:// in the URL?)")
    monkeypatch.setenv("COMPACTION_REDIS_URL", f"redis://127.0.0.1:{tls_port}/0")
    code, out, _ = cli(capsys, "doctor", "--timeout", "0.5")
    store_line = out.split("\nWARN")[0].split("\nOK")[0]
    assert code == 1 and store_line.startswith("FAIL redis store")
    assert "rediss:// in the URL?" in " ".join(store_line.split())


# -- doctor: each line says what it checked -------------------------------------------------------
def test_doctor_names_the_gemini_endpoint_it_cannot_reach(
        urls: tuple[str, str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Before: "ConnectError: [Errno 111] Connection refused", naming neither the API nor
    the address (the OpenAI check names both)."""
    monkeypatch.setenv("COMPACTION_SUMMARIZER", "gemini")
    monkeypatch.setenv("COMPACTION_SUMMARIZER_API_KEY", "k")
    monkeypatch.setenv("COMPACTION_SUMMARIZER_BASE_URL", "http://127.0.0.1:1")
    code, out, _ = cli(capsys, "doctor", "--timeout", "0.5", "--json")
    summarizer = json.loads(out)[-1]
    assert code == 1 and summarizer["verdict"] == "FAIL"
    assert summarizer["detail"].startswith("gemini API at http://127.0.0.1:1: cannot connect")


def test_doctor_does_not_blame_client_tracking_when_redis_is_down(
        urls: tuple[str, str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Before: with the store unreachable, "guard reads" said CLIENT TRACKING was refused
    and the guard's user needed the client command: a second, wrong, diagnosis."""
    monkeypatch.setenv("COMPACTION_REDIS_URL", "redis://127.0.0.1:1/0")
    code, out, _ = cli(capsys, "doctor", "--timeout", "0.5", "--json")
    checks = {c["name"]: c for c in json.loads(out)}
    assert code == 1 and checks["redis store"]["verdict"] == "FAIL"
    assert checks["guard reads"] == {"name": "guard reads", "verdict": "WARN",
                                     "detail": "not checked: the store is not reachable"}


def test_a_connection_lost_mid_command_is_not_an_answer(urls: tuple[str, str]) -> None:
    """``sessions`` sends SCAN and a pipeline itself, outside the store's error mapping: a
    Redis gone after the first PING (a restart, a failover) read "Redis ... answered with
    an error: Error 111 connecting"; it is unreachable, not answering."""
    from shared.core.errors import StoreUnavailable
    from workers.cli._common import store_errors

    gone = f"redis://127.0.0.1:{free_port()}/0"
    client = redis.Redis.from_url(gone, socket_connect_timeout=0.5)
    with pytest.raises(StoreUnavailable) as caught, store_errors(gone):
        client.scan(cursor=0, match="cmp:*", count=10)
    assert str(caught.value).startswith(f"cannot reach Redis at {gone}: Error 111")


# -- large sessions ---------------------------------------------------------------------------
def sent_bytes(url: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        return int(client.info("stats")["total_net_output_bytes"])
    finally:
        client.close()


@pytest.mark.parametrize("argv", [["history", SESSION], ["compact", SESSION],
                                  ["rewind", SESSION, "0", "--yes"]])
def test_history_rewind_and_compact_do_not_read_a_large_log(
        store: SessionStore, urls: tuple[str, str], capsys: pytest.CaptureFixture[str],
        argv: list[str]) -> None:
    """Before: each checked that the session exists with one read of its whole view: a
    10k-message log (~6 MB here; 3.7 s and 350 MB for 100k messages) sent to list its
    summaries. Now two small reads (state, length)."""
    from shared.core.messages import Message

    filler = "lorem ipsum dolor sit amet " * 20
    for start in range(0, 10_000, 500):
        store.append(SESSION, [Message(role="user" if i % 2 == 0 else "assistant",
                                       content=f"message {i} {filler}")
                               for i in range(start, start + 500)])
    before = sent_bytes(urls[0])
    code, out, err = cli(capsys, *argv)
    assert code == 0, err
    assert sent_bytes(urls[0]) - before < 50_000  # the view is ~6 MB
    if argv[0] == "history":
        assert "no summaries yet (10000 messages)" in out


def test_doctor_warns_of_a_host_clock_off_the_stores(
        urls: tuple[str, str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Before: no check of the clock. Queue lag (publisher's send time against the worker's
    clock), retry ETAs and kombu's redelivery compare wall clocks across hosts; the store's
    TIME is the one reference every host reaches. This host's clock is moved, not Redis's."""
    import time as time_module

    from workers.cli import doctor

    _, out, _ = cli(capsys, "doctor", "--timeout", "0.5", "--json")
    clock = {c["name"]: c for c in json.loads(out)}["clock"]
    assert clock["verdict"] == "OK" and "the store's clock" in clock["detail"]
    monkeypatch.setattr(doctor, "_wall_clock", lambda: time_module.time() + 45)
    _, out, _ = cli(capsys, "doctor", "--timeout", "0.5", "--json")
    clock = {c["name"]: c for c in json.loads(out)}["clock"]
    assert clock["verdict"] == "WARN", clock
    ahead = float(clock["detail"].removeprefix("this host is ").split(" s ahead of ")[0])
    assert 44 < ahead < 46, clock  # 45 s, less a few ms of round trip
    assert "NTP" in clock["detail"]


# -- --json: the documented shapes (README's table), and nothing on stdout for an error ---------
def test_json_outputs_have_the_keys_readme_documents(
        store: SessionStore, compacted: list[int], capsys: pytest.CaptureFixture[str]) -> None:
    documented: dict[tuple[str, ...], set[str]] = {
        ("sessions",): {"sessions", "cursor"},
        ("stats", SESSION): {"length", "watermark", "version", "model", "window",
                             "limits_source", "reserve", "regions", "estimated_prompt_tokens",
                             "usage_ratio", "should_compact", "within_budget", "summaries",
                             "pending_job", "limits_detail"},
        ("show", SESSION): {"model", "max_tokens", "messages"},
        ("compact", SESSION): {"task_id", "task", "session_id"},
        ("compact", SESSION, "--wait", "--force"): {
            "status", "reason", "tokens_before", "tokens_after", "watermark_before",
            "watermark_after", "summary_kind", "latency_ms"},
    }
    for argv, keys in documented.items():
        code, out, err = cli(capsys, *argv, "--json")
        assert code == 0, err
        assert keys <= set(json.loads(out)), argv
    code, out, _ = cli(capsys, "sessions", "--json")
    row = json.loads(out)["sessions"][0]
    assert set(row) == {"tenant", "session_id", "messages", "tokens", "watermark", "model",
                        "idle_seconds"}
    code, out, _ = cli(capsys, "history", SESSION, "--json")
    assert {"watermark", "kind", "text", "ledger", "tokens", "covers_from", "model",
            "created_at", "current"} <= set(json.loads(out)[0])
    code, out, _ = cli(capsys, "doctor", "--timeout", "0.5", "--json")
    assert all(set(c) == {"name", "verdict", "detail"} and c["verdict"] in ("OK", "WARN", "FAIL")
               for c in json.loads(out))
    for command in ("stats", "history", "show", "compact"):
        code, out, err = cli(capsys, command, "nobody", "--json")
        assert (code, out) == (1, "") and err.startswith("compaction: error: no session")


def test_replay_error_is_one_line_without_a_progress_bar(tmp_path: Path) -> None:
    """Before: stderr not a terminal, the bar was still drawn there and left
    "replaying sessions ━━━ 0/? 0:00:00" above the error line."""
    pytest.importorskip("openai")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"bad\n')
    for path in (str(tmp_path / "missing.jsonl"), str(broken)):
        done = run_cli("replay", path, "--in-process")
        assert done.returncode == 2
        assert len(done.stderr.splitlines()) == 1, done.stderr
        assert done.stderr.startswith("compaction: error: ")


def test_show_refuses_a_negative_chars(capsys: pytest.CaptureFixture[str]) -> None:
    """Before: ``--chars -5`` was taken as 0 (print everything), the opposite of a limit."""
    with pytest.raises(SystemExit) as stopped:
        main(["show", SESSION, "--chars", "-5"])
    assert stopped.value.code == 2
    assert "compaction: error: argument --chars: must be >= 0 (got -5)" in capsys.readouterr().err


def test_a_record_this_version_cannot_read_is_one_line(
        store: SessionStore, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: a summary record that does not parse (another version's, edited by hand)
    ended history, stats, report and rewind with pydantic's traceback."""
    for turn in split_turns(3, seed=1):
        store.append(SESSION, turn)
    sums = store.keys(SESSION).summaries
    for bad in ("not json", '{"watermark": 5}'):
        store.redis.hset(sums, "5", bad)
        for argv in (["history", SESSION], ["stats", SESSION], ["rewind", SESSION, "5", "-y"]):
            code, out, err = cli(capsys, *argv)
            assert (code, out) == (1, ""), (argv, err)
            assert err.startswith("compaction: error: cannot read a SummaryRecord from Redis: ")
            assert len(err.splitlines()) == 1 and "another version" in err


def test_a_message_this_version_cannot_read_is_one_line_naming_it(
        store: SessionStore, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: a log entry that does not parse was pydantic's traceback for stats, and for
    ``compact --wait`` a line naming "list[function-after[_role_rules(), Message]]" with
    the raw input and pydantic's URL in it."""
    for turn in split_turns(3, seed=1):
        store.append(SESSION, turn)
    store.redis.lset(store.keys(SESSION).log, 1, "garbage")
    for argv in (["stats", SESSION], ["compact", SESSION, "--wait", "--force"]):
        code, out, err = cli(capsys, *argv)
        assert (code, out) == (1, ""), (argv, err)
        assert "cannot read a Message from Redis: Invalid JSON" in err, err
        assert len(err.splitlines()) == 1 and "pydantic.dev" not in err


# -- delete: the erasure an operator had to script against the store ------------------------
def test_delete_removes_every_key_of_the_session_and_asks_first(
        store: SessionStore, compacted: list[int], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: no command removed a session (a user's erasure request meant Python against
    the store, or redis-cli patterns); now ``delete``, confirmed like ``rewind``."""
    from shared.store.recall_index import recall_keys

    other = store.for_tenant("acme")
    kept = other.append(SESSION, split_turns(2)[0])  # the same id in another tenant stays
    done = run_cli("delete", SESSION)
    assert done.returncode == 2 and "pass --yes to confirm" in done.stderr
    monkeypatch.setattr(sys, "stdin", Terminal("no\n"))
    code, _, err = cli(capsys, "delete", SESSION)
    assert code == 1 and "delete its" in err and "not deleted: nothing changed" in err
    assert store.length(SESSION) > 0
    monkeypatch.setattr(sys, "stdin", Terminal("y\n"))
    code, out, _ = cli(capsys, "delete", SESSION)
    assert code == 0 and "deleted" in out and "2 summaries" in out
    k, rx = store.keys(SESSION), recall_keys(store, SESSION)
    assert store.redis.exists(*k.all_keys(), rx.meta) == 0
    assert list(store.redis.scan_iter(match=f"{store.config.key_prefix}:*{{default:{SESSION}}}*")) \
        == []
    assert other.length(SESSION) == kept > 0
    code, _, err = cli(capsys, "delete", SESSION, "--yes")
    assert code == 1 and "no session" in err


@pytest.mark.parametrize("columns", [40, 50, 60, 80])
def test_sessions_never_cut_a_figure_in_a_narrow_terminal(
        store: SessionStore, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, columns: int) -> None:
    """Before: below ~65 columns every column was cut ("messa…", "107.…", "many…"), though
    the table promised that only the session id gives way. Now the figures are whole, the
    session id keeps at least 8 columns, and where even that does not fit the last activity,
    then the watermark, are left out (the title says so)."""
    for turn in split_turns(40, seed=4):
        store.append("wide-session-1", turn)
    monkeypatch.setenv("COLUMNS", str(columns))
    (figures,) = json.loads(cli(capsys, "sessions", "--json")[1])["sessions"]
    code, out, _ = cli(capsys, "sessions")
    assert code == 0
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("tenant"))
    cells = next(line for line in lines if line.startswith("default")).split()
    assert all(len(line) <= columns for line in lines), out
    assert header.split()[:4] == ["tenant", "session", "messages", "tokens"], out
    assert cells[2:4] == [str(figures["messages"]), human(figures["tokens"])], out
    assert cells[1].startswith("wide-") and len(cells[1]) >= 8
    if columns >= 80:
        assert "last activity" in header and "(narrow)" not in out
    else:
        assert "(narrow)" in " ".join(lines[:2])
