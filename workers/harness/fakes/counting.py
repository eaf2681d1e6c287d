"""Prompt token counting for the fake provider servers.

A fake server must decide, like the real provider, whether a request fits the
context window, and report ``usage``; both need a prompt token count. The
count is pluggable: any callable ``count(messages, tools) -> int`` over the
OpenAI wire form of the request (the Gemini fake converts its ``contents``
first) will do, so tests can inject an exact or a deliberately skewed counter.

The default counts with tiktoken's o200k encoding loaded from a local rank
file (no download: the project runs offline) and frames messages the way
OpenAI documents for its chat models: 3 tokens per message, 1 more for a
``name``, 3 to prime the reply. Where tiktoken or the rank file is missing it
falls back to characters / 4 and logs a warning once, so the fakes still run.
"""

from __future__ import annotations

import functools
import json
import logging
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from shared.core.tokens_exact import load_encoding

logger = logging.getLogger(__name__)

PromptCounter = Callable[[list[dict[str, Any]], "list[dict[str, Any]] | None"], int]
"""``count(messages, tools) -> int``: prompt tokens of one chat request."""

TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING = 3
IMAGE_TOKENS = 85  # OpenAI's flat cost of a low-detail image; a fake needs no more precision

# workers/harness/fakes/counting.py -> ../shared/data/tokenizers (the data sits beside
# the project root, see the data README).
DEFAULT_TOKENIZER_PATH = (
    Path(__file__).resolve().parents[4] / "shared" / "data" / "tokenizers" / "o200k_base.tiktoken"
)


@functools.lru_cache(maxsize=4)
def load_o200k(path: str) -> Any:
    """A ``tiktoken.Encoding`` for o200k_base built only from the local rank file ``path``.

    Loaded by the core's loader (:func:`shared.core.tokens_exact.load_encoding`:
    no download, the file's sha256 checked against o200k_base's), so the fakes
    and the exact counter read rank files one way. tiktoken's own cache names
    the file by a hash; such a file is shown to the loader under its encoding's
    name through a symlink. Raises ConfigError (a ValueError) when tiktoken is
    missing or the file is not o200k_base's, OSError when there is no file.
    Cached per path (loading takes ~1 s).
    """
    file = Path(path)
    if file.name == "o200k_base.tiktoken":
        return load_encoding("o200k_base", file.parent)
    if not file.is_file():
        raise OSError(f"{file}: no such rank file")
    directory = Path(tempfile.mkdtemp(prefix="cmp-o200k-"))
    (directory / "o200k_base.tiktoken").symlink_to(file.resolve())
    return load_encoding("o200k_base", directory)


def _content_parts(content: Any) -> tuple[list[str], int]:
    """Texts of a message's content and how many non-text parts (images, files) it has."""
    if content is None:
        return [], 0
    if isinstance(content, str):
        return [content], 0
    texts: list[str] = []
    media = 0
    if isinstance(content, Sequence):
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                media += 1
    return texts, media


def _tool_call_texts(tool_calls: Any) -> list[str]:
    """Name and argument text of each tool call, nested (OpenAI) or flat form."""
    texts: list[str] = []
    for call in tool_calls if isinstance(tool_calls, Sequence) else []:
        if not isinstance(call, Mapping):
            continue
        fn = call.get("function", call)
        if not isinstance(fn, Mapping):
            continue
        args = fn.get("arguments", "")
        texts.append(str(fn.get("name", "")))
        texts.append(args if isinstance(args, str) else json.dumps(args))
    return texts


class FramedCounter:
    """OpenAI's chat framing over a text tokenizer ``encode(text) -> int``.

    Exact for plain text messages with the right tokenizer (per OpenAI's published
    recipe); tool calls and tool schemas are counted as their JSON text, which is close
    to but not exactly what the provider bills.
    """

    def __init__(self, text_tokens: Callable[[str], int], name: str) -> None:
        self._text_tokens = text_tokens
        self.name = name

    def text(self, text: str) -> int:
        return self._text_tokens(text)

    def __call__(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> int:
        total = REPLY_PRIMING
        for message in messages:
            total += TOKENS_PER_MESSAGE
            texts, media = _content_parts(message.get("content"))
            texts.append(str(message.get("role", "")))
            texts.extend(_tool_call_texts(message.get("tool_calls")))
            if message.get("tool_call_id"):
                texts.append(str(message["tool_call_id"]))
            if message.get("name"):
                total += TOKENS_PER_NAME
                texts.append(str(message["name"]))
            total += sum(self._text_tokens(t) for t in texts if t) + media * IMAGE_TOKENS
        if tools:
            total += self._text_tokens(json.dumps(tools, ensure_ascii=False, sort_keys=True))
        return total


def chars_per_four(text: str) -> int:
    """The crude fallback: one token per four characters, rounded up."""
    return (len(text) + 3) // 4


def char_counter() -> FramedCounter:
    """A framed counter over characters / 4 (no tokenizer needed)."""
    return FramedCounter(chars_per_four, "chars/4")


@functools.lru_cache(maxsize=4)
def default_counter(tokenizer_path: str | None = None) -> FramedCounter:
    """o200k from ``tokenizer_path`` (default: the shared data directory), else chars/4.

    The fallback is logged as a warning because every count a fake then reports is
    only an estimate (chars/4 underestimates most real sessions).
    """
    path = Path(tokenizer_path) if tokenizer_path is not None else DEFAULT_TOKENIZER_PATH
    try:
        encoding = load_o200k(str(path))
    except (ImportError, OSError, ValueError) as exc:
        logger.warning("fake servers count tokens as chars/4: o200k unavailable (%s)", exc)
        return char_counter()

    def encode(text: str) -> int:
        return len(encoding.encode(text, disallowed_special=()))

    return FramedCounter(encode, "o200k")


def completion_tokens(counter: PromptCounter, text: str) -> int:
    """Tokens of generated text: the counter's ``text`` method if it has one, else chars/4."""
    text_method = getattr(counter, "text", None)
    if callable(text_method):
        return int(text_method(text))
    return chars_per_four(text)


__all__ = [
    "DEFAULT_TOKENIZER_PATH",
    "FramedCounter",
    "PromptCounter",
    "char_counter",
    "chars_per_four",
    "completion_tokens",
    "default_counter",
    "load_o200k",
]
