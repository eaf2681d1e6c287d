"""Plain configuration objects that library code takes explicitly.

Only the edges (the Celery app, the CLI) read the environment, through
``workers.settings``; they build these objects and pass them in. Defaults are
the figures peers converged on (see DESIGN.md, "What anchors the numbers").
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator


class StoreConfig(BaseModel):
    """Limits and retention of the Redis session store."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key_prefix: str = Field(default="cmp", pattern=r"^[a-z][a-z0-9_]{0,15}$")
    max_message_bytes: int = Field(default=2_000_000, gt=0)
    max_messages_per_call: int = Field(default=500, gt=0)
    max_messages_per_session: int = Field(default=100_000, gt=0)
    summary_retention: int = Field(default=50, ge=1, description="summaries kept per session")
    ttl_seconds: int | None = Field(default=None, gt=0, description="refreshed on every write")
    pending_ttl_seconds: int = Field(default=600, gt=0)
    pending_stale_seconds: int | None = Field(
        default=None, ge=0, description="a pending flag no worker claimed for this long is "
        "taken for a lost job's: the next writer re-arms it and publishes the job again; "
        "0: never; None: half of pending_ttl_seconds (see pending_stale_after)")
    lease_ttl_seconds: int = Field(default=300, gt=0)
    request_ttl_seconds: int = Field(
        default=3600, gt=0, description="requests left for the lease holder (dirty flag, and "
        "those it took but had not run when it died): must outlive a job's redelivery")
    socket_timeout: float = Field(default=0.5, gt=0)
    connect_timeout: float = Field(default=0.5, gt=0)
    cluster_migration_wait: float | None = Field(
        default=None, ge=0, allow_inf_nan=False, description="on a Redis Cluster, how long "
        "a call whose slot is being moved to another master waits for the move to end "
        "before StoreUnavailable; None: connect_timeout + socket_timeout")

    @field_validator("pending_stale_seconds")
    @classmethod
    def _stale_before_expiry(cls, value: int | None, info: ValidationInfo) -> int | None:
        """A flag is never older than its TTL: an age at or past it would never be met."""
        ttl = info.data.get("pending_ttl_seconds")
        if value and isinstance(ttl, int) and value >= ttl:
            raise ValueError(f"must be below pending_ttl_seconds ({ttl}), or 0 to never "
                             "publish a pending job again")
        return value

    @property
    def pending_stale_after(self) -> int:
        """Seconds after which a pending flag no worker claimed is re-armed and its job
        published again by the next writer that would have set it (0: never).

        The default is half the flag's TTL: 300 s with the default 600 s. A queued job
        clears the flag when a worker starts it, so the flag's age is how long its job has
        waited. 300 s is above the broker's visibility timeout with the workers' default
        timing (258 s, ``workers.settings``): a job whose worker was killed after taking it
        is redelivered, and clears the flag, before it counts as stale; what is left is a
        job lost for good (a purge, a message lost between the broker and a killed
        worker) or a queue minutes behind. A duplicate job is harmless (the lease and the
        watermark's compare-and-swap make it a no-op or a small extra compaction) and
        there is at most one per session per stale period, the re-armed flag being young
        again. Half of a shorter TTL keeps the rule valid for any TTL and never re-publishes
        later than the flag's expiry would have let the next turn publish anyway."""
        if self.pending_stale_seconds is None:
            return self.pending_ttl_seconds // 2
        return self.pending_stale_seconds


class CompactionPolicy(BaseModel):
    """When to compact and how far: the hysteresis and cheap-stage knobs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    trigger_ratio: float = Field(default=0.80, gt=0, le=1)
    target_ratio: float = Field(default=0.50, gt=0, le=1)
    keep_recent_ratio: float = Field(default=0.25, gt=0, lt=1, description="of the window")
    keep_recent_tokens: int | None = Field(default=None, gt=0)
    message_threshold: int = Field(default=400, gt=0, description="messages since watermark")
    min_saving_ratio: float = Field(default=0.10, ge=0, lt=1,
                                    description="skip smaller compactions")
    recovery_ratio: float = Field(default=0.20, gt=0, lt=1,
                                  description="of the window after an overflow")
    unrecognised_overflow_at: float | None = Field(
        default=0.90, gt=0, le=1,
        description="an error nothing recognises, refusing a request at least this full "
                    "(prompt + output reserve over the window), is taken for an overflow in "
                    "a wording no pattern knows: compacted to target_ratio and retried once; "
                    "None: never")
    emergency_drop_fraction: float = Field(default=0.5, gt=0, lt=1)
    split_turn_min_messages: int = Field(default=5, ge=2)
    # cheap stages
    clear_tool_outputs_over_tokens: int = Field(default=400, gt=0)
    clear_keep_recent_turns: int = Field(default=3, ge=0)
    # summary size caps (no runaway growth)
    max_summary_tokens: int = Field(default=2_000, gt=0)
    max_ledger_chars: int = Field(default=4_000, gt=0)
    summary_placement: Literal["system", "message"] = "system"
    recall_notice: bool = Field(default=True, description="when a request offers the recall "
                                "tool, its summary says what can be recalled and how")
    proactive: bool = Field(default=True, description="kill switch; recovery stays on regardless")

    @model_validator(mode="after")
    def _ordered(self) -> CompactionPolicy:
        if self.target_ratio >= self.trigger_ratio:
            raise ValueError("target_ratio must be below trigger_ratio (hysteresis)")
        return self

    def keep_recent_for(self, window: int) -> int:
        """Tokens of recent history kept verbatim for a given window."""
        if self.keep_recent_tokens is not None:
            return self.keep_recent_tokens
        return max(1, int(window * self.keep_recent_ratio))


__all__ = ["CompactionPolicy", "StoreConfig"]
