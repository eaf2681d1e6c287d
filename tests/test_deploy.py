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
from workers.settings import ENV_PREFIX, Settings

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "docker-compose.yml"
DOCKERFILE = DOCKER / "Dockerfile"
LOCK = DOCKER / "requirements.lock"
BUILD_LOCK = DOCKER / "build-requirements.lock"
PROCFILE = ROOT / "Procfile"
DOCKERIGNORE = ROOT / ".dockerignore"
AUTH = "ops:correct-horse-battery"
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
    env.setdefault("FLOWER_BASIC_AUTH", AUTH)
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
    """The compose file rendered once with only FLOWER_BASIC_AUTH set."""
    return _render(tmp_path_factory.mktemp("compose"))


@pytest.fixture
def services(rendered: dict[str, Any]) -> dict[str, Any]:
    services: dict[str, Any] = rendered["services"]
    return services


# ------------------------------------------------------------- compose file

def test_compose_file_validates(tmp_path: Path) -> None:
    done = _run_config(tmp_path, "-q", FLOWER_BASIC_AUTH=AUTH)
    assert done.returncode == 0, done.stderr
    assert set(_render(tmp_path)["services"]) == {"redis", "worker", "flower"}


@pytest.mark.parametrize("value", [None, ""])
def test_compose_refuses_to_render_without_flower_credentials(tmp_path: Path,
                                                              value: str | None) -> None:
    env = {} if value is None else {"FLOWER_BASIC_AUTH": value}
    done = _run_config(tmp_path, "-q", **env)
    assert done.returncode != 0
    assert "FLOWER_BASIC_AUTH" in done.stderr


def test_flower_credentials_are_mandatory_in_the_file_itself() -> None:
    flower = _raw()["services"]["flower"]
    value = _env(flower)["FLOWER_BASIC_AUTH"]
    # ${VAR:?msg} fails when VAR is unset or empty; ${VAR:-x} or ${VAR} would not.
    assert re.fullmatch(r"\$\{FLOWER_BASIC_AUTH:\?[^}]+\}", value), value


def test_flower_runs_behind_the_refusing_entry_point(services: dict[str, Any]) -> None:
    for name, service in services.items():
        argv = _argv(service)
        if "flower" in argv or any("flower" in a for a in argv):
            assert argv[:3] == ["python", "-m", "workers.flower_entry"], name
            assert not any(a.startswith(("--basic-auth", "--basic_auth")) for a in argv)
    flower_env = _env(services["flower"])
    assert flower_env["FLOWER_BASIC_AUTH"] == AUTH
    assert "FLOWER_UNAUTHENTICATED_API" not in flower_env


def test_flower_is_published_on_localhost_only_by_default(services: dict[str, Any]) -> None:
    assert _host_ips(services["flower"]) == ["127.0.0.1"]


def test_flower_healthcheck_uses_its_healthcheck_endpoint(services: dict[str, Any]) -> None:
    test = " ".join(services["flower"]["healthcheck"]["test"])
    assert "/healthcheck" in test


def test_redis_persists_with_aof_and_never_evicts(services: dict[str, Any]) -> None:
    redis = services["redis"]
    argv = _argv(redis)
    assert argv[0] == "redis-server"
    assert _option(argv, "--appendonly") == "yes"
    assert _option(argv, "--maxmemory-policy") == "noeviction"
    assert any(str(v).split(":")[1] == "/data" for v in redis["volumes"]), redis["volumes"]
    assert not redis.get("ports"), "the broker must not be published on the host"
    health = " ".join(redis["healthcheck"]["test"])
    assert "redis-cli ping" in health and "PONG" in health


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
    assert _option(argv, "-Q", "--queues") == "compaction"


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
    worker_env = _env(services["worker"])
    expected = {f"{ENV_PREFIX}{name.upper()}" for name in Settings.model_fields}
    assert expected <= set(worker_env), sorted(expected - set(worker_env))


def test_unset_settings_stay_unset_so_defaults_apply(services: dict[str, Any]) -> None:
    worker_env = _env(services["worker"])
    assert worker_env["COMPACTION_SUMMARIZER_API_KEY"] is None
    assert worker_env["COMPACTION_SUMMARIZER"] is None


def test_summarizer_key_reaches_the_worker_only(tmp_path: Path) -> None:
    services = _render(tmp_path, COMPACTION_SUMMARIZER="openai",
                       COMPACTION_SUMMARIZER_API_KEY="sk-test-123")["services"]
    worker, flower = _env(services["worker"]), _env(services["flower"])
    assert worker["COMPACTION_SUMMARIZER"] == "openai"
    assert worker["COMPACTION_SUMMARIZER_API_KEY"] == "sk-test-123"
    assert "COMPACTION_SUMMARIZER_API_KEY" not in flower
    assert "sk-test-123" not in str(services["redis"])


def test_no_secret_value_is_written_in_the_file() -> None:
    for name, service in _raw()["services"].items():
        for key, value in _env(service).items():
            if SECRET_NAME.search(key):
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
    assert _option(worker, "--pool", "-P") == "threads"
    assert not any(arg.startswith("REMAP_SIGTERM") for arg in worker)
    assert _option(worker, "--queues", "-Q") == "compaction"
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
