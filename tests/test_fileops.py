"""fileops.may_read: a cheap test that never rules out a command file_ops finds a read in."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.fileops import file_ops, may_read

PROGRAMS = [  # an oracle of its own: every program a read may come from, and others
    "cat", "head", "tail", "less", "more", "nl", "bat", "wc", "diff", "cmp", "xxd", "hexdump",
    "strings", "source", ".", "md5sum", "sha256sum", "view", "grep", "egrep", "fgrep", "rg",
    "ag", "ack", "sed", "awk", "perl", "cp", "patch", "ls", "git", "python", "rm", "mv",
    "touch", "tee", "echo", "cd", "/bin/cat", "./run.sh"]
ARGS = ["src/app.py", "a.txt", "b.txt", "-n", "-i", "'1,20p'", "s/x/y/", "checkout", "$(",
        ")", "<", "input.txt", ">", "out.txt", "2>&1", "<<EOF", "EOF", "#", "*.py", "x="]


@st.composite
def commands(draw: st.DrawFn) -> str:
    """Simple commands (a wrapper maybe, a program, arguments) joined by operators; a
    program's name sometimes split by quotes or a backslash, as shells allow."""
    out = []
    for _ in range(draw(st.integers(1, 3))):
        prog = draw(st.sampled_from(PROGRAMS))
        if len(prog) > 1 and draw(st.booleans()):
            k = draw(st.integers(1, len(prog) - 1))
            prog = prog[:k] + draw(st.sampled_from(["''", '""', "\\"]))[:2] + prog[k:]
        words = [*draw(st.lists(st.sampled_from(["sudo", "env", "X=1"]), max_size=1)), prog,
                 *draw(st.lists(st.sampled_from(ARGS), max_size=4))]
        out.append(" ".join(words))
        out.append(draw(st.sampled_from([" | ", " && ", "; ", "\n", " || "])))
    return "".join(out[:-1])


@settings(max_examples=3000, deadline=None)
@given(command=commands())
def test_a_command_ruled_out_has_no_read(command: str) -> None:
    if not may_read(command):
        assert not [op for op in file_ops("bash", {"command": command}) if op[1] == "read"]


@pytest.mark.parametrize("command", [
    "cat src/app.py", "c'a't src/app.py", 'c"at" a.txt', "c\\at a.txt", "/bin/cat a.txt",
    "sudo head -n 5 a.txt", "python x.py < input.txt", "git diff | grep -n foo a.txt",
    "cd src && sed -n '1,20p' app.py", "cp a.txt b.txt", "echo $(cat a.txt)",
])
def test_commands_that_read_are_kept(command: str) -> None:
    assert [op for op in file_ops("bash", {"command": command}) if op[1] == "read"]
    assert may_read(command)


@pytest.mark.parametrize("command", [
    "python -m pytest -x", "git status", "ls -la", "concatenate --heads", "pip install -e",
])
def test_commands_without_a_reader_are_ruled_out(command: str) -> None:
    assert not may_read(command)
