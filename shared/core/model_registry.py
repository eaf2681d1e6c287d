"""The packaged model registry (from litellm's data) and model-name canonicalization.

Apart from :mod:`shared.core.limits` (precedence of learned, override,
registry, family default, fallback) because this is the lookup in one
table: how a model string, however routed or dated, finds its row.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from shared.core.errors import InvalidInput

__all__ = ["Registry", "RegistryEntry", "canonical_model_name", "default_registry",
           "positive_int"]

_BEDROCK_REGION = re.compile(r"^(?:us|eu|apac|ap|au|ca|jp|global|us-gov)\.")
_BEDROCK_VENDOR = re.compile(
    r"^(?:anthropic|meta|amazon|mistral|cohere|ai21|deepseek|openai|qwen|writer|moonshot"
    r"|minimax|google|nvidia)\."
)
_SUFFIXES = re.compile(
    r"(?:-v\d+:\d+|:\d+|[-:@]latest|@[\w.-]*|-\d{4}-\d{2}-\d{2}|-\d{8}|-\d{2}-\d{4}|-\d{4}"
    r"|-\d{2}-\d{2})$"
)


def canonical_model_name(model: str) -> str:
    """A provider-neutral name: ``bedrock/us.anthropic.claude-3-5-sonnet-20240620-v1:0`` and
    ``vertex_ai/claude-3-5-sonnet@20240620`` both become ``claude-3-5-sonnet``.

    Lower-cased; routing prefixes (``openai/``, ``azure/``, ``openrouter/anthropic/``,
    ``models/``) dropped; Bedrock region and vendor prefixes and ``-v1:0`` dropped; date
    and ``-latest`` / ``@...`` suffixes dropped; dots between digits become dashes
    (``claude-3.5-sonnet`` == ``claude-3-5-sonnet``).
    """
    name = model.strip().lower().rsplit("/", 1)[-1]
    name = _BEDROCK_VENDOR.sub("", _BEDROCK_REGION.sub("", name))
    while True:
        stripped = _SUFFIXES.sub("", name)
        if stripped == name or not stripped:
            break
        name = stripped
    return re.sub(r"(?<=\d)\.(?=\d)", "-", name)


def _hint(model: str) -> str | None:
    """The provider a model string routes to, when it says so."""
    key = model.strip().lower()
    if "/" in key:
        return key.split("/", 1)[0]
    if _BEDROCK_VENDOR.match(_BEDROCK_REGION.sub("", key)):
        return "bedrock"
    return "vertex_ai" if "@" in key else None


# litellm providers that serve their own models: their entries describe the vendor's API.
_VENDORS = ("openai", "anthropic", "gemini", "mistral", "xai", "deepseek", "cohere_chat",
            "cohere", "moonshot", "zai", "dashscope", "minimax", "ai21", "perplexity")


def _first_party(entry: RegistryEntry) -> bool:
    """litellm's plain keys (``gpt-4o``, ``claude-sonnet-4-5``) or a vendor's own route."""
    if entry.provider in _VENDORS:
        return True
    key = entry.key.lower()
    return not any(c in key for c in "/@:") and not _BEDROCK_VENDOR.match(
        _BEDROCK_REGION.sub("", key))


def positive_int(value: object, field: str) -> int:
    """``value`` if it is a positive int (not a bool), else InvalidInput naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(f"expected a positive integer, got {value!r}", field=field)
    return value


@dataclass(frozen=True, slots=True)
class RegistryEntry:
    key: str
    context_window: int
    max_output_tokens: int | None
    provider: str


class Registry:
    """The generated registry, indexed by exact key and by canonical name."""

    def __init__(self, entries: Mapping[str, RegistryEntry], source: str) -> None:
        self.source = source
        self._exact = {k.lower(): e for k, e in entries.items()}
        self._canonical: dict[str, list[RegistryEntry]] = {}
        for entry in entries.values():
            self._canonical.setdefault(canonical_model_name(entry.key), []).append(entry)

    def __len__(self) -> int:
        return len(self._exact)

    @classmethod
    def from_json(cls, data: Any, source: str = "model_limits.json") -> Registry:
        """Build from the generator's format; bad rows raise InvalidInput naming the key."""
        models = data.get("models") if isinstance(data, Mapping) else None
        if not isinstance(models, Mapping):
            raise InvalidInput("expected an object with a 'models' object", field=source)
        entries = {}
        for key, row in models.items():
            field = f"{source}.models[{key!r}]"
            if not isinstance(row, list) or len(row) != 3:
                raise InvalidInput("expected [window, max_output or null, provider]", field=field)
            out = None if row[1] is None else positive_int(row[1], field + "[1]")
            entries[key] = RegistryEntry(key, positive_int(row[0], field + "[0]"), out, str(row[2]))
        meta = data.get("_meta", {})
        version = meta.get("litellm_version") if isinstance(meta, Mapping) else None
        label = f"litellm {version} " if version else ""
        return cls(entries, f"{label}model_prices_and_context_window.json")

    @classmethod
    def load(cls, path: str | Path) -> Registry:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InvalidInput(f"cannot read the model registry: {exc}", field=str(path)) from None
        return cls.from_json(data, str(path))

    def lookup(self, model: str) -> tuple[RegistryEntry, str] | None:
        """The entry for ``model`` and how it matched; None when nothing matches.

        Exact key first, then the key with leading routing segments dropped
        (``openai/gpt-4o`` -> ``gpt-4o``), then the canonical name. Among
        several canonical matches: the routed provider, else litellm's
        unprefixed first-party key, else the most common window (the smaller
        one on a tie, because a window too small only compacts early).
        """
        key = model.strip().lower()
        parts = key.split("/")
        tries = ["/".join(parts[i:]) for i in range(len(parts))]
        tries += [f"{vendor}/{key}" for vendor in _VENDORS if "/" not in key]
        for i, name in enumerate(tries):
            entry = self._exact.get(name)
            if entry is not None:
                return entry, "exact" if i == 0 else "prefix"
        candidates = self._canonical.get(canonical_model_name(key))
        if not candidates:
            return None
        hint = _hint(key)
        if hint:
            candidates = [e for e in candidates if e.provider.startswith(hint)] or candidates
        pool = [e for e in candidates if _first_party(e)] or candidates
        windows = Counter(e.context_window for e in pool)
        best = max(windows.items(), key=lambda kv: (kv[1], -kv[0]))[0]
        return min((e for e in pool if e.context_window == best), key=lambda e: e.key), "canonical"


@lru_cache(maxsize=1)
def default_registry() -> Registry:
    """The registry file packaged with ``shared`` (read once)."""
    data = resources.files("shared.core").joinpath("data").joinpath("model_limits.json")
    text = data.read_text(encoding="utf-8")
    return Registry.from_json(json.loads(text), "shared/core/data/model_limits.json")
