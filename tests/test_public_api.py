"""The public surface: ``shared.__all__`` is complete, exact and documented."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import shared

REQUIRED = {
    "Message", "ToolCall", "from_openai", "to_openai", "from_anthropic", "to_anthropic",
    "from_gemini", "to_gemini", "estimate_tokens", "estimate_message_tokens",
    "estimate_messages_tokens", "estimate_tool_tokens", "model_limits", "turn_starts",
    "safe_cut", "find_cut_point", "repair_tool_pairs", "check_budget", "is_context_overflow",
    "parse_overflow", "emergency_truncate", "ContextGuard",
}
README = Path(__file__).resolve().parents[1] / "README.md"


def test_all_names_exist_and_are_unique() -> None:
    assert len(shared.__all__) == len(set(shared.__all__))
    for name in shared.__all__:
        assert hasattr(shared, name), name


def test_required_names_are_exported() -> None:
    assert set(shared.__all__) >= REQUIRED


def test_every_lazy_export_is_in_all_and_nothing_else_is() -> None:
    assert set(shared._EXPORTS) == set(shared.__all__)
    for name, module in shared._EXPORTS.items():
        assert getattr(importlib.import_module(module), name) is getattr(shared, name), name


def test_unknown_names_raise_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        shared.no_such_name  # noqa: B018


def test_required_names_are_documented_in_the_readme() -> None:
    text = README.read_text()
    api = text[text.index("## API"):]
    missing = [n for n in REQUIRED if not re.search(rf"`{n}\b", api)]
    assert not missing, f"README API section does not document {missing}"
