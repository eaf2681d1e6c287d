"""Tests for workers.summarizer.offline: sections, errors, incremental merge, size bound."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.errors import InvalidInput
from shared.core.facts import extract_facts
from shared.core.messages import Message, ToolCall
from shared.core.tokens import DEFAULT_COUNTER
from workers.summarizer.offline import OfflineSummarizer, error_signature
from workers.summarizer.prompts import SUMMARY_SECTIONS
from workers.summarizer.quality import check_summary

TRANSCRIPTS = Path(__file__).resolve().parents[2] / "shared" / "data" / "transcripts.dev.jsonl"


def bash(command: str, call_id: str, text: str = "") -> Message:
    return Message(role="assistant", content=text, tool_calls=[
        ToolCall(id=call_id, name="bash", arguments={"command": command})])


def result(text: str, call_id: str) -> Message:
    return Message(role="tool", content=text, tool_call_id=call_id)


def session() -> list[Message]:
    return [
        Message(role="user", content="Fix the crash in src/app.py. You must not modify tests."),
        bash("cat src/app.py", "c1", "I will read the file first."),
        result("<returncode>0</returncode>\n<output>\ndef main(): ...\n</output>", "c1"),
        bash("python -m pytest -q", "c2"),
        result("<returncode>1</returncode>\n<output>\nTraceback (most recent call last):\n"
               '  File "src/app.py", line 3\nZeroDivisionError: division by zero\n</output>', "c2"),
        bash("sed -i 's/1\\/0/1/' src/app.py", "c3", "The fix is to remove the division."),
        result("<returncode>0</returncode>\n<output>\n</output>", "c3"),
        Message(role="user", content="Also update the changelog please."),
        Message(role="assistant", content="Done: the crash is fixed and tests pass."),
    ]


def summarize(messages: list[Message], previous: str | None = None, start: int = 0,
              summarizer: OfflineSummarizer | None = None) -> str:
    summarizer = summarizer or OfflineSummarizer()
    return summarizer.summarize(messages, previous, extract_facts(messages, start=start),
                                start=start)


def section(text: str, name: str) -> str:
    """Body of one ``## name`` (or ``### name``) section."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.lstrip("#").strip() == name) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("#")), len(lines))
    return "\n".join(lines[start:end]).strip()


def test_sections_goal_constraints_activity_errors_files() -> None:
    text = summarize(session())
    for name in (*SUMMARY_SECTIONS, "Done", "In progress"):
        assert section(text, name) is not None
    assert section(text, "Goal").startswith("Fix the crash in src/app.py.")
    assert "- You must not modify tests." in section(text, "Constraints")
    done = section(text, "Done")
    assert "3 tool calls (bash x3); 1 errors." in done
    assert "`python -m pytest -q`" in done
    context = section(text, "Critical context")
    assert "Error (#4, `python -m pytest -q`): ZeroDivisionError: division by zero" in context
    assert "Last agent message (#8): Done: the crash is fixed" in section(text, "In progress")
    assert "The fix is to remove the division." in section(text, "Key decisions")
    assert "Also update the changelog please." in section(text, "Next steps")
    assert section(text, "Modified files") == "- src/app.py"
    assert section(text, "Read files") == "- none"
    check_summary(text, input_tokens=DEFAULT_COUNTER.messages(session()) * 3)


@pytest.mark.parametrize(("output", "expected"), [
    ("<returncode>1</returncode>\n<output>\n</output>", None),  # grep found nothing
    ("<returncode>0</returncode>\n<output>\nall good\n</output>", None),
    ("<returncode>2</returncode>\n<output>\nusage: foo\n</output>", "exit code 2: usage: foo"),
    ("Error: flight HAT030 not available on date 2024-05-13",
     "Error: flight HAT030 not available on date 2024-05-13"),
    ('{"error": "not found"}', 'error: "not found"'),
    ('{"status": "ok"}', None),
    ("Exception occurred:\n  File \"x.py\", line 1\nSyntaxError: invalid syntax",
     "SyntaxError: invalid syntax"),
    ("bash: foo: command not found", "bash: foo: command not found"),
    ("", None),
    ("1172.0", None),
])
def test_error_signature(output: str, expected: str | None) -> None:
    assert error_signature(output) == expected


def test_incremental_merge_keeps_previous_and_appends() -> None:
    msgs = session()
    first = summarize(msgs[:4])
    second = summarize(msgs[4:], first, start=4)
    assert section(second, "Goal") == section(first, "Goal")
    done = section(second, "Done")
    assert "Messages #0-#3" in done and "Messages #4-#8" in done
    assert "- You must not modify tests." in section(second, "Constraints")
    assert section(second, "In progress").startswith("- Last agent message (#8)")  # replaced
    # src/app.py was read in the first range and modified in the second: modified wins
    assert section(first, "Read files") == "- src/app.py"
    assert section(second, "Read files") == "- none"
    assert section(second, "Modified files") == "- src/app.py"


