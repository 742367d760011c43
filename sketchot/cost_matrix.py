"""The Gibbs kernel of a cost matrix ``M`` given by the caller: ``K = exp(-M / reg)``,
with no point cloud behind it (POT's ``ot.sinkhorn(a, b, M, reg)``).

:class:`CostMatrixGeometry` offers the contract of :class:`~sketchot.gibbs.GibbsGeometry`
that kernels and the solver read for TRUE kernel values (``shape``, ``reg``, ``cost``,
``context``, ``max_cost``, ``at_reg``, ``sample``, ``block``, ``log_block``, ``cost_block``,
``matmat``, ``log_matvec``, ``softmax_average`` of the fitted rows, ``computes_on_device``),
each read from ``M`` block by block, plus :meth:`~CostMatrixGeometry.dual_lower_bound`. What
only points give (``X``, ``Y``, their centred forms and norms, ``center``, ``rows``,
``union_rows``, ``fit_clouds``, new points in ``softmax_average``) raises
:class:`PointsRequiredError`, naming what needs points. :func:`has_points` tells callers
that read coordinates (a plan's moments, barycentric maps) which geometry they have.

``M`` is held as given when it is a C-contiguous float64 array (no copy: the caller keeps
it unchanged while a solve runs), otherwise converted once. Every block is ``-M[rows] /
reg`` read from it, so the entries agree bit for bit with a point-cloud geometry whose
cost blocks gave ``M``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._arrays import NUMPY
from ._parallel import Part, run_parts
from ._validation import check_float, describe, refuse_masked
from .gibbs import FLOAT64, THREADED_LOG_ENTRIES, block_rows, row_slices

#: ``-M_ij / reg`` of a forbidden pair (``M_ij = +inf``) in the geometry's blocks: finite, so
#: that a plan's entry there is ``exp(-1e100 + ...) = 0`` exactly and its cost term ``0 x
#: 1e100`` is 0 (``0 x inf`` would be NaN), and far below any exponent a finite cost gives.
FORBIDDEN_LOG = 1e100

#: The ``dim`` of :func:`~sketchot.gibbs.block_rows` for blocks of ``M``: its entries are
#: read, not computed from coordinates, so cache-sized blocks keep the elementwise steps
#: (scale, shifts, exp, sums) in cache, as for low-dimensional points.
BLOCK_DIM = 0


class PointsRequiredError(AttributeError):
    """An operation that needs point coordinates was asked of a geometry given by a cost
    matrix (an ``AttributeError``, so that ``getattr(geometry, 'X', None)`` reads "no
    points")."""


@dataclass(frozen=True)
class MatrixCost:
    """The cost of a :class:`CostMatrixGeometry`: the given matrix (scikit-learn's
    ``metric='precomputed'``). It has the attributes callers read of a
    :class:`~sketchot.gibbs.Cost`; none of the point-cloud shortcuts applies."""

    shape: tuple[int, int]

    metric = "precomputed"
    name = "precomputed"
    p = 2.0
    #: Not ``||x - y||^2``: no moment expansion of the plan's cost.
    sqeuclidean = False
    #: No coordinates to translate (no coarse-to-fine start from clusters).
    translation_invariant = False

    def __str__(self) -> str:
        return f"a cost matrix M of shape {self.shape}"

    def transposed(self) -> MatrixCost:
        """The cost of ``M^T``."""
        return MatrixCost((self.shape[1], self.shape[0]))


def check_cost_matrix(M: Any, name: str = "M") -> np.ndarray:
    """Validate a dense cost matrix: 2-D, non-empty, real, no NaN, no ``-inf``, at least one
    finite entry; returned as C-contiguous float64 (``M`` itself when it already is). ``+inf``
    entries are forbidden pairs (the kernel is 0 there) and negative entries are costs like
    any other (:class:`CostMatrixGeometry`). Errors name ``name``, say what was expected and
    what was received (:func:`~sketchot.gibbs.check_cost_block`'s wording)."""
    refuse_masked(
        M, name, f"fill the masked entries ({name}.filled(c) with a cost c, np.inf for a "
        "forbidden pair) first"
    )  # fmt: skip
    if hasattr(M, "tocsr") or hasattr(M, "toarray"):  # a SciPy sparse matrix
        raise TypeError(
            f"{name} must be a dense 2-D array of costs (n, m) here; got {describe(M)}: a "
            "sparse matrix of allowed pairs (missing entries forbidden) has its own geometry, "
            "sketchot.sparse_cost.SparseCostMatrixGeometry, which sketchot.solve and the "
            "POT-named entries build for a sparse M"
        )
    try:
        array = np.asarray(M)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"{name} must be a 2-D array of real costs (n, m); got {describe(M)}"
        ) from exc
    if array.dtype.kind not in "biuf":
        raise TypeError(
            f"{name} must be a 2-D array of real costs (n, m); got dtype {array.dtype} from "
            f"{describe(M)}"
        )
    if array.ndim != 2:
        raise ValueError(
            f"{name} must be a 2-D cost matrix of shape (n, m) (n rows of a, m of b); got "
            f"{array.ndim}-D input of shape {array.shape}"
        )
    if 0 in array.shape:
        raise ValueError(f"{name} must be non-empty; got shape {array.shape}")
    out = np.ascontiguousarray(array, dtype=np.float64)
    if np.isfinite(out.min()) and np.isfinite(out.max()):  # no NaN (it propagates), no inf
        return out
    nan = int(np.count_nonzero(np.isnan(out)))
    if nan:
        raise ValueError(
            f"{name} must contain real costs (+inf for a forbidden pair); got NaN for {nan} "
            f"of its {out.size} entries"
        )
    minus = int(np.count_nonzero(out == -np.inf))
    if minus:
        raise ValueError(
            f"{name} must contain real costs (+inf for a forbidden pair); got {minus} entries "
            f"-inf of its {out.size}: a pair of cost -inf makes the transport problem "
            "unbounded"
        )
    if not np.isfinite(out).any():
        raise ValueError(
            f"{name} must have at least one finite cost (an allowed pair); got {out.size} "
            "entries +inf (every pair forbidden)"
        )
    return out


