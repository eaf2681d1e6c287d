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
5. ``fallback``: the window an unknown model's name states (``phi-3-mini-4k``,
   ``my-llama-32k``: 4,000 and 32,000, the smaller reading of a rounded size), else
   128k; 4096 output. Visible as ``source == "fallback"`` and logged once per model
   string and process (a warning naming model and window).

The registry table and model-name canonicalization are in
:mod:`shared.core.model_registry`; their names are importable from here too.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from shared.core.errors import InvalidInput
from shared.core.model_registry import (
    Registry,
    RegistryEntry,
    canonical_model_name,
    default_registry,
    positive_int,
)

__all__ = [
    "FALLBACK_CONTEXT_WINDOW",
    "FALLBACK_MAX_OUTPUT",
    "MIN_INPUT_TOKENS",
    "PROVIDER_DEFAULTS",
    "LimitBook",
    "LimitSource",
    "ModelLimits",
    "Registry",
    "RegistryEntry",
    "canonical_model_name",
    "default_registry",
    "known_window",
    "model_limits",
    "output_reserve",
    "plausible_unowned",
    "refused_bound",
    "stated_limit",
    "window_in_name",
]

log = logging.getLogger(__name__)

LimitSource = Literal["learned", "override", "registry", "provider_default", "fallback"]
_SOURCES = ("learned", "override", "registry", "provider_default", "fallback")

FALLBACK_CONTEXT_WINDOW = 128_000  # what peers converged on for an unknown model
FALLBACK_MAX_OUTPUT = 4_096  # the most common default completion cap of OpenAI-compatible servers
MIN_INPUT_TOKENS = 1024  # the least input budget a reserve leaves (output_reserve)

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


@dataclass(frozen=True, slots=True)
class ModelLimits:
    """A model's context window and output cap, with ``source`` and a human ``detail``.
    ``output_known``: the output cap is one the provider enforces (the registry's or the
    caller's figure), not an assumption (a family's smallest, a fallback)."""

    model: str
    context_window: int
    max_output_tokens: int
    source: LimitSource
    detail: str
    output_known: bool = False

    def __post_init__(self) -> None:
        positive_int(self.context_window, "context_window")
        positive_int(self.max_output_tokens, "max_output_tokens")
        if self.source not in _SOURCES:
            raise InvalidInput(f"unknown source {self.source!r}", field="source")


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


_NAMED_SIZE = re.compile(r"(?:^|[-_:/.])(\d{1,4}(?:\.\d+)?)([km])(?=$|[-_:/.])")
"""A context size in a model's name: ``-8k``, ``_128k``, ``-1m`` (not ``q4_k``, ``8x7b``)."""


def window_in_name(model: str) -> int | None:
    """The window a model's name states, if any (its last size; k = 1,000, m = 1,000,000),
    when it is one a window can be."""
    sizes = _NAMED_SIZE.findall(model.lower())
    if not sizes:
        return None
    number, unit = sizes[-1]
    window = round(float(number) * (1_000 if unit == "k" else 1_000_000))
    return window if LimitBook.credible(window) else None


def _base(model: str, registry: Registry) -> ModelLimits:
    """Registry, name-stated size, provider default or fallback: what applies without
    caller knowledge."""
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
        return ModelLimits(model, window, out, "registry", detail, output_known=True)
    named = window_in_name(model)
    if named is not None:  # the name is more specific than its family's default
        return ModelLimits(model, named, min(FALLBACK_MAX_OUTPUT, named // 4), "fallback",
                           f"fallback: {model!r} is unknown; its name states {named}")
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
                "(%s); pass overrides={%r: WINDOW} to the guard if that is wrong",
                limits.model, limits.context_window, limits.max_output_tokens,
                "the size its name states" if window_in_name(limits.model) else
                "default fallback", limits.model)


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
        window = positive_int(value, f"learned[{key!r}]")
        if LimitBook.credible(window):  # else a misparse (a state written before the check)
            return replace(base, context_window=window, source="learned",
                           detail=f"learned: a provider error stated a {window}-token limit "
                                  f"for {key!r}")
    key, value = _find(overrides, model, canonical=True)
    if isinstance(value, ModelLimits):
        return replace(value, model=model, source="override", output_known=True,
                       detail=f"override: caller's limits for {key!r}")
    if value is not None:
        window = positive_int(value, f"overrides[{key!r}]")
        return replace(base, context_window=window, source="override",
                       detail=f"override: caller's {window}-token window for {key!r}")
    if base.source == "fallback":
        _warn_fallback(base)
    return base


def known_window(limits: ModelLimits) -> int | None:
    """``limits``' window where something knows it (the caller's override, the registry, a
    family default), None where it is a guess (``fallback``): what a learned window with
    no recorded owner is judged against (:func:`plausible_unowned`). ``limits`` must be
    looked up without learned limits."""
    return None if limits.source == "fallback" else limits.context_window


# An unowned learned window below a quarter of the model's known window is taken for
# another model's (see plausible_unowned).
UNOWNED_MIN_SHARE = 0.25


