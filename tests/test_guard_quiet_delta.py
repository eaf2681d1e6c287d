"""A tool chain's quiet prepare planned from the last one (shared.core.quiet) is the one a
full plan makes: the same messages, report and wire payloads, over random chains, budgets
(truncation included) and requests that change mid-turn.

Two worlds on one real Redis (a key prefix each) take the same calls: in one the guard
may plan a call from the turn's last quiet plan, in the other every call is planned in
full (the shortcut switched off on that guard). Every view must match, and the shortcut
must have been taken.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from shared.core.messages import Message
from shared.guard._again import QuietAgain
from tests.worlds import GREETING, KeyedWorld, canonical, recorded_alike, tool_chain

SYSTEMS = ("You are a careful coding agent.", "You are a careful coding agent. Be brief.")
TOOLS = (None, [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}])
WORDS = ("def", "return", "x", "path", "src/app.py", "ok", "FAILED", "café", "42", "{", "}",
         "\n", "    ", "assert", "日本", "error:", "line", "==")


def _text(draw: st.DrawFn, low: int, high: int) -> str:
    words = draw(st.lists(st.sampled_from(WORDS), min_size=low, max_size=high))
    return " ".join(words)


@st.composite
def chains(draw: st.DrawFn) -> dict[str, Any]:
    """Recorded turns, then the turns whose calls are prepared one by one."""
    def turn(t: int, calls: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{"role": "user", "content": f"task {t}: "
                                      + _text(draw, 1, 12)}]
        for c in range(calls):
            width = draw(st.integers(1, 3))  # parallel calls now and then
            ids = [f"c{t}_{c}_{k}" if draw(st.integers(0, 30)) != 0 else f"c0_0_{k}"
                   for k in range(width)]  # a repeated id now and then: renamed
            out.append({"role": "assistant", "content": draw(st.sampled_from(["", "Looking."])),
                        "tool_calls": [{"id": i, "name": "read_file",
                                        "arguments": f'{{"path": "f{k}.py"}}'}
                                       for k, i in enumerate(ids)]})
            for i in ids:
                size = draw(st.sampled_from([2, 20, 200, 900]))
                out.append({"role": "tool", "tool_call_id": i, "content": _text(draw, 1, size)})
        out.append({"role": "assistant", "content": "done " + _text(draw, 1, 5)})
        return out

    # at least one stored turn: a new session's view is not cached, every call reads it
    recorded = [turn(t, draw(st.integers(0, 3))) for t in range(draw(st.integers(1, 4)))]
    live = [turn(10 + t, draw(st.integers(1, 14))) for t in range(draw(st.integers(1, 2)))]
    return {"recorded": recorded, "live": live,
            "window": draw(st.sampled_from([3_000, 6_000, 12_000, 20_000, 40_000, 1_000_000,
                                            1_000_000])),
            "max_tokens": draw(st.sampled_from([None, 300, 1_000])),
            # per call: 0 as asked; 1 another system prompt; 2 the tools; 3 as Message objects;
            # 4 an earlier pending message changed (not a continuation)
            "twists": draw(st.lists(st.integers(0, 24), min_size=40, max_size=40))}


class World(KeyedWorld):
    """One guard over its own keys; ``full``: every call planned in full."""

    def __init__(self, client: redis.Redis, shell: str, full: bool, window: int) -> None:
        super().__init__(client, shell, window, "q")
        inner = getattr(self.guard, "inner", self.guard)
        self.again = 0
        if full:
            inner.planned_again = lambda *a, **k: None
        else:
            planned = inner.planned_again

            def counted(*args: Any, **kwargs: Any) -> Any:
                plan = planned(*args, **kwargs)
                self.again += plan is not None
                return plan

            inner.planned_again = counted

    def prepare(self, pending: list[Any], system: str, tools: Any, max_tokens: int | None,
                ) -> dict[str, Any]:
        view = self.guard.prepare("s", system, tools, max_tokens, "m", pending=pending)
        report = view.report.model_dump(exclude={"elapsed_ms"})
        return {"messages": [m.model_dump() for m in view.messages], "report": report,
                "openai": list(view.wire("openai")), "flat": view.openai(),
                "reasoning": view.openai(include_reasoning=True),
                "anthropic": view.anthropic(), "gemini": view.gemini(),
                "shared": list(view.anthropic(shared=True)[1])}


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url, socket_timeout=5, socket_connect_timeout=2)
    yield c
    c.close()


def _replay(client: redis.Redis, shell: str, case: dict[str, Any]) -> int:
    worlds = [World(client, shell, full, case["window"]) for full in (False, True)]
    try:
        for turn in case["recorded"]:
            for w in worlds:
                w.guard.record_turn("s", turn)
        twists = iter(case["twists"] * 10)
        for turn in case["live"]:
            calls = [i for i, m in enumerate(turn) if m["role"] == "assistant"]
            as_models = [Message.model_validate(m) for m in turn]
            for i in calls:
                twist = next(twists)
                pending: list[Any] = (as_models if twist == 3 else turn)[:i]
                if twist == 4 and i > 1:
                    pending = [*pending[:1], {**turn[1], "content": "changed"}, *pending[2:]]
                system = SYSTEMS[twist == 1]
                tools = TOOLS[twist == 2]
                views = [w.prepare(pending, system, tools, case["max_tokens"]) for w in worlds]
                assert canonical(views[0]) == canonical(views[1])
            recorded_alike(worlds, turn)
        return worlds[0].again
    finally:
        for w in worlds:
            w.close(client)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=chains())
def test_a_quiet_call_planned_from_the_last_is_the_full_plan(
        client: redis.Redis, case: dict[str, Any]) -> None:
    event(f"planned from the last: {min(_replay(client, 'sync', case), 3)}+")


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=chains())
def test_the_async_guard_plans_them_alike(client: redis.Redis, case: dict[str, Any]) -> None:
    _replay(client, "async", case)


def test_a_long_chain_is_planned_from_its_last_call(client: redis.Redis) -> None:
    """A 26-call chain in a window it fits (of a session with a stored turn: a new one's
    view is not cached): every call after the turn's second is planned
    from the last (the first has the user message newest, which sizes the reserve), and
    the views are the full plan's."""
    case = {"recorded": [GREETING], "live": [tool_chain(26, "x = 1\n" * 50)],
            "window": 1_000_000, "max_tokens": 1_000, "twists": [0] * 40}
    assert _replay(client, "sync", case) == 25


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_chain_whose_call_ids_repeat_is_planned_from_its_last_call(
        client: redis.Redis, shell: str) -> None:
    """A real agent's 26-call chain can call an id twice (a provider's positional ids, or
    an id it used earlier in the turn): the turn is renamed, and each call continues that
    renaming from the last quiet plan instead of planning the view in full (it did from
    the first repeated id on). The views are the full plan's, and the append stores the
    ids the last prepare sent."""
    # from the tenth call on, every id was called before in the turn
    turn = tool_chain(26, "x = 1\n" * 50, call_id=lambda c: f"k{c % 9}")
    first = GREETING
    case = {"recorded": [first], "live": [turn], "window": 1_000_000, "max_tokens": 1_000,
            "twists": [0] * 40}
    # every call after the turn's second but the one whose id first repeats (it renames)
    assert _replay(client, shell, case) == 24

    world = World(client, "sync", False, 1_000_000)
    try:
        world.guard.record_turn("s", first)
        sent = world.prepare(turn[:-1], SYSTEMS[0], None, 1_000)["messages"][-52:]
        world.guard.record_turn("s", turn)
        stored = [m.model_dump() for m in world.store.messages("s")][-53:-1]
        ids = [[c["id"] for c in m["tool_calls"]] or m["tool_call_id"] for m in sent]
        assert ids == [[c["id"] for c in m["tool_calls"]] or m["tool_call_id"] for m in stored]
        assert len({i[0] for i in ids if isinstance(i, list)}) == 26  # renamed apart
    finally:
        world.close(client)


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_chain_over_the_trigger_is_planned_from_its_last_call(
        client: redis.Redis, shell: str) -> None:
    """A chain that crosses the compaction trigger while its worker is behind: the first
    call over it plans the cheap stages and queues the job; the calls after it, the job
    queued and nothing new stored, write nothing and are planned from the last (they were
    planned in full, each one). The views are the full plan's."""
    turn = tool_chain(26, "x = 1\n" * 40)
    first = [{"role": "user", "content": "hi " * 13_000}, {"role": "assistant", "content": "hello"}]
    case = {"recorded": [first], "live": [turn], "window": 21_000, "max_tokens": 1_000,
            "twists": [0] * 40}
    worlds = [World(client, shell, full, case["window"]) for full in (False, True)]
    try:
        for w in worlds:
            w.guard.record_turn("s", first)
        over = 0
        for i in [i for i, m in enumerate(turn) if m["role"] == "assistant"]:
            views = [w.prepare(turn[:i], SYSTEMS[0], None, 1_000) for w in worlds]
            assert canonical(views[0]) == canonical(views[1])
            assert views[0]["report"]["budget"]["within_budget"]
            over += views[0]["report"]["budget"]["should_compact"]
        assert over >= 10  # the chain ends over the trigger
        assert worlds[0].again >= 23
    finally:
        for w in worlds:
            w.close(client)


