"""The heuristic estimator: content classes, providers, margin, messages, tools,
calibration and the hybrid estimate. Needs no data files and no tiktoken
(``test_tokens_exact.py`` measures against the real tokenizer)."""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import random
import time
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from shared.core import tokens
from shared.core.calibration import CALIBRATION_MAX_RATIO, CALIBRATION_MIN_RATIO
from shared.core.errors import InvalidInput
from shared.core.messages import FilePart, ImagePart, Message, TextPart, ToolCall
from shared.core.tokens import (
    DEFAULT_COUNTER,
    DEFAULT_SAFETY_MARGIN,
    MESSAGE_OVERHEAD,
    NAME_OVERHEAD,
    PROVIDERS,
    REQUEST_OVERHEAD,
    TOOL_CALL_OVERHEAD,
    TOOL_DEFINITION_OVERHEAD,
    TOOLS_BLOCK_OVERHEAD,
    Calibration,
    HeuristicCounter,
    TokenCounter,
    estimate_message_tokens,
    estimate_messages_tokens,
    estimate_tokens,
    estimate_tool_tokens,
    hybrid_estimate,
    provider_for_model,
    provider_profile,
)

PROSE = (
    "The committee met on Thursday to review the proposal. Most members agreed that "
    "the plan was sound, although several raised concerns about the schedule and the "
    "cost of hiring outside help. After a long discussion they decided to ask for a "
    "revised budget and to meet again in two weeks, once the figures were ready. "
    "Everyone thanked the chair for keeping the meeting short and focused."
)
CODE = '''def load_config(path: str) -> dict[str, Any]:
    """Read the settings file and fill in defaults."""
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    for key, value in DEFAULTS.items():
        data.setdefault(key, value)
    if data["retries"] < 0:
        raise ValueError(f"retries must be >= 0, got {data['retries']}")
    return data
'''
RECORDS = json.dumps(
    [
        {
            "id": f"res_{i:04d}",
            "status": "confirmed",
            "seat": f"{i % 30}{'ABCDEF'[i % 6]}",
            "price": 129.5 + i,
            "passengers": [{"first": "Ann", "last": "Lee"}],
        }
        for i in range(12)
    ]
)
CHINESE = "开发团队发布了该库的新版本，其中包含重要的修复。根据变更日志，修复了一个内存泄漏的错误。"  # noqa: RUF001
RUSSIAN = "Команда разработчиков выпустила новую версию библиотеки с важными исправлениями."  # noqa: RUF001


def raw(text: str, provider: str = "openai") -> int:
    """The estimate without safety margin."""
    return estimate_tokens(text, provider, safety_margin=0.0)


# -- content classes --------------------------------------------------------------


def test_empty_text_is_free_and_any_text_costs_a_token() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("a") >= 1
    assert estimate_tokens(" ") >= 1


def test_prose_counts_about_four_to_five_chars_per_token() -> None:
    assert 4.0 <= len(PROSE) / raw(PROSE) <= 5.5


def test_code_counts_denser_than_prose() -> None:
    assert 2.8 <= len(CODE) / raw(CODE) <= 4.3
    assert len(CODE) / raw(CODE) < len(PROSE) / raw(PROSE)


def test_json_counts_denser_than_code_and_prose() -> None:
    per_token = len(RECORDS) / raw(RECORDS)
    assert 2.2 <= per_token <= 3.4
    assert per_token < len(CODE) / raw(CODE)


def test_plain_chars_over_four_would_undercount_json_and_code() -> None:
    assert raw(RECORDS) > len(RECORDS) / 4 * 1.15
    assert raw(CODE) > len(CODE) / 4


def test_cjk_and_other_scripts_cost_far_more_per_character() -> None:
    cjk = raw(CHINESE) / len(CHINESE)
    cyrillic = raw(RUSSIAN) / len(RUSSIAN)
    english = raw(PROSE) / len(PROSE)
    assert cjk >= 0.6
    assert cjk > cyrillic > english
    assert raw("😀" * 10) >= 10


