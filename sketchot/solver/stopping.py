"""When the Sinkhorn iteration stops: the residual's norm, the checks, stalls and history.

Every driver of :mod:`~sketchot.solver.engine` (two-sided and symmetric) measures its
fixed-point residual with a :class:`ResidualNorm` and hands each measurement to a
:class:`Stopper`, which records the history, reports progress and decides between going on,
``'converged'``, ``'stalled'`` and ``'breakdown'`` (a non-finite residual).

The stall rule: a run whose best error has not improved by :data:`STALL_IMPROVEMENT` over
:data:`STALL_CHECKS` checks and :data:`STALL_ITERATIONS` iterations stops as stalled.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

#: A run stops as stalled when its best error improved by less than this factor over the
#: last :data:`STALL_CHECKS` checks (rounding has taken over: e.g. float64 potentials of a
#: tiny ``reg``, where ``C / reg`` leaves too few significant digits).
STALL_IMPROVEMENT = 0.99
STALL_CHECKS = 30
#: ... and over this many iterations: frequent checks (a check every iteration) must not
#: take a slow stretch of a small ``reg`` for a stall.
STALL_ITERATIONS = 300

NORMS = ("l2", "l1")


class ResidualNorm:
    """A residual vector's norm relative to the mass: ``norm='l2'``, ``||.||_2 / sum(b)``;
    ``norm='l1'``, ``||.||_1 / sum(a)``. With ``blocks > 1`` (a block-diagonal kernel of
    independent problems) the largest block's, each over its own mass.

    Parameters
    ----------
    norm : {'l2', 'l1'}
        The norm.
    a, b : ndarray
        The weights of the rows and the columns (the mass is ``sum(a)`` or ``sum(b)``).
    blocks : int, default=1
        Independent problems stacked in ``a`` and ``b``, of equal sizes.
    """

    def __init__(self, norm: str, a: np.ndarray, b: np.ndarray, blocks: int = 1) -> None:
        self.norm = norm
        mass = a if norm == "l1" else b
        self.mass = float(mass.sum())
        self.blocks = blocks
        self.block_mass = mass.reshape(blocks, -1).sum(axis=1) if blocks > 1 else None

    def __call__(self, diff: np.ndarray) -> float:
        """The relative norm of ``diff``, scaled by its largest entry first (no overflow of
        the squares); ``inf`` or ``nan`` when an entry is not finite."""
        scale = float(np.max(np.abs(diff))) if diff.size else 0.0
        if not math.isfinite(scale) or scale == 0.0:
            return scale
        ord_ = 1 if self.norm == "l1" else 2
        if self.block_mass is not None:
            norms = np.linalg.norm((diff / scale).reshape(self.blocks, -1), ord=ord_, axis=1)
            return scale * float(np.max(norms / self.block_mass))
        return scale * float(np.linalg.norm(diff / scale, ord=ord_)) / self.mass


class Stopper:
    """The checks of one run: history, progress reports, the tolerance and the stall rule.

    Parameters
    ----------
    tol : float
        Stop as ``'converged'`` below it (``0`` never does).
    progress : object, optional
        Receives ``update(iteration, error=, target=)`` at every recorded check.
    offset : int, default=0
        Iterations of the stages before this run (the history runs on across stages).

    Attributes
    ----------
    history : list of (int, float)
        ``(offset + iteration, error)`` at every recorded check.
    """

    def __init__(self, tol: float, progress: Any = None, offset: int = 0) -> None:
        self.tol, self.progress, self.offset = tol, progress, offset
        self.history: list[tuple[int, float]] = []
        self.checks = 0
        # the best error, the count of checks and the iteration when it was reached
        self.best, self.best_check, self.best_iteration = math.inf, 0, 0

    def check(self, iteration: int, error: float, record: bool = True) -> str | None:
        """The status after a check at ``iteration`` (``None``: go on). A non-finite
        ``error`` is a ``'breakdown'`` and is not recorded; with ``record=False`` a finite
        one is neither recorded nor compared (a cold start's residual)."""
        if not math.isfinite(error):
            return "breakdown"
        if not record:
            return None
        self.checks += 1
        self.history.append((self.offset + iteration, error))
        if self.progress is not None:
            self.progress.update(self.offset + iteration, error=error, target=self.tol)
        if error < self.tol:
            return "converged"
        if error < STALL_IMPROVEMENT * self.best:
            self.best, self.best_check, self.best_iteration = error, self.checks, iteration
            return None
        return "stalled" if self.stalled(iteration) else None

    def stalled(self, iteration: int) -> bool:
        """No improvement by :data:`STALL_IMPROVEMENT` over :data:`STALL_CHECKS` checks and
        :data:`STALL_ITERATIONS` iterations."""
        return (
            self.checks - self.best_check >= STALL_CHECKS
            and iteration - self.best_iteration >= STALL_ITERATIONS
        )
