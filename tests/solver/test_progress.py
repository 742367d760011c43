"""The live progress line: its estimate of the time left, and when it prints (or not)."""

from __future__ import annotations

import builtins
import io
import math
import re
import sys
from contextlib import contextmanager

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sketchot.solver import progress as progress_module
from sketchot.solver.progress import (
    AUTO_DELAY_SECONDS,
    ESTIMATE_SECONDS,
    LINE_SECONDS,
    Progress,
    format_seconds,
)


class FakeClock:
    """A clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@contextmanager
def fake_clock():
    """Replace the clock of every Progress (without pytest fixtures: hypothesis reruns)."""
    real = progress_module.clock
    clock = FakeClock()
    progress_module.clock = clock
    try:
        yield clock
    finally:
        progress_module.clock = real


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@contextmanager
def recorded_imports():
    """Names imported inside the block."""
    names: list[str] = []
    real = builtins.__import__

    def recording(name, *args, **kwargs):
        names.append(name)
        return real(name, *args, **kwargs)

    builtins.__import__ = recording
    try:
        yield names
    finally:
        builtins.__import__ = real


# ------------------------------------------------------------------------------ estimate
@settings(max_examples=150, deadline=None)
@given(
    rate=st.floats(0.3, 0.999),
    first_error=st.floats(1e-6, 1e3),
    iterations_to_target=st.integers(4, 5000),
    seen=st.floats(0.2, 0.95),
    seconds_per_iteration=st.floats(1e-4, 30.0),
    setup=st.floats(0.0, 100.0),
    every=st.sampled_from([1, 3, 10]),
    total_slack=st.one_of(st.none(), st.integers(-2000, 2000)),
)
def test_estimate_extrapolates_a_geometric_error_to_its_target(
    rate, first_error, iterations_to_target, seen, seconds_per_iteration, setup, every,
    total_slack,
):  # fmt: skip
    """error_k = e0 r^k reaches target = e0 r^K at K: the time left after k is (K - k) x dt,
    capped by the iterations left before ``total``."""
    assume(math.log(first_error) + iterations_to_target * math.log(rate) > -700)  # no underflow
    target = first_error * rate**iterations_to_target
    last = max(2 * every, int(seen * iterations_to_target) // every * every)
    if last >= iterations_to_target:
        return
    total = None if total_slack is None else max(last, iterations_to_target + total_slack)
    with fake_clock() as clock:
        progress = Progress("solve", total=total, show=False)
        clock.advance(setup)  # building a kernel: not part of the time per iteration
        for done in range(every, last + 1, every):
            clock.advance(every * seconds_per_iteration)
            progress.update(done, error=first_error * rate**done, target=target)
        left = progress.seconds_left()
    iterations_left = iterations_to_target - last
    if total is not None:
        iterations_left = min(iterations_left, total - last)
    expected = iterations_left * seconds_per_iteration
    assert left == pytest.approx(expected, rel=1e-6, abs=1e-9 * seconds_per_iteration)


def test_estimate_from_the_rate_alone_and_none_without_anything_to_go_by():
    with fake_clock() as clock:
        progress = Progress("mapping", total=1000, show=False, unit="colours")
        assert progress.seconds_left() is None
        for done in (100, 200, 300):
            clock.advance(2.0)
            progress.update(done)
        assert progress.seconds_left() == pytest.approx(700 * 0.02)
        unbounded = Progress("solve", show=False)
        for done, error in ((10, 1.0), (20, 2.0), (30, 4.0)):  # growing: no crossing ahead
            clock.advance(1.0)
            unbounded.update(done, error=error, target=1e-3)
        assert unbounded.seconds_left() is None
        unbounded.update(40, error=1e-4, target=1e-3)  # reached
        clock.advance(ESTIMATE_SECONDS)
        assert unbounded.seconds_left() == 0.0


def test_the_estimate_is_one_number_counting_down_within_a_second():
    with fake_clock() as clock:
        progress = Progress("solve", total=10_000, show=False)
        for done in (10, 20, 30):
            clock.advance(1.0)
            progress.update(done)
        first = progress.seconds_left()
        assert first == pytest.approx(9970 * 0.1)
        clock.advance(0.4)
        progress.update(40)  # 10 times faster: a different measure, not shown yet
        assert progress.seconds_left() == pytest.approx(first - 0.4)
        clock.advance(ESTIMATE_SECONDS)
        # recomputed from the updates of the recent half (done >= 20): 1.4 s for 20 iterations
        assert progress.seconds_left() == pytest.approx(9960 * 0.07 - ESTIMATE_SECONDS)


# ------------------------------------------------------------------------------- output
def test_show_false_prints_nothing_even_for_long_work():
    out = io.StringIO()
    with fake_clock() as clock, Progress("solve", total=100, show=False, stream=out) as bar:
        for done in range(1, 101):
            clock.advance(1.0)
            bar.update(done, error=0.9**done, target=1e-9)
            bar.log("a detailed line nobody asked for")
        bar.tick()
    assert out.getvalue() == ""


@pytest.mark.parametrize("stream", [io.StringIO, Terminal])
def test_fast_work_prints_nothing_and_imports_no_tqdm(stream):
    out = stream()
    with recorded_imports() as imported, fake_clock() as clock:
        bar = Progress("solve", total=500, stream=out)
        for done in range(1, 501):
            clock.advance(0.003)  # 1.5 s in all
            bar.update(done, error=0.5**done, target=1e-12)
        bar.tick()
        bar.close("converged")
    assert out.getvalue() == ""
    assert not [name for name in imported if name.startswith("tqdm")]


def test_slow_work_on_a_log_stream_prints_a_line_every_few_seconds():
    out = io.StringIO()
    with fake_clock() as clock, Progress("solve", total=1000, stream=out) as bar:
        for done in range(1, 201):
            clock.advance(0.1)  # 20 s in all
            bar.update(done, error=0.97**done, target=1e-9)
    lines = out.getvalue().splitlines()
    assert len(lines) <= math.ceil((20 - AUTO_DELAY_SECONDS) / LINE_SECONDS) + 1
    assert len(lines) >= 3
    assert all(line.startswith("solve: ") for line in lines)
    assert "err " in lines[0] and "(target 1.0e-09)" in lines[0] and " left" in lines[0]
    assert lines[-1].startswith("solve: 200/1000 it") and " left" not in lines[-1]
    assert "20 s elapsed" in lines[-1]


def test_verbose_log_lines_appear_prefixed_and_only_when_verbose():
    quiet, loud = io.StringIO(), io.StringIO()
    for out, verbose in ((quiet, False), (loud, True)):
        with Progress("sinkhorn", show=False, verbose=verbose, stream=out) as bar:
            bar.log("kernel built in 0.1 s")
            bar.update(10, error=1e-3, target=1e-6)
            bar.log("check at 10: err 1e-3")
    assert quiet.getvalue() == ""
    assert loud.getvalue().splitlines() == [
        "sinkhorn: kernel built in 0.1 s",
        "sinkhorn: check at 10: err 1e-3",
    ]


def test_without_tqdm_a_terminal_gets_one_line_rewritten_in_place(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm raises ImportError
    out = Terminal()
    with fake_clock() as clock:
        bar = Progress("solve", total=300, show=True, verbose=True, stream=out)
        for done in range(1, 301):
            clock.advance(0.05)
            bar.update(done, error=0.95**done, target=1e-6)
            if done == 150:
                bar.log("halfway")
        bar.close("converged")
    text = out.getvalue()
    assert text.count("\n") == 2  # the log line and the closed line: the rest is rewritten
    frames = text.split("\r")
    assert len(frames) > 10
    assert any(frame.startswith("solve: halfway") for frame in frames)
    assert frames[-1].startswith("solve: 300/300 it") and "converged" in frames[-1]
    assert text.endswith("\n")


def test_with_tqdm_a_terminal_gets_a_bar_with_one_estimate():
    pytest.importorskip("tqdm")
    out = Terminal()
    with (
        fake_clock() as clock,
        Progress("solve", total=200, show=True, verbose=True, stream=out) as bar,
    ):
        for done in range(1, 201):
            clock.advance(0.05)
            bar.update(done, error=0.9**done, target=1e-20)
            if done == 100:
                bar.log("halfway")
    text = out.getvalue()
    assert "solve: halfway\n" in text
    frames = [frame for frame in re.split(r"[\r\n]", text) if frame.startswith("solve: 1")]
    assert frames and all(frame.count("left") <= 1 for frame in frames)
    assert not re.search(r"\d<\d", text)  # tqdm's own estimate ([00:01<00:02]) is not shown
    assert "100%|" in text and "200/200 it" in text


def test_ctrl_c_closes_the_line_as_interrupted():
    out = io.StringIO()
    with pytest.raises(KeyboardInterrupt), Progress("solve", show=True, stream=out) as bar:
        bar.update(3)
        raise KeyboardInterrupt
    assert out.getvalue().splitlines()[-1].endswith("interrupted")
    bar.update(4)  # closed: ignored
    bar.close()
    assert out.getvalue().splitlines()[-1].endswith("interrupted")


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="show must be"):
        Progress("x", show="yes")
    with pytest.raises(ValueError, match="total must be"):
        Progress("x", total=-1)


def test_format_seconds():
    assert [format_seconds(s) for s in (0.04, 9.94, 9.96, 59.4, 61, 3599, 3600 * 5 + 61)] == [
        "0.0 s", "9.9 s", "10 s", "59 s", "1 min 01 s", "59 min 59 s", "5 h 01 min",
    ]  # fmt: skip
