"""Model limits: precedence, name normalisation, output reserve, learned limits, the generator."""

from __future__ import annotations

import importlib.util
import io
import json
import zipfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.core.errors import InvalidInput
from shared.core.limits import (
    FALLBACK_CONTEXT_WINDOW,
    LimitBook,
    ModelLimits,
    Registry,
    canonical_model_name,
    default_registry,
    known_window,
    model_limits,
    output_reserve,
    plausible_unowned,
    stated_limit,
    window_in_name,
)
from shared.core.records import SessionState

ROOT = Path(__file__).resolve().parents[1]
_SPEC = importlib.util.spec_from_file_location("gen_model_limits",
                                               ROOT / "scripts" / "gen_model_limits.py")
assert _SPEC is not None and _SPEC.loader is not None
gen = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(gen)

TINY = Registry.from_json({"_meta": {"litellm_version": "9.9"}, "models": {
    "gpt-4o": [128000, 16384, "openai"],
    "gpt-4o-2024-05-13": [128000, 4096, "openai"],
    "azure/gpt-4o": [64000, 16384, "azure"],
    "anthropic.claude-3-5-sonnet-20240620-v1:0": [200000, 4096, "bedrock"],
    "vertex_ai/claude-sonnet-4-5": [200000, 64000, "vertex_ai-anthropic_models"],
    "claude-sonnet-4-5": [200000, 64000, "anthropic"],
    "mistral/mistral-large-latest": [262144, 262144, "mistral"],
    "together_ai/mistral-large": [32768, 4096, "together_ai"],
    "hosted/qwen-x": [32768, 8192, "hosted"],
    "other/qwen-x": [32768, 8192, "other"],
    "third/qwen-x": [131072, 8192, "third"],
}})


# -- precedence -------------------------------------------------------------------------
def test_precedence_learned_beats_override_beats_registry() -> None:
    assert model_limits("gpt-4o", registry=TINY).source == "registry"
    over = model_limits("gpt-4o", overrides={"gpt-4o": 50_000}, registry=TINY)
    assert (over.source, over.context_window, over.max_output_tokens) == ("override", 50_000,
                                                                          16384)
    learned = model_limits("gpt-4o", overrides={"gpt-4o": 50_000}, learned={"GPT-4o ": 30_000},
                           registry=TINY)
    assert (learned.source, learned.context_window) == ("learned", 30_000)
    assert "30000" in learned.detail


def test_override_with_model_limits_and_canonical_key() -> None:
    given_limits = ModelLimits("x", 90_000, 2_000, "registry", "mine")
    got = model_limits("azure/gpt-4o-2024-08-06", overrides={"gpt-4o": given_limits},
                       registry=TINY)
    assert (got.model, got.context_window, got.max_output_tokens, got.source) == (
        "azure/gpt-4o-2024-08-06", 90_000, 2_000, "override")
    assert "'gpt-4o'" in got.detail


def test_learned_matches_the_exact_model_string_only() -> None:
    """A limit learned on one deployment must not shrink another."""
    assert model_limits("azure/gpt-4o", learned={"gpt-4o": 9_000}, registry=TINY).source \
        == "registry"


def test_provider_default_and_fallback_are_visible() -> None:
    claude = model_limits("claude-opus-99", registry=TINY)
    assert (claude.source, claude.context_window) == ("provider_default", 200_000)
    assert "claude" in claude.detail
    assert model_limits("gemini-7-ultra", registry=TINY).context_window == 1_048_576
    assert model_limits("gpt-4o-mini-2099-01-01", registry=Registry({}, "empty")
                        ).context_window == 128_000
    unknown = model_limits("acme-chat-7b", registry=TINY)
    assert (unknown.source, unknown.context_window) == ("fallback", FALLBACK_CONTEXT_WINDOW)
    assert "unknown" in unknown.detail


