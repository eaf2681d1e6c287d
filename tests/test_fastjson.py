"""fastjson.loads gives json.loads's value, whatever orjson would have made of it."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core import fastjson

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                 max_size=4),
    max_leaves=20)


def same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down (1 == 1.0 would hide a float)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


@settings(max_examples=300, deadline=None)
@given(value=values)
def test_any_json_reads_as_json_reads_it(value: Any) -> None:
    text = json.dumps(value, ensure_ascii=False)
    assert same(fastjson.loads(text), json.loads(text))
    assert same(fastjson.loads(text.encode()), json.loads(text.encode()))


@pytest.mark.parametrize("text", [
    '{"id": 123456789012345678901234567890}',  # orjson: a float
    '{"id": -9223372036854775809}',
    '[18446744073709551616]',
    '{"x": NaN, "y": -Infinity}',  # orjson refuses these
    '{"x": 1e400}',
    '{"x": "\\ud800"}',
    '{"a": 1, "a": 2}',
])
def test_where_orjson_differs_json_decides(text: str) -> None:
    assert same(fastjson.loads(text), json.loads(text))


def test_errors_are_json_errors() -> None:
    with pytest.raises(json.JSONDecodeError):
        fastjson.loads('{"a": ')


@settings(max_examples=200, deadline=None)
@given(meta=st.dictionaries(st.text(max_size=5), values, max_size=3),
       big=st.integers(2**64, 2**80))
def test_a_stored_message_reads_as_json_reads_it(meta: dict[str, Any], big: int) -> None:
    from shared.core.messages import Message

    for m in (Message(role="user", content="hi", metadata=meta),
              Message(role="user", content="hi", metadata={**meta, "n": big})):
        raw = m.to_json()
        assert same(fastjson.loads_message(raw), json.loads(raw))


def json_is_object(text: str) -> bool | type[BaseException]:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return ValueError
    except RecursionError:
        return RecursionError


def fast_is_object(text: str) -> bool | type[BaseException]:
    try:
        return fastjson.is_object(text)
    except ValueError:
        return ValueError
    except RecursionError:
        return RecursionError


@settings(max_examples=300, deadline=None)
@given(value=values, cut=st.integers(0, 40), junk=st.sampled_from(["", " ", "x", "}", ","]))
def test_is_object_says_what_json_says(value: Any, cut: int, junk: str) -> None:
    """An object or not, and an error exactly where json has one (a text cut short, with
    something after it)."""
    text = json.dumps(value, ensure_ascii=False)
    for candidate in (text, text[:cut] + junk, text + junk):
        assert fast_is_object(candidate) == json_is_object(candidate)


@pytest.mark.parametrize("text", [
    '{"x": NaN}', '{"x": "\\ud800"}', '{"x": 1e400}', '[1]', '"{}"', "  {}  ", "",
    "[" * 5000 + "]" * 5000, '{"a":' * 5000 + "1" + "}" * 5000,
])
def test_is_object_where_orjson_differs(text: str) -> None:
    assert fast_is_object(text) == json_is_object(text)


def _nested(depth: int, kind: str) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"k": value} if kind == "dict" else [value]
    return value


@pytest.mark.parametrize("kind", ["dict", "list"])
def test_depth_is_bounded_by_our_limit_not_the_interpreters(kind: str) -> None:
    assert not fastjson.deeper_than(_nested(fastjson.MAX_DEPTH, kind))
    assert fastjson.deeper_than(_nested(fastjson.MAX_DEPTH + 1, kind))
    assert fastjson.deeper_than(_nested(200_000, kind))  # no recursion: no stack to run out of
    assert not fastjson.deeper_than("leaf") and not fastjson.deeper_than({})


@pytest.mark.parametrize("depth", [fastjson.MAX_TEXT_DEPTH + 1, 5_000])
def test_json_text_deeper_than_orjson_reads_is_refused_on_every_python(depth: int) -> None:
    """Python 3.13's json reads 5,000 levels, 3.11's stopped near 1,000 less the caller's
    frames: the bound is ours."""
    with pytest.raises(RecursionError):
        fastjson.loads_finite("[" * depth + "]" * depth)
    within = fastjson.MAX_TEXT_DEPTH
    assert fastjson.loads_finite("[" * within + "]" * within) is not None
