"""shared.core.facts: the batched, region-restricted extraction equals the per-text one.

The reference below is the per-message algorithm ``extract_facts`` used before
it scanned a range's texts in one batch; hypothesis and the real sessions
check that both give byte-identical ledgers. Behaviour tests of the ledger
(and of extraction through it) are in tests/test_ledger.py.
"""

from __future__ import annotations

import functools
import json
import shlex
from collections.abc import Callable
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from shared.core import fact_patterns as patterns
from shared.core import facts as ledger_mod
from shared.core import fileops as fo
from shared.core import ledger as ledger_model
from shared.core.facts import extract_facts
from shared.core.fileops import (
    _tokens,
    file_ops,
    is_program,
    runs_something,
    shell_command,
    strip_heredocs,
)
from shared.core.ledger import MAX_FACT_CHARS, Fact, FileOp, Ledger
from shared.core.messages import Message, ToolCall
from tests.test_ledger import _COMMANDS, _load_sessions, result

# -- batched extraction == the per-text reference ----------------------------
# The reference below is the per-message algorithm extract_facts used before it
# scanned a range's texts in one batch, kept word for word (it runs ledger's own
# _scan, one text at a time, with the original patterns).

def _ref_shell_commands(text: str) -> list[tuple[str, str]]:
    out = []
    for m in patterns._FENCE.finditer(text):
        if m.group(1).lower() in patterns._SHELL_LANGS:
            for line in strip_heredocs(m.group(2)).splitlines():
                cmd = line.strip().removeprefix("$ ").strip()
                words = cmd.split()
                plausible = len(words) > 1 and patterns._PROGRAM_NAME.match(words[0])
                if words and len(cmd) <= MAX_FACT_CHARS and (is_program(words[0]) or plausible):
                    out.append(("command", cmd))
    for m in patterns._BACKTICK.finditer(patterns._FENCE.sub(" ", text)):
        cmd = m.group(1).strip()
        if len(cmd.split()) >= 2 and is_program(cmd.split()[0]):
            out.append(("command", cmd))
    return out


def _ref_tool_call_facts(name: str, arguments: str) -> tuple[list[Any], list[Any]]:
    scan, strong = patterns._scan, patterns._STRONG_ID
    facts: list[tuple[str, str]] = []
    try:
        args = json.loads(arguments)
    except ValueError:
        args = {}
    command = shell_command(name, args)
    if command is not None:
        body = strip_heredocs(command)
        facts += scan(body, strong, code_ids=True, paths=False)
        first = command.strip().split("\n", 1)[0].strip()
        if first and len(first) <= MAX_FACT_CHARS and runs_something(first):
            facts.append(("command", first))
    else:
        for key, value in patterns._short_strings(args):
            if patterns._ID_KEY.search(key) and value.strip() and " " not in value.strip():
                facts.append(("identifier", value.strip()))
            else:
                facts += scan(value, strong, code_ids=True)
    return facts, file_ops(name, args)


def _ref_message_facts(m: Message) -> tuple[list[Any], list[Any]]:
    scan, strong = patterns._scan, patterns._STRONG_ID
    facts: list[tuple[str, str]] = []
    files: list[tuple[str, str]] = []
    text = m.text()
    if m.role == "user":
        prose = patterns._FENCE.sub(" ", text)
        facts += scan(prose, strong, code_ids=True)
        facts += _ref_shell_commands(text)
        facts += patterns._constraints(prose)
    elif m.role == "assistant":
        facts += scan(text, strong, code_ids=False)
        for tc in m.tool_calls:
            f, ops = _ref_tool_call_facts(tc.name, tc.arguments)
            facts += f
            files += ops
    return facts, files


