"""Providers' token profiles, chat-framing overheads and the TokenCounter protocol.

The numbers are explained in :mod:`shared.core.tokens` (the estimator).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from shared.core.errors import InvalidInput
from shared.core.messages import Message

MESSAGE_OVERHEAD = 4
"""Framing of one message: 3 tokens plus its role (OpenAI cookbook)."""


NAME_OVERHEAD = 1
"""A message ``name`` costs one more token than its text."""


TOOL_CALL_OVERHEAD = 5
"""A tool call is framed like a message (3) addressed to ``functions.<name>`` (2)."""


REQUEST_OVERHEAD = 3
"""The reply is primed with ``<|im_start|>assistant<|message|>``."""


TOOL_DEFINITION_OVERHEAD = 8
"""Fixed text around one function in the tools namespace."""


TOOLS_BLOCK_OVERHEAD = 12
"""The tools header and namespace wrapper, paid once when any tool is defined."""


DEFAULT_SAFETY_MARGIN = 0.05
"""Content estimates are multiplied by ``1 + margin``: the held-out sessions
were never underestimated with it (BENCHMARKS.md)."""


ImageRule = Literal["openai", "anthropic", "gemini", "largest", "flat"]


@dataclass(frozen=True)
class ProviderProfile:
    """How one provider's tokenizer differs from the o200k baseline.

    ``image_rule`` costs an inline image by its pixel size the provider's way
    (:mod:`shared.core.tokens_media`); ``image_tokens`` is the figure when the size is
    unknown (a remote URL) or the rule is ``flat``. An inline PDF costs
    ``file_page_tokens`` per page it holds, an inline text file its text
    (:mod:`shared.core.tokens_media`); ``file_tokens`` is the flat figure for a file
    given by URL or id, or one whose pages cannot be read.
    """

    factor: float
    non_latin_factor: float
    image_tokens: int
    low_detail_image_tokens: int
    file_tokens: int
    image_rule: ImageRule = "flat"
    file_page_tokens: int = 3_000


PROVIDERS: Mapping[str, ProviderProfile] = {
    # Images: a 1024x1024 image at high detail is 85 + 4 tiles x 170 = 765 tokens
    # (OpenAI vision pricing for gpt-4o); low detail is a flat 85.
    # PDF pages: the page's text and an image of it (a letter page at high detail is
    # 765), ~1,500 a page.
    "openai": ProviderProfile(1.0, 1.0, 765, 85, 3_000, "openai", file_page_tokens=1_500),
    # Images: width x height / 750 with images scaled to <= 1.15 megapixels,
    # i.e. at most ~1,600 tokens (Anthropic vision docs).
    # PDF pages: 1,500-3,000 tokens of text plus the page image (Anthropic PDF docs).
    "anthropic": ProviderProfile(1.30, 1.0, 1_600, 1_600, 3_000, "anthropic",
                                 file_page_tokens=3_000),
    # Images: 1,120 tokens at media_resolution high, the Gemini 3 default, or Gemini
    # 2.x's 258 per 768x768 tile where that is more (1,548 for a 1920x1080 screenshot).
    # PDF pages: 560 at Gemini 3's default media resolution for documents, 258 on 2.x.
    "gemini": ProviderProfile(1.18, 1.0, 1_120, 280, 3_000, "gemini", file_page_tokens=560),
    # Unknown tokenizer: the largest figure of the three for media.
    "generic": ProviderProfile(1.25, 2.0, 1_600, 1_600, 3_000, "largest",
                               file_page_tokens=3_000),
}
"""A file whose content cannot be read (by URL or id, a PDF whose page objects are
compressed) is a flat 3,000 tokens everywhere: a page or two. An inline PDF is costed
by its pages, an inline text file by its text."""


def provider_profile(provider: str) -> ProviderProfile:
    """The profile for ``provider``; unknown names use ``generic`` (conservative)."""
    if not isinstance(provider, str):
        raise InvalidInput(
            f"expected a provider name, got {type(provider).__name__}", field="provider"
        )
    return PROVIDERS.get(provider.strip().lower(), PROVIDERS["generic"])


def provider_for_model(model: str) -> str:
    """The tokenizer family of a model name: openai, anthropic, gemini or generic.

    Routing prefixes (``openai/``, ``google/``, ``models/``...) are ignored.
    """
    if not isinstance(model, str):
        raise InvalidInput(f"expected a model name, got {type(model).__name__}", field="model")
    name = model.strip().lower().rsplit("/", 1)[-1]
    if "claude" in name:
        return "anthropic"
    if "gemini" in name or "gemma" in name:  # Gemma 3 shares Gemini's tokenizer
        return "gemini"
    if name.startswith(("gpt-", "gpt4", "chatgpt", "ft:gpt")) or (
        len(name) >= 2 and name[0] == "o" and name[1] in "134" and name[2:3] in ("", "-")
    ):
        return "openai"
    return "generic"


class TokenCounter(Protocol):
    """What every module that needs token counts takes (injectable)."""

    def text(self, text: str) -> int: ...
    def message(self, message: Message) -> int: ...
    def messages(self, messages: Sequence[Message]) -> int: ...
    def tools(self, tools: Sequence[Mapping[str, Any]]) -> int: ...
