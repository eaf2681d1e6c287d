"""How long a cluster call waits out a slot migration, shared by both cluster clients.

While a slot moves to another master, Redis runs a command naming several keys only
where it holds all of them, and answers ``TRYAGAIN`` otherwise: the command did not
run, so sending it again is safe. The store's scripts name every key a session may have
(some never exist), so every script of every session in that slot meets ``TRYAGAIN``
until the slot is assigned to its new master. redis-py gives up after 16 tries (about
0.4 s) and its asyncio client followed ``ASK`` with ``ASKING`` sent on another connection
than the command's; the clients (:mod:`shared.store.cluster_sync`,
:mod:`shared.store.cluster_aio`) instead try again with a short backoff, starting over
at the slot's owner, until the migration ends or their wait is spent
(:class:`MigrationWait`), then fail with :class:`SlotMigrating` (``StoreUnavailable``
through the store) naming the slot.
"""

from __future__ import annotations

import math
import time

import redis.exceptions

from shared.core.config import StoreConfig
from shared.core.errors import InvalidInput

FIRST_DELAY = 0.01
"""Seconds before the first retry of a refused call; doubled each time, up to
:data:`MAX_DELAY`."""
MAX_DELAY = 0.1
"""The longest pause between two tries: a migration that ends is noticed within it."""


def default_migration_wait(config: StoreConfig) -> float:
    """The config's ``cluster_migration_wait``, by default the store's connect and socket
    timeouts: the time a call on a dead node takes to fail (1 s with the defaults)."""
    if config.cluster_migration_wait is not None:
        return config.cluster_migration_wait
    return config.connect_timeout + config.socket_timeout


def check_migration_wait(value: float) -> float:
    """``value`` as a wait in seconds (0: fail at the first ``TRYAGAIN``; a bound, so
    finite)."""
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not (value >= 0 and math.isfinite(value))):
        raise InvalidInput(f"must be a finite number of seconds >= 0, not {value!r}",
                           field="migration_wait")
    return float(value)


class SlotMigrating(redis.exceptions.ClusterError):
    """A call the cluster kept refusing (``TRYAGAIN``) for longer than the client's
    migration wait: its slot is being moved to another master."""


class MigrationWait:
    """The pauses of one call between the cluster's ``TRYAGAIN`` answers: exponential
    from :data:`FIRST_DELAY` to :data:`MAX_DELAY`, within ``bound`` seconds in all."""

    def __init__(self, bound: float) -> None:
        self.bound = bound
        self.started = time.monotonic()
        self.tries = 0

    def pause(self, slot: int | None, node: str) -> float:
        """Seconds to sleep before the next try; raises :class:`SlotMigrating` once the
        wait is spent."""
        waited = time.monotonic() - self.started
        left = self.bound - waited
        if left <= 0:
            where = "its slot" if slot is None else f"slot {slot}"
            raise SlotMigrating(
                f"{where} is being migrated: the cluster answered TRYAGAIN ({node}) for "
                f"{waited:.2f} s, {self.tries + 1} tries; the client waits at most "
                f"{self.bound:g} s (migration_wait)")
        self.tries += 1
        return min(FIRST_DELAY * 2.0 ** (self.tries - 1), MAX_DELAY, left)


__all__ = ["FIRST_DELAY", "MAX_DELAY", "MigrationWait", "SlotMigrating",
           "check_migration_wait", "default_migration_wait"]
