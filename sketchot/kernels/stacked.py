"""The exact Gibbs kernels of many small problems, stacked as one block-diagonal operator.

For ``B`` pairs of clouds ``X_k`` (n points) and ``Y_k`` (m points), the operator is the
``B n x B m`` block-diagonal matrix ``diag(K_1, ..., K_B)``, ``(K_k)_ij =
exp(-||x_ki - y_kj||^2 / reg)``, stored as one ``(B, n, m)`` array. Sinkhorn's updates act
row by row and column by column, so Sinkhorn on the block-diagonal kernel with the
concatenated weights IS the ``B`` independent Sinkhorn iterations: the one engine
(:func:`sketchot.solver.engine.iterate`) solves the whole batch, one fused pass per half-step
over every pair (batched products). It declares ``'block_diagonal'``, so that the engine
measures each pair's residual and mixes each pair's iterates on its own: nothing mixes the
pairs.

It declares the exact kernel's capabilities (``'exact'``, ``'nonnegative'``,
``'log_products'``, ``'absorb'``): the engine runs the absorption-stabilised iteration
(Schmitzer 2019) on it, finite for any ``reg``.

Memory ``B n m`` float64 for ``-C / reg``, and as much again for the absorbed kernel; time
``O(B n m)`` per pass.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import (
    IDENTITY_STEP,
    FusedPass,
    KernelInfo,
    KernelOperator,
    RatioStep,
    check_operand,
    fast_ratios_and_bad,
    identity_pass,
    log_ratios_and_bad,
)
from .exact import LOG_FLOOR

#: Entries of the pairs that one group of a log-domain pass reads (its temporary's size).
GROUP_ENTRIES = 1 << 18


def stacked_log_kernel(X: np.ndarray, Y: np.ndarray, reg: float) -> np.ndarray:
    """``-||x_ki - y_kj||^2 / reg`` of every pair, shape ``(B, n, m)``, from clouds centred
    pair by pair (no cancellation far from the origin), clamped at 0 distance: one batched
    product of augmented coordinates, ``[2 x / reg, -|x|^2 / reg, 1] . [y, 1, -|y|^2 / reg]``
    (one pass over the output instead of one per term)."""
    B, n, d = X.shape
    center = (X.sum(axis=1, keepdims=True) + Y.sum(axis=1, keepdims=True)) / (
        X.shape[1] + Y.shape[1]
    )
    Xc, Yc = X - center, Y - center
    left = np.empty((B, n, d + 2))
    right = np.empty((B, d + 2, Y.shape[1]))
    np.multiply(Xc, 2.0 / reg, out=left[:, :, :d])
    left[:, :, d] = np.einsum("bnd,bnd->bn", Xc, Xc) * (-1.0 / reg)
    left[:, :, d + 1] = 1.0
    right[:, :d, :] = Yc.transpose(0, 2, 1)
    right[:, d, :] = 1.0
    right[:, d + 1, :] = np.einsum("bmd,bmd->bm", Yc, Yc) * (-1.0 / reg)
    out = np.matmul(left, right)
    np.minimum(out, 0.0, out=out)
    return out


class StackedGeometry:
    """What the engine reads from a stacked operator's geometry: ``reg``, ``shape`` and an
    upper bound of the cost (:meth:`max_cost`)."""

    def __init__(self, log_kernel: np.ndarray, reg: float, max_cost: float | None = None) -> None:
        self.reg = float(reg)
        self.batch, self.n, self.m = log_kernel.shape
        self.shape = (self.batch * self.n, self.batch * self.m)
        if max_cost is None:
            max_cost = float(-log_kernel.min()) * self.reg if log_kernel.size else 0.0
        self._max_cost = float(max_cost)

    def max_cost(self) -> float:
        """The largest cost of any pair."""
        return self._max_cost


class StackedExactKernel(KernelOperator):
    """``diag(K_1, ..., K_B)`` from the stacked ``-C / reg`` (module notes).

    Parameters
    ----------
    log_kernel : ndarray, shape (B, n, m)
        ``-C_k / reg`` of every pair (:func:`stacked_log_kernel`); kept, not copied.
    reg : float
    max_cost : float, optional
        An upper bound of the pairs' costs, when the caller knows one (default: computed, one
        pass over ``log_kernel``).
    buffer : ndarray, optional
        Float64 memory of at least ``log_kernel.size`` entries for the first absorbed kernel,
        reused from stack to stack by a caller that solves many (fresh memory costs a page
        fault per 4 KiB on first write); default: allocated.
    """

    def __init__(
        self,
        log_kernel: np.ndarray,
        reg: float,
        max_cost: float | None = None,
        buffer: np.ndarray | None = None,
    ) -> None:
        info = KernelInfo(
            "stacked_exact",
            {"batch": log_kernel.shape[0]},
            capabilities=frozenset(
                {"exact", "nonnegative", "log_products", "absorb", "block_diagonal"}
            ),
        )
        super().__init__(StackedGeometry(log_kernel, reg, max_cost), info, np.float64)
        self.log_kernel = log_kernel
        self.batch, self.n, self.m = log_kernel.shape
        self._linear: np.ndarray | None = None
        self._buffer = buffer
        #: the last absorbed form built from this kernel (its storage is reused)
        self.latest: AbsorbedStackedKernel | None = None

    # ------------------------------------------------------------- helpers
    def stack(self, values: np.ndarray, side: str) -> np.ndarray:
        """A vector over the rows (``side='rows'``) or columns as ``(B, n)`` or ``(B, m)``."""
        return values.reshape(self.batch, self.n if side == "rows" else self.m)

    def groups(self) -> list[slice]:
        """Consecutive pairs whose entries fit :data:`GROUP_ENTRIES`."""
        step = max(1, GROUP_ENTRIES // max(1, self.n * self.m))
        return [slice(k, min(k + step, self.batch)) for k in range(0, self.batch, step)]

    def linear(self) -> np.ndarray:
        """The stacked kernel ``exp(-C / reg)`` (computed on first use)."""
        if self._linear is None:
            self._linear = np.exp(self.log_kernel)
        return self._linear

    def storage(self) -> np.ndarray:
        """An array of ``log_kernel``'s shape for an absorbed kernel: in ``buffer`` if given."""
        if self._buffer is None:
            return np.empty_like(self.log_kernel)
        return self._buffer.ravel()[: self.log_kernel.size].reshape(self.log_kernel.shape)

    # ------------------------------------------------------------ products
    def matmat(self, V: Any) -> np.ndarray:
        V = check_operand(V, self.shape[1], "V", vector=False)
        cols = V.reshape(self.batch, self.m, -1)
        return np.matmul(self.linear(), cols).reshape(self.shape[0], *V.shape[1:])

    def rmatmat(self, U: Any) -> np.ndarray:
        U = check_operand(U, self.shape[0], "U", vector=False)
        rows = U.reshape(self.batch, self.n, -1)
        out = np.matmul(self.linear().transpose(0, 2, 1), rows)
        return out.reshape(self.shape[1], *U.shape[1:])

    def _rows(self, index: np.ndarray) -> np.ndarray:
        out = np.zeros((index.size, self.shape[1]))
        pair, row = np.divmod(index, self.n)
        for k, (p, r) in enumerate(zip(pair, row, strict=True)):
            out[k, p * self.m : (p + 1) * self.m] = np.exp(self.log_kernel[p, r])
        return out

    def fused_pass(
        self,
        side: str,
        w: np.ndarray,
        numerator: np.ndarray,
        *,
        log: bool = False,
        step: RatioStep = IDENTITY_STEP,
    ) -> FusedPass:
        if side == "cols":
            return identity_pass(w, numerator, log=log, step=step)
        if log:
            return self._log_pass(w, numerator, step)
        # two whole batched products: the solver keeps a stack within the cache
        # (sketchot.solver.batch), where they cost less than a pass in groups of pairs
        K = self.linear()
        W = self.stack(np.asarray(w, dtype=np.float64), "cols")
        with np.errstate(over="ignore", invalid="ignore"):
            products = np.matmul(K, W[:, :, None]).ravel()
            ratios, bad = fast_ratios_and_bad(numerator, products, step)
            projection = np.matmul(self.stack(ratios, "rows")[:, None, :], K).ravel()
        return FusedPass(products, ratios, projection, bad)

    def _log_pass(self, w: np.ndarray, numerator: np.ndarray, step: RatioStep) -> FusedPass:
        """The rows pass on logarithms, in groups of pairs (one temporary per group)."""
        W = self.stack(np.asarray(w, dtype=np.float64), "cols")
        products = np.empty((self.batch, self.n))
        projection = np.empty((self.batch, self.m))
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            for g in self.groups():
                products[g] = _log_matvec(self.log_kernel[g], W[g])
            ratios, bad = log_ratios_and_bad(numerator, products.ravel(), step)
            R = self.stack(ratios, "rows")
            for g in self.groups():
                projection[g] = _log_matvec(self.log_kernel[g].transpose(0, 2, 1), R[g])
        return FusedPass(products.ravel(), ratios, projection.ravel(), bad)

    def project(
        self, side: str, values: np.ndarray, index: Any = None, *, log: bool = False
    ) -> np.ndarray:
        empty = -np.inf if log else 0.0
        if index is not None:
            full = np.full(self.shape[0 if side == "rows" else 1], empty)
            full[index] = values
            values = full
        if side == "cols":
            return np.array(values, dtype=np.float64)
        U = self.stack(np.asarray(values, dtype=np.float64), "rows")
        if not log:
            with np.errstate(over="ignore", invalid="ignore"):
                return np.matmul(U[:, None, :], self.linear()).ravel()
        out = np.empty((self.batch, self.m))
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            for g in self.groups():
                out[g] = _log_matvec(self.log_kernel[g].transpose(0, 2, 1), U[g])
        return out.ravel()

    def absorbed(
        self,
        alpha: np.ndarray,
        beta: np.ndarray,
        previous: Any = None,
        blocks: np.ndarray | None = None,
    ) -> AbsorbedStackedKernel:
        """``diag(e^alpha) K diag(e^beta)``, pair by pair (see
        :class:`~sketchot.kernels.exact.AbsorbedExactKernel`). ``blocks`` (a mask over the
        pairs, with ``previous``): only these pairs are recomputed, the others keep
        ``previous``'s entries (so their ``alpha``, ``beta`` must be ``previous``'s): the
        solver re-absorbs the pairs whose scalings left its range, not the whole stack."""
        self.latest = AbsorbedStackedKernel(self, alpha, beta, previous, blocks)
        return self.latest


