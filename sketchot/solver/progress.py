"""A live progress line for long work: iterations, error against its target, time left.

:class:`Progress` is told how far the work is (``update``) and draws one line on a terminal:
the label, the iterations (or other units) done, the current error and the error it must
reach, the elapsed time and one estimate of the time left. The estimate comes from what was
measured: the time per iteration over the recent updates, times the iterations left, which are
``total - done`` or, when an error and its target are given, the iterations until the error
crosses the target, extrapolated from the error's geometric decrease (a straight line through
``log(error)`` against the iterations of the recent updates), whichever is smaller. It is
recomputed at most once per :data:`ESTIMATE_SECONDS` and counts down in between, so the line
never shows two different estimates within a second.

Drawing: with `tqdm <https://tqdm.github.io>`_ (the ``progress`` extra) on a terminal, a tqdm
bar; without it, a plain line rewritten in place. On a stream that is not a terminal (a log
file, a pipe, a notebook), one line at most every :data:`LINE_SECONDS`. With ``show='auto'``
nothing is drawn before the work has run :data:`AUTO_DELAY_SECONDS`, so fast work prints
nothing; tqdm is imported only when a line is drawn on a terminal. While a line is shown, a
background thread redraws it a few times a second, so the elapsed time moves even when the
work reports rarely.

Examples
--------
>>> import io
>>> out = io.StringIO()
>>> with Progress("sinkhorn", total=100, show="auto", stream=out) as progress:
...     for iteration in range(1, 101):
...         progress.update(iteration, error=0.5**iteration, target=1e-9)
>>> out.getvalue()  # fast work: nothing printed
''
"""

from __future__ import annotations

import math
import shutil
import sys
import threading
import time
import weakref
from collections import deque
from typing import Any, TextIO

#: The clock every :class:`Progress` reads (seconds); tests replace it with a fake one.
clock = time.perf_counter

#: With ``show='auto'``, nothing is drawn before the work has run this long.
AUTO_DELAY_SECONDS = 2.0

#: The estimate of the time left is recomputed at most this often; it counts down in between.
ESTIMATE_SECONDS = 1.0

#: On a stream that is not a terminal, one line at most this often.
LINE_SECONDS = 5.0

#: A terminal line is redrawn at most this often by ``update`` ...
REDRAW_SECONDS = 0.1

#: ... and this often by the background thread while the work reports nothing.
TICK_SECONDS = 0.5

#: Updates kept for the estimate (the recent half of the work is what it reads).
MAX_POINTS = 512


