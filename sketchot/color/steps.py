"""The steps of a colour-transfer program, each shown live once it runs a couple of seconds."""

from __future__ import annotations

import io
import re
import sys
import time
from typing import Any, TextIO

from ..solver import Progress


class Steps:
    """The steps of a program, each shown as a live line once it has run a couple of seconds.

    Each step is a :class:`~sketchot.solver.progress.Progress` with ``show='auto'``: fast steps
    print nothing. :meth:`say` is a ``progress`` callback for
    :func:`~sketchot.color.transfer_colors`: it prints each message as ``[elapsed s] text``,
    starts the step the message announces (loading, sampling, solving, mapping, drawing) and
    feeds the mapping step its counts. Lines the library prints meanwhile go through
    :meth:`lines` (``contextlib.redirect_stdout(steps.lines())``), above the live line.

    Parameters
    ----------
    stream : file-like, optional
        Where the messages and the live lines go (default ``sys.stdout``).
    """

    #: Messages of :func:`~sketchot.color.transfer_colors` that start a step, and the step.
    ANNOUNCED = (
        ("sampling", "sampling"),
        ("solving", "solving"),
        ("mapping all", "mapping"),
        ("drawing", "drawing the figure"),
    )

    #: A message with the count of a mapping: ``mapped DONE/TOTAL distinct colours ...``.
    MAPPED = re.compile(r"mapped (\d+)/(\d+) distinct colou?rs")

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = sys.stdout if stream is None else stream
        self.started = time.perf_counter()
        self.current: Progress | None = None

    def start(self, label: str, *, total: int | None = None, unit: str = "it") -> Progress:
        """End the current step and start ``label``."""
        self.finish()
        self.current = Progress(
            label, total=total, show="auto", verbose=True, unit=unit, stream=self.stream
        )
        return self.current

    def finish(self, status: str = "") -> None:
        """End the current step (its line, if shown, stays with ``status``)."""
        if self.current is not None:
            current, self.current = self.current, None
            current.close(status)

    def say(self, text: str) -> None:
        """Print a message ``[elapsed s] text``; follow the steps it announces."""
        count = self.MAPPED.match(text)
        if count is not None and self.current is not None:
            self.current.total = int(count[2])
            self.current.update(int(count[1]))
            self.current.log(text)
            return
        self.finish()
        print(f"[{time.perf_counter() - self.started:7.2f} s] {text}", file=self.stream)
        self.stream.flush()
        for start, label in self.ANNOUNCED:
            if text.startswith(start):
                if label == "mapping":
                    label = "mapping the target" if " target " in text else "mapping the source"
                self.start(label, unit="colours" if label.startswith("mapping") else "it")
                break

    def lines(self) -> TextIO:
        """A text stream whose lines go above the current step's live line."""
        return _LinesAbove(self)

    def __enter__(self) -> Steps:
        return self

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> None:
        interrupted = kind is not None and issubclass(kind, KeyboardInterrupt)
        self.finish("interrupted" if interrupted else "")


class _LinesAbove(io.TextIOBase):
    """Complete lines written here are printed above the live line of the current step."""

    def __init__(self, steps: Steps) -> None:
        super().__init__()
        self.steps = steps
        self.pending = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            if self.steps.current is not None:
                self.steps.current.log(line)
            else:
                print(line, file=self.steps.stream)
        return len(text)

    def flush(self) -> None:
        self.steps.stream.flush()