# -- normalisation ------------------------------------------------------------------------
@pytest.mark.parametrize(("model", "window", "key", "how"), [
    ("gpt-4o", 128000, "gpt-4o", "exact"),
    ("OpenAI/GPT-4o", 128000, "gpt-4o", "prefix"),
    ("gpt-4o-2024-05-13", 128000, "gpt-4o-2024-05-13", "exact"),  # a snapshot keeps its row
    ("gpt-4o-2024-08-06", 128000, "gpt-4o", "canonical"),
    ("gpt-4o-latest", 128000, "gpt-4o", "canonical"),
    ("azure/gpt-4o", 64000, "azure/gpt-4o", "exact"),
    ("azure/gpt-4o-2024-11-20", 64000, "azure/gpt-4o", "canonical"),  # routed provider wins
    ("bedrock/anthropic.claude-3-5-sonnet-20240620-v1:0", 200000,
     "anthropic.claude-3-5-sonnet-20240620-v1:0", "prefix"),
    ("eu.anthropic.claude-sonnet-4-5-20250929-v1:0", 200000, "claude-sonnet-4-5", "canonical"),
    ("claude-sonnet-4-5@20250929", 200000, "vertex_ai/claude-sonnet-4-5", "canonical"),
    ("openrouter/anthropic/claude-sonnet-4.5", 200000, "claude-sonnet-4-5", "canonical"),
    ("mistral-large-latest", 262144, "mistral/mistral-large-latest", "prefix"),
    ("qwen-x", 32768, "hosted/qwen-x", "canonical"),  # most common window, then key order
])
def test_registry_lookup_normalises(model: str, window: int, key: str, how: str) -> None:
    found = TINY.lookup(model)
    assert found is not None
    entry, matched = found
    assert (entry.context_window, entry.key, matched) == (window, key, how)
    limits = model_limits(model, registry=TINY)
    assert repr(key) in limits.detail and limits.source == "registry"


@pytest.mark.parametrize(("raw", "canonical"), [
    ("bedrock/us.anthropic.claude-3-5-sonnet-20241022-v2:0", "claude-3-5-sonnet"),
    ("vertex_ai/claude-3-5-sonnet@20240620", "claude-3-5-sonnet"),
    ("models/gemini-2.5-flash-preview-05-20", "gemini-2-5-flash-preview"),
    ("gpt-4o-2024-08-06", "gpt-4o"),
    ("ollama/llama3.1:latest", "llama3-1"),
    ("command-r-plus-08-2024", "command-r-plus"),
    ("gpt-3.5-turbo-0125", "gpt-3-5-turbo"),
])
def test_canonical_model_name(raw: str, canonical: str) -> None:
    assert canonical_model_name(raw) == canonical


def test_placeholder_output_caps_are_not_used_as_the_reserve() -> None:
    """litellm copies the window into max_output_tokens for many rows."""
    limits = model_limits("mistral/mistral-large-latest", registry=TINY)
    assert limits.max_output_tokens == 8_192  # the mistral family default
    assert "no usable output cap" in limits.detail
    assert output_reserve(limits) == 8_192


def test_packaged_registry_covers_the_big_vendors() -> None:
    registry = default_registry()
    assert len(registry) > 1000
    assert "litellm" in registry.source
    for model, window in (("gpt-4o", 128_000), ("claude-sonnet-4-5", 200_000),
                          ("gemini-2.5-pro", 1_048_576), ("openai/gpt-4.1", 1_047_576),
                          ("anthropic.claude-3-5-sonnet-20240620-v1:0", 200_000)):
        limits = model_limits(model)
        assert (limits.source, limits.context_window) == ("registry", window), limits


def test_bad_input_names_the_field() -> None:
    with pytest.raises(InvalidInput, match="model"):
        model_limits("  ")
    with pytest.raises(InvalidInput, match=r"overrides\['gpt-4o'\]"):
        model_limits("gpt-4o", overrides={"gpt-4o": 0}, registry=TINY)
    with pytest.raises(InvalidInput, match="learned"):
        model_limits("gpt-4o", learned={"gpt-4o": True}, registry=TINY)
    with pytest.raises(InvalidInput, match="context_window"):
        ModelLimits("m", 0, 10, "registry", "")
    with pytest.raises(InvalidInput, match=r"models\['m'\]\[0\]"):
        Registry.from_json({"models": {"m": [-1, None, "p"]}})
    with pytest.raises(InvalidInput, match="models"):
        Registry.from_json([1, 2])


