"""Plain configuration objects that library code takes explicitly.

Only the edges (the Celery app, the CLI) read the environment, through
``workers.settings``; they build these objects and pass them in. Defaults are
the figures peers converged on (see DESIGN.md, "What anchors the numbers").
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


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
    lease_ttl_seconds: int = Field(default=300, gt=0)
    request_ttl_seconds: int = Field(
        default=3600, gt=0, description="requests left for the lease holder (dirty flag, and "
        "those it took but had not run when it died): must outlive a job's redelivery")
    socket_timeout: float = Field(default=0.5, gt=0)
    connect_timeout: float = Field(default=0.5, gt=0)


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
