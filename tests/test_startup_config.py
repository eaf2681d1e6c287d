"""Bad configuration is one line, never a traceback (the real commands, as subprocesses).

A worker (``celery -A workers.app worker``), Flower (``python -m
workers.flower_entry``) and the CLI (``compaction stats``) started with a bad
setting must exit non-zero with a single stderr line naming the variable and
the value, secrets redacted. The unit tests below cover the pieces: secret
files, the Redis password joining the URLs, the typo warning.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared.core.errors import ConfigError
from workers.flower_entry import FILE_VAR, credentials_environment
from workers.settings import (
    ENV_PREFIX,
    FILE_SETTINGS,
    FILE_SUFFIX,
    Settings,
    known_variables,
    load_settings,
    read_secret_file,
    redact_url,
    unknown_variables,
    warn_unknown_variables,
    with_password,
)

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _script(name: str, module: str) -> list[str]:
    """The console script of this environment, or ``python -m`` where it has none."""
    path = BIN / name
    return [str(path)] if path.exists() else [sys.executable, "-m", module]


COMMANDS = {
    "worker": [*_script("celery", "celery"), "-A", "workers.app", "worker", "--pool", "threads",
               "--concurrency", "2", "--queues", "compaction", "--loglevel", "INFO", "-E"],
    "flower": [sys.executable, "-m", "workers.flower_entry", "--port=1"],
    "cli": [*_script("compaction", "workers.cli.main"), "stats", "some-session"],
}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith((ENV_PREFIX, "FLOWER_"))}
    env["FLOWER_BASIC_AUTH"] = "ops:correct-horse"
    env.update(extra)
    return env


def _run(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(COMMANDS[command], env=env, capture_output=True, text=True,
                          timeout=90, cwd=ROOT, check=False)


BAD = {
    "not a number": ({"COMPACTION_TRIGGER_RATIO": "abc"}, "COMPACTION_TRIGGER_RATIO='abc'"),
    "bad url": ({"COMPACTION_REDIS_URL": "http://x"}, "COMPACTION_REDIS_URL='http://x'"),
    "bad broker url": ({"COMPACTION_BROKER_URL": "redis://:hunter2@h:port/1"},
                       "COMPACTION_BROKER_URL='redis://:***@h:port/1'"),
    "unreadable secret": ({"COMPACTION_SUMMARIZER_API_KEY_FILE": "/nonexistent/api_key"},
                          "COMPACTION_SUMMARIZER_API_KEY_FILE=/nonexistent/api_key"),
}
# Each command with a non-number, a bad URL and an unreadable secret (every
# start costs seconds of imports, so not the full product).
CASES = [(command, case) for command in sorted(COMMANDS)
         for case in ("not a number", "unreadable secret",
                      "bad broker url" if command == "flower" else "bad url")]


@pytest.mark.slow
@pytest.mark.parametrize(("command", "case"), CASES)
def test_a_bad_setting_is_one_line_and_a_non_zero_exit(command: str, case: str) -> None:
    extra, expected = BAD[case]
    done = _run(command, _env(**extra))
    lines = done.stderr.splitlines()
    assert done.returncode != 0, done.stdout + done.stderr
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert expected in lines[0], lines[0]
    assert "hunter2" not in done.stderr + done.stdout


@pytest.mark.slow
def test_flower_with_an_unreadable_credentials_file_is_one_line(tmp_path: Path) -> None:
    env = _env(FLOWER_BASIC_AUTH_FILE=str(tmp_path / "missing"))
    del env["FLOWER_BASIC_AUTH"]
    done = _run("flower", env)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert f"FLOWER_BASIC_AUTH_FILE={tmp_path / 'missing'}" in done.stderr


@pytest.mark.slow
def test_a_typo_is_one_warning_line_naming_the_closest_setting() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "from workers.settings import load_settings; load_settings()"],
        env=_env(COMPACTION_TRIGER_RATIO="0.7"), capture_output=True, text=True, timeout=60,
        cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("warning:")
    assert "COMPACTION_TRIGER_RATIO (did you mean COMPACTION_TRIGGER_RATIO?)" in line


# -- secret files --------------------------------------------------------------------------
def test_every_file_setting_reads_its_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    values = {"redis_url": "redis://store:6379/0", "broker_url": "redis://broker:6379/1",
              "redis_password": "s3cret/+:@", "summarizer_api_key": "sk-from-file"}
    for name in FILE_SETTINGS:
        path = tmp_path / name
        path.write_text(values[name] + "\n")  # `echo x > file` leaves a newline
        monkeypatch.delenv(f"{ENV_PREFIX}{name.upper()}", raising=False)
        monkeypatch.setenv(f"{ENV_PREFIX}{name.upper()}{FILE_SUFFIX}", str(path))
    s = load_settings()
    assert s.summarizer_api_key is not None
    assert s.summarizer_api_key.get_secret_value() == "sk-from-file"
    assert s.redis_password is not None
    assert s.redis_password.get_secret_value() == "s3cret/+:@"
    assert s.redis_url == "redis://:s3cret%2F%2B%3A%40@store:6379/0"
    assert s.broker_url == "redis://:s3cret%2F%2B%3A%40@broker:6379/1"
    assert "sk-from-file" not in repr(s)


def test_the_password_reaches_redis_py_and_kombu_intact() -> None:
    from kombu.connection import Connection
    from redis.connection import parse_url

    url = with_password("redis://redis:6379/1", "p@ss:w/rd%")
    assert parse_url(url)["password"] == "p@ss:w/rd%"  # type: ignore[no-untyped-call]
    assert Connection(url).password == "p@ss:w/rd%"  # type: ignore[no-untyped-call]


@pytest.mark.parametrize(("url", "expected"), [
    ("redis://h:6379/0", "redis://:pw@h:6379/0"),
    ("redis://user@h/0", "redis://user:pw@h/0"),
    ("redis://:own@h/0", "redis://:own@h/0"),  # a URL's own password wins
    ("redis://a/1;redis://b/1", "redis://:pw@a/1;redis://:pw@b/1"),
    ("memory://", "memory://"),
])
def test_with_password(url: str, expected: str) -> None:
    assert with_password(url, "pw") == expected


def test_redact_url() -> None:
    assert redact_url("redis://:pw@h/0;rediss://u:pw@h2/1") == "redis://:***@h/0;rediss://u:***@h2/1"
    assert redact_url("redis://h/0") == "redis://h/0"


def test_both_the_variable_and_its_file_is_an_error(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "key").write_text("sk-file")
    monkeypatch.setenv("COMPACTION_SUMMARIZER_API_KEY", "sk-env")
    monkeypatch.setenv("COMPACTION_SUMMARIZER_API_KEY_FILE", str(tmp_path / "key"))
    with pytest.raises(ConfigError, match="COMPACTION_SUMMARIZER_API_KEY and "
                                          "COMPACTION_SUMMARIZER_API_KEY_FILE are both set"):
        load_settings()


def test_an_empty_secret_file_means_unset(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """So compose can mount an empty key file for the offline summarizer."""
    (tmp_path / "key").write_text("\n")
    monkeypatch.delenv("COMPACTION_SUMMARIZER_API_KEY", raising=False)
    monkeypatch.setenv("COMPACTION_SUMMARIZER_API_KEY_FILE", str(tmp_path / "key"))
    assert load_settings().summarizer_api_key is None


def test_an_unreadable_secret_names_the_variable_and_path_only(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        read_secret_file("COMPACTION_REDIS_PASSWORD_FILE", str(tmp_path))
    assert str(caught.value) == (f"COMPACTION_REDIS_PASSWORD_FILE={tmp_path}: cannot read the "
                                 "secret file: Is a directory")


def test_secret_values_are_redacted_in_errors() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(redis_password="hunter2", redis_url="redis://h:notaport/0")
    assert "hunter2" not in str(caught.value)
    assert "COMPACTION_REDIS_URL='redis://:***@h:notaport/0'" in str(caught.value)


# -- Flower's credentials file -------------------------------------------------------------
def test_flower_credentials_from_a_file(tmp_path: Path) -> None:
    (tmp_path / "auth").write_text("ops:correct-horse\n")
    env = credentials_environment({FILE_VAR: str(tmp_path / "auth"), "PATH": "/bin"})
    assert env == {"FLOWER_BASIC_AUTH": "ops:correct-horse", "PATH": "/bin"}


@pytest.mark.parametrize(("content", "message"), [
    ("", "the file is empty"),
    ("no-colon", "entry 1 must be user:password"),
])
def test_flower_refuses_a_bad_credentials_file(tmp_path: Path, content: str,
                                               message: str) -> None:
    (tmp_path / "auth").write_text(content)
    with pytest.raises(ConfigError, match=message):
        credentials_environment({FILE_VAR: str(tmp_path / "auth")})


def test_flower_refuses_both_credentials_sources(tmp_path: Path) -> None:
    (tmp_path / "auth").write_text("a:b")
    with pytest.raises(ConfigError, match="both set"):
        credentials_environment({FILE_VAR: str(tmp_path / "auth"), "FLOWER_BASIC_AUTH": "a:b"})


# -- typo warning --------------------------------------------------------------------------
def test_unknown_variables_get_the_closest_setting() -> None:
    environ = {"COMPACTION_TRIGER_RATIO": "0.7", "COMPACTION_ZZZ": "1",
               "COMPACTION_TRIGGER_RATIO": "0.8", "COMPACTION_SUMMARIZER_API_KEY_FILE": "/x",
               "COMPACTION_TEST_REDIS_URL": "redis://h/0", "OTHER": "1"}
    assert unknown_variables(environ) == [
        ("COMPACTION_TRIGER_RATIO", "COMPACTION_TRIGGER_RATIO"), ("COMPACTION_ZZZ", None)]


def test_the_warning_is_one_line_once_per_name() -> None:
    stream = io.StringIO()
    line = warn_unknown_variables({"COMPACTION_SUMARIZER": "openai"}, stream)
    assert line is not None and stream.getvalue() == line + "\n"
    assert "did you mean COMPACTION_SUMMARIZER?" in line
    assert warn_unknown_variables({"COMPACTION_SUMARIZER": "openai"}, stream) is None


def test_every_setting_and_file_variant_is_known() -> None:
    known = known_variables()
    assert {f"{ENV_PREFIX}{n.upper()}" for n in Settings.model_fields} <= known
    assert "COMPACTION_REDIS_PASSWORD_FILE" in known


# -- timing -----------------------------------------------------------------------------------
def test_a_visibility_timeout_below_the_longest_job_is_one_warning(own_redis_url: str) -> None:
    """A real worker: jobs outliving the visibility timeout are delivered twice (duplicated
    work), so the start says so in one line, and still starts (tests kill workers with a
    timeout of a few seconds on purpose)."""
    from workers.harness.stack.worker_process import WorkerProcess, worker_env

    env = worker_env(broker_url=own_redis_url, redis_url=own_redis_url, key_prefix="tvis",
                     broker_visibility_timeout="5")
    worker = WorkerProcess("vis", env, concurrency=1).start()
    worker.stop()
    warnings = [line for line in worker.log().splitlines() if "VISIBILITY_TIMEOUT" in line]
    assert warnings == [
        "warning: COMPACTION_BROKER_VISIBILITY_TIMEOUT=5 is below the longest job (180 s): "
        "a job still running after 5 s is delivered again and runs twice (unset, it is "
        "derived: 258 s)"], worker.log()
    env.pop("COMPACTION_BROKER_VISIBILITY_TIMEOUT")
    worker = WorkerProcess("vis2", env, concurrency=1).start()
    worker.stop()
    assert "VISIBILITY_TIMEOUT" not in worker.log()