def reference_extract(messages: list[Message], start: int = 0,
                      message_facts: Callable[[Message], tuple[list[Any], list[Any]]]
                      = _ref_message_facts) -> Ledger:
    facts: dict[tuple[str, str], list[int]] = {}
    files: dict[str, tuple[list[int], list[str]]] = {}
    for offset, m in enumerate(messages):
        i = start + offset
        found, ops = message_facts(m)
        for key in dict.fromkeys(found):
            seen = facts.get(key)
            if seen is None:
                facts[key] = [i, i, 1]
            else:
                seen[1] = i
                seen[2] += 1
        touched: dict[str, str] = {}
        for path, status in ops:
            touched[path] = "modified" if "modified" in (touched.get(path), status) else status
        for path, status in touched.items():
            prev = files.get(path)
            if prev is None:
                files[path] = ([i, i, 1], [status])
            else:
                prev[0][1] = i
                prev[0][2] += 1
                if status == "modified":
                    prev[1][0] = "modified"
    return Ledger(
        start=start, end=start + len(messages),
        facts=ledger_model._sorted_facts(
            Fact(kind=k, text=t, first_seen=a, last_seen=b, count=n)
            for (k, t), (a, b, n) in facts.items()),
        files=ledger_model._sorted_files(
            FileOp(path=p, status=s, first_seen=a, last_seen=b, count=n)
            for p, ((a, b, n), [s]) in files.items()))


# Pieces that each pattern takes, joined with no space and with the joints'
# own characters, so matches touch, nest and sit at text edges.
_PIECES = [
    "https://x.io/a?b=1", "http://h:80/p)", "src/app/main.py", "./run.sh", "~/x/y", "../a/b/",
    "a.py", "README.md", "/etc/hosts", "v1.2.3", "3.11.2-rc1", "2024-05-21T10:00Z", "May 5th, 2024",
    "Jan. 3", "10:30 pm", "5 PM", "12/31/2024", "$1,859.50", "$ 5 million", "€3k", "£\n7", "5 USD",
    "42%", "version 3.11", "Python 3.12.1", "localhost:8080", "db.example.com:5432", "port 6379",
    "Port: 80", "HTTP 404", "Error: 500", "Status code = 200", "exit status 2", "errno 13",
    "1.2.3.4:22", "omar.d@example.com", "a+b@x.co.uk", "123e4567-e89b-12d3-a456-426614174000",
    "abcdefab-abcd-abcd-abcd-abcdefabcdef", "deadbeef1234", "0a1b2c3", "ABC-123", "UTF-8",
    "#1234", "&#12", "JG7FMM", "HAT028", "omar_davis_3817", "snake_case_name", "UPPER_CASE",
    "CamelCase", "camelCase", "pkg.mod.func", "_private_x", "<pr_description>", "</tag>",
    "`pytest -q tests`", "```bash\n$ pip install -e .\ngit status\n```", "```\ncode\n```",
    "Never push to main.", "You must keep it.", "- Only use tabs.", "I don't want that!",
    "\n", "\n\n", " ", "\t", "\u00a0", "\u2028", ".", ",", ":", "-", "/", "@", "#", "$",
    "é", "\u0663", "日本", "x", "42", "word",
]
_ALPHABET = "aZ09_./-@#$€:;,!?%<>`'\"()[]{}=+~&* \n\t\u00a0é\u0663"


# The strategies below are made once (functools.cache, module constants) instead of at
# every draw: hypothesis validates each new strategy object it draws from, which cost
# more than the drawing. Same draws, same examples.
@functools.cache
def _texts() -> st.SearchStrategy[str]:
    return st.lists(st.one_of(st.sampled_from(_PIECES), st.text(_ALPHABET, max_size=6)),
                    max_size=8).map("".join)


@functools.cache
def _json_values() -> st.SearchStrategy[Any]:
    # finite: a caller's arguments with NaN or Infinity are refused (no provider reads them)
    leaves = st.one_of(_texts(), st.integers(-5, 10**6),
                       st.floats(allow_nan=False, allow_infinity=False), st.booleans(), st.none())
    return st.recursive(leaves, lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["id", "user_id", "path", "note", "order_ids", "x"]),
                        inner, max_size=3)), max_leaves=6)


_TOOL_NAMES = st.sampled_from(["bash", "shell", "read_file", "write_file", "get_user",
                               "str_replace_based_edit_tool", "apply_patch", "search"])
_SHELL_COMMANDS = st.one_of(st.sampled_from(_COMMANDS), _texts(),
                            st.lists(st.sampled_from(_COMMANDS), max_size=3).map("\n".join))
