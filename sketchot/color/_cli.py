"""Shared pieces of the colour-transfer command-line programs (examples/ and benchmarks/).

Every bad input must end as ONE line ``error: ...`` on stderr and exit code 2, without a
traceback, and before any output file is touched.
"""

from __future__ import annotations

import argparse
import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from matplotlib.backend_bases import FigureCanvasBase
from PIL import Image


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (``error: ...``) with exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"error: {message}\n")


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def check_output(parser: argparse.ArgumentParser, path: Path, option: str, kind: str) -> None:
    """Refuse, before any work, an output whose folder is missing or whose format is unknown.

    ``kind`` is ``"image"`` (formats Pillow writes), ``"figure"`` (formats matplotlib writes)
    or ``"json"``.
    """
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        parser.error(f"{option}: output folder {str(folder)!r} does not exist")
    if path.is_dir():
        parser.error(f"{option}: {str(path)!r} is a folder, not a file name")
    suffix = path.suffix.lower()
    if kind == "image" and suffix not in Image.registered_extensions():
        parser.error(f"{option}: cannot tell the image format from the extension of {str(path)!r}")
    if kind == "figure":
        formats = FigureCanvasBase.get_supported_filetypes()
        if suffix.lstrip(".") not in formats:
            parser.error(
                f"{option}: matplotlib cannot write {suffix or 'files without an extension'}; "
                f"use one of {', '.join('.' + name for name in sorted(formats))}"
            )


def one_line_warning(message, category, filename, lineno, line=None) -> str:
    """``warnings.formatwarning`` replacement: ``warning: message`` on one line."""
    return f"warning: {message}\n"


@contextmanager
def one_line_warnings() -> Iterator[None]:
    """Print warnings as ``warning: message`` lines inside the block, then restore."""
    previous = warnings.formatwarning
    warnings.formatwarning = one_line_warning
    try:
        yield
    finally:
        warnings.formatwarning = previous
