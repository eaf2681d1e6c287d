"""Responses content parts <-> neutral content parts, and the field checks of an item.

Shared by the item mapping (:mod:`shared.integrations.agents_items`) and the client-side
tool items (:mod:`shared.integrations.agents_client_items`): both read user and tool
output content the same way, and name a bad field the same way (``items[i].field``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from shared.core.errors import InvalidInput

IMAGE_FILE = "image/*"  # the media type of an image uploaded with the Files API (by id)

__all__ = ["IMAGE_FILE", "input_parts", "json_copy", "kind_of", "mapping", "parts_out",
           "string"]


def kind_of(value: Any) -> str:
    """The JSON kind of ``value`` for an error message."""
    return "null" if value is None else type(value).__name__


def json_copy(value: Any) -> Any:
    """``value`` as plain JSON data (a copy: what is kept in metadata is never shared)."""
    return json.loads(json.dumps(value, default=str))


def mapping(raw: Any, where: str) -> Mapping[str, Any]:
    """An item or part as a mapping (an SDK pydantic item is dumped as the SDK sends it)."""
    if hasattr(raw, "model_dump"):  # an SDK pydantic item (ResponseFunctionToolCall...)
        raw = raw.model_dump(mode="json", exclude_none=True)
    if not isinstance(raw, Mapping):
        raise InvalidInput(f"expected an object, got {kind_of(raw)}", field=where)
    return raw


def string(obj: Mapping[str, Any], key: str, where: str, *, nonempty: bool = False) -> str:
    """``obj[key]``, which must be a string (InvalidInput naming ``where.key``)."""
    value = obj.get(key)
    if not isinstance(value, str):
        raise InvalidInput("required" if key not in obj else
                           f"expected a string, got {kind_of(value)}", field=f"{where}.{key}")
    if nonempty and not value:
        raise InvalidInput("must not be empty", field=f"{where}.{key}")
    return value


def input_parts(content: Any, where: str) -> str | list[dict[str, Any]]:
    """User/system/tool-output content: a string, or input_text/image/file parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidInput(f"expected a string or a list of parts, got {kind_of(content)}",
                           field=where)
    parts: list[dict[str, Any]] = []
    for j, raw in enumerate(content):
        at = f"{where}[{j}]"
        part = mapping(raw, at)
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": string(part, "text", at)})
        elif kind == "input_image":
            url = part.get("image_url")
            if isinstance(url, str) and url.startswith("data:") and ";base64," in url:
                media, data = url[5:].split(";base64,", 1)
                image = {"type": "image", "data": data, "media_type": media}
            elif isinstance(url, str) and url:
                image = {"type": "image", "url": url}
            elif isinstance(part.get("file_id"), str) and part["file_id"]:
                # an uploaded image: a file part by id, marked as an image (IMAGE_FILE)
                parts.append({"type": "file", "file_id": part["file_id"],
                              "media_type": IMAGE_FILE})
                continue
            else:
                raise InvalidInput("an image needs image_url (a URL or data URL) or file_id",
                                   field=f"{at}.image_url")
            if isinstance(part.get("detail"), str):
                image["detail"] = part["detail"]
            parts.append(image)
        elif kind == "input_file":
            file: dict[str, Any] = {"type": "file"}
            for src, dst in (("file_url", "url"), ("file_id", "file_id"),
                             ("filename", "filename"), ("file_data", "data")):
                if isinstance(part.get(src), str):
                    file[dst] = part[src]
            if not ({"url", "file_id", "data"} & file.keys()):
                raise InvalidInput("a file needs file_url, file_id or file_data", field=at)
            parts.append(file)
        else:
            raise InvalidInput(f"unknown content part type {kind!r} (expected input_text, "
                               "input_image or input_file)", field=f"{at}.type")
    return parts


def parts_out(content: Any) -> Any:
    """Neutral content as Responses input content (the inverse of :func:`input_parts`)."""
    if isinstance(content, str):
        return content
    out: list[dict[str, Any]] = []
    for part in content:
        if part.type == "text":
            out.append({"type": "input_text", "text": part.text})
        elif part.type == "image":
            url = part.url or f"data:{part.media_type};base64,{part.data}"
            image: dict[str, Any] = {"type": "input_image", "image_url": url,
                                     "detail": part.detail or "auto"}
            out.append(image)
        elif part.file_id is not None and part.media_type == IMAGE_FILE:
            out.append({"type": "input_image", "file_id": part.file_id, "detail": "auto"})
        else:
            file: dict[str, Any] = {"type": "input_file"}
            for src, dst in (("url", "file_url"), ("file_id", "file_id"),
                             ("filename", "filename"), ("data", "file_data")):
                if getattr(part, src) is not None:
                    file[dst] = getattr(part, src)
            out.append(file)
    return out