class AbsorbedStackedKernel(StackedExactKernel):
    """``exp(alpha_i + beta_j - C_ij / reg)`` of every pair, clamped below at
    :data:`~sketchot.kernels.exact.LOG_FLOOR` (the absorbed exact kernel, stacked); linear
    passes only.

    Attributes
    ----------
    alpha, beta : ndarray, shape (B n,), (B m,)
        The absorbed log-scalings.
    """

    def __init__(
        self,
        parent: StackedExactKernel,
        alpha: np.ndarray,
        beta: np.ndarray,
        previous: AbsorbedStackedKernel | None = None,
        blocks: np.ndarray | None = None,
    ) -> None:
        KernelOperator.__init__(
            self, parent.geometry, KernelInfo("stacked_exact", dict(parent.info.params)),
            np.float64,
        )  # fmt: skip
        self.log_kernel = parent.log_kernel
        self.batch, self.n, self.m = parent.batch, parent.n, parent.m
        self.latest = None
        self.alpha = np.asarray(alpha, dtype=np.float64)
        self.beta = np.asarray(beta, dtype=np.float64)
        reuse = previous is not None and previous._linear is not None
        if blocks is not None and not reuse:
            raise ValueError("blocks re-absorbs part of a previous absorbed kernel; got none")
        store = previous._linear if reuse else parent.storage()
        floor = LOG_FLOOR[np.dtype(np.float64)]
        alpha_k, beta_k = self.stack(self.alpha, "rows"), self.stack(self.beta, "cols")
        for k in (slice(None),) if blocks is None else np.flatnonzero(blocks):
            np.add(self.log_kernel[k], alpha_k[k][..., :, None], out=store[k])
            store[k] += beta_k[k][..., None, :]
            np.maximum(store[k], floor, out=store[k])  # -inf too
            np.exp(store[k], out=store[k])
        self._linear = store

    def fused_pass(self, side, w, numerator, *, log=False, step=IDENTITY_STEP) -> FusedPass:
        if log:
            raise NotImplementedError("an absorbed kernel runs linear passes only")
        return super().fused_pass(side, w, numerator, step=step)

    def absorbed(self, alpha, beta, previous=None, blocks=None):
        raise NotImplementedError("absorb into the parent kernel, not into an absorbed one")


def _log_matvec(log_kernel: np.ndarray, log_w: np.ndarray) -> np.ndarray:
    """``log(K_k exp(w_k))`` for a group of pairs: ``(G, n, m)`` and ``(G, m)`` -> ``(G, n)``,
    by log-sum-exp (``-inf`` where every term is ``-inf``)."""
    terms = log_kernel + log_w[:, None, :]
    top = terms.max(axis=2)
    safe = np.where(np.isfinite(top), top, 0.0)
    terms -= safe[:, :, None]
    np.exp(terms, out=terms)
    with np.errstate(divide="ignore"):
        return np.log(terms.sum(axis=2)) + safe
