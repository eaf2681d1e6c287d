"""What a read holds (shared.core.fileops.read_scope): the whole file or one partial read.

A read is superseded only by a later read that holds at least what it held
(shared.core.cheap), so a partial read (a range, a grep, head, tail, wc) must
never look like a whole-file read, and the same partial read must look the same
however its path is spelled.
"""

from __future__ import annotations

from typing import Any

import pytest

from shared.core.fileops import read_scope


def _shell(command: str) -> tuple[str, str] | None:
    return read_scope("bash", {"command": command})


@pytest.mark.parametrize("command", [
    "cat src/app.py", "cat -n src/app.py", "nl -ba src/app.py", "cat < src/app.py",
    "cd /w && cat ../w/src/app.py", "sudo cat src/app.py",
])
def test_whole_file_shell_reads(command: str) -> None:
    found = _shell(command)
    assert found is not None and found[1] == "", found


@pytest.mark.parametrize("command", [
    "sed -n 1,20p src/app.py", "sed -n '1909,2000p' src/app.py", "head -n 5 src/app.py",
    "tail -5 src/app.py", "wc -l src/app.py", "grep GENERATING src/app.py",
    "grep -C 20 'alias of %s' src/app.py", "nl -ba src/app.py | sed -n 100,140p",
    "nl -ba src/app.py | grep -C 20 'alias of'", "cat src/app.py | head -3",
    "cat src/app.py > /dev/null", "cat src/app.py 2>&1", "awk 'NR<5' src/app.py",
    "cat src/app.py; echo done",
])
def test_partial_shell_reads_are_never_whole(command: str) -> None:
    found = _shell(command)
    assert found is not None and found[0].endswith("src/app.py") and found[1] != "", found


def test_the_same_partial_read_has_one_scope_and_different_ones_differ() -> None:
    same = {_shell("cd /t && sed -n '200,260p' src/app.py"),
            _shell("sed -n 200,260p /t/src/app.py"),
            _shell("cd /t; sed -n \"200,260p\" ./src/app.py")}
    assert len(same) == 1 and None not in same
    scopes = {_shell(c) for c in ("sed -n 1,20p a.py", "sed -n 1,21p a.py", "grep x a.py",
                                  "grep y a.py", "grep -n x a.py", "head a.py", "tail a.py")}
    assert len(scopes) == 7


@pytest.mark.parametrize(("name", "args", "scope_is_whole"), [
    ("read_file", {"path": "a.py"}, True),
    ("read_file", {"path": "a.py", "offset": None, "limit": None}, True),
    ("str_replace_editor", {"command": "view", "path": "/t/a.py", "view_range": None}, True),
    ("Read", {"file_path": "a.py", "explanation": "look at it"}, True),
    ("Read", {"file_path": "a.py", "offset": 10, "limit": 5}, False),
    ("str_replace_editor", {"command": "view", "path": "/t/a.py", "view_range": [1, 20]}, False),
    ("read_file", {"target_file": "a.py", "start_line_one_indexed": 3,
                   "end_line_one_indexed_inclusive": 9}, False),
])
def test_structured_reads(name: str, args: dict[str, Any], scope_is_whole: bool) -> None:
    found = read_scope(name, args)
    assert found is not None and (found[1] == "") == scope_is_whole, found


def test_calls_that_do_not_only_read_one_file_have_no_scope() -> None:
    for command in ("cat a.py b.py", "python a.py", "sed -i s/a/b/ a.py", "cat a.py > b.py"):
        assert _shell(command) is None, command
    assert read_scope("write_file", {"path": "a.py", "content": "x"}) is None
    assert read_scope("str_replace_editor", {"command": "create", "path": "a.py"}) is None
