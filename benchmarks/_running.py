"""How benchmark scripts run their cells: the best of repeated timings, and cells in a child
process stopped at a time budget (imported as a sibling of the scripts)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any

from _results import timed


def best_time(function: Callable[[], Any], repeats: int) -> float:
    """The smallest of ``repeats`` timed calls (s): the least disturbed by other load."""
    return min(timed(function)[0] for _ in range(repeats))


class CellRunner:
    """Runs benchmark cells in one child process (so a cell's peak memory is its own when
    ``fresh``); a cell past ``budget`` seconds is killed and ``None`` returned."""

    def __init__(self, budget: float, fresh: bool = False) -> None:
        self.budget, self.fresh, self.pool = budget, fresh, None

    def __call__(self, function: Callable[..., Any], *args: Any) -> Any:
        if self.pool is None:
            self.pool = multiprocessing.get_context("spawn").Pool(
                1, maxtasksperchild=1 if self.fresh else None
            )
        pending = self.pool.apply_async(function, args)
        try:
            return pending.get(timeout=self.budget)
        except multiprocessing.TimeoutError:
            self.close(kill=True)
            return None

    def close(self, kill: bool = False) -> None:
        if self.pool is not None:
            self.pool.terminate() if kill else self.pool.close()
            # wait for the workers: one killed at exit may be writing a cache (KeOps's)
            self.pool.join()
            self.pool = None
