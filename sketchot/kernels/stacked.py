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

Precision. ``-C / reg`` is float64 always; ``dtype=numpy.float32`` stores the absorbed
kernels (and the linear kernel) in float32, whose linear passes read half the bytes (a chunk
of the batch solver stays in the cache at twice the pairs); their exponents are computed in
float64 and exponentiated in float32. The values, weights and scalings the passes return are
float64.

Memory ``B n m`` float64 for ``-C / reg``, and ``B n m`` entries of ``dtype`` for the
absorbed kernel; time ``O(B n m)`` per pass.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._validation import check_dtype
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


def stacked_log_kernel(
    X: np.ndarray, Y: np.ndarray, reg: float, out: np.ndarray | None = None
) -> np.ndarray:
    """``-||x_ki - y_kj||^2 / reg`` of every pair, shape ``(B, n, m)``, from clouds centred
    pair by pair (no cancellation far from the origin), clamped at 0 distance: one batched
    product of augmented coordinates, ``[2 x / reg, -|x|^2 / reg, 1] . [y, 1, -|y|^2 / reg]``
    (one pass over the output instead of one per term). ``out``: float64 memory of that
    shape to write into (a caller that builds many stacks reuses one)."""
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
    out = np.matmul(left, right, out=out)
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
    dtype : {numpy.float64, numpy.float32}, default=numpy.float64
        Storage of the linear and absorbed kernels (module notes).
    """

    def __init__(
        self,
        log_kernel: np.ndarray,
        reg: float,
        max_cost: float | None = None,
        buffer: np.ndarray | None = None,
        dtype: Any = np.float64,
    ) -> None:
        info = KernelInfo(
            "stacked_exact",
            {"batch": log_kernel.shape[0]},
            capabilities=frozenset(
                {"exact", "nonnegative", "log_products", "absorb", "block_diagonal"}
            ),
        )
        super().__init__(StackedGeometry(log_kernel, reg, max_cost), info, check_dtype(dtype))
        self.log_kernel = log_kernel
        self.batch, self.n, self.m = log_kernel.shape
        self._linear: np.ndarray | None = None
        self._buffer = buffer
        #: the last rows pass (:meth:`_linear_projection`)
        self._recent: _Recent | None = None
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
        """The stacked kernel ``exp(-C / reg)`` in ``dtype`` (computed on first use)."""
        if self._linear is None:
            self._linear = np.exp(self.log_kernel).astype(self.dtype, copy=False)
        return self._linear

    def storage(self) -> np.ndarray:
        """An array of ``log_kernel``'s shape and ``dtype`` for an absorbed kernel: in
        ``buffer`` if given."""
        if self._buffer is None:
            return np.empty(self.log_kernel.shape, dtype=self.dtype)
        memory = self._buffer.ravel().view(self.dtype)
        return memory[: self.log_kernel.size].reshape(self.log_kernel.shape)

    def operand(self, values: np.ndarray, side: str) -> np.ndarray:
        """A vector of float64 values over the rows or columns, stacked (:meth:`stack`) in
        the kernel's ``dtype`` for a product (no float64 copy of a float32 kernel)."""
        return self.stack(np.asarray(values, dtype=np.float64), side).astype(self.dtype, copy=False)

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
        W = self.operand(w, "cols")
        with np.errstate(over="ignore", invalid="ignore"):
            products = np.matmul(K, W[:, :, None]).ravel().astype(np.float64, copy=False)
            ratios, bad = fast_ratios_and_bad(numerator, products, step)
            projection = np.matmul(self.operand(ratios, "rows")[:, None, :], K).ravel()
        projection = projection.astype(np.float64, copy=False)
        self._recent = _Recent(ratios, projection)
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
        if not log:
            return self._linear_projection(np.asarray(values, dtype=np.float64))
        U = self.stack(np.asarray(values, dtype=np.float64), "rows")
        out = np.empty((self.batch, self.m))
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            for g in self.groups():
                out[g] = _log_matvec(self.log_kernel[g].transpose(0, 2, 1), U[g])
        return out.ravel()

    def _linear_projection(self, values: np.ndarray) -> np.ndarray:
        """``values^T K`` pair by pair; the pairs whose kernel and values are those of the
        last rows pass (:class:`_Recent`) reuse its projection (an absorption of a few pairs
        is followed by the projection of the whole stack)."""
        recent, K = self._recent, self.linear()
        U = self.operand(values, "rows")
        if recent is None:
            with np.errstate(over="ignore", invalid="ignore"):
                out = np.matmul(U[:, None, :], K).ravel()
            return out.astype(np.float64, copy=False)
        redo = recent.stale | np.any(
            self.stack(values, "rows") != self.stack(recent.ratios, "rows"), axis=1
        )
        out = self.stack(recent.projection, "cols").copy()
        if redo.any():
            with np.errstate(over="ignore", invalid="ignore"):
                out[redo] = np.matmul(U[redo][:, None, :], K[redo])[:, 0, :]
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
            parent.dtype,
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
        alpha_k, beta_k = self.stack(self.alpha, "rows"), self.stack(self.beta, "cols")
        if blocks is not None:
            parts = [slice(k, k + 1) for k in np.flatnonzero(blocks)]
        elif self.dtype == np.float64:
            parts = [slice(None)]
        else:  # float64 exponents in groups of pairs (a float64 temporary per group)
            parts = self.groups()
        # float32: the float64 exponents of one group at a time, in one temporary
        largest = max(store[k].size for k in parts)
        temp = None if self.dtype == np.float64 else np.empty(largest)
        for k in parts:
            _absorb(store[k], self.log_kernel[k], alpha_k[k], beta_k[k], temp)
        self._linear = store
        # the pairs kept from previous keep its last rows pass
        self._recent = None
        if blocks is not None and previous._recent is not None:
            self._recent = previous._recent.without(np.asarray(blocks, dtype=bool))
        self._buffer = None

    def fused_pass(self, side, w, numerator, *, log=False, step=IDENTITY_STEP) -> FusedPass:
        if log:
            raise NotImplementedError("an absorbed kernel runs linear passes only")
        return super().fused_pass(side, w, numerator, step=step)

    def absorbed(self, alpha, beta, previous=None, blocks=None):
        raise NotImplementedError("absorb into the parent kernel, not into an absorbed one")