def cost_range(M: np.ndarray) -> tuple[float, float]:
    """``(smallest, largest)`` finite entry of a checked ``M`` (``+inf`` entries are
    forbidden pairs, not costs)."""
    finite = np.isfinite(M)
    if finite.all():
        return float(M.min()), float(M.max())
    values = M[finite]
    return float(values.min()), float(values.max())


def check_support(allowed: Any, a: np.ndarray, b: np.ndarray, hard: tuple[bool, bool]) -> None:
    """Refuse weights that no plan on the allowed pairs can carry, when it is detectable
    cheaply: a row (column) with positive weight and a hard marginal whose allowed pairs all
    meet zero weights, and, for balanced transport, a block of the allowed pairs' graph
    (its connected components over the positive weights) whose masses in ``a`` and ``b``
    differ. Hall's condition within one block is not checked (the solve then misses its
    accuracy and says so).

    Parameters
    ----------
    allowed : ndarray of bool or scipy.sparse matrix, shape (n, m)
        The allowed pairs (``M`` finite, or the stored entries of a sparse ``M``).
    a, b : ndarray
        The weights.
    hard : pair of bool
        Whether each marginal is a hard constraint (balanced transport: both).
    """
    import scipy.sparse

    rows, cols = np.flatnonzero(a > 0), np.flatnonzero(b > 0)
    if scipy.sparse.issparse(allowed):
        graph = scipy.sparse.csr_array(allowed, dtype=bool)[rows][:, cols]
        graph.eliminate_zeros()
    else:
        graph = scipy.sparse.csr_array(np.asarray(allowed, dtype=bool)[np.ix_(rows, cols)])
    row_count, col_count = graph.sum(axis=1), graph.sum(axis=0)
    for side, (count, index, weights, other) in enumerate(
        ((row_count, rows, a, "columns with b_j > 0"), (col_count, cols, b, "rows with a_i > 0"))
    ):
        empty = np.flatnonzero(count == 0)
        if empty.size:
            what = ("row", "a") if side == 0 else ("column", "b")
            first = int(index[empty[0]])
            fix = (
                "there is no plan with these marginals; forbid fewer pairs or set its weight to 0"
                if hard[side]
                else "a soft marginal would destroy its mass, which the "
                "solver does not represent (log K v = -inf): set its weight to 0 (the "
                f"value then lacks that side's penalty times {what[1]}_i)"
            )
            raise ValueError(
                f"M has {empty.size} {what[0]}(s) with weight > 0 and no allowed pair among "
                f"the {other} (every entry +inf or missing), e.g. {what[0]} {first} "
                f"({what[1]}[{first}] = {weights[first]:.6g}): {fix}"
            )
    if not all(hard) or (row_count.min() * 2 > cols.size and col_count.min() * 2 > rows.size):
        return  # any two rows share a column: one block
    from scipy.sparse.csgraph import connected_components

    n_active = rows.size
    both = scipy.sparse.block_array([[None, graph], [graph.T, None]], format="csr")
    count, labels = connected_components(both, directed=False)
    if count == 1:
        return
    mass_a = np.bincount(labels[:n_active], weights=a[rows], minlength=count)
    mass_b = np.bincount(labels[n_active:], weights=b[cols], minlength=count)
    gap = np.abs(mass_a - mass_b)
    worst = int(gap.argmax())
    if gap[worst] > 1e-9 * max(float(a.sum()), float(b.sum())):
        block_rows_ = rows[labels[:n_active] == worst]
        raise ValueError(
            f"M's allowed pairs split the weights into {count} independent blocks, and one "
            f"(rows {_few(block_rows_)} of M) holds mass {mass_a[worst]:.6g} in a and "
            f"{mass_b[worst]:.6g} in b: no plan on the allowed pairs has the marginals a "
            "and b (balanced transport moves mass only along allowed pairs); allow pairs "
            "between the blocks or solve unbalanced"
        )


