"""The Gibbs kernel of a SPARSE cost matrix: the stored entries of ``M`` are the allowed pairs,
every missing entry a forbidden one (POT's sparse-cost convention for ``ot.emd``), so that
``K_ij = exp(-M_ij / reg)`` on the stored entries and ``0`` elsewhere.

:class:`SparseCostMatrixGeometry` is a :class:`~sketchot.cost_matrix.CostMatrixGeometry`
whose products, log products, soft-max averages and bounds run over the stored entries only,
``O(nnz)`` each, never an ``n x m`` array; its row blocks (``log_block``, ``cost_block``,
``block``: what dense fallbacks such as the Newton stage or several targets read) are dense
rows with the forbidden value in the missing entries, as the dense geometry's ``+inf``
entries read.

A stored entry is an allowed pair whatever its value, an explicit zero included (a pair of
cost 0: SciPy keeps explicit zeros, and so does this geometry); a stored ``+inf`` is a
forbidden pair like a missing one (it is dropped); duplicates are summed (SciPy's
convention for COO input).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._arrays import NUMPY
from ._validation import check_float, describe
from .cost_matrix import FORBIDDEN_LOG, CostMatrixGeometry, MatrixCost, require_points


def is_sparse(M: Any) -> bool:
    """Whether ``M`` is a SciPy sparse matrix or array (without importing SciPy when it has
    not been)."""
    import sys

    sparse = sys.modules.get("scipy.sparse")
    return sparse is not None and sparse.issparse(M)


def check_sparse_cost(M: Any, name: str = "M") -> Any:
    """Validate a SciPy sparse cost matrix: 2-D, non-empty, real; stored NaN or ``-inf``
    refused by name; stored ``+inf`` dropped (a forbidden pair, as a missing one); at least
    one allowed pair. Returned as a canonical ``scipy.sparse.csr_array`` of float64 (sorted
    indices, duplicates summed, explicit zeros KEPT: a stored 0 is a pair of cost 0)."""
    import scipy.sparse

    if M.ndim != 2:
        raise ValueError(f"{name} must be a 2-D sparse cost matrix; got {M.ndim}-D {describe(M)}")
    if 0 in M.shape:
        raise ValueError(f"{name} must be non-empty; got shape {M.shape}")
    if M.dtype.kind not in "biuf":
        raise TypeError(
            f"{name} must hold real costs; got a sparse matrix of dtype {M.dtype} ({describe(M)})"
        )
    csr = scipy.sparse.csr_array(M, dtype=np.float64, copy=True)
    csr.sum_duplicates()  # also sorts the indices; keeps explicit zeros
    data = csr.data
    nan = int(np.count_nonzero(np.isnan(data)))
    if nan:
        raise ValueError(
            f"{name} must contain real costs on its stored entries (a missing entry or +inf "
            f"is a forbidden pair); got NaN in {nan} of its {data.size} stored entries"
        )
    minus = int(np.count_nonzero(data == -np.inf))
    if minus:
        raise ValueError(
            f"{name} must contain real costs on its stored entries; got {minus} entries -inf: "
            "a pair of cost -inf makes the transport problem unbounded"
        )
    if not np.isfinite(data).all():  # +inf stored: forbidden like a missing entry
        keep = np.isfinite(data)
        coo = csr.tocoo()
        csr = scipy.sparse.csr_array(
            (coo.data[keep], (coo.row[keep], coo.col[keep])), shape=csr.shape
        )
        csr.sum_duplicates()
    if csr.nnz == 0:
        raise ValueError(
            f"{name} must have at least one allowed pair (a stored finite cost); got none of "
            f"its {M.shape[0]} x {M.shape[1]} pairs"
        )
    return csr


def _row_of_entries(csr: Any) -> np.ndarray:
    """The row index of every stored entry of a CSR matrix (``nnz`` integers)."""
    return np.repeat(np.arange(csr.shape[0]), np.diff(csr.indptr))


class SparseCostMatrixGeometry(CostMatrixGeometry):
    """A sparse cost matrix ``M`` and ``reg``: ``K_ij = exp(-M_ij / reg)`` on the stored
    entries, ``0`` on the missing ones (forbidden pairs).

    Parameters
    ----------
    M : scipy.sparse matrix or array, shape (n, m)
        Costs on the allowed pairs (:func:`check_sparse_cost`); negative costs are costs.
    reg : float
        Entropic regularisation, ``> 0``.
    shift : bool, default=False
        As :class:`~sketchot.cost_matrix.CostMatrixGeometry`: solve on ``M - min(M)`` (stored
        entries) when ``M`` has negative entries.

    Attributes
    ----------
    M : scipy.sparse.csr_array, shape (n, m)
        The stored costs (canonical CSR, float64). ``M.T`` is kept as CSR too
        (``transposed_``) for the column side's passes.
    nnz : int
        The number of allowed pairs.
    forbidden : int
        ``n m - nnz``.
    offset, min_cost, reg, cost, context
        As :class:`~sketchot.cost_matrix.CostMatrixGeometry`.

    Notes
    -----
    Products and log products (:meth:`matmat`, :meth:`log_matvec`) cost ``O(nnz)`` for each
    column of the operand, the log products by a segment maximum and a segment sum over the
    rows' stored entries; memory ``O(nnz)``. ``M`` is copied once into canonical CSR (and its
    transpose), so later changes to the caller's matrix do not reach a solve.
    """

    def __init__(self, M: Any, reg: Any, *, shift: bool = False) -> None:
        csr = check_sparse_cost(M)
        self._set(csr, check_float(reg, "reg", positive=True))
        if shift:
            self.offset = min(self.min_cost, 0.0)
        self.check_reg()

    def _set(self, csr: Any, reg: float, transposed: Any = None) -> None:
        self.M = csr
        self.transposed_ = transposed if transposed is not None else csr.T.tocsr()
        self.transposed_.sort_indices()
        self.reg = float(reg)
        self.cost = MatrixCost(csr.shape)
        self.context = NUMPY
        self.nnz = int(csr.nnz)
        self.min_cost = float(csr.data.min())
        self._max_cost = float(csr.data.max()) - min(self.min_cost, 0.0)
        self.forbidden = int(csr.shape[0] * csr.shape[1] - csr.nnz)
        self.offset = 0.0
        self._rows_of_entries = _row_of_entries(csr)
        self._cols_of_entries = _row_of_entries(self.transposed_)

    def _copy(self, reg: float, offset: float) -> SparseCostMatrixGeometry:
        geometry = SparseCostMatrixGeometry.__new__(SparseCostMatrixGeometry)
        geometry.__dict__.update(self.__dict__)
        geometry.reg, geometry.offset = float(reg), offset
        geometry.check_reg()
        return geometry

    def unshifted(self) -> SparseCostMatrixGeometry:
        """The same matrix (not copied) at the same ``reg`` with no offset."""
        return self._copy(self.reg, 0.0)

    def at_reg(self, reg: float) -> SparseCostMatrixGeometry:
        """The same matrix (not copied) at another ``reg``."""
        return self._copy(reg, self.offset)

    def __repr__(self) -> str:
        n, m = self.shape
        return (
            f"<SparseCostMatrixGeometry {n}x{m} nnz={self.nnz} reg={self.reg:g} "
            f"max_cost={self._max_cost:.6g}"
            + (f" offset={self.offset:.6g}" if self.offset else "")
            + ">"
        )

    def sample(self, size: int, generator: np.random.Generator) -> CostMatrixGeometry:
        """The sub-matrix of at most ``size`` rows and columns drawn uniformly without
        replacement (rows first), as a sparse geometry at the same ``reg``; a draw with no
        allowed pair gives a dense all-forbidden geometry (its kernel is 0)."""
        n, m = self.shape
        rows = np.sort(generator.choice(n, size=min(size, n), replace=False))
        cols = np.sort(generator.choice(m, size=min(size, m), replace=False))
        sub = self.M[rows][:, cols]
        if sub.nnz == 0:
            return CostMatrixGeometry.all_forbidden(sub.shape, self.reg)
        geometry = SparseCostMatrixGeometry.__new__(SparseCostMatrixGeometry)
        geometry._set(sub.tocsr(), self.reg)
        geometry.offset = min(geometry.min_cost, 0.0) if self.offset else 0.0
        geometry.check_reg()
        return geometry

    # ------------------------------------------------------------ entries
    def _matrix(self, transpose: bool) -> Any:
        return self.transposed_ if transpose else self.M

    def _entry_rows(self, transpose: bool) -> np.ndarray:
        return self._cols_of_entries if transpose else self._rows_of_entries

    def _neg_cost_entries(self, transpose: bool = False) -> np.ndarray:
        """``-(M_ij - offset) / reg`` of every stored entry, in storage order (a new array)."""
        out = self._matrix(transpose).data - self.offset
        out *= -1.0 / self.reg
        return out

    def _dense_rows(self, C: Any, rows: Any, fill: float, values: np.ndarray) -> np.ndarray:
        """Dense rows ``rows`` of the pattern of ``C`` with ``values`` (one per stored entry
        of ``C``) on the stored entries and ``fill`` elsewhere."""
        index = np.atleast_1d(np.arange(C.shape[0])[rows])
        out = np.full((index.size, C.shape[1]), fill)
        entries, indptr = _entries_of_rows(C.indptr, index)
        out[np.repeat(np.arange(index.size), np.diff(indptr)), C.indices[entries]] = values[entries]
        return out

    def log_block(self, rows: Any, dtype: np.dtype = np.float64) -> np.ndarray:
        """Dense rows of ``-M / reg``, ``-FORBIDDEN_LOG`` at the missing entries (what the
        dense geometry reads for ``+inf``); ``O(rows x m)``."""
        out = self._dense_rows(self.M, rows, -FORBIDDEN_LOG, self._neg_cost_entries())
        return out.astype(dtype, copy=False)

    def block(self, index: Any) -> np.ndarray:
        """True dense rows ``K[index, :]`` (zeros at the missing entries)."""
        return self._dense_rows(self.M, index, 0.0, np.exp(self._neg_cost_entries()))

    def columns(self, index: Any) -> np.ndarray:
        """True dense columns ``K[:, index]``, shape ``(n, len(index))``."""
        values = np.exp(self._neg_cost_entries(transpose=True))
        return self._dense_rows(self.transposed_, index, 0.0, values).T

    def cost_block(self, rows: Any) -> np.ndarray:
        """Dense cost rows; a missing pair reads ``reg * FORBIDDEN_LOG`` (as a dense
        ``+inf``: its plan entry is 0, and so is its cost term)."""
        return self._dense_rows(self.M, rows, self.reg * FORBIDDEN_LOG, self.M.data - self.offset)

    def kernel_matrix(
        self, transpose: bool = False, log_shift: Any = None, floor: float | None = None
    ) -> Any:
        """``K`` (or ``K^T``) as a CSR array on the stored entries, ``O(nnz)``; with
        ``log_shift = (alpha, beta)`` the entries are ``exp(alpha_i + beta_j - M_ij / reg)``;
        ``floor`` clamps the exponents from below (an absorbed kernel's entries never
        denormal)."""
        import scipy.sparse

        C = self._matrix(transpose)
        exponents = self._neg_cost_entries(transpose)
        if log_shift is not None:
            alpha, beta = log_shift
            if transpose:
                alpha, beta = beta, alpha
            with np.errstate(invalid="ignore"):
                exponents += alpha[self._entry_rows(transpose)]
                exponents += beta[C.indices]
        if floor is not None:
            np.maximum(exponents, floor, out=exponents)
        return scipy.sparse.csr_array((np.exp(exponents), C.indices, C.indptr), shape=C.shape)

    def matmat(self, index: Any, V: np.ndarray, *, transpose: bool = False) -> np.ndarray:
        """``K[index, :] @ V`` (or ``K[:, index].T @ V``) over the stored entries,
        ``O(nnz of the rows)`` per column of ``V``."""
        C = self._matrix(transpose)
        rows = np.arange(C.shape[0])[index]
        flat = np.atleast_1d(rows)
        if flat.size == C.shape[0] and np.array_equal(flat, np.arange(C.shape[0])):
            return np.asarray(self.kernel_matrix(transpose) @ V, dtype=np.float64)
        import scipy.sparse

        # only the stored entries of the rows asked for: a sampled check costs O(their nnz)
        entries, indptr = _entries_of_rows(C.indptr, flat)
        values = np.exp((C.data[entries] - self.offset) * (-1.0 / self.reg))
        K = scipy.sparse.csr_array(
            (values, C.indices[entries], indptr), shape=(flat.size, C.shape[1])
        )
        out = np.asarray(K @ V, dtype=np.float64)
        return out.reshape(rows.shape + out.shape[1:])

    def log_matvec(
        self, index: Any, log_v: np.ndarray, *, transpose: bool = False, over: Any = None
    ) -> np.ndarray:
        """``log (K[index, :] @ exp(log_v))`` over the stored entries (or the transposed form),
        stable for any reg (each row shifted by its largest term); ``-inf`` for a row with no
        allowed pair or only zero weights. ``over`` restricts the sum to those entries of the
        other side (``log_v`` then has one entry per entry of ``over``). ``O(nnz)``."""
        C = self._matrix(transpose)
        width = C.shape[1]
        if over is not None and not (isinstance(over, slice) and over == slice(None)):
            full = np.full(width, -np.inf)
            full[np.arange(width)[over]] = log_v
            log_v = full
        rows = np.arange(C.shape[0])[index]
        flat = np.atleast_1d(rows)
        if flat.size == C.shape[0] and np.array_equal(flat, np.arange(C.shape[0])):
            terms = self._neg_cost_entries(transpose)
            terms += log_v[C.indices]
            return _segment_logsumexp(terms, C.indptr)[rows]
        # only the stored entries of the rows asked for: a sampled check costs O(their nnz)
        entries, indptr = _entries_of_rows(C.indptr, flat)
        terms = (C.data[entries] - self.offset) * (-1.0 / self.reg)
        terms += log_v[C.indices[entries]]
        return _segment_logsumexp(terms, indptr).reshape(rows.shape)

    def softmax_average(
        self,
        points: np.ndarray | None,
        log_weights: np.ndarray,
        values: np.ndarray,
        *,
        transpose: bool = False,
    ) -> np.ndarray:
        """``sum_j softmax_j(log_w_j - M_ij / reg) values_j`` over each row's stored entries
        (every column's when ``transpose``); a row with no allowed pair of positive weight
        gives NaN. ``points`` must be ``None``."""
        import scipy.sparse

        if points is not None:
            require_points(self, "softmax_average at new points")
        C = self._matrix(transpose)
        terms = self._neg_cost_entries(transpose)
        terms += log_weights[C.indices]
        top = _segment_max(terms, C.indptr)
        with np.errstate(invalid="ignore"):
            weights = np.exp(terms - top[self._entry_rows(transpose)])
        W = scipy.sparse.csr_array((weights, C.indices, C.indptr), shape=C.shape)
        with np.errstate(invalid="ignore", divide="ignore"):
            totals = np.asarray(W.sum(axis=1)).ravel()
            out = np.asarray(W @ values, dtype=np.float64)
            return out / (totals if values.ndim == 1 else totals[:, None])

    def dual_lower_bound(self, f: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
        """Weak duality over the allowed pairs: with ``g_j = min_{a_i > 0, (i, j) stored}
        (M_ij - f_i)`` (``+inf`` for a column no active row reaches), ``<f, a> + <g, b>``
        bounds ``min <P, M>`` over couplings on the allowed pairs from below. ``O(nnz)``."""
        active = a > 0
        rows = self._rows_of_entries
        keep = active[rows]
        g = np.full(self.shape[1], np.inf)
        np.minimum.at(g, self.M.indices[keep], self.M.data[keep] - self.offset - f[rows[keep]])
        with np.errstate(invalid="ignore"):
            total = float(f[active] @ a[active]) + float(np.where(b > 0, g * b, 0.0).sum())
        return total

    def plan_inner(self, log_u: np.ndarray, log_v: np.ndarray, W: Any) -> float:
        """``<P, W>`` for the plan ``P = diag(u) K diag(v)`` on the stored entries and ``W``
        given on the same pattern (a sparse matrix, read at the stored entries) or dense.
        ``O(nnz)``."""
        rows, cols = self._rows_of_entries, self.M.indices
        plan = self._neg_cost_entries()
        plan += log_u[rows]
        plan += log_v[cols]
        np.exp(plan, out=plan)
        values = _values_at(W, rows, cols)
        with np.errstate(invalid="ignore"):
            return float(np.where(plan > 0, plan * values, 0.0).sum())

    def plan_entries(self, log_u: np.ndarray, log_v: np.ndarray) -> tuple[np.ndarray, ...]:
        """``(rows, cols, P_ij)`` of the plan ``P = diag(u) K diag(v)`` on the stored entries
        (``O(nnz)``): what a summary of the plan reads instead of dense rows."""
        rows, cols = self._rows_of_entries, self.M.indices
        plan = self._neg_cost_entries()
        plan += log_u[rows]
        plan += log_v[cols]
        np.exp(plan, out=plan)
        return rows, cols, plan

    def plan_matrix(self, log_u: np.ndarray, log_v: np.ndarray) -> Any:
        """The plan ``diag(u) K diag(v)`` as a ``scipy.sparse.csr_array`` on the stored
        entries (``O(nnz)``; a pair whose plan entry underflows stays stored, as 0)."""
        import scipy.sparse

        _, _, plan = self.plan_entries(log_u, log_v)
        return scipy.sparse.csr_array(
            (plan, self.M.indices.copy(), self.M.indptr.copy()), shape=self.shape
        )


def _values_at(W: Any, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``W[rows, cols]`` for a dense or a SciPy sparse ``W`` (0 where a sparse ``W`` stores
    nothing)."""
    if is_sparse(W):
        return np.asarray(W.tocsr()[rows, cols]).ravel().astype(np.float64)
    return np.asarray(W, dtype=np.float64)[rows, cols]


def _entries_of_rows(indptr: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(entries, sub_indptr)``: the storage positions of the stored entries of ``rows`` (in
    the order of ``rows``) and the CSR ``indptr`` of the sub-matrix they make; ``O(their
    nnz)``, no Python loop over rows."""
    starts, counts = indptr[rows], indptr[rows + 1] - indptr[rows]
    sub_indptr = np.zeros(rows.size + 1, dtype=np.intp)
    np.cumsum(counts, out=sub_indptr[1:])
    entries = np.arange(sub_indptr[-1]) + np.repeat(starts - sub_indptr[:-1], counts)
    return entries, sub_indptr


def _segment_max(values: np.ndarray, indptr: np.ndarray) -> np.ndarray:
    """The largest of each row's stored values (CSR ``indptr``), ``-inf`` for an empty row."""
    out = np.full(indptr.size - 1, -np.inf)
    nonempty = np.flatnonzero(np.diff(indptr) > 0)
    if nonempty.size:
        out[nonempty] = np.maximum.reduceat(values, indptr[nonempty])
    return out


def _segment_logsumexp(values: np.ndarray, indptr: np.ndarray) -> np.ndarray:
    """``log sum exp`` of each row's stored values, shifted by the row's largest value;
    ``-inf`` for an empty row or one whose values are all ``-inf``."""
    top = _segment_max(values, indptr)
    shift = np.where(np.isfinite(top), top, 0.0)
    counts = np.diff(indptr)
    with np.errstate(invalid="ignore"):
        terms = np.exp(values - np.repeat(shift, counts))
    sums = np.zeros(indptr.size - 1)
    nonempty = np.flatnonzero(counts > 0)
    if nonempty.size:
        sums[nonempty] = np.add.reduceat(terms, indptr[nonempty])
    with np.errstate(divide="ignore"):
        return shift + np.log(sums)


def cost_geometry(M: Any, reg: Any, *, shift: bool = False) -> CostMatrixGeometry:
    """The geometry of a cost matrix: :class:`SparseCostMatrixGeometry` for a SciPy sparse
    ``M`` (its stored entries the allowed pairs), :class:`~sketchot.cost_matrix.
    CostMatrixGeometry` for a dense one (``+inf`` entries the forbidden pairs)."""
    if is_sparse(M):
        return SparseCostMatrixGeometry(M, reg, shift=shift)
    return CostMatrixGeometry(M, reg, shift=shift)


def allowed_pairs(geometry: CostMatrixGeometry) -> Any:
    """The allowed pairs of a cost-matrix geometry: a boolean array (``M`` finite) or, for a
    sparse geometry, its pattern (what :func:`~sketchot.cost_matrix.check_support` reads)."""
    if isinstance(geometry, SparseCostMatrixGeometry):
        import scipy.sparse

        M = geometry.M
        return scipy.sparse.csr_array(
            (np.ones(M.nnz, dtype=bool), M.indices, M.indptr), shape=M.shape
        )
    return np.isfinite(geometry.M)


def sparse_reference_costs(
    M: Any, a: np.ndarray, b: np.ndarray, reg: float, log_c: Any = None
) -> Any:
    """:func:`~sketchot.cost_matrix.reference_costs` on the stored entries of a sparse ``M``
    (checked: :func:`check_sparse_cost`): ``M_ij + reg log(a_i b_j / c_ij)`` there, a zero
    weight's term left out; ``log c = -inf`` gives ``+inf`` (a forbidden pair, dropped when
    the geometry is built). Returned as a CSR array of the same pattern."""
    import scipy.sparse

    with np.errstate(divide="ignore"):
        log_a, log_b = np.log(a), np.log(b)
    log_a[~np.isfinite(log_a)] = 0.0
    log_b[~np.isfinite(log_b)] = 0.0
    rows, cols = _row_of_entries(M), M.indices
    data = M.data + reg * (log_a[rows] + log_b[cols])
    if log_c is not None:
        with np.errstate(invalid="ignore"):
            data -= reg * np.asarray(log_c)[rows, cols]
    return scipy.sparse.csr_array((data, cols.copy(), M.indptr.copy()), shape=M.shape)


__all__ = [
    "SparseCostMatrixGeometry",
    "allowed_pairs",
    "check_sparse_cost",
    "cost_geometry",
    "is_sparse",
    "sparse_reference_costs",
]
