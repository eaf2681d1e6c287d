"""The lease protocol: how any number of workers share sessions, in one place.

Keys (all under the session's hash tag, see :mod:`shared.store.keys`):

``pending``: "a job is queued". The guard sets it (``SET NX``, with the
    append) and publishes only when it was absent: a burst of turns leaves at
    most one queued job. A job clears it first (``claim``); it expires, so a
    job lost on the way never blocks the session, and one that stood unclaimed
    past ``StoreConfig.pending_stale_after`` is re-armed by the next writer, which
    publishes the job again (in the same script: one re-publish per stale period).
``lease``: the holder's random token with an expiry: one job at a time per
    session. ``SET NX PX``; extended and released only by its owner (``lease.lua``).
``dirty``: requests left for the holder by jobs that found the lease taken,
    one line each (``force``, ``keep_recent``, manual), appended: none
    overwrites another. A busy job appends, then tries the lease once more.
``taken``: what the holder took from ``dirty`` and is running, kept until its
    next look: a holder that dies hands them on (the next ``acquire`` moves
    them back to ``dirty``).
``watch``: "a busy job's follow-up is scheduled" (see Failures), expiring when
    it is due; the follow-up deletes it as it starts. ``more`` when that one can
    schedule another, ``last`` when it is the last of its chain (a fresh busy
    job then schedules one of its own).

The holder's loop (:class:`LeaseHolder`): run its own request, then
``finish`` (one script): requests waiting? take them, extend the lease, run
them, look again; none? release, in the same atomic step as the look, so
no request can land between the last look and the release. After
:data:`MAX_RERUN_ROUNDS` rounds it releases and hands the rest to a
follow-up job.

Renewal. A holder takes the lease for at most :data:`HOLD_TTL_SECONDS` and a
thread of the job extends it every third of that (:class:`Renewal`), no
longer than the job's hard time limit: a job that outlives it (the threads
pool cannot kill it) lets its lease expire, and a killed one's expires soon.

Fencing. A holder commits with its token (:meth:`LeaseOps.commit_under_lease`):
``commit_summary.lua`` checks it against the lease in the same script as the
version compare-and-swap, so a job that lost its lease (expired, session
deleted) gets ``CommitResult(ok=False, reason="lease")`` and writes nothing,
even when its version still matches; its request goes back to the flag.

Failures. A claim Redis does not answer is sent again with the same token for a few
seconds (:data:`CLAIM_RETRY_DELAYS`; the lease script takes a lease its token holds for
the caller's, so a claim that ran but lost its answer is not busy with itself); still
unanswered, the task asks Celery for a retry, since nothing was taken and the pending
flag it did not clear keeps later turns from publishing. A retried job comes back and
finds the flag. One that fails for
good (``StoreUnavailable``, a bug) puts back what it took and hands waiting
requests to a follow-up job (after the lease's TTL if it could not release),
at most :data:`MAX_HANDOFFS` times in a row (a job stopped by its process,
``SystemExit``, gives nothing up: what it cannot hand over stays in the flag for
its redelivery); then they leave the flag as failed, in the session's state
(``requests_failed``, ``last_request_failure``:
``guard.stats()``, ``compaction stats``) and the task's result: never unseen.
A busy job also sends a follow-up for when the holder's lease would expire:
a holder killed with ``-9`` runs nothing, and its redelivered job may still
find the lease held; the follow-up takes the requests over. One such follow-up
per session is enough (``watch``): a busy job leaves its request in ``dirty``
first, so the follow-up already scheduled, which starts later, finds it; a
follow-up that finds the lease held again schedules the next.
"""

from __future__ import annotations

import contextvars
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from shared.core.errors import InvalidInput, StoreUnavailable
from shared.core.records import CommitResult, SummaryRecord
from shared.store.commands import pending_command, rearm_lost_command
from shared.store.requests import Request, distinct

if TYPE_CHECKING:
    from shared.core.config import StoreConfig
    from shared.store.keys import SessionKeys

log = logging.getLogger("compaction.lease")
MAX_RERUN_ROUNDS = 3  # rounds of "take the requests left while we held it, run them"
MAX_HANDOFFS = 3  # follow-up jobs in a row after failures, then requests are failed
LEASE_LOST = "lease_lost"  # an outcome whose commit was refused: the lease was lost
HOLD_TTL_SECONDS = 30.0  # a holder renews in steps of this: a killed one's lease is gone soon
CLAIM_RETRY_DELAYS = (0.25, 0.5, 1.0, 2.0, 4.0)
"""Pauses between a job's claims while Redis does not answer (a restart, a failover, a
freeze: ~8 s in all). A job that fails its claim leaves the pending flag set, and no
later turn publishes a job until the flag goes stale (minutes): waiting here is cheaper."""


