"""The neutral message model every other module speaks.

Provider wire formats (OpenAI, Anthropic, Gemini) are converted to and from
this model at the edges (see ``shared.core.wire``). Messages are frozen: the
log is append-only and a view never edits a message in place, it builds a
new one (``model_copy(update=...)``).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from shared.core import fastjson
from shared.core.errors import InvalidInput

Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")
INPUT: dict[str, Any] = {"input": True}
"""Validation context of a caller's message (:func:`validate_message`): its tool calls'
arguments are checked for numbers no provider reads (``NaN``, ``Infinity``, ``1e999``)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TextPart(_Frozen):
    type: Literal["text"] = "text"
    text: str


class ImagePart(_Frozen):
    """An image by URL (``url``) or inline base64 (``data`` + ``media_type``)."""

    type: Literal["image"] = "image"
    url: str | None = None
    data: str | None = None
    media_type: str | None = None
    detail: str | None = None

    @model_validator(mode="after")
    def _has_source(self) -> ImagePart:
        if not self.url and not self.data:
            raise ValueError("an image part needs url or data")
        return self


class FilePart(_Frozen):
    """A document (PDF, text...) by URL, inline base64 data or provider file id."""

    type: Literal["file"] = "file"
    url: str | None = None
    data: str | None = None
    file_id: str | None = None
    media_type: str | None = None
    filename: str | None = None

    @model_validator(mode="after")
    def _has_source(self) -> FilePart:
        if not (self.url or self.data or self.file_id):
            raise ValueError("a file part needs url, data or file_id")
        return self


ContentPart = Annotated[TextPart | ImagePart | FilePart, Field(discriminator="type")]


class ToolCall(_Frozen):
    """One function call requested by the assistant. ``arguments`` is JSON text."""

    id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=256)
    arguments: str = "{}"

    @field_validator("arguments", mode="before")
    @classmethod
    def _arguments_are_json(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, Mapping):
            if fastjson.deeper_than(dict(value)):
                raise ValueError("arguments are nested too deeply")
            try:  # NaN and Infinity are refused: json would write them, no API reads them
                return json.dumps(value, ensure_ascii=False, allow_nan=False)
            except RecursionError:
                raise ValueError("arguments are nested too deeply") from None
            except (ValueError, TypeError) as exc:
                raise ValueError(f"arguments cannot be written as JSON: {exc}") from None
        if isinstance(value, str):
            text = value.strip() or "{}"
            # a caller's arguments must be JSON a provider reads; a stored message is read
            # back as it was stored (one written before this check may hold NaN)
            given = isinstance(info.context, dict) and info.context.get("input") is True
            check = fastjson.is_finite_object if given else fastjson.is_object
            try:
                is_object = check(text)
            except ValueError as exc:
                raise ValueError(f"arguments are not valid JSON: {exc}") from None
            except RecursionError:
                raise ValueError("arguments are nested too deeply") from None
            if not is_object:
                raise ValueError("arguments must be a JSON object (every provider requires one)")
            return value if value.strip() else "{}"
        return value

    def args(self) -> Any:
        """The arguments parsed (a dict for every sane provider)."""
        return fastjson.loads(self.arguments)