def plausible_unowned(learned: int, known: int | None) -> bool:
    """Whether a learned window whose model was not recorded (``learned_window`` stored
    before ``learned_model`` existed) can be the limit of the model the state names,
    whose window is ``known`` (None: a guess).

    Those states name the session's *last* model, not the one the limit was learned
    for: an older guard rewrote ``model`` on a switch and kept the window, so a 16k limit
    learned for gpt-4o may sit next to gpt-4.1 (1M). Such a window is taken only where
    nothing knows the model's window, or where it is at least a quarter of the known
    one: an endpoint serving a model with somewhat less context than the table or the
    caller says is common (a deployment's cap, a proxy's reserve), one with 4x less
    is far more likely another model's limit. Refusing a real one costs one overflow,
    which learns it again with its owner; taking a wrong one would budget the session
    at a fraction of its window for good (an overflow never raises a learned window)."""
    return known is None or learned >= known * UNOWNED_MIN_SHARE


def output_reserve(limits: ModelLimits, max_tokens: int | None = None, *,
                   min_input_tokens: int = MIN_INPUT_TOKENS, fixed_tokens: int = 0) -> int:
    """Tokens to set aside for the answer: ``max_tokens`` if given, else the model's max output.

    Capped at the model's output cap where it is known (``output_known``): the provider
    refuses a larger ``max_tokens`` anyway. Capped too so that the input budget
    ``window - reserve`` never drops below ``min(min_input_tokens, window // 2)`` (and at
    least 1) on top of ``fixed_tokens`` (what every request of the caller carries:
    system prompt, tools, the newest message), as far as the window holds them: a
    reserve that leaves no room for the prompt would make every request impossible.
    When a cap bites, the caller must also send the returned value as ``max_tokens``:
    the provider would reject prompt + the larger value.
    """
    if max_tokens is not None:
        positive_int(max_tokens, "max_tokens")
    positive_int(min_input_tokens, "min_input_tokens")
    window = limits.context_window
    wanted = limits.max_output_tokens if max_tokens is None else max_tokens
    if limits.output_known:
        wanted = min(wanted, limits.max_output_tokens)
    floor = max(1, min(min_input_tokens, window // 2))
    if fixed_tokens + floor < window:  # the fixed part and as much again as any request
        floor += fixed_tokens
    elif floor < fixed_tokens < window:
        floor = fixed_tokens
    return max(0, min(wanted, window - floor))


def stated_limit(limit: int | None, window: int) -> int | None:
    """The window an overflow error states, when it can be one: credible, and below the
    window the refused request was prepared for. An overflow never raises the window:
    a larger figure is another number of the text (a string's length in characters, a
    batch cap) or a misparse, and believing it would send larger requests after a refusal.
    """
    if limit and LimitBook.credible(limit) and limit < window:
        return limit
    return None


def refused_bound(estimate: int, window: int, excess: int | None = None) -> int | None:
    """The window an overflow that states none implies, for a request of ``estimate``
    tokens that was prepared to fit ``window``: the real window is below that request
    (less an overshoot the error stated: Ollama's "exceeded ... by N tokens"). A server
    started with less context than its model has (llama.cpp's "exceeds the available
    context size", Ollama's default ``num_ctx``) is otherwise retried at a fifth of a
    window it does not have. None unless lower than ``window`` and credible."""
    bound = estimate - (excess or 0)
    return bound if bound < window and LimitBook.credible(bound) else None


class LimitBook:
    """Limits learned from overflow errors, per model string, in this process's memory
    only: nothing persists it, and other processes (guards, workers) never see it. The
    guard learns into it only where the model's window is a guess (``fallback``); a limit
    one session's error teaches below a window the registry, a family default or the
    caller knows is that session's alone, stored in its state (``learned_window``), which
    every process and the workers read.

    ``learn`` keeps the smallest credible limit a provider stated: providers
    state the window they enforce, and a second, larger figure for the same
    model string usually comes from a different error shape (total vs
    input-only), so the smaller one is the one that keeps requests valid.
    Figures outside ``[MIN_CREDIBLE, MAX_CREDIBLE]`` are misparses and ignored.
    """

    MIN_CREDIBLE = 512
    MAX_CREDIBLE = 100_000_000
    MAX_MODELS = 1_024
    """Model names a book keeps (the names come from requests: a process serving callers
    that name models at will would otherwise grow for as long as it runs); past it, the
    one learned first is forgotten. Its sessions keep their own learned window."""

    @classmethod
    def credible(cls, limit: int) -> bool:
        """Whether ``limit`` can be a context window (else a misparse, never learned)."""
        return cls.MIN_CREDIBLE <= limit <= cls.MAX_CREDIBLE

    def __init__(self, initial: Mapping[str, int] | None = None, *,
                 max_models: int | None = None) -> None:
        self.max_models = self.MAX_MODELS if max_models is None else max_models
        if self.max_models < 1:
            raise ValueError("a LimitBook keeps at least one model")
        self._limits: dict[str, int] = {}
        self._lock = threading.Lock()
        self.version = 0  # moves on with every change: what a reader keys a cache on
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
        if not self.credible(limit):
            return False
        with self._lock:
            current = self._limits.get(key)
            if current is not None and current <= limit:
                return False
            self._limits[key] = limit
            while len(self._limits) > self.max_models:
                del self._limits[next(iter(self._limits))]  # learned first, forgotten first
            self.version += 1
            return True

    def get(self, model: str) -> int | None:
        return self._limits.get(self._key(model))

    def forget(self, model: str) -> bool:
        """Drop a learned limit (the deployment changed); True if there was one."""
        with self._lock:
            dropped = self._limits.pop(self._key(model), None) is not None
            self.version += dropped
            return dropped

    def as_mapping(self) -> dict[str, int]:
        """A copy, for ``model_limits(learned=...)`` and for persisting."""
        with self._lock:
            return dict(self._limits)

    def __len__(self) -> int:
        return len(self._limits)