def _lines(raw: Any) -> list[str]:
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return [line for line in text.split("\n") if line]


class LeaseOps:
    """The store's side of the protocol (mixed into :class:`SessionStore`)."""

    if TYPE_CHECKING:
        config: StoreConfig
        redis: Any
        def keys(self, session_id: str) -> SessionKeys: ...
        def _run(self, what: str, fn: Callable[[], Any]) -> Any: ...
        def _script(self, what: str, name: str, keys: list[str], args: list[Any]) -> Any: ...
        def _commit(self, session_id: str, record: SummaryRecord, expected_version: int,
                    token: str) -> CommitResult: ...

    def mark_pending(self, session_id: str) -> int:
        """Set the pending flag if absent, or re-arm a stale one (``pending.lua``); truthy
        means the caller should enqueue a job: 1, or 3 when the flag had stood unclaimed
        past the config's ``pending_stale_after``
        (:func:`shared.store.commands.rearmed`)."""
        cmd = pending_command(self.keys(session_id), self.config)
        return cmd.parse(self._script(cmd.what, cmd.script, cmd.keys, cmd.args))

    def rearm_lost(self, session_id: str) -> bool:
        """Re-arm the pending flag if it stood past the stale age while no worker holds
        the lease (``rearm_lost.lua``): True when this call did and the caller publishes
        the job again (the workers' sweep, :mod:`workers.sweep`); False, nothing changed,
        otherwise (:func:`shared.store.commands.rearm_lost_command`)."""
        cmd = rearm_lost_command(self.keys(session_id), self.config)
        return cmd.parse(self._script(cmd.what, cmd.script, cmd.keys, cmd.args))

    def clear_pending(self, session_id: str) -> None:
        self._run("clear_pending", lambda: self.redis.delete(self.keys(session_id).pending))

    def is_pending(self, session_id: str) -> bool:
        return bool(self._run("is_pending",
                              lambda: self.redis.exists(self.keys(session_id).pending)))

    def _lease(self, what: str, session_id: str, token: str, mode: str,
               ttl_seconds: float | None = None) -> Any:
        k = self.keys(session_id)
        ttl_ms = int((ttl_seconds or self.config.lease_ttl_seconds) * 1000)
        return self._script(what, "lease", [k.lease, k.dirty, k.taken, k.pending],
                            [token, mode, ttl_ms, self.config.request_ttl_seconds * 1000])

    def _watch_key(self, session_id: str) -> str:
        return self.keys(session_id).watch

    def mark_watched(self, session_id: str, seconds: float, last: bool) -> bool:
        """Note a busy job's follow-up, due in ``seconds`` (``last``: it watches no further);
        False: one is scheduled already that can carry this job's request."""
        key, ms = self._watch_key(session_id), max(int(seconds * 1000), 1)
        value = "last" if last else "more"

        def mark() -> bool:
            if self.redis.set(key, value, nx=True, px=ms):
                return True
            if last:
                return False
            return self.redis.set(key, value, px=ms, get=True) not in (b"more", "more")

        return bool(self._run("mark_watched", mark))

    def clear_watched(self, session_id: str) -> None:
        """A follow-up starts (or was not sent): the next busy job schedules its own."""
        key = self._watch_key(session_id)
        self._run("clear_watched", lambda: self.redis.delete(key))

    def acquire_lease(self, session_id: str, ttl_seconds: float | None = None) -> str | None:
        """An owner token if the lease was free; a dead owner's taken requests go back."""
        token = secrets.token_hex(16)
        return token if self._lease("acquire_lease", session_id, token, "acquire",
                                    ttl_seconds) else None

    def claim(self, session_id: str, ttl_seconds: float | None = None, *,
              token: str | None = None) -> str | None:
        """A job's first step in one round trip: clear the pending flag, try the lease.
        ``token``: the one an earlier attempt of this claim sent (it may have run though
        its answer was lost): a lease it holds is the caller's."""
        token = token or secrets.token_hex(16)
        return token if self._lease("claim", session_id, token, "claim", ttl_seconds) else None

    def finish_lease(self, session_id: str, token: str,
                     ttl_seconds: float | None = None) -> tuple[str, list[str]]:
        """The owner's last look and release, atomically: ``("released", [])``, ``("dirty",
        requests)`` (taken, lease extended; the next call marks them done) or ``("lost", [])``."""
        raw = self._lease("finish_lease", session_id, token, "finish", ttl_seconds)
        (status,) = _lines(raw[0])
        return (status, _lines(raw[1])) if status == "dirty" else (status, [])

    def extend_lease(self, session_id: str, token: str, ttl_seconds: float | None = None) -> bool:
        return bool(self._lease("extend_lease", session_id, token, "extend", ttl_seconds))

    def lease_remaining(self, session_id: str) -> float:
        """Seconds before the session's lease expires (0: free)."""
        ms = self._run("lease_remaining", lambda: self.redis.pttl(self.keys(session_id).lease))
        return max(int(ms), 0) / 1000

    def release_lease(self, session_id: str, token: str) -> bool:
        """Release if still the owner; what it took is forgotten (ran or put back)."""
        return bool(self._lease("release_lease", session_id, token, "release"))

    def commit_under_lease(self, session_id: str, record: SummaryRecord,
                           expected_version: int, token: str) -> CommitResult:
        """:meth:`SessionStore.commit_summary`, fenced: refused (``reason="lease"``)
        unless ``token`` still holds the session's lease, in the same script."""
        if not token:
            raise InvalidInput("a fenced commit needs the lease token", field="token")
        return self._commit(session_id, record, expected_version, token)

    def mark_dirty(self, session_id: str, request: str = "") -> None:
        """Ask the lease holder to run once more; ``request`` (one line) rides along."""
        if not isinstance(request, str) or "\n" in request:
            raise InvalidInput("must be a string of one line", field="request")
        k = self.keys(session_id)
        self._run("mark_dirty", lambda: self.redis.pipeline(transaction=True).append(
            k.dirty, "\n" + request).expire(k.dirty, self.config.request_ttl_seconds).execute())

    def take_dirty(self, session_id: str) -> bool:
        return self.take_dirty_requests(session_id) is not None

    def take_dirty_requests(self, session_id: str) -> list[str] | None:
        """Read and clear the dirty flag: None when it was not set, else its requests."""
        raw = self._run("take_dirty", lambda: self.redis.getdel(self.keys(session_id).dirty))
        return None if raw is None else _lines(raw)

    def requests_waiting(self, session_id: str) -> bool:
        """Whether requests wait for a holder (in the flag, or taken by a dead one)."""
        k = self.keys(session_id)
        return bool(self._run("requests_waiting", lambda: self.redis.exists(k.dirty, k.taken)))

    def record_request_failure(self, session_id: str, requests: list[str], error: str) -> bool:
        """Requests given up on: counted in the state (``requests_failed``) with why. False
        when the session is gone (deleted or expired since the job read it): nothing is
        written, as a count alone would be a state no delete comes for (the task's result
        still names the requests)."""
        k = self.keys(session_id)
        detail = json.dumps({"at": round(time.time(), 3), "error": error[:300],
                             "requests": [asdict(Request.decode(r)) for r in requests[:10]]},
                            sort_keys=True)
        return bool(self._script("record_request_failure", "request_failure", [k.state],
                                 [max(1, len(requests)), detail]))


