"""What a provider's reported usage teaches the guard, sans-I/O.

The guard's estimate of a request is a heuristic; the provider's count of the same
request (its usage) calibrates it, and tells of a provider that silently cut the
request: a report far below what was sent, above the window, or one that stopped
growing while the requests kept growing (a server keeping only its last tokens). Each
report is compared with the request it describes (:class:`Sent`, made by
:func:`shared.core.guard_state.plan_view`), never with the session as it is now.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from shared.core.calibration import CALIBRATION_PLAUSIBLE, Calibration, model_family
from shared.core.limits import LimitBook
from shared.core.records import SessionState

SILENT_TRUNCATION_RATIO = 0.5  # a report below this share of the estimate of what was sent
# A report that grew by under this share of what the request grew by (heuristic tokens)
# since the last report learned from: no tokenizer is that much denser than the heuristic
# on the added content (CALIBRATION_PLAUSIBLE starts at 0.25): a ceiling upstream.
CEILING_SHARE = 0.1
# ... judged once the request grew by this share of the last learned one, and by at least
# CEILING_MIN_GROWTH heuristic tokens (until then such a report is not learned from)
CEILING_GROWTH = 0.1
CEILING_MIN_GROWTH = 256
# ... and learned as the window when it held within this share of the last learned report
# (a server keeping its last tokens reports the same figure; a caller's erratic figures,
# such as Anthropic's input tokens without the cached ones, are flagged, not learned)
CEILING_STEADY = 0.02


@dataclass(frozen=True, slots=True)
class Sent:
    """The request a prepared view describes: what the provider's usage will be about."""

    heuristic: int  # uncalibrated estimate of the request, the calibration's unit
    estimate: int  # calibrated estimate of the same request
    end: int  # log length it covered
    window: int
    version: int  # the session version it was built at
    state: SessionState
    model: str = ""  # the model it was prepared for


def usage_fields(reported: int, sent: Sent) -> dict[str, Any]:
    """State fields learned from the provider's reported prompt tokens for ``sent``.

    Like with like: the report is compared with the calibrated heuristic of
    *that* request (what was actually sent, whatever landed since), and the
    fields are applied only at the version it was built at (the append
    checks). Silent truncation is suspected when the provider saw more than
    its window, far less than the request that was sent, or when its count
    stopped growing while the request kept growing (:func:`_ceiling`: a server
    that keeps only its last tokens; each such report would otherwise drag the
    ratio down a little, so a gradually growing session never looked far
    less). Not the hybrid estimate: it is anchored on the previous report, so
    a provider that keeps under-reporting would vouch for itself.
    """
    state, window = sent.state, sent.window
    expected = max(math.ceil(sent.heuristic * state.calibration_ratio - 1e-9), 1)
    family = model_family(sent.model)
    same = not family or not state.calibration_family or family == state.calibration_family
    ceiling = same and _ceiling(reported, sent)
    if ceiling and not state.ceiling_seen:
        # Once is not proof: an estimate can overshoot one request (content the heuristic
        # overcounts); the next report, on a request that kept growing, confirms it.
        return {"ceiling_seen": 1}
    if window and (reported > window or ceiling or (expected > 1000 and
                                                    reported < expected * SILENT_TRUNCATION_RATIO)):
        fields: dict[str, Any] = {"silent_truncation_flags": state.silent_truncation_flags + 1,
                                  "recover_next": 1, "ceiling_seen": 0}
        kept = max(reported, state.anchor_reported or 0)
        if ceiling and kept < window and LimitBook.credible(kept) \
                and kept - min(reported, state.anchor_reported or 0) <= kept * CEILING_STEADY:
            # a steady ceiling (not a caller's erratic figures, such as cache-less counts):
            # what the server keeps is its window, as an overflow's bound is learned
            fields.update(learned_window=kept, model=sent.model or state.model,
                          learned_model=sent.model or state.model)
        return fields
    if ceiling is None:  # not grown, not yet judged: neither a sample nor an anchor
        return {}
    reset = {"ceiling_seen": 0} if state.ceiling_seen else {}
    # a report of another tokenizer family than the ratio's starts the ratio afresh
    cal = (Calibration(state.calibration_ratio, state.calibration_samples) if same
           else Calibration()).update(reported, sent.heuristic)
    return {"anchor_reported": reported, "anchor_estimated": sent.heuristic,
            "anchor_end": sent.end, "anchor_version": sent.version,
            "calibration_ratio": cal.ratio, "calibration_samples": cal.samples,
            "calibration_family": family or state.calibration_family, **reset}


def _ceiling(reported: int, sent: Sent) -> bool | None:
    """Whether ``reported`` sits at a ceiling: the request grew since the last report
    learned from (the anchor, any view: whole requests in heuristic tokens) and the report
    hardly did. True: judged so; False: judged not; None: it did not grow with the request,
    but the request has not grown enough yet to tell (kept out of the calibration, and the
    anchor stays, so the growth adds up over the next reports)."""
    state = sent.state
    low, high = CALIBRATION_PLAUSIBLE  # an anchor no tokenizer explains proves nothing
    if state.anchor_reported is None or not state.anchor_estimated \
            or not low <= state.anchor_reported / state.anchor_estimated <= high:
        return False
    grown = sent.heuristic - state.anchor_estimated
    if grown <= 0 or reported - state.anchor_reported >= grown * CEILING_SHARE:
        return False
    return True if grown >= max(CEILING_MIN_GROWTH,
                                state.anchor_estimated * CEILING_GROWTH) else None


__all__ = ["CEILING_GROWTH", "CEILING_MIN_GROWTH", "CEILING_SHARE", "CEILING_STEADY",
           "SILENT_TRUNCATION_RATIO", "Sent", "usage_fields"]
