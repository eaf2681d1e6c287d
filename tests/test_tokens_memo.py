"""The memo of short texts' counts: the same figures as counting afresh, bounded."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.core import tokens
from shared.core.tokens import PROVIDERS, HeuristicCounter

short = st.text(max_size=tokens._SHORT)


@pytest.fixture(autouse=True)
def empty_memo() -> Iterator[None]:
    tokens._SHORT_SEEN.clear()
    yield
    tokens._SHORT_SEEN.clear()


@given(short, st.sampled_from(sorted(PROVIDERS)))
def test_a_remembered_count_is_the_count(text: str, provider: str) -> None:
    profile = PROVIDERS[provider]
    first = tokens._raw_text(text, profile)
    again = tokens._raw_text(text, profile)  # from the memo when the text is not empty
    latin, other = tokens._features(text) if text else (0.0, 0.0)
    assert first == again == profile.factor * (latin + profile.non_latin_factor * other)


def test_the_memo_is_per_text_not_per_provider() -> None:
    """One entry serves every provider: the provider's scaling is applied after it."""
    profiles = [PROVIDERS[p] for p in sorted(PROVIDERS)]
    before = [tokens._raw_text("read_file", p) for p in profiles]
    assert len(tokens._SHORT_SEEN) == 1
    assert [tokens._raw_text("read_file", p) for p in profiles] == before
    assert len(set(before)) > 1  # the providers do scale it differently
    counter = HeuristicCounter("anthropic")
    raw = tokens._raw_text("read_file", PROVIDERS["anthropic"])
    assert counter.text("read_file") == tokens._tokens(raw, counter.safety_margin)


def test_long_texts_are_not_kept() -> None:
    text = "x" * (tokens._SHORT + 1)
    tokens._raw_text(text, PROVIDERS["openai"])
    assert text not in tokens._SHORT_SEEN


def test_the_memo_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokens, "_SHORT_KEEP", 8)
    for i in range(50):
        tokens._raw_text(f"name{i}", PROVIDERS["openai"])
        assert len(tokens._SHORT_SEEN) <= 8


def test_a_text_sliced_by_a_smaller_chunk_skips_the_memo(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where slicing applies (tests shrink the slice), the count is made as before."""
    monkeypatch.setattr(tokens, "_CHUNK", 4)
    tokens._raw_text("twelve chars", PROVIDERS["openai"])
    assert not tokens._SHORT_SEEN