class Renewal:
    """Extends a held lease every ``ttl / 3`` until stopped or ``until`` (monotonic); an
    extension that fails (Redis away) is tried again, one that finds another owner sets
    :attr:`lost` and stops."""

    def __init__(self, store: LeaseOps, session_id: str, token: str, ttl_seconds: float,
                 until: float) -> None:
        self.store, self.session_id, self.token = store, session_id, token
        self.ttl, self.until, self.renewals = ttl_seconds, until, 0
        self.lost, self._stop = threading.Event(), threading.Event()
        # in the job's context: its log lines ("lease lost", "renewal failed") carry the
        # job's ids, as the job's own lines do
        self._thread = threading.Thread(target=contextvars.copy_context().run,
                                        args=(self._loop,), daemon=True)

    def _loop(self) -> None:
        wait = self.ttl / 3
        while not self._stop.wait(wait) and time.monotonic() < self.until:
            try:
                if not self.store.extend_lease(self.session_id, self.token, self.ttl):
                    self.lost.set()
                    log.warning("lease of %s lost while working", self.session_id)
                    return
                self.renewals, wait = self.renewals + 1, self.ttl / 3
            except StoreUnavailable as exc:  # soon again: the TTL keeps running
                wait = self.ttl / 10
                log.warning("lease renewal of %s failed, trying again: %s", self.session_id, exc)

    def __enter__(self) -> Renewal:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class Outcome(Protocol):
    @property
    def status(self) -> str: ...