def test_registry_load_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "limits.json"
    path.write_text(json.dumps({"models": {"acme-1": [4096, None, "acme"]}}))
    limits = model_limits("acme-1", registry=Registry.load(path))
    assert (limits.context_window, limits.max_output_tokens) == (4096, 2048)
    with pytest.raises(InvalidInput, match="cannot read"):
        Registry.load(tmp_path / "missing.json")


# -- output reserve ------------------------------------------------------------------------
def test_output_reserve_defaults_requested_and_capped() -> None:
    limits = ModelLimits("m", 128_000, 16_384, "registry", "")
    assert output_reserve(limits) == 16_384
    assert output_reserve(limits, 1_000) == 1_000
    assert output_reserve(limits, 200_000) == 128_000 - 1024
    tiny = ModelLimits("m", 1500, 4096, "learned", "")
    assert output_reserve(tiny) == 1500 - 750  # floor is half the window when it is small
    with pytest.raises(InvalidInput, match="max_tokens"):
        output_reserve(limits, 0)
    with pytest.raises(InvalidInput, match="min_input_tokens"):
        output_reserve(limits, min_input_tokens=0)


def test_the_reserve_stops_at_a_known_output_cap_and_leaves_room_for_the_fixed_part() -> None:
    """A provider refuses max_tokens above the model's output cap anyway: the reserve is
    that cap where the registry (or the caller) states it, not where it is a guess. And
    it leaves the window room for what every request must carry (system prompt, tools,
    the newest message), not only for ``min_input_tokens``."""
    gpt = model_limits("gpt-4o")
    assert output_reserve(gpt, 118_000) == 16_384
    guessed = model_limits("my-llama-32k")
    assert guessed.source == "fallback"
    assert output_reserve(guessed, 200_000) == 32_000 - 1024  # 4,000 is a guess, not a cap
    assert output_reserve(guessed, 200_000, fixed_tokens=6_000) == 32_000 - 6_000 - 1024
    assert output_reserve(guessed, 2_000, fixed_tokens=6_000) == 2_000
    assert output_reserve(guessed, 200_000, fixed_tokens=31_000) == 32_000 - 31_000
    assert output_reserve(guessed, 200_000, fixed_tokens=40_000) == 32_000 - 1024  # no room
    caller = model_limits("acme", overrides={"acme": ModelLimits("acme", 50_000, 5_000,
                                                                 "override", "")})
    assert output_reserve(caller, 20_000) == 5_000
    assert output_reserve(model_limits("gpt-4o", learned={"gpt-4o": 60_000}), 30_000) \
        == 16_384  # a learned window keeps the registry's output cap


@given(window=st.integers(1, 3_000_000), out=st.integers(1, 3_000_000),
       max_tokens=st.none() | st.integers(1, 5_000_000), floor=st.integers(1, 100_000))
