"""Span attributes of the guard's decisions, shared by the sync and async guard shells.

The shells call :func:`shared.telemetry.span` around ``prepare``,
``record_turn`` and ``recover``, :func:`view_attributes` on the view they
return, and the :class:`~shared.telemetry.metrics.Metrics` methods at each
decision (docs/observability.md, "Guard instrumentation").
"""

from __future__ import annotations

from typing import Any


def view_attributes(report: Any) -> dict[str, Any]:
    """Span attributes of a prepared view's report (a ``ViewReport``)."""
    budget = report.budget
    return {"compaction.watermark": report.watermark, "compaction.version": report.version,
            "compaction.log_length": report.length,
            "compaction.estimated_prompt_tokens": report.estimated_prompt_tokens,
            "compaction.usage_ratio": round(float(budget.usage_ratio), 4),
            "compaction.window": budget.window, "compaction.truncated": report.truncated,
            "compaction.dropped_messages": report.dropped_messages,
            "compaction.cheap_applied": report.cheap_applied,
            "compaction.enqueued": report.enqueued, "compaction.recovery": report.recovery,
            "compaction.degraded": report.degraded, "compaction.summary_kind":
            report.summary_kind or None}


__all__ = ["view_attributes"]