def _few(index: np.ndarray) -> str:
    """A few indices, for a message."""
    shown = ", ".join(str(int(i)) for i in index[:5])
    return shown + (f", ... ({index.size} in all)" if index.size > 5 else "")


def lowest_cost(geometry: Any) -> float:
    """The smallest cost the geometry's kernel reads, or 0 when that is not negative: a plan
    of mass ``s`` costs at least ``lowest_cost * s`` (0 for point clouds, whose costs are
    distances; negative for a cost matrix solved with its negative entries as they are)."""
    if has_points(geometry):
        return 0.0
    return min(geometry.min_cost - geometry.offset, 0.0)


def reference_costs(
    M: np.ndarray, a: np.ndarray, b: np.ndarray, reg: float, log_c: Any = None
) -> np.ndarray:
    """The costs ``M + reg log(a b^T / c)`` (a new array) on which ``reg KL(P | a b^T)``
    is POT's ``reg KL(P | c)`` on ``M``: for every plan ``P``,

    ``<P, M'> + reg KL(P | a b^T) = <P, M> + reg KL(P | c) + reg (sum(a) sum(b) - sum(c))``

    (generalised KL), so both problems have the same plans whatever the marginal penalties.

    Parameters
    ----------
    M : ndarray, shape (n, m)
        Checked costs (:func:`check_cost_matrix`); ``+inf`` stays a forbidden pair.
    a, b : ndarray
        The weights; a zero weight's row (column) carries no mass, so its term is left out
        (its costs stay ``M``'s).
    reg : float
    log_c : ndarray of shape (n, m), or None
        ``log c``; ``-inf`` (``c_ij = 0``) makes a forbidden pair. ``None``: ``c = 1``
        (POT's ``reg_type='entropy'``).
    """
    with np.errstate(divide="ignore"):
        log_a, log_b = np.log(a), np.log(b)
    log_a[~np.isfinite(log_a)] = 0.0
    log_b[~np.isfinite(log_b)] = 0.0
    out = np.add.outer(reg * log_a, reg * log_b)
    if log_c is not None:
        with np.errstate(invalid="ignore"):
            out -= reg * log_c  # c = 0: +inf, a forbidden pair
    out += M  # +inf + finite stays +inf
    return out


def has_points(geometry: Any) -> bool:
    """Whether the geometry has point coordinates (every geometry but
    :class:`CostMatrixGeometry`): plans' moments, barycentric maps, out-of-sample products
    and sketches fitted on points need them."""
    return not isinstance(geometry, CostMatrixGeometry)


def block_dim(geometry: Any) -> int:
    """The ``dim`` that sizes row blocks of the geometry's entries
    (:func:`~sketchot.gibbs.block_rows`): the points' dimension, or :data:`BLOCK_DIM` for a
    cost matrix."""
    return geometry.Xc.shape[1] if has_points(geometry) else BLOCK_DIM