class Message(_Frozen):
    """One message of a conversation, independent of any provider."""

    role: Role
    content: str | list[ContentPart] = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = Field(default=None, min_length=1, max_length=256)
    name: str | None = None
    reasoning: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("content", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any) -> Any:
        return "" if value is None else value

    @model_validator(mode="after")
    def _role_rules(self) -> Message:
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("tool_call_id: a tool result needs the id of its call")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("tool_calls: only assistant messages carry tool calls")
        if self.tool_call_id is not None and self.role != "tool":
            raise ValueError("tool_call_id: only tool messages carry a tool_call_id")
        return self

    # -- convenience -----------------------------------------------------
    def text(self) -> str:
        """All text of the message (parts joined), without images or files."""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(p.text for p in self.content if isinstance(p, TextPart))

    def media_count(self) -> int:
        """Images and files carried by the message."""
        if isinstance(self.content, str):
            return 0
        return sum(1 for p in self.content if not isinstance(p, TextPart))

    def to_json(self) -> str:
        """Compact JSON for storage; unset optional fields are left out.

        (Not ``exclude_defaults``: that would drop the content parts'
        ``type`` discriminator, and the message could not be read back.)
        """
        return self.model_dump_json(exclude_none=True)

    def to_json_bytes(self) -> bytes:
        """:meth:`to_json` as UTF-8 bytes, made directly (what the store sends and keeps)."""
        return self.__pydantic_serializer__.to_json(self, exclude_none=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> Message:
        return cls.model_validate_json(raw)


def _describe(exc: ValidationError, index: int, prefix: str, hint: str = "") -> InvalidInput:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"] if p not in ("function-after",))
    msg = err["msg"].removeprefix("Value error, ")
    # A model-level rule names its field at the start of the message ("tool_call_id: ...").
    if not loc and ":" in msg.split(" ", 1)[0]:
        loc, msg = msg.split(": ", 1)
    field = f"{prefix}[{index}]" + (f".{loc}" if loc else "")
    return InvalidInput(msg + hint, field=field, index=index)


_ANTHROPIC_PARTS = frozenset({"tool_use", "tool_result", "thinking", "redacted_thinking",
                              "document", "server_tool_use"})
_OPENAI_PARTS = frozenset({"image_url", "input_audio", "input_text", "input_image", "refusal"})


def _wire_format(data: Mapping[str, Any]) -> str | None:
    """The converter for a message that is in a provider's wire format, if it looks like one:
    the neutral model is not what an SDK hands back, and the first thing an integrator
    passes is often the provider's own list."""
    if data.get("role") == "model" or "parts" in data:
        return "from_gemini"
    calls, content = data.get("tool_calls"), data.get("content")
    if data.get("role") in ("developer", "function") or "refusal" in data or "audio" in data \
            or (isinstance(calls, list)
                and any(isinstance(c, Mapping) and "function" in c for c in calls)):
        return "from_openai"
    if isinstance(content, list):
        parts = [p for p in content if isinstance(p, Mapping)]
        types = {p.get("type") for p in parts if isinstance(p.get("type"), str)}
        if types & _ANTHROPIC_PARTS or any(p.get("type") == "image" and "source" in p
                                           for p in parts):
            return "from_anthropic"
        if types & _OPENAI_PARTS:
            return "from_openai"
    return None


def validate_message(data: Any, index: int = 0, prefix: str = "messages") -> Message:
    """One message from a dict (or a Message), raising InvalidInput that names the field
    (and the converter to use when the dict is in a provider's wire format)."""
    if isinstance(data, Message):
        return data
    if not isinstance(data, Mapping):
        raise InvalidInput(f"expected an object, got {type(data).__name__}",
                           field=f"{prefix}[{index}]", index=index)
    try:
        return Message.model_validate(data, context=INPUT)
    except ValidationError as exc:
        converter = _wire_format(data)
        hint = (f" (a provider's wire format: convert the list with shared.{converter}() "
                "first)") if converter else ""
        raise _describe(exc, index, prefix, hint) from None


def validate_messages(data: Iterable[Any], prefix: str = "messages") -> list[Message]:
    """Many messages; the first bad one raises InvalidInput naming ``messages[i].field``."""
    if isinstance(data, (str, bytes, Mapping)) or not isinstance(data, Iterable):
        raise InvalidInput("expected a list of messages", field=prefix)
    return [validate_message(item, i, prefix) for i, item in enumerate(data)]


def _field(message: Any, name: str) -> Any:
    if isinstance(message, Mapping):
        return message.get(name)
    return getattr(message, name, None)


def _call_id(call: Any) -> Any:
    """The id of a tool call: a ToolCall, a neutral dict or an OpenAI nested one."""
    return call.get("id") if isinstance(call, Mapping) else getattr(call, "id", None)


def check_tool_results(messages: Sequence[Any], prefix: str = "messages",
                       earlier_calls: Collection[str] | None = None) -> None:
    """Raise InvalidInput naming ``messages[i].tool_call_id`` for an orphan tool result.

    A tool result answers a call requested earlier: by an assistant message
    earlier in ``messages``, or (for results that come before any assistant
    message of ``messages``: the turn continues one already stored) by a
    call in ``earlier_calls`` when the caller knows them (None: not known,
    such leading results are accepted). Takes validated ``Message`` objects
    or their dicts (neutral or OpenAI tool calls); validate shapes first.
    """
    seen: set[str] = set()
    assistant_seen = False
    for i, message in enumerate(messages):
        typed = type(message) is Message  # validated already: no ABC check per field
        role = message.role if typed else _field(message, "role")
        if role == "assistant":
            assistant_seen = True
            if typed:
                seen.update(c.id for c in message.tool_calls)
            else:
                seen.update(str(_call_id(c)) for c in (_field(message, "tool_calls") or [])
                            if _call_id(c) is not None)
        elif role == "tool":
            call_id = message.tool_call_id if typed else _field(message, "tool_call_id")
            if call_id in seen:
                continue
            if not assistant_seen and (earlier_calls is None or call_id in earlier_calls):
                continue
            where = ("an earlier message of this call" if assistant_seen or earlier_calls is None
                     else "an earlier message of this call or of the session")
            raise InvalidInput(f"tool result for {call_id!r}, which matches no tool call in "
                               f"{where} (an orphan tool result)",
                               field=f"{prefix}[{i}].tool_call_id", index=i)


def tool_call_ids(messages: Sequence[Message]) -> set[str]:
    """Ids of every tool call requested in ``messages``."""
    return {tc.id for m in messages for tc in m.tool_calls}


__all__ = [
    "ROLES",
    "ContentPart",
    "FilePart",
    "ImagePart",
    "Message",
    "Role",
    "TextPart",
    "ToolCall",
    "check_tool_results",
    "tool_call_ids",
    "validate_message",
    "validate_messages",
]
