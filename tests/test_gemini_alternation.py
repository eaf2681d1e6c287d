"""Gemini contents alternate between user and model: neighbours of one role go out as one
content, in the whole conversion and in the views kept incrementally alike.

The API has refused non-alternating multi-turn contents ("Please ensure that multiturn
requests alternate between user and model"), and wants the responses to a model
content's calls all in the one user content right after it. One exception: function
responses share a content with nothing else (Gemini 3 refuses a user content with text
after its function responses), so tool results then user text are two user contents.
Every output is checked against ``google.genai.types.Content``; views handed out earlier
must not change when the session goes on (a joined content is a new one).
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Callable, Sequence
from typing import Any

from google.genai import types
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.messages import ImagePart, Message, TextPart, ToolCall
from shared.core.wire import to_gemini
from shared.core.wirefold import GeminiFold, fold_of, fold_of_stored, gemini_view
from shared.core.wireview import decode_stored
from shared.store.sessions import SessionStore
from tests.test_wirefold import SYSTEM, folded

LEAD = Message(role="user", content="Summary of the conversation so far: the parser is done.",
               metadata={"compaction": "summary"})
NOTE = Message(role="user", content="[12 earlier messages were dropped to fit the window]",
               metadata={"compaction": "summary"})
M = "gemini-2.5-flash"


def user(text: str) -> Message:
    return Message(role="user", content=text)


def model(text: str, *calls: str) -> Message:
    return Message(role="assistant", content=text, tool_calls=[
        ToolCall(id=c, name="read_file", arguments={"path": f"{c}.py"}) for c in calls])


def result(call: str, text: str) -> Message:
    return Message(role="tool", tool_call_id=call, name="read_file", content=text)


def responses(content: dict[str, Any]) -> bool:
    return any("function_response" in p for p in content["parts"])


def check_contents(contents: Sequence[dict[str, Any]]) -> None:
    """Valid google-genai contents that alternate, but for user text after responses."""
    for c in contents:
        types.Content.model_validate(c)
        assert c["parts"], "the API refuses a content without parts"
        if responses(c):
            assert c["role"] == "user" and all("function_response" in p for p in c["parts"])
    for a, b in itertools.pairwise(contents):
        assert a["role"] != b["role"] or (a["role"] == "user" and responses(a)
                                          and not responses(b)), (a, b)


def shape(contents: Sequence[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    return [(c["role"], [next(k for k in p if k != "thought_signature") for p in c["parts"]])
            for c in contents]


def test_neighbours_of_one_role_go_out_as_one_content() -> None:
    cases: dict[str, tuple[list[Message], list[tuple[str, list[str]]]]] = {
        "a summary leading as a user message, then the user's": (
            [SYSTEM, LEAD, user("next task")], [("user", ["text", "text"])]),
        "two user messages after a cut": (
            [SYSTEM, user("a"), user("b"), model("ok")],
            [("user", ["text", "text"]), ("model", ["text"])]),
        "an assistant message without parts between two user ones": (
            [SYSTEM, user("hi"), model(""), user("are you there?")],
            [("user", ["text", "text"])]),
        "two assistant messages, the second with calls": (
            [SYSTEM, user("go"), model("let me look"), model("", "c1", "c2"),
             result("c2", "B"), result("c1", "A"), model("done")],
            [("user", ["text"]), ("model", ["text", "function_call", "function_call"]),
             ("user", ["function_response", "function_response"]), ("model", ["text"])]),
        "tool results then the user's next text: two user contents": (
            [SYSTEM, user("go"), model("", "c1"), result("c1", "A"), user("and now?"),
             user("hurry")],
            [("user", ["text"]), ("model", ["function_call"]), ("user", ["function_response"]),
             ("user", ["text", "text"])]),
        "a later system message joins the user's": (
            [SYSTEM, user("go"), Message(role="system", content="be brief"), model("ok")],
            [("user", ["text", "text"]), ("model", ["text"])]),
    }
    for name, (messages, expected) in cases.items():
        _, contents = to_gemini(messages)
        check_contents(contents)
        assert shape(contents) == expected, name


def test_joined_contents_keep_every_part_in_order() -> None:
    picture = ImagePart(data="aGk=", media_type="image/png")
    messages = [SYSTEM, LEAD, Message(role="user", content=[TextPart(text="look"), picture]),
                user("at this"), model("thinking"), model("", "c1")]
    _, contents = to_gemini(messages)
    assert contents == [
        {"role": "user", "parts": [{"text": LEAD.text()}, {"text": "look"},
                                   {"inline_data": {"mime_type": "image/png", "data": "aGk="}},
                                   {"text": "at this"}]},
        {"role": "model", "parts": [{"text": "thinking"}, {"function_call": {
            "name": "read_file", "args": {"path": "c1.py"}, "id": "c1"}}]}]


# -- random role sequences: the whole conversion and the kept views ---------------------


@st.composite
def role_sequences(draw: st.DrawFn) -> list[Message]:
    """Messages in any order of roles: user text (or empty, or with an image), assistant
    text (or empty, or reasoning only), calls with their results in any order, a later
    system message, all of any length."""
    out: list[Message] = []
    calls = 0
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["user", "user", "user-empty", "user-image", "assistant",
                                     "assistant", "assistant-empty", "reasoning", "calls",
                                     "calls", "system"]))
        n = len(out)
        if kind == "user":
            out.append(user(f"u{n}"))
        elif kind == "user-empty":
            out.append(user(""))
        elif kind == "user-image":
            out.append(Message(role="user", content=[TextPart(text=f"see {n}"), ImagePart(
                url=f"https://example.com/{n}.png")]))
        elif kind == "assistant":
            out.append(model(f"a{n}"))
        elif kind == "assistant-empty":
            out.append(model(""))
        elif kind == "reasoning":
            out.append(Message(role="assistant", content="", reasoning=f"r{n}",
                               metadata={"gemini_signatures": {"thought:0": "c2ln"}}))
        elif kind == "system":
            out.append(Message(role="system", content=f"note {n}"))
        else:
            ids = [f"c{calls + k}" for k in range(draw(st.integers(1, 3)))]
            calls += len(ids)
            out.append(model(draw(st.sampled_from(["", f"a{n}"])), *ids))
            out.extend(result(c, f"r{c}") for c in draw(st.permutations(ids)))
    return out


Case = tuple[list[Message], list[Message], list[Message], list[int], list[int]]


@st.composite
def views(draw: st.DrawFn) -> Case:
    """A head (system prompt, maybe a summary or a truncation note leading as a user
    message), the history (folded at random cuts) and the pending turn (sent call by
    call: growing prefixes)."""
    convo = draw(role_sequences())
    head = [SYSTEM, *draw(st.sampled_from([[], [LEAD], [NOTE]]))]
    while convo and convo[0].role == "system":  # it would lead with the head's: not here
        convo = convo[1:]
    split = draw(st.integers(0, len(convo)))
    cuts = draw(st.lists(st.integers(1, max(1, split)), max_size=5))
    steps = draw(st.lists(st.integers(0, 3), max_size=5))
    return head, convo[:split], convo[split:], cuts, steps


def own_parts(messages: Sequence[Message]) -> list[tuple[str, dict[str, Any]]]:
    """(role, part) of each message converted alone, in order: what the contents hold."""
    out = []
    for m in messages:
        alone = m.model_copy(update={"role": "user"}) if m.role == "system" else m
        for c in to_gemini([alone])[1]:
            out.extend((c["role"], p) for p in c["parts"])
    return out


def calls_of(contents: Sequence[dict[str, Any]]) -> None:
    """The responses to a model content's calls are the one user content after it."""
    for a, b in itertools.pairwise(contents):
        if responses(b):
            calls = [p for p in a["parts"] if "function_call" in p]
            assert a["role"] == "model" and len(calls) == len(b["parts"])


