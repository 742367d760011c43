"""The shared thread pool: results independent of the thread count, and Ctrl-C honoured at once."""

from __future__ import annotations

import _thread
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import sketchot
from sketchot._parallel import (
    MAX_GROUPS,
    Part,
    RunCancelledError,
    add_in_place,
    groups,
    reduce_parts,
    run_parts,
)
from sketchot.kernels.base import THREADED_PASS_MIN_ENTRIES, matrix_fused_pass

ROOT = Path(__file__).resolve().parents[1]


def test_groups_depend_on_the_number_of_items_only():
    assert groups(list(range(7)), 3) == [[0, 1, 2], [3, 4, 5], [6]]
    many = list(range(10 * MAX_GROUPS + 3))
    assert len(groups(many)) <= MAX_GROUPS
    assert [x for part in groups(many) for x in part] == many
    assert groups(list(range(5))) == [[0], [1], [2], [3], [4]]


@pytest.mark.parametrize("threads", [1, 2, 3, 5])
def test_results_come_back_one_per_group_in_group_order(threads):
    rng = np.random.default_rng(threads)
    delays = rng.uniform(0, 2e-3, size=40)

    def part(items):
        for index in items:
            time.sleep(delays[index])  # finish out of order
        return list(items)

    with sketchot.thread_limit(threads):
        results = run_parts(part, list(range(40)), parallel=True, group=3)
    assert results == groups(list(range(40)), 3)


def test_threads_caps_the_workers_of_one_run():
    def part(items):
        time.sleep(0.02)  # long enough for every worker to take a group
        return threading.current_thread().name

    with sketchot.thread_limit(3):
        names = run_parts(part, list(range(8)), parallel=True, group=1, threads=1)
        assert set(names) == {threading.current_thread().name}  # the calling thread
        names = run_parts(part, list(range(8)), parallel=True, group=1, threads=2)
        assert len(set(names)) == 2


def test_sums_are_bit_identical_with_any_number_of_threads():
    rng = np.random.default_rng(7)
    values = rng.standard_normal((500, 64)) * 10.0 ** rng.integers(-8, 8, size=(500, 1))

    def part(rows):
        total = np.zeros(64)
        for i in rows:
            total += values[i]
        return total

    sums = []
    for threads in (1, 2, 3, 4):
        with sketchot.thread_limit(threads):
            sums.append(reduce_parts(part, range(500), True, add_in_place))
            listed = run_parts(part, range(500), True)
            assert np.array_equal(sum(listed[1:], listed[0].copy()), sums[0])
    for other in sums[1:]:
        assert np.array_equal(other, sums[0])
    np.testing.assert_allclose(sums[0], values.sum(axis=0), rtol=1e-12, atol=1e-6)


def test_no_item_still_calls_the_function_once():
    assert run_parts(lambda part: len(part), [], parallel=True) == [0]
    assert reduce_parts(lambda part: 0.0, [], True, add_in_place) == 0.0


@pytest.mark.parametrize("source", ["matrix", "streamed exact"])
def test_threaded_fused_passes_are_bit_identical_for_1_2_and_3_threads(source):
    rng = np.random.default_rng(3)
    if source == "matrix":
        F = rng.random((30_000, 150))  # 4.5e6 entries: threaded, 18 blocks
        w, c = rng.random(150), rng.random(30_000) + 0.1

        def fused():
            return matrix_fused_pass(F, w, c, np.float64)

        entries = F.size
    else:  # 6 row blocks of the streamed kernel, recomputed by every pass
        X, Y = rng.random((6000, 20)), rng.random((2000, 20))
        K = sketchot.make_kernel(X, Y, 2.0, backend="exact", max_dense_bytes=0)
        w, c = rng.random(2000), np.full(6000, 1 / 6000)

        def fused():
            return K.fused_pass("rows", w, c)

        entries = X.shape[0] * Y.shape[0]
    assert entries >= THREADED_PASS_MIN_ENTRIES
    passes = []
    for threads in (1, 2, 3):
        with sketchot.thread_limit(threads):
            passes.append(fused())
    for other in passes[1:]:
        for field in ("products", "ratios", "projection", "bad"):
            assert np.array_equal(getattr(other, field), getattr(passes[0], field)), field


def test_an_error_in_one_group_stops_the_others_and_is_raised():
    started = []

    def part(items):
        for index in items:
            started.append(index)
            if index == 3:
                raise ValueError("block 3 is broken")
            time.sleep(0.01)
        return None

    with sketchot.thread_limit(2), pytest.raises(ValueError, match="block 3 is broken"):
        run_parts(part, list(range(400)), parallel=True, group=4)
    time.sleep(0.1)
    assert len(started) < 20  # the other worker stopped too: no group past the window ran


