"""Context windows and output caps per model, and where each figure came from.

Wrong windows are a top complaint about compaction tools, so every answer
names its source. Precedence, strongest first:

1. ``learned``: a limit a provider stated in an overflow error for this exact
   model string (see ``LimitBook``). The provider's own word beats any table.
2. ``override``: a limit the caller configured (a deployment with a smaller
   window, a local server started with ``--ctx-size``).
3. ``registry``: ``shared/core/data/model_limits.json``, generated from litellm's
   ``model_prices_and_context_window.json`` by ``scripts/gen_model_limits.py``.
   The window is litellm's ``max_input_tokens``; for models whose input cap is
   separate from their output cap (gpt-5, Gemini) that makes
   ``window - reserve`` conservative, never too large.
4. ``provider_default``: a family default by name prefix (``PROVIDER_DEFAULTS``).
5. ``fallback``: 128k window, 4096 output, visible as ``source == "fallback"`` and
   logged once per model string and process (a warning naming model and window).
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from shared.core.errors import InvalidInput

__all__ = [
    "FALLBACK_CONTEXT_WINDOW",
    "FALLBACK_MAX_OUTPUT",
    "PROVIDER_DEFAULTS",
    "LimitBook",
    "LimitSource",
    "ModelLimits",
    "Registry",
    "RegistryEntry",
    "canonical_model_name",
    "default_registry",
    "model_limits",
    "output_reserve",
]

log = logging.getLogger(__name__)

LimitSource = Literal["learned", "override", "registry", "provider_default", "fallback"]
_SOURCES = ("learned", "override", "registry", "provider_default", "fallback")

FALLBACK_CONTEXT_WINDOW = 128_000  # what peers converged on for an unknown model
FALLBACK_MAX_OUTPUT = 4_096  # the most common default completion cap of OpenAI-compatible servers

# Family defaults, matched on the canonical name (dots become dashes) as ``name == prefix`` or
# ``name.startswith(prefix + "-")``, longest prefix first. Values are (window, max output):
# the provider's documented figures for the family, the smallest where the family varies.
PROVIDER_DEFAULTS: dict[str, tuple[int, int]] = {
    "claude": (200_000, 8_192),  # every Claude since Claude 3 has a 200k window
    "gemini": (1_048_576, 8_192),  # Gemini 1.5 / 2.x input limit; 8192 output on 1.5 / 2.0
    "gpt-5": (272_000, 128_000),  # OpenAI: 272k input cap, 128k output
    "gpt-4-1": (1_047_576, 32_768),  # gpt-4.1 family
    "gpt-4o": (128_000, 16_384),
    "gpt-4-turbo": (128_000, 4_096),
    "gpt-4-32k": (32_768, 4_096),
    "gpt-4": (8_192, 4_096),  # original gpt-4
    "gpt-3-5-turbo": (16_385, 4_096),
    "o1": (200_000, 100_000),  # OpenAI reasoning models (o1, o3, o4-mini)
    "o3": (200_000, 100_000),
    "o4": (200_000, 100_000),
    "grok": (131_072, 8_192),  # xAI grok-2 / grok-3
    "deepseek": (65_536, 8_192),  # DeepSeek API's first V3 window; later versions are larger
    "mistral": (32_768, 8_192),  # smallest window among Mistral's served models
    "command-r": (128_000, 4_000),  # Cohere Command R / R+
    "command-a": (256_000, 8_000),  # Cohere Command A
}

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


def _positive(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(f"expected a positive integer, got {value!r}", field=field)
    return value


@dataclass(frozen=True, slots=True)
class ModelLimits:
    """A model's context window and output cap, with ``source`` and a human ``detail``."""

    model: str
    context_window: int
    max_output_tokens: int
    source: LimitSource
    detail: str

    def __post_init__(self) -> None:
        _positive(self.context_window, "context_window")
        _positive(self.max_output_tokens, "max_output_tokens")
        if self.source not in _SOURCES:
            raise InvalidInput(f"unknown source {self.source!r}", field="source")


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
            out = None if row[1] is None else _positive(row[1], field + "[1]")
            entries[key] = RegistryEntry(key, _positive(row[0], field + "[0]"), out, str(row[2]))
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


def _find(table: Mapping[str, Any] | None, model: str, *, canonical: bool) -> tuple[str, Any]:
    if not table:
        return "", None
    key = model.strip().lower()
    by_key = {str(k).strip().lower(): (k, v) for k, v in table.items()}
    if key in by_key:
        return by_key[key]
    if canonical:
        name = canonical_model_name(key)
        for k, v in table.items():
            if canonical_model_name(str(k)) == name:
                return k, v
    return "", None


def _family(model: str) -> tuple[str, tuple[int, int]] | None:
    name = canonical_model_name(model)
    for prefix in sorted(PROVIDER_DEFAULTS, key=len, reverse=True):
        if name == prefix or name.startswith(prefix + "-"):
            return prefix, PROVIDER_DEFAULTS[prefix]
    return None


