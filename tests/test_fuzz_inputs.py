"""Bad input at the two doors of the hot path: ``append`` and ``prepare``.

What must hold whatever a caller sends:

- a rejected append raises :class:`InvalidInput` (or its branch
  :class:`LimitExceeded`) naming the field, and writes nothing (the log
  length is unchanged: all or nothing);
- what append accepted, prepare can always read back, and its view converts
  to every provider's wire format;
- prepare's own arguments (pending messages, system prompt, tools,
  max_tokens, model) are validated the same way.

Hypothesis drives the general properties on fakeredis (fast); targeted tests
pin the sizes and shapes named in the issue (10 MB messages, deep nesting,
lone surrogates, orphan tool results, non-JSON arguments, unknown roles).
The last group pins inputs that fuzzing once found slipping through.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from typing import Any

import fakeredis
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.core.config import StoreConfig
from shared.core.errors import InvalidInput, LimitExceeded
from shared.core.messages import ROLES, validate_messages
from shared.core.repair import PROVIDERS, validate_view
from shared.core.wire import to_anthropic, to_gemini, to_openai
from shared.guard import PreparedView
from shared.store.sessions import SessionStore
from tests.guard_shells import OPEN, SHELLS, make

FUZZ = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
_ids = itertools.count()


def fresh_session() -> str:
    return f"fuzz-{next(_ids)}"


@pytest.fixture(scope="module")
def store() -> SessionStore:
    return SessionStore(fakeredis.FakeRedis(), StoreConfig(max_message_bytes=200_000))


@pytest.fixture(scope="module", params=SHELLS)
def guard(request: pytest.FixtureRequest, store: SessionStore) -> Iterator[Any]:
    """One guard of each shell for the module's examples (an async shell is closed at the
    module's end, not after each test as tests.guard_shells.close_all would)."""
    guard = make(request.param, store, overrides={"gpt-4o": 32_000})
    if guard in OPEN:
        OPEN.remove(guard)
    yield guard
    guard.close()


def usable(view: PreparedView) -> None:
    """The view is valid for every provider and converts to every wire format."""
    for provider in PROVIDERS:
        assert validate_view(view.messages, provider) == [], provider
    to_openai(view.messages)
    to_anthropic(view.messages)
    to_gemini(view.messages)


# -- strategies -----------------------------------------------------------------------------
# Text a client may send: any code point, including NUL, controls, bidi overrides, emoji,
# combining marks; ``untrusted`` adds lone surrogates (refused by field, never stored).
any_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=60)
untrusted = st.one_of(any_text, st.lists(st.one_of(
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), st.characters()),
    min_size=1, max_size=8).map("".join))
weird_text = st.sampled_from(["", " ", "\x00", "\u202e\u2066evil", "\U0001f600" * 3, "e\u0301",
                              "\ufeff", "</transcript>", "null", "{", "\\u0000", "a" * 5000])
text = st.one_of(any_text, weird_text)
raw_text = st.one_of(text, untrusted)


def _deep(depth: int) -> Any:
    nested: Any = "leaf"
    for _ in range(depth):
        nested = [nested]
    return nested


junk = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True),
                 st.binary(max_size=8), st.lists(st.integers(), max_size=3),
                 st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63),
              st.floats(allow_nan=False, allow_infinity=False),  # what JSON holds
              any_text),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(any_text, inner, max_size=3)),
    max_leaves=12)
call_ids = st.one_of(st.sampled_from(["call_1", "call_2", "ghost"]), text, junk)
arguments = st.one_of(
    st.dictionaries(st.text(max_size=8), json_values, max_size=3).map(json.dumps),
    st.dictionaries(st.text(max_size=8), json_values, max_size=3),
    st.sampled_from(["", "   ", "{bad json", "[1, 2", "{'single': 'quotes'}", "NaN", "\x00",
                     "[1, 2]", "5", "null", '"text"', "[" * 3000 + "]" * 3000]),
    junk)
tool_calls = st.lists(st.fixed_dictionaries(
    {"id": call_ids, "name": st.one_of(st.sampled_from(["read_file", "bash"]), text, junk),
     "arguments": arguments}), max_size=3)