class _Recent:
    """The ratios and projection of a rows pass, and the pairs whose kernel changed since
    (``stale``): their projection is not the pass's any more. Copies (the caller owns the
    pass's arrays)."""

    def __init__(self, ratios: np.ndarray, projection: np.ndarray, stale: Any = False) -> None:
        self.ratios, self.projection, self.stale = ratios.copy(), projection.copy(), stale

    def without(self, blocks: np.ndarray) -> _Recent:
        """The same pass with the pairs ``blocks`` (a mask) stale too."""
        recent = _Recent.__new__(_Recent)
        recent.ratios, recent.projection = self.ratios, self.projection
        recent.stale = blocks | self.stale
        return recent


def _absorb(out, log_kernel, alpha, beta, temp=None) -> None:
    """``out = exp(max(alpha_i + beta_j + log_kernel_ij, floor))`` for a group of pairs, the
    exponents in float64 (in ``out`` itself when it is float64, else in ``temp``, float64
    memory of at least ``out.size`` entries), the floor
    :data:`~sketchot.kernels.exact.LOG_FLOOR` of ``out``'s dtype (``-inf`` too)."""
    exponent = out if temp is None else temp[: out.size].reshape(out.shape)
    np.add(log_kernel, alpha[..., :, None], out=exponent)
    exponent += beta[..., None, :]
    # clamped (and rounded to float32 once, when out is float32), then exponentiated in place
    np.maximum(exponent, LOG_FLOOR[out.dtype], out=out, casting="same_kind")
    np.exp(out, out=out)


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
