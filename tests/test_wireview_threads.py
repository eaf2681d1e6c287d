"""The cached wire forms are shared by every view of a session: a view's lazy
conversion (``view.openai()`` on another thread, after its prepare returned) may add
a format to them while a prepare carries them over to the next view. The carry must
not trip over the insertion: it raised ``dictionary changed size during iteration``
in the thread test of the full suite (``tests/test_guard_threads.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from shared.core import wireview
from shared.core.chunks import Chunks
from shared.core.messages import Message


def test_a_format_added_to_the_wire_forms_during_a_carry_is_left_to_the_next(
        monkeypatch: pytest.MonkeyPatch) -> None:
    first, new = Message(role="user", content="hi"), Message(role="assistant", content="hello")
    wire: dict[str, Any] = {"openai": Chunks.of(wireview.convert("openai", [first]))}
    convert = wireview.convert

    def converting_while_another_view_adds_a_format(fmt: str, messages: Any) -> Any:
        wire.setdefault("gemini-late", Chunks.of([]))  # another thread's lazy conversion
        return convert(fmt, messages)

    monkeypatch.setattr(wireview, "convert", converting_while_another_view_adds_a_format)
    out = wireview.carry(wire, 0, {}, [new])
    assert list(out["openai"]) == convert("openai", [first, new])
