"""Wire-format adapters: examples, bad input, round-trip properties, real sessions."""

from __future__ import annotations

import base64
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.core.errors import InvalidInput
from shared.core.messages import FilePart, ImagePart, Message, TextPart, ToolCall
from shared.core.wire import (
    from_anthropic,
    from_gemini,
    from_openai,
    to_anthropic,
    to_gemini,
    to_openai,
)
from shared.core.wire.anthropic import BLANK_RESULT_TEXT

TRANSCRIPTS = Path(__file__).resolve().parents[2] / "shared" / "data" / "transcripts.dev.jsonl"
PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def anthropic_round(messages: list[Message]) -> list[Message]:
    system, wire = to_anthropic(messages)
    return from_anthropic(wire, system)


def gemini_round(messages: list[Message]) -> list[Message]:
    system, contents = to_gemini(messages)
    return from_gemini(contents, system)


def openai_round(messages: list[Message]) -> list[Message]:
    return from_openai(to_openai(messages))


# == OpenAI =================================================================


def test_openai_flat_tool_calls_come_out_nested_and_null_content_is_restored() -> None:
    wire: list[dict[str, Any]] = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": "hi", "name": "ann"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "think",
            "tool_calls": [{"id": "c1", "name": "f", "arguments": '{"a":1}'}],
            "usage": {"prompt_tokens": 10},
        },
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    msgs = from_openai(wire)
    assert [m.role for m in msgs] == ["system", "user", "assistant", "tool"]
    assert msgs[0].metadata == {"openai_role": "developer"}
    assert msgs[2].content == "" and msgs[2].reasoning == "think"
    assert msgs[2].tool_calls == [ToolCall(id="c1", name="f", arguments='{"a":1}')]
    assert msgs[2].metadata == {"usage": {"prompt_tokens": 10}}
    out = to_openai(msgs)
    assert out[0]["role"] == "developer"
    assert out[2] == {
        "role": "assistant",
        "content": None,
        "reasoning_content": "think",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}
        ],
    }
    assert "reasoning_content" not in to_openai(msgs, include_reasoning=False)[2]


def test_openai_data_urls_become_inline_data_and_back() -> None:
    url = "data:image/png;base64," + b64(b"\x89PNG")
    wire = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": url, "detail": "low"}},
                {"type": "image_url", "image_url": {"url": "https://x.test/a.jpg"}},
                {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBE"}},
                {"type": "file", "file": {"file_id": "file-1", "filename": "a.pdf"}},
            ],
        }
    ]
    (msg,) = from_openai(wire)
    assert isinstance(msg.content, list)
    assert msg.content[1] == ImagePart(data=b64(b"\x89PNG"), media_type="image/png", detail="low")
    assert msg.content[3] == FilePart(data="JVBE", media_type="application/pdf")
    assert to_openai([msg]) == wire


def test_openai_output_is_accepted_by_the_sdk_types() -> None:
    from openai.types.chat import ChatCompletionMessageParam
    from pydantic import TypeAdapter

    msgs = [
        Message(role="user", content=[TextPart(text="a"), ImagePart(url="https://x.test/i.png")]),
        Message(role="assistant", tool_calls=[ToolCall(id="c", name="f", arguments="{}")]),
        Message(role="tool", tool_call_id="c", content="r"),
    ]
    adapter: TypeAdapter[Any] = TypeAdapter(ChatCompletionMessageParam)
    for item in to_openai(msgs, include_reasoning=False):
        adapter.validate_python(item, strict=True)


@pytest.mark.parametrize(
    ("wire", "where"),
    [
        ([{"role": "robot", "content": "x"}], "messages[0].role: unknown role"),
        ([{"role": "tool", "content": "x"}], "messages[0].tool_call_id: required"),
        ([{"role": "tool", "content": "x", "tool_call_id": ""}], "messages[0].tool_call_id: must"),
        ([{"role": "user", "content": 3}], "messages[0].content: expected"),
        ([{"role": "user", "content": "x", "colour": 1}], "messages[0].colour: unknown field"),
        (
            [{"role": "user", "content": [{"type": "video"}]}],
            "messages[0].content[0].type: unknown",
        ),
        (
            [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}],
            "messages[0].content[0].type: audio input is not supported",
        ),
        (
            [
                {"role": "user", "content": "x"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{"}}
                    ],
                },
            ],
            "messages[1].tool_calls[0].function.arguments: not valid JSON",
        ),
        (
            [{"role": "assistant", "tool_calls": [{"id": "c", "name": "f", "arguments": {}}]}],
            "messages[0].tool_calls[0].arguments: expected a JSON string",
        ),
        (
            [{"role": "user", "content": "x", "tool_calls": [{"id": "c", "name": "f"}]}],
            "messages[0].tool_calls: only assistant",
        ),
        ([{"role": "function", "name": "f", "content": "x"}], "messages[0].role: the deprecated"),
        (["hello"], "messages[0]: expected an object"),
        ({"role": "user"}, "messages: expected a list"),
    ],
)
def test_openai_bad_input_names_the_field(wire: Any, where: str) -> None:
    with pytest.raises(InvalidInput) as info:
        from_openai(wire)
    assert str(info.value).startswith(where)


def test_openai_invalid_input_carries_field_and_index() -> None:
    with pytest.raises(InvalidInput) as info:
        from_openai([{"role": "user", "content": "x"}, {"role": "tool", "content": "x"}])
    assert info.value.field == "messages[1].tool_call_id" and info.value.index == 1


# == Anthropic ==============================================================


def _tool_use(cid: str, name: str = "f", args: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "tool_use", "id": cid, "name": name, "input": args or {}}


def _result(cid: str, content: Any = "ok", **extra: Any) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": cid, "content": content, **extra}


