"""A tool chain that outgrows the window truncates on every call: each call's truncation
record (the previous summary, then the cut's note) is counted from its parts
(shared.core.tokens_joined.joined_tokens), the summary once per record, the note per call. The
figure is the whole block's, and the views are the ones counting it whole makes.

Two worlds on one real Redis (a key prefix each) take the same calls: in one the block is
counted from its parts, in the other whole (``tokens_joined.JOINED`` off around its calls). Every
view must match.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from shared.core import tokens, tokens_joined
from shared.core.errors import CompactionError
from shared.core.records import SummaryRecord
from shared.core.tokens import HeuristicCounter
from shared.core.tokens_classes import _CHUNK
from shared.core.tokens_joined import joined_tokens
from tests.worlds import GREETING, KeyedWorld, canonical, recorded_alike, tool_chain

PIECES = ("a", "Ab", "xyz ", "word ", "  ", "    ", "\n", "\r\n", "\t", "é", "日本", "Жук", "😀",
          "</", '="', '">', "/>", "<b>", "123", " 45", '{"k": ', "\\n", "QUJDRA" * 12, "-_=+/",
          "camelCase", "CONST", "\x1b[0m", "...", ", ")
SIGNS = (" yang ", " het ", " ya ", " ang ")
COUNTERS = (HeuristicCounter(), HeuristicCounter("anthropic", 0.1),
            HeuristicCounter("gemini"), HeuristicCounter("generic", 0.0))


def _text(draw: st.DrawFn, high: int, signs: bool = False) -> str:
    pieces = st.sampled_from(PIECES + SIGNS if signs else PIECES)
    return "".join(draw(st.lists(pieces, max_size=high)))


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_a_text_counted_from_its_parts_is_counted_as_whole(data: st.DataObject) -> None:
    draw = data.draw
    signs = draw(st.booleans())
    head = _text(draw, draw(st.sampled_from([10, 200, 2_000])), signs)
    if draw(st.integers(0, 9)) == 0:  # longer than the heuristic's slice
        head = head + "x = 1\n" * (_CHUNK // 6 + draw(st.integers(0, 50)))
    middle = _text(draw, 40, signs)
    tail = _text(draw, draw(st.sampled_from([0, 5, 40, 300])), signs)
    for counter in COUNTERS:
        assert joined_tokens(counter, head, middle, tail) == counter.text(head + middle + tail)


def test_the_parts_are_counted_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the figure costs: after the first call with a head, the head is not counted
    again, nor the whole text (the middle and the tail's start alone, by their parts)."""
    head = "The summary so far: " + "we read src/app.py and fixed a test. " * 200
    tail = "\n\n- src/app.py: fixed\n</conversation_summary>"
    counter = HeuristicCounter()
    notes = [f"[context truncated: {k} earlier messages dropped]" for k in range(40)]
    expected = [counter.text(head + note + tail) for note in notes]
    joined_tokens(counter, head, "[note]", tail)
    counted: list[int] = []
    real = tokens_joined._parts

    def spy(text: str, markup: bool) -> tuple[float, float, int, int]:
        counted.append(len(text))
        return real(text, markup)

    monkeypatch.setattr(tokens_joined, "_parts", spy)
    monkeypatch.setattr(tokens, "_features", lambda text: pytest.fail("counted whole"))
    assert [joined_tokens(counter, head, note, tail) for note in notes] == expected
    assert max(counted) < 200


# -- the guard: a chain that outgrows the window ------------------------------------

WORDS = ("def", "return", "x", "path", "src/app.py", "ok", "FAILED", "café", "42", "{", "}",
         "\n", "    ", "assert", "日本", "error:", "line", "==", "<div>", "</p>")


def _words(draw: st.DrawFn, low: int, high: int) -> str:
    return " ".join(draw(st.lists(st.sampled_from(WORDS), min_size=low, max_size=high)))


