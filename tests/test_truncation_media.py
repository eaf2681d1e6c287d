"""Emergency truncation replaces the newest tool step's media before it drops the step.

A step whose screenshots do not fit was dropped whole (its calls and their results),
so the model made the same calls again and met the same cut on every call.
"""

from __future__ import annotations

import base64

import fakeredis
import pytest

from shared.core.config import StoreConfig
from shared.core.messages import ImagePart, Message, TextPart
from shared.core.truncation import emergency_truncate
from shared.core.wire import from_anthropic
from shared.store.sessions import SessionStore
from tests.guard_shells import SHELLS, make
from tests.images_support import png

SHOT = base64.b64encode(png(1280, 800)).decode("ascii")


def screenshot_turn(calls: int) -> list[Message]:
    """One user task, one assistant message making ``calls`` screenshot calls, their
    results (a caption and a 1280x800 PNG each)."""
    return from_anthropic([
        {"role": "user", "content": "compare these pages"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": f"toolu_{j}", "name": "screenshot",
             "input": {"url": f"https://site/{j}"}} for j in range(calls)]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_{j}", "content": [
                {"type": "text", "text": f"page {j}"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": SHOT}}]} for j in range(calls)]},
    ])


def images(messages: list[Message]) -> int:
    return sum(isinstance(p, ImagePart) for m in messages if isinstance(m.content, list)
               for p in m.content)


def test_the_newest_step_keeps_its_calls_and_texts_when_its_images_do_not_fit() -> None:
    turn = screenshot_turn(6)
    result = emergency_truncate(turn, 3000)
    assert result.within_budget
    assert [m.role for m in result.messages] == ["user", "assistant", *["tool"] * 6]
    assert len(result.messages[1].tool_calls) == 6
    texts = [[p.text for p in m.content if isinstance(p, TextPart)]
             for m in result.messages[2:] if isinstance(m.content, list)]
    assert [t[0] for t in texts] == [f"page {j}" for j in range(6)]
    kept = images(result.messages)
    assert 0 < kept < 6  # the oldest replaced, the newest kept while they fit
    assert all(images([m]) == 0 for m in result.messages[2:2 + 6 - kept])
    assert "[image/png image not sent:" in texts[0][1]
    assert result.dropped == 0
    assert "6 media parts" not in result.note and "media part" in result.note


def test_every_image_goes_before_the_step_does() -> None:
    turn = screenshot_turn(6)
    result = emergency_truncate(turn, 500)
    assert result.within_budget
    assert len(result.messages) == 8 and images(result.messages) == 0
    assert len(result.messages[1].tool_calls) == 6


def test_a_step_that_fits_keeps_its_images() -> None:
    turn = screenshot_turn(2)
    result = emergency_truncate(turn, 100_000)
    assert not result.changed and images(result.messages) == 2


@pytest.mark.parametrize("shell_name", SHELLS)
def test_the_guard_sends_the_pending_step_with_placeholders(shell_name: str) -> None:
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="t"))
    guard = make(shell_name, store, overrides={"claude-sonnet-4-5": 8000})
    view = guard.prepare("s", "sys", model="claude-sonnet-4-5", max_tokens=1000,
                         pending=screenshot_turn(6))
    assert view.report.truncated
    _, wire = view.anthropic()
    assert [m["role"] for m in wire] == ["user", "assistant", "user"]
    assert [b["id"] for b in wire[1]["content"]] == [f"toolu_{j}" for j in range(6)]
    results = wire[2]["content"]
    assert [r["tool_use_id"] for r in results] == [f"toolu_{j}" for j in range(6)]
    assert results[0]["content"][1]["text"].startswith("[image/png image not sent:")


def test_a_step_dropped_after_all_is_not_counted_as_replaced() -> None:
    result = emergency_truncate(screenshot_turn(6), 20)
    assert len(result.messages) == 1 and result.media_removed == 0
    assert "media" not in result.note and "7 earlier messages dropped" in result.note
