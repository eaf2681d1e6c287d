"""JSON text to Python values as :func:`json.loads` makes them, by orjson where it can.

Cold paths parse every stored message of a view and every tool call's
arguments; orjson does that several times faster than the standard library,
and it differs from it in two ways this module removes: it refuses what
``json`` accepts (``NaN``, lone surrogates, numbers beyond a double), handed
back to ``json``; and it reads an integer beyond 64 bits as a float, so a
value holding any float is parsed again by ``json`` (a float is rare in stored
messages and arguments).
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson


def _has_float(value: Any) -> bool:
    """Whether a float is anywhere in ``value`` (strings are not looked into)."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is float:
            return True
        values = item.values() if kind is dict else item if kind is list else ()
        for v in values:
            kind = type(v)
            if kind is float:
                return True
            if kind is dict or kind is list:
                stack.append(v)
    return False


def loads(text: str | bytes) -> Any:
    """``json.loads(text)``, the same value (and the same error)."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)
    return json.loads(text) if _has_float(value) else value


def is_object(text: str | bytes) -> bool:
    """Whether ``json.loads(text)`` is a dict (raising its error where ``text`` is not
    JSON): a check needs no exact value, so nothing is walked for floats (a tool call's
    arguments are checked whenever a message is validated, stored ones too)."""
    try:
        return type(orjson.loads(text)) is dict
    except orjson.JSONDecodeError:
        return isinstance(json.loads(text), dict)


class NonFinite(ValueError):
    """``NaN``, ``Infinity`` or a number beyond a double: ``json`` reads them, no
    provider's API does."""


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NonFinite(f"the number {text} is beyond what a float holds: no provider takes it")
    return value


def _no_constant(name: str) -> Any:
    raise NonFinite(f"{name} is not JSON: no provider takes it")


def loads_finite(text: str | bytes) -> Any:
    """``json.loads(text)``, raising :class:`NonFinite` where a provider could not read it
    (and RecursionError past :data:`MAX_TEXT_DEPTH`: :func:`check_text_depth`)."""
    check_text_depth(text)
    return json.loads(text, parse_float=_finite_float, parse_constant=_no_constant)


def is_finite_object(text: str | bytes) -> bool:
    """:func:`is_object`, raising :class:`NonFinite` for ``NaN``, ``Infinity`` or a number
    beyond a double too. orjson refuses each of them, so only text it refuses is read
    again, by ``json`` with those checks."""
    try:
        return type(orjson.loads(text)) is dict
    except orjson.JSONDecodeError:
        return isinstance(loads_finite(text), dict)


def loads_unchecked(raw: str | bytes) -> Any:
    """orjson's parse of ``raw`` (json's where orjson refuses it), for a caller that reads
    no number of it (a stored message's role, ids and text): a number may differ from
    :func:`json.loads`'s."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def loads_message(raw: str | bytes) -> Any:
    """:func:`loads` of a stored message (:meth:`shared.core.messages.Message.to_json`):
    only its metadata and content parts can hold a number, so only they are checked
    (a cold read parses every message of the view)."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)
    if type(value) is dict:
        meta, content = value.get("metadata"), value.get("content")
        if not (meta and _has_float(meta)) and not (type(content) is list
                                                    and _has_float(content)):
            return value
    return json.loads(raw) if _has_float(value) else value


def _finite_or_none(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


def _none(_: str) -> None:
    return None


def loads_sendable(text: str | bytes) -> Any:
    """:func:`loads`, with ``NaN``, ``Infinity`` and numbers beyond a double read as None:
    no API takes them, and stored tool-call arguments may hold them (written before
    callers' arguments were checked for them); an Anthropic or Gemini view of such a
    message is then still sendable."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text, parse_float=_finite_or_none, parse_constant=_none)
    if not _has_float(value):
        return value
    return json.loads(text, parse_float=_finite_or_none, parse_constant=_none)


MAX_DEPTH = 200
"""How deeply a value handed in as objects (tool definitions, a call's arguments) may
nest. Real schemas stay within a few dozen levels; Python's own limits are not a bound to
lean on: json on Python 3.13 writes 5,000 levels where 3.11 stopped, and the code after
it then ran out of stack instead. (orjson writes at most 255.)"""

MAX_TEXT_DEPTH = 512
"""How deeply JSON handed in as text may nest. json, which reads it, stopped near Python's
recursion limit on 3.11 (less the caller's own frames) and reads 5,000 levels on 3.13:
the bound is ours, well inside both."""


def check_text_depth(text: str | bytes) -> None:
    """RecursionError (what callers already report as "nested too deeply") for JSON text
    nested past :data:`MAX_TEXT_DEPTH`, on every Python version. Text with fewer opening
    brackets than that cannot nest that deep, and is not parsed here."""
    openers = text.count("[") + text.count("{") if isinstance(text, str) \
        else text.count(b"[") + text.count(b"{")
    if openers <= MAX_TEXT_DEPTH:
        return
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc):
            raise RecursionError(f"nested more than {MAX_TEXT_DEPTH} levels") from None
        return  # not JSON, or NaN and the like: the caller's parse says which
    if deeper_than(value, MAX_TEXT_DEPTH):
        raise RecursionError(f"nested more than {MAX_TEXT_DEPTH} levels")


def deeper_than(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` (dicts and lists) nests more than ``limit`` levels, found without
    recursion."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children
                     if isinstance(child, (dict, list, tuple)))
    return False


__all__ = ["MAX_DEPTH", "MAX_TEXT_DEPTH", "NonFinite", "check_text_depth", "deeper_than",
           "is_finite_object", "is_object", "loads", "loads_finite", "loads_message",
           "loads_sendable", "loads_unchecked"]