_ARGUMENTS = st.dictionaries(
    st.sampled_from(["path", "file_path", "command", "input", "reservation_id",
                     "user_id", "query", "items", "amount", "code"]),
    _json_values(), max_size=4)


@st.composite
def _tool_calls(draw: st.DrawFn, i: int) -> ToolCall:
    name = draw(_TOOL_NAMES)
    if name in ("bash", "shell") and draw(st.booleans()):
        args: dict[str, Any] = {"command": draw(_SHELL_COMMANDS)}
    else:
        args = draw(_ARGUMENTS)
    return ToolCall(id=f"c{i}", name=name, arguments=args)


_ROLES = st.sampled_from(["user", "assistant", "tool", "system"])
_CALL_LISTS = st.lists(_tool_calls(0), max_size=3)  # ids: made per message below


@st.composite
def mixed_messages(draw: st.DrawFn) -> list[Message]:
    out: list[Message] = []
    for i in range(draw(st.integers(0, 10))):
        role = draw(_ROLES)
        text = draw(_texts())
        if role == "assistant":
            calls = draw(_CALL_LISTS)
            calls = [c.model_copy(update={"id": f"c{i}_{j}"}) for j, c in enumerate(calls)]
            out.append(Message(role="assistant", content=text, tool_calls=calls))
        elif role == "tool":
            out.append(result(text, f"c{i}"))
        else:
            out.append(Message(role=role, content=text))
    return out


def _outcome(extract: Any, messages: list[Message], start: int) -> str:
    """The ledger's JSON, or the error it raised (a number written "$\\n5" is a
    fact with a line break, which Fact rejects: both paths must fail alike)."""
    try:
        return str(extract(messages, start).to_json())
    except ValueError as exc:
        return f"{type(exc).__name__}: {exc}"


def _batched(messages: list[Message], start: int) -> Ledger:
    return extract_facts(messages, start=start)


@settings(max_examples=400, deadline=None)
@given(mixed_messages(), st.integers(0, 50))
def test_batched_extraction_equals_reference(messages: list[Message], start: int) -> None:
    assert _outcome(_batched, messages, start) == _outcome(reference_extract, messages, start)


@settings(max_examples=300, deadline=None)
@given(st.lists(_texts(), max_size=6), st.booleans(), st.booleans())
# One "\n" between texts would let _NUMBER's "\s?" join them ("5 $" + "7" -> "$\n7").
@example(["paid 5 $", "7 now"], True, True)
@example(["5", "USD 3"], False, True)
@example(["$5", "k 2", "<b>", "a/b.py 1"], True, False)
def test_scan_batch_equals_scan_text_by_text(texts_: list[str], code_ids: bool,
                                            paths: bool) -> None:
    batch = ledger_mod._ScanBatch()
    outs = [batch.add(t, code_ids=code_ids, paths=paths) for t in texts_]
    batch.run()
    assert outs == [patterns._scan(t, patterns._STRONG_ID, code_ids=code_ids, paths=paths)
                    for t in texts_]


@settings(max_examples=300, deadline=None)
@given(_texts())
def test_fast_patterns_match_like_the_originals(text: str) -> None:
    for fast, original in ((patterns._NUMBER_FAST, patterns._NUMBER),
                           (patterns._STRONG_ID_FAST, patterns._STRONG_ID)):
        assert [m.span() for m in fast.finditer(text)] == \
            [m.span() for m in original.finditer(text)]


_NUMBERISH = ["$", "€", "¥", " ", "  ", "\n", "\t", "\r", "\u00a0", "\u2028", "5", "12", "\u0663",
              ",", ".", ":", "=", "k", "K", "M", "bn", "million", "USD", "dollars", "pm", "am",
              "T", "Exit", "exit code", "status", "Status code", "HTTP", "Error", "errno", "Port",
              "port", "Version", "Python", "January", "Jan.", "May", "5th", ", 2024", "v1.2",
              "3.11.2", "rc1", "%", "localhost", "a.b", "x", "word", "-", "/", "12/31/2024"]