def test_anthropic_tool_results_split_into_tool_messages_and_merge_back() -> None:
    wire: list[dict[str, Any]] = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "plan\n\nmore", "signature": "sig1"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "calling"},
                _tool_use("t1", "read", {"path": "ä.txt"}),
                _tool_use("t2", "list"),
            ],
        },
        {
            "role": "user",
            "content": [
                _result("t1", "body"),
                _result("t2", [{"type": "text", "text": "no"}], is_error=True),
                {"type": "text", "text": "and then?"},
            ],
        },
    ]
    msgs = from_anthropic(wire, "sys")
    assert [m.role for m in msgs] == ["system", "user", "assistant", "tool", "tool", "user"]
    assistant = msgs[2]
    assert assistant.reasoning == "plan\n\nmore"
    assert assistant.tool_calls[0].arguments == '{"path": "ä.txt"}'
    assert msgs[4].metadata == {"is_error": True} and msgs[4].tool_call_id == "t2"
    assert to_anthropic(msgs) == ("sys", wire)


def test_anthropic_merges_same_role_runs_and_puts_results_first() -> None:
    msgs = [
        Message(role="system", content="a"),
        Message(role="system", content="b"),
        Message(role="user", content="one"),
        Message(role="user", content="two"),
        Message(
            role="assistant", tool_calls=[ToolCall(id="c1", name="f"), ToolCall(id="c2", name="g")]
        ),
        Message(role="tool", tool_call_id="c1", content="r1"),
        Message(role="user", content="interjection"),
        Message(role="tool", tool_call_id="c2", content="r2"),
        Message(role="system", content="late note"),
    ]
    system, wire = to_anthropic(msgs)
    assert system == [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert [w["role"] for w in wire] == ["user", "assistant", "user"]
    assert wire[0]["content"] == [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    assert wire[2]["content"] == [
        _result("c1", "r1"),
        _result("c2", "r2"),
        {"type": "text", "text": "interjection"},
        {"type": "text", "text": "late note"},
    ]


def test_anthropic_drops_reasoning_it_cannot_sign() -> None:
    msgs = from_openai([{"role": "assistant", "content": "x", "reasoning_content": "deepseek"}])
    assert to_anthropic(msgs) == (None, [{"role": "assistant", "content": "x"}])
    signed = from_anthropic(
        [
            {
                "role": "assistant",
                "content": [{"type": "thinking", "thinking": "t", "signature": "s"}],
            }
        ]
    )
    edited = signed[0].model_copy(update={"reasoning": "changed length", "content": "x"})
    assert to_anthropic([edited]) == (None, [{"role": "assistant", "content": "x"}])


def test_anthropic_documents_and_images_map_to_parts() -> None:
    blocks = [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
        {"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}},
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "hé"}},
        {"type": "document", "source": {"type": "file", "file_id": "file_1"}, "title": "a"},
        {"type": "text", "text": "hint", "cache_control": {"type": "ephemeral"}},
    ]
    (msg,) = from_anthropic([{"role": "user", "content": blocks}])
    assert isinstance(msg.content, list)
    assert msg.content[2] == FilePart(data=b64("hé".encode()), media_type="text/plain")
    assert msg.content[3] == FilePart(file_id="file_1", filename="a")
    blocks[-1] = {"type": "text", "text": "hint"}  # cache_control is a request hint: dropped
    assert to_anthropic([msg]) == (None, [{"role": "user", "content": blocks}])


@pytest.mark.parametrize(
    ("wire", "where"),
    [
        ([{"role": "system", "content": "x"}], "messages[0].role: unknown role"),
        (
            [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}],
            "messages[0].content[0].tool_use_id: required",
        ),
        (
            [{"role": "assistant", "content": [{"type": "server_tool_use", "id": "s"}]}],
            "messages[0].content[0].type: unknown block type 'server_tool_use'",
        ),
        (
            [
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "a", "name": "f", "input": "{}"}],
                }
            ],
            "messages[0].content[0].input: expected an object",
        ),
        (
            [{"role": "user", "content": [_result("a", is_error="yes")]}],
            "messages[0].content[0].is_error: expected a boolean",
        ),
        ([{"role": "user", "content": None}], "messages[0].content: expected a list"),
        (
            [
                {
                    "role": "user",
                    "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}],
                }
            ],
            "messages[0].content[0].source.type: unsupported image source",
        ),
    ],
)
def test_anthropic_bad_input_names_the_field(wire: Any, where: str) -> None:
    with pytest.raises(InvalidInput) as info:
        from_anthropic(wire)
    assert str(info.value).startswith(where)


def test_anthropic_bad_system_names_the_field() -> None:
    with pytest.raises(InvalidInput, match=r"^system\[1\].type: unknown block type"):
        from_anthropic([], [{"type": "text", "text": "a"}, {"type": "image"}])


@pytest.mark.parametrize(
    ("msgs", "where"),
    [
        (
            [
                Message(role="user", content="x"),
                Message(role="tool", tool_call_id="zz", content="r"),
            ],
            "messages[1].tool_call_id: no tool_use 'zz'",
        ),
        (
            [
                Message(role="user", content="x"),
                Message(role="assistant", tool_calls=[ToolCall(id="a", name="f")]),
                Message(role="user", content="never answered"),
            ],
            "messages[1].tool_calls[0].id: tool_use 'a' has no tool_result",
        ),
        (
            [Message(role="system", content=[ImagePart(url="https://x.test/a.png")])],
            "messages[0].content[0]: the system prompt takes text only",
        ),
    ],
)
def test_anthropic_refuses_structure_it_cannot_send(msgs: list[Message], where: str) -> None:
    with pytest.raises(InvalidInput) as info:
        to_anthropic(msgs)
    assert str(info.value).startswith(where)


# == Gemini =================================================================


def test_gemini_synthesizes_ids_matches_by_name_and_does_not_send_them() -> None:
    contents: list[dict[str, Any]] = [
        {"role": "user", "parts": [{"text": "go"}]},
        {
            "role": "model",
            "parts": [
                {"function_call": {"name": "read", "args": {"p": 1}}},
                {"function_call": {"name": "ls", "args": {}}},
                {"function_call": {"name": "read", "args": {"p": 2}}},
            ],
        },
        {
            "role": "user",
            "parts": [
                {"function_response": {"name": "ls", "response": {"output": "a b"}}},
                {"function_response": {"name": "read", "response": {"output": "one"}}},
                {"function_response": {"name": "read", "response": {"error": "gone"}}},
            ],
        },
    ]
    msgs = from_gemini(contents)
    ids = [c.id for c in msgs[1].tool_calls]
    assert ids == ["gemini-1-0", "gemini-1-1", "gemini-1-2"]
    assert [m.tool_call_id for m in msgs[2:]] == ["gemini-1-1", "gemini-1-0", "gemini-1-2"]
    assert msgs[4].content == "gone" and msgs[4].metadata["is_error"] is True
    assert from_gemini(contents) == msgs  # deterministic
    assert to_gemini(msgs) == (None, contents)