roles = st.one_of(st.sampled_from([*ROLES, "developer", "function", "USER", "", "model"]), junk)
good_parts = st.lists(st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, text),
    st.just({"type": "image", "url": "https://example.com/cat.png", "detail": "low"}),
    st.just({"type": "image", "data": "aGVsbG8=", "media_type": "image/png"}),
    # (a provider file id is not portable: Gemini refuses an OpenAI one, by design)
    st.just({"type": "file", "data": "JVBERi0=", "media_type": "application/pdf",
             "filename": "report.pdf"})),
    min_size=1, max_size=3)
content_parts = st.one_of(good_parts, st.lists(st.one_of(
    junk, st.dictionaries(st.sampled_from(["type", "text", "url", "data"]),
                          st.one_of(raw_text, junk), max_size=3)), max_size=3))


@st.composite
def raw_messages(draw: st.DrawFn) -> Any:
    """A message dict as an untrusted client might send it (often valid, often not)."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.one_of(junk, text))  # not even an object
    message: dict[str, Any] = {"role": draw(roles)}
    if draw(st.booleans()):
        message["content"] = draw(st.one_of(raw_text, raw_text, junk, content_parts))
    if draw(st.integers(0, 3)) == 0:
        message["tool_calls"] = draw(st.one_of(tool_calls, junk))
    if draw(st.integers(0, 2)) == 0 or message["role"] == "tool":
        message["tool_call_id"] = draw(call_ids)
    if draw(st.integers(0, 5)) == 0:
        message["name"] = draw(st.one_of(raw_text, junk))
    if draw(st.integers(0, 5)) == 0:
        message["metadata"] = draw(st.dictionaries(raw_text, st.one_of(
            json_values, st.just(_deep(400)), junk), max_size=3))
    if draw(st.integers(0, 9)) == 0:
        message[draw(st.sampled_from(["extra", "function_call", "refusal"]))] = draw(text)
    return message


@st.composite
def valid_messages(draw: st.DrawFn) -> dict[str, Any]:
    """Messages append must accept: any role order, orphan results, odd but legal text."""
    role = draw(st.sampled_from(ROLES))
    content = draw(st.one_of(text, text, text, good_parts)) if role == "user" else draw(text)
    message: dict[str, Any] = {"role": role, "content": content}
    if role == "tool":
        message["tool_call_id"] = draw(st.sampled_from(["call_1", "call_2", "ghost", "x" * 256]))
    if role == "assistant" and draw(st.booleans()):
        message["tool_calls"] = [
            {"id": draw(st.sampled_from(["call_1", "call_2", "dup"])),
             "name": draw(st.sampled_from(["read_file", "bash", "n" * 256])),
             "arguments": json.dumps(draw(st.dictionaries(st.text(max_size=6), json_values,
                                                           max_size=3)))}
            for _ in range(draw(st.integers(1, 3)))]
    return message


def assert_names_a_field(error: InvalidInput, prefix: str) -> None:
    assert error.field is not None and error.field.startswith(prefix), (error.field, str(error))
    assert str(error).startswith(error.field)


# -- append: clear errors, all or nothing ------------------------------------------------------

@FUZZ
@given(batch=st.lists(raw_messages(), min_size=1, max_size=5), seed=valid_messages())
def test_append_rejects_bad_input_by_field_and_writes_nothing(
        store: SessionStore, batch: list[Any], seed: dict[str, Any]) -> None:
    sid = fresh_session()
    store.append(sid, [seed])
    try:
        length = store.append(sid, batch)
    except InvalidInput as exc:
        assert_names_a_field(exc, "messages")
        assert store.length(sid) == 1, "a rejected append must write nothing"
    else:
        assert length == 1 + len(batch) == store.length(sid)


@FUZZ
@given(batch=st.lists(valid_messages(), min_size=1, max_size=12),
       more=st.lists(valid_messages(), max_size=6), cut=st.integers(0, 20))
def test_prepare_reads_back_whatever_append_accepted(
        store: SessionStore, guard: Any, batch: list[dict[str, Any]],
        more: list[dict[str, Any]], cut: int) -> None:
    """Orphan results, leading assistant or tool messages, NUL, bidi, emoji: views stay valid."""
    sid = fresh_session()
    store.append(sid, batch)
    usable(guard.prepare(sid, "You are a helpful agent.", None, 500, "gpt-4o"))
    store.truncate_after(sid, min(cut, store.length(sid)))  # an edit mid-turn
    if more:
        store.append(sid, more)
    usable(guard.prepare(sid, "", None, 1000, "gpt-4o", pending=more[-1:]))


@FUZZ
@given(pending=st.one_of(st.lists(raw_messages(), max_size=3), junk, text),
       system=st.one_of(any_text, untrusted, junk),
       max_tokens=st.one_of(st.none(), st.integers(-5, 10**7), junk),
       model=st.one_of(st.sampled_from(["gpt-4o", "claude-sonnet-4", "unknown-model-x"]),
                       text, junk),
       tools=st.one_of(st.none(), text, junk, st.lists(st.one_of(junk, st.fixed_dictionaries(
           {"type": st.just("function"), "function": st.fixed_dictionaries(
               {"name": text, "parameters": json_values})})), max_size=2)))
def test_prepare_validates_its_arguments(guard: Any, pending: Any, system: str,
                                         max_tokens: Any, model: Any, tools: Any) -> None:
    sid = fresh_session()
    guard.store.append(sid, [{"role": "user", "content": "hello"}])
    try:
        view = guard.prepare(sid, system, tools, max_tokens, model, pending=pending)
    except InvalidInput as exc:
        assert exc.field, str(exc)
        assert exc.field.split("[")[0].split(".")[0] in (
            "pending", "tools", "max_tokens", "model", "system_prompt"), exc.field
    else:
        usable(view)
    assert guard.store.length(sid) == 1, "prepare never writes the log"


# -- the shapes named in the issue --------------------------------------------------------------

def _rejected(store: SessionStore, batch: list[Any], field: str,
              kind: type[InvalidInput] = InvalidInput) -> InvalidInput:
    sid = fresh_session()
    store.append(sid, [{"role": "user", "content": "first"}])
    with pytest.raises(kind) as caught:
        store.append(sid, batch)
    assert caught.value.field == field, str(caught.value)
    assert store.length(sid) == 1
    return caught.value


def test_ten_megabyte_message_is_refused_by_index() -> None:
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig())  # default limit: 2 MB
    ok = {"role": "user", "content": "fine"}
    huge = {"role": "tool", "tool_call_id": "c1", "content": "x" * 10_000_000}
    error = _rejected(store, [ok, ok, huge], "messages[2]", LimitExceeded)
    assert "bytes" in str(error) and "2000000" in str(error)


def test_too_many_messages_per_call_and_per_session_are_limits() -> None:
    store = SessionStore(fakeredis.FakeRedis(),
                         StoreConfig(max_messages_per_call=10, max_messages_per_session=12))
    msg = {"role": "user", "content": "m"}
    _rejected(store, [msg] * 11, "messages", LimitExceeded)
    sid = fresh_session()
    store.append(sid, [msg] * 10)
    with pytest.raises(LimitExceeded) as caught:
        store.append(sid, [msg] * 3)
    assert caught.value.field == "messages" and store.length(sid) == 10


@pytest.mark.parametrize(("batch", "field"), [
    ([{"role": "hacker", "content": "x"}], "messages[0].role"),
    ([{"role": "user", "content": "ok"}, {"role": "robot"}], "messages[1].role"),
    ([{"role": "assistant", "tool_calls": [{"id": "c", "name": "f", "arguments": "{bad"}]}],
     "messages[0].tool_calls.0.arguments"),
    ([{"role": "assistant", "tool_calls": [{"id": "c", "name": "f", "arguments": 5}]}],
     "messages[0].tool_calls.0.arguments"),
    ([{"role": "tool", "content": "result without its call id"}], "messages[0].tool_call_id"),
    ([{"role": "user", "content": 42}], "messages[0].content.str"),
    ([{"role": "user", "content": "x", "surprise": True}], "messages[0].surprise"),
    (["just a string"], "messages[0]"),
    ("not a list", "messages"),
    ([{"role": "user", "tool_calls": [{"id": "c", "name": "f"}]}], "messages[0].tool_calls"),
])
def test_bad_messages_are_named(batch: Any, field: str) -> None:
    _rejected(SessionStore(fakeredis.FakeRedis(), StoreConfig()), batch, field)


def test_orphan_tool_results_are_kept_in_the_log_and_repaired_in_the_view(
        make_guard: Callable[..., Any]) -> None:
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig())
    guard = make_guard(store)
    store.append("s", [{"role": "tool", "tool_call_id": "ghost", "content": "lost result"},
                       {"role": "user", "content": "hi"},
                       {"role": "assistant", "tool_calls": [{"id": "c1", "name": "f"}]},
                       {"role": "user", "content": "the result never came"}])
    assert store.length("s") == 4  # the raw log is never edited
    view = guard.prepare("s", "system")
    usable(view)
    assert "lost result" not in json.dumps(view.openai())


def test_moderately_deep_json_is_accepted_and_read_back(
        make_guard: Callable[..., Any]) -> None:
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig())
    nested: Any = "leaf"
    for _ in range(60):
        nested = {"k": [nested]}
    store.append("s", [{"role": "user", "content": "x"},
                       {"role": "assistant", "tool_calls": [
                           {"id": "c", "name": "f", "arguments": json.dumps({"q": nested})}]},
                       {"role": "tool", "tool_call_id": "c", "content": "ok"}])
    usable(make_guard(store).prepare("s"))


# -- inputs that once slipped through (each was a bug found by fuzzing) ---------------------------

def _expect_invalid(call: Callable[[], Any], field_prefix: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        call()
    assert_names_a_field(caught.value, field_prefix)


def test_content_parts_survive_the_store(make_guard: Callable[..., Any]) -> None:
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig())
    store.append("s", [{"role": "user", "content": [
        {"type": "text", "text": "look at this"},
        {"type": "image", "url": "https://example.com/cat.png"}]}])
    usable(make_guard(store).prepare("s"))


def test_lone_surrogate_is_rejected_by_field() -> None:
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig())
    _expect_invalid(lambda: store.append("s", [{"role": "user", "content": "a\ud800b"}]),
                    "messages[0]")
    assert store.length("s") == 0


def test_deeply_nested_metadata_is_rejected_by_field() -> None:
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig())
    nested: Any = []
    for _ in range(400):
        nested = [nested]
    _expect_invalid(lambda: store.append(
        "s", [{"role": "user", "content": "x", "metadata": {"deep": nested}}]), "messages[0]")


def test_deeply_nested_arguments_are_rejected_by_field() -> None:
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig())
    deep = "[" * 5000 + "]" * 5000
    _expect_invalid(lambda: store.append("s", [{"role": "assistant", "tool_calls": [
        {"id": "c", "name": "f", "arguments": deep}]}]), "messages[0].tool_calls")


def test_non_object_arguments_are_refused_or_converted(make_guard: Callable[..., Any]) -> None:
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig())
    batch = [{"role": "user", "content": "x"},
             {"role": "assistant", "tool_calls": [{"id": "c", "name": "f", "arguments": "[1, 2]"}]},
             {"role": "tool", "tool_call_id": "c", "content": "ok"}]
    try:
        store.append("s", batch)
    except InvalidInput as exc:
        assert_names_a_field(exc, "messages[1].tool_calls")
        return
    usable(make_guard(store).prepare("s"))


def test_none_instead_of_a_list_is_named() -> None:
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig())
    _expect_invalid(lambda: store.append("s", None), "messages")  # type: ignore[arg-type]


@pytest.mark.parametrize("system_prompt", [5, None, ["a"], "\ud800"])
def test_bad_system_prompt_is_named(
        system_prompt: Any, make_guard: Callable[..., Any]) -> None:
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig())
    _expect_invalid(lambda: make_guard(store).prepare("s", system_prompt), "system_prompt")


@pytest.mark.parametrize("depth", [250, 5000])
def test_deeply_nested_tool_schema_is_named(
        depth: int, make_guard: Callable[..., Any]) -> None:
    """Bounded by our own limit: Python 3.13's json wrote 5,000 levels (3.11's stopped),
    and the guard's copy of the definitions then raised a bare RecursionError."""
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig())
    schema: Any = {}
    for _ in range(depth):
        schema = {"items": schema}
    tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    _expect_invalid(lambda: make_guard(store).prepare("s", "", tools), "tools")


def test_arguments_given_as_deeply_nested_objects_are_named() -> None:
    nested: Any = {}
    for _ in range(250):
        nested = {"k": nested}
    call = {"role": "assistant", "content": None,
            "tool_calls": [{"id": "c", "name": "f", "arguments": nested}]}
    with pytest.raises(InvalidInput, match="nested too deeply"):
        validate_messages([call])


@pytest.mark.parametrize("tools", [1, 2.5, True])
def test_non_list_tools_are_named(tools: Any, make_guard: Callable[..., Any]) -> None:
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig())
    _expect_invalid(lambda: make_guard(store).prepare("s", "", tools), "tools")
