"""Calibration of the heuristic against provider-reported usage.

The guard and the workers estimate with one heuristic; providers report
what they actually counted. ``Calibration`` keeps the smoothed ratio of the
two (it describes the tokenizer and the content mix, so it survives
compaction); ``hybrid_estimate`` adds the calibrated heuristic for what was
appended since a report to that report (valid only for the same view).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

from shared.core.errors import InvalidInput
from shared.core.tokens_profiles import provider_for_model, provider_profile

CALIBRATION_MIN_RATIO = 0.5
"""The learned ratio never leaves [0.5, 2.0]: a tokenizer twice as dense as
o200k is already extreme, so anything beyond is a bug, not a measurement."""
CALIBRATION_MAX_RATIO = 2.0
CALIBRATION_PLAUSIBLE = (0.25, 4.0)
"""A single report whose reported/estimated ratio falls outside this band is
ignored: a wrong session, a cached-token total or a unit error, not news."""
CALIBRATION_MIN_WEIGHT = 0.2
"""Reports are averaged while there are few of them, then smoothed with this
weight: the ratio follows a provider change within ~10 calls without one odd
call swinging it."""


def _count_arg(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(
            f"expected an integer token count, got {type(value).__name__}", field=field
        )
    if value < 0:
        raise InvalidInput("a token count cannot be negative", field=field)
    return value


@dataclass(frozen=True)
class Calibration:
    """Learned ratio of provider-reported to estimated prompt tokens.

    It belongs to a session (or a model) and survives compaction: the ratio
    describes the tokenizer and the content mix, not the view. Pure: every
    update returns a new value, so it can live in the store beside the
    anchor and be replaced with a compare-and-swap.
    """

    ratio: float = 1.0
    samples: int = 0

    def __post_init__(self) -> None:
        if (
            isinstance(self.ratio, bool)
            or not isinstance(self.ratio, (int, float))
            or not math.isfinite(self.ratio)
            or not CALIBRATION_MIN_RATIO <= self.ratio <= CALIBRATION_MAX_RATIO
        ):
            raise InvalidInput(
                f"expected a ratio between {CALIBRATION_MIN_RATIO} and {CALIBRATION_MAX_RATIO}",
                field="calibration.ratio",
            )
        _count_arg(self.samples, "calibration.samples")

    def update(self, reported: int, estimated: int) -> Calibration:
        """Fold in one report: the provider counted ``reported`` prompt tokens
        for a request this counter estimated at ``estimated``.

        Zero counts (no usage reported) and implausible ratios leave the
        calibration unchanged.
        """
        reported = _count_arg(reported, "reported")
        estimated = _count_arg(estimated, "estimated")
        if reported == 0 or estimated == 0:
            return self
        observed = reported / estimated
        low, high = CALIBRATION_PLAUSIBLE
        if not low <= observed <= high:
            return self
        weight = max(1.0 / (self.samples + 1), CALIBRATION_MIN_WEIGHT)
        ratio = self.ratio + weight * (observed - self.ratio)
        ratio = min(max(ratio, CALIBRATION_MIN_RATIO), CALIBRATION_MAX_RATIO)
        return Calibration(ratio=ratio, samples=self.samples + 1)

    def apply(self, estimate: int) -> int:
        """``estimate`` corrected by the learned ratio (rounded up)."""
        estimate = _count_arg(estimate, "estimate")
        return math.ceil(estimate * self.ratio - 1e-9)


@functools.lru_cache(maxsize=1024)
def model_family(model: str) -> str:
    """The tokenizer family of ``model`` ("" for none): what a learned ratio is valid for."""
    return provider_for_model(model) if model and isinstance(model, str) else ""


def prior_ratio(model: str, counter: object) -> float:
    """The ratio a session is estimated with before its first usage report.

    Stored counts are at ``counter``'s baseline (its ``provider``: o200k for the default
    heuristic and for tiktoken), but Gemini's tokenizer counts ~18% more on the same text
    and Claude's 16-30% more (``PROVIDERS``): without a prior, a new Gemini or Claude
    session is underestimated by that much until the provider reports usage, which an
    agent that never passes usage never does. The first report replaces the prior (it
    carries no weight). 1.0 for model families without a profile of their own and for a
    counter that does not say its baseline (a custom one may count that model exactly).
    """
    for _ in range(3):  # through the counters that wrap another (memos, a job's counter)
        if hasattr(counter, "provider"):
            break
        counter = getattr(counter, "base", None) or getattr(counter, "counter", None)
    baseline = getattr(counter, "provider", None)
    if not model or not isinstance(model, str) or not isinstance(baseline, str):
        return 1.0
    return _prior(model, baseline)


@functools.lru_cache(maxsize=1024)
def _prior(model: str, baseline: str) -> float:
    family = model_family(model)
    if family in ("", "generic"):
        return 1.0
    ratio = provider_profile(family).factor / provider_profile(baseline).factor
    return min(max(ratio, CALIBRATION_MIN_RATIO), CALIBRATION_MAX_RATIO)


def hybrid_estimate(
    anchor_reported: int,
    anchor_estimated: int,
    current_estimated: int,
    calibration: Calibration,
) -> int:
    """Prompt tokens of the current view: the provider's own count of an earlier
    request (the anchor) plus the calibrated estimate of what was added since.

    ``anchor_estimated`` and ``current_estimated`` must come from the same
    counter. The anchor is valid only while the current view extends the
    anchored one; compaction replaces the view, so callers drop the anchor
    then and keep the calibration. A view smaller than the anchor's (or no
    anchor: ``anchor_reported == 0``) falls back to
    ``calibration.apply(current_estimated)``. After a single report, the one
    that set the ratio, the result equals that fallback (the anchor cancels);
    the anchor pays off once the ratio is an average over several reports.
    """
    anchor_reported = _count_arg(anchor_reported, "anchor_reported")
    anchor_estimated = _count_arg(anchor_estimated, "anchor_estimated")
    current_estimated = _count_arg(current_estimated, "current_estimated")
    if not isinstance(calibration, Calibration):
        raise InvalidInput("expected a Calibration", field="calibration")
    if anchor_reported == 0 or current_estimated < anchor_estimated:
        return calibration.apply(current_estimated)
    return anchor_reported + calibration.apply(current_estimated - anchor_estimated)


__all__ = [
    "CALIBRATION_MAX_RATIO",
    "CALIBRATION_MIN_RATIO",
    "CALIBRATION_MIN_WEIGHT",
    "CALIBRATION_PLAUSIBLE",
    "Calibration",
    "hybrid_estimate",
    "model_family",
    "prior_ratio",
]
