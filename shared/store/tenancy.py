"""Tenant isolation: a store handle without the raw client, and Redis ACL users.

Two layers, because the first alone is only a convention in Python:

1. :class:`TenantStore` (what :meth:`SessionStore.for_tenant` returns): one
   tenant's sessions through the store's methods only. Every session id is
   validated into that tenant's keys (:mod:`shared.store.keys`); the handle
   has no ``redis``/``client`` attribute and cannot be re-scoped to another
   tenant.
2. A Redis ACL user per tenant (:func:`create_tenant_user`), allowed only
   the keys under the tenant's hash tags (``~{prefix}:{tenant:*}*``, and
   ``~{prefix}:rx:{tenant:*}*`` for the recall index), no
   pub/sub channels, only data, transaction and script commands (no
   ``KEYS``/``SCAN``/``RANDOMKEY``, nothing ``@dangerous``: no ``FLUSHALL``,
   ``CONFIG``, ``ACL``, ``SCRIPT FLUSH``...). Redis checks the key patterns for
   the keys a script is given and for every command the script runs, so the
   Lua scripts cannot reach past them either. :func:`connect_tenant` opens a
   tenant handle over a connection authenticated as that user: then another
   tenant's keys are refused by Redis itself (``NOPERM``), whatever the
   calling code does. Works on Redis 6.2 and 7.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from shared.core.config import StoreConfig
from shared.core.errors import InvalidInput
from shared.core.records import AppendResult, InlineJob
from shared.core.tokens import TokenCounter
from shared.store import commands
from shared.store.keys import validate_tenant
from shared.store.sessions import SessionStore

# Commands a tenant user may run, on its own keys only. Subcommand grants
# (``script|load``) are the form Redis 6.2 understands too.
_COMMANDS = ("-@all", "+@read", "+@write", "+@transaction", "+@connection", "-@dangerous",
             "-scan", "-randomkey", "-keys", "+select", "+evalsha", "+eval",
             "+script|load", "+script|exists")
# Client tracking pushes the names of keys written under any prefix the client asks for,
# whatever its key patterns (Redis 7 does not check them): another tenant's session ids.
# A tenant handle has no change feed (it hides its client), so nothing of ours needs it.
# Redis 6.2 knows no subcommand removal: there the user is made without this rule.
_NO_TRACKING = "-client|tracking"
T = TypeVar("T")
HIDDEN = frozenset({"redis", "client", "for_tenant"})
# The store's attributes a tenant handle forwards besides its public methods.
_ATTRIBUTES = frozenset({"tenant", "config", "counter", "idempotency_keep", "idempotency_ttl"})

if TYPE_CHECKING:
    _Handle = SessionStore  # typed as the store it forwards to (minus the hidden names)
else:
    _Handle = object


class TenantStore(_Handle):
    """One tenant's sessions, through the store's methods only (no raw client)."""

    __slots__ = ("_TenantStore__store",)

    def __init__(self, store: SessionStore) -> None:
        object.__setattr__(self, "_TenantStore__store", store)

    def __getattr__(self, name: str) -> Any:
        store = self.__store
        if name in _ATTRIBUTES or (not name.startswith("_") and name not in HIDDEN
                                   and callable(getattr(type(store), name, None))):
            return getattr(store, name)
        raise AttributeError(f"{name!r} is not available on a tenant's store handle: it "
                             "reads and writes only through the store's methods")

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError("a tenant's store handle is read-only")

    def __dir__(self) -> list[str]:
        cls = type(self.__store)
        return sorted(_ATTRIBUTES | {n for n in dir(cls) if not n.startswith("_")
                                     and n not in HIDDEN and callable(getattr(cls, n))})

    def __repr__(self) -> str:
        return f"TenantStore(tenant={self.__store.tenant!r})"

    def execute(self, cmd: commands.Command[T]) -> T:
        """The store's ``execute``, for a command on this tenant's keys only: a command
        is built by the caller, so its keys could name any session of any tenant."""
        store: SessionStore = self.__store
        for key in cmd.keys:
            own_key(store, key)
        return store.execute(cmd)

    def append_encoded(self, session_id: str, encoded: Sequence[tuple[str | bytes, int]],
                       *, job: InlineJob | None = None, **options: Any) -> AppendResult:
        """The store's ``append_encoded`` without an :class:`InlineJob`: the append
        script pushes the job's message into the key it names, in the database it names,
        which could be another tenant's log. A handle has no raw client, so a guard over
        it never builds one (it publishes the job itself)."""
        if job is not None:
            raise InvalidInput("a tenant's store handle pushes no inline job (the caller "
                               "publishes it)", field="job")
        store: SessionStore = self.__store
        return store.append_encoded(session_id, encoded, **options)

    def for_tenant(self, tenant: str) -> TenantStore:
        """Itself for its own tenant; a tenant handle never reaches another tenant."""
        if tenant != self.__store.tenant:
            raise InvalidInput("a tenant's store cannot be re-scoped to another tenant",
                               field="tenant")
        return self


def own_key(store: SessionStore, key: str) -> str:
    """``key``, when it is one of ``store``'s tenant's session keys (the session's hash
    tag, or the recall index's); InvalidInput otherwise."""
    prefix, tenant = store.config.key_prefix, store.tenant
    if not isinstance(key, str) or not key.startswith(
            (f"{prefix}:{{{tenant}:", f"{prefix}:rx:{{{tenant}:")):
        raise InvalidInput(f"{key!r:.120} is not a key of tenant {tenant!r}", field="keys")
    return key


def backing_store(handle: SessionStore) -> SessionStore:
    """The store behind a tenant handle (a plain store is its own), for the store
    layer's own modules only: the recall index runs scripts on keys it derives
    from ``handle.keys(session_id)``, which the handle validated into its tenant.
    An ACL-bound connection (:func:`connect_tenant`) still confines it."""
    if isinstance(handle, TenantStore):
        inner: SessionStore = object.__getattribute__(handle, "_TenantStore__store")
        return inner
    return handle


def tenant_username(tenant: str, prefix: str = "cmp") -> str:
    return f"{prefix}-tenant-{validate_tenant(tenant)}"


def tenant_key_pattern(tenant: str, prefix: str = "cmp") -> str:
    """Every key of the tenant's sessions (``{`` and ``}`` are literal in ACL globs;
    tenant ids have no ``:``, so ``{acme:`` is never a prefix of another tenant's tag)."""
    return f"{prefix}:{{{validate_tenant(tenant)}:*}}*"


def tenant_recall_pattern(tenant: str, prefix: str = "cmp") -> str:
    """Every recall index key of the tenant's sessions (:mod:`shared.store.recall_index`:
    the session's hash tag after ``<prefix>:rx:``)."""
    return f"{prefix}:rx:{{{validate_tenant(tenant)}:*}}*"


def tenant_acl_rules(tenant: str, password: str, prefix: str = "cmp") -> list[str]:
    """The ``ACL SETUSER`` rules of a tenant's user (the password given as its SHA-256)."""
    if not isinstance(password, str) or len(password) < 16:
        raise InvalidInput("must be a string of at least 16 characters", field="password")
    digest = hashlib.sha256(password.encode()).hexdigest()
    return ["reset", "on", f"#{digest}", f"~{tenant_key_pattern(tenant, prefix)}",
            f"~{tenant_recall_pattern(tenant, prefix)}", "resetchannels", *_COMMANDS,
            _NO_TRACKING]


def create_tenant_user(admin: Any, tenant: str, password: str, prefix: str = "cmp") -> str:
    """Create (or reset) the tenant's ACL user with an admin connection; its name.

    Persist it the way the deployment keeps ACLs (``ACL SAVE`` with an
    ``aclfile``, or the rules in the config management that writes it).
    """
    name = tenant_username(tenant, prefix)
    rules = tenant_acl_rules(tenant, password, prefix)
    try:
        admin.execute_command("ACL", "SETUSER", name, *rules)
    except redis.exceptions.ResponseError as exc:
        if _NO_TRACKING not in str(exc):
            raise
        # Redis 6.2: no subcommand removal (a user there may still track key names)
        admin.execute_command("ACL", "SETUSER", name, *(r for r in rules if r != _NO_TRACKING))
    return name


def delete_tenant_user(admin: Any, tenant: str, prefix: str = "cmp") -> bool:
    return bool(admin.execute_command("ACL", "DELUSER", tenant_username(tenant, prefix)))


def connect_tenant(url: str, tenant: str, password: str, config: StoreConfig | None = None,
                   *, counter: TokenCounter | None = None) -> TenantStore:
    """A tenant's store handle over a connection authenticated as its ACL user."""
    cfg = config or StoreConfig()
    client = redis.Redis.from_url(
        url, username=tenant_username(tenant, cfg.key_prefix), password=password,
        socket_timeout=cfg.socket_timeout, socket_connect_timeout=cfg.connect_timeout,
        retry=Retry(NoBackoff(), 0), health_check_interval=30)
    return TenantStore(SessionStore(client, cfg, tenant=tenant, counter=counter))


__all__ = ["TenantStore", "connect_tenant", "create_tenant_user", "delete_tenant_user",
           "tenant_acl_rules", "tenant_key_pattern", "tenant_recall_pattern",
           "tenant_username"]
