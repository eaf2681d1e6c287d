"""What an image costs each provider, from its pixel size when the message carries it.

OpenAI (GPT-4o, GPT-4.1, the o-series: the vision guide's "calculating costs") fits a
high-detail image into 2048x2048, scales its shortest side down to 768 and charges 170
tokens per 512-pixel tile plus 85; low detail is 85. A 1024x1024 image costs 765, a
1920x1080 screenshot 1,105, a tall 1080x2400 phone screenshot 1,445. Anthropic charges
about width x height / 750 after scaling the image to at most 1,568 pixels on its long
side and ~1.2 megapixels (at most ~1,600 tokens). Gemini 3 charges at most a flat figure
per media resolution (1,120 at high, its default for images); Gemini 2.x charges 258
tokens for an image within 384x384 and 258 per 768x768 tile for a larger one, so a
1920x1080 screenshot costs 1,548 and a 3840x2160 one 3,870. The model's generation is
not known where content is counted, so Gemini's cost is the larger of the two. Where the
size is unknown (a remote URL, an unreadable header) the profile's flat figure stands,
which for OpenAI is the 1024x1024 image's.

Per-model rules the provider profile cannot see (GPT-4o mini's and GPT-4.1 mini's
larger multipliers, ``detail="original"``) are left to calibration from usage reports.
"""

from __future__ import annotations

import math

from shared.core.images import image_size
from shared.core.messages import ImagePart
from shared.core.tokens_profiles import ProviderProfile

_OPENAI_BASE, _OPENAI_TILE = 85, 170
_ANTHROPIC_LONG_EDGE, _ANTHROPIC_PIXELS, _ANTHROPIC_PIXELS_PER_TOKEN = 1568, 1_200_000, 750
_GEMINI_SMALL, _GEMINI_TILE, _GEMINI_TILE_TOKENS = 384, 768, 258


def openai_image_tokens(width: int, height: int) -> int:
    """A high-detail image of ``width`` x ``height`` pixels, as OpenAI tiles it."""
    scale = min(1.0, 2048 / max(width, height))
    w, h = width * scale, height * scale
    scale = min(1.0, 768 / min(w, h))
    w, h = w * scale, h * scale
    return _OPENAI_BASE + _OPENAI_TILE * math.ceil(w / 512 - 1e-9) * math.ceil(h / 512 - 1e-9)


def anthropic_image_tokens(width: int, height: int) -> int:
    """An image of ``width`` x ``height`` pixels, as Anthropic scales and counts it."""
    pixels = width * height
    scale = min(1.0, _ANTHROPIC_LONG_EDGE / max(width, height),
                math.sqrt(_ANTHROPIC_PIXELS / pixels))
    return math.ceil(pixels * scale * scale / _ANTHROPIC_PIXELS_PER_TOKEN)


def gemini_image_tokens(width: int, height: int) -> int:
    """An image of ``width`` x ``height`` pixels, as Gemini 2.x tiles it."""
    if width <= _GEMINI_SMALL and height <= _GEMINI_SMALL:
        return _GEMINI_TILE_TOKENS
    return _GEMINI_TILE_TOKENS * math.ceil(width / _GEMINI_TILE) * math.ceil(height / _GEMINI_TILE)


def image_cost(part: ImagePart, profile: ProviderProfile) -> int:
    """Tokens of one image for ``profile``: by its size where the provider's rule and the
    image's header allow, else the profile's flat figure."""
    rule = profile.image_rule
    if part.detail == "low" and rule in ("openai", "gemini", "flat"):  # where it exists
        return profile.low_detail_image_tokens
    size = image_size(part) if rule != "flat" else None
    if size is None:
        return profile.image_tokens
    if rule == "openai":
        return openai_image_tokens(*size)
    if rule == "anthropic":
        return anthropic_image_tokens(*size)
    if rule == "gemini":
        return max(profile.image_tokens, gemini_image_tokens(*size))
    return max(openai_image_tokens(*size), anthropic_image_tokens(*size),  # "largest"
               gemini_image_tokens(*size))


__all__ = ["anthropic_image_tokens", "gemini_image_tokens", "image_cost",
           "openai_image_tokens"]
