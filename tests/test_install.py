"""A fresh install with no extras: every public module imports, every command's --help runs.

This is the newcomer's first step (``pip install context-compaction``), so
it runs in a new virtual environment holding only the required
dependencies: an optional dependency (openai, google-genai, tiktoken,
flower, fakeredis) imported at module level anywhere in ``shared`` or in
what ``compaction`` loads fails here, not on a user's machine. pip's cache
makes the install take seconds to half a minute; it is marked slow but
never skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from workers.cli.main import COMMANDS

ROOT = Path(__file__).resolve().parents[1]

# Modules whose documented purpose is an optional extra, with the extra and the
# top-level module it installs. Only these may fail to import without extras, and
# each must fail for exactly that reason (so the list stays honest).
OPTIONAL_MODULES = {
    # the replay harness drives a fake provider through the openai SDK (README: replay)
    "workers.harness.replay.run": ("openai", "openai"),
    "workers.harness.replay.runner": ("openai", "openai"),
    # framework adapters: each is the shell of one framework (README: framework adapters)
    "shared.integrations.langchain": ("langchain", "langchain"),
    "shared.integrations.langchain_messages": ("langchain", "langchain_core"),
    "shared.integrations.pydantic_ai": ("pydantic-ai", "pydantic_ai"),
    "shared.integrations.pydantic_ai_parts": ("pydantic-ai", "pydantic_ai"),
    "shared.integrations.agents_sdk": ("openai-agents", "agents"),
    "shared.integrations.agents_run": ("openai-agents", "agents"),
    # the HTTP service (README: compaction serve)
    "workers.server.app": ("server", "fastapi"),
    "workers.server.routes": ("server", "fastapi"),
    "workers.server.main": ("server", "fastapi"),
}

WALK = """
import importlib, json, pkgutil, sys
optional = set(json.loads(sys.argv[1]))
failures, optional_errors, imported = {}, {}, []
for package in ("shared", "workers"):
    root = importlib.import_module(package)
    names = [package] + [m.name for m in pkgutil.walk_packages(root.__path__, package + ".")]
    for name in names:
        try:
            importlib.import_module(name)
            imported.append(name)
        except ModuleNotFoundError as exc:
            (optional_errors if name in optional else failures)[name] = exc.name or str(exc)
        except Exception as exc:
            failures[name] = f"{type(exc).__name__}: {exc}"
heavy = sorted(m for m in sys.modules if m.split(".")[0] in
               ("openai", "google", "tiktoken", "flower", "fakeredis", "langchain"))
print(json.dumps({"failures": failures, "optional": optional_errors,
                  "imported": imported, "heavy": heavy}))
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("COMPACTION_", "PYTHON", "VIRTUAL_ENV"))}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A new venv with the package installed (editable) and no extras."""
    path = tmp_path_factory.mktemp("bare") / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(path)
    done = subprocess.run(
        [str(path / "bin" / "python"), "-m", "pip", "install", "-q", "-e", str(ROOT)],
        capture_output=True, text=True, env=_env(), timeout=900, check=False)
    assert done.returncode == 0, f"pip install failed:\n{done.stdout}\n{done.stderr}"
    yield path


def run(venv_path: Path, *argv: str, cwd: Path | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*argv], capture_output=True, text=True, timeout=120,
                          cwd=cwd or venv_path.parent, check=False,
                          env={**_env(), **(env or {}),
                               "PATH": f"{venv_path / 'bin'}:{os.environ['PATH']}"})


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_no_extra_is_installed(bare_venv: Path) -> None:
    listed = run(bare_venv, str(bare_venv / "bin" / "python"), "-m", "pip", "list",
                 "--format=json")
    names = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert not names & {"openai", "google-genai", "tiktoken", "flower", "fakeredis"}, names


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_every_public_module_imports_without_extras(bare_venv: Path) -> None:
    done = run(bare_venv, str(bare_venv / "bin" / "python"), "-c", WALK,
               json.dumps(sorted(OPTIONAL_MODULES)))
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["failures"] == {}, found["failures"]
    # each optional module fails for its own extra, and no other
    expected = {name: top for name, (_extra, top) in OPTIONAL_MODULES.items()}
    assert {k: v.split(".")[0] for k, v in found["optional"].items()} == expected
    assert "shared" in found["imported"] and "workers.cli.main" in found["imported"]
    assert len(found["imported"]) > 50
    assert found["heavy"] == []


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_compaction_help_and_every_commands_help(bare_venv: Path) -> None:
    script = str(bare_venv / "bin" / "compaction")
    argvs = [["--help"], ["--version"], *([name, "--help"] for name in COMMANDS)]
    # One interpreter start-up per command line: run a few at a time.
    with ThreadPoolExecutor(max_workers=4) as pool:
        runs = list(pool.map(lambda argv: run(bare_venv, script, *argv), argvs))
    for argv, done in zip(argvs, runs, strict=True):
        assert done.returncode == 0, (argv, done.stderr)
        assert done.stderr == "", (argv, done.stderr)
        assert "Traceback" not in done.stdout
    assert runs[argvs.index(["--version"])].stdout.startswith("compaction ")


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_command_needing_an_extra_says_which_in_one_line(bare_venv: Path) -> None:
    script = str(bare_venv / "bin" / "compaction")
    done = run(bare_venv, script, "replay", "sessions.jsonl", "--window", "8000")
    assert done.returncode == 2
    assert done.stderr == ("compaction: error: replay needs the 'openai' extra: "
                           "pip install 'context-compaction[openai]'\n")
    done = run(bare_venv, script, "demo", "--turns", "2")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("compaction: error: ")
    assert "context-compaction[embedded]" in lines[0]
    # the servers: the same one line, with the prefix every other error has, before
    # anything connects (no Redis listens on port 1: the extra is what is missing)
    nowhere = {"COMPACTION_REDIS_URL": "redis://127.0.0.1:1/0"}
    for argv, extra in ((["serve"], "server"), (["mcp"], "mcp")):
        done = run(bare_venv, script, *argv, env=nowhere)
        assert (done.returncode, done.stderr) == (2, (
            f"compaction: error: {argv[0]} needs the '{extra}' extra: "
            f"pip install 'context-compaction[{extra}]'\n")), argv


def test_optional_modules_list_names_real_modules() -> None:
    """The list above must not rot: each entry is a module of this repository."""
    for name in OPTIONAL_MODULES:
        path = ROOT / (name.replace(".", "/") + ".py")
        assert path.exists(), name
    assert sys.version_info >= (3, 11)
