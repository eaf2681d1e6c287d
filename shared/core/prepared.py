"""What the guard returns: the view to send and the report of its decisions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, overload

from pydantic import BaseModel, ConfigDict, PrivateAttr

from shared.core.budget import BudgetReport
from shared.core.chunks import Chunks
from shared.core.constructed import constructed
from shared.core.messages import Message


class ViewReport(BaseModel):
    """What the guard decided for one request."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    model: str
    limits_source: str
    budget: BudgetReport
    estimated_prompt_tokens: int
    watermark: int
    version: int
    length: int
    summary_kind: str
    cheap_applied: int
    truncated: bool
    dropped_messages: int
    note: str
    enqueued: bool
    pending_job: bool
    recovery: bool
    degraded: bool
    elapsed_ms: float

    @classmethod
    def built(cls, session_id: str, model: str, limits_source: str, budget: BudgetReport,
              estimated_prompt_tokens: int, watermark: int, version: int, length: int,
              summary_kind: str, cheap_applied: int, truncated: bool, dropped_messages: int,
              note: str, enqueued: bool, pending_job: bool, recovery: bool, degraded: bool,
              elapsed_ms: float) -> ViewReport:
        """A report from valid figures: :meth:`model_construct` without its field walk."""
        return constructed(cls, {
            "session_id": session_id, "model": model, "limits_source": limits_source,
            "budget": budget, "estimated_prompt_tokens": estimated_prompt_tokens,
            "watermark": watermark, "version": version, "length": length,
            "summary_kind": summary_kind, "cheap_applied": cheap_applied,
            "truncated": truncated, "dropped_messages": dropped_messages, "note": note,
            "enqueued": enqueued, "pending_job": pending_job, "recovery": recovery,
            "degraded": degraded, "elapsed_ms": elapsed_ms}, None)