def test_the_shortcut_is_a_quiet_again_of_both_shells() -> None:
    from shared.guard import AsyncContextGuard, ContextGuard

    assert issubclass(ContextGuard, QuietAgain) and issubclass(AsyncContextGuard, QuietAgain)


def test_a_pending_turn_keeps_no_view_the_cache_dropped(client: redis.Redis) -> None:
    """The turn's quiet plan holds its cached view weakly: a view the cache evicts is freed
    though the turn goes on (a turn is kept longer than a view, by other bounds)."""
    import gc
    import weakref

    world = World(client, "sync", False, 1_000_000)
    try:
        world.guard.record_turn("s", [{"role": "user", "content": "hi"},
                                      {"role": "assistant", "content": "hello"}])
        turn: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
        for c in range(3):
            turn.append({"role": "assistant", "content": "", "tool_calls": [
                {"id": f"w{c}", "name": "read_file", "arguments": "{}"}]})
            turn.append({"role": "tool", "tool_call_id": f"w{c}", "content": "ok"})
            world.prepare(turn, SYSTEMS[0], None, None)
        assert world.again >= 1
        cached = weakref.ref(world.guard.views.get("s"))
        world.guard.views.discard("s")
        gc.collect()
        assert cached() is None
        world.prepare(turn, SYSTEMS[0], None, None)  # read again, planned in full
    finally:
        world.close(client)
