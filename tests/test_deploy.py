"""Deployment files: docker-compose.yml, Dockerfile, Procfile, the locks, the wheel.

There is no Docker engine in CI, so the compose file is checked the way
compose itself reads it (``docker-compose config`` renders it with the
environment interpolated) and the Dockerfile is checked as text. Without a
compose binary the compose tests are skipped with a message naming the apt
package (reported by ``-ra``); ``COMPACTION_REQUIRE_COMPOSE=1`` turns that into
a failure.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from workers.app import celery_config
from workers.cli.doctor import WORKER_COMMAND
from workers.settings import ENV_PREFIX, FILE_SUFFIX, Settings

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "docker-compose.yml"
DOCKERFILE = DOCKER / "Dockerfile"
LOCK = DOCKER / "requirements.lock"
BUILD_LOCK = DOCKER / "build-requirements.lock"
PROCFILE = ROOT / "Procfile"
DOCKERIGNORE = ROOT / ".dockerignore"
SECRETS = "/run/secrets/"
SECRET_NAME = re.compile(r"(API_KEY|SECRET|PASSWORD|PASSWD|TOKEN|BASIC_AUTH|CREDENTIAL)", re.I)


# ------------------------------------------------------------------ helpers

def _yaml() -> Any:
    try:
        import yaml
    except ImportError:
        pytest.fail("PyYAML is needed to read the compose file: pip install pyyaml "
                    "(it belongs in the dev extra)")
    return yaml


@cache
def _compose_binary() -> tuple[str, ...] | None:
    if shutil.which("docker-compose"):
        return ("docker-compose",)
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
        if probe.returncode == 0:
            return ("docker", "compose")
    return None


def _compose() -> tuple[str, ...]:
    binary = _compose_binary()
    if binary is None:
        if os.environ.get("COMPACTION_REQUIRE_COMPOSE") == "1":
            pytest.fail("docker-compose is not installed, so the compose file cannot be "
                        "validated: apt-get install -y docker-compose")
        pytest.skip("SKIPPED: docker-compose is not installed, the compose file was not "
                    "validated (apt-get install -y docker-compose; "
                    "COMPACTION_REQUIRE_COMPOSE=1 makes this a failure)")
    return binary


def _clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The caller's environment without anything compose would interpolate from it."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith((ENV_PREFIX, "FLOWER_", "REDIS_", "GOOGLE_"))}
    env.update(extra)
    env["HOME"] = str(tmp_path)  # no user-level docker config
    return env


def _run_config(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    empty = tmp_path / "empty.env"
    empty.write_text("")
    cmd = [*_compose(), "--env-file", str(empty), "-f", str(COMPOSE), "config", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False,
                          cwd=tmp_path, env=_clean_env(tmp_path, **env))


def _render(tmp_path: Path, **env: str) -> dict[str, Any]:
    done = _run_config(tmp_path, **env)
    assert done.returncode == 0, done.stderr
    rendered: dict[str, Any] = _yaml().safe_load(done.stdout)
    return rendered


def _raw() -> dict[str, Any]:
    """The file as written (anchors merged, nothing interpolated)."""
    raw: dict[str, Any] = _yaml().safe_load(COMPOSE.read_text())
    return raw


def _env(service: Mapping[str, Any]) -> dict[str, Any]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # compose also allows KEY=VALUE lists
        return dict(item.split("=", 1) if "=" in item else (item, None) for item in env)
    return dict(env)


def _argv(service: Mapping[str, Any]) -> list[str]:
    command = service.get("command") or []
    return command.split() if isinstance(command, str) else [str(c) for c in command]


def _host_ips(service: Mapping[str, Any]) -> list[str]:
    ips = []
    for port in service.get("ports", []):
        if isinstance(port, dict):  # compose v2's long form
            ips.append(str(port.get("host_ip", "")))
        else:
            parts = str(port).split(":")
            ips.append(parts[0] if len(parts) == 3 else "")
    return ips


def _seconds(duration: str) -> float:
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", str(duration)):
        total += float(number) * units[unit]
    return total


def _option(argv: list[str], *names: str) -> str | None:
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines: list[str] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    out = []
    for line in lines:
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _final_stage() -> list[tuple[str, str]]:
    instructions = _dockerfile_instructions()
    last_from = max(i for i, (word, _) in enumerate(instructions) if word == "FROM")
    return instructions[last_from:]


def _lock_pins(path: Path) -> dict[str, Version]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][A-Za-z0-9.+!-]*)", line)
        assert match, f"{path.name}: not an exact pin: {line!r}"
        name = canonicalize_name(match.group(1))
        assert name not in pins, f"{path.name}: {name} pinned twice"
        pins[name] = Version(match.group(2))
    return pins


@cache
def _lock_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lock_requirements",
                                                  DOCKER / "lock_requirements.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The compose file rendered once with none of the variables it reads set."""
    return _render(tmp_path_factory.mktemp("compose"))


