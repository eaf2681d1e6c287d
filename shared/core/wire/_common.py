"""Checked access to untrusted wire dicts, shared by the three adapters.

Provider payloads arrive as plain JSON-like data from agents we do not
control. Every reader here either returns a value of the expected type or
raises :class:`shared.core.errors.InvalidInput` whose message starts with the
exact wire path (``messages[3].content[1].tool_use_id: ...``), so a caller
can find the bad field without a debugger.

Also here: the small encodings more than one adapter needs (data URLs,
base64 of bytes, JSON tool arguments, joining several reasoning blocks into
the one ``Message.reasoning`` string and splitting them back).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from shared.core import fastjson
from shared.core.errors import InvalidInput
from shared.core.messages import FilePart, ImagePart, Message, validate_message

#: Metadata keys every adapter agrees on (provider-specific keys carry a prefix).
IS_ERROR = "is_error"
USAGE = "usage"

#: One wire message or content: a dict, or an SDK's pydantic object.
WireItem = Mapping[str, Any] | BaseModel

#: Several reasoning blocks are joined with this into ``Message.reasoning``.
REASONING_SEP = "\n\n"


@dataclass(frozen=True, slots=True)
class Loc:
    """A wire path plus the index of the top-level item it lies in."""

    path: str
    index: int | None = None

    @classmethod
    def item(cls, prefix: str, index: int) -> Loc:
        return cls(f"{prefix}[{index}]", index)

    def __truediv__(self, key: str | int) -> Loc:
        step = f"[{key}]" if isinstance(key, int) else f".{key}"
        return Loc(self.path + step, self.index)

    def error(self, message: str) -> InvalidInput:
        return InvalidInput(message, field=self.path, index=self.index)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def as_sequence(value: Any, name: str) -> Sequence[Any]:
    """The top-level list of messages or contents (a str or dict is refused)."""
    if type(value) is list or type(value) is tuple:  # the common case, without ABC checks
        return value
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        raise InvalidInput(f"expected a list, got {_kind(value)}", field=name)
    return value


def as_mapping(value: Any, loc: Loc) -> Mapping[str, Any]:
    """A dict; an SDK's pydantic object (``resp.choices[0].message``, ``types.Content``)
    is accepted too, dumped in JSON mode so bytes arrive as base64 text."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json", exclude_none=True)
    if not isinstance(value, Mapping):
        raise loc.error(f"expected an object, got {_kind(value)}")
    return value


def as_list(value: Any, loc: Loc) -> Sequence[Any]:
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        raise loc.error(f"expected a list, got {_kind(value)}")
    return value


def check_keys(obj: Mapping[str, Any], allowed: Iterable[str], loc: Loc) -> None:
    """Refuse keys we would otherwise drop silently. A key set to None carries nothing
    to drop: the providers' SDKs dump every field of their models, unset ones as None
    (``ChatCompletionMessage.model_dump()``, google-genai's ``Content.model_dump()``),
    including fields added after this code was written."""
    known = set(allowed)
    for key, value in obj.items():
        if key not in known and value is not None:
            raise (loc / str(key)).error(f"unknown field (expected one of {sorted(known)})")


def req_str(obj: Mapping[str, Any], key: str, loc: Loc, *, nonempty: bool = False) -> str:
    """A required string field; ``nonempty`` for ids and names."""
    value = obj.get(key)
    if not isinstance(value, str):
        missing = key not in obj
        raise (loc / key).error("required" if missing else f"expected a string, got {_kind(value)}")
    if nonempty and not value:
        raise (loc / key).error("must not be empty")
    return value


def opt_str(obj: Mapping[str, Any], key: str, loc: Loc) -> str | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, str):
        raise (loc / key).error(f"expected a string or null, got {_kind(value)}")
    return value


def opt_bool(obj: Mapping[str, Any], key: str, loc: Loc) -> bool:
    value = obj.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise (loc / key).error(f"expected a boolean, got {_kind(value)}")
    return value


def b64_text(value: Any, loc: Loc) -> str:
    """Base64 text from a str (kept as is) or raw bytes (encoded): metadata stays JSON."""
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if not isinstance(value, str):
        raise loc.error(f"expected base64 text or bytes, got {_kind(value)}")
    return value


_DATA_URL = re.compile(r"data:([^;,]*);base64,(.*)", re.DOTALL)


def split_data_url(url: str) -> tuple[str, str] | None:
    """``(media_type, data)`` of a ``data:<type>;base64,<data>`` URL, else None."""
    match = _DATA_URL.fullmatch(url)
    return (match.group(1), match.group(2)) if match else None


def data_url(media_type: str, data: str) -> str:
    return f"data:{media_type};base64,{data}"


