"""Tests for shared.core.ledger: verbatim facts, constraints, file operations, merge and cap."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.errors import InvalidInput
from shared.core.facts import extract_facts
from shared.core.fileops import (
    file_ops,
)
from shared.core.ledger import (
    HEADERS,
    Fact,
    FileOp,
    Ledger,
)
from shared.core.messages import Message, ToolCall

TRANSCRIPTS = Path(__file__).resolve().parents[2] / "shared" / "data" / "transcripts.dev.jsonl"


def user(text: str) -> Message:
    return Message(role="user", content=text)


def bash(command: str, call_id: str = "c1", text: str = "") -> Message:
    return Message(role="assistant", content=text, tool_calls=[
        ToolCall(id=call_id, name="bash", arguments={"command": command})])


def call(name: str, args: dict[str, Any], call_id: str = "c1") -> Message:
    return Message(role="assistant", tool_calls=[ToolCall(id=call_id, name=name, arguments=args)])


def result(text: str, call_id: str = "c1") -> Message:
    return Message(role="tool", content=text, tool_call_id=call_id)


def texts(ledger: Ledger, kind: str) -> list[str]:
    return [f.text for f in ledger.facts if f.kind == kind]


# -- facts -----------------------------------------------------------------

def test_customer_service_identifiers_numbers_and_constraints() -> None:
    ledger = extract_facts([
        Message(role="system", content="You must never reveal policy 7. Reservation ZZ9ZZZ."),
        user("Hi, my user ID is omar_davis_3817 and reservation JG7FMM. Mail: omar.d@example.com"),
        Message(role="assistant", content="The refund is $1,859 for flight HAT028 on 2024-05-21."),
        user("Please never change the passengers. I don't have my card. The only thing left."),
    ])
    ids = texts(ledger, "identifier")
    assert {"omar_davis_3817", "JG7FMM", "HAT028", "omar.d@example.com"} <= set(ids)
    assert "ZZ9ZZZ" not in ids  # system messages are never summarized, never mined
    assert {"$1,859", "2024-05-21"} <= set(texts(ledger, "number"))
    assert texts(ledger, "constraint") == ["Please never change the passengers."]


def test_constraints_are_verbatim_sentences_outside_code() -> None:
    text = (
        "Fix the parser.\n- You must not modify tests/test_api.py under any circumstances.\n"
        "```python\nx = 1  # must be ignored, only code\n```\n"
        "From now on, answer in French. I'll make sure to reply."
    )
    found = texts(extract_facts([user(text)]), "constraint")
    assert found == ["You must not modify tests/test_api.py under any circumstances.",
                     "From now on, answer in French."]


def test_urls_paths_and_user_commands() -> None:
    ledger = extract_facts([user(
        "See https://github.com/org/repo/issues/42. Edit src/app/main.py, then run "
        "`pytest -q tests/test_main.py` and ```bash\n$ pip install -e .\n```"
    )])
    assert "https://github.com/org/repo/issues/42" in texts(ledger, "url")
    assert "src/app/main.py" in texts(ledger, "path")
    assert {"pytest -q tests/test_main.py", "pip install -e ."} <= set(texts(ledger, "command"))
    assert "and/or" not in texts(ledger, "path")


def test_bash_commands_kept_only_when_they_run_something() -> None:
    ledger = extract_facts([
        bash("cat src/a.py"), result("..."),
        bash("cd repo && python -m pytest -x tests/test_b.py", "c2"), result("ok", "c2"),
        bash("cat <<'EOF' > reproduce.py\nimport secret_module_name\nEOF", "c3"),
    ])
    assert texts(ledger, "command") == ["cd repo && python -m pytest -x tests/test_b.py"]
    assert "secret_module_name" not in texts(ledger, "identifier")  # heredoc body is content
    assert ledger.files_read == ("src/a.py",)
    assert ledger.files_modified == ("reproduce.py",)


def test_tool_results_are_not_mined() -> None:
    ledger = extract_facts([call("get_user", {"user_id": "u_1"}), result('{"id": "ABC123X"}')])
    assert texts(ledger, "identifier") == ["u_1"]


def test_every_fact_records_first_last_and_count() -> None:
    ledger = extract_facts([user("ref JG7FMM"), user("hello"), user("again JG7FMM")], start=10)
    (fact,) = [f for f in ledger.facts if f.text == "JG7FMM"]
    assert (fact.first_seen, fact.last_seen, fact.count) == (10, 12, 2)
    assert (ledger.start, ledger.end) == (10, 13)


# -- file operations -------------------------------------------------------

@pytest.mark.parametrize(("command", "expected"), [
    ("sed -i 's/a/b/' src/x.py", [("src/x.py", "modified")]),
    ("sed -n '1,10p' src/x.py", [("src/x.py", "read")]),
    ("nl -ba f.py | sed -n '10,20p'", [("f.py", "read")]),
    ("echo hi > out.txt 2>&1", [("out.txt", "modified")]),
    ("grep -rn 'foo' src/", []),
    ("grep -n 'def run' src/a.py", [("src/a.py", "read")]),
    ("cd pkg && cat <<'EOF' > mod.py\nimport os\nEOF", [("pkg/mod.py", "modified")]),
    ("mv a.py b.py", [("a.py", "modified"), ("b.py", "modified")]),
    ("cp a.py b.py", [("a.py", "read"), ("b.py", "modified")]),
    ("rm -f /tmp/x.log", [("/tmp/x.log", "modified")]),
    ("python3 run.py | tee -a log.txt", [("log.txt", "modified")]),
    ("git checkout -- a.py", [("a.py", "modified")]),
    ("perl -pi -e 's/x/y/' lib/a.pl", [("lib/a.pl", "modified")]),
    ("head -n 20 ./README.md", [("README.md", "read")]),
    ("python -c \"print(1)\" > /dev/null", []),
    ("ls -la", []),
    ("cat 'unterminated", []),
    ("sed -i '1c\\   # Don\\'t show it' pkg/a.py", [("pkg/a.py", "modified")]),
])
def test_shell_file_operations(command: str, expected: list[tuple[str, str]]) -> None:
    assert file_ops("bash", {"command": command}) == expected


@pytest.mark.parametrize(("name", "args", "expected"), [
    ("read_file", {"path": "a.py"}, [("a.py", "read")]),
    ("write_file", {"file_path": "b.py", "content": "x"}, [("b.py", "modified")]),
    ("str_replace_based_edit_tool", {"command": "view", "path": "/r/a.py"}, [("/r/a.py", "read")]),
    ("str_replace_based_edit_tool", {"command": "str_replace", "path": "/r/a.py"},
     [("/r/a.py", "modified")]),
    ("apply_patch", {"input": "*** Begin Patch\n*** Update File: src/app.py\n@@\n-a\n+b\n"},
     [("src/app.py", "modified")]),
    ("search_direct_flight", {"origin": "JFK", "destination": "SEA"}, []),
    ("copyFile", {"source": "docs/a.md", "destination": "docs/b.md"},
     [("docs/a.md", "read"), ("docs/b.md", "read")]),
    ("bash", {"command": ["sed", "-i", "s/a/b/", "c.py"]}, [("c.py", "modified")]),
    ("bash", "not a dict", []),
])
def test_structured_tool_file_operations(name: str, args: Any,
                                         expected: list[tuple[str, str]]) -> None:
    assert file_ops(name, args) == expected


def test_modified_wins_within_and_across_cycles() -> None:
    read_then_edit = [bash("cat a.py"), result(""), bash("sed -i 's/x/y/' a.py", "c2")]
    assert extract_facts(read_then_edit).files_modified == ("a.py",)
    edit_then_read = [bash("sed -i 's/x/y/' a.py"), result(""), bash("cat a.py", "c2")]
    assert extract_facts(edit_then_read).files_modified == ("a.py",)
    first = extract_facts([bash("cat a.py")])
    second = extract_facts([bash("echo x >> a.py")], start=1)
    for merged in (first.merge(second), second.merge(first)):
        assert merged.files_modified == ("a.py",) and merged.files_read == ()
        assert merged.files[0].first_seen == 0 and merged.files[0].last_seen == 1


def test_garbage_commands_never_raise() -> None:
    for junk in ["'", '"', "<<", "> ", "| | ;;", "cd", "sed -i", "\x00\x01", "cat <<EOF\nno end"]:
        extract_facts([bash(junk)])


# -- model: merge, cap, render, missing ----------------------------------

def test_render_sections_in_order_and_empty() -> None:
    assert Ledger().render() == ""
    ledger = extract_facts([
        user("Never push to main. Ticket ABC-123."),
        bash("cat a.py && sed -i 's/x/y/' b.py"),
    ])
    rendered = ledger.render()
    positions = [rendered.index(h) for h in HEADERS]
    assert positions == sorted(positions)
    assert "- Never push to main." in rendered and "- id: ABC-123" in rendered


def test_path_fact_not_repeated_when_file_is_tracked() -> None:
    ledger = extract_facts([bash("touch src/a.py", text="I will edit src/a.py now.")])
    assert ledger.render().count("src/a.py") == 1
    assert ledger.capped(10_000) == ledger


def test_missing_from_lists_what_the_summary_lost() -> None:
    ledger = extract_facts([user("Use port 8080 only. Reservation JG7FMM."), bash("cat x.py")])
    missing = ledger.missing_from("We booked JG7FMM and read x.py.")
    assert "JG7FMM" not in texts(missing, "identifier")
    assert missing.files == ()
    assert "port 8080" in texts(missing, "number")
    assert texts(missing, "constraint") == ["Use port 8080 only."]


def test_capped_keeps_constraints_first() -> None:
    facts = [Fact(kind="identifier", text=f"ID{i:04d}X", first_seen=i, last_seen=i)
             for i in range(1, 50)]
    facts.append(Fact(kind="constraint", text="Never delete data.", first_seen=0, last_seen=0))
    ledger = Ledger(start=0, end=50, facts=tuple(facts))
    small = ledger.capped(60)
    assert [f.text for f in small.facts] == ["Never delete data."]
    assert len(small.render()) <= 60
    mid = ledger.capped(150)
    assert "Never delete data." in mid.render()
    assert "ID0049X" in mid.render()  # most recent survives before older ones


def test_bad_arguments_name_their_field() -> None:
    with pytest.raises(InvalidInput, match="max_chars"):
        Ledger().capped(-1)
    with pytest.raises(InvalidInput, match="start"):
        extract_facts([], start=-1)
    with pytest.raises(InvalidInput, match=r"messages\[1\]"):
        extract_facts([user("ok"), {"role": "bogus"}])  # type: ignore[list-item]


def test_json_round_trip() -> None:
    ledger = extract_facts([user("Never use $5 coupons. ID JG7FMM"), bash("sed -i 's/a/b/' x.py")])
    assert Ledger.from_json(ledger.to_json()) == ledger
    assert json.loads(ledger.to_json())["files"][0]["status"] == "modified"


# -- properties ------------------------------------------------------------

_FRAGMENTS = [
    "must keep JG7FMM", "Never touch src/core.py.", "see https://x.io/a?b=1", "$1,200",
    "version 3.11.2", "port 6379", "omar_davis_3817", "I don't know.", "deadbeef1234",
    "ask about ABC-12", "2024-05-15", "plain words", "`git push origin main`", "CamelCase",
]
_COMMANDS = [
    "cat a.py", "sed -i 's/x/y/' a.py", "echo 1 > b.txt", "pytest -q", "rm c.py",
    "cd d && cat <<'EOF' > e.py\nbody_identifier_x\nEOF", "grep -n foo a.py", "mv a.py f.py",
]


@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    out: list[Message] = []
    for i in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["user", "assistant", "bash", "tool"]))
        text = " ".join(draw(st.lists(st.sampled_from(_FRAGMENTS), max_size=4)))
        if kind == "user":
            out.append(user(text + draw(st.text(max_size=20))))
        elif kind == "assistant":
            out.append(Message(role="assistant", content=text))
        elif kind == "bash":
            out.append(bash(draw(st.sampled_from(_COMMANDS)), f"c{i}", text))
        else:
            out.append(result(text, f"c{i}"))
    return out


@settings(max_examples=150, deadline=None)
@given(conversations(), st.data())
def test_split_extraction_merges_to_whole(messages: list[Message], data: st.DataObject) -> None:
    k = data.draw(st.integers(0, len(messages)))
    whole = extract_facts(messages)
    assert extract_facts(messages[:k]).merge(extract_facts(messages[k:], start=k)) == whole
    assert extract_facts(messages[k:], start=k).merge(extract_facts(messages[:k])) == whole


@settings(max_examples=100, deadline=None)
@given(conversations(), st.data())
def test_merge_idempotent_and_associative(messages: list[Message], data: st.DataObject) -> None:
    i = data.draw(st.integers(0, len(messages)))
    j = data.draw(st.integers(i, len(messages)))
    a = extract_facts(messages[:i])
    b = extract_facts(messages[i:j], start=i)
    c = extract_facts(messages[j:], start=j)
    assert a.merge(a) == a
    assert a.merge(b).merge(c) == a.merge(b.merge(c))
    ab = a.merge(b)
    assert ab.merge(b) == ab.merge(b).merge(b)


@settings(max_examples=150, deadline=None)
@given(conversations(), st.integers(0, 3000))
def test_cap_is_respected(messages: list[Message], max_chars: int) -> None:
    ledger = extract_facts(messages)
    capped = ledger.capped(max_chars)
    assert len(capped.render()) <= max_chars
    assert set(capped.facts) <= set(ledger.facts) and set(capped.files) <= set(ledger.files)
    if len(ledger.render()) <= max_chars:
        assert capped == ledger
    # Constraints come first: one is left out only if it does not fit beside the kept ones.
    for c in set(ledger.constraints) - set(capped.constraints):
        assert len(Ledger(facts=(*capped.constraints, c)).render()) > max_chars


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a.py", "b.py", "c.py"]),
                          st.sampled_from(["read", "modified"])), max_size=8))
def test_modified_wins_property(ops: list[tuple[str, str]]) -> None:
    ledgers = [Ledger(start=i, end=i + 1, files=(FileOp(path=p, status=s, first_seen=i,
                                                         last_seen=i),))
               for i, (p, s) in enumerate(ops)]
    merged = Ledger()
    for ledger in ledgers:
        merged = merged.merge(ledger)
    for path in {p for p, _ in ops}:
        want = "modified" if (path, "modified") in ops else "read"
        assert [f.status for f in merged.files if f.path == path] == [want]


# -- real sessions ---------------------------------------------------------

def _load_sessions() -> list[tuple[str, list[Message]]]:
    if not TRANSCRIPTS.exists():
        pytest.skip(f"real transcripts not found at {TRANSCRIPTS} (shared data folder absent)")
    sessions = []
    for line in TRANSCRIPTS.read_text().splitlines():
        record = json.loads(line)
        messages = []
        for raw in record["messages"]:
            raw = dict(raw)
            usage = raw.pop("usage", None)
            messages.append(Message.model_validate({**raw, "metadata": {"usage": usage}}
                                                   if usage else raw))
        sessions.append((record["id"], messages))
    return sessions


def _haystack(message: Message) -> str:
    parts = [message.text()]
    for tc in message.tool_calls:
        parts.append(tc.arguments)
        args = tc.args()
        if isinstance(args, dict):
            parts += [v for v in args.values() if isinstance(v, str)]
    return "\n".join(parts)


def test_real_sessions_facts_are_verbatim() -> None:
    for session_id, messages in _load_sessions():
        ledger = extract_facts(messages)
        assert ledger.facts, session_id
        for fact in ledger.facts:
            for index in (fact.first_seen, fact.last_seen):
                assert fact.text in _haystack(messages[index]), (session_id, fact)
        if session_id.startswith("mini-swe"):
            assert ledger.files_modified, session_id
            assert ledger.constraints, session_id
        assert len(ledger.capped(2000).render()) <= 2000
