"""The Redis session store: append-only log, running token totals, summaries.

All writes of compaction state go through ``commit_summary`` (one Lua
compare-and-swap on the session's version); history edits bump the version
so that every in-flight compaction loses its swap. The store is bound to one
tenant at construction: a caller cannot name another tenant's keys.

Every Redis failure surfaces as :class:`StoreUnavailable` within the socket
timeouts configured in :class:`StoreConfig`, never as a hang. An append whose
reply was lost (a timeout after Redis applied it) is safe to retry when it
carries a request id: the second attempt is recognised and writes nothing.

Standalone Redis and Redis Cluster alike: every key of a session shares one
hash tag, and every multi-key operation is one Lua script over the keys it
is given (a large view read adds one MULTI/EXEC over the same keys), so it
runs on the node that owns the session's slot.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from importlib import resources
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.commands.core import Script
from redis.driver_info import DriverInfo
from redis.retry import Retry

from shared.core.config import StoreConfig
from shared.core.errors import (
    InvalidInput,
    LimitExceeded,
    SlotMoved,
    StoreError,
    StoreUnavailable,
)
from shared.core.messages import Message
from shared.core.records import (
    AppendResult,
    CheapDecision,
    CommitResult,
    HistoryEdit,
    InlineJob,
    RawView,
    SessionState,
    SummaryRecord,
    ViewCursor,
    ViewData,
    current_decisions,
)
from shared.core.tokens import DEFAULT_COUNTER, TokenCounter
from shared.store import commands
from shared.store.commands import EncodedBatch
from shared.store.damage import Mended, mend_steps
from shared.store.edits import rewind_steps, truncate_steps
from shared.store.keys import DEFAULT_TENANT, SessionKeys, validate_tenant
from shared.store.lease import LeaseOps

if TYPE_CHECKING:
    from shared.store.tenancy import TenantStore

T = TypeVar("T")
log = logging.getLogger("shared.store")
# What "Redis is not there right now" looks like. The cluster errors count too:
# every key of one call shares a slot, so they can only mean an unreachable or
# reconfiguring cluster (no reachable node, slot not covered, CLUSTERDOWN).
_REDIS_FAILURES = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                   redis.exceptions.BusyLoadingError, redis.exceptions.ClusterError,
                   redis.exceptions.RedisClusterException)
SCRIPTS = ("append", "commit_summary", "truncate", "rewind", "view", "lease", "cheap",
           "request_failure", "pending", "reset_damaged", "retotal", "rearm_lost")
IDEMPOTENCY_KEEP = 64  # request ids remembered per session (a retry comes within seconds)
IDEMPOTENCY_TTL_SECONDS = 3600


@functools.cache
def _load_lua(name: str) -> str:
    return resources.files("shared.store").joinpath("lua", name).read_text(encoding="utf-8")


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _pairs(flat: Sequence[Any]) -> dict[str, str]:
    return {_s(flat[i]): _s(flat[i + 1]) for i in range(0, len(flat), 2)}


def append_refusal(exc: Exception, session_id: str, config: StoreConfig) -> Exception:
    """The typed error for an append the script refused (a full session, a damaged one),
    else ``exc`` itself."""
    damaged = commands.session_damaged(exc)
    if damaged is not None:
        return damaged
    refused = _refusal(exc)  # sent on the guard's own connection: not typed on the way
    if refused:
        return StoreUnavailable(f"redis refused the append: {refused}")
    if str(exc).startswith("SESSION_FULL"):
        return LimitExceeded(f"session {session_id!r} would exceed "
                             f"{config.max_messages_per_session} messages", field="messages")
    return exc


_REFUSING = (redis.exceptions.OutOfMemoryError, redis.exceptions.ReadOnlyError,
             redis.exceptions.MasterDownError)
_REFUSING_CODES = ("MISCONF", "BUSY", "NOREPLICAS")


_REDIRECTIONS = (redis.exceptions.MovedError, redis.exceptions.AskError,
                 redis.exceptions.TryAgainError)
"""A cluster's answers that redis-py follows for a single command but lets out of a
transaction (a pipeline's ``MULTI``/``EXEC``)."""

_PIPELINE_ERROR = " of pipeline caused error: "


def server_error(exc: Exception) -> str:
    """The server's error text of ``exc``, also where redis-py wrapped it for a pipeline's
    command (``Command # 1 (HSET ...) of pipeline caused error: NOREPLICAS ...``; the
    asyncio client's shows the arguments' tuple)."""
    text = str(exc)
    _, sep, tail = text.rpartition(_PIPELINE_ERROR)
    return tail.lstrip("('\"") if sep else text


def _refusal(exc: Exception) -> str:
    """Why Redis refuses commands for now, as an outage: a server at ``maxmemory`` under
    ``noeviction`` (the policy sessions need), one that cannot persist, a busy script, a
    replica answering after a failover, a primary short of ``min-replicas-to-write``
    replicas (a pipeline's command too). '' for anything else."""
    if isinstance(exc, redis.exceptions.OutOfMemoryError):
        return (f"out of memory ({exc}): raise its maxmemory, or bound sessions with "
                "COMPACTION_SESSION_TTL_SECONDS")
    if isinstance(exc, _REFUSING) or (isinstance(exc, redis.exceptions.ResponseError)
                                      and server_error(exc).startswith(_REFUSING_CODES)):
        return str(exc)
    return ""


def typed_failure(what: str, exc: Exception) -> StoreError | None:
    """The typed error for a failure of Redis itself (None: a reply the caller reads, such
    as a script's refusal): connection trouble is :class:`StoreUnavailable`, which the
    guard rides out; a database number the server does not have is a configuration
    mistake no retry mends, so it says which setting to fix."""
    if isinstance(exc, _REDIS_FAILURES):
        return StoreUnavailable(f"redis unavailable during {what}: {exc}")
    if isinstance(exc, _REDIRECTIONS):
        return SlotMoved(f"redis cluster redirected {what} ({type(exc).__name__}: "
                         f"{server_error(exc)}): its slot is moving to another master")
    refused = _refusal(exc)
    if refused:
        return StoreUnavailable(f"redis refused {what}: {refused}")
    if isinstance(exc, redis.exceptions.ResponseError):
        damaged = commands.session_damaged(exc)
        if damaged is not None:
            return damaged
    if isinstance(exc, redis.exceptions.ResponseError) and "DB index is out of range" in str(exc):
        return StoreError(
            f"redis has no such database ({exc}, during {what}): the number at the end of "
            "the Redis URL (COMPACTION_REDIS_URL) must be below the server's `databases` "
            "setting, 16 by default")
    return None


_TYPED = (*_REDIS_FAILURES, redis.exceptions.ResponseError)
"""What :func:`typed_failure` may type; anything else passes through as it is."""


@contextmanager
def redis_errors(what: str) -> Iterator[None]:
    """Turn connection trouble into the typed StoreUnavailable (:func:`typed_failure`)."""
    try:
        yield
    except _TYPED as exc:
        typed = typed_failure(what, exc)
        if typed is None:
            raise
        raise typed from exc


def driver_info() -> DriverInfo:
    """redis-py's name and version as each connection announces them, given here: left
    to redis-py, every new connection looks its version up in the installed metadata
    (1-2 ms, paid by the first call of a new process)."""
    return DriverInfo(lib_version=redis.__version__)


MAX_CONNECTIONS = 100
"""connect's (and connect_async's) default pool size: calls beyond it wait their turn."""


def connect(url: str, config: StoreConfig | None = None, *,
            max_connections: int = MAX_CONNECTIONS,
            pool_timeout: float | None = None) -> redis.Redis:
    """A client with bounded socket timeouts and no silent retries (no call can hang).

    redis-py clients built by hand retry failed commands up to ten times
    with backoff by default: seconds of stall on the hot path, and a
    replayed non-idempotent write. The store's callers decide about retries.
    Its pool holds at most ``max_connections``; a thread beyond them waits for one,
    first come first served (redis-py's pool, 100 connections, failed the 101st thread's
    call at once with ``Too many connections`` while Redis answered every call), and
    fails (StoreUnavailable) once no connection has come back from an answered call for
    ``pool_timeout`` seconds, by default the connect and socket timeouts
    (:mod:`shared.store.pools`).
    A ``redis+sentinel://`` URL (``rediss+sentinel://`` over TLS) gives a client of the
    primary that Sentinel names (:func:`shared.store.sentinel.connect_sentinel`).
    """
    if isinstance(max_connections, bool) or not isinstance(max_connections, int) \
            or max_connections < 1:
        raise InvalidInput("must be a positive integer", field="max_connections")
    cfg = config or StoreConfig()
    if url.lower().startswith(("redis+sentinel://", "rediss+sentinel://")):
        from shared.store.sentinel import connect_sentinel

        return connect_sentinel(url, cfg, max_connections=max_connections,
                                pool_timeout=pool_timeout)
    from shared.store.pools import FairConnectionPool

    wait = cfg.connect_timeout + cfg.socket_timeout if pool_timeout is None else pool_timeout
    pool = FairConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=wait,
        socket_timeout=cfg.socket_timeout,
        socket_connect_timeout=cfg.connect_timeout,
        retry=Retry(NoBackoff(), 0),
        health_check_interval=30,
        driver_info=driver_info(),
    )
    return redis.Redis.from_pool(pool)