POLISH = (
    "Zespół programistów opublikował nową wersję biblioteki, która zawiera ważne poprawki "
    "błędów. Według dziennika zmian naprawiono wyciek pamięci występujący podczas długich "
    "połączeń z serwerem oraz przyspieszono uruchamianie aplikacji."
)
POLISH_WITHOUT_DIACRITICS = POLISH.translate(str.maketrans("ółęąśżźćńŁÓĘĄŚŻŹĆŃ",
                                                           "oleaszzcnLOEASZZCN"))


def test_other_languages_in_latin_letters_count_their_long_words() -> None:
    """o200k splits a Polish word of the same length into more pieces than an English one;
    the accented letters are the sign, so the same text stripped of them counts as before."""
    assert raw(POLISH) / len(POLISH) > raw(PROSE) / len(PROSE) * 1.1
    accented = raw(POLISH) - raw(POLISH_WITHOUT_DIACRITICS)
    letters = POLISH.count("ó") + POLISH.count("ł") + POLISH.count("ę") + POLISH.count("ą")
    assert accented > letters * 0.2  # more than the accented letters' own weight


@pytest.mark.parametrize(("plain", "signed"), [
    (" We met at the cafe.", " We met at the café."),  # an accented word
    (" He said yarn is a word.", " He said yang is a word."),  # a sign word
])
def test_a_sign_of_another_language_in_english_text_adds_a_bounded_few_tokens(
        plain: str, signed: str) -> None:
    bound = tokens._OTHER_LANGUAGE_LETTER * tokens._LETTERS_PER_DIACRITIC + 2
    for english in (PROSE, PROSE * 20):
        assert 0 <= raw(english + signed) - raw(english + plain) <= bound


INDONESIAN = (
    "Tim pengembang telah merilis versi baru yang memperbaiki kebocoran memori pada koneksi "
    "panjang dengan server. Pengguna disarankan untuk segera memperbarui perangkat lunak "
    "mereka, karena versi sebelumnya mengandung celah keamanan dalam proses autentikasi."
)