@st.composite
def chains(draw: st.DrawFn) -> dict[str, Any]:
    """Recorded turns, a stored summary or none, then chains whose calls are prepared one
    by one in a window they outgrow."""
    def turn(t: int, calls: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{"role": "user", "content": f"task {t}: "
                                      + _words(draw, 1, 12)}]
        for c in range(calls):
            width = draw(st.integers(1, 2))
            ids = [f"c{t}_{c}_{k}" for k in range(width)]
            out.append({"role": "assistant", "content": draw(st.sampled_from(["", "Looking."])),
                        "tool_calls": [{"id": i, "name": "read_file",
                                        "arguments": f'{{"path": "src/f{c}_{k}.py"}}'}
                                       for k, i in enumerate(ids)]})
            for i in ids:
                size = draw(st.sampled_from([1, 10, 40, 120]))  # (hypothesis draws short lists)
                out.append({"role": "tool", "tool_call_id": i,
                            "content": " ".join([_words(draw, 1, 8)] * size)})
        out.append({"role": "assistant", "content": "done " + _words(draw, 1, 5)})
        return out

    recorded = [turn(t, draw(st.integers(0, 3))) for t in range(draw(st.integers(1, 4)))]
    live = [turn(10 + t, draw(st.integers(4, 16))) for t in range(draw(st.integers(1, 2)))]
    summary = draw(st.sampled_from([0, 0, 300, 1_500, 4_000]))
    return {"recorded": recorded, "live": live, "summary": _words(draw, 1, 10) * (summary // 30)
            if summary else "", "ledger": draw(st.sampled_from(["", "- src/app.py: fixed"])),
            "window": draw(st.sampled_from([1_800, 2_500, 3_500, 5_000])),
            "max_tokens": draw(st.sampled_from([200, 300, 600]))}


class World(KeyedWorld):
    """One guard over its own keys; ``whole``: every truncation block counted whole."""

    def __init__(self, client: redis.Redis, shell: str, whole: bool, window: int) -> None:
        super().__init__(client, shell, window, "t")
        self.whole = whole

    def prepare(self, pending: list[Any], max_tokens: int | None) -> dict[str, Any]:
        joined, tokens_joined.JOINED = tokens_joined.JOINED, not self.whole
        try:
            got = self.guard.prepare("s", "You are a careful coding agent.", None, max_tokens,
                                     "m", pending=pending)
        except CompactionError as exc:  # what cannot fit at all: alike in both worlds
            return {"error": type(exc).__name__}
        finally:
            tokens_joined.JOINED = joined
        report = got.report.model_dump(exclude={"elapsed_ms"})
        return {"messages": [m.model_dump() for m in got.messages], "report": report,
                "openai": list(got.wire("openai")), "anthropic": got.anthropic(),
                "gemini": got.gemini()}


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url, socket_timeout=5, socket_connect_timeout=2)
    yield c
    c.close()


def _replay(client: redis.Redis, shell: str, case: dict[str, Any]) -> int:
    """Both worlds through the case; how many calls truncated."""
    worlds = [World(client, shell, whole, case["window"]) for whole in (False, True)]
    truncated = 0
    try:
        for turn in case["recorded"]:
            for w in worlds:
                w.guard.record_turn("s", turn)
        if case["summary"]:
            for w in worlds:
                state = w.store.state("s")
                record = SummaryRecord(watermark=len(w.store.messages("s")), kind="offline",
                                       text=case["summary"], ledger=case["ledger"], tokens=1)
                assert w.store.commit_summary("s", record, state.version).ok
        for turn in case["live"]:
            for i in [i for i, m in enumerate(turn) if m["role"] == "assistant"]:
                views = [w.prepare(turn[:i], case["max_tokens"]) for w in worlds]
                assert canonical(views[0]) == canonical(views[1])
                truncated += "report" in views[0] and views[0]["report"]["truncated"]
            recorded_alike(worlds, turn, summaries=True)
        return truncated
    finally:
        for w in worlds:
            w.close(client)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=chains())
def test_a_chain_that_outgrows_the_window_truncates_as_counted_whole(
        client: redis.Redis, case: dict[str, Any]) -> None:
    event(f"truncated calls: {min(_replay(client, 'sync', case), 10)}+")


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=chains())
def test_the_async_guard_truncates_them_alike(client: redis.Redis,
                                              case: dict[str, Any]) -> None:
    _replay(client, "async", case)


def _long_chain() -> dict[str, Any]:
    return {"recorded": [GREETING], "live": [tool_chain(26, "x = 1\n" * 60, path="src/f{}.py")],
            "window": 2_500, "max_tokens": 300,
            "summary": "We read src/app.py, ran the tests and fixed two of them. " * 120,
            "ledger": "- src/app.py: fixed"}


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_long_chain_truncates_on_every_call_as_counted_whole(
        client: redis.Redis, shell: str) -> None:
    assert _replay(client, shell, _long_chain()) >= 20


def test_a_chain_that_truncates_again_counts_the_summary_once(
        client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each call of a chain that outgrows the window truncates, each with a new note after
    the same summary: the summary is counted once per record, not on every call (it
    was: a third of such a call, on a 6k-character summary)."""
    case = _long_chain()
    summary = case["summary"]
    world = World(client, "sync", False, case["window"])
    counted: list[int] = []
    real = tokens._features

    def spy(text: str) -> tuple[float, float]:
        counted.append(len(text))
        return real(text)

    try:
        world.guard.record_turn("s", case["recorded"][0])
        state = world.store.state("s")
        assert world.store.commit_summary("s", SummaryRecord(
            watermark=len(world.store.messages("s")), kind="offline", text=summary,
            ledger=case["ledger"], tokens=1), state.version).ok
        turn = case["live"][0]
        calls = [i for i, m in enumerate(turn) if m["role"] == "assistant"]
        monkeypatch.setattr(tokens, "_features", spy)
        again = 0
        for n, i in enumerate(calls):
            counted.clear()
            got = world.prepare(turn[:i], case["max_tokens"])
            if n >= 3 and got["report"]["truncated"]:
                again += 1
                assert max(counted, default=0) < len(summary), (n, counted)
        assert again >= 15
    finally:
        world.close(client)