def test_gemini_accepts_camel_case_and_bytes_and_emits_snake_case() -> None:
    system = {"parts": [{"text": "rules"}]}
    contents: list[dict[str, Any]] = [
        {"role": "user", "parts": [{"inlineData": {"mimeType": "image/png", "data": b"\x00\x01"}}]},
        {
            "role": "model",
            "parts": [
                {"text": "hmm", "thought": True, "thoughtSignature": b"\x07"},
                {"functionCall": {"id": "c1", "name": "f", "args": {"camelKey": 1}}},
            ],
        },
        {
            "role": "user",
            "parts": [{"functionResponse": {"id": "c1", "name": "f", "response": {"x": [1]}}}],
        },
    ]
    msgs = from_gemini(contents, system)
    assert msgs[1].content == [ImagePart(data=b64(b"\x00\x01"), media_type="image/png")]
    assert msgs[2].reasoning == "hmm" and msgs[2].tool_calls[0].args() == {"camelKey": 1}
    assert msgs[3].content == '{"x": [1]}' and msgs[3].name == "f"
    system_out, out = to_gemini(msgs)
    assert system_out == system
    assert out[0]["parts"] == [{"inline_data": {"mime_type": "image/png", "data": "AAE="}}]
    assert out[1]["parts"][0] == {"text": "hmm", "thought": True, "thought_signature": "Bw=="}
    assert out[2]["parts"][0]["function_response"]["response"] == {"x": [1]}


def test_gemini_looks_up_names_merges_tool_results_and_validates_with_sdk() -> None:
    from google.genai import types

    msgs = from_openai(
        [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "a", "name": "f", "arguments": "{}"},
                    {"id": "b", "name": "g", "arguments": '{"k": "v"}'},
                ],
            },
            {"role": "tool", "tool_call_id": "a", "content": "1"},
            {"role": "tool", "tool_call_id": "b", "content": "2"},
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": "https://x/a.png"}}],
            },
        ]
    )
    system, contents = to_gemini(msgs)
    assert [c["role"] for c in contents] == ["user", "model", "user", "user"]
    responses = [p["function_response"] for p in contents[2]["parts"]]
    assert [(r["id"], r["name"], r["response"]) for r in responses] == [
        ("a", "f", {"output": "1"}),
        ("b", "g", {"output": "2"}),
    ]
    assert contents[3]["parts"] == [
        {"file_data": {"mime_type": "image/png", "file_uri": "https://x/a.png"}}
    ]
    types.Content.model_validate(system)
    for content in contents:
        types.Content.model_validate(content)


@pytest.mark.parametrize(
    ("contents", "where"),
    [
        ([{"role": "assistant", "parts": [{"text": "x"}]}], "contents[0].role: unknown role"),
        (
            [{"role": "user", "parts": [{"text": "x", "inline_data": {}}]}],
            "contents[0].parts[0]: a part",
        ),
        (
            [{"role": "user", "parts": [{"text": "x", "videoMetadata": {}}]}],
            "contents[0].parts[0].video_metadata: unknown field",
        ),
        (
            [{"role": "model", "parts": [{"function_call": {"name": "f", "args": [1]}}]}],
            "contents[0].parts[0].function_call.args: expected an object",
        ),
        (
            [{"role": "model", "parts": [{"function_response": {"name": "f", "response": {}}}]}],
            "contents[0].parts[0]: function responses belong in a user content",
        ),
        (
            [{"role": "user", "parts": [{"function_response": {"response": {}}}]}],
            "contents[0].parts[0].function_response.name: required",
        ),
        (
            [{"role": "user", "parts": [{"inline_data": {"mime_type": "a/b", "mimeType": "a/b"}}]}],
            "contents[0].parts[0].inline_data.mimeType: given twice",
        ),
        ([{"role": "user", "parts": "text"}], "contents[0].parts: expected a list"),
    ],
)
def test_gemini_bad_input_names_the_field(contents: Any, where: str) -> None:
    with pytest.raises(InvalidInput) as info:
        from_gemini(contents)
    assert str(info.value).startswith(where)


def test_gemini_refuses_what_it_cannot_send() -> None:
    with pytest.raises(InvalidInput, match=r"^messages\[0\].name: no function name"):
        to_gemini([Message(role="tool", tool_call_id="x", content="r")])
    with pytest.raises(InvalidInput, match=r"^messages\[0\].content\[0\].file_id"):
        to_gemini([Message(role="user", content=[FilePart(file_id="file-1")])])


# == bad input the neutral model itself refuses, reported at the wire item ===


