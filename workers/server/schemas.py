"""Request and response bodies of the HTTP API: pydantic models at the boundary.

Messages travel in the wire format the request names (``openai``,
``anthropic``, ``gemini``; ``neutral`` is the project's own ``Message``);
they are converted with ``shared.core.wire``, which names the bad field
(``messages[3].tool_call_id: required``) when they do not convert.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainValidator

from shared.core.prepared import ViewReport
from shared.core.recall import DEFAULT_LIMIT, MAX_LIMIT, MAX_QUERY_CHARS, RecallHit

Format = Literal["openai", "anthropic", "gemini", "neutral"]


def _whole(value: Any) -> Any:
    """A float with no fractional part as the integer it is: ``2000.0`` is what Python's
    ``json.dumps`` writes for a figure computed in floats (a string or ``1.5`` stays
    refused by the strict check that follows)."""
    if type(value) is float and value.is_integer():
        return int(value)
    return value


Whole = Annotated[int, BeforeValidator(_whole)]
"""An integer of a request body: strict, but ``2000.0`` is 2000."""


class _Body(BaseModel):
    """A request body: unknown fields and lax types are 422 naming the field (strict: a
    string is not an integer, ``"true"`` is not a boolean, ``1.5`` is not an integer;
    ``2000.0`` is, :data:`Whole`)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class RequestFigures(_Body):
    """What the next provider call will carry besides the history."""

    system_prompt: str = Field(default="", description="the agent's system prompt")
    tools: list[dict[str, Any]] | None = Field(default=None,
                                               description="tool definitions (counted)")
    max_tokens: Whole | None = Field(default=None, ge=1, description="output reserve")
    model: str = Field(default="gpt-4o", min_length=1, max_length=200)
    pending: list[Any] = Field(default_factory=list,
                               description="this turn's messages not yet recorded")
    format: Format = "openai"
    min_length: Whole | None = Field(
        default=None, ge=0,
        description="`length` of the last record of this session (RecordOut): the view holds "
                    "that turn even when another server process recorded it a moment ago")


class PrepareRequest(RequestFigures):
    pass


def _provider_error(value: Any) -> str | dict[str, Any]:
    """A string or an object, checked by hand: pydantic's union would name its member in
    the field of the 422 (``error.str``), not the field."""
    if isinstance(value, str | dict):
        return value
    raise ValueError("should be a string (the provider's error message) or an object "
                     "(its JSON body)")


ProviderError = Annotated[str | dict[str, Any], PlainValidator(
    _provider_error, json_schema_input_type=str | dict[str, Any])]
"""``RecoverRequest.error``: the provider's error text or its JSON body."""


class RecoverRequest(RequestFigures):
    error: ProviderError = Field(
        description="the provider's error: its message, or its JSON body")
    status: Whole | None = Field(default=None, ge=100, le=599,
                               description="the HTTP status of the failed call")
    prepared_tokens: Whole | None = Field(
        default=None, ge=1,
        description="report.estimated_prompt_tokens of the prepared view the provider refused: "
                    "when the error states no window, it bounds the real one, and an error "
                    "nothing recognises counts as an overflow when it was nearly the window "
                    "(where another server process made that prepare, this one plans the same "
                    "view for a recognised overflow; an unrecognised error needs this figure)")


class RecordRequest(_Body):
    messages: list[Any] = Field(min_length=1, description="the turn, in `format`")
    format: Format = "openai"
    usage: dict[str, Any] | None = Field(
        default=None, description="the provider's usage for the call that produced the turn")
    request_id: str | None = Field(default=None, min_length=1, max_length=128,
                                   description="idempotency key: a retried record is kept once")


class CompactRequest(_Body):
    keep_recent: Whole | None = Field(default=None, ge=0,
                                    description="tokens of recent history kept verbatim")
    force: bool = False


