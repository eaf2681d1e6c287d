"""The tree's layers hold: the core does no I/O, the runtime ships no harness.

Each check runs in a fresh interpreter, because ``sys.modules`` of the test
process already holds everything.
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import shared.core

ROOT = Path(__file__).resolve().parents[1]

# Libraries the core must load without: I/O clients, task queues, provider SDKs.
IO_LIBRARIES = ("redis", "hiredis", "celery", "kombu", "fakeredis", "openai", "google",
                "tiktoken", "httpx", "flower")


def run_isolated(code: str) -> dict[str, object]:
    """Run ``code`` in a new interpreter; it prints one JSON object last."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def core_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(shared.core.__path__, "shared.core."))


def test_core_and_package_load_with_every_io_library_blocked() -> None:
    result = run_isolated(f"""
        import importlib, json, sys
        BLOCKED = {IO_LIBRARIES!r}
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError(f"blocked: {{name}}")
                return None
        sys.meta_path.insert(0, Block())
        import shared
        loaded = []
        for name in {core_modules()!r}:
            importlib.import_module(name)
            loaded.append(name)
        # core names re-exported by the package resolve without I/O libraries too
        shared.Message, shared.check_budget, shared.emergency_truncate, shared.to_gemini
        print(json.dumps({{"loaded": loaded}}))
    """)
    assert result["loaded"] == core_modules()
    assert len(core_modules()) >= 20


def test_import_shared_loads_no_io_library() -> None:
    result = run_isolated(f"""
        import json, sys
        import shared
        print(json.dumps({{"io": sorted(m for m in sys.modules
                                        if m.split(".")[0] in {IO_LIBRARIES!r})}}))
    """)
    assert result["io"] == []


def test_the_worker_runtime_never_loads_the_harness_or_the_cli() -> None:
    result = run_isolated("""
        import json, sys
        import workers.app, workers.tasks
        app = workers.app.app
        app.loader.import_default_modules()
        print(json.dumps({"bad": sorted(m for m in sys.modules
                                        if m.startswith(("workers.harness", "workers.cli")))}))
    """)
    assert result["bad"] == []


def test_the_core_imports_nothing_outside_the_core() -> None:
    offenders = []
    for path in sorted((ROOT / "shared" / "core").rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            stripped = line.strip()
            if stripped.startswith(("from shared", "import shared")) and not (
                    stripped.startswith(("from shared.core", "import shared.core"))):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {stripped}")
    assert not offenders


def test_shared_never_imports_workers() -> None:
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "shared").rglob("*.py")
                 if "import workers" in p.read_text() or "from workers" in p.read_text()]
    assert not offenders