@settings(max_examples=1500, deadline=None)
@given(st.lists(st.sampled_from(_NUMBERISH), max_size=14).map("".join))
# Every kind of whitespace a _NUMBER match can hold, each at a region's edge.
@example("x Error  5 y")
@example("x Status code = 200 y")
@example("x Exit  status:  3 y")
@example("x $ 5 y")
@example("x $\n5\nk y")
@example("x 5,\nmillion y")
@example("x 5 USD y 7\teuros")
@example("x 5 pm y 7 AM")
@example("x May 5, 2024 y")
@example("x Jan. 5th 2024 y")
@example("x 2024-01-02 10:30 y")
@example("x Port 80 y port: 8080")
@example("x Python 3.11 y version 2.0")
@example("5 x")
@example("x 5 am y $5 bn $5 K $5 M 5 dollars 5 euros 5 pounds 5 JPY 5 GBP 5 CHF 5 CAD 5 AUD y")
@example("x 5 PM y Exit status 3 y $5 million y 5 EUR y Error : 5 y")
def test_regions_hold_every_match(text: str) -> None:
    """Scanning only the regions (joined by " ") finds exactly the matches of the whole text."""
    for regions, pattern in ((patterns._NUMBER_SPANS, patterns._NUMBER_FAST),
                             (patterns._PATH_WORDS, patterns._PATH),
                             (patterns._ID_WORDS, patterns._STRONG_ID_FAST),
                             (patterns._CODE_WORDS, patterns._CODE_ID)):
        origins, found = regions.find(text)
        spans = [(o, o + len(w)) for o, w in zip(origins, found, strict=True)]
        for m in pattern.finditer(text):  # every match inside one region
            assert any(a <= m.start() and m.end() <= b for a, b in spans), (pattern.pattern, m)
        offsets = [sum(len(w) + 1 for w in found[:k]) for k in range(len(found))]
        got = []
        for m in pattern.finditer(" ".join(found)):
            k = max(k for k, off in enumerate(offsets) if off <= m.start())
            got.append((origins[k] + m.start() - offsets[k], m.group(0)))
        assert got == [(m.start(), m.group(0)) for m in pattern.finditer(text)], pattern.pattern


def test_real_sessions_batched_equals_reference() -> None:
    # The reference's facts of a message depend on the message alone: each message's are
    # found once, not once per range below that holds it (about three times).
    sessions = _load_sessions()
    per_message = {id(m): _ref_message_facts(m) for _, messages in sessions for m in messages}
    for session_id, messages in sessions:
        n = len(messages)
        ranges = [(0, n), (1, n), (1, min(n, 47))]
        ranges += [(lo, min(n, lo + 46)) for lo in range(1, n, 37)]
        for lo, hi in ranges:
            got = extract_facts(messages[lo:hi], start=lo).to_json()
            want = reference_extract(messages[lo:hi], lo, lambda m: per_message[id(m)])
            assert got == want.to_json(), (session_id, lo, hi)


def _shlex_tokens(text: str) -> list[str] | None:
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|<>()")
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:
        return None


_SHELL_ALPHABET = " \t\r\n\x0b'\"\\#;&|<>()ab$=é\x00"


@settings(max_examples=3000, deadline=None)
@given(st.one_of(
    st.text(_SHELL_ALPHABET, max_size=14),
    st.lists(st.one_of(st.sampled_from([*_COMMANDS, "&&", "||", ";;", "2>&1", "|&", "(", ")",
                                        "a=b", "x/y.py", "-n", "\r", "\u00a0", "'s/a/b/'",
                                        '"a b"', '"a\\"b"', "\\ ", "# note", "\"#x\"", "''"]),
                       st.text(_SHELL_ALPHABET, max_size=5)),
             max_size=8).map(" ".join)))
@example("sed -i '1c\\   # Don\\'t show it' pkg/a.py")
@example('echo "a\\"b\\\\c\\d" e\\ f#g \'h\\\' ; ls # x\ny')
def test_shell_tokens_equal_shlex(text: str) -> None:
    """The regex tokenizer gives shlex's tokens, and the same fallback where shlex fails."""
    expected = _shlex_tokens(text)
    assert _tokens(text) == (fo._WORDS_AND_OPS.findall(text) if expected is None else expected)