def cluster_nodes(url: str) -> tuple[str, list[tuple[str, int]]]:
    """A cluster URL that may name several nodes (``redis://h1:7000,h2:7000/0``): the
    URL of the first (with the credentials and options), and the others as (host, port).

    One named node is one point of failure: a process started while it is down would
    not find the cluster, however healthy the other masters are."""
    parts = urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    first, *more = hosts.split(",")
    others = []
    for node in more:
        host, colon, port = node.rpartition(":")
        if not colon or "]" in port:  # no port (an IPv6 address alone, too): the default
            host, port = node, "6379"
        if not port.isdigit():
            raise InvalidInput(f"cluster node {node!r} in the Redis URL: port is not a number",
                               field="redis_url")
        others.append((host.strip("[]"), int(port)))
    return urlunsplit(parts._replace(netloc=f"{userinfo}{at}{first}")), others


def connect_cluster(url: str, config: StoreConfig | None = None, *,
                    migration_wait: float | None = None) -> Any:
    """A Redis Cluster client with the same bounded timeouts and no replayed commands.

    ``url`` names one node or several (``redis://h1:7000,h2:7000``): the client asks the
    first that answers for the slot map, then knows every node (a node named here may
    die later; one that is down now is skipped). Cluster clients follow slot moves
    (MOVED/ASK) themselves; a dead, hung or unreachable node surfaces as
    :class:`StoreUnavailable` within a socket timeout
    (:class:`~shared.store.cluster_sync.StoreCluster`), and so does a cluster no named
    node answers for (now: the client asks at once). A call whose slot is being moved
    to another master waits for the move to end, at most ``migration_wait`` seconds
    (default: the connect and socket timeouts), then is :class:`StoreUnavailable`.
    """
    from redis.cluster import ClusterNode

    from shared.store.cluster_sync import StoreCluster
    from shared.store.cluster_wait import check_migration_wait, default_migration_wait

    cfg = config or StoreConfig()
    wait = check_migration_wait(default_migration_wait(cfg) if migration_wait is None
                                else migration_wait)
    first, others = cluster_nodes(url)
    node: Any = ClusterNode  # untyped in redis-py
    with redis_errors("connecting to the cluster"):
        return StoreCluster.from_url(
            first,
            startup_nodes=[node(host, port) for host, port in others],
            socket_timeout=cfg.socket_timeout,
            socket_connect_timeout=cfg.connect_timeout,
            retry=Retry(NoBackoff(), 1),
            driver_info=driver_info(),
            migration_wait=wait,
        )


