"""A provider's cooldown, shared by every worker: a wait the provider stated to one call
is honoured by every job, not only by the job it was told to.

Without it a 429 with ``Retry-After: 30`` held back the job that got it, while the
session's later turns and every other session on every worker went on calling the
rate-limited provider at once (QA: six turns of one session, four retry chains, 14
requests).

- **Recorded** when a summarizer call fails with a stated wait (a ``SummarizerUnavailable``
  tagged with ``retry_after``: ``Retry-After`` / ``retry-after-ms`` on a 429 or 503,
  Google's ``RetryInfo``): one Redis key of its own, :func:`cooldown_key`, with a PX expiry
  equal to the wait. One Lua script sets it only when that makes the cooldown longer: a
  shorter wait told to another call never shortens a longer one.
- **Checked** before each summarizer call (one ``PTTL``, Redis's clock, so workers' clocks
  need not agree): while the provider cools down the call is not made, and
  :class:`~shared.core.errors.SummarizerUnavailable` tagged ``cooldown`` with the wait left
  is raised instead, which takes the path of a stated wait (:mod:`workers.tasks`: a Celery
  retry after it plus jitter, capped; a longer one, or the last attempt, goes to the
  offline summarizer). It is counted as
  ``compaction_summarizer_errors_total{error="cooldown"}`` (not as a call) and logged once
  by the job that met it.

The key is per provider, model, endpoint (base URL; Vertex AI's project and location) and
API key, under the store's key prefix: ``{prefix}:cooldown:{provider}:{model}:{digest}``,
then ``:{fingerprint}`` when the summarizer calls with a key. A rate limit is the key's
(its account's): two tenants' worker pools calling one endpoint with their own keys cool
down apart, where one tenant's 429 used to pause the other's summaries; a keyless endpoint
(a local server) keeps the key it always had. Vertex AI has no key: its quota is the
project's, per location, whichever credentials call it. The key holds no secret and names
no session: the endpoint is hashed, the API key only fingerprinted (:func:`fingerprint`,
one-way), the value is the wait stated. An older version's key of a keyed summarizer
(no fingerprint) is no longer read: it holds that version's workers and expires with its
wait, nothing to migrate. ``DEL`` ends a cooldown by hand. Redis is reached through the
worker's store client; a Redis that does not answer here is logged and the call goes
ahead as it would have without the cooldown (the job's own reads and commit report the
outage).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from shared.core.errors import StoreUnavailable, SummarizerUnavailable
from shared.store.own_writes import lua_source
from shared.store.sessions import redis_errors
from shared.telemetry.metrics import get_metrics
from workers.summarizer.failures import failure_of, tag

log = logging.getLogger("compaction.summarizer")
COOLDOWN_CLASS = "cooldown"


def fingerprint(credential: str) -> str:
    """A short one-way fingerprint of an API key: tells two keys' cooldowns apart, never
    gives the key back (tagged, so it matches no other system's hash of the key)."""
    return hashlib.sha256(b"compaction-cooldown\0" + credential.encode()).hexdigest()[:16]


def cooldown_key(prefix: str, provider: str, model: str, endpoint: str,
                 credential: str | None = None) -> str:
    """The cooldown key of ``provider``'s ``model`` at ``endpoint`` (hashed: a base URL may
    carry credentials or an internal host name) called with the API key ``credential``
    (fingerprinted; None or empty: a keyless endpoint, the key without a fingerprint)."""
    digest = hashlib.sha256(endpoint.encode()).hexdigest()[:16]
    key = f"{prefix}:cooldown:{provider}:{model}:{digest}"
    return f"{key}:{fingerprint(credential)}" if credential else key


class ProviderCooldown:
    """The cooldown of one summarizer (provider, model, endpoint, API key), in Redis.

    Built once per worker process (:func:`workers.runtime.build_runtime`) over the store's
    client; thread-safe as the client is.
    """

    def __init__(self, client: Any, key: str, provider: str) -> None:
        self.client = client
        self.key = key
        self.provider = provider
        self._extend = client.register_script(lua_source("cooldown"))

    def remaining(self) -> float:
        """Seconds the provider still cools down (0: none). StoreUnavailable when Redis
        does not answer."""
        with redis_errors("the summarizer's cooldown check"):
            millis = int(self.client.pttl(self.key))
        return max(0, millis) / 1000

    def extend(self, wait: float) -> float:
        """Cool down for ``wait`` seconds unless a longer cooldown is on; the seconds left
        afterwards. StoreUnavailable when Redis does not answer."""
        millis = max(1, round(wait * 1000))
        with redis_errors("the summarizer's cooldown"):
            left = self._extend(keys=[self.key], args=[millis, f"{wait:g}"])
        return int(left) / 1000

    def before_call(self) -> None:
        """Raise the tagged SummarizerUnavailable, without calling, while the provider
        cools down (counted; the job that meets it logs it once, as its failure)."""
        try:
            left = self.remaining()
        except StoreUnavailable as exc:
            log.warning("summarizer cooldown not checked, calling: %s", exc)
            return
        if left <= 0:
            return
        get_metrics().summarizer_skipped(self.provider, COOLDOWN_CLASS)
        raise tag(SummarizerUnavailable(
            f"{self.provider}: not called, the provider cools down for {left:g} s more "
            f"(a wait it stated to an earlier call; {self.key})"),
            COOLDOWN_CLASS, retry_after=left)

    def after_failure(self, exc: BaseException) -> None:
        """Record the wait ``exc`` states, if any, for every worker (never raises)."""
        failure = failure_of(exc)
        if (not isinstance(exc, SummarizerUnavailable) or failure is None
                or failure.error_class == COOLDOWN_CLASS or not failure.retry_after
                or failure.retry_after <= 0):
            return
        try:
            left = self.extend(failure.retry_after)
        except StoreUnavailable as exc_redis:
            log.warning("summarizer cooldown of %g s not recorded: %s", failure.retry_after,
                        exc_redis)
            return
        log.info("summarizer %s cools down for %g s on every worker (stated wait %g s)",
                 self.key, left, failure.retry_after)


__all__ = ["COOLDOWN_CLASS", "ProviderCooldown", "cooldown_key", "fingerprint"]