def test_output_reserve_always_leaves_an_input_budget(window: int, out: int,
                                                      max_tokens: int | None, floor: int) -> None:
    limits = ModelLimits("m", window, out, "registry", "")
    reserve = output_reserve(limits, max_tokens, min_input_tokens=floor)
    assert 0 <= reserve <= (out if max_tokens is None else max_tokens)
    assert window - reserve >= max(1, min(floor, window // 2))


# -- learned limits ----------------------------------------------------------------------------
def test_limit_book_keeps_the_smallest_credible_limit() -> None:
    book = LimitBook()
    assert book.learn("GPT-4o", 128_000) is True
    assert book.learn("gpt-4o", 200_000) is False  # larger: kept smaller
    assert book.learn("gpt-4o", 100) is False  # not credible: a misparse
    assert book.learn("gpt-4o", 10**12) is False
    assert book.learn("gpt-4o", 64_000) is True
    assert book.get(" gpt-4o ") == 64_000 and len(book) == 1
    assert model_limits("gpt-4o", learned=book.as_mapping(), registry=TINY).context_window \
        == 64_000
    copy = book.as_mapping()
    copy["gpt-4o"] = 1
    assert book.get("gpt-4o") == 64_000  # as_mapping is a copy
    assert book.forget("gpt-4o") is True and book.get("gpt-4o") is None
    with pytest.raises(InvalidInput, match="limit"):
        book.learn("gpt-4o", "8192")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="model"):
        book.learn("", 8192)
    assert LimitBook({"m": 9000}).get("m") == 9000


@given(st.lists(st.integers(-10, 10**9), max_size=30))
def test_limit_book_holds_the_minimum_of_credible_values(values: list[int]) -> None:
    book = LimitBook()
    for v in values:
        book.learn("m", v)
    credible = [v for v in values if LimitBook.MIN_CREDIBLE <= v <= LimitBook.MAX_CREDIBLE]
    assert book.get("m") == (min(credible) if credible else None)


# -- generator ----------------------------------------------------------------------------------
def _wheel(tmp_path: Path, registry: dict[str, object]) -> Path:
    path = tmp_path / "litellm-1.2.3-py3-none-any.whl"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("litellm/model_prices_and_context_window_backup.json", json.dumps(registry))
        zf.writestr("litellm-1.2.3.dist-info/METADATA", "Name: litellm\nVersion: 1.2.3\n")
    path.write_bytes(buffer.getvalue())
    return path


def test_generator_keeps_chat_models_and_records_the_version(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path, {
        "sample_spec": {"mode": "one of: chat, embedding", "max_input_tokens": "n"},
        "b-chat": {"mode": "chat", "max_input_tokens": 8192, "max_output_tokens": 1024,
                   "litellm_provider": "p"},
        "a-old": {"mode": "completion", "max_tokens": 4097, "litellm_provider": "q"},
        "embed": {"mode": "embedding", "max_input_tokens": 8191, "litellm_provider": "p"},
        "img": {"mode": "image_generation", "litellm_provider": "p"},
        "no-window": {"mode": "chat", "litellm_provider": "p"},
    })
    out = tmp_path / "out.json"
    assert gen.main(["--wheel", str(wheel), "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["_meta"]["litellm_version"] == "1.2.3" and data["_meta"]["count"] == 2
    assert list(data["models"]) == ["a-old", "b-chat"]
    assert data["models"]["b-chat"] == [8192, 1024, "p"]
    assert data["models"]["a-old"] == [4097, None, "q"]
    assert model_limits("b-chat", registry=Registry.from_json(data)).detail.startswith(
        "registry: litellm 1.2.3")


def test_committed_registry_file_has_the_generator_header() -> None:
    data = json.loads((ROOT / "shared" / "core" / "data" / "model_limits.json").read_text())
    meta = data["_meta"]
    assert meta["generator"] == "scripts/gen_model_limits.py" and meta["litellm_version"]
    assert meta["count"] == len(data["models"])
    assert list(data["models"]) == sorted(data["models"])


@pytest.mark.parametrize(("name", "window"), [
    ("acme-chat-8k", 8_000), ("house/llama-3-8b-instruct-262k", 262_000),
    ("qwen2.5-7b-instruct-1m", 1_000_000), ("local_model_32K_v2", 32_000),
    ("claude-house-9k", 9_000),  # more specific than the family's default
    ("qwen2.5:7b-instruct-q4_K_M", None), ("mixtral-8x7b", None), ("tiny-0.1k", None),
    ("house-model", None),
])
def test_an_unknown_model_s_name_can_state_its_window(name: str, window: int | None) -> None:
    assert window_in_name(name) == window
    limits = model_limits(name, registry=TINY)
    if window is None:
        assert limits.source in ("fallback", "provider_default")
        return
    assert (limits.context_window, limits.source) == (window, "fallback")
    assert "its name states" in limits.detail and limits.max_output_tokens <= window // 4


def test_a_known_model_s_name_is_not_read_for_a_size() -> None:
    """The registry's figure wins over what the name seems to say."""
    registry = Registry.from_json({"models": {"acme-chat-8k": [8192, 2048, "acme"]}})
    assert model_limits("acme-chat-8k", registry=registry).context_window == 8192


@pytest.mark.parametrize(("limit", "window", "learned"), [
    (32_000, 128_000, 32_000), (128_000, 128_000, None), (1_000_000, 128_000, None),
    (100, 128_000, None), (None, 128_000, None), (0, 128_000, None)])
def test_a_stated_limit_is_learned_only_below_the_window(limit: int | None, window: int,
                                                          learned: int | None) -> None:
    assert stated_limit(limit, window) == learned


def test_an_unowned_learned_window_is_plausible_only_near_a_known_window() -> None:
    """Audit F1: a window stored without its owner is another model's where it is below
    a quarter of the model's known window; anything goes where the window is a guess."""
    assert plausible_unowned(16_000, None)
    assert plausible_unowned(16_000, 24_000) and plausible_unowned(32_000, 128_000)
    assert not plausible_unowned(31_999, 128_000)
    assert not plausible_unowned(16_000, 1_047_576)
    assert known_window(model_limits("gpt-4.1")) == 1_047_576
    assert known_window(model_limits("gpt-4o", overrides={"gpt-4o": 24_000})) == 24_000
    assert known_window(model_limits("claude-future-9")) == 200_000  # a family default
    assert known_window(model_limits("my-local-llama")) is None  # a guess


def test_learned_for_keeps_an_owned_window_and_judges_an_unowned_one() -> None:
    """Audit F1: an owned window is its owner's whatever the known window (which is not
    even looked up); an unowned one is the state's model's only where plausible for it."""
    def never() -> int | None:
        raise AssertionError("looked up for an owned window")

    owned = SessionState(model="gpt-4.1", learned_window=16_000, learned_model="gpt-4o")
    assert owned.learned_for("gpt-4o", never) == 16_000
    assert owned.learned_for("gpt-4.1", never) == 0
    unowned = SessionState(model="gpt-4.1", window=1_047_576, learned_window=16_000)
    assert unowned.unowned_learned() and not owned.unowned_learned()
    assert unowned.learned_for("gpt-4.1", lambda: 1_047_576) == 0
    assert unowned.learned_for("gpt-4.1", lambda: None) == 16_000
    assert unowned.learned_for("gpt-4.1", lambda: 60_000) == 16_000
    assert unowned.learned_for("gpt-4o", lambda: None) == 0  # not the state's model
    assert SessionState(model="gpt-4.1").learned_for("gpt-4.1", never) == 0


def test_a_worker_judges_an_unowned_window_against_the_window_the_guard_used() -> None:
    """Audit F1: without the guard's overrides, the state's ``window`` (what the last guard
    budgeted the model with) stands for the known window, else the registry's: the
    worker takes what the guard took."""
    assert SessionState(model="gpt-4.1", window=1_047_576,
                        learned_window=16_000).stored_learned() == 0
    assert SessionState(model="gpt-4.1", learned_window=16_000).stored_learned() == 0
    assert SessionState(model="gpt-4o", window=16_000,  # the guard took it (24k override)
                        learned_window=16_000).stored_learned() == 16_000
    assert SessionState(model="my-local-llama", window=128_000,
                        learned_window=4_096).stored_learned() == 0
    assert SessionState(model="my-local-llama", learned_window=4_096).stored_learned() == 4_096
    assert SessionState(model="gpt-4.1", window=1_047_576, learned_window=16_000,
                        learned_model="gpt-4.1").stored_learned() == 16_000  # owned
