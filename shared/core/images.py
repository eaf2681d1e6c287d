"""The pixel size of an inline image, read from its first bytes: no decoder, no I/O.

Providers cost an image by its size (OpenAI by 512-pixel tiles, Anthropic by area), and a
screenshot costs half as much again as the square image a flat figure assumes. An image
sent inline (``ImagePart.data``, or a ``data:`` URL) carries its size in its header: PNG,
GIF and WebP in their first 30 bytes, JPEG in a start-of-frame segment after the
metadata ones, found by hopping from segment to segment. Only the base64 quartets that
hold the bytes read are decoded, so a 5 MB screenshot costs a few microseconds. An image
by remote URL, or one this module cannot read, has no known size (None): its cost falls
back to the provider's flat figure.
"""

from __future__ import annotations

import binascii
import struct

from shared.core.messages import FilePart, ImagePart

_MAX_SIDE = 1 << 16
_MAX_SEGMENTS = 64  # a JPEG's metadata segments before its frame: a handful in practice
_WHITESPACE = str.maketrans("", "", " \t\r\n")


class _Base64Bytes:
    """Random access to the bytes a base64 string encodes, decoding only what is read."""

    __slots__ = ("_text",)

    def __init__(self, text: str) -> None:
        self._text = text

    def __len__(self) -> int:
        return len(self._text) // 4 * 3

    def read(self, offset: int, size: int) -> bytes:
        first, last = offset // 3, -(-(offset + size) // 3)
        chunk = self._text[4 * first : 4 * last]
        chunk = chunk[: len(chunk) // 4 * 4]
        try:
            raw = binascii.a2b_base64(chunk)
        except (binascii.Error, ValueError):
            return b""
        start = offset - 3 * first
        return raw[start : start + size]


def inline_payload(part: ImagePart | FilePart) -> str | None:
    """The base64 text of an inline image or file, or None (a remote URL, a file id,
    another encoding)."""
    if part.data:
        text = part.data
    elif part.url and part.url[:5].lower() == "data:":
        header, sep, text = part.url.partition(",")
        if not sep or not header.lower().endswith(";base64"):
            return None
    else:
        return None
    if "\n" in text[:4096] or " " in text[:4096]:  # MIME-wrapped lines break the quartets
        text = text.translate(_WHITESPACE)
    return text


def _size(width: int, height: int) -> tuple[int, int] | None:
    if 0 < width < _MAX_SIDE and 0 < height < _MAX_SIDE:
        return width, height
    return None


def _jpeg(data: _Base64Bytes) -> tuple[int, int] | None:
    offset = 2
    for _ in range(_MAX_SEGMENTS):
        head = data.read(offset, 9)
        if len(head) < 4 or head[0] != 0xFF:
            return None
        marker = head[1]
        if marker == 0xFF:  # fill byte before a marker
            offset += 1
            continue
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # a start of frame
            if len(head) < 9:
                return None
            height, width = struct.unpack(">HH", head[5:9])
            return _size(width, height)
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # markers without a length
            offset += 2
            continue
        (length,) = struct.unpack(">H", head[2:4])
        if length < 2:
            return None
        offset += 2 + length
    return None


def image_size(part: ImagePart) -> tuple[int, int] | None:
    """(width, height) in pixels of an inline PNG, JPEG, GIF or WebP image, else None."""
    text = inline_payload(part)
    if not text:
        return None
    data = _Base64Bytes(text)
    head = data.read(0, 30)
    if head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR" and len(head) >= 24:
        return _size(*struct.unpack(">II", head[16:24]))
    if head[:6] in (b"GIF87a", b"GIF89a") and len(head) >= 10:
        return _size(*struct.unpack("<HH", head[6:10]))
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        kind = head[12:16]
        if kind == b"VP8 " and len(head) >= 30:
            width, height = struct.unpack("<HH", head[26:30])
            return _size(width & 0x3FFF, height & 0x3FFF)
        if kind == b"VP8L" and len(head) >= 25:
            bits = int.from_bytes(head[21:25], "little")
            return _size((bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
        if kind == b"VP8X" and len(head) >= 30:
            return _size(int.from_bytes(head[24:27], "little") + 1,
                         int.from_bytes(head[27:30], "little") + 1)
        return None
    if head[:2] == b"\xff\xd8":
        return _jpeg(data)
    return None


__all__ = ["image_size"]
