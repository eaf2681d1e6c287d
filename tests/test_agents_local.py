"""The in-process copy of an Agents SDK session for a Redis outage: bounded (messages and
tokens), in order, one per session in a process, never writing back a log Redis lost."""

from __future__ import annotations

import gc
import logging
import time

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
    log.messages += [user(0), user(1)]
    local.seen([], [summary, user(0), user(1)], 2, 0, 3)
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
    log.messages += [user(0), call("c1"), result("c1"), user(1)]
    local.seen([], [user(0), call("c1"), result("c1"), user(1)], 4, 0, 4)
    assert local.record([user(2)], log.append, log.length)
    assert [m.role for m in local.messages()] == ["user", "user"]


def test_an_empty_log_is_logged_and_never_re_seeded(caplog: pytest.LogCaptureFixture) -> None:
    local, log = LocalHistory("s"), Log()
    rule = Message(role="system", content="rule")
    local.seen([rule], [user(5), user(6)], 9, 2, 3)
    with caplog.at_level(logging.ERROR):
        assert local.seen([], [], 0, 0, 0)  # Redis came back empty (or deleted elsewhere)
    assert [r.getMessage()[:50] for r in caplog.records] == [
        "Redis lost 9 messages of session s: history before"]
    assert "without persistence" in caplog.text
    assert local.messages() == [] and local.pinned == []
    assert local.record([user(7)], log.append, log.length)  # the run's new items only
    assert [m.text() for m in log.messages] == ["m7"]
    assert len(caplog.records) == 1


def test_a_save_that_finds_the_log_emptied_drops_the_copy_and_logs_once(
        caplog: pytest.LogCaptureFixture) -> None:
    local, log = LocalHistory("s"), Log()
    for n in range(3):
        assert local.record([user(n)], log.append, log.length)
    log.messages.clear()  # Redis restarted empty while the model answered
    with caplog.at_level(logging.ERROR):
        assert local.record([user(3)], log.append, log.length)
        assert local.record([user(4)], log.append, log.length)
    assert len(caplog.records) == 1 and "Redis lost 3 messages of session s" in caplog.text
    assert [m.text() for m in local.messages()] == ["m3", "m4"]
    assert [m.text() for m in log.messages] == ["m3", "m4"]


def test_a_shorter_log_after_an_edit_elsewhere_is_taken_and_data_loss_is_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    local = LocalHistory("s")
    local.seen([], [user(0), user(1), user(2)], 3, 1, 3)
    with caplog.at_level(logging.ERROR):
        assert not local.seen([], [user(0), user(1)], 2, 2, 2)  # popped elsewhere: version 2
        assert not caplog.records
        assert local.seen([], [user(0)], 1, 2, 1)  # an older snapshot: same version
    assert "Redis lost 1 messages of session s" in caplog.text
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
    idle.touched -= 61  # Redis expired the session by now: the copy is stale
    assert copy_of(guard, "t", "a", ttl=60) is not idle


def test_a_deleted_log_is_not_written_back() -> None:
    local, log = LocalHistory("s"), Log()
    local.seen([], [user(0), user(1)], 2, 0, 2)
    assert local.seen([], [], 0, 0, 0)
    assert local.messages() == [] and local.length == 0
    local.record([user(2)], down, log.length)  # the new log's first turn, missed
    local.flush(log.append, log.length)
    assert [m.text() for m in log.messages] == ["m2"]


def test_a_copy_that_never_knew_the_log_reports_no_misplacement(
        caplog: pytest.LogCaptureFixture) -> None:
    """A fresh process saves during an outage: once Redis is back its batch follows the
    log, which it never read; nothing was saved meanwhile that it knew of."""
    local, log = LocalHistory("s"), Log()
    log.append([user(0), user(1)], "earlier")
    assert not local.record([user(2)], down, log.length)
    with caplog.at_level(logging.ERROR):
        assert local.flush(log.append, log.length) == 1
    assert not caplog.records
    assert [m.text() for m in log.messages] == ["m0", "m1", "m2"]


class ForgetfulLog(Log):
    """A log that forgets request ids (the store's ``idempotency_ttl`` passed)."""

    def append(self, batch: list[Message], request_id: str) -> int:
        self.messages.extend(batch)
        return len(self.messages)

    def read(self, start: int, end: int) -> list[Message]:
        return self.messages[start:end]


def test_a_landed_batch_older_than_the_request_id_ttl_is_not_saved_twice(
        caplog: pytest.LogCaptureFixture) -> None:
    local, log = LocalHistory("s", ids_ttl=0.05), ForgetfulLog()
    assert local.record([user(0)], log.append, log.length, log.read)

    def landed(batch: list[Message], request_id: str) -> int:
        log.append(batch, request_id)  # applied; the reply is lost
        raise StoreUnavailable("timeout")

    assert not local.record([user(1)], landed, log.length, log.read)
    with caplog.at_level(logging.WARNING):
        assert local.flush(log.append, log.length, log.read) == 1  # young: sent again
    assert [m.text() for m in log.messages] == ["m0", "m1", "m1"]  # (ForgetfulLog)
    del log.messages[-1]
    caplog.clear()
    assert not local.record([user(2)], landed, log.length, log.read)
    time.sleep(0.06)  # older than the store remembers its id
    with caplog.at_level(logging.WARNING):
        assert local.record([user(3)], log.append, log.length, log.read)
    assert [m.text() for m in log.messages] == ["m0", "m1", "m2", "m3"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "in the log already" in caplog.text


def test_the_copy_is_bounded_by_tokens() -> None:
    local, log = LocalHistory("s", limit=1000, count=lambda m: len(m.text())), Log()
    big = [Message(role="user", content="x" * 300) for _ in range(10)]
    for message in big:
        assert local.record([message], log.append, log.length)
    assert local.tokens <= 1000 and len(local.messages()) <= 3
    for message in big:  # Redis down: unsaved ones too, the newest batch kept whole
        local.record([message], down, log.length)
    assert local.tokens <= 1000 + 300


def test_a_guard_s_copies_are_bounded_by_tokens_unsaved_kept_last(
        monkeypatch: pytest.MonkeyPatch) -> None:
    class Guard:
        pass

    monkeypatch.setattr(agents_local, "TOKENS", 1000)
    guard, log = Guard(), Log()

    def copy(name: str) -> LocalHistory:
        return copy_of(guard, "t", name, count=lambda m: len(m.text()))

    copy("a").record([Message(role="user", content="x" * 400)], down, log.length)
    for name in "bcde":
        copy(name).record([Message(role="user", content="y" * 400)], log.append, log.length)
    copies = agents_local._COPIES[guard]
    assert sum(c.tokens for c in copies._copies.values()) <= 1000 + 400
    assert ("t", "a") in copies._copies  # unsaved: kept while others can go