@pytest.fixture
def services(rendered: dict[str, Any]) -> dict[str, Any]:
    services: dict[str, Any] = rendered["services"]
    return services


# ------------------------------------------------------------- compose file

def test_compose_file_validates(tmp_path: Path) -> None:
    done = _run_config(tmp_path, "-q")
    assert done.returncode == 0, done.stderr
    assert set(_render(tmp_path)["services"]) == {"redis", "worker", "flower", "server"}


def _secret_sources(service: Mapping[str, Any]) -> set[str]:
    return {s["source"] if isinstance(s, dict) else str(s) for s in service.get("secrets", [])}


def test_secrets_are_files_mounted_where_the_file_variables_point(
        rendered: dict[str, Any]) -> None:
    """Every *_FILE variable names a secret the service mounts; no secret is a variable."""
    assert set(rendered["secrets"]) == {"redis_password", "flower_basic_auth",
                                        "summarizer_api_key", "server_tokens"}
    for secret in rendered["secrets"].values():
        assert set(secret) == {"file"}, secret  # a host file, not an external or env secret
    for name, service in rendered["services"].items():
        env = _env(service)
        files = {key: str(value) for key, value in env.items() if key.endswith("_FILE")}
        assert all(path.startswith(SECRETS) for path in files.values()), (name, files)
        pointed = {path.removeprefix(SECRETS) for path in files.values()}
        assert pointed <= _secret_sources(service), name


def test_flower_gets_its_credentials_from_a_secret_file(services: dict[str, Any]) -> None:
    flower = services["flower"]
    env = _env(flower)
    assert env["FLOWER_BASIC_AUTH_FILE"] == SECRETS + "flower_basic_auth"
    assert "FLOWER_BASIC_AUTH" not in env and "FLOWER_UNAUTHENTICATED_API" not in env
    assert _secret_sources(flower) == {"flower_basic_auth", "redis_password"}


def test_flower_runs_behind_the_refusing_entry_point(services: dict[str, Any]) -> None:
    for name, service in services.items():
        argv = _argv(service)
        if "flower" in argv or any("flower" in a for a in argv):
            assert argv[:3] == ["python", "-m", "workers.flower_entry"], name
            assert not any(a.startswith(("--basic-auth", "--basic_auth")) for a in argv)


def test_flower_is_published_on_localhost_only_by_default(services: dict[str, Any]) -> None:
    assert _host_ips(services["flower"]) == ["127.0.0.1"]


def test_flower_healthcheck_uses_its_healthcheck_endpoint(services: dict[str, Any]) -> None:
    test = " ".join(services["flower"]["healthcheck"]["test"])
    assert "/healthcheck" in test


def _redis_server_argv(redis: Mapping[str, Any]) -> list[str]:
    """The redis-server line of the service's shell script (it reads the password first)."""
    argv = _argv(redis)
    assert argv[:2] == ["sh", "-c"], argv
    (line,) = [ln.strip() for ln in argv[2].splitlines()
               if ln.strip().startswith("exec redis-server")]
    return line.split("<<")[0].split()[1:]