def _ref_structured_file_ops(name: str, args: Any) -> list[tuple[str, str]]:
    """file_ops of a non-shell call as it was before it returned early (the reference)."""
    if not isinstance(args, dict):
        return []
    words = set(fo._LOWER_RUN.findall(fo._CAMEL_HUMP.sub(r"\1_\2", name).lower()))
    sub = args.get("command")
    if isinstance(sub, str) and sub.strip():
        status = "read" if sub.strip().lower() in fo._EDITOR_READ else "modified"
    else:
        status = "modified" if words & fo._WRITE_WORDS else "read"
    paths = [m.group(1) for key in ("input", "patch", "diff") if isinstance(args.get(key), str)
             for m in fo._PATCH_TARGET.finditer(args[key]) if m.group(1) != "/dev/null"]
    status = "modified" if paths else status
    for key, value in args.items():
        vague = str(key).lower() in fo._VAGUE_KEYS
        if vague or str(key).lower() in fo._PATH_KEYS:
            for v in value if isinstance(value, list) else [value]:
                if isinstance(v, str) and len(v) <= 1000 and fo._plain_path(v.strip(),
                                                                            strict=vague):
                    paths.append(v)
    return [(fo._norm(p.strip(), ""), status) for p in paths if fo._plain_path(p.strip())]


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(["read_file", "write_file", "applyPatch", "str_replace_based_edit_tool",
                        "grep", "copyFile", "view", "MultiEdit", "search_flights", "x"]),
       st.dictionaries(st.sampled_from(["path", "file_path", "paths", "source", "dest", "command",
                                        "input", "patch", "diff", "query", "Path"]),
                       st.one_of(st.sampled_from(["a.py", " src/b.ts ", "view", "create", "",
                                                 "*** Update File: c.py\n", "+++ b/d.md\n",
                                                 "--- a\n+++ /dev/null", "docs/", "-x", "SEA"]),
                                 st.lists(st.sampled_from(["a.py", "b/c.rs", "*.py", 3]),
                                          max_size=3),
                                 _texts(), st.integers()),
                       max_size=4))
def test_structured_file_ops_equal_reference(name: str, args: dict[str, Any]) -> None:
    assert file_ops(name, args) == _ref_structured_file_ops(name, args)


def _ref_strip_heredocs(command: str) -> str:
    """strip_heredocs before its shortcut for commands without "<<" (the reference)."""
    lines, out, i = command.split("\n"), [], 0
    while i < len(lines):
        out.append(lines[i])
        for m in fo._HEREDOC.finditer(lines[i]):
            i += 1
            while i < len(lines) and lines[i].strip() != m.group(2):
                i += 1
        i += 1
    return "\n".join(out)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(["cat <<EOF > a.py", "cat <<-'END'", "x << y", "EOF", "END",
                                 "  EOF  ", "body", "<<<", "a <b", "\r", "", "python -c 1"]),
                max_size=8).map("\n".join))
def test_strip_heredocs_equals_reference(command: str) -> None:
    assert strip_heredocs(command) == _ref_strip_heredocs(command)


def _ref_constraints(prose: str) -> list[tuple[str, str]]:
    """_constraints before its keyword pre-test (the reference)."""
    out = []
    for line in prose.splitlines():
        for sentence in patterns._SENTENCE_SPLIT.split(patterns._BULLET.sub("", line).strip()):
            s = sentence.strip()
            sized = 8 <= len(s) <= ledger_model.MAX_CONSTRAINT_CHARS and len(s.split()) >= 3
            if sized and patterns._CONSTRAINT.search(s):
                out.append(("constraint", s))
    return out


_PROSE_WORDS = ["You", "must", "MUST", "Never", "ONLY", "only if", "the only", "I", "I'll", "keep",
                "Keep in mind", "please", "use", "stick to", "Act as", "respond in", "don't",
                "do not", "want", "prefer", "PREFERABLY", "at least", "no more than", "avoid",
                "mu\u017ft", "\u212aeep", "w\u0131thout", "plain", "words", "here", "the", "file",
                "-", "1.", ".", "!", "?", "\n", "\n- ", "(", "\"", "going forward", "not allowed"]


@settings(max_examples=800, deadline=None)
@given(st.lists(st.sampled_from(_PROSE_WORDS), max_size=14).map(" ".join))
@example("Keep it short. mu\u017ft do it. I want \u212aeys. Use only tabs.\n- Never push.")
def test_constraints_equal_reference(prose: str) -> None:
    assert patterns._constraints(prose) == _ref_constraints(prose)