class Progress:
    """One live progress line.

    Parameters
    ----------
    label : str
        What is running (``'sinkhorn'``, ``'mapping'``); starts the line and every log line.
    total : int, optional
        Units the work will do at most (``max_iter``): shown as ``done/total`` and a bar, and
        a cap on the estimate. May be set later through the ``total`` attribute.
    show : {'auto', True, False}, default='auto'
        ``'auto'``: draw only once the work has run :data:`AUTO_DELAY_SECONDS` (fast work prints
        nothing); ``True``: draw from the start; ``False``: never draw.
    verbose : bool, default=False
        Print the :meth:`log` lines.
    unit : str, default='it'
        Name of what ``done`` counts.
    stream : file-like, optional
        Where to draw (default ``sys.stderr``).

    Examples
    --------
    >>> import io
    >>> out = io.StringIO()
    >>> with Progress("solve", show=True, verbose=True, stream=out) as progress:
    ...     progress.log("kernel built")
    ...     progress.update(10, error=1e-3, target=1e-6)
    >>> "solve: kernel built" in out.getvalue().splitlines()
    True
    """

    def __init__(
        self,
        label: str,
        *,
        total: int | None = None,
        show: bool | str = "auto",
        verbose: bool = False,
        unit: str = "it",
        stream: TextIO | None = None,
    ) -> None:
        if not (show is True or show is False or show == "auto"):
            raise ValueError(f"show must be True, False or 'auto'; got {show!r}")
        if total is not None and not (isinstance(total, int) and total >= 0):
            raise ValueError(f"total must be None or an integer >= 0; got {total!r}")
        self.label = str(label)
        self.total = total
        self.show = show
        self.verbose = bool(verbose)
        self.unit = str(unit)
        self.stream = sys.stderr if stream is None else stream
        self.started = clock()
        self.done: int | None = None
        self.error: float | None = None
        self.target: float | None = None
        self.closed = False
        self._lock = threading.RLock()
        self._points: deque[tuple[float, int, float | None]] = deque(maxlen=MAX_POINTS)
        self._finish: float | None = None  # the estimated end of the work, on the clock
        self._estimated_at: float | None = None
        self._display: _Display | None = None
        self._drawn_at = -math.inf
        if show is not False:
            _TICKER.add(self)
            if show is True:
                self._draw(self.started, force=True)

    # ------------------------------------------------------------------ what the work calls
    def update(self, done: int, *, error: float | None = None, target: float | None = None) -> None:
        """``done`` iterations (or units) finished so far; ``error`` the current error,
        ``target`` the error it must reach."""
        now = clock()
        with self._lock:
            if self.closed:
                return
            self.done = int(done)
            self.error = None if error is None else float(error)
            if target is not None:
                self.target = float(target)
            log_error = None
            if self.error is not None and self.error > 0 and math.isfinite(self.error):
                log_error = math.log(self.error)
            if self._points and self._points[-1][1] > self.done:
                self._points.clear()  # counting again from fewer units: measure afresh
                self._finish = None
            self._points.append((now, self.done, log_error))
            self._draw(now)

    def log(self, text: str) -> None:
        """A detailed line, printed only when verbose (prefixed by the label), printed above
        the live line without breaking it."""
        if not self.verbose:
            return
        with self._lock:
            line = f"{self.label}: {text}"
            if self._display is not None:
                self._display.write_above(line)
            else:
                _write(self.stream, line + "\n")

    def close(self, status: str = "") -> None:
        """End the line (with ``status``, such as ``'converged'``, when it was shown); nothing
        is printed for work that was never shown. Closing twice does nothing."""
        with self._lock:
            if self.closed:
                return
            now = clock()
            if self._display is None and self.show == "auto":
                self._draw(now)  # work that ran long enough is shown, if only by its last line
            self.closed = True
            _TICKER.discard(self)
            if self._display is not None:
                self._display.finish(self._text(now, status, final=True), self.done, self.total)
                self._display = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind, value, traceback) -> bool:
        if kind is None:
            self.close()
        elif issubclass(kind, KeyboardInterrupt):
            self.close("interrupted")
        else:
            self.close(f"stopped by {kind.__name__}")
        return False

    # -------------------------------------------------------------------------- estimates
    def elapsed(self) -> float:
        """Seconds since the progress was created."""
        return clock() - self.started

    def seconds_left(self) -> float | None:
        """The estimate of the time left, as the line shows it (``None``: nothing to go by)."""
        with self._lock:
            return self._left(clock())

    def _left(self, now: float) -> float | None:
        # One number at a time: recomputed at most once per ESTIMATE_SECONDS, counting down
        # in between.
        if (
            self._finish is None
            or self._estimated_at is None
            or now - self._estimated_at >= ESTIMATE_SECONDS
        ):
            self._finish = self._measure()
            self._estimated_at = now
        return None if self._finish is None else max(0.0, self._finish - now)

    def _measure(self) -> float | None:
        """When the work should end (on the clock), from the updates of the recent half of the
        work: the time per unit, and the error's geometric rate of decrease."""
        if not self._points:
            return None
        t_last, done_last, log_last = self._points[-1]
        if done_last <= 0:
            return None
        recent = [point for point in self._points if point[1] >= done_last / 2]
        if len(recent) < 2 and len(self._points) >= 2:
            recent = list(self._points)[-2:]
        t_first, done_first, _ = recent[0]
        if done_first < done_last:
            seconds_per_unit = (t_last - t_first) / (done_last - done_first)
        else:
            seconds_per_unit = (t_last - self.started) / done_last
        units_left = []
        if self.total is not None:
            units_left.append(max(0, self.total - done_last))
        if log_last is not None and self.target is not None and self.target > 0:
            log_target = math.log(self.target)
            if log_last <= log_target:
                units_left.append(0.0)
            else:
                slope = _slope([(d, e) for _, d, e in recent if e is not None])
                if slope is not None and slope < 0:
                    units_left.append((log_target - log_last) / slope)
        if not units_left:
            return None
        return t_last + min(units_left) * max(0.0, seconds_per_unit)

    # --------------------------------------------------------------------------- drawing
    def tick(self) -> None:
        """Redraw the line if it is due (called by the background thread)."""
        with self._lock:
            if not self.closed:
                self._draw(clock(), ticking=True)

    def _draw(self, now: float, force: bool = False, ticking: bool = False) -> None:
        if self.closed or self.show is False:
            return
        if self._display is None:
            if not force and now - self.started < AUTO_DELAY_SECONDS:
                return
            self._display = _Display.open(self.stream, self.label, self.total)
        interval = REDRAW_SECONDS if self._display.live else LINE_SECONDS
        if ticking and self._display.live:
            interval = TICK_SECONDS * 0.8
        if force or now - self._drawn_at >= interval:
            self._drawn_at = now
            self._display.draw(self._text(now), self.done, self.total)

    def _text(self, now: float, status: str = "", final: bool = False) -> str:
        parts = []
        if self.done is not None:
            if self.total is not None:
                parts.append(f"{self.done}/{self.total} {self.unit}")
            else:
                parts.append(f"{self.done} {self.unit}")
        if self.error is not None:
            error = f"err {self.error:.2e}"
            if self.target is not None:
                error += f" (target {self.target:.1e})"
            parts.append(error)
        parts.append(f"{format_seconds(now - self.started)} elapsed")
        if status:
            parts.append(status)
        elif not final:
            left = self._left(now)
            if left is not None:
                parts.append(f"~{format_seconds(left)} left")
        return f"{self.label}: " + ", ".join(parts)


