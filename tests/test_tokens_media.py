"""Images costed by pixel size the providers' way (shared.core.tokens_media)."""

from __future__ import annotations

import base64

import pytest

from shared.core.messages import FilePart, ImagePart, Message, TextPart
from shared.core.tokens import (
    PROVIDERS,
    estimate_message_tokens,
    estimate_tokens,
    file_tokens,
    image_tokens,
)
from shared.core.tokens_media import (
    anthropic_image_tokens,
    gemini_image_tokens,
    openai_image_tokens,
    pdf_pages,
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


# -- files: a PDF by its pages, a text file by its text ----------------------------------------
def pdf(pages: int, padding: int = 0) -> bytes:
    """A PDF of ``pages`` page objects under one /Pages root (``padding`` bytes of content
    stream per page, so page objects fall anywhere in a long file)."""
    kids = " ".join(f"{i + 3} 0 R" for i in range(pages))
    out = [b"%PDF-1.7\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n",
           f"2 0 obj\n<< /Type /Pages /Kids [{kids}] /Count {pages} >>\nendobj\n".encode()]
    for i in range(pages):
        sep = "" if i % 2 else " "  # both spellings: /Type /Page and /Type/Page
        out.append(f"{i + 3} 0 obj\n<</Type{sep}/Page/Parent 2 0 R/MediaBox[0 0 612 792]>>\n"
                   f"stream\n".encode() + b"x" * padding + b"\nendstream\nendobj\n")
    return b"".join(out) + b"trailer\n<< /Root 1 0 R >>\n%%EOF\n"


def pdf_part(pages: int, padding: int = 0, media_type: str | None = "application/pdf") -> FilePart:
    return FilePart(data=base64.b64encode(pdf(pages, padding)).decode(), media_type=media_type,
                    filename="report.pdf")


@pytest.mark.parametrize("provider", ["openai", "anthropic", "gemini", "generic"])
def test_an_inline_pdf_costs_its_pages(provider: str) -> None:
    per_page = PROVIDERS[provider].file_page_tokens
    assert file_tokens(pdf_part(1), provider) == per_page
    assert file_tokens(pdf_part(40), provider) == 40 * per_page  # the /Pages root not a page
    # no media type stated: the bytes say PDF
    assert file_tokens(pdf_part(7, media_type=None), provider) == 7 * per_page


def test_page_objects_are_found_across_the_chunks_a_long_pdf_is_read_in() -> None:
    part = pdf_part(300, padding=20_011)  # ~6 MB: page objects straddle every boundary
    assert len(part.data or "") > 4 * (1 << 20)
    assert pdf_pages(part) == 300
    wrapped = part.model_copy(update={"data": "\n".join(
        (part.data or "")[i:i + 76] for i in range(0, len(part.data or ""), 76))})
    assert pdf_pages(wrapped) == 300  # MIME-wrapped base64


def test_an_inline_text_file_costs_its_text() -> None:
    text = "def handler(event):\n    return process(event['body'])\n" * 2_000
    part = FilePart(data=base64.b64encode(text.encode()).decode(), media_type="text/plain")
    for provider in ("openai", "anthropic", "gemini"):
        assert file_tokens(part, provider) == pytest.approx(estimate_tokens(text, provider),
                                                            rel=0.01)
    small = FilePart(data=base64.b64encode(b"a short note").decode(), media_type="text/plain")
    assert file_tokens(small) < 20


def test_a_file_without_its_bytes_or_pages_stays_flat() -> None:
    for part in (FilePart(file_id="file-123", filename="report.pdf"),
                 FilePart(url="https://example.com/report.pdf"),
                 FilePart(data=base64.b64encode(b"%PDF-1.4 \x00\x01 no page objects").decode(),
                          media_type="application/pdf")):  # compressed object streams
        for provider, profile in PROVIDERS.items():
            assert file_tokens(part, provider) == profile.file_tokens


def test_a_message_with_pdfs_is_estimated_by_their_pages() -> None:
    message = Message(role="user", content=[TextPart(text="compare these"),
                                            *(pdf_part(30) for _ in range(3))])
    text_only = Message(role="user", content="compare these")
    extra = estimate_message_tokens(message) - estimate_message_tokens(text_only)
    assert extra == 90 * PROVIDERS["openai"].file_page_tokens
