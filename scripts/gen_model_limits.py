"""Generate shared/core/data/model_limits.json from the model registry shipped inside litellm.

litellm's ``model_prices_and_context_window.json`` is the most complete public
table of context windows, but depending on litellm at runtime would pull a
large package into the agent's hot path. This script downloads the litellm
wheel with ``pip download --no-deps`` into a temporary directory, reads the
JSON straight out of the wheel (a zip) without installing or importing
litellm, keeps chat / completion / responses models only (no image, embedding,
audio, rerank...) and writes a compact, sorted file with a header naming the
litellm version and the date.

Usage::

    python scripts/gen_model_limits.py                     # latest litellm from PyPI
    python scripts/gen_model_limits.py --version 1.109.1   # a pinned release
    python scripts/gen_model_limits.py --wheel litellm-....whl   # offline, a wheel at hand
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REGISTRY_NAMES = (
    "litellm/model_prices_and_context_window_backup.json",
    "litellm/model_prices_and_context_window.json",
)
KEPT_MODES = frozenset({"chat", "completion", "responses"})
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "shared" / "core" / "data" / "model_limits.json"


def download_wheel(dest: Path, version: str | None) -> Path:
    """``pip download litellm --no-deps`` into ``dest``; returns the wheel's path."""
    spec = f"litellm=={version}" if version else "litellm"
    cmd = [sys.executable, "-m", "pip", "download", spec, "--no-deps", "--only-binary=:all:",
           "--quiet", "-d", str(dest)]
    subprocess.run(cmd, check=True)
    wheels = sorted(dest.glob("litellm-*.whl"))
    if not wheels:
        raise SystemExit(f"pip download produced no litellm wheel in {dest}")
    return wheels[-1]


def read_registry(wheel: Path) -> tuple[dict[str, Any], str]:
    """The registry JSON and the litellm version, read from the wheel without installing it."""
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        member = next((n for n in REGISTRY_NAMES if n in names), None)
        if member is None:
            raise SystemExit(f"{wheel.name} holds none of {', '.join(REGISTRY_NAMES)}")
        data = json.loads(zf.read(member))
        version = _wheel_version(zf, wheel.name)
    if not isinstance(data, dict):
        raise SystemExit(f"{member} is not a JSON object")
    return data, version


def _wheel_version(zf: zipfile.ZipFile, filename: str) -> str:
    for name in zf.namelist():
        if name.endswith(".dist-info/METADATA"):
            match = re.search(r"^Version: (\S+)$", zf.read(name).decode("utf-8", "replace"), re.M)
            if match:
                return match.group(1)
    return filename.split("-")[1]


def _positive_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and value > 0 else None


def select_models(registry: Mapping[str, Any]) -> dict[str, list[Any]]:
    """``key -> [context_window, max_output_tokens or null, litellm_provider]``, chat-like only.

    The window is litellm's ``max_input_tokens`` (``max_tokens`` for old
    entries that lack it); entries with neither are dropped.
    """
    models: dict[str, list[Any]] = {}
    for key, spec in registry.items():
        if not isinstance(spec, Mapping) or spec.get("mode") not in KEPT_MODES:
            continue
        window = _positive_int(spec.get("max_input_tokens"))
        window = window or _positive_int(spec.get("max_tokens"))
        if window is None:
            continue
        provider = spec.get("litellm_provider")
        models[key] = [
            window,
            _positive_int(spec.get("max_output_tokens")),
            provider if isinstance(provider, str) else "",
        ]
    return dict(sorted(models.items()))


def render(models: Mapping[str, list[Any]], version: str, today: dt.date) -> str:
    """Compact JSON, one model per line so that regenerations diff well."""
    meta = {
        "source": f"litellm {version} model_prices_and_context_window.json (PyPI wheel)",
        "litellm_version": version,
        "generated": today.isoformat(),
        "generator": "scripts/gen_model_limits.py",
        "modes": sorted(KEPT_MODES),
        "fields": ["context_window", "max_output_tokens", "litellm_provider"],
        "count": len(models),
    }
    lines = [json.dumps(k) + ":" + json.dumps(v, separators=(",", ":")) for k, v in models.items()]
    return ('{"_meta":' + json.dumps(meta, separators=(",", ":")) + ',\n"models":{\n'
            + ",\n".join(lines) + "\n}}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", help="litellm release to download (default: latest)")
    parser.add_argument("--wheel", type=Path, help="use this litellm wheel instead of downloading")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output JSON path")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="litellm-wheel-") as tmp:
        wheel = args.wheel or download_wheel(Path(tmp), args.version)
        registry, version = read_registry(wheel)
    models = select_models(registry)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(models, version, dt.date.today()), encoding="utf-8")
    print(f"{args.out}: {len(models)} models from litellm {version} "
          f"({args.out.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
