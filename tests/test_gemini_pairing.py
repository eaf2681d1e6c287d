"""Gemini function responses sent or recorded apart from their calls (Gemini sends no ids):
they answer the session's newest unanswered call of their name, in the view, the store and
every wire form, through the real guard on both shells."""

from __future__ import annotations

import base64
import itertools
import json
from collections.abc import Callable
from typing import Any

from shared.core.wire import from_gemini, to_gemini
from shared.store.sessions import SessionStore

M = "gemini-2.5-flash"
MISSING = "tool result missing"


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "parts": [{"text": text}]}


def _calls(*names: str) -> dict[str, Any]:
    sig = base64.b64encode(b"sig").decode()
    return {"role": "model", "parts": [
        {"functionCall": {"name": n, "args": {"k": i}}, **({"thoughtSignature": sig} if not i
                                                           else {})}
        for i, n in enumerate(names)]}


def _responses(*pairs: tuple[str, str]) -> dict[str, Any]:
    return {"role": "user", "parts": [
        {"functionResponse": {"name": n, "response": {"output": out}}} for n, out in pairs]}


def _pairs(view: Any) -> list[tuple[str, str]]:
    """(function name, output) of each call and the response Gemini pairs it with."""
    _, contents = view.gemini()
    assert contents == to_gemini(view.messages)[1]
    out = []
    for prev, cur in itertools.pairwise(contents):
        calls = [p["function_call"] for p in prev["parts"] if "function_call" in p]
        resps = [p["function_response"] for p in cur["parts"] if "function_response" in p]
        if calls and prev["role"] == "model":  # Gemini pairs by name, in order
            assert sorted(c["name"] for c in calls) == sorted(r["name"] for r in resps)
            for c in calls:
                r = next(r for r in resps if r["name"] == c["name"])
                resps.remove(r)
                out.append((c["name"], r["response"]["output"]))
    return out


def _openai_outputs(view: Any) -> dict[str, str]:
    """Output of each OpenAI call by its function name."""
    msgs = view.openai()
    names = {c["id"]: c["function"]["name"] for m in msgs for c in m.get("tool_calls") or ()}
    return {names[m["tool_call_id"]]: m["content"] for m in msgs if m["role"] == "tool"}


