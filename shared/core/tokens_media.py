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

A file sent inline is costed by its content: a PDF by its pages (each page object,
``/Type /Page``, found in the decoded bytes; providers charge per page, text and page
image), a text file by its text. Both read at most a bounded share of the file (the rest
is scaled from it), a megabyte of base64 at a time. A file by URL or id, or a PDF whose
page objects sit in compressed object streams, keeps the profile's flat figure.

Per-model rules the provider profile cannot see (GPT-4o mini's and GPT-4.1 mini's
larger multipliers, ``detail="original"``) are left to calibration from usage reports.
"""

from __future__ import annotations

import binascii
import functools
import math
import re

from shared.core.images import image_size, inline_payload
from shared.core.messages import FilePart, ImagePart
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


FILE_SCAN_LIMIT = 64 << 20
"""Base64 characters of a PDF read for its pages at most (48 MB of file, past every
provider's PDF limit); a larger one is scaled from what was read."""
TEXT_SCAN_LIMIT = 1 << 20
"""Base64 characters of a text file decoded and estimated at most; the rest is scaled."""
_SCAN_CHUNK = 1 << 20  # base64 characters decoded at a time (a multiple of 4)
_PAGE = re.compile(rb"/Type\s*/Page(?![A-Za-z0-9#])")  # a page, not the /Pages tree
_TAIL = 64  # decoded bytes carried into the next chunk: a page marker split by a boundary
_PDF_MAGIC = "JVBERi0"  # "%PDF-" in base64
_TEXT_TYPES = ("application/json", "application/xml", "application/x-yaml",
               "application/yaml", "application/javascript", "application/x-python")


def _media_type(part: FilePart) -> str:
    if part.media_type:
        return part.media_type.lower()
    if part.url and part.url[:5].lower() == "data:":
        return part.url[5:].partition(";")[0].partition(",")[0].lower()
    return ""


def pdf_pages(part: FilePart) -> int | None:
    """Pages of an inline PDF (its page objects), or None: not inline, not a PDF, or no
    page object readable (compressed object streams)."""
    kind = _media_type(part)
    if kind and kind != "application/pdf":
        return None
    text = inline_payload(part)
    if not text or not text.startswith(_PDF_MAGIC):
        return None
    return _pages(text)


@functools.lru_cache(maxsize=16)
def _pages(text: str) -> int | None:
    """Page objects in the PDF ``text`` encodes, decoded a chunk at a time: a match that
    ends in the bytes carried over was counted with the chunk before, one that runs to
    the end of a chunk (its next byte unseen) is counted with the next."""
    scanned = min(len(text) // 4 * 4, FILE_SCAN_LIMIT)
    pages, tail = 0, b""
    for at in range(0, scanned, _SCAN_CHUNK):
        try:
            raw = binascii.a2b_base64(text[at:min(at + _SCAN_CHUNK, scanned)])
        except (binascii.Error, ValueError):
            break
        buf, last = tail + raw, at + _SCAN_CHUNK >= scanned
        pages += sum(1 for m in _PAGE.finditer(buf)
                     if m.end() >= len(tail) and (last or m.end() < len(buf)))
        tail = buf[-_TAIL:]
    if not pages or not scanned:
        return None
    return math.ceil(pages * len(text) / scanned) if scanned < len(text) else pages


def file_text(part: FilePart) -> tuple[str, float] | None:
    """The text of an inline text file (at most :data:`TEXT_SCAN_LIMIT` of it decoded) and
    how many times that the whole is; None for anything else."""
    kind = _media_type(part)
    if not (kind.startswith("text/") or kind in _TEXT_TYPES):
        return None
    text = inline_payload(part)
    if not text:
        return None
    read = min(len(text) // 4 * 4, TEXT_SCAN_LIMIT)
    try:
        decoded = binascii.a2b_base64(text[:read]).decode("utf-8", errors="replace")
    except (binascii.Error, ValueError):
        return None
    return decoded, (len(text) / read if read else 1.0)


__all__ = ["FILE_SCAN_LIMIT", "TEXT_SCAN_LIMIT", "anthropic_image_tokens", "file_text",
           "gemini_image_tokens", "image_cost", "openai_image_tokens", "pdf_pages"]