class RecallRequest(_Body):
    """A model's ``recall`` tool call, its arguments as the tool defines them."""

    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS,
                       description="exact words: file paths, identifiers, error codes, numbers")
    limit: Whole = Field(default=DEFAULT_LIMIT, ge=1, le=MAX_LIMIT,
                       description="passages to return, best first")
    start: Whole | None = Field(default=None, ge=0, description="first message index searched")
    end: Whole | None = Field(default=None, ge=0, description=(
        "search messages before this index (default: the watermark, i.e. what was "
        "summarized away)"))


class PreparedOut(BaseModel):
    format: Format
    messages: list[Any] = Field(description="the view in `format` (system first for openai)")
    system: Any = Field(default=None,
                        description="anthropic `system` / gemini `system_instruction`")
    report: ViewReport = Field(description="what the guard decided: tokens by region "
                                           "(`budget`), `estimated_prompt_tokens`, truncation")


class RecoverOut(BaseModel):
    recovered: bool = Field(description="false: not a context overflow, send the error on")
    view: PreparedOut | None = None


class RecordOut(BaseModel):
    session_id: str
    length: int = Field(description="messages in the session's log after the append")


class CompactOut(BaseModel):
    session_id: str
    task_id: str
    task: str


class RecallOut(BaseModel):
    session_id: str
    hits: list[RecallHit] = Field(description="one passage per message, best first")
    text: str = Field(description="the hits rendered as the recall tool's result: send it "
                                  "to the model as the tool message's content")


class SummaryOut(BaseModel):
    watermark: int
    kind: str
    tokens: int
    created_at: float | None = None
    text: str


class HistoryOut(BaseModel):
    session_id: str
    watermark: int
    summaries: list[SummaryOut]


class RegionsOut(BaseModel):
    system: int
    summary: int
    tools: int
    history: int


class StatsSummaryOut(BaseModel):
    watermark: int
    kind: str
    tokens: int
    created_at: float | None = None


class StatsOut(BaseModel):
    """The context meter (``ContextGuard.stats``)."""

    session_id: str
    tenant: str
    length: int = Field(description="messages in the session's log")
    watermark: int = Field(description="messages [0, watermark) are covered by the summary")
    version: int
    model: str = Field(description="the model of the last prepare (empty before one)")
    window: int
    limits_source: str = Field(description="learned, override, registry, provider_default "
                                           "or fallback")
    reserve: int = Field(description="output reserve (max_tokens, capped)")
    regions: RegionsOut
    estimated_prompt_tokens: int
    usage_ratio: float
    should_compact: bool
    within_budget: bool
    summary_kind: str
    cheap_decisions: int
    summaries: list[StatsSummaryOut]
    pending_job: bool
    calibration_ratio: float
    calibration_samples: int
    silent_truncation_flags: int
    requests_failed: int
    last_request_failure: str | None = None


class HealthOut(BaseModel):
    status: Literal["ok"]


class ErrorBody(BaseModel):
    code: str = Field(description="snake_case name of the error (invalid_input, ...)")
    message: str
    field: str | None = Field(default=None, description="the input at fault, when one is")


class ErrorOut(BaseModel):
    error: ErrorBody


class OverflowErrorBody(ErrorBody):
    """``irreducible_overflow``: the fixed part alone exceeds the window."""

    fixed_tokens: int = Field(description="system + tools + reserve + newest message")
    window: int


class OverflowErrorOut(BaseModel):
    error: OverflowErrorBody


__all__ = [
    "CompactOut",
    "CompactRequest",
    "ErrorBody",
    "ErrorOut",
    "Format",
    "HealthOut",
    "HistoryOut",
    "OverflowErrorBody",
    "OverflowErrorOut",
    "PrepareRequest",
    "PreparedOut",
    "RecallOut",
    "RecallRequest",
    "RecordOut",
    "RecordRequest",
    "RecoverOut",
    "RecoverRequest",
    "RegionsOut",
    "StatsOut",
    "StatsSummaryOut",
    "SummaryOut",
]
