"""Pieces shared by the colour-transfer command-line programs (examples/ and benchmarks/).

Every bad input must end as ONE line ``error: ...`` on stderr and exit code 2, without a
traceback, and before any output file is touched; the output files themselves are planned,
checked and written with :class:`~sketchot.color.outputs.OutputSet`. Ctrl-C ends a program as
one line (:data:`INTERRUPTED`) and exit code 130, also while it loads its libraries (the
programs install their own handler for that before their imports, then :func:`run_program`
takes over). :class:`~sketchot.color.steps.Steps` shows a live line for each step that runs
more than a couple of seconds.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

from PIL import Image

from .images import PILLOW_LIMIT
from .outputs import OutputPathError, OutputSet

#: The one line a program prints on stderr when Ctrl-C stops it.
INTERRUPTED = "error: interrupted; every output keeps its previous content"

#: Exit code of a program stopped by Ctrl-C (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED = 130


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


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def add_max_pixels_option(parser: argparse.ArgumentParser) -> None:
    """``--max-pixels N``: the ``max_pixels`` of :func:`~sketchot.color.load_image`."""
    parser.add_argument(
        "--max-pixels", type=non_negative_int, metavar="N",
        help="refuse image files of more than N pixels before decoding them (default: "
        f"Pillow's decompression-bomb threshold, {Image.MAX_IMAGE_PIXELS}); 0: no limit",
    )  # fmt: skip


def max_pixels_of(args: argparse.Namespace) -> int | str | None:
    """The ``max_pixels`` argument for ``--max-pixels`` (absent: Pillow's; 0: none)."""
    return PILLOW_LIMIT if args.max_pixels is None else (args.max_pixels or None)


def check_outputs(
    parser: argparse.ArgumentParser,
    outputs: OutputSet,
    inputs: Iterable[tuple[str, str | os.PathLike]] = (),
) -> None:
    """:meth:`OutputSet.check` before any work; a refused path ends the program as
    ``error: ...`` with exit code 2."""
    try:
        outputs.check(inputs)
    except OutputPathError as exc:
        parser.error(str(exc))


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


def run_program(main: Callable[[], int]) -> int:
    """Run a program's ``main()`` and return its exit code; Ctrl-C at any moment ends it as
    one line :data:`INTERRUPTED` on stderr and :data:`EXIT_INTERRUPTED`, never a traceback.

    Restores Python's ``KeyboardInterrupt`` (the program may have installed a handler of its
    own while it imported its libraries). Once ``main()`` is over, a further Ctrl-C ends the
    process at once (the interpreter's shutdown would print a traceback).
    """
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        code = main()
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr)
        code = EXIT_INTERRUPTED
    signal.signal(signal.SIGINT, _exit_interrupted)
    return code


def _exit_interrupted(number: int, frame: Any) -> None:
    for stream in (sys.stdout, sys.stderr):
        with suppress(OSError, ValueError):
            stream.flush()
    os._exit(EXIT_INTERRUPTED)
