"""The in-process copy of an Agents SDK session for a Redis outage: bounded, in order, one
per session in a process, re-seeding a log Redis lost."""

from __future__ import annotations

import gc
import logging

import pytest

from shared.core.errors import StoreUnavailable
from shared.core.messages import Message, ToolCall
from shared.integrations import agents_local
from shared.integrations.agents_local import LocalHistory, copy_of


def user(n: int) -> Message:
    return Message(role="user", content=f"m{n}")


def down(batch: list[Message], request_id: str) -> int:
    raise StoreUnavailable("redis unavailable during append")


class Log:
    """A log that answers: appends once per request id, as the store does."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.ids: dict[str, int] = {}

    def append(self, batch: list[Message], request_id: str) -> int:
        if request_id not in self.ids:
            self.messages.extend(batch)
            self.ids[request_id] = len(self.messages)
        return self.ids[request_id]

    def length(self) -> int:
        return len(self.messages)


def test_the_copy_keeps_its_summary_and_the_newest_messages() -> None:
    local, log = LocalHistory("s", keep=4), Log()
    summary = Message(role="system", content="summary")
    local.seen([], [summary, user(0), user(1)], 2, 0)
    for n in (2, 3, 4):
        assert local.record([user(n)], log.append, log.length)
    assert [m.text() for m in local.messages()] == ["summary", "m2", "m3", "m4"]


def test_missed_batches_are_saved_in_order_with_their_first_ids(
        caplog: pytest.LogCaptureFixture) -> None:
    local, log = LocalHistory("s", keep=3), Log()
    tried: list[tuple[str, str]] = []
    saved: list[tuple[str, str]] = []

    def failing(batch: list[Message], request_id: str) -> int:
        tried.append((batch[0].text(), request_id))
        return down(batch, request_id)

    def answering(batch: list[Message], request_id: str) -> int:
        saved.append((batch[0].text(), request_id))
        return log.append(batch, request_id)

    for n in range(4):  # one message a batch; the oldest beyond keep is dropped
        assert not local.record([user(n)], failing, log.length)
    assert local.unsaved == 3 and "are dropped" in caplog.text
    with pytest.raises(StoreUnavailable):
        local.flush(failing, log.length)  # m1 sent, Redis still down
    assert local.record([user(4)], answering, log.length)
    assert [text for text, _ in saved] == ["m1", "m2", "m3", "m4"]
    assert saved[0] == tried[-1]  # m1 again with the id it went out with first
    assert len({rid for _, rid in saved}) == 4
    assert local.unsaved == 0


def call(call_id: str) -> Message:
    return Message(role="assistant", content="",
                   tool_calls=[ToolCall(id=call_id, name="read_file", arguments="{}")])


def result(call_id: str) -> Message:
    return Message(role="tool", content="x=1", tool_call_id=call_id)


def test_a_dropped_batch_takes_the_results_of_its_calls_along() -> None:
    local, log = LocalHistory("s", keep=3), Log()
    local.record([user(0), call("c1")], down, log.length)
    local.record([result("c1")], down, log.length)
    local.record([Message(role="assistant", content="done")], down, log.length)
    assert local.unsaved == 1
    local.flush(log.append, log.length)
    assert [m.text() for m in log.messages] == ["done"]


def test_a_trimmed_copy_keeps_no_result_without_its_call() -> None:
    local, log = LocalHistory("s", keep=3), Log()
    local.seen([], [user(0), call("c1"), result("c1"), user(1)], 4, 0)
    assert local.record([user(2)], log.append, log.length)
    assert [m.role for m in local.messages()] == ["user", "user"]


def test_an_empty_log_is_re_seeded_with_the_summary_after_the_pinned_messages(
        caplog: pytest.LogCaptureFixture) -> None:
    local, log = LocalHistory("s"), Log()
    rule = Message(role="system", content="rule")
    summary = Message(role="user", content="SUMMARY", metadata={"compaction": "summary"})
    local.seen([rule], [summary, user(5), user(6)], 9, 2)
    assert local.seen([], [], 0, 0)  # Redis came back empty: the copy is kept
    assert "re-seeded" in caplog.text and local.messages()[0].text() == "SUMMARY"
    assert local.flush(log.append, log.length) == 0  # the copy is not a new message
    assert [(m.role, m.text()) for m in log.messages] == [
        ("system", "rule"), ("system", "SUMMARY"), ("user", "m5"), ("user", "m6")]
    assert local.length == 4


def test_a_shorter_log_after_an_edit_elsewhere_is_taken_and_data_loss_is_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    local = LocalHistory("s")
    local.seen([], [user(0), user(1), user(2)], 3, 1)
    with caplog.at_level(logging.ERROR):
        assert not local.seen([], [user(0), user(1)], 2, 2)  # popped elsewhere: version 2
        assert not caplog.records
        assert not local.seen([], [user(0)], 1, 2)  # an older snapshot: same version
    assert "holds 1 messages, this process knew 2" in caplog.text
    assert [m.text() for m in local.messages()] == ["m0"]


def test_a_missed_batch_saved_after_messages_it_did_not_see_is_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    local, log = LocalHistory("s"), Log()
    assert local.record([user(0)], log.append, log.length)
    local.record([user(1)], down, log.length)
    log.append([user(9)], "elsewhere")
    local.flush(log.append, log.length)
    assert "out of order" in caplog.text
    assert [m.text() for m in log.messages] == ["m0", "m9", "m1"]


def test_one_copy_per_guard_tenant_and_session_bounded_in_sessions(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    class Guard:
        pass

    monkeypatch.setattr(agents_local, "SESSIONS", 2)
    guard, other = Guard(), Guard()
    first = copy_of(guard, "t", "a")
    assert copy_of(guard, "t", "a") is first
    assert copy_of(guard, "u", "a") is not first and copy_of(other, "t", "a") is not first
    first.record([user(0)], down, lambda: 0)  # unsaved: the other one goes first
    copy_of(guard, "t", "b")
    assert copy_of(guard, "t", "a") is first
    copy_of(guard, "t", "c").record([user(1)], down, lambda: 0)
    copy_of(guard, "t", "d")  # every copy holds unsaved items: the oldest used goes, logged
    assert "will not be saved" in caplog.text and copy_of(guard, "t", "a") is not first
    del guard
    gc.collect()
    assert other in agents_local._COPIES and len(agents_local._COPIES) == 1


def test_a_copy_idle_for_longer_than_the_session_ttl_is_not_used() -> None:
    class Guard:
        pass

    guard = Guard()
    idle = copy_of(guard, "t", "a", ttl=60)
    idle.touched -= 61  # Redis expired the session by now: no re-seed from this copy
    assert copy_of(guard, "t", "a", ttl=60) is not idle


def test_a_log_deleted_while_redis_stayed_up_is_not_re_seeded() -> None:
    local, log = LocalHistory("s"), Log()
    local.seen([], [user(0), user(1)], 2, 0)
    assert not local.seen([], [], 0, 0, restarted=lambda seconds: False)
    assert local.messages() == [] and local.length == 0
    local.record([user(2)], down, log.length)  # the new log's first turn, missed
    local.flush(log.append, log.length, lambda seconds: False)
    assert [m.text() for m in log.messages] == ["m2"]
