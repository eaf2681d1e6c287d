"""Message validation: a bad message names its field; one in a provider's wire format names
the converter that reads it."""

from __future__ import annotations

from typing import Any

import pytest

from shared.core.errors import InvalidInput
from shared.core.messages import validate_messages
from shared.core.wire import from_anthropic, from_gemini, from_openai

OPENAI_CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}]}

WIRE: list[tuple[str, dict[str, Any], str]] = [
    ("openai nested call", OPENAI_CALL, "from_openai"),
    ("openai image_url", {"role": "user", "content": [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]},
     "from_openai"),
    ("openai developer", {"role": "developer", "content": "be brief"}, "from_openai"),
    ("openai refusal", {"role": "assistant", "content": None, "refusal": "no"}, "from_openai"),
    ("anthropic tool_use", {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "read", "input": {}}]}, "from_anthropic"),
    ("anthropic image", {"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "AAAA"}}]}, "from_anthropic"),
    ("gemini", {"role": "model", "parts": [{"text": "hi"}]}, "from_gemini"),
]
CONVERTERS = {"from_openai": from_openai, "from_anthropic": from_anthropic,
              "from_gemini": from_gemini}


@pytest.mark.parametrize(("name", "message", "converter"), WIRE, ids=[w[0] for w in WIRE])
def test_a_wire_format_message_names_its_converter(name: str, message: dict[str, Any],
                                                   converter: str) -> None:
    with pytest.raises(InvalidInput, match=rf"shared\.{converter}\(\)") as raised:
        validate_messages([{"role": "user", "content": "hi"}, message], prefix="pending")
    assert raised.value.field is not None and raised.value.field.startswith("pending[1]")
    converted = CONVERTERS[converter]([message])  # the hint is right: it reads
    assert validate_messages(converted)


def test_a_plain_mistake_gets_no_converter_hint() -> None:
    with pytest.raises(InvalidInput) as raised:
        validate_messages([{"role": "user", "content": 5}])
    assert raised.value.field == "messages[0].content.str"
    assert "wire format" not in str(raised.value)


@pytest.mark.parametrize("kind", [[], {}, ["text"]])
def test_a_content_part_whose_type_is_not_a_string_is_a_validation_error(kind: Any) -> None:
    """Found by the fuzz test: a list as a part's type made the wire-format check raise
    TypeError (unhashable) instead of the error that names the field."""
    with pytest.raises(InvalidInput) as raised:
        validate_messages([{"role": "user", "content": [{"type": kind}]}])
    assert raised.value.field is not None and raised.value.field.startswith("messages[0]")


def test_the_guard_names_the_converter_for_pending_messages(guard: Any) -> None:
    with pytest.raises(InvalidInput, match=r"shared\.from_openai\(\)") as raised:
        guard.prepare("s", "sys", max_tokens=500, model="small-model",
                      pending=[{"role": "user", "content": "go"}, OPENAI_CALL])
    assert raised.value.field == "pending[1].tool_calls.0.name"
