"""The colour programs under Ctrl-C (one line, exit code 130, at once) and their live steps."""

from __future__ import annotations

import io
import signal
import subprocess
import sys
import time
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sketchot.color.cli import EXIT_INTERRUPTED, INTERRUPTED
from sketchot.color.steps import Steps
from sketchot.solver import progress as progress_module

ROOT = Path(__file__).resolve().parents[2]

# Runs a program with an import that hangs: Ctrl-C arrives while the libraries load.
SLOW_IMPORT = """
import runpy, sys, time

class SlowMatplotlib:
    def find_spec(self, name, path=None, target=None):
        if name == "matplotlib":
            print("importing", flush=True)
            time.sleep(60)
        return None

sys.meta_path.insert(0, SlowMatplotlib())
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def interrupt(process: subprocess.Popen, after: str, wait: float = 0.0):
    """SIGINT once ``after`` appears on the process's stdout (and ``wait`` seconds more);
    returns (seconds from the signal to the exit, stdout, stderr)."""
    seen = []
    try:
        for line in process.stdout:
            seen.append(line)
            if after in line:
                break
        else:
            pytest.fail(f"the program ended before {after!r}: {process.stderr.read()}")
        time.sleep(wait)
        assert process.poll() is None, "the program ended before the signal"
        tick = time.perf_counter()
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
        return time.perf_counter() - tick, "".join(seen) + out, err
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def start(programs, *command) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, *map(str, command)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=ROOT, env=programs.env,
    )  # fmt: skip


@pytest.mark.parametrize("program", ["color_transfer", "compare_backends"])
def test_ctrl_c_while_the_libraries_load_is_one_line_and_exit_code_130(
    programs, tiny_pair, tmp_path, program
):
    source, target = tiny_pair
    process = start(programs, "-c", SLOW_IMPORT, programs.path(program), source, target,
                    "--out", tmp_path / "r.png")  # fmt: skip
    elapsed, out, err = interrupt(process, "importing")
    assert process.returncode == EXIT_INTERRUPTED
    assert err.splitlines() == [INTERRUPTED]
    assert "Traceback" not in out
    assert elapsed < 2.0
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def large_pair(tmp_path_factory):
    """Two 120 x 120 images of random colours: 14400 pixels to sample from."""
    folder = tmp_path_factory.mktemp("large")
    rng = np.random.default_rng(11)
    for name in ("a.png", "b.png"):
        Image.fromarray(rng.integers(0, 256, (120, 120, 3), dtype=np.uint8)).save(folder / name)
    return folder / "a.png", folder / "b.png"


def test_ctrl_c_during_a_long_solve_stops_at_once_with_one_line(programs, large_pair, tmp_path):
    """A streamed exact solve (12000 x 12000 kernel, past the 1 GiB dense budget) whose
    iterations take seconds each, on the pool's threads: interrupted after 2.5 s."""
    source, target = large_pair
    old = tmp_path / "r.png"
    old.write_bytes(b"previous run")
    process = start(programs, programs.path("color_transfer"), source, target, "--out", old,
                    "--backend", "exact", "--n-samples", 12000, "--reg", 0.01, "--tol", 1e-300,
                    "--max-iter", 100000)  # fmt: skip
    elapsed, out, err = interrupt(process, "solving entropic OT", wait=2.5)
    assert process.returncode == EXIT_INTERRUPTED
    assert err.splitlines()[-1] == INTERRUPTED
    # besides warnings, only the solver's own live line (sketchot.solver.progress) and the
    # one-line error that says the outputs were kept
    allowed = ("warning: ", "sinkhorn (", "error: interrupted")
    assert all(line.startswith(allowed) for line in err.splitlines()[:-1] if line), err
    assert "Traceback" not in out + err
    assert elapsed < 3.0, f"{elapsed:.1f} s from Ctrl-C to the exit"
    # the solve ran past the couple of seconds: its live line was shown, then closed
    lines = out.splitlines()
    shown = [line for line in lines if line.startswith("solving: ") and " s elapsed" in line]
    assert shown and shown[-1].endswith("interrupted"), out
    assert old.read_bytes() == b"previous run"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.png"]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_steps_show_the_slow_steps_only_and_keep_every_message(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(progress_module, "clock", clock)
    out = io.StringIO()
    steps = Steps(out)
    steps.start("loading")
    clock.now += 0.5  # fast: nothing shown
    steps.say("sampling 100 pixels from the source (10 x 10) and the target (10 x 10)")
    clock.now += 0.1
    steps.say("solving entropic OT between 100 and 100 colours: backend='exact', reg=0.1")
    with redirect_stdout(steps.lines()):
        print("  iter | marginal err")
        clock.now += 3.0  # slow: shown
        print("    10 | 1e-3")
    steps.say("kernel built in 0.001 s; converged after 10 iterations (0.10 ms each)")
    steps.say("mapping all 400 source pixels")
    for done in (100, 200, 300):
        clock.now += 1.5
        steps.say(f"mapped {done}/300 distinct colours ({done / 3:.0f}%, {clock.now:.2f} s)")
    steps.finish()
    lines = out.getvalue().splitlines()
    assert not any(line.startswith(("loading:", "sampling:")) for line in lines)
    assert "solving:   iter | marginal err" in lines  # the solver's lines, under the step
    assert "solving:     10 | 1e-3" in lines
    assert any(line.startswith("solving: 3.0 s elapsed") for line in lines)
    assert any("] kernel built" in line for line in lines)
    mapping = [line for line in lines if line.startswith("mapping the source: ")]
    assert "mapping the source: mapped 300/300 distinct colours (100%, 8.10 s)" in mapping
    assert mapping[-1] == "mapping the source: 300/300 colours, 4.5 s elapsed"
