"""Shared core of the context-compaction service.

``shared.core`` is the pure core: messages and wire formats, tokens, limits,
turns, budget, overflow detection, repair, truncation, cheap stages, the fact
ledger and view building. It does no I/O and imports no I/O library.
``shared.store`` (Redis session store, Lua scripts, lease protocol),
``shared.guard`` (the agent's hot path) and ``shared.enqueue`` (publishing
jobs) are the I/O edge around it. ``workers`` imports this package; this
package never imports ``workers``.

The public API is ``__all__``. Names are loaded on first use (PEP 562), so
``import shared`` and the core load without redis, celery or any provider
SDK installed; touching an I/O name imports its module then.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    "RecallHit": "shared.core.recall",
    "recall_tool": "shared.core.recall",
    "answer_recall_call": "shared.store.recall_query",
    "AsyncContextGuard": "shared.guard",
    "AsyncSessionStore": "shared.store.aio",
    "BadSummary": "shared.core.errors",
    "BudgetReport": "shared.core.budget",
    "Calibration": "shared.core.tokens",
    "CallbackEnqueuer": "shared.enqueue",
    "CeleryEnqueuer": "shared.enqueue",
    "CommitResult": "shared.core.records",
    "CompactionError": "shared.core.errors",
    "CompactionPolicy": "shared.core.config",
    "ConfigError": "shared.core.errors",
    "ContextGuard": "shared.guard",
    "CutPoint": "shared.core.turns",
    "Enqueuer": "shared.enqueue",
    "ErrorKind": "shared.core.overflow",
    "FilePart": "shared.core.messages",
    "HeuristicCounter": "shared.core.tokens",
    "HistoryEdit": "shared.core.records",
    "ImagePart": "shared.core.messages",
    "InvalidInput": "shared.core.errors",
    "IrreducibleOverflow": "shared.core.errors",
    "Ledger": "shared.core.ledger",
    "LimitBook": "shared.core.limits",
    "LimitExceeded": "shared.core.errors",
    "Message": "shared.core.messages",
    "ModelLimits": "shared.core.limits",
    "NullEnqueuer": "shared.enqueue",
    "OverflowInfo": "shared.core.overflow",
    "PreparedView": "shared.guard",
    "RedisTaskPublisher": "shared.enqueue",
    "SessionDamaged": "shared.core.errors",
    "SessionNotFound": "shared.core.errors",
    "SessionState": "shared.core.records",
    "SessionStore": "shared.store.sessions",
    "StoreConfig": "shared.core.config",
    "StoreError": "shared.core.errors",
    "StoreUnavailable": "shared.core.errors",
    "SummarizerError": "shared.core.errors",
    "SummarizerUnavailable": "shared.core.errors",
    "SummaryRecord": "shared.core.records",
    "TASK_COMPACT": "shared.enqueue",
    "TASK_MAYBE_SUMMARIZE": "shared.enqueue",
    "TextPart": "shared.core.messages",
    "TiktokenCounter": "shared.core.tokens_exact",
    "TokenCounter": "shared.core.tokens",
    "ToolCall": "shared.core.messages",
    "TruncationResult": "shared.core.truncation",
    "ViewReport": "shared.guard",
    "build_counter": "shared.core.tokens_exact",
    "check_budget": "shared.core.budget",
    "classify_error": "shared.core.overflow",
    "connect": "shared.store.sessions",
    "connect_async": "shared.store.aio",
    "connect_cluster": "shared.store.sessions",
    "emergency_truncate": "shared.core.truncation",
    "ensure_reducible": "shared.core.budget",
    "estimate_message_tokens": "shared.core.tokens",
    "estimate_messages_tokens": "shared.core.tokens",
    "estimate_tokens": "shared.core.tokens",
    "estimate_tool_tokens": "shared.core.tokens",
    "extract_facts": "shared.core.facts",
    "find_cut_point": "shared.core.turns",
    "from_anthropic": "shared.core.wire",
    "from_gemini": "shared.core.wire",
    "from_openai": "shared.core.wire",
    "hybrid_estimate": "shared.core.tokens",
    "is_context_overflow": "shared.core.overflow",
    "is_tool_pairing_error": "shared.core.overflow",
    "model_limits": "shared.core.limits",
    "output_reserve": "shared.core.limits",
    "parse_overflow": "shared.core.overflow",
    "provider_for_model": "shared.core.tokens",
    "publisher_app": "shared.enqueue",
    "repair_tool_pairs": "shared.core.repair",
    "safe_cut": "shared.core.turns",
    "to_anthropic": "shared.core.wire",
    "to_gemini": "shared.core.wire",
    "to_openai": "shared.core.wire",
    "turn_starts": "shared.core.turns",
    "validate_messages": "shared.core.messages",
    "validate_view": "shared.core.repair",
}

__all__ = [
    "TASK_COMPACT",
    "TASK_MAYBE_SUMMARIZE",
    "AsyncContextGuard",
    "AsyncSessionStore",
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
    "RecallHit",
    "RedisTaskPublisher",
    "SessionDamaged",
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
    "answer_recall_call",
    "build_counter",
    "check_budget",
    "classify_error",
    "connect",
    "connect_async",
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
    "recall_tool",
    "repair_tool_pairs",
    "safe_cut",
    "to_anthropic",
    "to_gemini",
    "to_openai",
    "turn_starts",
    "validate_messages",
    "validate_view",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'shared' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:
    from shared.core.budget import BudgetReport, check_budget, ensure_reducible
    from shared.core.config import CompactionPolicy, StoreConfig
    from shared.core.errors import (
        BadSummary,
        CompactionError,
        ConfigError,
        InvalidInput,
        IrreducibleOverflow,
        LimitExceeded,
        SessionDamaged,
        SessionNotFound,
        StoreError,
        StoreUnavailable,
        SummarizerError,
        SummarizerUnavailable,
    )
    from shared.core.facts import extract_facts
    from shared.core.ledger import Ledger
    from shared.core.limits import LimitBook, ModelLimits, model_limits, output_reserve
    from shared.core.messages import (
        FilePart,
        ImagePart,
        Message,
        TextPart,
        ToolCall,
        validate_messages,
    )
    from shared.core.overflow import (
        ErrorKind,
        OverflowInfo,
        classify_error,
        is_context_overflow,
        is_tool_pairing_error,
        parse_overflow,
    )
    from shared.core.recall import RecallHit, recall_tool
    from shared.core.records import CommitResult, HistoryEdit, SessionState, SummaryRecord
    from shared.core.repair import repair_tool_pairs, validate_view
    from shared.core.tokens import (
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
    from shared.core.tokens_exact import TiktokenCounter, build_counter
    from shared.core.truncation import TruncationResult, emergency_truncate
    from shared.core.turns import CutPoint, find_cut_point, safe_cut, turn_starts
    from shared.core.wire import (
        from_anthropic,
        from_gemini,
        from_openai,
        to_anthropic,
        to_gemini,
        to_openai,
    )
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
    from shared.guard import AsyncContextGuard, ContextGuard, PreparedView, ViewReport
    from shared.store.aio import AsyncSessionStore, connect_async
    from shared.store.recall_query import answer_recall_call
    from shared.store.sessions import SessionStore, connect, connect_cluster
