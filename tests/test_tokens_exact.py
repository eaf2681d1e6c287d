"""The optional exact counter (tiktoken) and the heuristic measured against it.

Skips with a clear message when tiktoken is not installed or the tokenizer
files of ``../shared/data/tokenizers`` are absent.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import statistics
import sysconfig
from pathlib import Path
from typing import Any

import pytest

from shared.core import tokens_exact
from shared.core.errors import ConfigError
from shared.core.messages import FilePart, ImagePart, Message, TextPart, ToolCall
from shared.core.tokens import DEFAULT_COUNTER, HeuristicCounter, estimate_tokens, image_tokens
from shared.core.tokens_exact import (
    KNOWN_ENCODINGS,
    TOKENS_PER_MESSAGE,
    TOKENS_PER_REQUEST,
    TiktokenCounter,
    build_counter,
    exact_counter_available,
    load_encoding,
)
from tests.conftest import DATA_DIR
from tests.strategies import load_transcripts

tiktoken = pytest.importorskip("tiktoken", reason="tiktoken is an optional extra: not installed")
TOKENIZERS = DATA_DIR / "tokenizers"


@pytest.fixture(scope="module")
def tokenizers() -> Path:
    if not (TOKENIZERS / "o200k_base.tiktoken").is_file():
        pytest.skip(f"tokenizer files not found at {TOKENIZERS} (the ../shared/data kit)")
    return TOKENIZERS


@pytest.fixture(scope="module")
def o200k(tokenizers: Path) -> TiktokenCounter:
    return TiktokenCounter("o200k_base", tokenizers)


def test_known_ids(tokenizers: Path) -> None:
    assert load_encoding("o200k_base", tokenizers).encode("hello world") == [24912, 2375]
    assert load_encoding("cl100k_base", tokenizers).encode("hello world") == [15339, 1917]
    assert exact_counter_available("o200k_base", tokenizers)


def test_patterns_and_special_tokens_match_tiktoken(
    tokenizers: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Our copies of the published encoding parameters equal tiktoken's own."""
    import tiktoken_ext.openai_public as public

    for name, spec in KNOWN_ENCODINGS.items():
        ranks = load_encoding(name, tokenizers)._mergeable_ranks
        monkeypatch.setattr(public, "load_tiktoken_bpe", lambda *_a, _r=ranks, **_k: _r)
        params = public.ENCODING_CONSTRUCTORS[name]()
        assert params["pat_str"] == spec.pat_str
        assert params["special_tokens"] == dict(spec.special_tokens)


def test_message_framing_follows_the_cookbook(o200k: TiktokenCounter) -> None:
    assert o200k.messages([]) == TOKENS_PER_REQUEST == 3
    # 3 framing + "user" (1) + "hello world" (2)
    assert o200k.message(Message(role="user", content="hello world")) == TOKENS_PER_MESSAGE + 3
    named = Message(role="user", content="hello world", name="alice")
    assert o200k.message(named) == TOKENS_PER_MESSAGE + 3 + 1 + o200k.text("alice")
    assert o200k.text("") == 0
    assert o200k.text("<|endoftext|>") > 1  # special-token text counts as ordinary text


def test_tool_calls_are_framed_like_messages(o200k: TiktokenCounter) -> None:
    args = '{"user_id": "omar_davis_3817"}'
    message = Message(
        role="assistant", tool_calls=[ToolCall(id="c1", name="get_user_details", arguments=args)]
    )
    expected = (
        TOKENS_PER_MESSAGE
        + o200k.text("assistant")
        + TOKENS_PER_MESSAGE
        + o200k.text("functions.get_user_details")
        + o200k.text(args)
    )
    assert o200k.message(message) == expected


def test_media_use_the_flat_figures(o200k: TiktokenCounter) -> None:
    image = ImagePart(url="https://example.com/cat.png")
    message = Message(role="user", content=[TextPart(text="hi"), image, FilePart(file_id="f1")])
    plain = Message(role="user", content="hi")
    assert o200k.message(message) - o200k.message(plain) == image_tokens(image) + 3_000


def test_tool_definitions(o200k: TiktokenCounter) -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    openai_form = {"type": "function", "function": {"name": "search", "parameters": schema}}
    bare = {"name": "search", "input_schema": schema}
    assert o200k.tools([]) == 0
    assert o200k.tools([openai_form]) == o200k.tools([bare]) > o200k.text(json.dumps(schema))


