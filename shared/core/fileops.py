"""File operations of tool calls: which paths a call reads or modifies.

Structured file tools are read from their arguments (path-like keys, patch
targets, editor sub-commands); shell tools have their command split into
the tokens :mod:`shlex` gives in posix mode (the same rules, as regexes, for
speed), tolerant of garbage: a command that does not parse yields what its
words suggest, never an exception. Used by the fact ledger (files read
and modified across cycles) and by the cheap stages (superseded reads).
"""

from __future__ import annotations

import functools
import json
import posixpath
import re
import shlex
from collections.abc import Iterable
from typing import Any

_SHELL_TOOLS = {"bash", "shell", "sh", "terminal", "run_shell", "run_command", "execute_command",
                "execute_bash", "run_terminal_cmd", "exec", "local_shell", "shell_exec"}
_INSPECT = {"cat", "head", "tail", "less", "more", "nl", "bat", "wc", "grep", "egrep", "fgrep",
            "rg", "ag", "ack", "sed", "awk", "ls", "ll", "tree", "find", "pwd", "cd", "echo",
            "printf", "tee", "mkdir", "touch", "which", "file", "stat", "diff", "true", ":"}
_READERS = {"cat", "head", "tail", "less", "more", "nl", "bat", "wc", "diff", "cmp", "xxd",
            "hexdump", "strings", "source", ".", "md5sum", "sha256sum", "view"}
_GREPS = {"grep", "egrep", "fgrep", "rg", "ag", "ack"}
_DELETERS = {"rm", "unlink", "shred", "touch", "truncate", "tee", "mv"}
_WRAPPERS = {"sudo", "time", "nohup", "env", "command", "exec", "nice"}
_PROGRAMS = _INSPECT | _READERS | {
    "python", "python3", "pip", "pip3", "pytest", "git", "npm", "npx", "yarn", "pnpm", "node",
    "make", "docker", "kubectl", "curl", "wget", "cargo", "go", "uv", "poetry", "tox", "bash",
    "sh", "rm", "mv", "cp", "chmod", "ssh", "scp", "export", "sudo", "mvn", "gradle", "helm",
    "terraform", "psql", "mysql", "redis-cli", "celery", "ruff", "mypy", "black", "java"}
_SEPARATORS = {";", "&", "&&", "|", "||", "|&", "(", ")", ";;"}
_REDIRECTION_CHARS = frozenset("<>&|")
_HEREDOC = re.compile(r"(?<!<)<<-?\s*(['\"]?)([\w.-]+)\1")
_WRITE_WORDS = {"write", "edit", "create", "replace", "str", "insert", "patch", "delete", "remove",
                "move", "rename", "append", "save", "overwrite", "apply", "modify", "multiedit"}
_PATH_KEYS = {"path", "file_path", "filepath", "file", "filename", "target_file", "old_path",
              "new_path", "notebook_path", "relative_path", "absolute_path", "paths", "files"}
_VAGUE_KEYS = {"source", "destination", "dest", "src", "dst", "target"}  # must look like a path
_PATCH_TARGET = re.compile(
    r"^(?:\*\*\* (?:Add|Update|Delete) File: |\*\*\* Move to: |\+\+\+ (?:b/)?)(\S.*?)\s*$", re.M
)
_EDITOR_READ = {"view", "read", "show", "cat", "open"}
_WHOLE_READERS = {"cat", "nl", "bat", "less", "more", "view"}  # print every line of a file
_READ_NOTES = {"command", "explanation", "description", "reason"}  # say nothing of the range
# Compiled once: the ledger parses every shell command of every job's range.
_WORDS_AND_OPS = re.compile(r"[;&|<>()]+|[^\s;&|<>()]+")
_ASSIGNMENT = re.compile(r"^\w+=")
_IN_PLACE = re.compile(r"^-[a-zA-Z]*i|^--in-place")
_WORDISH = re.compile(r"[A-Za-z_]")
_LETTER = re.compile(r"[A-Za-z]")
_LOWER_RUN = re.compile(r"[a-z]+")
_CAMEL_HUMP = re.compile(r"([a-z])([A-Z])")


def is_program(word: str) -> bool:
    """Whether ``word`` names a shell program users commonly quote as a command."""
    return word in _PROGRAMS or word.startswith("./")


def shell_command(name: str, args: Any) -> str | None:
    """The shell command of a shell tool call, or None for any other tool."""
    if name.lower() not in _SHELL_TOOLS or not isinstance(args, dict):
        return None
    for key in ("command", "cmd", "script", "input", "code"):
        value = args.get(key)
        if isinstance(value, str):
            return value
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return shlex.join(value)
    return None


def strip_heredocs(command: str) -> str:
    """``command`` without here-document bodies (file contents, not commands)."""
    if "<<" not in command:  # no here-document can start
        return command
    lines, out, i = command.split("\n"), [], 0
    while i < len(lines):
        out.append(lines[i])
        for m in _HEREDOC.finditer(lines[i]):
            i += 1
            while i < len(lines) and lines[i].strip() != m.group(2):
                i += 1
        i += 1
    return "\n".join(out)


