"""Start Flower for this app, never unauthenticated: ``python -m workers.flower_entry``.

Why a wrapper: Flower shows every task's arguments (session ids, tenants)
and exposes remote control (shut workers down, revoke jobs), yet it starts
happily without any authentication. This entry point refuses to start
unless ``FLOWER_BASIC_AUTH`` holds ``user:password`` pairs (comma-separated,
Flower's own format), then replaces itself with
``python -m celery -A workers.app flower [args...]``. Flower reads
``FLOWER_BASIC_AUTH`` from the environment by itself, so the credentials
never appear on a command line (``ps``, ``/proc/<pid>/cmdline``), and the
wrapper rejects ``--basic-auth`` arguments for the same reason.

Other Flower options pass through unchanged, as arguments (``--port=5555``)
or as ``FLOWER_<OPTION>`` environment variables.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence

from shared.core.errors import ConfigError

ENV_VAR = "FLOWER_BASIC_AUTH"
APP = "workers.app"
_FORBIDDEN_ARGS = ("--basic-auth", "--basic_auth")


def parse_basic_auth(value: str | None) -> list[tuple[str, str]]:
    """The ``(user, password)`` pairs of a ``FLOWER_BASIC_AUTH`` value.

    Flower splits the value on commas and compares each entry literally
    with the decoded ``Authorization`` header, so: a user may not contain
    ``:`` (HTTP basic auth could never send it), no part may be empty, and
    surrounding whitespace is refused instead of silently becoming part of
    a credential nobody can type.
    """
    if value is None or not value.strip():
        raise ConfigError(f"{ENV_VAR} is not set: Flower refuses to start without "
                          f"authentication; set {ENV_VAR}=user:password")
    pairs: list[tuple[str, str]] = []
    for position, entry in enumerate(value.split(","), start=1):
        where = f"{ENV_VAR} entry {position}"
        if entry != entry.strip():
            raise ConfigError(f"{where} has surrounding whitespace; Flower compares it literally")
        user, sep, password = entry.partition(":")
        if not sep:
            raise ConfigError(f"{where} must be user:password")
        if not user:
            raise ConfigError(f"{where} has an empty user name")
        if not password:
            raise ConfigError(f"{where} has an empty password")
        pairs.append((user, password))
    return pairs


def flower_command(args: Sequence[str]) -> list[str]:
    """The command this wrapper becomes; refuses credentials passed as arguments."""
    for arg in args:
        if arg.split("=", 1)[0] in _FORBIDDEN_ARGS:
            raise ConfigError(f"pass credentials through {ENV_VAR}, not {arg.split('=', 1)[0]} "
                              "(arguments are visible in the process list)")
    return [sys.executable, "-m", "celery", "-A", APP, "flower", *args]


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None,
         execve: Callable[[str, list[str], dict[str, str]], object] = os.execve) -> int:
    """Validate, then exec Flower with ``environ`` (returns only on a configuration error)."""
    args = list(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ if environ is None else environ)
    try:
        parse_basic_auth(env.get(ENV_VAR))
        command = flower_command(args)
    except ConfigError as exc:
        print(f"workers.flower_entry: {exc}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    execve(command[0], command, env)
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["ENV_VAR", "flower_command", "main", "parse_basic_auth"]