def _constraint_texts(text: str) -> list[str]:
    return [f.text for f in extract_facts([Message(role="user", content=text)]).facts
            if f.kind == "constraint"]


def test_a_prohibition_after_a_clause_break_is_a_constraint() -> None:
    # After ";", ",", ":" or a dash, "do not"/"don't" opens an imperative clause, as after
    # "but": the user's "do not touch tests/" must reach the ledger.
    for text in ("Fix the failing test in app.py; do not touch tests/.",
                 "Fix the failing test in app.py, don't touch tests/.",
                 "Fix the failing test in app.py: do NOT touch tests/.",
                 "Fix the failing test in app.py - don't touch tests/.",
                 "Fix the failing test in app.py \u2014 do not touch tests/.",
                 "Fix the failing test in app.py; never touch tests/.",
                 "Fix the failing test in app.py; you must not touch tests/."):
        assert _constraint_texts(text) == [text], text


def test_chat_after_a_clause_break_is_not_a_constraint() -> None:
    for text in ("Sorry, I don't have my card with me.", "Yes, I do not know the number.",
                 "Thanks, don't worry about it.", "Okay; don't mind the typo.",
                 "The test passed: it does not fail anymore.",
                 "Hmm, they don't have a reservation."):
        assert _constraint_texts(text) == [], text


_LINE_BREAKY = st.lists(st.sampled_from(
    [*list("$€5 \t\n\r\x0b\x0c\x1c\x85\u2028`lsgit-USD%k./_:@#aZ0"), "```bash\n", "http://"]),
    max_size=60).map("".join)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["user", "assistant"]), _LINE_BREAKY), max_size=6))
def test_no_text_makes_extraction_fail(texts: list[tuple[str, str]]) -> None:
    """A fact is one line: line breaks inside a number ("$\\n5") or a backtick span
    ("`ls\\r -la`") once made Fact reject it and failed the whole worker job."""
    messages = [Message(role=role, content=text) for role, text in texts]
    ledger = extract_facts(messages)
    assert all("\n" not in f.text and "\r" not in f.text for f in ledger.facts)


def test_line_breaks_end_numbers_and_commands() -> None:
    texts = ["cost $\n5 or 5\rUSD", "run `ls\r -la` now", "pay $ 5 or 5 USD, run `ls -la`"]
    facts = [f.text for f in extract_facts([Message(role="user", content=t)
                                            for t in texts]).facts]
    assert sorted(facts) == ["$ 5", "5 USD", "ls -la"]


def test_compound_identifiers_and_pre_release_versions_are_recorded_whole() -> None:
    """A ledger fact is copied verbatim: a prefix of an id names a different ticket."""
    text = ("order ORD-2024-0001-XZ shipped, see FACT-000-1a2b3c; released v1.2.3-rc.1 "
            "after 2.0.1-beta.2, ticket PROJ-42.")
    rendered = extract_facts([Message(role="user", content=text)]).render()
    for whole in ("ORD-2024-0001-XZ", "FACT-000-1a2b3c", "v1.2.3-rc.1", "2.0.1-beta.2",
                  "PROJ-42"):
        assert whole in rendered, (whole, rendered)
    for cut in ("ORD-2024\n", "FACT-000\n", "v1.2.3\n", "PROJ-42.\n"):
        assert cut not in rendered + "\n", (cut, rendered)


def test_a_curly_apostrophe_is_read_as_the_straight_one() -> None:
    """Phones and word processors type U+2019: "don't touch tests/" typed so was no
    constraint at all."""
    curly = "\u2019"
    for text in (f"Fix app.py; don{curly}t touch tests/.", f"Please don{curly}t use numpy.",
                 f"I don{curly}t want any new dependencies.", f"You mustn{curly}t push to main."):
        rendered = extract_facts([Message(role="user", content=text)]).render()
        assert f"- {text}" in rendered, text
    assert "Constraints" not in extract_facts(
        [Message(role="user", content=f"Thanks, don{curly}t worry about it.")]).render()
