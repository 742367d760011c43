"""A small shared thread pool for block-wise numpy work, with a user-settable size.

numpy, scipy.fft and BLAS release the GIL in their kernels, so independent row blocks can run
on several cores from Python threads.

**Groups.** Items (row blocks) are cut into consecutive groups whose size depends on the number
of items only, never on the number of threads. A group is the unit of work handed to a thread
and the unit of reduction: results come back one per group, in group order, and
:func:`reduce_parts` folds them in that order. Sums of partial results are therefore
bit-identical with 1, 2 or any number of threads, and do not depend on scheduling.

**Interruption.** A run is cancelled when the calling thread is interrupted (Ctrl-C) or when a
group raises: the calling thread waits in short timeouts, so ``KeyboardInterrupt`` reaches it
at once; it then sets the run's cancel flag, drops the groups not started, waits at most
:data:`CANCEL_GRACE_SECONDS` for the running ones and re-raises. A worker sees the flag
between two items: iterating the :class:`Part` it was given raises
:class:`RunCancelledError` once the run is cancelled, so ``for rows in part: ...`` stops after
the current block. A worker whose items are long (``sinkhorn_batch``'s chunks, each solved over
many iterations) also calls :meth:`Part.check` between its own steps. A worker that ran on
would hold the process after the interrupt: the interpreter joins the pool's threads at exit.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

from ._validation import check_int

T = TypeVar("T")
R = TypeVar("R")

#: Most groups a run is cut into (fewer when there are fewer items): enough for any common
#: number of threads to share the work evenly, few enough that handing out a group and
#: combining its result cost nothing next to its blocks.
MAX_GROUPS = 64

#: Seconds an interrupted run waits for the blocks being computed before it re-raises.
CANCEL_GRACE_SECONDS = 1.0

# How often the waiting thread wakes up (a signal is acted on only between bytecodes).
_WAIT_SECONDS = 0.05

_LOCK = threading.Lock()
_STATE = {"threads": os.cpu_count() or 1}
_POOL: dict[int, ThreadPoolExecutor] = {}


def get_num_threads() -> int:
    """Worker threads sketchot uses for block-wise work (default: the machine's cores).

    Returns
    -------
    int
        The number set by :func:`set_num_threads` or :func:`thread_limit`, else the number
        of cores.
    """
    return _STATE["threads"]


def set_num_threads(n_threads: int) -> None:
    """Set the number of worker threads (``1`` runs everything in the calling thread).

    Large kernel products and passes are split over these threads, with partial sums added
    in a fixed order, so results do not depend on the number of threads or on scheduling.
    BLAS's own threads are not changed.

    Parameters
    ----------
    n_threads : int
        At least 1.

    See Also
    --------
    thread_limit : the same inside a ``with`` block only.
    """
    _STATE["threads"] = check_int(n_threads, "n_threads", minimum=1)


@contextmanager
def thread_limit(n_threads: int) -> Iterator[None]:
    """Context manager: use ``n_threads`` worker threads inside the ``with`` block.

    Parameters
    ----------
    n_threads : int
        At least 1; the previous number is restored when the block exits, also on an
        exception.

    Examples
    --------
    >>> import sketchot
    >>> with sketchot.thread_limit(1):
    ...     sketchot.get_num_threads()
    1
    """
    previous = get_num_threads()
    set_num_threads(n_threads)
    try:
        yield
    finally:
        _STATE["threads"] = previous


def pool(threads: int) -> ThreadPoolExecutor:
    """The process-wide pool of ``threads`` workers (created on first use)."""
    with _LOCK:
        if threads not in _POOL:
            _POOL[threads] = ThreadPoolExecutor(threads, thread_name_prefix="sketchot")
        return _POOL[threads]


class RunCancelledError(Exception):
    """Raised in a worker by iterating its :class:`Part` after the run was cancelled."""


class Part(Sequence[T]):
    """One group of items, as a worker function receives it.

    A read-only sequence; iterating it checks the run's cancel flag before each item and
    raises :class:`RunCancelledError` once the run is cancelled (Ctrl-C in the calling thread,
    or an error in another group), so a worker written as ``for rows in part: ...`` stops
    between two blocks.

    Parameters
    ----------
    items : sequence
        The group's items, in order.
    index : int
        Position of the group in the run (results come back in this order).
    cancel : threading.Event, optional
        The run's cancel flag (``None``: never cancelled, as in the calling thread).
    """

    def __init__(self, items: Sequence[T], index: int = 0, cancel: threading.Event | None = None):
        self.items = items
        self.index = index
        self._cancel = cancel

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, key):
        return self.items[key]

    def __iter__(self) -> Iterator[T]:
        for item in self.items:
            self.check()
            yield item

    def cancelled(self) -> bool:
        """Whether the run was cancelled (for workers that check between their own steps)."""
        return self._cancel is not None and self._cancel.is_set()

    def check(self) -> None:
        """Raise :class:`RunCancelledError` if the run was cancelled: for a worker whose one
        item is long (a chunk of problems solved over many iterations), to call between its
        own steps, so that Ctrl-C stops it as promptly as a row block would."""
        if self.cancelled():
            raise RunCancelledError(f"group {self.index} stopped: the run was cancelled")


def groups(items: Sequence[T], size: int | None = None) -> list[Sequence[T]]:
    """Consecutive groups of ``size`` items (the last one shorter).

    ``size=None`` cuts ``items`` into at most :data:`MAX_GROUPS` groups of
    ``ceil(len(items) / MAX_GROUPS)`` items. The grouping depends on ``len(items)`` only, never
    on the number of threads.

    Examples
    --------
    >>> groups(list(range(5)), 2)
    [[0, 1], [2, 3], [4]]
    """
    if size is None:
        size = max(1, -(-len(items) // MAX_GROUPS))
    size = check_int(size, "size", minimum=1)
    return [items[start : start + size] for start in range(0, len(items), size)]


def run_parts(
    function: Callable[[Part[T]], R],
    items: Sequence[T],
    parallel: bool,
    *,
    group: int | None = None,
    threads: int | None = None,
) -> list[R]:
    """``[function(part) for part in groups(items, group)]``, on the pool, in group order.

    Runs in the calling thread when ``parallel`` is false, one thread is set, or there are too
    few items to share; the groups and the order of the results are the same either way, so
    combining the results in list order gives the same bits with any number of threads.
    ``function`` receives a :class:`Part`: iterating it raises :class:`RunCancelledError` once
    the run is cancelled. Ctrl-C in the calling thread cancels the run: the groups not started are
    dropped, the running ones stop after their current item, and ``KeyboardInterrupt`` is
    re-raised within about a block's time. An error in one group cancels the others the same
    way and is re-raised.

    Parameters
    ----------
    function : callable
        Called once per group with a :class:`Part`.
    items : sequence
        The items (typically row slices).
    parallel : bool
        Whether the run may use the pool.
    group : int, optional
        Items per group (default: see :func:`groups`). Results that are summed must use a
        grouping that does not depend on the thread count (any fixed number, or the default).
    threads : int, optional
        Workers at most (default :func:`get_num_threads`), e.g. fewer where each group
        holds much memory.

    Returns
    -------
    list
        One result per group, in group order (one group, empty, when there is no item).

    Examples
    --------
    >>> run_parts(lambda part: sum(part), list(range(10)), parallel=True, group=4)
    [6, 22, 17]
    """
    results: list[R] = []
    _drive(function, _nonempty_groups(items, group), parallel, results.append, threads)
    return results


def reduce_parts(
    function: Callable[[Part[T]], R],
    items: Sequence[T],
    parallel: bool,
    combine: Callable[[R, R], R],
    *,
    group: int | None = None,
) -> R:
    """:func:`run_parts` folded as ``combine(...combine(combine(r0, r1), r2)..., rk)``.

    The fold runs in group order (bit-identical results with any number of threads) as the
    groups finish, so at most a few results per thread are held at once, whatever the number
    of groups. ``combine`` may update its first argument in place (see :func:`add_in_place`).

    Examples
    --------
    >>> import numpy as np
    >>> def part(rows):
    ...     total = np.zeros(2)
    ...     for i in rows:
    ...         total += [i, 1]
    ...     return total
    >>> reduce_parts(part, range(100), True, add_in_place)
    array([4950.,  100.])
    """
    folded: list[R] = []

    def fold(result: R) -> None:
        if folded:
            folded[0] = combine(folded[0], result)
        else:
            folded.append(result)

    _drive(function, _nonempty_groups(items, group), parallel, fold)
    return folded[0]


def add_in_place(total, more):
    """``total += more; return total``: the ``combine`` of a sum (numpy arrays, in place)."""
    total += more
    return total


def _nonempty_groups(items: Sequence[T], group: int | None) -> list[Sequence[T]]:
    """:func:`groups`, or one empty group when there is no item (``function`` still runs once)."""
    return groups(items, group) or [items[:0]]


def _drive(
    function: Callable[[Part[T]], R],
    parts: list[Sequence[T]],
    parallel: bool,
    consume: Callable[[R], None],
    threads: int | None = None,
) -> None:
    """Run ``function`` on every group and pass the results to ``consume`` in group order."""
    threads = get_num_threads() if threads is None else min(threads, get_num_threads())
    n_items = sum(len(part) for part in parts)
    if not parallel or threads == 1 or len(parts) < 2 or n_items < 2 * threads:
        for index, items in enumerate(parts):
            consume(function(Part(items, index)))
        return
    run = _SharedRun(function, parts, consume, window=2 * threads)
    workers = [pool(threads).submit(run.work) for _ in range(min(threads, len(parts)))]
    try:
        waiting = set(workers)
        while waiting:
            # Short waits: a signal handler (Ctrl-C) runs only when this thread wakes up.
            done, waiting = futures.wait(
                waiting, timeout=_WAIT_SECONDS, return_when=futures.FIRST_EXCEPTION
            )
            for worker in done:
                worker.result()  # a worker's error, re-raised here
    except BaseException:
        run.cancel.set()
        for worker in workers:
            worker.cancel()
        futures.wait(workers, timeout=CANCEL_GRACE_SECONDS)
        raise


class _SharedRun:
    """What the workers of one pooled run share.

    Each worker takes the next group not taken yet (so the threads share the work however the
    groups differ in cost) and hands its result over in group order: results that finish early
    wait in ``_finished`` until the groups before them are consumed. A worker does not take a
    group more than ``window`` groups ahead of the first one not consumed, which bounds the
    results held at once.
    """

    def __init__(
        self,
        function: Callable[[Part[T]], R],
        parts: list[Sequence[T]],
        consume: Callable[[R], None],
        window: int,
    ) -> None:
        self.function, self.parts, self.consume, self.window = function, parts, consume, window
        self.cancel = threading.Event()
        self._turn = threading.Condition()
        self._next_group = 0
        self._next_consumed = 0
        self._finished: dict[int, R] = {}

    def work(self) -> None:
        """One worker: take groups until none is left or the run is cancelled."""
        while True:
            with self._turn:
                while self._next_group - self._next_consumed >= self.window:
                    if self.cancel.is_set():
                        return
                    self._turn.wait(_WAIT_SECONDS)
                index = self._next_group
                self._next_group += 1
            if index >= len(self.parts) or self.cancel.is_set():
                return
            result = self.function(Part(self.parts[index], index, self.cancel))
            with self._turn:
                self._finished[index] = result
                while self._next_consumed in self._finished:
                    self.consume(self._finished.pop(self._next_consumed))
                    self._next_consumed += 1
                self._turn.notify_all()


def for_each(function: Callable[[T], None], items: Iterable[T], parallel: bool) -> None:
    """Call ``function`` on every item (order of side effects unspecified when parallel)."""
    items = list(items)

    def run(part: Part[T]) -> None:
        for item in part:
            function(item)

    run_parts(run, items, parallel)