def decode_text(data: str) -> str | None:
    """UTF-8 text of base64 ``data``, or None when it is not both."""
    try:
        return base64.b64decode(data, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None


def encode_text(text: str) -> str:
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def json_arguments(value: Any, loc: Loc) -> str:
    """OpenAI-style arguments: a string that parses as JSON, kept byte for byte. A number
    beyond a float is refused: the formats that take arguments as an object would send
    it as ``Infinity``, which no API parses."""
    if not isinstance(value, str):
        raise loc.error(f"expected a JSON string, got {_kind(value)}")
    if value.strip():
        try:
            fastjson.loads_finite(value)
        except fastjson.NonFinite as exc:
            raise loc.error(str(exc)) from None
        except ValueError as exc:
            raise loc.error(f"not valid JSON ({exc})") from None
        except RecursionError:
            raise loc.error("nested too deeply") from None
    return value


def finite_json(value: Mapping[str, Any], loc: Loc) -> str:
    """An object's JSON as :func:`canonical_json` writes it; a non-finite number (which it
    would write as ``Infinity``, no JSON) is refused at ``loc``."""
    if fastjson.deeper_than(value):
        raise loc.error("nested too deeply")
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except RecursionError:
        raise loc.error("nested too deeply") from None
    except TypeError as exc:
        raise loc.error(f"not JSON: {exc}") from None
    except ValueError:
        raise loc.error("holds a number beyond what a float holds (NaN or Infinity): "
                        "no provider takes it") from None


def omitted_text(part: ImagePart | FilePart, why: str) -> str:
    """The line of text that stands where an image or file is not sent: the model is told
    what it does not see (its media type, name or address) and why."""
    kind = "image" if isinstance(part, ImagePart) else "file"
    what = " ".join(x for x in (part.media_type, kind) if x)
    if isinstance(part, FilePart) and part.filename:
        what += f" {part.filename}"
    elif part.url and not part.url.startswith("data:"):
        what += f" at {part.url}"
    return f"[{what} not sent: {why}]"


def arguments_object(arguments: str, loc: Loc) -> dict[str, Any]:
    """Arguments as the JSON object Anthropic and Gemini require (a non-finite number
    stored before they were refused: None, :func:`~shared.core.fastjson.loads_sendable`)."""
    value = fastjson.loads_sendable(arguments)
    if not isinstance(value, dict):
        raise loc.error(f"this provider needs a JSON object as arguments, got {_kind(value)}")
    return value


_STORED_CALL_KEYS = frozenset(("id", "name", "arguments"))


def stored_call(call: Any, index: int, j: int) -> tuple[str, str, dict[str, Any]] | None:
    """(id, name, arguments as the object Anthropic and Gemini take) of call ``j`` of a
    stored message (``messages[index]``) given as plain data; None when it is not as the
    store writes it. Arguments that are no JSON object raise the whole conversion's error."""
    if type(call) is not dict or call.keys() != _STORED_CALL_KEYS:
        return None
    call_id, name, arguments = call["id"], call["name"], call["arguments"]
    if type(call_id) is not str or type(name) is not str or type(arguments) is not str:
        return None
    args = fastjson.loads_sendable(arguments)
    if type(args) is not dict:
        arguments_object(arguments, Loc(f"messages[{index}].tool_calls[{j}].arguments", index))
    return call_id, name, args


def canonical_json(value: Any) -> str:
    """How arguments and structured results are written (what ToolCall does for dicts)."""
    return json.dumps(value, ensure_ascii=False)


def join_reasoning(texts: Sequence[str]) -> str | None:
    return REASONING_SEP.join(texts) if texts else None


def split_reasoning(joined: str, lengths: Sequence[int]) -> list[str] | None:
    """Undo :func:`join_reasoning` given the block lengths; None if ``joined`` was edited."""
    if sum(lengths) + len(REASONING_SEP) * (len(lengths) - 1) != len(joined) or not lengths:
        return None
    parts, pos = [], 0
    for k, size in enumerate(lengths):
        if k and joined[pos : pos + len(REASONING_SEP)] != REASONING_SEP:
            return None
        pos += len(REASONING_SEP) if k else 0
        parts.append(joined[pos : pos + size])
        pos += size
    return parts


def build(data: dict[str, Any], loc: Loc) -> Message:
    """A Message from neutral fields; a model-level error is reported at the wire item."""
    try:
        return Message.model_validate(data)
    except ValidationError as exc:
        # For a union (str | list of parts) the deepest error is the one that explains.
        err = max(exc.errors(), key=lambda e: len(e["loc"]))
        message = err["msg"].removeprefix("Value error, ")
        if not err["loc"] and ":" in message.split(" ", 1)[0]:  # "tool_call_id: ..." model rules
            where, message = message.split(": ", 1)
            raise (loc / where).error(message) from None
        at, previous = loc, None
        for segment in err["loc"]:
            if not _union_label(segment, previous):
                at = at / segment
            previous = segment
        raise at.error(message) from None


def _union_label(segment: str | int, previous: str | int | None) -> bool:
    """Pydantic's names for union branches ("str", "list[...]", a part's tag), not fields."""
    if isinstance(segment, int):
        return False
    tag = isinstance(previous, int) and segment in ("text", "image", "file")
    return tag or "[" in segment or segment in ("str", "list")


def neutral(messages: Any) -> list[Message]:
    """The neutral input of a ``to_*`` function, validated (dicts are accepted too)."""
    items = as_sequence(messages, "messages")
    return [validate_message(item, i) for i, item in enumerate(items)]


def content_dicts(parts: Sequence[dict[str, Any]], single_text_as_str: bool) -> Any:
    """Neutral content from part dicts: "" when empty, a str for one lone text if asked."""
    if not parts:
        return ""
    if single_text_as_str and len(parts) == 1 and parts[0]["type"] == "text":
        return parts[0]["text"]
    return list(parts)
