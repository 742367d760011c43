"""Fixtures shared by the colour tests."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest


@pytest.fixture
def zero_pixel_png(tmp_path: Path) -> Path:
    """A syntactically valid PNG of 0 x 0 pixels (Pillow refuses to write one itself)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", 0, 0, 8, 2, 0, 0, 0)
    path = tmp_path / "zero.png"
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b""))
        + chunk(b"IEND", b"")
    )
    return path