def require_points(geometry: Any, what: str) -> None:
    """Raise :class:`PointsRequiredError` when ``geometry`` has no points, naming ``what``."""
    if not has_points(geometry):
        raise PointsRequiredError(
            f"{what} needs point clouds X, Y; this kernel was built on {geometry.cost} (no "
            "coordinates): solve on the clouds (sketchot.sinkhorn(a, b, X, Y, reg)), or use "
            "the plan's products with your own coordinates, e.g. "
            "result.lazy_plan.matmat(Y) / result.marginal_a[:, None] for the barycentric map"
        )


def _positions(index: Any, size: int) -> tuple[np.ndarray, bool]:
    """``index`` (a slice, integers or a mask over ``range(size)``) as sorted-or-not int
    positions, and whether they are one contiguous increasing run (blocks are then views)."""
    positions = np.atleast_1d(np.arange(size)[index])
    run = positions.size == 0 or bool(
        positions[-1] - positions[0] + 1 == positions.size and np.all(np.diff(positions) == 1)
    )
    return positions, run


def _part(positions: np.ndarray, run: bool, rows: slice) -> Any:
    """The positions ``positions[rows]``: a slice when they are contiguous."""
    if run and positions.size:
        start = int(positions[0])
        return slice(start + rows.start, start + rows.stop)
    return positions[rows]


