"""Redis key layout of one session, with validated names.

Every key of a session shares one Redis Cluster hash tag
``{tenant:session}`` so that the multi-key Lua scripts run on a Cluster.
Tenant and session ids are checked against a strict charset: nothing a
caller passes can reach outside its own namespace (no braces, no globs, no
whitespace, no separators that would make two sessions share a key).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shared.errors import InvalidInput

TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
SESSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}$")
REQUEST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}$")
DEFAULT_TENANT = "default"


def validate_tenant(tenant: str) -> str:
    if not isinstance(tenant, str) or not TENANT_RE.fullmatch(tenant):
        raise InvalidInput(
            "must be 1-64 characters of letters, digits, '_', '.', '-' and start with a "
            f"letter or digit (got {tenant!r:.80})",
            field="tenant",
        )
    return tenant


def validate_session_id(session_id: str) -> str:
    if not isinstance(session_id, str) or not SESSION_RE.fullmatch(session_id):
        raise InvalidInput(
            "must be 1-128 characters of letters, digits, '_', '.', ':', '-' and start with a "
            f"letter or digit (got {session_id!r:.80})",
            field="session_id",
        )
    return session_id


def validate_request_id(request_id: str) -> str:
    """An idempotency key: stored as a hash field, so the same strict charset."""
    if not isinstance(request_id, str) or not REQUEST_RE.fullmatch(request_id):
        raise InvalidInput(
            "must be 1-128 characters of letters, digits, '_', '.', ':', '-' and start with a "
            f"letter or digit (got {request_id!r:.80})",
            field="request_id",
        )
    return request_id


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
        )

    def data_keys(self) -> list[str]:
        """Keys that hold session data (TTL applies to these)."""
        return [self.log, self.cum, self.state, self.summaries, self.summary_index, self.cheap]

    def all_keys(self) -> list[str]:
        """Every key of the session: data, recent append request ids, flags, lease."""
        return [*self.data_keys(), self.requests, self.request_order, self.pending,
                self.lease, self.dirty]


def session_pattern(prefix: str, tenant: str) -> str:
    """SCAN pattern matching the state keys of one tenant's sessions."""
    validate_tenant(tenant)
    return f"{prefix}:{{{tenant}:*}}:state"


__all__ = [
    "DEFAULT_TENANT",
    "SessionKeys",
    "session_pattern",
    "validate_request_id",
    "validate_session_id",
    "validate_tenant",
]