def test_a_pending_response_answers_the_recorded_call(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    guard = make_guard(store)
    user = _user("what is in /etc/app.toml?")
    guard.prepare("s", "sys", model=M, pending=from_gemini([user]))
    guard.record_turn("s", from_gemini([user, _calls("read_file")]))
    view = guard.prepare("s", "sys", model=M,
                         pending=from_gemini([_responses(("read_file", "port = 8080"))]))
    assert _pairs(view) == [("read_file", "port = 8080")]
    assert MISSING not in json.dumps(view.openai())


def test_responses_recorded_in_the_next_turn_answer_their_calls(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    guard = make_guard(store)
    for k in range(3):
        guard.record_turn("s", from_gemini([_user(f"task {k}"), _calls("read_file", "list_dir")]))
        guard.record_turn("s", from_gemini([
            _responses(("read_file", f"A{k}"), ("list_dir", f"D{k}")),
            {"role": "model", "parts": [{"text": f"ok {k}"}]}]))
    view = guard.prepare("s", "sys", model=M)
    assert _pairs(view) == [p for k in range(3)
                            for p in (("read_file", f"A{k}"), ("list_dir", f"D{k}"))]
    stored = [m for m in store.messages("s") if m.role == "tool"]
    assert MISSING not in json.dumps(view.openai()) and len(stored) == 6


def test_responses_in_completion_order_answer_their_own_calls(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    guard = make_guard(store)
    guard.record_turn("s", from_gemini([_user("go")]))
    guard.record_turn("s", from_gemini([_calls("read_file", "list_dir")]))
    guard.record_turn("s", from_gemini([_responses(("list_dir", "DIR LISTING"),
                                                   ("read_file", "FILE CONTENT"))]))
    view = guard.prepare("s", "sys", model=M)
    assert _openai_outputs(view) == {"read_file": "FILE CONTENT", "list_dir": "DIR LISTING"}
    assert sorted(_pairs(view)) == [("list_dir", "DIR LISTING"), ("read_file", "FILE CONTENT")]


def test_pending_responses_in_completion_order_answer_their_own_calls(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    guard = make_guard(store)
    guard.record_turn("s", from_gemini([_user("go"), _calls("read_file", "list_dir")]))
    guard.prepare("s", "sys", model=M)  # the guard holds the view
    pending = from_gemini([_responses(("list_dir", "DIR"), ("read_file", "FILE"))])
    view = guard.prepare("s", "sys", model=M, pending=pending)
    assert _openai_outputs(view) == {"read_file": "FILE", "list_dir": "DIR"}
    guard.record_turn("s", [*pending, *from_gemini([{"role": "model",
                                                       "parts": [{"text": "done"}]}])])
    view = guard.prepare("s", "sys", model=M)
    assert _openai_outputs(view) == {"read_file": "FILE", "list_dir": "DIR"}


def test_parallel_calls_of_one_name_are_answered_in_order(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    guard = make_guard(store)
    guard.record_turn("s", from_gemini([_user("go"), _calls("read_file", "read_file")]))
    guard.record_turn("s", from_gemini([_responses(("read_file", "first"),
                                                   ("read_file", "second"))]))
    view = guard.prepare("s", "sys", model=M)
    assert _pairs(view) == [("read_file", "first"), ("read_file", "second")]
    calls = [c for m in view.messages for c in m.tool_calls]
    results = {m.tool_call_id: m.text() for m in view.messages if m.role == "tool"}
    assert [results[c.id] for c in calls] == ["first", "second"]
    assert [json.loads(c.arguments) for c in calls] == [{"k": 0}, {"k": 1}]


def test_a_guard_that_never_saw_the_calls_pairs_the_responses_by_the_store(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """Another process records the responses: no view, no ids of its own appends; the
    store's mapping (its ID_CONFLICT reply) names the calls, and the next read shows it."""
    make_guard(store).record_turn("s", from_gemini([_user("go"),
                                                    _calls("read_file", "list_dir")]))
    other = make_guard(store)
    other.record_turn("s", from_gemini([_responses(("list_dir", "DIR"), ("read_file", "FILE"))]))
    view = make_guard(store).prepare("s", "sys", model=M)
    assert _openai_outputs(view) == {"read_file": "FILE", "list_dir": "DIR"}


def test_a_later_turns_made_up_ids_never_pair_with_an_earlier_turns_calls(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """Turn 1's call had the made-up id ``gemini-1-0``; turn 2's response to another
    function gets the same made-up id: it must answer turn 2's call, by name."""
    guard = make_guard(store)
    guard.record_turn("s", from_gemini([_user("a"), _calls("read_file"),
                                        _responses(("read_file", "R1")),
                                        {"role": "model", "parts": [{"text": "ok"}]}]))
    guard.record_turn("s", from_gemini([_user("b"), _calls("list_dir")]))
    guard.record_turn("s", from_gemini([_responses(("list_dir", "D2"))]))
    view = guard.prepare("s", "sys", model=M)
    assert _pairs(view) == [("read_file", "R1"), ("list_dir", "D2")]


SIG = base64.b64encode(b"SIG").decode()


def test_a_signature_on_an_empty_text_part_is_sent_back(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """Streamed Gemini 3 turns end with ``{"text": "", "thoughtSignature": ...}``; the
    signature is to be returned as received (the part was dropped with its signature)."""
    guard = make_guard(store)
    trailing = {"role": "model", "parts": [{"text": "Hello"}, {"text": " there"},
                                           {"text": "", "thoughtSignature": SIG}]}
    alone = {"role": "model", "parts": [{"text": "", "thoughtSignature": SIG},
                                        {"functionCall": {"name": "f", "args": {}}}]}
    guard.record_turn("s", from_gemini([_user("hi"), trailing, _user("more"), alone,
                                        _responses(("f", "x"))]))
    for view in (guard.prepare("s", "sys", model=M), make_guard(store).prepare("s", "sys",
                                                                               model=M)):
        _, contents = view.gemini()
        assert contents == to_gemini(view.messages)[1]
        assert contents[1] == {"role": "model", "parts": [
            {"text": "Hello"}, {"text": " there"}, {"text": "", "thought_signature": SIG}]}
        assert contents[3]["parts"][0] == {"text": "", "thought_signature": SIG}
    only = from_gemini([_user("hi"), {"role": "model", "parts": [
        {"text": "", "thoughtSignature": SIG}]}])
    assert to_gemini(only)[1][1] == {"role": "model", "parts": [{"text": "",
                                                                 "thought_signature": SIG}]}


def test_responses_split_over_two_turns_answer_the_calls_still_open(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """Two parallel calls of one name answered one record at a time: the second response
    answers the call still open (the view says which), not the first call again."""
    guard = make_guard(store)
    guard.record_turn("s", from_gemini([_user("go"), _calls("read_file", "read_file")]))
    guard.prepare("s", "sys", model=M)
    guard.record_turn("s", from_gemini([_responses(("read_file", "first"))]))
    guard.record_turn("s", from_gemini([_responses(("read_file", "second"))]))
    view = guard.prepare("s", "sys", model=M)
    calls = [c for m in view.messages for c in m.tool_calls]
    results = {m.tool_call_id: m.text() for m in view.messages if m.role == "tool"}
    assert [results[c.id] for c in calls] == ["first", "second"]