# shlex (posix, whitespace_split, these punctuation chars) as regexes, about
# ten times cheaper: its whitespace is " \t\r\n"; a token is a run of
# punctuation or a word, and a word joins bare characters, backslash escapes,
# '...' (literal) and "..." (where a backslash escapes only " and \); "#"
# outside quotes starts a comment to the end of the line. What shlex refuses
# (an unclosed quote, a backslash at the end) is the one character left over.
_SHLEX_SPECIAL = re.compile(r"['\"\\#]")
_PLAIN_TOKENS = re.compile(r"[;&|<>()]+|[^ \t\r\n;&|<>()]+")
_SHELL_LEX = re.compile(
    r"(?P<op>[;&|<>()]+)"
    r"|(?P<word>(?:[^ \t\r\n;&|<>()'\"\\#]++|\\[\s\S]|'[^']*+'|\"(?:[^\"\\]++|\\[\s\S])*+\")++)"
    r"|[ \t\r\n]++|#[^\n]*+"
    r"|(?P<bad>[\s\S])"
)
_WORD_PIECE = re.compile(r"[^'\"\\]++|\\([\s\S])|'([^']*+)'|\"((?:[^\"\\]++|\\[\s\S])*+)\"")
_QUOTED_ESCAPE = re.compile(r"\\([\s\S])")


def _unquote(word: str) -> str:
    if not _SHLEX_SPECIAL.search(word):
        return word
    out = []
    for m in _WORD_PIECE.finditer(word):
        escaped, single, double = m.groups()
        if escaped is not None:
            out.append(escaped)
        elif single is not None:
            out.append(single)
        elif double is not None:
            out.append(_QUOTED_ESCAPE.sub(
                lambda e: e.group(1) if e.group(1) in "\"\\" else e.group(0), double))
        else:
            out.append(m.group(0))
    return "".join(out)


def _tokens(text: str) -> list[str]:
    """shlex's tokens of ``text``; plain words and operators when it does not parse."""
    if not _SHLEX_SPECIAL.search(text):
        return _PLAIN_TOKENS.findall(text)
    tokens = []
    for m in _SHELL_LEX.finditer(text):
        if m.group("bad") is not None:
            return _WORDS_AND_OPS.findall(text)
        if m.group("op") is not None:
            tokens.append(m.group("op"))
        elif m.group("word") is not None:
            tokens.append(_unquote(m.group("word")))
    return tokens


def _simple_commands(command: str) -> Iterable[tuple[list[str], list[tuple[str, str]]]]:
    """(argv, redirections) of each simple command; garbage degrades to plain words."""
    tokens = _tokens(strip_heredocs(command).replace("\n", " ; "))
    argv: list[str] = []
    redirs: list[tuple[str, str]] = []
    pending: str | None = None
    for tok in [*tokens, ";"]:
        if pending is not None:
            redirs.append((pending, tok))
            pending = None
        elif tok in _SEPARATORS:
            if argv:
                yield argv, redirs
            argv, redirs = [], []
        elif ("<" in tok or ">" in tok) and _REDIRECTION_CHARS.issuperset(tok):
            pending = tok
        else:
            argv.append(tok)


def _program(argv: list[str]) -> tuple[str, list[str]]:
    while argv and (argv[0] in _WRAPPERS or _ASSIGNMENT.match(argv[0])):
        argv = argv[1:]
    return (argv[0].rsplit("/", 1)[-1], argv[1:]) if argv else ("", [])


def runs_something(command: str) -> bool:
    """Whether a command does more than inspect or write files (worth keeping verbatim)."""
    for argv, _ in _simple_commands(command):
        prog, rest = _program(argv)
        if prog == "sed" and any(_IN_PLACE.match(a) for a in rest):
            return True
        if prog and prog not in _INSPECT:
            return True
    return False


_NOT_PATH = re.compile(r"[*?\[{$=\s`'\"\\(),<>]")  # globs, variables, quoting debris


def _plain_path(token: str, *, strict: bool = False) -> bool:
    if not token or token.startswith(("-", "+", "&")) or _NOT_PATH.search(token):
        return False
    if token.isdigit() or "://" in token or token == "/dev/null":
        return False
    return looks_like_path(token) if strict else bool(_WORDISH.search(token))


def _norm(path: str, cwd: str) -> str:
    if cwd and not path.startswith(("/", "~")):
        path = posixpath.join(cwd, path)
    return posixpath.normpath(path) if path not in (".", "") else path


def _shell_file_ops(command: str) -> list[tuple[str, str]]:
    return _file_ops_of(list(_simple_commands(command)))


