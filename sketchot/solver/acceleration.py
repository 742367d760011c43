"""Anderson acceleration of the Sinkhorn fixed-point map on log-scalings.

One Sinkhorn iteration is a map ``T`` on the column log-scalings ``x = log v``:
``x -> log b - log K^T (a / K e^x)``. Its Jacobian at the solution is symmetric with
eigenvalues in ``[0, 1]`` (one equal to 1, along the constant shift that leaves the plan
unchanged), so plain iteration contracts like ``1 - delta`` per step where ``delta`` is the
spectral gap, which shrinks with ``reg``. Anderson mixing (type II) with memory ``k`` extrapolates
from the last ``k`` iterates and residuals; on a linear map it is a restarted-GMRES-like
method (full GMRES would contract like ``1 - 2 sqrt(delta)``), so it pays most where the plain
iteration is slowest, at small ``reg``, for ``O(k m)`` work per step and no extra
kernel product (measured gains are in ``benchmarks/small_reg.py``).

References
----------
H. F. Walker, P. Ni. Anderson acceleration for fixed-point iterations. SIAM J. Numer. Anal.
49(4), 2011.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

#: Relative Tikhonov term of the mixing least squares (keeps near-collinear histories stable).
RIDGE = 1e-10
#: A residual this many times the smallest one since the last restart restarts the history.
RESTART_GROWTH = 100.0


class AndersonMixer:
    """Anderson mixing (type II) for ``x = T(x)`` on the entries ``active``.

    Parameters
    ----------
    memory : int
        Past iterates used (``0`` returns ``T(x)``: the plain iteration).
    active : ndarray of bool, shape (m,)
        Entries that take part; the others (``log v = -inf`` where ``b = 0``) are returned as
        ``T(x)`` gives them.

    Notes
    -----
    Safeguard: when a residual ``||T(x) - x||`` is not finite or exceeds
    ``RESTART_GROWTH`` times the smallest since the last restart, the history is dropped and
    the plain step ``T(x)`` is taken, so a bad extrapolation costs one iteration. The count is
    in ``restarts``.
    """

    def __init__(self, memory: int, active: np.ndarray) -> None:
        self.memory = memory
        self.active = np.asarray(active, dtype=bool)
        self.all_active = bool(self.active.all())
        self.restarts = 0
        # differences of residuals f = T(x) - x and of map values, the last f and T(x):
        # 2 memory + 2 vectors of the active size in all
        self._df: list[np.ndarray] = []
        self._dg: list[np.ndarray] = []
        # the Gram matrix of _df, one row added per step: its entries are the same dot
        # products a full recomputation gives (u @ w == w @ u to the bit)
        self._gram = np.zeros((0, 0))
        self._last: tuple[np.ndarray, np.ndarray] | None = None
        self._best = math.inf

    def reset(self) -> None:
        """Forget the history (after the map itself changed, e.g. a repair)."""
        self._df.clear()
        self._dg.clear()
        self._gram = np.zeros((0, 0))
        self._last = None
        self._best = math.inf

    def step(self, x: np.ndarray, g: np.ndarray) -> np.ndarray:
        """The next iterate from ``x`` and ``g = T(x)`` (both shape (m,), unchanged).

        ``O(memory m)`` work (one new row of the Gram matrix of the stored differences, the
        coefficients' right-hand side, the mixed iterate) and ``O(memory m)`` memory.
        """
        if self.memory == 0:
            return g
        ga = np.array(g if self.all_active else g[self.active], dtype=np.float64)
        f = ga - (x if self.all_active else x[self.active])
        residual = float(np.linalg.norm(f))
        if not math.isfinite(residual) or residual > RESTART_GROWTH * self._best:
            self.restarts += self._last is not None
            self.reset()
            return g
        self._best = min(self._best, residual)
        if self._last is not None:
            new = f - self._last[0]
            self._df.append(new)
            self._dg.append(ga - self._last[1])
            row = np.array([new @ w for w in self._df])
            size = len(self._df)
            grown = np.empty((size, size))
            grown[:-1, :-1] = self._gram
            grown[-1, :] = row
            grown[:-1, -1] = row[:-1]
            self._gram = grown
            if size > self.memory:
                del self._df[0], self._dg[0]
                self._gram = self._gram[1:, 1:]
        self._last = (f, ga)
        if not self._df:
            return g
        gram = self._gram.copy()
        gram[np.diag_indices_from(gram)] += RIDGE * max(float(np.trace(gram)), np.finfo(float).tiny)
        gamma = np.linalg.solve(gram, np.array([u @ f for u in self._df]))
        mixed = ga.copy()
        for weight, dg in zip(gamma, self._dg, strict=True):
            mixed -= weight * dg
        if not np.all(np.isfinite(mixed)):
            self.restarts += 1
            self.reset()
            return g
        if self.all_active:
            return mixed
        out = np.array(g, dtype=np.float64)
        out[self.active] = mixed
        return out


class BlockAndersonMixer:
    """:class:`AndersonMixer` on each of ``blocks`` equal consecutive slices of ``x`` on its
    own: the fixed-point map of a block-diagonal kernel is ``blocks`` independent maps, and
    each gets its own coefficients, history and restarts, so that every block runs the
    iterates it would run alone (to rounding). The least squares of all the blocks are
    solved together (batched ``(blocks, k, k)`` systems); the Gram matrices are updated by
    one row per step, ``O(memory m)`` work per step in all.

    Parameters
    ----------
    memory : int
        Past iterates used per block (at least 1).
    active : ndarray of bool, shape (m,)
        Entries that take part (see :class:`AndersonMixer`).
    blocks : int
        Number of blocks; ``m`` is a multiple of it.
    """

    def __init__(self, memory: int, active: np.ndarray, blocks: int) -> None:
        self.memory = memory
        self.blocks = blocks
        self.active = np.asarray(active, dtype=bool).reshape(blocks, -1)
        self.all_active = bool(self.active.all())
        self.restarts = 0
        width = self.active.shape[1]
        # ring buffers of the differences (one slot per past step, shared by the blocks;
        # zero where a block has no entry) and their Gram matrices, kept up to date
        self._df = np.zeros((blocks, memory, width))
        self._dg = np.zeros((blocks, memory, width))
        self._gram = np.zeros((blocks, memory, memory))
        self._valid = np.zeros((blocks, memory), dtype=bool)
        self._slot = 0
        self._last_f = np.zeros((blocks, width))
        self._last_g = np.zeros((blocks, width))
        self._has_last = np.zeros(blocks, dtype=bool)
        self._best = np.full(blocks, np.inf)

    def reset(self, which: Any = None) -> None:
        """Forget the history of the blocks ``which`` (a mask; default every block)."""
        which = slice(None) if which is None else which
        self._df[which] = 0.0
        self._dg[which] = 0.0
        self._gram[which] = 0.0
        self._valid[which] = False
        self._has_last[which] = False
        self._best[which] = np.inf

    def step(self, x: np.ndarray, g: np.ndarray) -> np.ndarray:
        """The next iterate from ``x`` and ``g = T(x)`` (both shape (m,), unchanged; ``g`` is
        kept until the next step, not copied: the caller must not modify it); a block whose
        residual is not finite or grew restarts (:class:`AndersonMixer`)."""
        shape = (self.blocks, -1)
        with np.errstate(invalid="ignore"):
            if self.all_active:
                ga = g.reshape(shape)
                f = ga - x.reshape(shape)
            else:
                ga = np.where(self.active, g.reshape(shape), 0.0)
                f = np.where(self.active, ga - x.reshape(shape), 0.0)
        residual = np.sqrt(np.einsum("bm,bm->b", f, f))
        restart = ~np.isfinite(residual) | (residual > RESTART_GROWTH * self._best)
        if restart.any():
            self.restarts += int(np.count_nonzero(restart & self._has_last))
            self.reset(restart)
            f[restart] = 0.0
            ga = np.where(restart[:, None], 0.0, ga)
        np.minimum(self._best, residual, out=self._best, where=~restart)
        push = self._has_last & ~restart
        if push.any():
            slot = self._slot
            df, dg = f - self._last_f, ga - self._last_g
            if not push.all():
                df[~push], dg[~push] = 0.0, 0.0
            self._df[:, slot], self._dg[:, slot] = df, dg
            row = np.einsum("bkm,bm->bk", self._df, df)
            self._gram[:, slot, :], self._gram[:, :, slot] = row, row
            self._valid[:, slot] = push
            self._slot = (slot + 1) % self.memory
        # kept, not copied: f and ga are this step's own arrays (zero for restarted blocks)
        self._last_f, self._last_g = f, ga
        self._has_last = ~restart
        if not self._valid.any():
            return g
        gram = self._gram.copy()
        diagonal = gram.reshape(self.blocks, -1)[:, :: self.memory + 1]  # a view
        ridge = RIDGE * np.maximum(diagonal.sum(axis=1), np.finfo(float).tiny)
        # unused slots: a unit diagonal, zero off it and in the right-hand side, so gamma = 0
        diagonal += np.where(self._valid, ridge[:, None], 1.0)
        try:
            gamma = np.linalg.solve(gram, np.einsum("bkm,bm->bk", self._df, f)[:, :, None])
        except np.linalg.LinAlgError:
            self.restarts += 1
            self.reset()
            return g
        mixed = ga - np.einsum("bk,bkm->bm", gamma[:, :, 0], self._dg)
        broken = ~np.isfinite(np.einsum("bm->b", mixed))
        if broken.any():
            self.restarts += int(np.count_nonzero(broken))
            self.reset(broken)
            mixed[broken] = ga[broken]
        if restart.any():
            mixed[restart] = g.reshape(shape)[restart]
        if self.all_active:
            return mixed.ravel()
        out = np.array(g, dtype=np.float64).reshape(shape)
        out[self.active] = mixed[self.active]
        return out.ravel()
