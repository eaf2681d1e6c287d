"""Image bytes as encoders write them, for tests that read their sizes."""

from __future__ import annotations

import struct
import zlib


def png(width: int, height: int) -> bytes:
    """A complete, valid PNG (one grey row per line)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(
            ">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    rows = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def jpeg(width: int, height: int, *, exif: int = 0, progressive: bool = False) -> bytes:
    """A JPEG's header as cameras write it: JFIF, an Exif block of ``exif`` bytes, tables,
    then the frame that states the size."""
    def segment(marker: int, body: bytes) -> bytes:
        return bytes((0xFF, marker)) + struct.pack(">H", len(body) + 2) + body

    frame = struct.pack(">BHHB", 8, height, width, 3) + b"\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    return (b"\xff\xd8" + segment(0xE0, b"JFIF\x00\x01\x01\x00\x00\x48\x00\x48\x00\x00")
            + (segment(0xE1, b"Exif\x00\x00" + b"\x00" * (exif - 6)) if exif else b"")
            + segment(0xDB, b"\x00" + bytes(range(64)))
            + segment(0xC4, b"\x00" + b"\x00" * 16)
            + segment(0xC2 if progressive else 0xC0, frame) + b"\xff\xda" + b"\x00" * 64
            + b"\xff\xd9")


def gif(width: int, height: int) -> bytes:
    return b"GIF89a" + struct.pack("<HH", width, height) + b"\x00\x00\x00;"


def webp(kind: bytes, width: int, height: int) -> bytes:
    if kind == b"VP8 ":
        body = b"\x00" * 3 + b"\x9d\x01\x2a" + struct.pack("<HH", width, height) + b"\x00" * 8
    elif kind == b"VP8L":
        bits = (width - 1) | ((height - 1) << 14)
        body = b"\x2f" + bits.to_bytes(4, "little") + b"\x00" * 8
    else:
        body = b"\x00" * 4 + (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    riff = b"WEBP" + kind + struct.pack("<I", len(body)) + body
    return b"RIFF" + struct.pack("<I", len(riff)) + riff
