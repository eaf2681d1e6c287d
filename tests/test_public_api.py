"""The public surface: ``shared.__all__`` is complete, exact and documented."""

from __future__ import annotations

import re
import types
from pathlib import Path

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


def test_everything_imported_into_the_package_is_exported() -> None:
    names = {n for n, v in vars(shared).items()
             if not n.startswith("_") and not isinstance(v, types.ModuleType)}
    assert names - {"annotations"} == set(shared.__all__)


def test_required_names_are_documented_in_the_readme() -> None:
    text = README.read_text()
    api = text[text.index("## API"):]
    missing = [n for n in REQUIRED if not re.search(rf"`{n}\b", api)]
    assert not missing, f"README API section does not document {missing}"
