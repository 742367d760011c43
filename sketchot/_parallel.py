"""A small shared thread pool for block-wise numpy work, with a user-settable size.

numpy, scipy.fft and BLAS release the GIL in their kernels, so independent row blocks can run
on several cores from Python threads. Results are combined in block order, never in
completion order, so the output does not depend on scheduling or on the number of threads.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

from ._validation import check_int

T = TypeVar("T")
R = TypeVar("R")

_LOCK = threading.Lock()
_STATE = {"threads": os.cpu_count() or 1}
_POOL: dict[int, ThreadPoolExecutor] = {}


def get_num_threads() -> int:
    """Worker threads sketchot uses for block-wise work (default: the machine's cores)."""
    return _STATE["threads"]


def set_num_threads(n_threads: int) -> None:
    """Set the number of worker threads (``1`` runs everything in the calling thread)."""
    _STATE["threads"] = check_int(n_threads, "n_threads", minimum=1)


@contextmanager
def thread_limit(n_threads: int) -> Iterator[None]:
    """Context manager: use ``n_threads`` worker threads inside the ``with`` block.

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


def split(items: Sequence[T], parts: int) -> list[Sequence[T]]:
    """Round-robin split ``items[k::parts]``: balanced even when blocks differ in cost."""
    return [items[k::parts] for k in range(parts)]


def run_parts(function: Callable[[Sequence[T]], R], items: Sequence[T], parallel: bool) -> list[R]:
    """``[function(part) for part in split(items, threads)]`` on the pool, in part order.

    Runs in the calling thread when ``parallel`` is false, one thread is set, or there are too
    few items to share.
    """
    threads = get_num_threads()
    if not parallel or threads == 1 or len(items) < 2 * threads:
        return [function(items)]
    futures = [pool(threads).submit(function, part) for part in split(items, threads)]
    return [future.result() for future in futures]


def for_each(function: Callable[[T], None], items: Iterable[T], parallel: bool) -> None:
    """Call ``function`` on every item (order of side effects unspecified when parallel)."""
    items = list(items)

    def run(part: Sequence[T]) -> None:
        for item in part:
            function(item)

    run_parts(run, items, parallel)