def format_seconds(seconds: float) -> str:
    """``'4.2 s'``, ``'42 s'``, ``'3 min 05 s'``, ``'2 h 03 min'``.

    Examples
    --------
    >>> format_seconds(4.24), format_seconds(185), format_seconds(7400)
    ('4.2 s', '3 min 05 s', '2 h 03 min')
    """
    if seconds < 9.95:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


def _slope(points: list[tuple[int, float]]) -> float | None:
    """Least-squares slope of ``y`` against ``x`` (``None`` with fewer than two distinct x)."""
    if len(points) < 2:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    if sxx == 0:
        return None
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / sxx


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _write(stream: Any, text: str) -> None:
    try:
        stream.write(text)
        stream.flush()
    except (OSError, ValueError):  # a closed or broken stream: progress is not worth a crash
        pass


class _Display:
    """Where a shown line goes: a tqdm bar, a plain terminal line, or plain log lines."""

    live = False

    def __init__(self, stream: Any, label: str) -> None:
        self.stream = stream
        self.label = label

    @staticmethod
    def open(stream: Any, label: str, total: int | None) -> _Display:
        if not _is_terminal(stream):
            return _Display(stream, label)
        try:
            import tqdm  # noqa: F401  (the optional extra)
        except ImportError:
            return _PlainTerminal(stream, label)
        return _TqdmBar(stream, label, total)

    def draw(self, text: str, done: int | None, total: int | None) -> None:
        _write(self.stream, text + "\n")

    def write_above(self, line: str) -> None:
        _write(self.stream, line + "\n")

    def finish(self, text: str, done: int | None, total: int | None) -> None:
        _write(self.stream, text + "\n")