def test_languages_without_diacritics_are_told_by_their_common_words(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Indonesian, Dutch, Swahili and Tagalog carry no diacritics; their commonest words
    ("yang", "het", "kwa", "ang") are the sign instead, looked for at the text's start."""
    assert tokens.may_hold_signs(INDONESIAN) and tokens._count_chunk(INDONESIAN,
                                                                     signs=True)[3] >= 4
    counted = raw(INDONESIAN)
    monkeypatch.setattr(tokens, "may_hold_signs", lambda head: False)
    assert counted > raw(INDONESIAN) * 1.1


def test_english_code_and_logs_are_not_looked_at_for_sign_words() -> None:
    assert not tokens.may_hold_signs(PROSE + CODE + RECORDS)


def test_code_logs_and_json_are_not_taken_for_another_language() -> None:
    for text in (CODE, RECORDS, "src/app/handlers/registration_controller.py:118: Warning"):
        assert tokens._count_chunk(text)[3] == 0  # no accented letter: nothing added


def test_scripts_with_few_merges_cost_more_per_character() -> None:
    def per_char(text: str) -> float:
        return raw(text * 20) / (len(text) * 20)

    thai, hindi = per_char("ภาษาไทย"), per_char("हिन्दी")
    for sparse in ("ພາສາລາວ", "አማርኛ", "བོད་སྐད", "ꆈꌠꉙ"):  # Lao, Amharic, Tibetan, Yi
        assert per_char(sparse) > 2 * max(thai, hindi)
    # Hangul costs the same whichever page of UTF-8 its syllables fall in.
    assert per_char("가각간") == pytest.approx(per_char("한국어"), rel=0.01)
    assert per_char("가각간") < per_char("ꆈꌠꉙ") / 2


def test_long_digit_runs_count_in_groups_of_about_three() -> None:
    digits = "".join(random.Random(1).choice("0123456789") for _ in range(9000))
    assert len(digits) / 3.5 <= raw(digits) <= len(digits) / 1.5


def test_whitespace_runs_are_cheap_but_not_free() -> None:
    assert raw("x" + " " * 3 + "y") <= 4
    # BPE merges at most ~128 spaces (16 tabs or newlines) per token
    assert 10_000 / 128 <= raw(" " * 10_000) <= 2_000
    assert 1_000 / 16 <= raw("\n" * 1_000) <= 300
    assert raw("\t" * 1_000) >= 1_000 / 16


def test_base64_blobs_count_about_one_and_a_half_chars_per_token() -> None:
    blob = base64.b64encode(random.Random(2).randbytes(6000)).decode()
    assert len(blob) / 2.0 <= raw(blob) <= len(blob) / 1.1
    # the same length of prose is far cheaper
    assert raw(blob) > 2 * raw((PROSE * 30)[: len(blob)])


def test_escapes_and_control_bytes_are_counted() -> None:
    assert raw('{"cmd": "a\\nb\\nc"}') > raw('{"cmd": "a b c"}')
    assert raw("\x00" * 100) >= 50
    assert raw("\x1b[32mok\x1b[0m") > raw("ok")


def test_lone_surrogates_do_not_crash() -> None:
    assert estimate_tokens("abc\ud800def") >= 2


# -- invariants -----------------------------------------------------------------------

texts = st.text(st.characters(codec="utf-8"), max_size=300) | st.text(
    st.sampled_from("aZ09 \n\t.,:{}\"'\\/+=_-é中😀\x00"), max_size=300
) | st.text(st.sampled_from("abcdefgh  łóęßà가한ꀀກཀሀảनก"), max_size=300) | st.lists(
    st.sampled_from(["yang", "het", "een", "kwa", "ang", "ng", "na", "dan", "ya", "the",
                     "memperbaiki", "function", "\n", "é"]), max_size=80).map(" ".join)


@given(texts)
def test_estimate_is_non_negative_and_positive_for_any_text(text: str) -> None:
    n = estimate_tokens(text)
    assert n >= 0
    assert (n == 0) == (text == "")


@given(texts, texts)
def test_adding_text_never_lowers_the_estimate(a: str, b: str) -> None:
    whole = raw(a + b)
    assert whole >= raw(a)
    assert whole >= raw(b)
    assert estimate_tokens(a + b) >= estimate_tokens(a)


@given(texts, st.integers(min_value=1, max_value=400))
def test_slicing_long_texts_never_changes_the_count(text: str, chunk: int) -> None:
    """Huge texts are counted slice by slice; with context the result is exact."""
    profile = PROVIDERS["openai"]
    whole = tokens._raw_text(text, profile)
    saved = tokens._CHUNK
    tokens._CHUNK = chunk
    try:
        sliced = tokens._raw_text(text, profile)
    finally:
        tokens._CHUNK = saved
    assert sliced == pytest.approx(whole, rel=1e-9, abs=1e-9)


@given(st.lists(texts, max_size=8))
def test_messages_add_up_exactly(contents: list[str]) -> None:
    messages = [Message(role="user", content=c) for c in contents]
    assert DEFAULT_COUNTER.messages(messages) == REQUEST_OVERHEAD + sum(
        DEFAULT_COUNTER.message(m) for m in messages
    )


@given(st.lists(texts, min_size=1, max_size=8))
@example(["À", "000000AAAAAAAAAAAAAAAAAAAAaaaaa", "AAAAAAAAAAAAAAA0000"])  # found on 3.12
def test_joining_texts_into_one_message_is_roughly_additive(contents: list[str]) -> None:
    parts = sum(raw(c) for c in contents)
    joined = raw("".join(contents))
    # a sign of another language in one part (an accented letter, a sign word) vouches for
    # the letters of the others once joined: at most _OTHER_LANGUAGE_LETTER more a letter
    # (['À', '000000AAAA...'] counted 22 joined, 15 apart)
    vouched = tokens._OTHER_LANGUAGE_LETTER * sum(ch.isalpha() for ch in "".join(contents))
    assert joined <= parts + 2 * len(contents) + vouched
    assert joined >= 0.5 * parts - 2 * len(contents)


def test_huge_inputs_are_linear_and_fast() -> None:
    text = (CODE + RECORDS + PROSE + CHINESE) * 4_000  # ~8 MB of mixed content
    start = time.perf_counter()
    n = estimate_tokens(text)
    elapsed = time.perf_counter() - start
    assert elapsed < 5.0
    unit = estimate_tokens(CODE + RECORDS + PROSE + CHINESE)
    assert n == pytest.approx(unit * 4_000, rel=0.02)
    pathological = "a" * 2_000_000 + "(" * 2_000_000 + " " * 2_000_000 + "9" * 2_000_000
    start = time.perf_counter()
    assert estimate_tokens(pathological) > 0
    assert time.perf_counter() - start < 5.0


def test_short_messages_take_microseconds() -> None:
    message = Message(role="assistant", content="Sure, I can change that flight for you. " * 2)
    counter = HeuristicCounter()
    best = math.inf
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(1_000):
            counter.message(message)
        best = min(best, (time.perf_counter() - start) / 1_000)
    assert best < 100e-6  # measured ~4 µs; the bound leaves room for loaded CI machines


# -- providers and margin ---------------------------------------------------------------


def test_provider_factors_scale_the_same_text() -> None:
    text = PROSE + CODE
    openai = raw(text, "openai")
    assert raw(text, "gemini") == pytest.approx(openai * 1.18, rel=0.01)
    assert raw(text, "anthropic") > openai
    assert raw(text, "generic") > openai


def test_unknown_providers_fall_back_to_generic() -> None:
    assert provider_profile("some-new-lab") is PROVIDERS["generic"]
    assert raw(PROSE, "some-new-lab") == raw(PROSE, "generic")
    assert provider_profile(" OpenAI ") is PROVIDERS["openai"]


def test_generic_counts_other_scripts_twice_as_heavily() -> None:
    ratio = raw(CHINESE, "generic") / raw(CHINESE, "openai")
    assert ratio >= 2 * PROVIDERS["generic"].factor * 0.95


@pytest.mark.parametrize(
    ("model", "provider"),
    [
        ("gpt-4o", "openai"),
        ("gpt-4.1-mini", "openai"),
        ("openai/gpt-5", "openai"),
        ("o1", "openai"),
        ("o3-mini", "openai"),
        ("o4-mini-2025-04-16", "openai"),
        ("chatgpt-4o-latest", "openai"),
        ("claude-sonnet-4-5", "anthropic"),
        ("anthropic/claude-3-5-haiku-latest", "anthropic"),
        ("gemini-2.5-pro", "gemini"),
        ("google/gemini-3-pro-preview", "gemini"),
        ("models/gemini-2.0-flash", "gemini"),
        ("llama-3.1-70b", "generic"),
        ("mistral-large", "generic"),
        ("omni-moderation-latest", "generic"),
        ("", "generic"),
    ],
)
def test_provider_for_model(model: str, provider: str) -> None:
    assert provider_for_model(model) == provider


def test_bad_provider_and_model_names_raise_naming_the_field() -> None:
    with pytest.raises(InvalidInput, match="provider"):
        estimate_tokens("x", 3)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="model"):
        provider_for_model(None)  # type: ignore[arg-type]