def test_redis_persists_with_aof_and_never_evicts(services: dict[str, Any]) -> None:
    redis = services["redis"]
    argv = _redis_server_argv(redis)
    assert argv[0] == "redis-server"
    assert _option(argv, "--appendonly") == "yes"
    assert _option(argv, "--maxmemory-policy") == "noeviction"
    assert _option(argv, "--maxmemory") == "1gb"
    assert any(str(v).split(":")[1] == "/data" for v in redis["volumes"]), redis["volumes"]
    assert not redis.get("ports"), "the broker must not be published on the host"
    health = " ".join(redis["healthcheck"]["test"])
    assert "redis-cli ping" in health and "PONG" in health


def test_redis_requires_the_password_from_its_secret(services: dict[str, Any]) -> None:
    """requirepass arrives on stdin (not argv); the health check authenticates the same way."""
    redis = services["redis"]
    script = _argv(redis)[2].replace("$$", "$")  # `config` may print compose's escape
    assert "cat /run/secrets/redis_password" in script
    assert "exec redis-server - " in script and "requirepass $password" in script
    assert "requirepass" not in " ".join(_redis_server_argv(redis))
    assert "REDISCLI_AUTH=" in " ".join(redis["healthcheck"]["test"])
    assert _secret_sources(redis) == {"redis_password"}
    for name in ("worker", "flower"):
        env = _env(services[name])
        assert env["COMPACTION_REDIS_PASSWORD_FILE"] == SECRETS + "redis_password", name
        assert "redis_password" in _secret_sources(services[name]), name
        for key in ("COMPACTION_REDIS_URL", "COMPACTION_BROKER_URL"):
            assert "@" not in str(env.get(key, "")), (name, key)  # the password is joined in


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs a redis-server binary")
def test_the_redis_script_starts_a_redis_that_requires_the_password(tmp_path: Path) -> None:
    """Run the service's script with a local redis-server (no Docker engine here)."""
    import redis as redis_py

    from workers.settings import load_settings

    script = _argv(_render(tmp_path)["services"]["redis"])[2].replace("$$", "$")
    secret = tmp_path / "redis_password"
    secret.write_text("s3cret-pw\n")
    port = _free_port()
    script = script.replace("/run/secrets/redis_password", str(secret)).replace(
        "exec redis-server - ", f"exec redis-server - --port {port} --dir {tmp_path} "
        "--bind 127.0.0.1 --save '' ")
    server = subprocess.Popen(["sh", "-c", script], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE)
    try:
        url = f"redis://127.0.0.1:{port}/0"
        _wait_for_port(port)
        with pytest.raises(redis_py.AuthenticationError):
            redis_py.Redis.from_url(url).ping()
        settings = load_settings(redis_url=url, redis_password="s3cret-pw")
        assert redis_py.Redis.from_url(settings.redis_url).ping()
        assert "s3cret-pw" not in Path(f"/proc/{server.pid}/cmdline").read_text()
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_the_redis_script_refuses_a_password_urls_would_mangle(tmp_path: Path) -> None:
    script = _argv(_render(tmp_path)["services"]["redis"])[2].replace("$$", "$")
    secret = tmp_path / "redis_password"
    secret.write_text("has space@")
    script = script.replace("/run/secrets/redis_password", str(secret)).replace(
        "exec redis-server", "exec false")
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=10,
                          check=False)
    assert done.returncode == 1 and "redis_password secret must" in done.stderr


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_for_port(port: int, timeout: float = 10.0) -> None:
    import socket
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    pytest.fail(f"redis-server did not listen on {port}")


