"""What the guard returns: the view to send and the report of its decisions."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from shared.core.budget import BudgetReport
from shared.core.messages import Message


class ViewReport(BaseModel):
    """What the guard decided for one request."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    model: str
    limits_source: str
    budget: BudgetReport
    estimated_prompt_tokens: int
    watermark: int
    version: int
    length: int
    summary_kind: str
    cheap_applied: int
    truncated: bool
    dropped_messages: int
    note: str
    enqueued: bool
    pending_job: bool
    recovery: bool
    degraded: bool
    elapsed_ms: float


class PreparedView(BaseModel):
    """The messages to send (system message first) and the report."""

    model_config = ConfigDict(frozen=True)

    messages: list[Message]
    report: ViewReport

    def openai(self, *, include_reasoning: bool = False) -> list[dict[str, Any]]:
        """The view in OpenAI Chat Completions format.

        ``reasoning_content`` is left out by default (api.openai.com rejects
        it); DeepSeek / vLLM style endpoints may want ``include_reasoning=True``.
        """
        from shared.core.wire import to_openai

        return to_openai(self.messages, include_reasoning=include_reasoning)


__all__ = ["PreparedView", "ViewReport"]
