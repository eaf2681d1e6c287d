"""Images costed by pixel size the providers' way (shared.core.tokens_media)."""

from __future__ import annotations

import base64

import pytest

from shared.core.messages import ImagePart, Message, TextPart
from shared.core.tokens import PROVIDERS, estimate_message_tokens, image_tokens
from shared.core.tokens_media import (
    anthropic_image_tokens,
    gemini_image_tokens,
    openai_image_tokens,
)
from tests.images_support import jpeg, png


@pytest.mark.parametrize(
    ("width", "height", "tokens"),
    [
        (1024, 1024, 765),  # OpenAI's worked example: 768x768, 4 tiles
        (2048, 4096, 1105),  # OpenAI's worked example: 1024x2048 -> 768x1536, 6 tiles
        (1920, 1080, 1105),  # a screenshot: 1365x768, 3 x 2 tiles
        (1080, 2400, 1445),  # a tall phone screenshot: 768x1706 -> 2 x 4 tiles
        (512, 512, 255),  # small images are not scaled up
        (100, 30, 255),
    ],
)
def test_openai_tiles(width: int, height: int, tokens: int) -> None:
    assert openai_image_tokens(width, height) == tokens


def test_anthropic_area_with_its_caps() -> None:
    assert anthropic_image_tokens(200, 200) == 54
    assert anthropic_image_tokens(1000, 1000) == 1334
    for width, height in ((1092, 1092), (1920, 1080), (4032, 3024), (8000, 200)):
        assert anthropic_image_tokens(width, height) <= 1600


@pytest.mark.parametrize(
    ("width", "height", "tokens"),
    [
        (384, 384, 258),  # within 384x384: one tile
        (385, 200, 258),  # larger: 768-pixel tiles, here one
        (1920, 1080, 1548),  # a screenshot: 3 x 2 tiles
        (3840, 2160, 3870),  # a 4K screenshot: 5 x 3 tiles
        (1080, 2400, 2064),  # a tall phone screenshot: 2 x 4 tiles
    ],
)
def test_gemini_2_tiles(width: int, height: int, tokens: int) -> None:
    assert gemini_image_tokens(width, height) == tokens


def screenshot(fmt: str = "png") -> ImagePart:
    raw = png(1920, 1080) if fmt == "png" else jpeg(1920, 1080, exif=20_000)
    return ImagePart(data=base64.b64encode(raw).decode(), media_type=f"image/{fmt}")


def test_an_inline_screenshot_costs_its_tiles_not_the_flat_figure() -> None:
    for fmt in ("png", "jpeg"):
        assert image_tokens(screenshot(fmt), "openai") == 1105
        assert image_tokens(screenshot(fmt), "anthropic") == 1600
    assert image_tokens(screenshot(), "generic") == 1600  # the largest of the three rules
    # Gemini: Gemini 2.x's tiles where they cost more than Gemini 3's flat figure
    assert image_tokens(screenshot(), "gemini") == 1548
    small = ImagePart(data=base64.b64encode(png(300, 300)).decode(), media_type="image/png")
    assert image_tokens(small, "gemini") == PROVIDERS["gemini"].image_tokens
    big = ImagePart(data=base64.b64encode(png(3840, 2160)).decode(), media_type="image/png")
    assert image_tokens(big, "gemini") == image_tokens(big, "generic") == 3870


def test_low_detail_and_unknown_sizes_keep_the_flat_figures() -> None:
    low = screenshot().model_copy(update={"detail": "low"})
    assert image_tokens(low, "openai") == 85
    assert image_tokens(low, "anthropic") == 1600  # Anthropic has no low detail
    assert image_tokens(low, "gemini") == 280  # Gemini's low media resolution
    remote = ImagePart(url="https://example.com/screen.png")
    for provider, profile in PROVIDERS.items():
        assert image_tokens(remote, provider) == profile.image_tokens


def test_a_message_counts_its_images_by_size() -> None:
    small = ImagePart(data=base64.b64encode(png(256, 256)).decode(), media_type="image/png")
    with_small = Message(role="user", content=[TextPart(text="What is this?"), small])
    with_big = Message(role="user", content=[TextPart(text="What is this?"), screenshot()])
    assert estimate_message_tokens(with_big) - estimate_message_tokens(with_small) == 1105 - 255