def test_merge_with_an_llm_summary() -> None:
    previous = (
        "**Goal:** Migrate the billing service\n\n## Constraints\n- Never touch prod.\n\n"
        "## Progress\n### Done\n- Wrote migration 0042.\n### In progress\n- Testing\n\n"
        "## Weird extra section\nsome note\n\n## Read files\n- `docs/a.md` (skimmed)\n\n"
        "## Modified files\n- `billing/models.py` — added field\n"
    )
    msgs = [bash("cat docs/a.md && sed -i 's/a/b/' billing/models.py", "c9")]
    text = summarize(msgs, previous, start=50)
    assert section(text, "Goal") == "**Goal:** Migrate the billing service" or \
        "Migrate the billing service" in text
    assert "- Never touch prod." in section(text, "Constraints")
    assert "- Wrote migration 0042." in section(text, "Done")
    assert "some note" in section(text, "Critical context")
    assert section(text, "Modified files") == "- `billing/models.py` — added field"
    assert section(text, "Read files") == "- `docs/a.md` (skimmed)"


def test_configuration_is_validated() -> None:
    with pytest.raises(InvalidInput, match="max_chars"):
        OfflineSummarizer(max_chars=50)
    with pytest.raises(InvalidInput, match="item_chars"):
        OfflineSummarizer(item_chars=0)
    with pytest.raises(InvalidInput, match=r"messages\[0\]"):
        OfflineSummarizer().summarize([{"role": "x"}], None, extract_facts([]))  # type: ignore[list-item]


_WORDS = st.sampled_from(["must keep", "JG7FMM", "src/x.py", "Error: boom", "##", "# Goal",
                          "Traceback (most recent call last):", "\n", "I will fix it.", "word"])


# Made once, not at every draw (hypothesis validates each new strategy object it draws
# from, which cost more than the drawing); the same draws, the same sessions.
_PIECES = st.lists(st.one_of(_WORDS, st.text(max_size=30)), max_size=30)
_KINDS = st.sampled_from(["user", "assistant", "call"])
_SHELL = st.sampled_from(["cat a.py", "echo x > b.py", "pytest"])


@st.composite
def random_session(draw: st.DrawFn) -> list[Message]:
    out: list[Message] = []
    for i in range(draw(st.integers(0, 15))):
        text = " ".join(draw(_PIECES))
        kind = draw(_KINDS)
        if kind == "call":
            out.append(bash(draw(_SHELL), f"c{i}", text))
            out.append(result(text, f"c{i}"))
        else:
            out.append(Message(role=kind, content=text))
    return out


@settings(max_examples=120, deadline=None)
@given(st.lists(random_session(), min_size=1, max_size=4), st.integers(200, 4000))
def test_output_is_bounded_and_deterministic(parts: list[list[Message]], max_chars: int) -> None:
    summarizer = OfflineSummarizer(max_chars=max_chars)
    previous: str | None = None
    start = 0
    for part in parts:
        text = summarize(part, previous, start, summarizer)
        assert len(text) <= max_chars
        assert text == summarize(part, previous, start, summarizer)
        previous, start = text, start + len(part)


def _load_sessions() -> list[tuple[str, list[Message]]]:
    if not TRANSCRIPTS.exists():
        pytest.skip(f"real transcripts not found at {TRANSCRIPTS} (shared data folder absent)")
    out = []
    for line in TRANSCRIPTS.read_text().splitlines():
        record = json.loads(line)
        out.append((record["id"], [Message.model_validate(
            {k: v for k, v in m.items() if k != "usage"}) for m in record["messages"]]))
    return out


def test_real_sessions_compress_and_fold() -> None:
    summarizer = OfflineSummarizer(max_chars=6000)
    for session_id, messages in _load_sessions():
        body = messages[1:]  # the system prompt is never summarized
        input_chars = sum(len(m.text()) + sum(len(t.arguments) for t in m.tool_calls)
                          for m in body)
        whole = summarize(body, None, 1, summarizer)
        assert len(whole) <= 6000, session_id
        assert len(whole) * 2 < input_chars, session_id
        check_summary(whole, input_tokens=DEFAULT_COUNTER.messages(body))
        previous: str | None = None
        step = max(1, len(body) // 4)
        for lo in range(0, len(body), step):
            previous = summarize(body[lo:lo + step], previous, 1 + lo, summarizer)
            assert len(previous) <= 6000
        assert previous is not None and section(previous, "Goal") == section(whole, "Goal")


def _path_heavy(turns: int) -> list[Message]:
    """Turns that read and write deep JSON files: dense in tokens per character."""
    out: list[Message] = []
    for t in range(turns):
        path = f"/srv/app/{t}/cfg_{t:03d}/a.b/{t}_x-{t}/settings.json"
        out.append(Message(role="user", content=f"update {path} key k{t}={{\"v\":[{t},{t}]}}"))
        out.append(Message(role="assistant", content="", tool_calls=[ToolCall(
            id=f"w{t}", name="write_file", arguments=json.dumps({"path": path,
                                                                 "content": "{}"}))]))
        out.append(Message(role="tool", tool_call_id=f"w{t}", content=f"wrote {path}"))
    return out


def test_the_offline_summary_stays_within_the_summary_token_cap() -> None:
    """COMPACTION_MAX_SUMMARY_TOKENS is a token cap: 4 characters a token overshoots it on
    paths and JSON, where a token is closer to 2 characters."""
    from shared.core.ledger import Ledger
    from workers.summarizer.engine import SummaryEngine

    messages = _path_heavy(120)
    ledger = Ledger().merge(extract_facts(messages))
    for cap in (300, 800, 2000):
        draft = SummaryEngine(None, max_summary_tokens=cap).summarize(messages, None, ledger)
        assert draft.kind == "offline"
        assert DEFAULT_COUNTER.text(draft.text) <= cap, (cap, DEFAULT_COUNTER.text(draft.text))
        assert "## Goal" in draft.text