class PreparedView(BaseModel):
    """The messages to send (system message first) and the report.

    ``messages`` is an immutable sequence that shares its history with the
    guard's cached view (:class:`shared.core.chunks.Chunks`): index, slice,
    iterate and compare it like a list; ``list(view.messages)`` for a copy.
    """

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    messages: Sequence[Message]
    report: ViewReport
    # head (system / summary lead), the cached view's parts, pending: see wire().
    _head: Sequence[Message] = PrivateAttr(default=())
    _wire: dict[str, Any] | None = PrivateAttr(default=None)
    _applied: Any = PrivateAttr(default=None)
    _extra: Sequence[Message] = PrivateAttr(default=())
    _extra_wire: Sequence[dict[str, Any]] = PrivateAttr(default=())  # kept across prepares

    _head_wire: dict[str, Any] | None = PrivateAttr(default=None)  # per format; "memo"
    _memo: dict[Any, Any] | None = PrivateAttr(default=None)  # the cached view's, see wire()

    @classmethod
    def built(cls, messages: Sequence[Message], report: ViewReport, *,
              head: Sequence[Message] = (), head_wire: dict[str, Any] | None = None,
              wire: dict[str, Any] | None = None, applied: Any = None,
              extra: Sequence[Message] = (),
              extra_wire: Sequence[dict[str, Any]] = (),
              memo: dict[Any, Any] | None = None) -> PreparedView:
        """A view from parts the guard already holds: :meth:`model_construct` without its
        per-field walk (a prepare made two of them, a tenth of a warm call)."""
        return constructed(cls, {"messages": messages, "report": report},
                     {"_head": head, "_wire": wire, "_applied": applied, "_extra": extra,
                      "_extra_wire": extra_wire, "_head_wire": head_wire, "_memo": memo})

    def wire(self, fmt: str = "openai") -> Sequence[dict[str, Any]]:
        """The view in an incremental wire format (``openai``, ``openai+reasoning``)
        without copying: the history's converted messages are shared with the cache."""
        concat, convert, convert_kept, history_wire = _wire_parts()
        private = self.__pydantic_private__  # a slot: no __getattr__ per attribute
        assert private is not None
        wire, applied = private["_wire"], private["_applied"]
        if wire is None or applied is None:
            whole: list[dict[str, Any]] = convert(fmt, self.messages)
            return whole
        kept = private["_head_wire"]
        head = kept.get(fmt) if kept is not None else None
        if head is None:
            head = convert(fmt, private["_head"])
            if kept is not None:
                kept[fmt] = head
        history = history_wire(wire, fmt, applied)
        pending = convert_kept(fmt, private["_extra"], private["_extra_wire"])
        memo = private["_memo"]
        if memo is None:
            joined: Chunks[dict[str, Any]] = concat(head, history, pending)
            return joined
        # head + history, kept with the cached view while both are the same (a tool chain's
        # quiet calls): each call appends its pending forms, the history's chunks not walked
        found = memo.get(fmt)
        if found is None or found[0] is not history or found[1] is not head:
            found = memo[fmt] = (history, head, concat(head, history))
        prefix: Chunks[dict[str, Any]] = found[2]
        return prefix.plus(pending)

    def openai(self, *, include_reasoning: bool = False) -> list[dict[str, Any]]:
        """The view in OpenAI Chat Completions format (a new list; its dicts are shared,
        do not mutate them).

        ``reasoning_content`` is left out by default (api.openai.com rejects
        it); DeepSeek / vLLM style endpoints may want ``include_reasoning=True``.
        """
        from shared.core.wireview import flatten

        return flatten(self.wire("openai+reasoning" if include_reasoning else "openai"))

    @overload
    def anthropic(self, *, shared: Literal[False] = False) -> tuple[Any, list[dict[str, Any]]]:
        ...

    @overload
    def anthropic(self, *, shared: Literal[True]) -> tuple[Any, Sequence[dict[str, Any]]]: ...

    def anthropic(self, *, shared: bool = False) -> tuple[Any, Sequence[dict[str, Any]]]:
        """``(system, messages)`` for Anthropic's Messages API (a new list; its dicts are
        shared, do not mutate them): the history's turns kept with the guard's cached
        view, the rest converted (:mod:`shared.core.wirefold`). ``shared``: the messages
        as a read-only sequence sharing the cached turns, no copy of the history (the
        SDK takes any iterable), as :meth:`wire` is for OpenAI's format."""
        from shared.core.wire import to_anthropic

        found = self._folded("anthropic", shared)
        return found if found is not None else to_anthropic(list(self.messages))

    @overload
    def gemini(self, *, shared: Literal[False] = False,
               ) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]: ...

    @overload
    def gemini(self, *, shared: Literal[True],
               ) -> tuple[dict[str, Any] | None, Sequence[dict[str, Any]]]: ...

    def gemini(self, *, shared: bool = False,
               ) -> tuple[dict[str, Any] | None, Sequence[dict[str, Any]]]:
        """``(system_instruction, contents)`` for Gemini (a new list; its dicts are shared,
        do not mutate them), kept like :meth:`anthropic` (``shared`` too)."""
        from shared.core.wire import to_gemini

        found = self._folded("gemini", shared)
        return found if found is not None else to_gemini(list(self.messages))

    def _folded(self, fmt: str, shared: bool = False) -> Any:
        """The view in ``fmt`` from the cached history's fold; None: convert it whole (a
        view without cached parts, or one the fold leaves to the whole conversion)."""
        private = self.__pydantic_private__  # a slot: no __getattr__ per attribute
        assert private is not None
        wire, applied = private["_wire"], private["_applied"]
        if wire is None or applied is None:
            return None
        from shared.core.wirefold import AnthropicFold, anthropic_view, gemini_view
        from shared.core.wireview import history_fold

        fold = history_fold(wire, fmt, applied)
        head, pending = private["_head"], private["_extra"]
        kept = private["_head_wire"]  # shared by the prepares with this head: turns kept there
        head_memo: tuple[dict[str, Any], ...] | None = None
        if kept is not None:
            head_memo = kept.get("memo")
            if head_memo is None or len(head_memo) != len(head):
                head_memo = kept["memo"] = tuple({} for _ in head)
        extra = private["_extra_wire"]  # a slot per pending message, kept across the turn
        pending_memo = tuple(extra) if len(extra) == len(pending) else None
        if isinstance(fold, AnthropicFold):
            return anthropic_view(head, fold, pending, head_memo, pending_memo, shared=shared)
        return gemini_view(head, fold, pending, head_memo, pending_memo, shared=shared)


_PARTS: tuple[Any, ...] = ()


def _wire_parts() -> tuple[Any, ...]:
    """:meth:`PreparedView.wire`'s helpers, imported on its first call (not at import
    time; an import statement per call cost ~1.3 µs of a tool chain's ~100)."""
    global _PARTS
    if not _PARTS:
        from shared.core.chunks import concat
        from shared.core.wireview import convert, convert_kept, history_wire

        _PARTS = (concat, convert, convert_kept, history_wire)
    return _PARTS


__all__ = ["PreparedView", "ViewReport"]