def test_every_service_is_limited_restarted_and_not_root(services: dict[str, Any]) -> None:
    for name, service in services.items():
        assert float(service["cpus"]) > 0, name
        assert service["mem_limit"], name
        assert int(service["pids_limit"]) > 0, name
        assert service["restart"] in ("unless-stopped", "always", "on-failure"), name
        user = str(service["user"]).split(":")[0]
        assert user not in ("", "0", "root"), name
        assert service["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in service["security_opt"], name


def test_redis_memory_limit_leaves_room_above_maxmemory(services: dict[str, Any]) -> None:
    limit = str(services["redis"]["mem_limit"]).lower()
    units = {"k": 2**10, "m": 2**20, "g": 2**30}
    limit_bytes = int(float(limit[:-1]) * units[limit[-1]]) if limit[-1] in units else int(limit)
    assert limit_bytes >= 1.5 * 2**30  # maxmemory 1gb + the AOF rewrite's fork


def test_third_party_images_are_pinned_to_an_exact_version(services: dict[str, Any]) -> None:
    digest = r"@sha256:[0-9a-f]{64}"
    exact = re.compile(rf"[^:@]+:\d+\.\d+\.\d+[^@]*({digest})?|[^@]+{digest}")
    for name, service in services.items():
        if "build" in service:
            continue  # built from this repository
        assert exact.fullmatch(service["image"]), (name, service["image"])
    args = [a for word, a in _dockerfile_instructions() if word == "ARG"]
    (base,) = [a.split("=", 1)[1] for a in args if a.startswith("PYTHON_IMAGE=")]
    assert exact.fullmatch(base), base


def test_store_and_broker_are_separate_databases(services: dict[str, Any]) -> None:
    worker, flower = _env(services["worker"]), _env(services["flower"])
    store, broker = worker["COMPACTION_REDIS_URL"], worker["COMPACTION_BROKER_URL"]
    assert store.startswith("redis://redis:") and broker.startswith("redis://redis:")
    assert store != broker
    assert flower["COMPACTION_BROKER_URL"] == broker


def test_worker_scales_without_fixed_names_or_ports(services: dict[str, Any]) -> None:
    worker = services["worker"]
    assert "container_name" not in worker
    assert not worker.get("ports")
    assert "hostname" not in worker  # every replica needs its own Celery node name


def test_worker_command(services: dict[str, Any]) -> None:
    argv = _argv(services["worker"])
    assert argv[:4] == ["celery", "-A", "workers.app", "worker"]
    assert _option(argv, "--pool", "-P") == "threads"
    assert _option(argv, "--concurrency", "-c") == "32"
    assert _option(argv, "-Q", "--queues") is None  # COMPACTION_QUEUE, the app's default
    assert _option(argv, "--loglevel", "-l") == "INFO"
    assert "-E" in argv or "--task-events" in argv  # task events for Flower


def _worker_shape(argv: list[str]) -> dict[str, str | None]:
    """What a worker command means, independent of option spelling and order."""
    return {"app": _option(argv, "-A", "--app"), "pool": _option(argv, "--pool", "-P"),
            "concurrency": _option(argv, "--concurrency", "-c"),
            "queues": _option(argv, "--queues", "-Q"),
            "loglevel": (_option(argv, "--loglevel", "-l") or "").upper() or None,
            "events": "yes" if ("-E" in argv or "--task-events" in argv) else None,
            "subcommand": argv[3] if len(argv) > 3 else None}


def test_the_documented_worker_commands_are_one_command(services: dict[str, Any]) -> None:
    """README, Procfile, compose and the image's default command start the same worker."""
    readme = (ROOT / "README.md").read_text()
    documented = re.findall(r"`(celery -A workers\.app worker[^`]*)`", readme)
    assert documented, "README names no worker command"
    (cmd,) = [args for word, args in _final_stage() if word == "CMD"]
    commands = {
        "compose": _argv(services["worker"]),
        "Procfile": _procfile()["worker"].split(),
        "Dockerfile": [str(a) for a in json.loads(cmd)],
        **{f"README {i}": c.split() for i, c in enumerate(documented)},
        "compaction doctor's hint": WORKER_COMMAND.split(),
    }
    shapes = {where: _worker_shape(argv) for where, argv in commands.items()}
    expected = {"app": "workers.app", "pool": "threads", "concurrency": "32",
                "queues": None, "loglevel": "INFO", "events": "yes",
                "subcommand": "worker"}
    for where, shape in shapes.items():
        assert shape == expected, (where, commands[where])


def test_worker_stop_grace_outlasts_soft_shutdown_and_one_llm_call(
        services: dict[str, Any]) -> None:
    """docker stop is a warm shutdown: running jobs get the grace period to finish."""
    settings = Settings()
    soft = float(celery_config(settings)["worker_soft_shutdown_timeout"])
    grace = _seconds(services["worker"]["stop_grace_period"])
    assert grace > soft + 5, (grace, soft)
    assert grace > settings.summarizer_timeout, (grace, settings.summarizer_timeout)


def test_services_wait_for_a_healthy_redis(services: dict[str, Any]) -> None:
    for name in ("worker", "flower"):
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy", name


def test_every_setting_is_passed_through_to_the_worker(services: dict[str, Any]) -> None:
    """Secrets as their *_FILE variant (a file), every other setting by name."""
    worker_env = _env(services["worker"])
    missing = []
    for name in Settings.model_fields:
        variable = f"{ENV_PREFIX}{name.upper()}"
        if variable not in worker_env and f"{variable}{FILE_SUFFIX}" not in worker_env:
            missing.append(variable)
    assert not missing, missing


def test_unset_settings_stay_unset_so_defaults_apply(services: dict[str, Any]) -> None:
    worker_env = _env(services["worker"])
    assert worker_env["COMPACTION_SUMMARIZER"] is None
    assert worker_env["COMPACTION_TRIGGER_RATIO"] is None


def test_summarizer_key_reaches_the_worker_only(tmp_path: Path) -> None:
    services = _render(tmp_path, COMPACTION_SUMMARIZER="openai",
                       COMPACTION_SUMMARIZER_API_KEY="sk-test-123")["services"]
    worker, flower = _env(services["worker"]), _env(services["flower"])
    assert worker["COMPACTION_SUMMARIZER"] == "openai"
    # Only as a file: a key in the shell is not passed into any container.
    assert worker["COMPACTION_SUMMARIZER_API_KEY_FILE"] == SECRETS + "summarizer_api_key"
    assert "summarizer_api_key" in _secret_sources(services["worker"])
    assert "summarizer_api_key" not in _secret_sources(services["flower"])
    assert not any(k.startswith("COMPACTION_SUMMARIZER_API_KEY") for k in flower)
    assert "sk-test-123" not in str(services)


def test_no_secret_value_is_written_in_the_file() -> None:
    for name, service in _raw()["services"].items():
        for key, value in _env(service).items():
            if key.endswith("_FILE"):
                assert str(value).startswith(SECRETS), (name, key)
            elif SECRET_NAME.search(key):
                assert value is None or str(value).startswith("${"), (name, key)


# ------------------------------------------------------------------ Procfile

def _procfile() -> dict[str, str]:
    entries = {}
    for line in PROCFILE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, command = line.partition(":")
            entries[name.strip()] = command.strip()
    return entries


def test_procfile_has_worker_and_flower() -> None:
    entries = _procfile()
    assert {"worker", "flower"} <= set(entries)
    worker = entries["worker"].split()
    assert worker[:4] == ["celery", "-A", "workers.app", "worker"]
    assert _option(worker, "--loglevel", "-l") == "INFO" and "-E" in worker
    assert _option(worker, "--pool", "-P") == "threads"
    assert not any(arg.startswith("REMAP_SIGTERM") for arg in worker)
    assert _option(worker, "--queues", "-Q") is None
    flower = entries["flower"].split()
    assert flower[:3] == ["python", "-m", "workers.flower_entry"]
    assert not any("basic" in arg for arg in flower)


# ---------------------------------------------------------------- Dockerfile

def test_dockerfile_runs_as_a_non_root_user() -> None:
    users = [args for word, args in _final_stage() if word == "USER"]
    assert users, "the runtime stage has no USER"
    user = users[-1].split(":")[0]
    assert user not in {"root", "0"}


def test_dockerfile_runtime_settings() -> None:
    final = _final_stage()
    env = " ".join(args for word, args in final if word == "ENV")
    assert "PYTHONUNBUFFERED=1" in env
    # The threads pool cannot cancel jobs, so SIGTERM must stay a warm shutdown
    # (see the comment in the Dockerfile and tests/test_flower.py's stop check).
    command = " ".join(args for word, args in final if word == "CMD")
    if "threads" in command:
        assert "REMAP_SIGTERM" not in env
    health = [args for word, args in final if word == "HEALTHCHECK"]
    assert health and "CMD" in health[0] and "ping" in health[0]
    assert any(word == "CMD" for word, _ in final)


def test_dockerfile_bakes_in_no_secret() -> None:
    for word, args in _dockerfile_instructions():
        if word in {"ENV", "ARG", "LABEL"}:
            for name in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*=", args) or args.split()[:1]:
                assert not SECRET_NAME.search(name), f"{word} {args}"
        if word == "COPY":
            assert ".env" not in args.split()


def test_dockerfile_installs_only_pinned_dependencies() -> None:
    runs = [args for word, args in _dockerfile_instructions() if word == "RUN"]
    installs = [cmd.strip() for run in runs for cmd in run.split("&&") if " install " in cmd]
    assert installs
    for cmd in installs:
        assert "--no-deps" in cmd, cmd
        assert re.search(r"-r \S*requirements\.lock|/tmp/dist/\*\.whl", cmd), cmd
    assert any(cmd.strip().endswith(" check") for run in runs for cmd in run.split("&&"))
    copied = " ".join(args for word, args in _dockerfile_instructions() if word == "COPY")
    for lock in (LOCK, BUILD_LOCK):
        assert f"docker/{lock.name}" in copied
        assert lock.exists()


def test_dockerignore_admits_exactly_what_the_dockerfile_copies() -> None:
    lines = [ln.strip() for ln in DOCKERIGNORE.read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert lines[0] == "*", "an allow-list keeps .env files and virtualenvs out of the context"
    allowed = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    for word, args in _dockerfile_instructions():
        if word != "COPY" or "--from=" in args:
            continue
        sources = [a for a in args.split() if not a.startswith("--")][:-1]
        for source in sources:
            assert source.rstrip("/") in allowed, source
    assert not any(".env" in a or ".venv" in a for a in allowed)


# --------------------------------------------------------------------- locks

def test_lock_pins_satisfy_the_project_requirements() -> None:
    tool = _lock_tool()
    pins = _lock_pins(LOCK)
    for req in tool.root_requirements(ROOT / "pyproject.toml", tool.DEFAULT_EXTRAS):
        name = canonicalize_name(req.name)
        assert name in pins, f"{req} is not in {LOCK.name}"
        assert req.specifier.contains(pins[name], prereleases=True), (str(req), pins[name])
    assert "context-compaction" not in pins


def _parse_pins(text: str) -> dict[str, Version]:
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = Version(version)
    return pins


def lock_disagreements(pyproject: str, lock: str) -> list[str]:
    """What the lock misses or pins outside pyproject's runtime requirements.

    Runtime: ``[project].dependencies`` plus the image's extras; a
    requirement's own extras (``redis[hiredis]``) are expanded through the
    installed package's metadata, the only place that says what they add.
    """
    from importlib import metadata

    project = tomllib.loads(pyproject)["project"]
    optional = project.get("optional-dependencies", {})
    lines = list(project.get("dependencies", []))
    for extra in _lock_tool().DEFAULT_EXTRAS:
        lines.extend(optional[extra])
    pins = _parse_pins(lock)
    problems = []
    todo = [(Requirement(line), "pyproject.toml") for line in lines]
    while todo:
        req, why = todo.pop()
        name = canonicalize_name(req.name)
        if name not in pins:
            problems.append(f"{req} ({why}) is not pinned")
            continue
        if not req.specifier.contains(pins[name], prereleases=True):
            problems.append(f"{name}=={pins[name]} does not satisfy {req} ({why})")
        if req.extras:
            try:
                requires = metadata.distribution(req.name).requires or []
            except metadata.PackageNotFoundError:
                problems.append(f"{req.name} is not installed: cannot expand {req}")
                continue
            for line in requires:
                child = Requirement(line)
                marker = child.marker
                if marker is not None and any(marker.evaluate({"extra": e}) for e in req.extras) \
                        and not marker.evaluate({"extra": ""}):
                    todo.append((child, f"extra of {req}"))
    return problems


def test_every_runtime_requirement_with_its_extras_is_pinned_in_the_lock() -> None:
    problems = lock_disagreements((ROOT / "pyproject.toml").read_text(), LOCK.read_text())
    assert not problems, ("docker/requirements.lock disagrees with pyproject.toml "
                          f"(regenerate: .venv/bin/python docker/lock_requirements.py): {problems}")


def test_the_lock_check_catches_a_missing_extra_and_a_pin_out_of_range() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    lock = LOCK.read_text()
    without_hiredis = "\n".join(ln for ln in lock.splitlines() if not ln.startswith("hiredis=="))
    assert any("hiredis" in p and "not pinned" in p
               for p in lock_disagreements(pyproject, without_hiredis))
    old_celery = re.sub(r"(?m)^celery==.*$", "celery==4.4.7", lock)
    assert any(p.startswith("celery==4.4.7 does not satisfy")
               for p in lock_disagreements(pyproject, old_celery))


def test_lock_is_closed_where_the_environment_matches_it() -> None:
    """Each pinned package's own requirements are pinned too (checked via installed metadata)."""
    from importlib import metadata

    tool = _lock_tool()
    pins = _lock_pins(LOCK)
    checked = 0
    for name, version in pins.items():
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        if Version(dist.version) != version:
            continue
        checked += 1
        for line in dist.requires or []:
            req = Requirement(line)
            if not tool.marker_applies(req.marker, ()):
                continue
            child = canonicalize_name(req.name)
            assert child in pins, f"{name} {version} needs {req}, which is not pinned"
            assert req.specifier.contains(pins[child], prereleases=True), (name, str(req))
    if checked < len(pins) // 2:
        pytest.fail(f"only {checked}/{len(pins)} pins match the installed environment: "
                    "regenerate with .venv/bin/python docker/lock_requirements.py")


def test_build_lock_can_build_this_pyproject() -> None:
    pins = _lock_pins(BUILD_LOCK)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for line in project["build-system"]["requires"]:
        req = Requirement(line)
        name = canonicalize_name(req.name)
        assert name in pins and req.specifier.contains(pins[name]), str(req)
    if isinstance(project["project"].get("license"), str):
        # An SPDX string (PEP 639) needs setuptools >= 77.
        assert pins["setuptools"] >= Version("77")


# --------------------------------------------------------------------- wheel

def _context_copy(dest: Path) -> None:
    """The Docker build context as the allow-list admits it (sources only)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    for package in ("shared", "workers"):
        shutil.copytree(ROOT / package, dest / package, ignore=ignore)


def _package_files() -> Iterator[str]:
    for package in ("shared", "workers"):
        for path in (ROOT / package).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                yield path.relative_to(ROOT).as_posix()


@pytest.mark.slow
def test_the_wheel_carries_every_file_the_image_needs(tmp_path: Path) -> None:
    """The image runs `pip install --no-deps .`: data files missing from the wheel break it.

    Builds the wheel the way pip does in the Dockerfile, from a copy of the
    build context, and compares it with the source tree.
    """
    src = tmp_path / "src"
    src.mkdir()
    _context_copy(src)
    out = tmp_path / "dist"
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "--wheel-dir", str(out),
           str(src)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, f"wheel build failed (needs PyPI for setuptools):\n{done.stderr}"
    (wheel,) = out.glob("*.whl")
    inside = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(set(_package_files()) - inside)
    assert not missing, ("files the code ships but the wheel lacks (fix "
                         f"[tool.setuptools.package-data] in pyproject.toml): {missing}")