def test_build_counter_names_the_two_counters(tokenizers: Path, tmp_path: Path) -> None:
    assert build_counter() is DEFAULT_COUNTER
    assert build_counter("heuristic", encoding="nonsense", encoding_dir=tmp_path) is DEFAULT_COUNTER
    exact = build_counter("tiktoken", encoding="cl100k_base", encoding_dir=tokenizers)
    assert isinstance(exact, TiktokenCounter)
    assert repr(exact) == "TiktokenCounter(encoding='cl100k_base')"
    assert exact.text("hello world") == 2
    with pytest.raises(ConfigError, match="not readable"):
        build_counter("tiktoken", encoding_dir=tmp_path)
    with pytest.raises(ConfigError, match="heuristic, tiktoken"):
        build_counter("exact")


def test_missing_file_wrong_hash_and_unknown_names_raise_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not readable"):
        TiktokenCounter("o200k_base", tmp_path)
    (tmp_path / "o200k_base.tiktoken").write_bytes(b"aGVsbG8= 0\n")
    with pytest.raises(ConfigError, match="sha256"):
        TiktokenCounter("o200k_base", tmp_path)
    with pytest.raises(ConfigError, match="checksum is not known"):
        TiktokenCounter("p50k_base", tmp_path)
    with pytest.raises(ConfigError, match="encoding"):
        load_encoding("")
    assert not exact_counter_available("o200k_base", tmp_path)


def test_corrupt_lines_raise_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = b"aGVsbG8= 0\nnot-base64!! 1\n"
    spec = tokens_exact._EncodingSpec(
        sha256=hashlib.sha256(raw).hexdigest(), pat_str=r"\w+", special_tokens={}
    )
    monkeypatch.setitem(tokens_exact.KNOWN_ENCODINGS, "tiny_test", spec)
    (tmp_path / "tiny_test.tiktoken").write_bytes(raw)
    with pytest.raises(ConfigError, match="line 2"):
        load_encoding("tiny_test", tmp_path)


def test_tiktoken_registry_failures_raise_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(name: str) -> Any:
        raise OSError("no network")

    tokens_exact._load.cache_clear()
    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    with pytest.raises(ConfigError, match="encoding_dir"):
        TiktokenCounter("o200k_base")
    assert not exact_counter_available("o200k_base")
    tokens_exact._load.cache_clear()