@settings(max_examples=300, deadline=None)
@given(case=views(), shared=st.booleans())
def test_random_role_sequences_alternate_and_the_kept_views_equal_the_whole(
        case: Case, shared: bool) -> None:
    head, history, pending, cuts, steps = case
    system, contents = to_gemini([*head, *history, *pending])
    check_contents(contents)
    calls_of(contents)
    assert [(c["role"], p) for c in contents for p in c["parts"]] == own_parts(
        [*head[1:], *history, *pending])

    handed: list[tuple[Any, Any]] = []  # every view returned, and a deep copy of it

    def view(fold: GeminiFold, given: list[Message], memo: tuple[dict[str, Any], ...] | None,
             head_memo: tuple[dict[str, Any], ...]) -> None:
        got = gemini_view(head, fold, given, head_memo, memo, shared=shared)
        assert got is not None
        assert (got[0], list(got[1])) == to_gemini([*head, *history, *given])
        handed.append((got, copy.deepcopy((got[0], list(got[1])))))

    raw = [m.to_json().encode() for m in history]
    stored = fold_of_stored("gemini", raw, lambda i: json.loads(raw[i]), decode_stored)
    for fold in (folded("gemini", history, cuts), stored):
        head_memo = tuple({} for _ in head)
        memo = tuple({} for _ in pending)  # the turn's slots, kept across its calls
        at = 0
        for step in [*steps, len(pending)]:
            at = min(len(pending), at + step)
            view(fold, pending[:at], memo[:at] if at < len(pending) else memo, head_memo)
        view(fold, pending, None, head_memo)
        # the turn recorded: the history's last content may grow (a new one)
        grown = fold.extend(pending, memo)
        got = gemini_view(head, grown, [], head_memo, (), shared=shared)
        assert got is not None and (got[0], list(got[1])) == (system, contents)
        check_contents(list(got[1]))
    for got, snapshot in handed:  # no later call changed what an earlier one handed out
        assert (got[0], list(got[1])) == snapshot