class CostMatrixGeometry:
    """A cost matrix ``M`` and ``reg``: the TRUE Gibbs kernel ``K_ij = exp(-M_ij / reg)``.

    Parameters
    ----------
    M : array_like, shape (n, m)
        Costs (:func:`check_cost_matrix`); any cost, not only one a point cloud gives (not
        symmetric, no triangle inequality needed). ``+inf`` marks a forbidden pair: the
        kernel is 0 there (blocks read ``-FORBIDDEN_LOG`` for ``-M / reg``, so that plans
        are exactly 0 and their cost terms 0, never NaN). Negative costs are costs: the
        kernel is ``exp(-M / reg) > 1`` there.
    reg : float
        Entropic regularisation, ``> 0``.
    shift : bool, default=False
        Whether the geometry's costs are ``M - min(M)`` when ``M`` has negative entries
        (``offset = min(M)``): the kernel is then ``exp(-(M - offset) / reg)``, ``e^(offset /
        reg)`` times ``exp(-M / reg)``, so that no exponent is positive. Balanced transport
        has the same plan on both; its value moves by ``offset`` times the mass and ``log
        u`` by ``offset / reg`` (:func:`sketchot.solver.matrix.sinkhorn_matrix` puts them
        back). Blocks, costs and bounds are all of ``M - offset``.

    Attributes
    ----------
    M : ndarray, shape (n, m)
        The costs as given, C-contiguous float64.
    offset : float
        What the geometry subtracts from ``M`` (0 unless ``shift`` and ``M`` has negative
        entries).
    min_cost : float
        The smallest finite entry of ``M``.
    forbidden : int
        The number of ``+inf`` entries (forbidden pairs).
    reg : float
    cost : MatrixCost
        What callers read of the cost (``sqeuclidean`` and ``translation_invariant`` are
        False).
    context : ArrayContext
        NumPy on the host (the kernels of this geometry run there).

    Notes
    -----
    Blocks of ``M`` are read row by row (``O(rows m)`` each, no ``n x m`` temporary); the
    column side (``transpose=True``) reads strided columns. The range of the finite costs is
    found once (``O(n m)``) and kept by :meth:`at_reg`; :meth:`max_cost` is the spread of the
    kernel's exponents, the largest entry when ``M >= 0``.
    """

    def __init__(self, M: Any, reg: Any, *, shift: bool = False) -> None:
        self.M = check_cost_matrix(M)
        self.reg = check_float(reg, "reg", positive=True)
        self.cost = MatrixCost(self.M.shape)
        self.context = NUMPY
        self.min_cost, largest = cost_range(self.M)
        self.forbidden = int(self.M.size - np.count_nonzero(np.isfinite(self.M)))
        self._max_cost = largest - min(self.min_cost, 0.0)
        self.offset = min(self.min_cost, 0.0) if shift else 0.0
        self.check_reg()

    @classmethod
    def _checked(
        cls, M: np.ndarray, reg: float, max_cost: float, min_cost: float = 0.0,
        forbidden: int = 0, offset: float = 0.0,
    ) -> CostMatrixGeometry:  # fmt: skip
        """A geometry of an already validated ``M`` (another ``reg``, a sub-matrix)."""
        geometry = cls.__new__(cls)
        geometry.M, geometry.reg = M, float(reg)
        geometry.cost = MatrixCost(M.shape)
        geometry.context = NUMPY
        geometry._max_cost = max_cost
        geometry.min_cost, geometry.forbidden, geometry.offset = min_cost, forbidden, offset
        geometry.check_reg()
        return geometry

    @classmethod
    def all_forbidden(cls, shape: tuple[int, int], reg: float) -> CostMatrixGeometry:
        """The geometry of a cost that forbids every pair (every entry ``+inf``): its kernel
        is 0 (a sampled sub-matrix may be one)."""
        empty = np.full(shape, np.inf)
        if empty.ndim != 2:
            raise ValueError(f"shape must be (n, m); got {shape!r}")
        return cls._checked(empty, check_float(reg, "reg", positive=True), 0.0, 0.0, empty.size)

    def unshifted(self) -> CostMatrixGeometry:
        """The same ``M`` (not copied) at the same ``reg`` with no offset: the kernel
        ``exp(-M / reg)`` itself."""
        return CostMatrixGeometry._checked(
            self.M, self.reg, self._max_cost, self.min_cost, self.forbidden
        )

    def check_reg(self) -> None:
        """Refuse a ``reg`` at which ``max_cost() / reg`` or ``1 / reg`` is not a finite
        float64 (``ValueError``): every geometry built or moved to another ``reg`` calls it."""
        with np.errstate(over="ignore", divide="ignore"):
            scale = self._max_cost / self.reg
            inverse = 1.0 / self.reg
        if not (np.isfinite(scale) and np.isfinite(inverse)):
            raise ValueError(
                f"reg={self.reg:g} is too small for this cost matrix: max(M) / reg = "
                f"{scale:g} is not a finite float64 (reg must be a normal positive number "
                "well above 1e-300 times the largest cost)"
            )

    def __repr__(self) -> str:
        n, m = self.shape
        return (
            f"<CostMatrixGeometry {n}x{m} reg={self.reg:g} max_cost={self._max_cost:.6g}"
            + (f" offset={self.offset:.6g}" if self.offset else "")
            + (f" forbidden={self.forbidden}" if self.forbidden else "")
            + ">"
        )

    # ------------------------------------------------------------ the contract
    @property
    def shape(self) -> tuple[int, int]:
        """``(n, m)``."""
        return self.M.shape

    @property
    def metric(self) -> str:
        """``'precomputed'`` (the cost is the matrix)."""
        return self.cost.metric

    def max_cost(self) -> float:
        """The spread of the costs: the largest finite entry of ``M`` minus the smallest
        when that is negative (the largest entry when ``M >= 0``; exact, not a bound).
        Schedules and scales read it as the range of ``M / reg``."""
        return self._max_cost

    def at_reg(self, reg: float) -> CostMatrixGeometry:
        """The same ``M`` (not copied) at another ``reg``."""
        return CostMatrixGeometry._checked(
            self.M, reg, self._max_cost, self.min_cost, self.forbidden, self.offset
        )

    def sample(self, size: int, generator: np.random.Generator) -> CostMatrixGeometry:
        """The sub-matrix of at most ``size`` rows and ``size`` columns drawn uniformly without
        replacement (rows first, as :meth:`GibbsGeometry.sample
        <sketchot.gibbs.GibbsGeometry.sample>` draws its points), at the same ``reg``."""
        n, m = self.shape
        rows = np.sort(generator.choice(n, size=min(size, n), replace=False))
        cols = np.sort(generator.choice(m, size=min(size, m), replace=False))
        sub = np.ascontiguousarray(self.M[np.ix_(rows, cols)])
        if not np.isfinite(sub).any():  # every sampled pair forbidden: the kernel is 0
            return CostMatrixGeometry.all_forbidden(sub.shape, self.reg)
        smallest, largest = cost_range(sub)
        forbidden = int(sub.size - np.count_nonzero(np.isfinite(sub)))
        return CostMatrixGeometry._checked(
            sub, self.reg, largest - min(smallest, 0.0), smallest, forbidden,
            min(smallest, 0.0) if self.offset else 0.0,
        )  # fmt: skip

    def computes_on_device(self, cost: Any = None) -> bool:
        """Never: the matrix is a NumPy array on the host."""
        del cost
        return False

    def _oriented(self, transpose: bool) -> np.ndarray:
        return self.M.T if transpose else self.M

    def _neg_cost(
        self, C: np.ndarray, rows: Any, over: Any = None, dtype: np.dtype = FLOAT64
    ) -> np.ndarray:
        """``-C[rows][:, over] / reg`` in ``dtype`` (a new array)."""
        if over is None:
            block = C[rows]
        elif isinstance(rows, slice):
            block = C[rows, over]
        else:
            block = C[np.ix_(rows, np.arange(C.shape[1])[over])]
        out = np.array(block, dtype=dtype)
        if self.offset:
            out -= self.offset
        out *= -1.0 / self.reg
        if self.forbidden:  # -inf -> -FORBIDDEN_LOG: exp gives 0, 0 x it gives 0
            np.maximum(out, -FORBIDDEN_LOG, out=out)
        return out

    def log_block(self, rows: Any, dtype: np.dtype = FLOAT64) -> np.ndarray:
        """``-M[rows, :] / reg`` in ``dtype`` (float64 by default)."""
        return self._neg_cost(self.M, rows, dtype=dtype)

    def block(self, index: Any) -> np.ndarray:
        """True rows ``K[index, :] = exp(-M[index, :] / reg)``."""
        out = self.log_block(index)
        return np.exp(out, out=out)

    def columns(self, index: Any) -> np.ndarray:
        """True columns ``K[:, index] = exp(-M[:, index] / reg)``, shape ``(n, len(index))``
        (strided reads of ``M``, ``O(n len(index))``)."""
        out = self._neg_cost(self.M.T, index)
        return np.exp(out, out=out).T

    def cost_block(self, rows: Any) -> np.ndarray:
        """The cost rows ``M[rows, :]`` (a new float64 array); a forbidden pair reads
        ``reg * FORBIDDEN_LOG`` (``-reg`` times :meth:`log_block`'s entry: its plan entry is
        0, and so is its cost term)."""
        out = np.array(self.M[rows], dtype=np.float64)
        if self.offset:
            out -= self.offset
        if self.forbidden:
            np.minimum(out, self.reg * FORBIDDEN_LOG, out=out)
        return out

    def matmat(self, index: Any, V: np.ndarray, *, transpose: bool = False) -> np.ndarray:
        """``K[index, :] @ V`` (or ``K[:, index].T @ V``), ``O(len(index) m)``."""
        C = self._oriented(transpose)
        positions, run = _positions(index, C.shape[0])
        out = np.empty((positions.size, *V.shape[1:]))
        for rows in row_slices(positions.size, block_rows(C.shape[1], dim=BLOCK_DIM)):
            block = self._neg_cost(C, _part(positions, run, rows))
            np.exp(block, out=block)
            out[rows] = block @ V
        return out

    def log_matvec(
        self, index: Any, log_v: np.ndarray, *, transpose: bool = False, over: Any = None
    ) -> np.ndarray:
        """``log (K[index, :] @ exp(log_v))`` (or the transposed form, ``K[:, index].T``),
        stable for any reg: a per-row maximum shift; ``-inf`` for a row whose weights are
        all zero. ``over`` restricts the sum to those entries of the other side (``log_v``
        then has one entry per entry of ``over``). Large products run on the pool's threads
        (row blocks are independent: the same bits with any number of threads)."""
        C = self._oriented(transpose)
        positions, run = _positions(index, C.shape[0])
        width = C.shape[1] if over is None else np.arange(C.shape[1])[over].size
        out = np.empty(positions.size)

        def rows_of(part: Part[slice]) -> None:
            for rows in part:
                logits = self._neg_cost(C, _part(positions, run, rows), over)
                logits += log_v[None, :]
                top = logits.max(axis=1)
                shift = np.where(np.isfinite(top), top, 0.0)
                logits -= shift[:, None]
                np.exp(logits, out=logits)
                with np.errstate(divide="ignore"):
                    out[rows] = shift + np.log(logits.sum(axis=1))

        slices = list(row_slices(positions.size, block_rows(width, dim=BLOCK_DIM)))
        run_parts(rows_of, slices, positions.size * width >= THREADED_LOG_ENTRIES)
        return out

    def softmax_average(
        self,
        points: np.ndarray | None,
        log_weights: np.ndarray,
        values: np.ndarray,
        *,
        transpose: bool = False,
    ) -> np.ndarray:
        """``sum_j softmax_j(log_w_j - M_ij / reg) values_j`` for every row ``i`` (every
        column when ``transpose``); ``points`` must be ``None`` (new points need
        coordinates)."""
        if points is not None:
            require_points(self, "softmax_average at new points")
        C = self._oriented(transpose)
        out = np.empty((C.shape[0], *values.shape[1:]))
        for rows in row_slices(C.shape[0], block_rows(C.shape[1], dim=BLOCK_DIM)):
            logits = self._neg_cost(C, rows)
            logits += log_weights[None, :]
            logits -= logits.max(axis=1, keepdims=True)
            np.exp(logits, out=logits)
            logits /= logits.sum(axis=1, keepdims=True)
            out[rows] = logits @ values
        return out

    def dual_lower_bound(self, f: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
        """A lower bound of the unregularised OT cost ``min <P, M>`` over couplings of
        ``a`` and ``b`` (equal masses) from any source potential ``f`` finite where ``a >
        0``: with ``g_j = min_{a_i > 0} (M_ij - f_i)``, ``<f, a> + <g, b>`` (weak duality,
        as :func:`sketchot.gibbs.dual_lower_bound` for points). ``O(n m)``."""
        active = np.flatnonzero(a > 0)
        fa = f[active]
        g = np.full(self.shape[1], np.inf)
        for rows in row_slices(active.size, block_rows(self.shape[1], dim=BLOCK_DIM)):
            block = self.M[active[rows]] - (fa[rows, None] + self.offset)
            np.minimum(g, block.min(axis=0), out=g)
        return float(fa @ a[active] + g @ b)

    def plan_inner(self, log_u: np.ndarray, log_v: np.ndarray, W: np.ndarray) -> float:
        """``<P, W> = sum_ij P_ij W_ij`` for the plan ``P = diag(u) K diag(v)`` of this
        kernel and another ``n x m`` matrix ``W`` (e.g. the costs of the problem that a
        reference measure transformed into this one), over row blocks: ``O(n m)`` time, no
        ``n x m`` temporary. A pair the plan leaves empty adds nothing (even where ``W`` is
        ``inf``)."""
        total = 0.0
        for rows in row_slices(self.shape[0], block_rows(self.shape[1], dim=BLOCK_DIM)):
            block = self._neg_cost(self.M, rows)
            block += log_u[rows, None]
            block += log_v[None, :]
            np.exp(block, out=block)
            with np.errstate(invalid="ignore"):
                terms = np.where(block > 0, block * W[rows], 0.0)
            total += float(terms.sum())
        return total

    # ------------------------------------------------------ what needs points
    def _no_points(self, what: str) -> Any:
        require_points(self, what)

    X = property(lambda self: self._no_points("the source points X"))
    Y = property(lambda self: self._no_points("the target points Y"))
    Xc = property(lambda self: self._no_points("the centred source points Xc"))
    Yc = property(lambda self: self._no_points("the centred target points Yc"))
    x_sq = property(lambda self: self._no_points("the squared norms x_sq"))
    y_sq = property(lambda self: self._no_points("the squared norms y_sq"))
    center = property(lambda self: self._no_points("the points' centre"))

    def rows(self, side: str, index: Any) -> np.ndarray:
        """Refused: a sketch fitted on points needs them."""
        del side, index
        return self._no_points("a sketch fitted on points (rows)")

    def union_rows(self, index: Any = None) -> np.ndarray:
        """Refused: landmarks among the points need them."""
        del index
        return self._no_points("landmarks among the points (union_rows)")

    def fit_clouds(self, generator: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Refused: a data-dependent sketch needs the clouds."""
        del generator
        return self._no_points("a data-dependent sketch (fit_clouds)")