class SessionStore(LeaseOps):
    """Sessions of one tenant in Redis (standalone or Cluster; fakeredis for tests).

    ``idempotency_keep`` / ``idempotency_ttl``: how many append request ids
    a session remembers, and for how long (seconds): a retried append is
    recognised within these bounds.
    """

    def __init__(self, client: Any, config: StoreConfig | None = None, *,
                 tenant: str = DEFAULT_TENANT, counter: TokenCounter | None = None,
                 idempotency_keep: int = IDEMPOTENCY_KEEP,
                 idempotency_ttl: int = IDEMPOTENCY_TTL_SECONDS,
                 _scripts: Mapping[str, Script] | None = None) -> None:
        for name, value in (("idempotency_keep", idempotency_keep),
                            ("idempotency_ttl", idempotency_ttl)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInput("must be a positive integer", field=name)
        self.redis = client
        self.config = config or StoreConfig()
        self.tenant = validate_tenant(tenant)
        self.counter = counter or DEFAULT_COUNTER
        self.idempotency_keep = idempotency_keep
        self.idempotency_ttl = idempotency_ttl
        # Scripts are bound to the client, not the tenant: for_tenant() shares them.
        self._scripts: Mapping[str, Script] = _scripts or {
            name: client.register_script(_load_lua(f"{name}.lua")) for name in SCRIPTS
        }

    def keys(self, session_id: str) -> SessionKeys:
        return SessionKeys.for_session(self.config.key_prefix, self.tenant, session_id)

    def warm_up(self) -> bool:
        """Connect and load the scripts now, best effort, so that the first call of a new
        process pays for neither (a few ms). False when Redis did not answer (then the
        first call connects, and reports the failure, as usual)."""
        scripts = list(self._scripts.values())
        try:
            loaded = self.redis.script_exists(*(s.sha for s in scripts))
            for script, found in zip(scripts, loaded, strict=True):
                if not found:
                    self.redis.script_load(script.script)
        except Exception as exc:  # any failure here is the first call's to report
            log.debug("warm-up of the store's connection failed: %s", exc)
            return False
        return True

    def for_tenant(self, tenant: str) -> TenantStore:
        """A handle on one tenant's sessions: store methods only, no raw client, no way
        to another tenant (:mod:`shared.store.tenancy`; for isolation Redis enforces,
        :func:`~shared.store.tenancy.connect_tenant` as the tenant's ACL user). Cheap:
        the connection and the registered scripts are shared, nothing is sent."""
        from shared.store.tenancy import TenantStore

        return TenantStore(SessionStore(
            self.redis, self.config, tenant=tenant, counter=self.counter,
            idempotency_keep=self.idempotency_keep, idempotency_ttl=self.idempotency_ttl,
            _scripts=self._scripts))

    def _run(self, what: str, fn: Callable[[], T]) -> T:
        with redis_errors(what):
            return fn()

    def execute(self, cmd: commands.Command[T]) -> T:
        """Run one sans-I/O command (:mod:`shared.store.commands`) and parse its reply."""
        return cmd.parse(self._script(cmd.what, cmd.script, cmd.keys, cmd.args))

    def _script(self, what: str, name: str, keys: list[str], args: list[Any]) -> Any:
        script = self._scripts[name]
        return self._run(what, lambda: script(keys=keys, args=args))

    @property
    def _ttl(self) -> int:
        return self.config.ttl_seconds or 0

    # -- the log ---------------------------------------------------------------
    def encode(self, session_id: str, messages: Iterable[Any]) -> EncodedBatch:
        """Validate and encode messages; nothing is written when any of them is bad.

        Tool-call ids are made unique in the session here (the store boundary,
        :mod:`shared.core.callids`), so every later stage pairs calls and
        results unambiguously at no cost.
        """
        return commands.encode(messages, self.config, self.counter)

    def append(self, session_id: str, messages: Iterable[Any], *,
               request_id: str | None = None) -> int:
        """Append atomically (all or nothing); returns the new length of the log.

        With a ``request_id``, the append happens at most once: a retry with
        the same id (after a timeout that left the outcome unknown) writes
        nothing and returns the length the first attempt produced.
        """
        return self.append_encoded(session_id, self.encode(session_id, messages),
                                   request_id=request_id).length

    def append_encoded(self, session_id: str, encoded: Sequence[tuple[str | bytes, int]], *,
                       request_id: str | None = None, mark_pending: bool = False,
                       with_state: bool = False, state_fields: Mapping[str, Any] | None = None,
                       fields_version: int | None = None, job: InlineJob | None = None,
                       run: Callable[[commands.Command[AppendResult]], AppendResult] | None = None,
                       ) -> AppendResult:
        """Append pre-encoded messages (see :meth:`append`), with the turn's bookkeeping.

        ``mark_pending``: also set the session's pending flag if absent, in
        the same script (``result.marked`` says whether this call set it).
        ``with_state``: return the state hash after the append too.
        ``state_fields``: set these on the state hash too, but only if its
        version is still ``fields_version`` (figures about a view that a
        compaction or an edit has since replaced are dropped). ``run``: what sends the
        script (the guard's own-writes connection, :mod:`shared.store.own_writes`).
        ``job``: pushed by the script too if it sets the pending flag
        (``result.published``); only for a broker queue on this same Redis.
        """
        opts = commands.AppendOptions(request_id, mark_pending, with_state, state_fields,
                                      fields_version, job)
        for _ in range(commands.APPEND_ATTEMPTS):
            cmd = commands.append_command(self.keys(session_id), self.config, encoded, opts,
                                          idempotency_keep=self.idempotency_keep,
                                          idempotency_ttl=self.idempotency_ttl)
            try:
                return self.execute(cmd) if run is None else run(cmd)
            except redis.exceptions.ResponseError as exc:
                # Ids repeat in the session: rename against its mapping and send again.
                renamed = commands.renamed_after(exc, encoded, self.config, self.counter)
                if renamed is None:
                    raise append_refusal(exc, session_id, self.config) from None
                encoded = renamed
        raise StoreUnavailable(f"append to {session_id!r}: tool-call ids kept colliding")

    def length(self, session_id: str) -> int:
        return int(self._run("length", lambda: self.redis.llen(self.keys(session_id).log)))

    def messages(self, session_id: str, start: int = 0, end: int | None = None) -> list[Message]:
        """Messages ``[start, end)`` of the raw log."""
        stop = -1 if end is None else end - 1
        if end is not None and end <= start:
            return []
        raw = self._run("read", lambda: self.redis.lrange(self.keys(session_id).log, start, stop))
        return [Message.model_validate_json(r) for r in raw]

    def range_tokens(self, session_id: str, start: int, end: int) -> int:
        """Estimated tokens of messages ``[start, end)``: two lookups, any history length."""
        if end <= start:
            return 0
        k = self.keys(session_id)

        def read() -> list[Any]:
            pipe = self.redis.pipeline(transaction=False)  # one slot: fine on a Cluster too
            pipe.lindex(k.cum, end - 1)
            if start > 0:
                pipe.lindex(k.cum, start - 1)
            return list(pipe.execute())

        values = self._run("range_tokens", read)
        return int(values[0] or 0) - (int(values[1] or 0) if start > 0 else 0)

    # -- state and summaries ----------------------------------------------------
    def state(self, session_id: str) -> SessionState:
        raw = self._run("state", lambda: self.redis.hgetall(self.keys(session_id).state))
        return SessionState.from_hash({_s(a): _s(b) for a, b in raw.items()})

    def update_state(self, session_id: str, **fields: Any) -> None:
        """Figures that are not compaction state (request figures, calibration, anchor); the
        session's TTL, where one is set, is refreshed with them (a prepare of a session
        never recorded writes its figures: they must not outlive the TTL)."""
        clean = commands.state_fields(fields)
        if not clean:
            return
        key, ttl = self.keys(session_id).state, self.config.ttl_seconds

        def write() -> Any:
            pipe = self.redis.pipeline(transaction=False)
            pipe.hset(key, mapping=clean)
            if ttl:
                pipe.expire(key, ttl)
            return pipe.execute()

        self._run("update_state", write)

    def clear_state_flags(self, session_id: str, *names: str) -> None:
        """Flags of the state back to their default (absent: 0). An HDEL, which never makes a
        state: a worker clearing a flag of a session deleted since it read it would bring
        the state back, alone, for ever where sessions have no TTL."""
        self._run("clear_state_flags",
                  lambda: self.redis.hdel(self.keys(session_id).state, *names))

    def read_view(self, session_id: str, since: ViewCursor | None = None, *,
                  with_counts: bool = False) -> RawView:
        """One atomic read of the view, undecoded; only what is new when ``since`` still holds.

        With a cursor from an earlier read (same epoch and log generation,
        the watermark still inside what it holds), the reply carries
        ``log[since.end:]`` and the summary only if the version changed
        (``incremental``); otherwise everything from the watermark.
        ``with_counts``: also the running token totals of the messages sent
        (:meth:`RawView.message_counts`), read atomically with them. A large
        range comes by plain LRANGE after the script, checked to be the script's
        moment's (:func:`shared.store.commands.view_steps`): two round trips.
        """
        return commands.drive(commands.view_steps(self.keys(session_id), since, with_counts),
                              self._send)

    def _send(self, step: commands.Step) -> Any:
        """One step of a sans-I/O exchange: a script, or plain commands in one MULTI/EXEC."""
        if isinstance(step, commands.Command):
            return self.execute(step)

        def batch() -> list[Any]:
            pipe = self.redis.pipeline(transaction=True)  # one slot: fine on a Cluster too
            for call in step.calls:
                pipe.execute_command(*call)
            return list(pipe.execute())

        return step.parse(self._run(step.what, batch))

    def load_view(self, session_id: str, *, with_counts: bool = False) -> ViewData:
        """One atomic read of everything prepare() needs, decoded; ``with_counts``: with
        the store's token count of each history message (``ViewData.history_counts``)."""
        raw = self.read_view(session_id, with_counts=with_counts)
        # Built from models decoded just above: validating them again (pydantic re-runs
        # every message's validators for a list[Message] field) would double the cost.
        return ViewData.model_construct(
            state=raw.state(),
            history=raw.decode_messages(),
            tokens_before_watermark=raw.tokens_before_watermark,
            tokens_total=raw.tokens_total,
            length=raw.length,
            summary=(SummaryRecord.model_validate_json(raw.summary_json)
                     if raw.summary_json else None),
            cheap=current_decisions(raw.cheap_raw),
            pending=raw.pending,
            epoch=raw.epoch,
            history_counts=raw.message_counts() if with_counts else None,
        )

    def commit_summary(self, session_id: str, record: SummaryRecord,
                       expected_version: int) -> CommitResult:
        """The one compare-and-swap writer. A stale writer gets ``ok=False``; a worker
        holding the lease commits fenced (:meth:`commit_under_lease`)."""
        return self._commit(session_id, record, expected_version, "")

    def _commit(self, session_id: str, record: SummaryRecord, expected_version: int,
                token: str) -> CommitResult:
        return self.execute(commands.commit_command(self.keys(session_id), self.config, record,
                                                    expected_version, token))

    def summary(self, session_id: str, watermark: int) -> SummaryRecord | None:
        raw = self._run("summary",
                        lambda: self.redis.hget(self.keys(session_id).summaries, watermark))
        return SummaryRecord.model_validate_json(raw) if raw else None

    def summaries(self, session_id: str) -> list[SummaryRecord]:
        """Every kept summary, oldest watermark first."""
        k = self.keys(session_id)
        raw = self._run("summaries", lambda: self.redis.hgetall(k.summaries))
        records = [SummaryRecord.model_validate_json(v) for v in raw.values()]
        return sorted(records, key=lambda r: r.watermark)

    def truncate_after(self, session_id: str, index: int) -> HistoryEdit:
        """A history edit: drop positions ``>= index``, bump the version, fall back.

        The summary becomes the newest one whose watermark is ``<= index``.
        This is the only operation that removes messages from the log: the
        user changed history; compaction itself never deletes. Returns the
        version the edit created (read atomically with it); ``HistoryEdit(0, 0, 0)``
        for a session that does not exist (deleted, expired): nothing is written.
        """
        version, watermark, new_length, gen = commands.drive(
            truncate_steps(self.keys(session_id), session_id, index, self._ttl), self._send)
        # Recall answers from the log itself and checks each hit's checksum, so this
        # only frees index space early; nothing past the edit is returned either way.
        from shared.store.recall_index import forget_after  # recall_index imports this module
        if gen:  # 0: no session, nothing was edited
            forget_after(self, session_id, index, gen=gen)
        return HistoryEdit(version=version, watermark=watermark, length=new_length)

    def rewind(self, session_id: str, watermark: int) -> SessionState:
        """Make the kept summary at ``watermark`` current (0: no summary); the state after.
        A session that does not exist (deleted, expired) has nothing to rewind: nothing is
        written (its state reads as the default)."""
        return commands.drive(rewind_steps(self.keys(session_id), watermark, self._ttl),
                              self._send)

    # -- cheap-stage decisions ---------------------------------------------------
    def record_cheap(self, session_id: str, decisions: Iterable[CheapDecision],
                    expected_version: int | None = None) -> int:
        """Record decisions once (first writer wins), so the view's prefix stays stable."""
        items = list(decisions)
        if not items:
            return 0
        return self.execute(commands.cheap_command(self.keys(session_id), self.config, items,
                                                    expected_version))

    def reset_damaged(self, session_id: str) -> bool:
        """Remove the keys of a session whose log and totals no longer agree (Redis evicted
        some of them: :class:`~shared.core.errors.SessionDamaged`), recall index included,
        so that it starts afresh as an expired session would. False, and nothing removed,
        when the session is not damaged (any more)."""
        from shared.store.recall_index import drop_index  # recall_index imports this module
        if not self.execute(commands.reset_damaged_command(self.keys(session_id))):
            return False
        drop_index(self, session_id)
        return True

    def mend_damaged(self, session_id: str) -> Mended:
        """Mend a session Redis damaged (:class:`~shared.core.errors.SessionDamaged`): its
        running totals counted again from its intact log ("retotaled", history kept), or
        its keys removed, recall index included ("reset": the log is gone); "" when it is
        not damaged (any more). See :mod:`shared.store.damage`."""
        from shared.store.recall_index import drop_index  # recall_index imports this module
        done = commands.drive(mend_steps(self.keys(session_id), self.counter), self._send)
        if done == "reset":
            drop_index(self, session_id)
        return done

    def delete_session(self, session_id: str) -> None:
        """Remove every key of a session (explicit user request only). UNLINK: the keys
        are gone at once, their memory freed off Redis's main thread (a DEL of a long
        log frees every message before Redis answers anyone: ~4 ms at 10k)."""
        from shared.store.recall_index import drop_index  # recall_index imports this module
        k = self.keys(session_id)
        keys = [*k.all_keys(), commands.ids_key(k)]
        self._run("delete", lambda: self.redis.unlink(*keys))
        drop_index(self, session_id)


__all__ = ["IDEMPOTENCY_KEEP", "IDEMPOTENCY_TTL_SECONDS", "SessionStore", "connect",
           "connect_cluster", "redis_errors"]