def test_safety_margin_is_applied_and_validated() -> None:
    assert DEFAULT_SAFETY_MARGIN == 0.05
    assert estimate_tokens(PROSE) == math.ceil(
        tokens._raw_text(PROSE, PROVIDERS["openai"]) * 1.05 - 1e-9
    )
    assert estimate_tokens(PROSE, safety_margin=0.5) > estimate_tokens(PROSE)
    for bad in (-0.1, 1.5, "0.1", True, float("nan")):
        with pytest.raises(InvalidInput, match="safety_margin"):
            estimate_tokens("x", safety_margin=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidInput, match="safety_margin"):
            HeuristicCounter(safety_margin=bad)  # type: ignore[arg-type]


def test_bad_text_raises_naming_the_field() -> None:
    with pytest.raises(InvalidInput, match="text"):
        estimate_tokens(b"bytes")  # type: ignore[arg-type]


# -- messages -------------------------------------------------------------------------


def test_an_empty_message_costs_its_framing() -> None:
    assert estimate_message_tokens(Message(role="assistant")) == MESSAGE_OVERHEAD
    assert estimate_messages_tokens([]) == REQUEST_OVERHEAD


def test_tool_calls_count_name_arguments_and_framing() -> None:
    args = json.dumps({"command": "grep -rn 'def save' django/db/models/base.py"})
    plain = Message(role="assistant", content="Let me look.")
    with_call = plain.model_copy(
        update={"tool_calls": [ToolCall(id="c1", name="bash", arguments=args)]}
    )
    extra = estimate_message_tokens(with_call) - estimate_message_tokens(plain)
    assert extra >= TOOL_CALL_OVERHEAD + raw(args)
    assert extra <= TOOL_CALL_OVERHEAD + estimate_tokens(args + "bash") + 2
    two_calls = plain.model_copy(
        update={"tool_calls": [ToolCall(id="c1", name="bash", arguments=args)] * 2}
    )
    assert estimate_message_tokens(two_calls) > estimate_message_tokens(with_call)


