"""The in-process copy a GuardedSession keeps for a Redis outage: bounded, in order."""

from __future__ import annotations

import pytest

from shared.core.errors import StoreUnavailable
from shared.core.messages import Message
from shared.integrations.agents_local import LocalHistory


def user(n: int) -> Message:
    return Message(role="user", content=f"m{n}")


def down(batch: list[Message], request_id: str) -> None:
    raise StoreUnavailable("redis unavailable during append")


def test_the_copy_keeps_its_summary_and_the_newest_messages() -> None:
    local = LocalHistory("s", keep=4)
    summary = Message(role="system", content="summary")
    local.seen([], [summary, user(0), user(1)])
    local.added([user(2), user(3), user(4)])
    assert [m.text() for m in local.messages()] == ["summary", "m2", "m3", "m4"]


def test_missed_batches_are_saved_in_order_with_their_first_ids(
        caplog: pytest.LogCaptureFixture) -> None:
    local = LocalHistory("s", keep=3)
    tried: list[tuple[str, str]] = []
    saved: list[tuple[str, str]] = []

    def failing(batch: list[Message], request_id: str) -> None:
        tried.append((batch[0].text(), request_id))
        down(batch, request_id)

    for n in range(4):  # one message a batch; the oldest beyond keep is dropped
        assert not local.record([user(n)], failing)
    assert local.unsaved == 3 and "are dropped" in caplog.text
    with pytest.raises(StoreUnavailable):
        local.flush(failing)  # m1 sent, Redis still down
    assert local.record([user(4)], lambda b, r: saved.append((b[0].text(), r)))
    assert [text for text, _ in saved] == ["m1", "m2", "m3", "m4"]
    assert saved[0] == tried[-1]  # m1 again with the id it went out with first
    assert len({rid for _, rid in saved}) == 4
    assert local.unsaved == 0
