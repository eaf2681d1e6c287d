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

``FLOWER_BASIC_AUTH_FILE=/run/secrets/flower_basic_auth`` reads the value
from a file instead (Docker secrets: the credentials are then not in the
container's configuration, ``docker inspect``); the wrapper hands it to
Flower in the exec'd process's environment. Setting both is an error.

Other Flower options pass through unchanged, as arguments (``--port=5555``)
or as ``FLOWER_<OPTION>`` environment variables. The app's own settings
(``COMPACTION_*``) are checked when Flower imports ``workers.app``: a bad
one is a single line and exit status 2, like the worker's.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence

from shared.core.errors import ConfigError
from workers.settings import FILE_SUFFIX, read_secret_file

ENV_VAR = "FLOWER_BASIC_AUTH"
FILE_VAR = ENV_VAR + FILE_SUFFIX
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
                          f"authentication; set {ENV_VAR}=user:password or {ENV_VAR}_FILE=<path>")
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


def credentials_environment(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for Flower: ``FLOWER_BASIC_AUTH`` read from ``FLOWER_BASIC_AUTH_FILE`` if set."""
    out = dict(env)
    path = out.pop(FILE_VAR, None)
    if path is None:
        return out
    if ENV_VAR in out:
        raise ConfigError(f"{ENV_VAR} and {FILE_VAR} are both set: keep one")
    value = read_secret_file(FILE_VAR, path)
    if not value.strip():
        raise ConfigError(f"{FILE_VAR}={path}: the file is empty; Flower refuses to start "
                          "without authentication")
    try:
        parse_basic_auth(value)
    except ConfigError as exc:
        raise ConfigError(f"{FILE_VAR}={path}: {exc}") from None
    out[ENV_VAR] = value
    return out


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
    try:
        env = credentials_environment(os.environ if environ is None else environ)
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


__all__ = ["ENV_VAR", "FILE_VAR", "credentials_environment", "flower_command", "main",
           "parse_basic_auth"]