def test_name_and_reasoning_are_counted() -> None:
    base = Message(role="user", content="hello")
    named = base.model_copy(update={"name": "alice"})
    assert estimate_message_tokens(named) >= estimate_message_tokens(base) + NAME_OVERHEAD + 1
    thinking = Message(role="assistant", content="ok", reasoning="First check the date. " * 20)
    assert (
        estimate_message_tokens(thinking)
        > estimate_message_tokens(Message(role="assistant", content="ok")) + 50
    )


@pytest.mark.parametrize(
    ("provider", "image", "low"),
    [("openai", 765, 85), ("anthropic", 1600, 1600), ("gemini", 1120, 280)],
)
def test_images_and_files_count_flat_per_item(provider: str, image: int, low: int) -> None:
    huge_data = base64.b64encode(b"\x89PNG" * 250_000).decode()  # 1 MB never counts as text
    parts: list[Any] = [
        TextPart(text="What is this?"),
        ImagePart(data=huge_data, media_type="image/png"),
        ImagePart(url="https://example.com/a.png", detail="low"),
        FilePart(file_id="file-123", filename="report.pdf"),
    ]
    message = Message(role="user", content=parts)
    text_only = Message(role="user", content="What is this?")
    extra = estimate_message_tokens(message, provider) - estimate_message_tokens(
        text_only, provider
    )
    assert extra == image + low + PROVIDERS[provider].file_tokens
    assert tokens.image_tokens(parts[1], provider) == image
    assert tokens.file_tokens(parts[3], provider) == PROVIDERS[provider].file_tokens


def test_bad_messages_raise_naming_the_field() -> None:
    with pytest.raises(InvalidInput, match=r"messages\[1\]"):
        estimate_messages_tokens([Message(role="user"), {"role": "user"}])  # type: ignore[list-item]
    with pytest.raises(InvalidInput, match="messages"):
        estimate_messages_tokens("hello")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="message"):
        estimate_message_tokens({"role": "user"})  # type: ignore[arg-type]


# -- tool definitions -----------------------------------------------------------------

SCHEMA = {
    "type": "object",
    "properties": {
        "user_id": {"type": "string", "description": "The user id, such as 'sara_doe_496'."},
        "cabin": {"type": "string", "enum": ["basic_economy", "economy", "business"]},
    },
    "required": ["user_id"],
}


def test_tool_definition_forms_count_the_same() -> None:
    openai_form = {
        "type": "function",
        "function": {
            "name": "get_user_details",
            "description": "Get a user.",
            "parameters": SCHEMA,
        },
    }
    bare = {"name": "get_user_details", "description": "Get a user.", "parameters": SCHEMA}
    anthropic = {"name": "get_user_details", "description": "Get a user.", "input_schema": SCHEMA}
    n = estimate_tool_tokens([openai_form])
    assert n == estimate_tool_tokens([bare]) == estimate_tool_tokens([anthropic])
    schema_text = json.dumps(SCHEMA, separators=(",", ":"))
    assert n >= TOOLS_BLOCK_OVERHEAD + TOOL_DEFINITION_OVERHEAD + raw(schema_text)
    assert estimate_tool_tokens([bare, bare]) > n
    assert estimate_tool_tokens([]) == 0


