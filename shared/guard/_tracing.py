"""The span around one guard call, for both shells (docs/observability.md)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from shared.core.prepared import PreparedView
from shared.telemetry import get_metrics, span
from shared.telemetry.hooks import view_attributes
from shared.telemetry.tracing import NO_SPAN, configured


class Traced:
    """A span around one guard call (a no-op one without an OpenTelemetry SDK).

    A context manager over :func:`shared.telemetry.span` (entered directly: no
    second generator on the hot path), and none at all while no SDK is configured;
    ``current`` is the span inside it.
    """

    __slots__ = ("_cm", "current")

    def __init__(self, name: str, attributes: Mapping[str, Any],
                 kind: str = "internal") -> None:
        self._cm = span(name, attributes, kind=kind) if configured() else None
        self.current: Any = NO_SPAN

    @classmethod
    def of(cls, name: str, attributes: Callable[[], Mapping[str, Any]],
           kind: str = "internal") -> Traced:
        """A span named ``name``, its ``attributes`` made only when spans record; else the
        one no-op span (a prepare of a tool chain made an attribute dict and a span object
        per call for nothing)."""
        if not configured():
            return _NOOP
        return cls(name, attributes(), kind)

    def __enter__(self) -> Traced:
        if self._cm is not None:
            self.current = self._cm.__enter__()
        return self

    def __exit__(self, *exc: Any) -> bool | None:
        return self._cm.__exit__(*exc) if self._cm is not None else None

    def view(self, view: PreparedView) -> PreparedView:
        """``view``, its report's figures set on the span (skipped when nothing records)."""
        if self.current.is_recording():
            self.current.set_attributes(view_attributes(view.report))
        return view

    def recovered(self, view: PreparedView) -> PreparedView:
        get_metrics().recovery("recovered")
        return self.view(view)

    def turn(self, length: int) -> int:
        """The log length after a recorded turn, set on the span."""
        self.current.set_attribute("compaction.log_length", length)
        return length


_NOOP = Traced.__new__(Traced)  # no SDK: nothing recorded, nothing kept (shared by threads)
_NOOP._cm, _NOOP.current = None, NO_SPAN

__all__ = ["Traced"]