class _PlainTerminal(_Display):
    """One line rewritten in place with a carriage return."""

    live = True

    def __init__(self, stream: Any, label: str) -> None:
        super().__init__(stream, label)
        self.text = ""
        self.width = 0

    def draw(self, text: str, done: int | None, total: int | None) -> None:
        columns = shutil.get_terminal_size((100, 24)).columns
        self.text = text[: max(10, columns - 1)]
        padding = " " * max(0, self.width - len(self.text))
        self.width = len(self.text)
        _write(self.stream, "\r" + self.text + padding)

    def write_above(self, line: str) -> None:
        _write(self.stream, "\r" + line.ljust(self.width) + "\n" + self.text)

    def finish(self, text: str, done: int | None, total: int | None) -> None:
        self.draw(text, done, total)
        _write(self.stream, "\n")


class _TqdmBar(_Display):
    """A tqdm bar whose description carries the line's text (tqdm's own estimate is not
    shown: the line has one estimate)."""

    live = True

    def __init__(self, stream: Any, label: str, total: int | None) -> None:
        super().__init__(stream, label)
        from tqdm import tqdm

        self.tqdm = tqdm
        self.bar = tqdm(
            total=total,
            file=stream,
            leave=True,
            dynamic_ncols=True,
            mininterval=0,
            disable=False,
            bar_format=self._format(total),
        )

    @staticmethod
    def _format(total: int | None) -> str:
        return "{desc} {percentage:3.0f}%|{bar}|" if total else "{desc}"

    def draw(self, text: str, done: int | None, total: int | None) -> None:
        if total != self.bar.total:
            self.bar.total = total
            self.bar.bar_format = self._format(total)
        if done is not None:
            self.bar.n = min(done, total) if total else done
        self.bar.set_description_str(text, refresh=False)
        self.bar.refresh()

    def write_above(self, line: str) -> None:
        self.tqdm.write(line, file=self.stream)

    def finish(self, text: str, done: int | None, total: int | None) -> None:
        self.draw(text, done, total)
        self.bar.close()


class _Ticker:
    """One background thread for every shown :class:`Progress`: redraws them while the work
    reports nothing (a daemon thread, gone when no progress is open)."""

    def __init__(self) -> None:
        self._live: weakref.WeakSet[Progress] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, progress: Progress) -> None:
        with self._lock:
            self._live.add(progress)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="sketchot-progress", daemon=True
                )
                self._thread.start()

    def discard(self, progress: Progress) -> None:
        with self._lock:
            self._live.discard(progress)

    def _run(self) -> None:
        while True:
            time.sleep(TICK_SECONDS)
            with self._lock:
                live = list(self._live)
                if not live:
                    self._thread = None
                    return
            for progress in live:
                progress.tick()


_TICKER = _Ticker()


class IterationTable:
    """The detailed log of a solve (``verbose=True``): a header, one row per check
    (iteration, residual, elapsed seconds) and a summary with the true-kernel check; prints
    nothing when disabled. ``where`` names the place the solve ran (e.g. ``' on Dask'``)."""

    def __init__(self, enabled: bool, where: str = "") -> None:
        self.enabled = enabled
        self.where = where
        self.started = time.perf_counter()
        self.header_done = False

    def log(self, text: str) -> None:
        if self.enabled:
            print(f"sketchot.sinkhorn: {text}")

    def update(self, iteration: int, *, error: float, target: float | None = None) -> None:
        del target  # the live line shows it; the table keeps its three columns
        if not self.enabled:
            return
        if not self.header_done:
            print(f"{'iter':>6} | {'marginal err (L2)':>18} | {'elapsed s':>9}")
            self.header_done = True
        print(f"{iteration:6d} | {error:18.6e} | {time.perf_counter() - self.started:9.3f}")

    def summary(self, result: Any) -> None:
        """The solve's last lines: its stop, timings, cost, errors and true-kernel check."""
        err_a, err_b = result.marginal_errors
        self.log(
            f"{result.status} after {result.n_iter} iterations{self.where} "
            f"({result.timings['per_iteration'] * 1e3:.2f} ms each, build "
            f"{result.timings['build']:.3f} s); <P, M> = {result.value_linear:.6g}; "
            f"L1 marginal errors a {err_a:.2e}, b {err_b:.2e}"
        )
        if result.true_kernel is not None:
            self.log(str(result.true_kernel))
