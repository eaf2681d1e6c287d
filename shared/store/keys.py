"""Redis key layout of one session, with validated names.

Every key of a session shares one Redis Cluster hash tag
``{tenant:session}`` so that the multi-key Lua scripts run on a Cluster.
Tenant and session ids are checked against a strict charset: nothing a
caller passes can reach outside its own namespace (no braces, no globs, no
whitespace, no separators that would make two sessions share a key).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from shared.core.errors import InvalidInput

TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
SESSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}$")
REQUEST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}$")
DEFAULT_TENANT = "default"


_ID_CHARS = "letters, digits, '_', '.', ':', '-'"


def _validated(value: str, pattern: re.Pattern[str], field: str, rule: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise InvalidInput(
            f"must be {rule} and start with a letter or digit (got {value!r:.80})",
            field=field,
        )
    return value


def validate_tenant(tenant: str) -> str:
    return _validated(tenant, TENANT_RE, "tenant",
                      "1-64 characters of letters, digits, '_', '.', '-'")


def validate_session_id(session_id: str) -> str:
    """``session_id``, checked (a valid one is remembered: a guard checks the same few ids
    on every call, and a regular expression run cold after a model call costs ~15 µs)."""
    if type(session_id) is str:
        return _session_id(session_id)
    return _validated(session_id, SESSION_RE, "session_id", f"1-128 characters of {_ID_CHARS}")


@functools.lru_cache(maxsize=4096)
def _session_id(session_id: str) -> str:
    return _validated(session_id, SESSION_RE, "session_id", f"1-128 characters of {_ID_CHARS}")


def validate_request_id(request_id: str) -> str:
    """An idempotency key: stored as a hash field, so the same strict charset."""
    return _validated(request_id, REQUEST_RE, "request_id", f"1-128 characters of {_ID_CHARS}")


@dataclass(frozen=True, slots=True)
class SessionKeys:
    """All keys of one session; build with :meth:`for_session` (validates)."""

    tenant: str
    session_id: str
    log: str
    cum: str
    state: str
    summaries: str
    summary_index: str
    cheap: str
    requests: str
    request_order: str
    pending: str
    lease: str
    dirty: str
    taken: str
    watch: str
    recall: str
    """Where the session's recall index keys start (:mod:`shared.store.recall_index`):
    ``<prefix>:rx:{<tenant>:<id>}``, the session's hash tag kept but outside the key
    prefix a guard's change feed watches (:func:`watched_prefix`), so that the
    hundreds of term keys an index batch writes are pushed to no guard."""

    @classmethod
    def for_session(cls, prefix: str, tenant: str, session_id: str) -> SessionKeys:
        validate_tenant(tenant)
        validate_session_id(session_id)
        base = f"{prefix}:{{{tenant}:{session_id}}}"
        return cls(
            tenant=tenant,
            session_id=session_id,
            log=f"{base}:log",
            cum=f"{base}:cum",
            state=f"{base}:state",
            summaries=f"{base}:sums",
            summary_index=f"{base}:sumidx",
            cheap=f"{base}:cheap",
            requests=f"{base}:reqs",
            request_order=f"{base}:reqorder",
            pending=f"{base}:pending",
            lease=f"{base}:lease",
            dirty=f"{base}:dirty",
            taken=f"{base}:taken",
            watch=f"{base}:watch",
            recall=recall_base(prefix, tenant, session_id),
        )

    def view_keys(self) -> list[str]:
        """Keys a guard's view is read from (``view.lua``'s): a write to any other key of
        the session (lease, request ids, recall index) leaves a cached view as it was."""
        return [self.state, self.log, self.cum, self.summaries, self.cheap, self.pending]

    def data_keys(self) -> list[str]:
        """Keys that hold session data (TTL applies to these)."""
        return [self.log, self.cum, self.state, self.summaries, self.summary_index, self.cheap]

    def all_keys(self) -> list[str]:
        """Every key of the session: data, recent append request ids, flags, lease."""
        return [*self.data_keys(), self.requests, self.request_order, self.pending,
                self.lease, self.dirty, self.taken, self.watch]


VIEW_KEY_NAMES = frozenset(("state", "log", "cum", "sums", "cheap", "pending"))
"""The last part of each of :meth:`SessionKeys.view_keys` (``<prefix>:{<tenant>:<id>}:<name>``)."""


def recall_base(prefix: str, tenant: str, session_id: str) -> str:
    """The start of every recall index key of a session (tenant and id validated by the
    caller): the session's hash tag after ``<prefix>:rx:``."""
    return f"{prefix}:rx:{{{tenant}:{session_id}}}"


def watched_prefix(prefix: str, tenant: str) -> str:
    """The start every key a guard's view is read from shares, for a whole tenant (a
    change feed's ``BCAST`` prefix): the recall index is not under it."""
    return f"{prefix}:{{{tenant}:"


def session_pattern(prefix: str, tenant: str) -> str:
    """SCAN pattern matching the state keys of one tenant's sessions."""
    validate_tenant(tenant)
    return f"{prefix}:{{{tenant}:*}}:state"


def pending_pattern(prefix: str) -> str:
    """SCAN pattern matching the pending flag of every session, of every tenant (the
    recall index keys, ``<prefix>:rx:{...}``, do not match: no ``{`` after the prefix)."""
    return f"{prefix}:{{*}}:pending"


def session_of_pending(prefix: str, key: str | bytes) -> tuple[str, str] | None:
    """(tenant, session id) of a key ``<prefix>:{<tenant>:<id>}:pending`` (tenant ids have
    no ``:``); None for any other key, or ids that are not valid ones."""
    text = key.decode(errors="replace") if isinstance(key, bytes) else key
    head, tail = f"{prefix}:{{", "}:pending"
    if not text.startswith(head) or not text.endswith(tail):
        return None
    tenant, sep, session_id = text[len(head):-len(tail)].partition(":")
    if not sep or not TENANT_RE.fullmatch(tenant) or not SESSION_RE.fullmatch(session_id):
        return None
    return tenant, session_id


__all__ = [
    "DEFAULT_TENANT",
    "SessionKeys",
    "pending_pattern",
    "recall_base",
    "session_of_pending",
    "session_pattern",
    "validate_request_id",
    "validate_session_id",
    "validate_tenant",
    "watched_prefix",
]
