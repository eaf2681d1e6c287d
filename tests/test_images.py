"""Pixel sizes read from inline images' headers (shared.core.images)."""

from __future__ import annotations

import base64

from hypothesis import given
from hypothesis import strategies as st

from shared.core.images import image_size
from shared.core.messages import ImagePart
from tests.images_support import gif, jpeg, png, webp


def inline(raw: bytes, media_type: str = "image/png") -> ImagePart:
    return ImagePart(data=base64.b64encode(raw).decode(), media_type=media_type)


def test_png_gif_and_webp_sizes_come_from_their_first_bytes() -> None:
    assert image_size(inline(png(37, 21))) == (37, 21)
    assert image_size(inline(gif(648, 521), "image/gif")) == (648, 521)
    for kind in (b"VP8 ", b"VP8L", b"VP8X"):
        assert image_size(inline(webp(kind, 1920, 1080), "image/webp")) == (1920, 1080), kind


def test_a_jpeg_frame_is_found_after_its_metadata() -> None:
    assert image_size(inline(jpeg(1920, 1080), "image/jpeg")) == (1920, 1080)
    assert image_size(inline(jpeg(4032, 3024, exif=60_000, progressive=True))) == (4032, 3024)


def test_data_urls_and_wrapped_base64_are_read() -> None:
    raw = png(800, 600)
    assert image_size(ImagePart(url="data:image/png;base64," + base64.b64encode(raw).decode())) \
        == (800, 600)
    wrapped = base64.encodebytes(jpeg(1280, 720, exif=5_000)).decode()  # lines of 76 + "\n"
    assert "\n" in wrapped
    assert image_size(ImagePart(data=wrapped)) == (1280, 720)


def test_what_cannot_be_read_has_no_size() -> None:
    assert image_size(ImagePart(url="https://example.com/cat.png")) is None
    assert image_size(ImagePart(url="data:image/svg+xml,<svg/>")) is None
    assert image_size(ImagePart(data="not base64 at all!")) is None
    assert image_size(inline(b"BM" + b"\x00" * 60)) is None  # a bitmap: not read
    assert image_size(inline(jpeg(640, 480)[:40])) is None  # cut before its frame
    assert image_size(inline(png(0, 5))) is None


def test_only_the_header_is_decoded() -> None:
    """A large screenshot costs no more to size than a small one."""
    big = ImagePart(data=base64.b64encode(png(64, 64) + b"\x00" * 8_000_000).decode())
    assert image_size(big) == (64, 64)


@given(st.binary(min_size=1, max_size=200))
def test_any_bytes_are_sized_or_not_without_raising(raw: bytes) -> None:
    size = image_size(inline(raw))
    assert size is None or (size[0] > 0 and size[1] > 0)


@given(st.sampled_from([b"\x89PNG\r\n\x1a\n", b"\xff\xd8", b"GIF89a", b"RIFF"]),
       st.binary(max_size=120))
def test_truncated_or_corrupt_headers_never_raise(magic: bytes, rest: bytes) -> None:
    size = image_size(inline(magic + rest))
    assert size is None or (size[0] > 0 and size[1] > 0)