def _file_ops_of(commands: list[tuple[list[str], list[tuple[str, str]]]]
                 ) -> list[tuple[str, str]]:
    ops: list[tuple[str, str]] = []
    cwd = ""
    for argv, redirs in commands:
        for op, target in redirs:
            if ">" in op and not op.endswith("&") and _plain_path(target):
                ops.append((_norm(target, cwd), "modified"))
            elif op == "<" and _plain_path(target):
                ops.append((_norm(target, cwd), "read"))
        prog, rest = _program(argv)
        words = [a for a in rest if not a.startswith("-")]
        if prog == "cd":
            cwd = _norm(words[0], cwd) if words and _plain_path(words[0]) else ""
            continue
        in_place = any(_IN_PLACE.match(a) for a in rest)
        status = "read"
        if prog in _GREPS or prog in ("sed", "awk", "perl"):
            script_given = any(a in ("-e", "-f") or a.startswith("--regexp") for a in rest)
            words = words if script_given else words[1:]
            status = "modified" if in_place and prog != "awk" else "read"
            strict = True
        elif prog in _READERS:
            strict = False
        elif prog in _DELETERS or prog == "patch":
            status, strict = "modified", False
        elif prog == "cp" and len(words) >= 2:
            ops += [(_norm(w, cwd), "read") for w in words[:-1] if _plain_path(w)]
            words, status, strict = words[-1:], "modified", False
        elif prog == "git" and words[:1] in (["checkout"], ["restore"], ["rm"], ["mv"]):
            words, status, strict = words[1:], "modified", True
        else:
            continue
        ops += [(_norm(w, cwd), status) for w in words if _plain_path(w, strict=strict)]
    return ops


def file_ops(name: str, args: Any) -> list[tuple[str, str]]:
    """(path, "read" | "modified") for every file a tool call reads or changes."""
    command = shell_command(name, args)
    if command is not None:
        return _shell_file_ops(command)
    if not isinstance(args, dict):
        return []
    paths = [m.group(1) for key in ("input", "patch", "diff") if isinstance(args.get(key), str)
             for m in _PATCH_TARGET.finditer(args[key]) if m.group(1) != "/dev/null"]
    patched = bool(paths)
    for key, value in args.items():
        lowered = str(key).lower()
        vague = lowered in _VAGUE_KEYS
        if vague or lowered in _PATH_KEYS:
            for v in value if isinstance(value, list) else [value]:
                if isinstance(v, str) and len(v) <= 1000 and _plain_path(v.strip(), strict=vague):
                    paths.append(v)
    if not paths:  # most calls (searches, lookups): no status to work out
        return []
    sub = args.get("command")
    if patched:
        status = "modified"
    elif isinstance(sub, str) and sub.strip():
        status = "read" if sub.strip().lower() in _EDITOR_READ else "modified"
    else:
        status = "modified" if _writes(name) else "read"
    return [(_norm(p.strip(), ""), status) for p in paths if _plain_path(p.strip())]


def read_scope(name: str, args: Any) -> tuple[str, str] | None:
    """(path, scope) of a call that only reads one file, else None. The scope is ``""``
    when the call returns the whole file (``cat``, a read tool without a range), else
    the call itself with the path normalized: a read is superseded only by a later read
    that holds at least what it held, a whole read or the same read again."""
    command = shell_command(name, args)
    if command is not None:
        return _shell_read_scope(command)
    ops = file_ops(name, args)
    if len(ops) != 1 or ops[0][1] != "read" or not isinstance(args, dict):
        return None
    path = ops[0][0]
    rest = {str(k): v for k, v in args.items()
            if str(k).lower() not in _READ_NOTES and v not in (None, "", [], {})
            and not (str(k).lower() in _PATH_KEYS
                     or (isinstance(v, str) and _norm(v.strip(), "") == path))}
    return path, json.dumps([name, rest], sort_keys=True, default=str) if rest else ""


def _shell_read_scope(command: str) -> tuple[str, str] | None:
    commands = list(_simple_commands(command))
    ops = _file_ops_of(commands)
    if len(ops) != 1 or ops[0][1] != "read":
        return None
    path, cwd = ops[0][0], ""
    steps: list[list[str]] = []
    for argv, redirs in commands:
        prog, rest = _program(argv)
        if prog == "cd":
            words = [a for a in rest if not a.startswith("-")]
            cwd = _norm(words[0], cwd) if words and _plain_path(words[0]) else ""
            continue
        steps.append([prog, *("" if _norm(a, cwd) == path else a for a in rest)])
        steps[-1] += [f"{op}{'' if _norm(t, cwd) == path else t}" for op, t in redirs]
    whole = (len(steps) == 1 and steps[0][0] in _WHOLE_READERS
             and all(a.startswith(("-", "<")) or a == "" for a in steps[0][1:]))
    return path, "" if whole else json.dumps(steps)


@functools.lru_cache(maxsize=1024)
def _writes(name: str) -> bool:
    """Whether a tool's name says it writes (``write_file``, ``applyPatch``); names repeat."""
    return bool(set(_LOWER_RUN.findall(_CAMEL_HUMP.sub(r"\1_\2", name).lower())) & _WRITE_WORDS)


_EXT = re.compile(r"\.[A-Za-z][A-Za-z0-9]{0,7}$")


def looks_like_path(token: str) -> bool:
    """A token that is a path: rooted or relative prefix, or a file extension."""
    if not _LETTER.search(token) or "//" in token:
        return False
    return token.startswith(("/", "./", "../", "~/")) or bool(_EXT.search(token.rstrip("/")))


__all__ = [
    "file_ops",
    "is_program",
    "looks_like_path",
    "read_scope",
    "runs_something",
    "shell_command",
    "strip_heredocs",
]