def _base(model: str, registry: Registry) -> ModelLimits:
    """Registry, provider default or fallback: what applies without caller knowledge."""
    found = registry.lookup(model)
    family = _family(model)
    if found is not None:
        entry, how = found
        window, out = entry.context_window, entry.max_output_tokens
        detail = f"registry: {registry.source} key {entry.key!r}"
        if how != "exact":
            detail += f" (matched {how} from {model!r})"
        if out is None or out > window // 2:
            # litellm often copies the window into max_output_tokens: no usable output cap.
            out = min(family[1][1] if family else FALLBACK_MAX_OUTPUT, max(1, window // 2))
            detail += f"; no usable output cap in the registry, {out} assumed"
        return ModelLimits(model, window, out, "registry", detail)
    if family is not None:
        prefix, (window, out) = family
        return ModelLimits(model, window, out, "provider_default",
                           f"provider_default: family {prefix!r} ({window} window)")
    return ModelLimits(model, FALLBACK_CONTEXT_WINDOW, FALLBACK_MAX_OUTPUT, "fallback",
                       f"fallback: {model!r} is unknown; assumed {FALLBACK_CONTEXT_WINDOW}")


_warned: set[str] = set()
_warned_lock = threading.Lock()


def _warn_fallback(limits: ModelLimits) -> None:
    """One warning per model string and process: the window is a guess."""
    key = limits.model.strip().lower()
    with _warned_lock:
        if key in _warned or len(_warned) >= 10_000:
            return
        _warned.add(key)
    log.warning("unknown model %r: assuming a %d-token context window and %d output tokens "
                "(default fallback); pass overrides={%r: WINDOW} to the guard if that is wrong",
                limits.model, limits.context_window, limits.max_output_tokens, limits.model)


def model_limits(model: str, *, overrides: Mapping[str, ModelLimits | int] | None = None,
                 learned: Mapping[str, int] | None = None,
                 registry: Registry | None = None) -> ModelLimits:
    """The limits for ``model``: learned > override > registry > provider default > fallback.

    ``learned`` matches the model string exactly (case and spaces aside): a
    limit learned from one deployment must not shrink another. ``overrides``
    also match by canonical name, so ``{"gpt-4o": 64000}`` covers
    ``azure/gpt-4o-2024-08-06``. An int override or a learned limit replaces
    the window only; the output cap comes from the lower tiers.
    """
    if not isinstance(model, str) or not model.strip():
        raise InvalidInput("expected a non-empty model name", field="model")
    base = _base(model, registry or default_registry())
    key, value = _find(learned, model, canonical=False)
    if value is not None:
        window = _positive(value, f"learned[{key!r}]")
        return replace(base, context_window=window, source="learned",
                       detail=f"learned: a provider error stated a {window}-token limit "
                              f"for {key!r}")
    key, value = _find(overrides, model, canonical=True)
    if isinstance(value, ModelLimits):
        return replace(value, model=model, source="override",
                       detail=f"override: caller's limits for {key!r}")
    if value is not None:
        window = _positive(value, f"overrides[{key!r}]")
        return replace(base, context_window=window, source="override",
                       detail=f"override: caller's {window}-token window for {key!r}")
    if base.source == "fallback":
        _warn_fallback(base)
    return base


def output_reserve(limits: ModelLimits, max_tokens: int | None = None, *,
                   min_input_tokens: int = 1024) -> int:
    """Tokens to set aside for the answer: ``max_tokens`` if given, else the model's max output.

    Capped so that the input budget ``window - reserve`` never drops below
    ``min(min_input_tokens, window // 2)`` (and at least 1): a reserve that
    leaves no room for the prompt would make every request impossible. When
    the cap bites, the caller must also send the returned value as
    ``max_tokens``: the provider would reject prompt + the larger value.
    """
    if max_tokens is not None:
        _positive(max_tokens, "max_tokens")
    _positive(min_input_tokens, "min_input_tokens")
    window = limits.context_window
    wanted = limits.max_output_tokens if max_tokens is None else max_tokens
    floor = max(1, min(min_input_tokens, window // 2))
    return max(0, min(wanted, window - floor))


class LimitBook:
    """Limits learned from overflow errors, per model string; the store persists it.

    ``learn`` keeps the smallest credible limit a provider stated: providers
    state the window they enforce, and a second, larger figure for the same
    model string usually comes from a different error shape (total vs
    input-only), so the smaller one is the one that keeps requests valid.
    Figures outside ``[MIN_CREDIBLE, MAX_CREDIBLE]`` are misparses and ignored.
    """

    MIN_CREDIBLE = 512
    MAX_CREDIBLE = 100_000_000

    def __init__(self, initial: Mapping[str, int] | None = None) -> None:
        self._limits: dict[str, int] = {}
        self._lock = threading.Lock()
        for model, limit in (initial or {}).items():
            self.learn(model, limit)

    @staticmethod
    def _key(model: str) -> str:
        if not isinstance(model, str) or not model.strip():
            raise InvalidInput("expected a non-empty model name", field="model")
        return model.strip().lower()

    def learn(self, model: str, limit: int) -> bool:
        """Record ``limit`` for ``model``; True when the stored figure changed."""
        key = self._key(model)
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise InvalidInput(f"expected an integer, got {limit!r}", field="limit")
        if not self.MIN_CREDIBLE <= limit <= self.MAX_CREDIBLE:
            return False
        with self._lock:
            current = self._limits.get(key)
            if current is not None and current <= limit:
                return False
            self._limits[key] = limit
            return True

    def get(self, model: str) -> int | None:
        return self._limits.get(self._key(model))

    def forget(self, model: str) -> bool:
        """Drop a learned limit (the deployment changed); True if there was one."""
        with self._lock:
            return self._limits.pop(self._key(model), None) is not None

    def as_mapping(self) -> dict[str, int]:
        """A copy, for ``model_limits(learned=...)`` and for persisting."""
        with self._lock:
            return dict(self._limits)

    def __len__(self) -> int:
        return len(self._limits)
