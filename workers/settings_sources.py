"""Where settings come from besides plain variables: ``COMPACTION_<NAME>_FILE``
secret files, and the warning for ``COMPACTION_*`` variables that are no setting.

Apart from the Settings model because both concern the environment itself
(files it points to, names it holds), not the values' meaning; the Flower
entry point reads secret files with the same function.
"""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from shared.core.errors import ConfigError
from workers.server.config import server_variables

ENV_PREFIX = "COMPACTION_"
FILE_SUFFIX = "_FILE"
# Settings that may be read from a file named by COMPACTION_<NAME>_FILE (secrets).
FILE_SETTINGS = ("redis_url", "broker_url", "redis_password", "summarizer_api_key")
# COMPACTION_* variables read by tools, not by Settings: no typo warning for them. The
# server's own (COMPACTION_SERVER_*) are not listed: they come from its config model.
NOT_SETTINGS = frozenset({
    "COMPACTION_TEST_REDIS_URL",  # workers/harness/stack/redis_server.py
    "COMPACTION_REQUIRE_COMPOSE",  # tests/test_deploy.py
    "COMPACTION_REPORT_SCREENSHOT",  # tests/test_report.py (regenerates docs/report.png)
    "COMPACTION_IMAGE",  # docker/docker-compose.yml (image tag)
    "COMPACTION_SECRETS_DIR",  # docker/docker-compose.yml (secret files)
})

__all__ = ["ENV_PREFIX", "FILE_SETTINGS", "FILE_SUFFIX", "NOT_SETTINGS", "SecretFileSource",
           "read_secret_file", "setting_variables", "unknown_among", "warn_unknown_among"]


def read_secret_file(variable: str, path: str) -> str:
    """The content of a secret file without its trailing newline ("" when empty).

    An unreadable file is a :class:`ConfigError` of one line naming the
    variable and the path (never the content).
    """
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise ConfigError(f"{variable}={path}: cannot read the secret file: "
                          f"{exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{variable}={path}: the secret file is not UTF-8 text") from None
    return text.rstrip("\r\n")


class SecretFileSource(PydanticBaseSettingsSource):
    """``COMPACTION_<NAME>_FILE``: a setting's value read from a file (Docker secrets).

    Setting both ``COMPACTION_<NAME>`` and ``COMPACTION_<NAME>_FILE`` is an
    error (which one wins would be a guess); an empty file means unset.
    """

    def __init__(self, settings_cls: type[BaseSettings],
                 environ: Mapping[str, str] | None = None) -> None:
        super().__init__(settings_cls)
        source = os.environ if environ is None else environ
        self.environ = {key.upper(): value for key, value in source.items()}

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        """Unused: :meth:`__call__` reads every file setting at once."""
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name in FILE_SETTINGS:
            variable = f"{ENV_PREFIX}{name.upper()}"
            path = self.environ.get(variable + FILE_SUFFIX)
            if path is None:
                continue
            if variable in self.environ:
                raise ConfigError(f"{variable} and {variable}{FILE_SUFFIX} are both set: "
                                  "keep one")
            text = read_secret_file(variable + FILE_SUFFIX, path)
            if text:
                values[name] = text
        return values


def setting_variables(fields: Mapping[str, Any]) -> frozenset[str]:
    """Every ``COMPACTION_*`` name read for ``fields`` (with the ``_FILE`` variants)."""
    names = {f"{ENV_PREFIX}{name.upper()}" for name in fields}
    names.update(f"{ENV_PREFIX}{name.upper()}{FILE_SUFFIX}" for name in FILE_SETTINGS)
    return frozenset(names)


def unknown_among(environ: Mapping[str, str],
                  known: frozenset[str]) -> list[tuple[str, str | None]]:
    """``(variable, closest known name or None)`` for each ``COMPACTION_*`` name that is
    neither in ``known`` (the settings' variables), nor a server variable
    (``COMPACTION_SERVER_*``, also offered as corrections), nor in :data:`NOT_SETTINGS`."""
    known = known | server_variables()
    suffixes = sorted(name.removeprefix(ENV_PREFIX) for name in known)
    found = []
    for key in sorted(environ):
        name = key.upper()
        if name.startswith(ENV_PREFIX) and name not in known and name not in NOT_SETTINGS:
            # Compared without the prefix, which every candidate shares.
            close = difflib.get_close_matches(name.removeprefix(ENV_PREFIX), suffixes, n=1,
                                              cutoff=0.6)
            found.append((key, ENV_PREFIX + close[0] if close else None))
    return found


_warned: set[str] = set()


def warn_unknown_among(known: frozenset[str], environ: Mapping[str, str] | None = None,
                       stream: TextIO | None = None) -> str | None:
    """One warning line for the ``COMPACTION_*`` variables that are not settings.

    Not fatal: during a rolling upgrade a variable of the other version is
    expected; a typo must still not pass silently. Each name is reported once
    per process. Returns the line (None when there is nothing to report).
    """
    found = [(name, close) for name, close in unknown_among(
        os.environ if environ is None else environ, known) if name not in _warned]
    if not found:
        return None
    _warned.update(name for name, _ in found)
    described = [f"{name} (did you mean {close}?)" if close else name for name, close in found]
    line = (f"warning: ignoring {', '.join(described)}: not a setting "
            f"(the settings are listed in README.md, Configuration)")
    print(line, file=stream or sys.stderr, flush=True)
    return line
