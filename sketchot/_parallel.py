"""A small shared thread pool for block-wise numpy work.

numpy, scipy.fft and BLAS release the GIL in their kernels, so independent row blocks can run
on several cores from Python threads. Results are combined in block order, never in
completion order, so the output does not depend on scheduling.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: Worker threads: the cores, at most 4 (memory bandwidth saturates beyond).
THREADS = min(4, os.cpu_count() or 1)

_POOL: ThreadPoolExecutor | None = None


def pool() -> ThreadPoolExecutor:
    """The process-wide pool (created on first use)."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="sketchot")
    return _POOL


def split(items: Sequence[T], parts: int) -> list[Sequence[T]]:
    """Round-robin split ``items[k::parts]``: balanced even when blocks differ in cost."""
    return [items[k::parts] for k in range(parts)]


def run_parts(function: Callable[[Sequence[T]], R], items: Sequence[T], parallel: bool) -> list[R]:
    """``[function(part) for part in split(items, THREADS)]`` on the pool, in part order.

    Runs in the calling thread when ``parallel`` is false, there is one core, or there are
    too few items to share.
    """
    if not parallel or THREADS == 1 or len(items) < 2 * THREADS:
        return [function(items)]
    futures = [pool().submit(function, part) for part in split(items, THREADS)]
    return [future.result() for future in futures]


def for_each(function: Callable[[T], None], items: Iterable[T], parallel: bool) -> None:
    """Call ``function`` on every item (order of side effects unspecified when parallel)."""
    items = list(items)

    def run(part: Sequence[T]) -> None:
        for item in part:
            function(item)

    run_parts(run, items, parallel)