O = TypeVar("O", bound=Outcome)  # noqa: E741 - the outcome type of one request


@dataclass
class LeaseHolder(Generic[O]):
    """One job's run of the protocol. ``execute(request, token)`` runs a request (commits
    fenced with ``token``), ``follow_up(countdown, handoff)`` publishes a follow-up job,
    ``retried(exc)``: whether the task queue brings this job back after ``exc``."""

    store: LeaseOps
    session_id: str
    execute: Callable[[Request, str], O]
    follow_up: Callable[[float, int], None]
    retried: Callable[[BaseException], bool]
    time_limit: float
    ttl_seconds: float
    handoff: int = 0
    outcome: O | None = None
    reruns: list[str] = field(default_factory=list)
    renewals: int = 0
    failure: dict[str, Any] = field(default_factory=dict)
    claimed: bool = False  # the claim answered (a failure after it is the holder's to hand over)
    _until: float = 0.0
    _renewal: Renewal | None = None
    _lost: bool = False  # a commit under the current token was refused

    def run(self, request: Request) -> bool:
        """False when the lease was busy (the request is left to the holder)."""
        self._until = time.monotonic() + self.time_limit
        self.ttl_seconds = min(self.ttl_seconds, HOLD_TTL_SECONDS)
        own: Request | None = request
        token = self._claim()
        self.claimed = True
        if token is None:
            self.store.mark_dirty(self.session_id, request.encode())
            token = self.store.acquire_lease(self.session_id, self.ttl_seconds)
            if token is None:
                self._watch_holder()
                return False
            own = None  # in the flag now: finish() runs it
        with self._held(token):
            if own is not None:
                self.outcome = self._execute([own], 0, token, own=True)
            finished = self._finish(token)
        if not finished:
            self._settle()
        return True

    def _claim(self) -> str | None:
        """The claim (and a follow-up's clearing of its watch), sent again with the same
        token while Redis does not answer, for :data:`CLAIM_RETRY_DELAYS`; both steps are
        safe to repeat. Then the last failure is raised."""
        token = secrets.token_hex(16)
        for delay in (*CLAIM_RETRY_DELAYS, None):
            try:
                if self.handoff:  # a follow-up: requests left from now on need their own
                    self.store.clear_watched(self.session_id)
                return self.store.claim(self.session_id, self.ttl_seconds, token=token)
            except StoreUnavailable as exc:
                if delay is None:
                    raise
                log.warning("claim of %s: redis did not answer (%s); again in %.2f s",
                            self.session_id, exc, delay)
                time.sleep(delay)
        raise AssertionError("unreachable")

    def _watch_holder(self) -> None:
        """A live holder runs the request before it ends; a killed one (-9) runs nothing,
        so a follow-up job comes once its lease would have expired and takes over: one
        per session, since it finds every request left before it starts."""
        if self.handoff >= MAX_HANDOFFS:
            return
        countdown = self.store.lease_remaining(self.session_id) + 1.0
        last = self.handoff + 1 >= MAX_HANDOFFS
        if not self.store.mark_watched(self.session_id, countdown, last):
            return  # a follow-up is due, and it starts after this request was left
        try:
            self.follow_up(countdown, self.handoff + 1)
        except Exception as exc:  # the next turn's job finds the request in the flag
            with suppress(StoreUnavailable):
                self.store.clear_watched(self.session_id)
            log.warning("busy %s: follow-up job not sent: %s", self.session_id, exc)

    @contextmanager
    def _held(self, token: str) -> Iterator[None]:
        """Renewed while inside; on a failure: released and handed over, then re-raised."""
        self._lost = False
        try:
            with Renewal(self.store, self.session_id, token, self.ttl_seconds,
                         self._until) as self._renewal:
                yield
        except BaseException as exc:
            released = False
            with suppress(StoreUnavailable):
                released = self.store.release_lease(self.session_id, token)
            if not self.retried(exc):
                self._hand_over(exc, released)
            raise
        finally:
            self.renewals += self._renewal.renewals if self._renewal is not None else 0
            self._renewal = None

    @property
    def lost(self) -> bool:
        return self._lost or (self._renewal is not None and self._renewal.lost.is_set())

    def _execute(self, requests: list[Request], i: int, token: str, own: bool = False) -> O:
        """Run ``requests[i]``; on a lost lease it and the rest go back to the flag, on a
        failure too, except the job's own (Celery retries it, or the task fails)."""
        try:
            outcome = self.execute(requests[i], token)
        except BaseException:
            if not own:
                self._put_back(requests[i:])
            raise
        if outcome.status == LEASE_LOST:
            self._lost = True
            self._put_back(requests[i:])
        return outcome

    def _finish(self, token: str) -> bool:
        """Run the requests left in the flag, then release (one atomic look). False
        when the lease was lost or rounds ran out (released): :meth:`_settle` follows."""
        for _ in range(MAX_RERUN_ROUNDS):
            if self.lost:
                return False
            status, lines = self.store.finish_lease(self.session_id, token, self.ttl_seconds)
            if status != "dirty":
                return status == "released"
            requests = distinct(lines)
            for i in range(len(requests)):
                outcome = self._execute(requests, i, token)
                self.reruns.append(outcome.status)
                self.outcome = self.outcome or outcome
                if self._lost:
                    return False
        self.store.release_lease(self.session_id, token)
        return False

    def _put_back(self, requests: list[Request]) -> None:
        for request in requests:  # a busy job's APPEND: none overwrites another
            self.store.mark_dirty(self.session_id, request.encode())

    def _settle(self) -> None:
        """After the lease was lost or rounds ran out: run what is left under the lease,
        or leave it to the job holding it now (it looks before it releases). Requests
        stay in the flag meanwhile: never taken out where a failure could drop them."""
        for _ in range(MAX_RERUN_ROUNDS):
            if not self.store.requests_waiting(self.session_id):
                return
            token = self.store.acquire_lease(self.session_id, self.ttl_seconds)
            if token is None:
                return  # another holder: it finds them before it releases
            with self._held(token):
                if self._finish(token):
                    continue
            break
        if self.store.requests_waiting(self.session_id):  # a stream: a fresh job goes on
            self._send_follow_up(0, 0, "requests left after the rerun rounds")

    def _hand_over(self, exc: BaseException, released: bool) -> None:
        """A failure that is not retried: requests that may wait go to a follow-up job
        (after the lease's TTL if it may still be held), or are recorded failed."""
        error = f"{type(exc).__name__}: {exc}"[:300]
        # SystemExit, KeyboardInterrupt: the process is stopped, not the requests failing
        # (Celery cancels a prefork job when the broker connection drops, so the follow-up
        # cannot be sent either): they stay in the flag for the job's redelivery.
        stopped = not isinstance(exc, Exception)
        waiting = True  # unless a look says otherwise (Redis may be what failed)
        with suppress(StoreUnavailable):
            waiting = self.store.requests_waiting(self.session_id)
        self.failure = {"error": error, "requests_waiting": waiting}
        if waiting and self.handoff >= MAX_HANDOFFS and not stopped:
            self._give_up(f"{error} ({self.handoff} follow-up jobs failed too)")
        elif waiting:
            countdown = 0.0 if released else self.ttl_seconds
            if self._send_follow_up(countdown, self.handoff + 1, error, give_up=not stopped):
                self.failure.update(handed_to_follow_up=True, countdown=countdown)

    def _send_follow_up(self, countdown: float, handoff: int, why: str,
                        give_up: bool = True) -> bool:
        try:
            self.follow_up(countdown, handoff)
        except Exception as exc:  # the broker is away too: recorded, not hidden
            reason = f"{why}; follow-up job not sent: {type(exc).__name__}: {exc}"
            if give_up:
                self._give_up(reason)
            else:
                log.warning("%s for %s: left in the flag for the next job", reason,
                            self.session_id)
            return False
        log.warning("%s for %s: follow-up job sent (in %.0f s)", why, self.session_id, countdown)
        return True

    def _give_up(self, error: str) -> None:
        """Take the waiting requests out of the flag and record them failed."""
        self.failure["requests_failed"] = True
        try:
            self.failure["failed"] = lines = self.store.take_dirty_requests(self.session_id) or []
            self.store.record_request_failure(self.session_id, lines, error)
        except StoreUnavailable as exc:  # the task's result still names them
            self.failure["not_recorded"] = str(exc)[:200]
        log.error("requests for %s given up: %s", self.session_id, error)


__all__ = ["HOLD_TTL_SECONDS", "LEASE_LOST", "MAX_HANDOFFS", "MAX_RERUN_ROUNDS", "LeaseHolder",
           "LeaseOps", "Renewal", "Request", "distinct"]