def test_missing_tiktoken_raises_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_tiktoken(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "tiktoken":
            raise ImportError("No module named 'tiktoken'")
        return real_import(name, *args, **kwargs)

    tokens_exact._load.cache_clear()
    monkeypatch.setattr(builtins, "__import__", no_tiktoken)
    with pytest.raises(ConfigError, match="pip install"):
        TiktokenCounter("o200k_base", TOKENIZERS)
    tokens_exact._load.cache_clear()


# -- the heuristic against the real tokenizer -------------------------------------------

SAMPLES = {
    "prose": (
        "Before taking any actions that update the booking database, you must list the "
        "action details and obtain explicit user confirmation to proceed. You should not "
        "provide any information or procedures not provided by the user or the tools."
    ),
    "code": (
        "def apply(self, estimate: int) -> int:\n"
        '    """Correct the estimate by the learned ratio."""\n'
        "    if estimate < 0:\n"
        "        raise ValueError(f'negative: {estimate}')\n"
        "    return math.ceil(estimate * self.ratio)\n"
    ),
    "json": json.dumps(
        {
            "reservation_id": "ZFA04Y",
            "flights": [
                {"origin": "SFO", "destination": "JFK", "date": "2024-05-20", "price": 1024}
            ],
            "payment_id": "credit_card_7815826",
        }
    ),
}


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_heuristic_is_close_on_each_content_class(kind: str, o200k: TiktokenCounter) -> None:
    text = SAMPLES[kind] * 5
    assert estimate_tokens(text, safety_margin=0.0) == pytest.approx(o200k.text(text), rel=0.15)


def test_heuristic_targets_on_the_dev_sessions(data_dir: Path, o200k: TiktokenCounter) -> None:
    """No session underestimated by more than 5%; the median overestimate at most 15%."""
    counter = HeuristicCounter()
    errors = []
    for _, messages in load_transcripts(data_dir):
        truth = o200k.messages(messages)
        errors.append(counter.messages(messages) / truth - 1)
    assert min(errors) >= -0.05
    assert statistics.median(errors) <= 0.15
    chars_over_four = []
    for _, messages in load_transcripts(data_dir):
        text = sum(len(m.text()) + sum(len(c.arguments) for c in m.tool_calls) for m in messages)
        chars_over_four.append(text / 4 / o200k.messages(messages) - 1)
    assert sum(e < 0 for e in chars_over_four) > len(chars_over_four) / 2  # the naive rule


STDLIB_FILES = (
    "argparse.py",
    "asyncio/base_events.py",
    "csv.py",
    "dataclasses.py",
    "difflib.py",
    "email/message.py",
    "http/client.py",
    "json/decoder.py",
    "LICENSE.txt",
    "pydoc_data/topics.py",
    "textwrap.py",
    "typing.py",
    "unittest/mock.py",
)
"""Text the heuristic's constants were not fitted on: the standard library of the
interpreter running the tests (code, a licence, help text)."""


def test_heuristic_targets_hold_on_text_outside_the_sessions(o200k: TiktokenCounter) -> None:
    """The uncalibrated targets, per file, on the standard library and on JSON built from
    this interpreter's configuration (indented and compact)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [
        (stdlib / name).read_text(encoding="utf-8")[:40_000]
        for name in STDLIB_FILES
        if (stdlib / name).is_file()
    ]
    if len(texts) < len(STDLIB_FILES) // 2:
        pytest.skip(f"standard library sources not found under {stdlib}")
    config = {k: str(v) for k, v in sorted(sysconfig.get_config_vars().items())}
    texts += [json.dumps(config, indent=2)[:40_000], json.dumps(config)[:40_000]]
    errors = [estimate_tokens(t) / o200k.text(t) - 1 for t in texts]
    assert min(errors) >= -0.05
    assert statistics.median(errors) <= 0.15


def html_page(rows: int = 60) -> str:
    """A page as documentation generators and sites write it: nested blocks with classes,
    links, a table, entities, self-closing tags."""
    body = "\n".join(
        f'<tr class="row-{i % 2}"><td class="name"><a href="/api/items/{i}#details" '
        f'title="Item {i}">item_{i}</a></td><td align="right">{i * 37 % 1000}&nbsp;kB</td>'
        f'<td><span class="badge badge-{"ok" if i % 3 else "warn"}">'
        f'{"ready" if i % 3 else "pending review"}</span><br/></td></tr>'
        for i in range(rows)
    )
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"/>'
            '<link rel="stylesheet" href="/static/site.css" type="text/css"/>'
            '<title>Inventory</title></head>\n<body><div class="container" id="main">'
            '<h1 class="title">Inventory</h1><table class="table striped">\n'
            + body + "\n</table></div></body></html>")


def test_markup_is_not_undercounted(o200k: TiktokenCounter) -> None:
    page = html_page()
    error = estimate_tokens(page, safety_margin=0) / o200k.text(page) - 1
    assert -0.05 <= error <= 0.20, error


def test_a_language_with_diacritics_is_not_undercounted(o200k: TiktokenCounter) -> None:
    polish = (
        "Zespół programistów opublikował nową wersję biblioteki, która zawiera ważne "
        "poprawki błędów. Według dziennika zmian naprawiono wyciek pamięci występujący "
        "podczas długich połączeń z serwerem oraz przyspieszono uruchamianie aplikacji. "
        "Użytkownicy powinni zaktualizować oprogramowanie jak najszybciej, ponieważ "
        "poprzednia wersja zawierała również lukę w zabezpieczeniach uwierzytelniania."
    )
    error = estimate_tokens(polish, safety_margin=0) / o200k.text(polish) - 1
    assert -0.05 <= error <= 0.30, error


@pytest.mark.parametrize("text", [
    # Indonesian: no diacritics at all
    "Tim pengembang telah merilis versi baru dari perpustakaan yang memperbaiki kebocoran "
    "memori pada koneksi panjang dengan server. Pengguna disarankan untuk segera "
    "memperbarui perangkat lunak mereka, karena versi sebelumnya juga mengandung celah "
    "keamanan dalam proses autentikasi yang dapat dimanfaatkan oleh penyerang.",
    # Dutch: next to none
    "Het ontwikkelteam heeft een nieuwe versie van de bibliotheek uitgebracht die een "
    "geheugenlek bij langdurige verbindingen met de server verhelpt. Gebruikers wordt "
    "aangeraden hun software zo snel mogelijk bij te werken, omdat de vorige versie ook "
    "een beveiligingslek in de authenticatie bevatte dat niet eerder werd opgemerkt.",
])
def test_a_language_without_diacritics_is_not_undercounted(o200k: TiktokenCounter,
                                                           text: str) -> None:
    error = estimate_tokens(text, safety_margin=0) / o200k.text(text) - 1
    assert -0.05 <= error <= 0.30, error