@pytest.mark.parametrize(
    ("convert", "where"),
    [
        (
            lambda: from_openai(
                [{"role": "assistant", "tool_calls": [{"id": "x" * 300, "name": "f"}]}]
            ),
            "messages[0].tool_calls[0].id: String should have at most 256",
        ),
        (
            lambda: from_openai(
                [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "data:;base64,"}}],
                    }
                ]
            ),
            "messages[0].content[0]: an image part needs url or data",
        ),
        (
            lambda: from_openai([{"role": "user", "content": "x", "tool_call_id": "a"}]),
            "messages[0].tool_call_id: only tool messages",
        ),
        (
            lambda: from_openai(
                [{"role": "assistant", "tool_calls": [{"id": "a", "type": "custom", "custom": {}}]}]
            ),
            "messages[0].tool_calls[0].type: only function tool calls",
        ),
        (
            lambda: from_openai(
                [{"role": "user", "content": [{"type": "file", "file": {"filename": "a"}}]}]
            ),
            "messages[0].content[0].file: a file needs file_id or file_data",
        ),
        (
            lambda: from_anthropic(
                [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image", "title": "t", "source": {"type": "url", "url": "u"}}
                        ],
                    }
                ]
            ),
            "messages[0].content[0].title: only documents",
        ),
        (
            lambda: from_gemini([{"role": "user", "parts": [{"function_call": {"name": "f"}}]}]),
            "contents[0].parts[0]: function calls belong in a model content",
        ),
        (
            lambda: from_gemini(
                [
                    {
                        "role": "user",
                        "parts": [
                            {
                                "function_response": {
                                    "name": "f",
                                    "response": {},
                                    "parts": [{"text": "x"}],
                                }
                            }
                        ],
                    }
                ]
            ),
            "contents[0].parts[0].function_response.parts[0]: a part holds exactly one of",
        ),
        (
            lambda: from_gemini(
                [{"role": "model", "parts": [{"text": "x", "thought_signature": 5}]}]
            ),
            "contents[0].parts[0].thought_signature: expected base64 text or bytes",
        ),
        (
            lambda: to_anthropic([Message(role="user", content=[FilePart(data="AA")])]),
            "messages[0].content[0].media_type: inline data needs a media type",
        ),
        (
            lambda: to_gemini([Message(role="user", content=[ImagePart(data="AA")])]),
            "messages[0].content[0].media_type: inline data needs a media type",
        ),
        (
            lambda: to_gemini([Message(role="system", content=[ImagePart(url="https://x/a.png")])]),
            "messages[0].content[0]: the system instruction takes text only",
        ),
        (
            lambda: to_openai([{"role": "tool", "content": "x"}]),  # type: ignore[list-item]
            "messages[0].tool_call_id: a tool result",
        ),
    ],
)
def test_bad_input_is_reported_at_its_wire_path(convert: Any, where: str) -> None:
    with pytest.raises(InvalidInput) as info:
        convert()
    assert str(info.value).startswith(where)


