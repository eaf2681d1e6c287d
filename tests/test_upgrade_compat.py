"""Rolling upgrade from yesterday's build (02f23f1), with its REAL code: scenarios a-c of
``scripts/upgrade_check.py`` (new guards + old workers, old guards + new workers, a
session's turns alternating between an old and a new guard), short. docs/upgrading.md
promises these run together; any finding of the check fails the test."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = [pytest.mark.celery, pytest.mark.slow, pytest.mark.redis]

ROOT = Path(__file__).resolve().parents[1]
OLD = "02f23f1"
ROUNDS = 16  # turns per session: each becomes due (~10 turns) and is compacted


def _check_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("upgrade_check",
                                                  ROOT / "scripts" / "upgrade_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_yesterdays_build_runs_beside_this_one(tmp_path: Path) -> None:
    # .ci/run tests a copy of the tracked files (no .git): it names the checkout
    repo = Path(os.environ.get("UPGRADE_CHECK_REPO", ROOT))
    check = _check_module()
    if not check.has_commit(OLD, repo):
        pytest.fail(f"commit {OLD} is not in the history of {repo}, so the upgrade check "
                    "cannot run the old code: clone with history (`git fetch --unshallow`), "
                    "or name a clone that has it in UPGRADE_CHECK_REPO", pytrace=False)
    results = check.run_check(OLD, 0.1, "abc", tmp_path, repo=repo, rounds=ROUNDS)
    assert set(results) == {"a", "b", "c"}
    for name, r in results.items():
        assert r["findings"] == [], (name, r["findings"], f"logs in {tmp_path}")
        assert r["turns"] == r["views"] == r["sessions"] * ROUNDS, (name, r)
        assert r["compacted"] == r["sessions"], (name, r)  # every session became due
        assert r["retries"] > 0, (name, r)
        # the old and new workers' jobs all ended (none failed: that is a finding)
        assert sum(sum(t.values()) for t in r["jobs"].values()) > 0, (name, r["jobs"])
    mixed = results["c"]["jobs"]
    assert any("old" in w for w in mixed) and any("new" in w for w in mixed), mixed