def test_builtin_tools_and_schemaless_tools_are_counted() -> None:
    assert estimate_tool_tokens([{"type": "web_search"}]) > TOOLS_BLOCK_OVERHEAD
    assert estimate_tool_tokens([{"name": "ping"}]) > TOOLS_BLOCK_OVERHEAD


@pytest.mark.parametrize(
    ("tools", "field"),
    [
        ("not a list", "tools"),
        ([42], r"tools\[0\]"),
        (
            [{"name": "ok"}, {"type": "function", "function": {"description": "x"}}],
            r"tools\[1\]\.function\.name",
        ),
        ([{"name": "x", "parameters": "{}"}], r"tools\[0\]\.parameters"),
        ([{"name": "x", "input_schema": [1]}], r"tools\[0\]\.input_schema"),
        ([{"name": "x", "description": 5}], r"tools\[0\]\.description"),
        ([{"type": "function", "function": "x"}], r"tools\[0\]\.function"),
        ([{"name": "x", "parameters": {"default": object()}}], r"tools\[0\]"),
    ],
)
def test_bad_tool_definitions_raise_naming_the_field(tools: Any, field: str) -> None:
    with pytest.raises(InvalidInput, match=field):
        estimate_tool_tokens(tools)


def test_heuristic_counter_implements_the_protocol() -> None:
    counter: TokenCounter = HeuristicCounter("gemini", safety_margin=0.1)
    message = Message(role="user", content=PROSE)
    assert counter.text(PROSE) == estimate_tokens(PROSE, "gemini", safety_margin=0.1)
    assert counter.message(message) == estimate_message_tokens(message, "gemini", safety_margin=0.1)
    assert counter.messages([message]) == estimate_messages_tokens(
        [message], "gemini", safety_margin=0.1
    )
    assert counter.tools([{"name": "x"}]) == estimate_tool_tokens(
        [{"name": "x"}], "gemini", safety_margin=0.1
    )
    assert "gemini" in repr(counter)
    assert DEFAULT_COUNTER.text(PROSE) == estimate_tokens(PROSE)


# -- calibration ------------------------------------------------------------------------


def test_default_calibration_changes_nothing() -> None:
    calibration = Calibration()
    assert (calibration.ratio, calibration.samples) == (1.0, 0)
    assert calibration.apply(1234) == 1234


def test_first_report_sets_the_ratio_then_reports_are_averaged() -> None:
    first = Calibration().update(reported=1100, estimated=1000)
    assert first.ratio == pytest.approx(1.1)
    assert first.samples == 1
    second = first.update(reported=900, estimated=1000)
    assert second.ratio == pytest.approx(1.0)
    assert second.samples == 2


def test_later_reports_are_smoothed_not_replaced() -> None:
    calibration = Calibration(ratio=1.0, samples=100)
    moved = calibration.update(reported=2000, estimated=1000)
    assert 1.0 < moved.ratio < 1.5  # one odd report moves it by the minimum weight only
    for _ in range(40):
        moved = moved.update(reported=1500, estimated=1000)
    assert moved.ratio == pytest.approx(1.5, rel=1e-3)


def test_ratio_is_clamped_and_absurd_reports_are_ignored() -> None:
    assert Calibration().update(3500, 1000).ratio == CALIBRATION_MAX_RATIO
    assert Calibration().update(300, 1000).ratio == CALIBRATION_MIN_RATIO
    calibration = Calibration(ratio=1.2, samples=3)
    assert calibration.update(50_000, 1000) is calibration  # 50x: a wrong session, not news
    assert calibration.update(10, 1000) is calibration
    assert calibration.update(0, 1000) is calibration  # no usage reported
    assert calibration.update(1000, 0) is calibration


def test_calibration_is_frozen_and_update_is_pure() -> None:
    calibration = Calibration()
    calibration.update(1500, 1000)
    assert calibration.ratio == 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        calibration.ratio = 2.0  # type: ignore[misc]


def test_apply_rounds_up() -> None:
    assert Calibration(ratio=0.5).apply(3) == 2
    assert Calibration(ratio=1.0).apply(0) == 0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"ratio": 5.0}, "calibration.ratio"),
        ({"ratio": float("nan")}, "calibration.ratio"),
        ({"ratio": True}, "calibration.ratio"),
        ({"samples": -1}, "calibration.samples"),
        ({"samples": 1.5}, "calibration.samples"),
    ],
)
def test_bad_calibrations_raise_naming_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput, match=field):
        Calibration(**kwargs)