def test_what_openai_cannot_carry_is_named_in_text_not_refused() -> None:
    """An image a tool returned (Anthropic, Gemini and the Agents SDK carry them), a file
    known by URL alone, inline data of no stated type: OpenAI's chat format has no place
    for them. The log holds such messages and every later view must too, so the OpenAI
    form says what it leaves out instead of refusing (which left the session unusable)."""
    shot = ImagePart(data="iVBORw0KGgo=", media_type="image/png")
    out = to_openai([
        Message(role="user", content=[FilePart(url="https://x/a.pdf"), ImagePart(data="/9j/4AA")]),
        Message(role="assistant", content="", tool_calls=[ToolCall(id="c1", name="shot")]),
        Message(role="tool", tool_call_id="c1", content=[TextPart(text="screen:"), shot]),
        Message(role="user", content=[ImagePart(data="AAAA")]),
    ])
    assert out[0]["content"] == [
        {"type": "text", "text": "[file at https://x/a.pdf not sent: OpenAI takes a file's "
                                 "data or file_id, not a URL]"},
        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/4AA"}}]
    assert out[2]["content"] == [
        {"type": "text", "text": "screen:"},
        {"type": "text", "text": "[image/png image not sent: OpenAI's chat format takes "
                                 "images and files in user messages only]"}]
    assert out[3]["content"] == [
        {"type": "text", "text": "[image not sent: its media type is not known]"}]



def test_gemini_odd_corners_round_trip() -> None:
    contents = [
        {
            "role": "user",
            "parts": [
                {"function_response": {"name": "f", "response": {}}, "thought_signature": "AQ=="}
            ],
        },
    ]
    msgs = from_gemini(contents, "plain system text")
    assert msgs[0] == Message(role="system", content="plain system text")
    assert msgs[1].tool_call_id == "gemini-0-0" and msgs[1].content == "{}"
    assert to_gemini(msgs) == ({"parts": [{"text": "plain system text"}]}, contents)
    edited = msgs[1].model_copy(update={"content": "no longer JSON"})
    _, out = to_gemini([edited])
    assert out[0]["parts"][0]["function_response"]["response"] == {"output": "no longer JSON"}


def test_sdk_objects_are_accepted_like_dicts() -> None:
    from google.genai import types
    from openai.types.chat import ChatCompletionMessage

    reply = ChatCompletionMessage.model_validate(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c9", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        }
    )
    (msg,) = from_openai([reply])
    assert msg.tool_calls == [ToolCall(id="c9", name="f", arguments="{}")]
    content = types.Content(
        role="model",
        parts=[types.Part(text="t", thought=True, thought_signature=b"\x01\x02")],
    )
    (model,) = from_gemini([content])
    assert model.reasoning == "t"
    assert model.metadata["gemini_signatures"] == {"thought:0": b64(b"\x01\x02")}


def test_sdk_dumps_with_their_unset_fields_are_accepted() -> None:
    """What agents append to their history: the SDK's reply dumped to a dict. The OpenAI
    SDK dumps every field, unset ones as None (``function_call`` among them), and
    google-genai every field of a part (``media_resolution``, ``video_metadata``...):
    both were refused, the OpenAI one as "the deprecated function-call format" named at
    ``role``. A None is no data; a field that holds some is still refused by name."""
    from google.genai import types
    from openai.types.chat import ChatCompletionMessage

    reply = ChatCompletionMessage.model_validate({
        "role": "assistant", "content": None, "refusal": None,
        "tool_calls": [{"id": "c9", "type": "function",
                        "function": {"name": "f", "arguments": "{}"}}]})
    result = {"role": "tool", "tool_call_id": "c9", "content": "done"}
    expected = from_openai([reply.model_dump(exclude_none=True), result])
    for dumped in (reply.model_dump(), reply.model_dump(mode="json")):
        assert "function_call" in dumped
        assert from_openai([dumped, result]) == expected
    with pytest.raises(InvalidInput) as info:
        from_openai([{"role": "assistant", "content": None,
                      "function_call": {"name": "f", "arguments": "{}"}}])
    assert str(info.value).startswith("messages[0].function_call: the deprecated")
    with pytest.raises(InvalidInput, match=r"messages\[0\].colour: unknown field"):
        from_openai([{"role": "user", "content": "x", "shade": None, "colour": "red"}])

    contents = [
        types.Content(role="user", parts=[
            types.Part(text="look"),
            types.Part(inline_data=types.Blob(mime_type="image/png", data=b"\x89PNG"))]),
        types.Content(role="model", parts=[
            types.Part(text="calling"),
            types.Part(function_call=types.FunctionCall(id="g1", name="f", args={"a": 1}))]),
        types.Content(role="user", parts=[types.Part(function_response=types.FunctionResponse(
            id="g1", name="f", response={"ok": True}))]),
    ]
    expected = from_gemini(contents)
    for mode in ("python", "json"):
        dumped = [c.model_dump(mode=mode) for c in contents]
        assert any(v is None for v in dumped[0]["parts"][0].values())
        assert from_gemini(dumped) == expected


def test_anthropic_text_documents_of_any_text_type_go_back_as_text() -> None:
    block = {
        "type": "document",
        "source": {"type": "text", "media_type": "text/csv", "data": "a,b"},
    }
    msgs = from_anthropic([{"role": "user", "content": [block]}])
    assert to_anthropic(msgs)[1][0]["content"] == [block]


# == property tests: canonical wire input survives from_F then to_F ===========

texts = st.text(max_size=12)
nonempty = st.text(min_size=1, max_size=12)
nonblank = nonempty.filter(str.strip)  # Anthropic refuses whitespace-only text
sendable = st.just("") | nonblank  # what goes to Anthropic as it is (blank text does not)
names = st.from_regex(r"[a-z_]{1,8}", fullmatch=True)
b64s = st.binary(min_size=1, max_size=9).map(b64)
finite = st.floats(allow_nan=False, allow_infinity=False)  # what JSON arguments can hold
scalars = st.none() | st.booleans() | st.integers() | finite | texts
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
json_objects = st.dictionaries(texts, json_values, max_size=4)


class Ids:
    """Unique tool-call ids within one generated conversation."""

    def __init__(self) -> None:
        self.n = 0

    def new(self, draw: st.DrawFn) -> str:
        self.n += 1
        return f"call_{self.n}_{draw(st.from_regex(r'[A-Za-z0-9]{0,6}', fullmatch=True))}"


def maybe(draw: st.DrawFn, key: str, value: st.SearchStrategy[Any]) -> dict[str, Any]:
    return {key: draw(value)} if draw(st.booleans()) else {}


@st.composite
def openai_conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    ids, out = Ids(), []
    text_parts = st.lists(st.builds(lambda t: {"type": "text", "text": t}, texts), max_size=3)
    image = st.builds(
        lambda url, detail: {"type": "image_url", "image_url": {"url": url, **detail}},
        st.sampled_from(["https://x.test/a.png", "data:image/png;base64,AAAA", "data:;base64,AA"]),
        st.sampled_from([{}, {"detail": "low"}, {"detail": "auto"}]),
    )
    file = (
        st.fixed_dictionaries(
            {},
            optional={
                "file_id": names,
                "file_data": st.sampled_from(["data:application/pdf;base64,JVBE", "QUJD"]),
                "filename": texts,
            },
        )
        .filter(lambda f: "file_id" in f or "file_data" in f)
        .map(lambda f: {"type": "file", "file": f})
    )
    user_parts = st.lists(
        st.one_of(
            text_parts.map(lambda p: p[0] if p else {"type": "text", "text": ""}), image, file
        ),
        max_size=4,
    )
    for _ in range(draw(st.integers(0, 7))):
        role = draw(st.sampled_from(["system", "developer", "user", "assistant", "tool"]))
        msg: dict[str, Any] = {"role": role}
        if role in ("system", "developer"):
            msg["content"] = draw(texts | text_parts)
        elif role == "user":
            msg["content"] = draw(texts | user_parts)
        elif role == "tool":
            msg.update(tool_call_id=ids.new(draw), content=draw(texts | text_parts))
        else:
            calls = [
                {
                    "id": ids.new(draw),
                    "type": "function",
                    "function": {
                        "name": draw(names),
                        "arguments": json.dumps(
                            draw(json_objects),
                            separators=draw(st.sampled_from([(",", ":"), (", ", ": ")])),
                        ),
                    },
                }
                for _ in range(draw(st.integers(0, 2)))
            ]
            msg["content"] = draw(
                (st.none() | nonempty | text_parts) if calls else (texts | text_parts)
            )
            if calls:
                msg["tool_calls"] = calls
            msg.update(maybe(draw, "reasoning_content", texts))
            msg.update(maybe(draw, "refusal", texts))
        if role != "tool":
            msg.update(maybe(draw, "name", names))
        out.append(msg)
    return out


@PROPS
@given(openai_conversations())
def test_openai_wire_round_trip(wire: list[dict[str, Any]]) -> None:
    assert to_openai(from_openai(wire)) == wire


anthropic_media = st.one_of(
    st.builds(
        lambda d: {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": d},
        },
        b64s,
    ),
    st.just({"type": "image", "source": {"type": "url", "url": "https://x.test/i.jpg"}}),
    st.builds(
        lambda d: {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": d},
        },
        b64s,
    ),
    st.builds(
        lambda t: {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": t},
        },
        nonblank,
    ),
    st.builds(
        lambda t: {"type": "document", "source": {"type": "file", "file_id": "file_9"}, "title": t},
        texts,
    ),
)
anthropic_text = st.builds(lambda t: {"type": "text", "text": t}, nonblank)


@st.composite
def anthropic_conversations(draw: st.DrawFn) -> tuple[Any, list[dict[str, Any]]]:
    ids, out = Ids(), []
    system = draw(st.none() | sendable | st.lists(anthropic_text, max_size=2))
    pending: list[str] = []
    for k in range(draw(st.integers(0, 6))):
        if k % 2 == 0:  # user
            results = []
            for cid in pending:  # blank results, and empty error ones, are not sent as they are
                error = draw(st.booleans())
                blocks = st.lists(anthropic_text | anthropic_media, min_size=int(error),
                                  max_size=2)
                results.append({"type": "tool_result", "tool_use_id": cid,
                                "content": draw((nonblank if error else sendable) | blocks),
                                **({"is_error": True} if error else {})})
            extra = draw(
                st.lists(anthropic_text | anthropic_media, min_size=0 if results else 1, max_size=3)
            )
            content: Any = results + extra
            if not results and draw(st.booleans()):
                content = draw(nonblank)
            out.append({"role": "user", "content": content})
            pending = []
        else:
            thinking = draw(
                st.lists(
                    st.one_of(
                        st.builds(
                            lambda t, s: {"type": "thinking", "thinking": t, **s},
                            texts,
                            st.sampled_from([{}, {"signature": "c2ln"}]),
                        ),
                        st.builds(lambda d: {"type": "redacted_thinking", "data": d}, b64s),
                    ),
                    max_size=2,
                )
            )
            pending = [ids.new(draw) for _ in range(draw(st.integers(0, 2)))]
            uses = [
                {"type": "tool_use", "id": cid, "name": draw(names), "input": draw(json_objects)}
                for cid in pending
            ]
            blocks = thinking + draw(st.lists(anthropic_text, max_size=2)) + uses
            out.append({"role": "assistant", "content": blocks or draw(nonblank)})
    return system, out


@PROPS
@given(anthropic_conversations())
def test_anthropic_wire_round_trip(case: tuple[Any, list[dict[str, Any]]]) -> None:
    system, wire = case
    assert to_anthropic(from_anthropic(wire, system)) == (system, wire)


gemini_media = st.one_of(
    st.builds(lambda d: {"inline_data": {"mime_type": "image/png", "data": d}}, b64s),
    st.builds(
        lambda d, n: {"inline_data": {"mime_type": "application/pdf", "data": d, **n}},
        b64s,
        st.sampled_from([{}, {"display_name": "a.pdf"}]),
    ),
    st.just({"file_data": {"mime_type": "video/mp4", "file_uri": "gs://b/v.mp4"}}),
    st.just(
        {
            "file_data": {
                "mime_type": "image/jpeg",
                "file_uri": "https://x.test/i.jpg",
                "display_name": "i",
            }
        }
    ),
)
gemini_text = st.builds(lambda t: {"text": t}, nonempty)


def signed(draw: st.DrawFn, part: dict[str, Any]) -> dict[str, Any]:
    return {**part, "thought_signature": draw(b64s)} if draw(st.booleans()) else part


@st.composite
def gemini_conversations(draw: st.DrawFn) -> tuple[Any, list[dict[str, Any]]]:
    ids, out = Ids(), []
    system = draw(
        st.none() | st.lists(gemini_text, min_size=1, max_size=2).map(lambda p: {"parts": p})
    )
    for _ in range(draw(st.integers(0, 5))):
        # canonical contents alternate (a user content after function responses aside)
        user = draw(st.booleans())
        if out and out[-1]["role"] == "model":
            user = True
        elif out and "function_response" not in out[-1]["parts"][0]:
            user = False
        if user:
            out.append(
                {
                    "role": "user",
                    "parts": draw(st.lists(gemini_text | gemini_media, min_size=1, max_size=3)),
                }
            )
            continue
        thoughts = [
            signed(draw, {"text": t, "thought": True}) for t in draw(st.lists(nonempty, max_size=2))
        ]
        content = [signed(draw, p) for p in draw(st.lists(gemini_text | gemini_media, max_size=2))]
        calls = []
        for _ in range(draw(st.integers(0 if thoughts or content else 1, 3))):
            call = {
                "name": draw(st.sampled_from(["f", "g"])),
                "args": draw(json_objects),
                **({"id": ids.new(draw)} if draw(st.booleans()) else {}),
            }
            calls.append(call)
        out.append(
            {
                "role": "model",
                "parts": thoughts + content + [signed(draw, {"function_call": c}) for c in calls],
            }
        )
        if calls:
            responses = []
            for c in calls:
                response = draw(
                    st.builds(lambda t: {"output": t}, texts)
                    | st.builds(lambda t: {"error": t}, texts)
                    | json_objects
                )
                fr = {
                    "name": c["name"],
                    "response": response,
                    **({"id": c["id"]} if "id" in c else {}),
                }
                fr.update(maybe(draw, "parts", st.lists(gemini_media, min_size=1, max_size=2)))
                responses.append({"function_response": fr})
            out.append({"role": "user", "parts": responses})
    return system, out


@PROPS
@given(gemini_conversations())
def test_gemini_wire_round_trip(case: tuple[Any, list[dict[str, Any]]]) -> None:
    system, contents = case
    assert to_gemini(from_gemini(contents, system)) == (system, contents)


# == property tests: neutral -> F -> neutral where F carries everything ======

neutral_text = st.builds(TextPart, text=texts)
full_text = st.builds(TextPart, text=nonempty)  # Anthropic and Gemini refuse empty texts
blank_free = st.builds(TextPart, text=nonblank)


@st.composite
def neutral_for_openai(draw: st.DrawFn) -> list[Message]:
    ids, out = Ids(), []
    media = st.one_of(
        st.builds(
            ImagePart, url=st.just("https://x.test/a.png"), detail=st.none() | st.just("high")
        ),
        st.builds(ImagePart, data=b64s, media_type=st.just("image/webp")),
        st.builds(
            FilePart,
            data=b64s,
            media_type=st.none() | st.just("application/pdf"),
            filename=st.none() | texts,
        ),
        st.builds(FilePart, file_id=names),
    )
    for _ in range(draw(st.integers(0, 7))):
        role = draw(st.sampled_from(["system", "user", "assistant", "tool"]))
        kw: dict[str, Any] = {"role": role, "name": draw(st.none() | names)}
        if role == "system":
            kw.update(
                content=draw(texts | st.lists(neutral_text, max_size=2)),
                metadata=draw(st.sampled_from([{}, {"openai_role": "developer"}])),
            )
        elif role == "user":
            kw["content"] = draw(texts | st.lists(neutral_text | media, max_size=3))
        elif role == "tool":
            kw.update(
                tool_call_id=ids.new(draw), content=draw(texts | st.lists(neutral_text, max_size=2))
            )
        else:
            kw["tool_calls"] = [
                ToolCall(
                    id=ids.new(draw), name=draw(names), arguments=json.dumps(draw(json_objects))
                )
                for _ in range(draw(st.integers(0, 2)))
            ]
            kw.update(
                content=draw(texts | st.lists(neutral_text, max_size=2)),
                reasoning=draw(st.none() | texts),
            )
        out.append(Message(**kw))
    return out


@PROPS
@given(neutral_for_openai())
def test_neutral_openai_neutral(messages: list[Message]) -> None:
    assert openai_round(messages) == messages


@st.composite
def neutral_for_anthropic(draw: st.DrawFn) -> list[Message]:
    """Alternating turns, results right after their calls: what Anthropic can say."""
    ids, out = Ids(), []
    media = st.one_of(
        st.builds(ImagePart, url=st.just("https://x.test/a.png")),
        st.builds(ImagePart, data=b64s, media_type=st.just("image/gif")),
        st.builds(
            FilePart, data=b64s, media_type=st.just("application/pdf"), filename=st.none() | texts
        ),
        st.builds(
            FilePart, data=nonblank.map(lambda t: b64(t.encode())), media_type=st.just("text/plain")
        ),
        st.builds(FilePart, url=st.just("https://x.test/d.pdf")),
    )
    parts = st.lists(blank_free | media, min_size=1, max_size=3)
    if draw(st.booleans()):
        out.append(Message(role="system", content=draw(sendable | st.lists(blank_free,
                                                                            max_size=2))))
    out.append(Message(role="user", content=draw(nonblank | parts)))
    for _ in range(draw(st.integers(0, 3))):
        thoughts = draw(st.lists(texts, max_size=2))
        calls = [
            ToolCall(
                id=ids.new(draw),
                name=draw(names),
                arguments=json.dumps(draw(json_objects), ensure_ascii=False),
            )
            for _ in range(draw(st.integers(0, 2)))
        ]
        kw: dict[str, Any] = {"role": "assistant", "tool_calls": calls}
        if thoughts:
            layout = [{"chars": len(t), "signature": "c2ln"} for t in thoughts]
            kw.update(reasoning="\n\n".join(thoughts), metadata={"anthropic_thinking": layout})
        kw["content"] = (  # no text beside calls or thoughts comes back "" (never [])
            draw(st.just("") | st.lists(blank_free, min_size=1, max_size=2))
            if calls or thoughts
            else draw(nonblank | st.lists(blank_free, min_size=1, max_size=2))
        )
        out.append(Message(**kw))
        for c in calls:
            error = draw(st.booleans())
            out.append(
                Message(
                    role="tool",
                    tool_call_id=c.id,
                    content=draw((nonblank if error else sendable) | parts),
                    metadata={"is_error": True} if error else {},
                )
            )
        if not calls or draw(st.booleans()):
            out.append(Message(role="user", content=draw(parts if calls else nonblank | parts)))
    return out


@PROPS
@given(neutral_for_anthropic())
def test_neutral_anthropic_neutral(messages: list[Message]) -> None:
    assert anthropic_round(messages) == messages


@st.composite
def neutral_for_gemini(draw: st.DrawFn) -> list[Message]:
    """Ids on every call, names on every result, one text or a list of several parts."""
    ids, out = Ids(), []
    media = st.one_of(
        st.builds(ImagePart, data=b64s, media_type=st.just("image/png")),
        st.builds(ImagePart, url=st.just("gs://b/i.png"), media_type=st.just("image/png")),
        st.builds(
            FilePart, data=b64s, media_type=st.just("application/pdf"), filename=st.none() | texts
        ),
        st.builds(FilePart, url=st.just("gs://b/v.mp4"), media_type=st.just("video/mp4")),
    )
    content = (
        nonempty | st.lists(full_text | media, min_size=2, max_size=3) | media.map(lambda p: [p])
    )
    if draw(st.booleans()):
        out.append(
            Message(
                role="system", content=draw(nonempty | st.lists(full_text, min_size=2, max_size=2))
            )
        )
    for _ in range(draw(st.integers(0, 4))):
        out.append(Message(role="user", content=draw(content)))
        calls = [
            ToolCall(
                id=ids.new(draw),
                name=draw(names),
                arguments=json.dumps(draw(json_objects), ensure_ascii=False),
            )
            for _ in range(draw(st.integers(0, 2)))
        ]
        out.append(
            Message(
                role="assistant",
                content=draw(content),
                tool_calls=calls,
                reasoning=draw(st.none() | nonempty),
            )
        )
        for c in calls:
            meta = draw(st.sampled_from([{}, {"is_error": True}]))
            out.append(
                Message(
                    role="tool", tool_call_id=c.id, name=c.name, content=draw(texts), metadata=meta
                )
            )
    return out


@PROPS
@given(neutral_for_gemini())
def test_neutral_gemini_neutral(messages: list[Message]) -> None:
    assert gemini_round(messages) == messages


# == the 40 real sessions ====================================================


def load_sessions() -> list[dict[str, Any]]:
    if not TRANSCRIPTS.is_file():
        pytest.skip(f"real transcripts not found at {TRANSCRIPTS} (read-only shared data absent)")
    return [json.loads(line) for line in TRANSCRIPTS.read_text().splitlines() if line.strip()]


def essence(messages: list[Message]) -> list[tuple[Any, ...]]:
    """What must survive any trip: roles, text, tool-call ids, names, arguments, result ids."""
    return [
        (m.role, m.text(), [(c.id, c.name, c.args()) for c in m.tool_calls], m.tool_call_id)
        for m in messages
    ]


def wire_essence(wire: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [
        (
            m["role"],
            m["content"] or "",
            [(c["id"], c["name"], json.loads(c["arguments"])) for c in m.get("tool_calls") or []],
            m.get("tool_call_id"),
        )
        for m in wire
    ]


def test_real_sessions_survive_every_format() -> None:
    from google.genai import types

    sessions = load_sessions()
    assert len(sessions) == 40
    for session in sessions:
        msgs = from_openai(session["messages"])
        expected = essence(msgs)
        assert expected == wire_essence(session["messages"]), session["id"]
        assert essence(openai_round(msgs)) == expected, session["id"]
        assert essence(anthropic_round(msgs)) == expected, session["id"]
        assert essence(gemini_round(msgs)) == expected, session["id"]
        chained = from_openai(to_openai(gemini_round(anthropic_round(msgs))))
        assert essence(chained) == expected, session["id"]
        usage = [m.metadata["usage"] for m in msgs if "usage" in m.metadata]
        assert len(usage) == sum(1 for m in session["messages"] if "usage" in m)
        system, contents = to_gemini(msgs)
        types.Content.model_validate(system)
        for content in contents:
            types.Content.model_validate(content)


# == property tests: any paired neutral log goes out in a shape the API takes =


@st.composite
def messy_conversations(draw: st.DrawFn) -> list[Message]:
    """Same-role runs, late system notes, empty messages, users between tool results."""
    ids, out = Ids(), []
    chatter = st.builds(
        Message, role=st.sampled_from(["system", "user", "assistant"]), content=texts
    )
    for _ in range(draw(st.integers(0, 8))):
        if not draw(st.booleans()):
            out.append(draw(chatter))
            continue
        calls = [
            ToolCall(id=ids.new(draw), name=draw(names), arguments=json.dumps(draw(json_objects)))
            for _ in range(draw(st.integers(1, 3)))
        ]
        out.append(Message(role="assistant", content=draw(texts), tool_calls=calls))
        for c in calls:
            if draw(st.booleans()):  # a user or system note, or an empty assistant, in between
                note = draw(chatter)
                out.append(
                    note if note.role != "assistant" else note.model_copy(update={"content": ""})
                )
            out.append(Message(role="tool", tool_call_id=c.id, content=draw(texts)))
    return out


def assert_valid_anthropic(wire: list[dict[str, Any]]) -> None:
    """Alternating roles, no empty message or text, results first and paired with calls."""

    def blocks(m: dict[str, Any]) -> list[dict[str, Any]]:
        return [] if isinstance(m["content"], str) else m["content"]

    roles = [m["role"] for m in wire]
    assert all(a != b for a, b in itertools.pairwise(roles)), roles
    for k, m in enumerate(wire):
        assert m["content"], m
        assert all(b["text"] for b in blocks(m) if b["type"] == "text")
        kinds = [b["type"] for b in blocks(m)]
        assert kinds == sorted(kinds, key=lambda t: t != "tool_result"), kinds
        calls = {b["id"] for b in blocks(wire[k - 1]) if b["type"] == "tool_use"} if k else set()
        results = {b["tool_use_id"] for b in blocks(m) if b["type"] == "tool_result"}
        assert results == calls or (m["role"] == "assistant" and not results), (calls, results)


def _result_text(message: Message) -> str:
    """A result's text, a blank one (or an error's empty one) as the placeholder Anthropic
    is sent instead (it refuses blank and empty-error results)."""
    text = message.text()
    if text == BLANK_RESULT_TEXT or (not text.strip() and (
            text or message.metadata.get("is_error"))):
        return ""
    return text


def texts_and_calls(messages: list[Message]) -> tuple[list[str], list[str], list[str]]:
    """Every non-empty text piece (merging regroups pieces, never edits them), calls, results."""
    pieces = [
        piece
        for m in messages
        if m.role != "tool"
        for piece in (
            [m.content]
            if isinstance(m.content, str)
            else [p.text for p in m.content if isinstance(p, TextPart)]
        )
        if piece.strip()  # blank text is not sent to Anthropic
    ]
    results = [f"{m.tool_call_id}={_result_text(m)}" for m in messages if m.role == "tool"]
    return sorted(pieces), [c.id for m in messages for c in m.tool_calls], sorted(results)


@PROPS
@given(messy_conversations())
def test_any_paired_log_goes_to_anthropic_validly_and_loses_nothing(msgs: list[Message]) -> None:
    system, wire = to_anthropic(msgs)
    assert_valid_anthropic(wire)
    assert texts_and_calls(from_anthropic(wire, system)) == texts_and_calls(msgs)


@PROPS
@given(messy_conversations())
def test_any_paired_log_goes_to_gemini_validly_and_loses_nothing(msgs: list[Message]) -> None:
    from google.genai import types

    system, contents = to_gemini(msgs)
    for content in contents:
        assert content["parts"] and all(p.get("text") != "" for p in content["parts"])
        types.Content.model_validate(content)
    if system is not None:
        types.Content.model_validate(system)
    back = from_gemini(contents, system)
    assert texts_and_calls(back) == texts_and_calls(msgs)
    calls = {c.id: c.name for m in msgs for c in m.tool_calls}
    assert all(m.name == calls[m.tool_call_id or ""] for m in back if m.role == "tool")


def test_empty_messages_and_texts_are_not_sent_where_the_api_refuses_them() -> None:
    msgs = [
        Message(role="user", content="a"),
        Message(role="assistant", content=" \n"),
        Message(role="user", content=[TextPart(text=""), TextPart(text="b")]),
    ]
    assert to_anthropic(msgs) == (
        None,
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            }
        ],
    )
    assert to_gemini(msgs) == (
        None,
        [
            {"role": "user", "parts": [{"text": "a"}]},
            {"role": "model", "parts": [{"text": " \n"}]},
            {"role": "user", "parts": [{"text": "b"}]},
        ],
    )
    assert to_openai(msgs)[1] == {"role": "assistant", "content": " \n"}  # OpenAI takes them


def test_an_assistant_turn_of_tool_calls_alone_has_no_content_array_for_openai() -> None:
    """Anthropic's tool_use-only reply becomes content [] in the neutral message; OpenAI
    refuses an empty content array, and the docs promise None for calls without text."""
    messages = from_anthropic([
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [_tool_use("t1")]},
        {"role": "user", "content": [_result("t1")]}])
    assert messages[1].content == "" and to_openai(messages)[1]["content"] is None
