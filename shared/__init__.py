"""Shared core of the context-compaction service.

A pure core (messages, tokens, limits, turns, budget, overflow, repair,
truncation, ledger, cheap stages, view) beside thin I/O modules (the Redis
session store, the guard, the enqueue client). The agent process imports
this package; the workers import it too; it never imports ``workers``.

The public API is everything in ``__all__`` (documented in the README's
API section); submodules are implementation detail.
"""

from __future__ import annotations

from shared.adapters import (
    from_anthropic,
    from_gemini,
    from_openai,
    to_anthropic,
    to_gemini,
    to_openai,
)
from shared.budget import BudgetReport, check_budget, ensure_reducible
from shared.config import CompactionPolicy, StoreConfig
from shared.enqueue import (
    TASK_COMPACT,
    TASK_MAYBE_SUMMARIZE,
    CallbackEnqueuer,
    CeleryEnqueuer,
    Enqueuer,
    NullEnqueuer,
    RedisTaskPublisher,
    publisher_app,
)
from shared.errors import (
    BadSummary,
    CompactionError,
    ConfigError,
    InvalidInput,
    IrreducibleOverflow,
    LimitExceeded,
    SessionNotFound,
    StoreError,
    StoreUnavailable,
    SummarizerError,
    SummarizerUnavailable,
)
from shared.facts import extract_facts
from shared.guard import ContextGuard, PreparedView, ViewReport
from shared.ledger import Ledger
from shared.limits import LimitBook, ModelLimits, model_limits, output_reserve
from shared.messages import FilePart, ImagePart, Message, TextPart, ToolCall, validate_messages
from shared.overflow import (
    ErrorKind,
    OverflowInfo,
    classify_error,
    is_context_overflow,
    is_tool_pairing_error,
    parse_overflow,
)
from shared.records import CommitResult, HistoryEdit, SessionState, SummaryRecord
from shared.repair import repair_tool_pairs, validate_view
from shared.store import SessionStore, connect, connect_cluster
from shared.tokens import (
    Calibration,
    HeuristicCounter,
    TokenCounter,
    estimate_message_tokens,
    estimate_messages_tokens,
    estimate_tokens,
    estimate_tool_tokens,
    hybrid_estimate,
    provider_for_model,
)
from shared.tokens_exact import TiktokenCounter, build_counter
from shared.truncation import TruncationResult, emergency_truncate
from shared.turns import CutPoint, find_cut_point, safe_cut, turn_starts

__all__ = [
    "TASK_COMPACT",
    "TASK_MAYBE_SUMMARIZE",
    "BadSummary",
    "BudgetReport",
    "Calibration",
    "CallbackEnqueuer",
    "CeleryEnqueuer",
    "CommitResult",
    "CompactionError",
    "CompactionPolicy",
    "ConfigError",
    "ContextGuard",
    "CutPoint",
    "Enqueuer",
    "ErrorKind",
    "FilePart",
    "HeuristicCounter",
    "HistoryEdit",
    "ImagePart",
    "InvalidInput",
    "IrreducibleOverflow",
    "Ledger",
    "LimitBook",
    "LimitExceeded",
    "Message",
    "ModelLimits",
    "NullEnqueuer",
    "OverflowInfo",
    "PreparedView",
    "RedisTaskPublisher",
    "SessionNotFound",
    "SessionState",
    "SessionStore",
    "StoreConfig",
    "StoreError",
    "StoreUnavailable",
    "SummarizerError",
    "SummarizerUnavailable",
    "SummaryRecord",
    "TextPart",
    "TiktokenCounter",
    "TokenCounter",
    "ToolCall",
    "TruncationResult",
    "ViewReport",
    "build_counter",
    "check_budget",
    "classify_error",
    "connect",
    "connect_cluster",
    "emergency_truncate",
    "ensure_reducible",
    "estimate_message_tokens",
    "estimate_messages_tokens",
    "estimate_tokens",
    "estimate_tool_tokens",
    "extract_facts",
    "find_cut_point",
    "from_anthropic",
    "from_gemini",
    "from_openai",
    "hybrid_estimate",
    "is_context_overflow",
    "is_tool_pairing_error",
    "model_limits",
    "output_reserve",
    "parse_overflow",
    "provider_for_model",
    "publisher_app",
    "repair_tool_pairs",
    "safe_cut",
    "to_anthropic",
    "to_gemini",
    "to_openai",
    "turn_starts",
    "validate_messages",
    "validate_view",
]