def test_a_grown_last_content_is_a_new_one() -> None:
    """The fold's last content grows by copy on write: the contents an earlier view holds
    stay as they were, and only the last chunk of the finished contents is copied."""
    turns = []
    for i in range(400):
        turns += [user(f"step {i}"), model(f"done {i}")]
    fold = fold_of("gemini", [*turns, user("one more")])
    _, before = gemini_view([SYSTEM], fold, [user("pending")], shared=True) or (None, [])
    kept = copy.deepcopy(list(before))
    grown = fold.extend([user("and another"), user("and a third"), model("ok")])
    assert grown.done.chunks[0] is fold.done.chunks[0]  # untouched chunks are shared
    _, after = gemini_view([SYSTEM], grown, [user("pending")], shared=True) or (None, [])
    assert list(before) == kept
    assert list(after) == to_gemini([SYSTEM, *turns, user("one more"), user("and another"),
                                     user("and a third"), model("ok"), user("pending")])[1]
    assert after[-3]["parts"] == [{"text": t} for t in ("one more", "and another",
                                                         "and a third")]


def test_a_guards_earlier_views_do_not_change(make_guard: Callable[..., Any],
                                              store: SessionStore) -> None:
    """Through the real guard (both shells): each call's view joins the user's messages,
    and the contents handed out by earlier calls stay as they were."""
    guard = make_guard(store)
    guard.record_turn("s", [user("what is in app.toml?"), model("", "c1"),
                            result("c1", "port = 8080"), model("port 8080")])
    handed: list[tuple[Any, Any]] = []
    pending: list[Message] = []
    for text in ("thanks", "one more thing", "what about the host?"):
        pending.append(user(text))
        view = guard.prepare("s", "sys", model=M, pending=list(pending))
        for contents in (view.gemini()[1], view.gemini(shared=True)[1]):
            assert list(contents) == to_gemini(view.messages)[1]
            check_contents(list(contents))
            assert shape(contents)[-1] == ("user", ["text"] * len(pending))
            handed.append((contents, copy.deepcopy(list(contents))))
    guard.record_turn("s", [*pending, model("the host is localhost")])
    guard.record_turn("s", [user("and the log level?")])
    view = guard.prepare("s", "sys", model=M, pending=[user("debug, I guess")])
    _, contents = view.gemini()
    assert contents == to_gemini(view.messages)[1]
    assert shape(contents)[-1] == ("user", ["text", "text"])
    for got, snapshot in handed:
        assert list(got) == snapshot
