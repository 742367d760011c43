"""Fixtures shared by the colour tests."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]


class Programs:
    """The command-line programs of examples/, run in a real process.

    The child gets the repository root first on ``PYTHONPATH``, so that it imports this
    checkout's ``sketchot`` (not another installed copy) in a worktree and in CI alike.
    """

    def __init__(self) -> None:
        inherited = os.environ.get("PYTHONPATH", "")
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(part for part in (str(ROOT), inherited) if part),
        }

    @staticmethod
    def path(name: str) -> Path:
        return ROOT / "examples" / f"{name}.py"

    def command(self, name: str, *args) -> list[str]:
        return [sys.executable, str(self.path(name)), *map(str, args)]

    def run(self, name: str, *args, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.command(name, *args), capture_output=True, text=True, timeout=timeout,
            cwd=ROOT, env=self.env,
        )  # fmt: skip

    def start(self, name: str, *args) -> subprocess.Popen:
        return subprocess.Popen(
            self.command(name, *args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True, cwd=ROOT, env=self.env,
        )  # fmt: skip


@pytest.fixture(scope="session")
def programs() -> Programs:
    return Programs()


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """A warm 16 x 12 source and a cool 14 x 10 target, written as PNG files."""
    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    warm = rng.integers([150, 40, 0], [255, 150, 70], size=(12, 16, 3)).astype(np.uint8)
    cool = rng.integers([0, 70, 120], [80, 180, 255], size=(10, 14, 3)).astype(np.uint8)
    Image.fromarray(warm).save(folder / "warm.png")
    Image.fromarray(cool).save(folder / "cool.png")
    return folder / "warm.png", folder / "cool.png"


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def _write_png(
    path: Path, width: int, height: int, bit_depth: int, color_type: int, data: bytes
) -> Path:
    """A PNG file from its header fields and its filtered scanlines (``data``, before zlib)."""
    header = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", zlib.compress(data))
        + _png_chunk(b"IEND", b"")
    )
    return path


@pytest.fixture
def write_png():
    """``write_png(path, width, height, bit_depth, color_type, data)``: PNGs Pillow won't write."""
    return _write_png


@pytest.fixture
def bomb_png(tmp_path: Path) -> Path:
    """A PNG whose header claims 100000 x 100000 RGB pixels (its data is a few bytes)."""
    return _write_png(tmp_path / "bomb.png", 100_000, 100_000, 8, 2, b"\0" * 64)


@pytest.fixture
def zero_pixel_png(tmp_path: Path) -> Path:
    """A syntactically valid PNG of 0 x 0 pixels (Pillow refuses to write one itself)."""
    return _write_png(tmp_path / "zero.png", 0, 0, 8, 2, b"")