def test_ctrl_c_in_the_calling_thread_stops_the_workers_between_blocks():
    processed = []

    def part(items):
        for index in items:
            time.sleep(0.02)  # a block of work (sleep releases the GIL, as numpy does)
            processed.append(index)

    timer = threading.Timer(0.2, _thread.interrupt_main)
    tick = time.perf_counter()
    with sketchot.thread_limit(2), pytest.raises(KeyboardInterrupt):
        timer.start()
        run_parts(part, list(range(2000)), parallel=True)  # 20 s of blocks on 2 threads
    assert time.perf_counter() - tick < 1.0
    count = len(processed)
    time.sleep(0.1)
    assert len(processed) == count  # nothing runs on after the interrupt


def test_a_cancelled_part_raises_when_iterated():
    flag = threading.Event()
    part = Part([1, 2, 3], 0, flag)
    seen = []
    with pytest.raises(RunCancelledError):
        for item in part:
            seen.append(item)
            flag.set()
    assert seen == [1] and part.cancelled() and len(part) == 3 and part[2] == 3


CHILD = textwrap.dedent(
    """
    import numpy as np
    import sketchot

    sketchot.set_num_threads(2)
    rng = np.random.default_rng(0)
    n = 40_000  # one streamed pass: about 10 s on 2 cores
    X, Y = rng.random((n, 20)), rng.random((n, 20))
    K = sketchot.make_kernel(X, Y, 1.0, backend="exact", max_dense_bytes=0)
    a, v = np.full(n, 1 / n), np.ones(n)
    print("started", flush=True)
    while True:
        K.fused_pass("rows", v, a)
    """
)


def _seconds_to_exit_after_sigint(tmp_path, code: str, *args: str, wait: float) -> float:
    """Run ``code`` in a child Python, send SIGINT a second after it prints ``started``, and
    return the seconds it took to exit (it must say ``KeyboardInterrupt``)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    child = subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    try:
        assert child.stdout.readline().strip() == "started"
        time.sleep(1.0)  # well inside the work, its workers busy
        assert child.poll() is None
        tick = time.perf_counter()
        child.send_signal(signal.SIGINT)
        child.wait(timeout=wait)
        elapsed = time.perf_counter() - tick
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    stderr = child.stderr.read()
    assert "KeyboardInterrupt" in stderr, stderr
    return elapsed


def test_ctrl_c_stops_a_long_streamed_exact_solve_within_a_few_seconds(tmp_path):
    elapsed = _seconds_to_exit_after_sigint(tmp_path, CHILD, wait=30)
    assert elapsed < 3.0, f"the process took {elapsed:.1f} s to exit after SIGINT"


BATCH_CHILD = textwrap.dedent(
    """
    import sys
    import numpy as np
    import sketchot

    sketchot.set_num_threads(2)
    rng = np.random.default_rng(0)
    # 5 chunks of 46 pairs of 150 x 150 points, each chunk about 9 s at reg 5e-4 (20000
    # iterations): the pool's workers are inside a chunk's iterations when the signal comes
    X, Y = rng.random((200, 150, 2)), rng.random((200, 150, 2)) + 0.3
    options = dict(reg=5e-4, tol=1e-9, max_iter=20_000)
    print("started", flush=True)
    if sys.argv[1] == "sinkhorn_batch":
        sketchot.sinkhorn_batch(X, Y, **options)
    else:
        sketchot.pairwise_divergences(X, **options)
    """
)


@pytest.mark.parametrize("entry", ["sinkhorn_batch", "pairwise_divergences"])
def test_ctrl_c_stops_the_batch_workers_inside_their_chunk(tmp_path, entry):
    """Issue 42: Ctrl-C in sinkhorn_batch printed the interrupt, then the process ran on for
    25-60 s: each worker finished its chunk (up to max_iter iterations) before the interpreter
    could join it. The workers now check the run's cancel flag at every engine check."""
    elapsed = _seconds_to_exit_after_sigint(tmp_path, BATCH_CHILD, entry, wait=60)
    # every other entry stops within 0.3 s; 3 s leaves room for a loaded machine
    assert elapsed < 3.0, f"the process took {elapsed:.1f} s to exit after SIGINT"


def test_a_worker_with_one_long_item_checks_the_flag_itself():
    """Part.check: for workers whose single item is long (a batch's chunk)."""
    steps = []

    def part(items):
        for _ in items:
            for step in range(400):  # one long item: 400 steps of 5 ms
                items.check()
                time.sleep(0.005)
                steps.append(step)

    timer = threading.Timer(0.2, _thread.interrupt_main)
    tick = time.perf_counter()
    with sketchot.thread_limit(2), pytest.raises(KeyboardInterrupt):
        timer.start()
        run_parts(part, list(range(4)), parallel=True, group=1)
    assert time.perf_counter() - tick < 1.0
    count = len(steps)
    time.sleep(0.1)
    assert len(steps) == count  # the workers stopped inside their item
