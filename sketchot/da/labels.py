"""The label-masked kernel of the semi-supervised fit with forbidden pairs.

POT's semi-supervised ``ot.da`` fit gives two labelled samples of different labels the cost
``limit_max``; at ``limit_max=inf`` the pair is forbidden, a kernel entry of 0. The kernel
restricted to the allowed pairs is block-structured by label: the rows of one source label
against the target columns of the same label or unlabelled (``-1``). :class:`LabelledKernel`
applies any backend's operator that way (no ``n x m`` array) and :class:`LabelledGeometry`
evaluates the TRUE masked kernel the same way for the solver's checks, so the solve is
certified like any other.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._validation import check_choice
from ..gibbs import GibbsGeometry, gibbs_log_matvec, gibbs_matmat, gibbs_softmax_average
from ..kernels import (
    IDENTITY_STEP,
    FusedPass,
    KernelInfo,
    KernelOperator,
    RatioStep,
    ratios_and_bad,
)

#: POT's mark of an unlabelled sample in ``ys`` / ``yt`` (``ot.utils`` ``MISSING_LABEL``).
MISSING_LABEL = -1


class LabelledGeometry(GibbsGeometry):
    """The clouds' geometry with POT's forbidden label pairs: the TRUE kernel is
    ``K_ij = exp(-c(x_i, y_j) / reg)`` where the pair is allowed (either sample unlabelled,
    or equal labels) and 0 where both samples are labelled differently (``limit_max=inf``).

    What the solver evaluates exactly (the true-kernel check, repairs, true rows) is computed
    per label: the rows of one source label against its allowed target columns, so no
    ``n x m`` array is formed. New points have no labels: :meth:`softmax_average` of given
    points is the plain kernel's. ``cost_block`` is the clouds' cost everywhere: it is only
    ever multiplied by kernel or plan entries, which are 0 on forbidden pairs (``+inf``
    there would make them ``0 * inf``).

    Parameters
    ----------
    X, Y, reg, metric
        As :class:`~sketchot.gibbs.GibbsGeometry`.
    ys, yt : ndarray
        The labels, ``-1`` for unlabelled samples.
    """

    def __init__(self, X, Y, reg, metric, ys: np.ndarray, yt: np.ndarray) -> None:
        super().__init__(X, Y, reg, metric)
        self.ys, self.yt = ys, yt

    def allowed(self, label: Any, *, transpose: bool = False) -> np.ndarray:
        """Positions in the other cloud allowed to a sample of ``label`` (of the source;
        of the target with ``transpose``)."""
        other = self.ys if transpose else self.yt
        if label == MISSING_LABEL:
            return np.arange(other.shape[0])
        return np.flatnonzero((other == label) | (other == MISSING_LABEL))

    def groups(self, index: Any, *, transpose: bool = False):
        """``(positions in the selection, allowed columns)`` per label of the selected rows
        (``index`` of the source; of the target with ``transpose``)."""
        own = self.yt if transpose else self.ys
        labels = own[np.arange(own.shape[0])[index]]
        for label in np.unique(labels):
            yield np.flatnonzero(labels == label), self.allowed(label, transpose=transpose)

    def mask(self, index: Any) -> np.ndarray:
        """Allowed pairs of the source rows ``index``: bool, ``(len(index), m)``."""
        ys = self.ys[np.arange(self.ys.shape[0])[index]]
        allowed = (ys[:, None] == self.yt[None, :]) | (self.yt[None, :] == MISSING_LABEL)
        return allowed | (ys[:, None] == MISSING_LABEL)

    def computes_on_device(self, cost: Any = None) -> bool:
        """Never: the per-label evaluations run on the host."""
        return False

    def matmat(self, index: Any, V: np.ndarray, *, transpose: bool = False) -> np.ndarray:
        own, other, cost = self._sides(transpose)
        rows = own[index]
        out = np.zeros((rows.shape[0], *V.shape[1:]))
        for sel, cols in self.groups(index, transpose=transpose):
            if cols.size:
                out[sel] = gibbs_matmat(rows[sel], other[cols], self.reg, V[cols], cost)
        return out

    def log_matvec(self, index: Any, log_v: np.ndarray, *, transpose: bool = False) -> np.ndarray:
        own, other, cost = self._sides(transpose)
        rows = own[index]
        out = np.full(rows.shape[0], -np.inf)
        for sel, cols in self.groups(index, transpose=transpose):
            if cols.size:
                out[sel] = gibbs_log_matvec(rows[sel], other[cols], self.reg, log_v[cols], cost)
        return out

    def block(self, index: Any) -> np.ndarray:
        return np.where(self.mask(index), super().block(index), 0.0)

    def log_block(self, rows: Any, dtype: Any = np.float64) -> np.ndarray:
        block = super().log_block(rows, dtype)
        return np.where(self.mask(rows), block, -np.inf).astype(block.dtype, copy=False)

    def softmax_average(self, points, log_weights, values, *, transpose: bool = False):
        if points is not None:  # new points have no labels: the plain kernel's average
            return super().softmax_average(points, log_weights, values, transpose=transpose)
        own, other, cost = self._sides(transpose)
        out = np.zeros((own.shape[0], *values.shape[1:]))
        for sel, cols in self.groups(slice(None), transpose=transpose):
            if cols.size:
                out[sel] = gibbs_softmax_average(
                    own[sel], other[cols], self.reg, log_weights[cols], values[cols], cost
                )
        return out

    def at_reg(self, reg: float) -> LabelledGeometry:
        return LabelledGeometry(self.X, self.Y, reg, self.cost, self.ys, self.yt)

    def sample(self, size: int, generator: np.random.Generator) -> GibbsGeometry:
        raise NotImplementedError(
            "a labelled geometry is not sampled (backend='auto' does not choose for the "
            "semi-supervised fit): pass a backend"
        )


class LabelledKernel(KernelOperator):
    """A kernel operator restricted to the allowed label pairs: ``K' = K o A`` for the
    operator ``K`` of the clouds (any backend) and the 0/1 pattern ``A`` of
    :class:`LabelledGeometry`, applied per source label (the rows of one label times the
    columns allowed to it), never as an ``n x m`` array.

    With factors ``K = U W^T`` a product costs what ``K``'s does, ``O((n + m) r)``;
    otherwise one product of ``K`` per source label. It is ``K' = L R^T`` with ``L = K'``
    and ``R = I`` for the fused passes. Its error against the true masked kernel is ``K``'s
    on the allowed pairs (0 elsewhere): the solver's true-kernel check certifies it through
    the labelled geometry, like any approximation.
    """

    def __init__(self, base: KernelOperator, geometry: LabelledGeometry) -> None:
        info = KernelInfo(
            backend=base.info.backend,
            params={**base.info.params, "labels": "masked"},
            rank=base.info.rank,
            capabilities=base.info.capabilities & {"nonnegative"},
            build_time=base.info.build_time,
            product_rtol=base.info.product_rtol,
            reason=f"{base.info.reason} (restricted to the allowed label pairs)".strip(),
        )
        super().__init__(geometry, info, base.dtype)
        self.base = base
        self.factors = base.factors if "factors" in base.info.capabilities else None
        self.row_groups = list(geometry.groups(slice(None)))

    def matmat(self, V: Any) -> np.ndarray:
        V = np.asarray(V, dtype=np.float64)
        out = np.zeros((self.shape[0], *V.shape[1:]))
        for rows, cols in self.row_groups:
            if self.factors is not None:
                left, right = self.factors
                out[rows] = left[rows] @ (right[cols].T @ V[cols])
            else:
                masked = np.zeros_like(V)
                masked[cols] = V[cols]
                out[rows] = self.base.matmat(masked)[rows]
        return out

    def rmatmat(self, U: Any) -> np.ndarray:
        U = np.asarray(U, dtype=np.float64)
        out = np.zeros((self.shape[1], *U.shape[1:]))
        for rows, cols in self.row_groups:
            if self.factors is not None:
                left, right = self.factors
                out[cols] += right[cols] @ (left[rows].T @ U[rows])
            else:
                masked = np.zeros_like(U)
                masked[rows] = U[rows]
                out[cols] += self.base.rmatmat(masked)[cols]
        return out

    def _rows(self, index: np.ndarray) -> np.ndarray:
        rows = self.base.to_dense(max_bytes=index.size * self.shape[1] * 8, rows=index)
        return np.where(self.geometry.mask(index), rows, 0.0)

    def fused_pass(self, side, w, numerator, *, log: bool = False, step: RatioStep = IDENTITY_STEP):
        if log:
            raise NotImplementedError("the labelled kernel declares no log-domain products")
        check_choice(side, "side", ("rows", "cols"))
        if side == "rows":  # L = K': products K' v, projection K'^T ratios
            products = self.matmat(w)
            ratios, bad = ratios_and_bad(numerator, products, step)
            return FusedPass(products, ratios, self.rmatmat(ratios), bad)
        # R = I: the products are w itself (K'^T u from the rows pass), the projection the
        # ratios
        products = np.array(w, dtype=np.float64)
        ratios, bad = ratios_and_bad(numerator, products, step)
        return FusedPass(products, ratios, ratios, bad)

    def project(self, side, values, index: Any = None, *, log: bool = False) -> np.ndarray:
        if log:
            raise NotImplementedError("the labelled kernel declares no log-domain products")
        check_choice(side, "side", ("rows", "cols"))
        n, m = self.shape
        full = np.zeros(n if side == "rows" else m)
        full[np.arange(full.size)[slice(None) if index is None else index]] = values
        return self.rmatmat(full) if side == "rows" else full