@pytest.mark.parametrize(
    ("reported", "estimated", "field"),
    [(-1, 10, "reported"), (10, -1, "estimated"), (1.5, 10, "reported"), (True, 10, "reported")],
)
def test_bad_reports_raise_naming_the_field(reported: Any, estimated: Any, field: str) -> None:
    with pytest.raises(InvalidInput, match=field):
        Calibration().update(reported, estimated)


@settings(max_examples=200)
@given(st.lists(st.tuples(st.integers(0, 10**7), st.integers(0, 10**7)), max_size=30))
def test_any_sequence_of_reports_keeps_the_ratio_in_range(reports: list[tuple[int, int]]) -> None:
    calibration = Calibration()
    for reported, estimated in reports:
        calibration = calibration.update(reported, estimated)
        assert CALIBRATION_MIN_RATIO <= calibration.ratio <= CALIBRATION_MAX_RATIO
    assert calibration.samples <= len(reports)


# -- hybrid estimate ----------------------------------------------------------------------


def test_hybrid_is_the_reported_anchor_plus_the_calibrated_delta() -> None:
    calibration = Calibration(ratio=1.1, samples=1)
    assert hybrid_estimate(1000, 900, 1000, calibration) == 1000 + 110
    assert hybrid_estimate(1000, 900, 900, calibration) == 1000


def test_hybrid_falls_back_when_the_view_shrank_or_there_is_no_anchor() -> None:
    calibration = Calibration(ratio=0.9, samples=2)
    # after a compaction the view is smaller than the anchored one: the anchor is stale
    assert hybrid_estimate(50_000, 48_000, 20_000, calibration) == calibration.apply(20_000)
    assert hybrid_estimate(0, 0, 20_000, calibration) == calibration.apply(20_000)


@given(
    st.integers(1, 10**6),
    st.integers(0, 10**6),
    st.integers(0, 10**6),
    st.integers(0, 10**6),
    st.floats(CALIBRATION_MIN_RATIO, CALIBRATION_MAX_RATIO),
)
def test_hybrid_grows_with_the_view(
    reported: int, anchor: int, current: int, more: int, ratio: float
) -> None:
    calibration = Calibration(ratio=ratio)
    current = max(current, anchor)
    assert hybrid_estimate(reported, anchor, current + more, calibration) >= hybrid_estimate(
        reported, anchor, current, calibration
    )
    assert hybrid_estimate(reported, anchor, current, calibration) >= reported


@given(st.integers(10, 10**6), st.floats(0.55, 1.9), st.integers(0, 10**6))
def test_after_one_report_the_anchor_adds_nothing_to_the_ratio(
    estimated: int, ratio: float, more: int
) -> None:
    """What the calibrated benchmark measures: after a first report, the hybrid estimate
    of any view that extends the reported one is the ratio applied to the whole estimate
    (the anchor cancels), so one early report is exactly as good as its ratio."""
    reported = round(estimated * ratio)
    calibration = Calibration().update(reported, estimated)
    assert calibration.samples == 1
    assert calibration.ratio == pytest.approx(reported / estimated, rel=1e-12)
    current = estimated + more
    hybrid = hybrid_estimate(reported, estimated, current, calibration)
    assert abs(hybrid - calibration.apply(current)) <= 1  # float rounding of the two ceilings


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((-1, 0, 0), "anchor_reported"),
        ((0, -1, 0), "anchor_estimated"),
        ((0, 0, 2.5), "current_estimated"),
    ],
)
def test_bad_hybrid_arguments_raise_naming_the_field(
    args: tuple[Any, Any, Any], field: str
) -> None:
    reported, anchor, current = args
    with pytest.raises(InvalidInput, match=field):
        hybrid_estimate(reported, anchor, current, Calibration())
    with pytest.raises(InvalidInput, match="calibration"):
        hybrid_estimate(1, 1, 1, 1.0)  # type: ignore[arg-type]
