"""The ``ssl_*`` options of a Redis URL, read as redis-py reads a ``rediss://`` URL's.

A ``rediss://`` URL goes to redis-py whole and it parses these options itself. The
Sentinel forms (the store's ``rediss+sentinel://``, a ``sentinel://`` broker) cannot:
their options must become connection keywords for the data nodes and for the Sentinels
alike. Reading them here, typed the same way, keeps the two paths equal, and a wrong
option is named at start-up instead of failing the first connection.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from redis.connection import URL_QUERY_ARGUMENT_PARSERS

from shared.core.errors import InvalidInput

TLS_OPTIONS = frozenset({
    "ssl_ca_certs", "ssl_ca_path", "ssl_ca_data", "ssl_certfile", "ssl_keyfile",
    "ssl_password", "ssl_cert_reqs", "ssl_check_hostname", "ssl_min_version",
    "ssl_ciphers", "ssl_include_verify_flags", "ssl_exclude_verify_flags"})
"""The options both redis-py's blocking and asyncio TLS connections take (so that one URL
serves the sync and the async store)."""
CERT_REQS = ("none", "optional", "required")
_FILES = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")


def is_tls_option(name: str) -> bool:
    return name.startswith("ssl_")


def tls_options(options: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """The connection keywords of the ``ssl_*`` entries of ``options`` (a query as
    :func:`urllib.parse.parse_qs` returns it: the last value wins; other entries are
    ignored). :class:`InvalidInput` (field ``url``) naming the first bad option: unknown,
    a value redis-py cannot read, a file or directory that does not exist, a client key
    without its certificate."""
    found: dict[str, Any] = {}
    for name in sorted(filter(is_tls_option, options)):
        if name not in TLS_OPTIONS:
            raise InvalidInput(f"unknown TLS option {name}; known: "
                               f"{', '.join(sorted(TLS_OPTIONS))}", field="url")
        value = options[name][-1]
        parser: Any = URL_QUERY_ARGUMENT_PARSERS.get(name)
        try:
            found[name] = parser(value) if parser is not None else value
        except (TypeError, ValueError):
            raise InvalidInput(f"{name}: cannot read {value!r}", field="url") from None
    reqs = found.get("ssl_cert_reqs")
    if reqs is not None and reqs not in CERT_REQS:
        raise InvalidInput(f"ssl_cert_reqs must be one of {', '.join(CERT_REQS)}, "
                           f"not {reqs!r}", field="url")
    for name in _FILES:
        if name in found and not os.path.isfile(found[name]):
            raise InvalidInput(f"{name}: no such file {found[name]!r}", field="url")
    if "ssl_ca_path" in found and not os.path.isdir(found["ssl_ca_path"]):
        raise InvalidInput(f"ssl_ca_path: no such directory {found['ssl_ca_path']!r}",
                           field="url")
    if "ssl_keyfile" in found and "ssl_certfile" not in found:
        raise InvalidInput("ssl_keyfile needs ssl_certfile (the client certificate)",
                           field="url")
    return found


__all__ = ["CERT_REQS", "TLS_OPTIONS", "is_tls_option", "tls_options"]
