"""The exact Gibbs kernel ``K(x, y) = exp(-c(x, y) / reg)`` block by block: the one helper
every layer uses for true-kernel values (products, log-sum-exp, softmax averages), and the
one place that owns the cost ``c`` (:class:`Cost`: squared Euclidean by default, or POT's
``'euclidean'``, ``'cityblock'``, ``'minkowski'`` with ``p``, or a callable).

These helpers never hold more than a block of rows times the other side at once; callers
choose the block so that it stays within a few tens of megabytes. Points should be centred
(the kernel is translation invariant) so that the expansion
``||x||^2 + ||y||^2 - 2 x.y`` loses no precision.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.spatial.distance import cdist

from ._arrays import NUMPY, ArrayContext, DeviceArrays
from ._parallel import Part, run_parts

#: Log-domain products over at least this many entries use the thread pool.
THREADED_LOG_ENTRIES = 1 << 22

#: Bytes of a block of kernel entries computed by NumPy from points of at most
#: :data:`CACHE_BLOCK_MAX_DIM` coordinates: a core's share of a typical L2 cache, so that an
#: entry's elementwise steps (cost, shifts, exp, products) run in cache instead of streaming
#: memory between steps.
CPU_BLOCK_BYTES = 1 << 20

#: Above this dimension the cost's cross product ``X_rows Y^T`` dominates, and BLAS repacks
#: ``Y`` for every block: blocks of :data:`BLOCK_BYTES` then cost less than cache-sized ones.
CACHE_BLOCK_MAX_DIM = 4

#: Bytes of a block of entries otherwise (and for other array libraries: PyTorch on the CPU
#: threads its own operations; a GPU's blocks are sized from its free memory).
BLOCK_BYTES = 1 << 24

FLOAT64 = np.dtype(np.float64)


#: The costs by name (POT's ``ot.dist`` names); a callable is accepted too.
METRICS = ("sqeuclidean", "euclidean", "cityblock", "minkowski")


@dataclass(frozen=True)
class Cost:
    """The ground cost ``c(x, y)`` of the problem (POT's ``ot.dist(x1, x2, metric, p)``).

    Parameters
    ----------
    metric : str or callable, default='sqeuclidean'
        ``'sqeuclidean'`` ``||x - y||_2^2``, ``'euclidean'`` ``||x - y||_2``, ``'cityblock'``
        ``||x - y||_1``, ``'minkowski'`` ``||x - y||_p``; or a callable ``metric(A, B)`` on
        two point sets of shapes ``(k, d)`` and ``(l, d)`` returning the non-negative cost
        block of shape ``(k, l)``.
    p : float, default=2
        The order of ``'minkowski'`` (``>= 1``, a norm); ignored by the other metrics.

    Notes
    -----
    A named metric is translation invariant, so it is evaluated on centred points; a callable
    is evaluated on the points as given (:attr:`translation_invariant` is False). A block
    costs ``O(k l d)``: one BLAS product for ``'sqeuclidean'``, ``scipy.spatial.distance.cdist``
    for the others.
    """

    metric: str | Callable[[np.ndarray, np.ndarray], np.ndarray] = "sqeuclidean"
    p: float = 2.0

    @property
    def name(self) -> str:
        """The metric's name (``'callable'`` for a callable)."""
        return self.metric if isinstance(self.metric, str) else "callable"

    @property
    def sqeuclidean(self) -> bool:
        """Whether the cost is ``||x - y||^2`` (the fast centred-expansion path)."""
        return self.metric == "sqeuclidean"

    @property
    def translation_invariant(self) -> bool:
        """Whether ``c(x + t, y + t) = c(x, y)`` is known (every named metric)."""
        return isinstance(self.metric, str)

    def __str__(self) -> str:
        if self.metric == "minkowski":
            return f"metric='minkowski', p={self.p:g}"
        return f"metric={self.name!r}"

    def transposed(self) -> Cost:
        """The cost ``c'(y, x) = c(x, y)`` (itself for a named metric, all symmetric)."""
        if isinstance(self.metric, str):
            return self
        metric = self.metric
        return Cost(lambda A, B: np.asarray(metric(B, A)).T, self.p)

    def block(self, A: np.ndarray, B: np.ndarray) -> np.ndarray:
        """The cost block ``c(a_i, b_j)``, shape ``(len(A), len(B))``, float64 (a new array)."""
        if self.sqeuclidean:
            return -neg_cost_over_reg(A, B, 1.0)
        if self.metric == "minkowski":
            return cdist(A, B, "minkowski", p=self.p)
        if isinstance(self.metric, str):
            return cdist(A, B, self.metric)
        out = np.array(self.metric(A, B), dtype=np.float64)
        if out.shape != (A.shape[0], B.shape[0]):
            raise ValueError(
                f"the metric callable must return the cost block of shape (len(A), len(B)) = "
                f"{(A.shape[0], B.shape[0])}; got shape {out.shape}"
            )
        check_cost_block(out)
        return out

    def norms(self, points: np.ndarray) -> np.ndarray:
        """``||x||`` in the metric's norm, for the triangle-inequality bound of
        :meth:`GibbsGeometry.max_cost` (named metrics only)."""
        order = {"sqeuclidean": 2.0, "euclidean": 2.0, "cityblock": 1.0}.get(self.metric, self.p)
        return np.linalg.norm(points, ord=order, axis=1)


#: The default cost.
SQEUCLIDEAN = Cost()


def check_cost_block(out: np.ndarray) -> None:
    """Refuse a user's cost block with NaN, infinite or negative entries, naming ``metric``
    (the kernel, the epsilon schedule and the certificates assume finite costs ``>= 0``)."""
    if out.size == 0 or (np.isfinite(out).all() and out.min() >= 0.0):
        return  # the common case: one pass over the block
    if np.isnan(out).any():
        raise ValueError(
            f"the metric callable returned NaN for {int(np.isnan(out).sum())} of the "
            f"{out.size} pairs of a cost block: metric must return finite costs >= 0"
        )
    if np.isinf(out).any():
        raise ValueError(
            f"the metric callable returned infinite costs for {int(np.isinf(out).sum())} of "
            f"the {out.size} pairs of a cost block (forbidden pairs are not supported): "
            "metric must return finite costs >= 0; give forbidden pairs a large finite cost "
            "instead (e.g. 1e3 times the largest allowed cost), or use POT with M"
        )
    raise ValueError(
        f"the metric callable returned negative costs (smallest {out.min():.6g}): metric must "
        "return costs >= 0; subtract the smallest cost c from it (the plan of M - c equals "
        "the plan of M; the value shifts by c times the mass)"
    )


def make_cost(metric: Any = "sqeuclidean", p: Any = 2.0) -> Cost:
    """Validate ``metric`` and ``p`` (POT's ``ot.dist`` names) into a :class:`Cost`."""
    if isinstance(metric, Cost):
        return metric
    if callable(metric):
        return Cost(metric, 2.0)
    if not isinstance(metric, str) or metric not in METRICS:
        raise ValueError(
            f"metric must be one of {', '.join(map(repr, METRICS))} or a callable "
            f"metric(A, B) -> cost block (len(A), len(B)); got {metric!r}"
        )
    try:
        p = float(p)
    except (TypeError, ValueError):
        raise TypeError(f"p must be a number >= 1; got {p!r}") from None
    if metric == "minkowski" and not (p >= 1 and np.isfinite(p)):
        raise ValueError(f"metric='minkowski' needs a finite p >= 1 (a norm); got p={p!r}")
    return Cost(metric, p if metric == "minkowski" else 2.0)


def block_rows(
    n_cols: int, itemsize: int = 8, target_bytes: int | None = None, *, dim: int | None = None
) -> int:
    """Rows per block so that ``rows * n_cols * itemsize`` is about ``target_bytes``: by
    default :data:`CPU_BLOCK_BYTES` for entries computed from points of ``dim`` at most
    :data:`CACHE_BLOCK_MAX_DIM` coordinates, :data:`BLOCK_BYTES` otherwise."""
    if target_bytes is None:
        small = dim is not None and dim <= CACHE_BLOCK_MAX_DIM
        target_bytes = CPU_BLOCK_BYTES if small else BLOCK_BYTES
    return max(1, target_bytes // max(1, n_cols * itemsize))


def row_slices(n_rows: int, rows_per_block: int) -> Iterator[slice]:
    """Consecutive slices covering ``range(n_rows)``."""
    for start in range(0, n_rows, rows_per_block):
        yield slice(start, min(start + rows_per_block, n_rows))


def sq_norms(points: np.ndarray) -> np.ndarray:
    """Squared Euclidean norm of each row."""
    return np.einsum("ij,ij->i", points, points)


def largest_cost(X: np.ndarray, Y: np.ndarray, cost: Cost) -> float:
    """``max_ij c(x_i, y_j)`` (0 for no pair), block by block: ``O(n m d)`` time,
    ``O(block x m)`` memory."""
    top = 0.0
    for rows in row_slices(X.shape[0], block_rows(Y.shape[0])):
        top = max(top, float(cost.block(X[rows], Y).max(initial=0.0)))
    return top


def neg_cost_over_reg(
    X: np.ndarray,
    Y: np.ndarray,
    reg: float,
    x_sq: np.ndarray | None = None,
    y_sq: np.ndarray | None = None,
    dtype: np.dtype = FLOAT64,
    cost: Cost | None = None,
) -> np.ndarray:
    """``-c(x_i, y_j) / reg`` for a block, shape ``(len(X), len(Y))``, in ``dtype``; the cost
    is ``||x_i - y_j||^2`` (from the norms) unless a non-default ``cost`` is given."""
    if cost is not None and not cost.sqeuclidean:
        out = cost.block(X, Y).astype(dtype, copy=False)
        out *= -1.0 / reg
        return out
    x_sq = sq_norms(X) if x_sq is None else x_sq
    y_sq = sq_norms(Y) if y_sq is None else y_sq
    out = (X @ Y.T).astype(dtype, copy=False)
    out *= -2.0
    out += x_sq[:, None].astype(dtype, copy=False)
    out += y_sq[None, :].astype(dtype, copy=False)
    np.maximum(out, 0.0, out=out)  # rounding can make tiny distances negative
    out *= -1.0 / reg
    return out


def gibbs_block(X: np.ndarray, Y: np.ndarray, reg: float, *args: Any, **kwargs: Any) -> np.ndarray:
    """``exp(-||x_i - y_j||^2 / reg)`` for a block of rows (never via ``exp(2 x.y / reg)``);
    the optional arguments are :func:`neg_cost_over_reg`'s."""
    out = neg_cost_over_reg(X, Y, reg, *args, **kwargs)
    np.exp(out, out=out)
    return out


def gibbs_matmat(
    X: np.ndarray, Y: np.ndarray, reg: float, V: np.ndarray, cost: Cost | None = None
) -> np.ndarray:
    """``K(X, Y) @ V`` streamed over row blocks of ``X``; ``V`` of shape (m,) or (m, k)."""
    out = np.empty((X.shape[0], *V.shape[1:]))
    y_sq = sq_norms(Y)
    for rows in row_slices(X.shape[0], block_rows(Y.shape[0], dim=X.shape[1])):
        out[rows] = gibbs_block(X[rows], Y, reg, y_sq=y_sq, cost=cost) @ V
    return out


def gibbs_softmax_average(
    X: np.ndarray,
    Y: np.ndarray,
    reg: float,
    log_weights: np.ndarray,
    values: np.ndarray,
    cost: Cost | None = None,
) -> np.ndarray:
    """``sum_j p_ij values_j`` with ``p_ij ~ exp(log_w_j - c(x_i, y_j) / reg)``.

    Computed with a per-row maximum shift, so it is finite for any ``reg`` (no underflow of
    the whole row). Columns with ``log_w_j = -inf`` get no weight.
    """
    out = np.empty((X.shape[0], *values.shape[1:]))
    y_sq = sq_norms(Y)
    for rows in row_slices(X.shape[0], block_rows(Y.shape[0], dim=X.shape[1])):
        logits = neg_cost_over_reg(X[rows], Y, reg, y_sq=y_sq, cost=cost)
        logits += log_weights[None, :]
        logits -= logits.max(axis=1, keepdims=True)
        np.exp(logits, out=logits)
        logits /= logits.sum(axis=1, keepdims=True)
        out[rows] = logits @ values
    return out


def gibbs_log_matvec(
    X: np.ndarray, Y: np.ndarray, reg: float, log_v: np.ndarray, cost: Cost | None = None
) -> np.ndarray:
    """``log sum_j exp(log_v_j - c(x_i, y_j) / reg)`` for each row ``x_i`` (log-sum-exp).

    Finite whenever some ``log_v_j`` is finite, for any ``reg``. Large products run on the
    pool's threads (:func:`sketchot._parallel.run_parts`; Ctrl-C stops them between blocks).
    """
    out = np.empty(X.shape[0])
    y_sq = sq_norms(Y)

    def rows_of(part: Part[slice]) -> None:
        for rows in part:
            logits = neg_cost_over_reg(X[rows], Y, reg, y_sq=y_sq, cost=cost)
            logits += log_v[None, :]
            top = logits.max(axis=1)
            logits -= top[:, None]
            np.exp(logits, out=logits)
            out[rows] = top + np.log(logits.sum(axis=1))

    # row blocks are independent (no sum across them): the pool changes no bit
    slices = list(row_slices(X.shape[0], block_rows(Y.shape[0], dim=X.shape[1])))
    run_parts(rows_of, slices, X.shape[0] * Y.shape[0] >= THREADED_LOG_ENTRIES)
    return out


def neg_cost_on_device(
    xp: Any, X: Any, x_sq: Any, Y: Any, y_sq: Any, reg: float, cost: Cost
) -> Any:
    """:func:`neg_cost_over_reg` for centred points and squared norms held by an Array API
    library ``xp`` on its device, float64: ``-(||x||^2 + ||y||^2 - 2 x.y) / reg`` clamped at
    0 before the division (its square root for the Euclidean cost)."""
    out = X @ Y.T  # in-place updates (the standard's operators) spare temporaries
    out *= -2.0
    out += x_sq[:, None]
    out += y_sq[None, :]
    out = xp.maximum(out, 0.0)  # rounding can make tiny distances negative
    if not cost.sqeuclidean:
        out = xp.sqrt(out)
    out *= -1.0 / reg
    return out


def logsumexp_on_device(xp: Any, logits: Any, axis: int) -> Any:
    """``log sum exp`` along ``axis`` with a maximum shift (``-inf`` for an all ``-inf``
    line), in the Array API namespace ``xp``; ``logits`` is overwritten."""
    top = xp.max(logits, axis=axis, keepdims=True)
    shift = xp.where(xp.isfinite(top), top, 0.0)
    logits -= shift
    total = xp.sum(xp.exp(logits), axis=axis)
    return xp.log(total) + xp.squeeze(shift, axis=axis)


def check_finite_norms(name: str, points: np.ndarray) -> None:
    """Refuse a cloud whose squared norms overflow float64 (values above ~1e154): every cost
    built from them would be inf or NaN, whatever ``reg``. ``O(n d)``."""
    with np.errstate(over="ignore", invalid="ignore"):
        finite = np.isfinite(sq_norms(points))
    if not np.all(finite):
        bad = int(np.count_nonzero(~finite))
        raise ValueError(
            f"{name} has {bad} point{'s' if bad > 1 else ''} whose squared norm overflows "
            f"float64 (largest |value| {np.abs(points).max():.3g}; squares must stay below "
            f"{np.finfo(np.float64).max:.3g}): rescale the points, e.g. divide X, Y by s and "
            "reg by s**2 (the same kernel)"
        )


def dual_lower_bound(
    Xc: np.ndarray,
    Yc: np.ndarray,
    f: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    cost: Cost | None = None,
) -> float:
    """A lower bound of the unregularised OT cost between ``(a, X)`` and ``(b, Y)`` (equal
    masses, cost ``c(x, y)``, ``||x - y||^2`` by default) from any finite source potential
    ``f``.

    With its c-transform ``g_j = min_i (C_ij - f_i)``, ``(f, g)`` is dual-feasible, so
    ``<f, a> + <g, b> <= OT(a, b)`` (weak duality). ``O(n m d)``, block by block.
    """
    active = a > 0
    Xa, fa = Xc[active], f[active]
    g = np.full(Yc.shape[0], np.inf)
    y_sq = sq_norms(Yc)
    for rows in row_slices(Xa.shape[0], block_rows(Yc.shape[0], dim=Xa.shape[1])):
        block = -neg_cost_over_reg(Xa[rows], Yc, 1.0, y_sq=y_sq, cost=cost)
        block -= fa[rows, None]
        np.minimum(g, block.min(axis=0), out=g)
    return float(fa @ a[active] + g @ b)


class GibbsGeometry:
    """Two point clouds, ``reg`` and the cost: everything needed to evaluate the TRUE Gibbs
    kernel ``K_ij = exp(-c(x_i, y_j) / reg)``.

    Every kernel operator carries one (its ``geometry``); the solver uses it for the exact
    values it needs (repairs, the true-kernel check, plans in the log domain, ``<P, M>``)
    without knowing how the operator represents ``K``.

    Parameters
    ----------
    X : ndarray, shape (n, d)
    Y : ndarray, shape (m, d)
    reg : float
    metric : str or callable, default='sqeuclidean'
        The cost ``c`` (:class:`Cost`, POT's ``ot.dist`` names).
    p : float, default=2
        The order of ``metric='minkowski'``.
    context : ArrayContext, default=NUMPY
        Where the caller's points live (:mod:`sketchot._arrays`: the library, device and
        whether the kernels run there), passed explicitly by the public entries; geometries
        derived from this one (:meth:`at_reg`, :meth:`sample`) keep it.

    Attributes
    ----------
    cost : Cost
    center : ndarray, shape (d,)
        Mean of all points (zero for a callable metric, which may not be translation
        invariant). The kernel of a named metric is translation invariant; centred
        coordinates keep ``||x||^2 + ||y||^2 - 2 x.y`` accurate.
    Xc, Yc : ndarray
        Centred clouds.
    context : ArrayContext
        The library and device of the caller's points (:mod:`sketchot._arrays`; NumPy unless
        the call passed e.g. PyTorch tensors): where the kernel runs its products.
    x_sq, y_sq : ndarray
        Squared norms of the centred points.
    """

    def __init__(
        self,
        X: np.ndarray,
        Y: np.ndarray,
        reg: float,
        metric: Any = "sqeuclidean",
        p: Any = 2.0,
        *,
        context: ArrayContext = NUMPY,
    ) -> None:
        self.X = X
        self.Y = Y
        self.reg = float(reg)
        # where the caller's points live: kernels that can run there do (kernels.device)
        self.context = context
        self.cost = make_cost(metric, p)
        if self.cost.translation_invariant:
            self.center = (X.sum(axis=0) + Y.sum(axis=0)) / (X.shape[0] + Y.shape[0])
        else:
            self.center = np.zeros(X.shape[1])
        self.Xc = X - self.center
        self.Yc = Y - self.center
        check_finite_norms("X", X)
        check_finite_norms("Y", Y)
        self._max_cost: float | None = None
        with np.errstate(over="ignore", invalid="ignore"):
            self.x_sq = sq_norms(self.Xc)
            self.y_sq = sq_norms(self.Yc)
            if not self.cost.translation_invariant:
                return  # a callable's largest cost is computed when first asked for
            cost = self.max_cost()
        if not np.isfinite(cost):  # each cloud squares finely, but not their distances
            power = "s**2" if self.cost.sqeuclidean else "s"  # the named costs' homogeneity
            raise ValueError(
                f"the costs ({self.cost}) between X and Y overflow float64 (largest |value| "
                f"{max(np.abs(X).max(), np.abs(Y).max()):.3g}): rescale the points, e.g. "
                f"divide X, Y by s and reg by {power} (the same kernel)"
            )
        with np.errstate(over="ignore", divide="ignore"):
            scale = cost / self.reg
            inverse = 1.0 / self.reg
        if not (np.isfinite(scale) and np.isfinite(inverse)):
            raise ValueError(
                f"reg={self.reg:g} is too small for these points: max cost / reg = {scale:g} "
                "is not a finite float64 (reg must be a normal positive number well above "
                "1e-300 times the largest cost)"
            )

    @property
    def metric(self) -> Any:
        """The metric as given (a name or the callable)."""
        return self.cost.metric

    def at_reg(self, reg: float) -> GibbsGeometry:
        """The same clouds and cost at another ``reg``."""
        return GibbsGeometry(self.X, self.Y, reg, self.cost, context=self.context)

    def sample(self, size: int, generator: np.random.Generator) -> GibbsGeometry:
        """The same cost and ``reg`` on at most ``size`` points of each cloud, drawn uniformly
        without replacement (a cheap stand-in for questions about the kernel's shape)."""
        n, m = self.shape
        rows = np.sort(generator.choice(n, size=min(size, n), replace=False))
        cols = np.sort(generator.choice(m, size=min(size, m), replace=False))
        return GibbsGeometry(self.X[rows], self.Y[cols], self.reg, self.cost, context=self.context)

    @property
    def shape(self) -> tuple[int, int]:
        """``(n, m)``."""
        return (self.X.shape[0], self.Y.shape[0])

    def rows(self, side: str, index: Any) -> np.ndarray:
        """Centred rows ``Xc[index]`` (``side='x'``) or ``Yc[index]`` (``'y'``)."""
        return (self.Xc if side == "x" else self.Yc)[index]

    def union_rows(self, index: Any = None) -> np.ndarray:
        """Rows of ``vstack([Xc, Yc])``, all of them when ``index`` is None."""
        union = np.vstack([self.Xc, self.Yc])
        return union if index is None else union[index]

    def fit_clouds(self, generator: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """The clouds a data-dependent sketch is fitted on: all of ``X`` and ``Y`` in memory
        (a chunked geometry returns a sample drawn with ``generator``)."""
        del generator
        return self.X, self.Y

    def _sides(self, transpose: bool) -> tuple[np.ndarray, np.ndarray, Cost]:
        if transpose:
            return self.Yc, self.Xc, self.cost.transposed()
        return self.Xc, self.Yc, self.cost

    def max_cost(self) -> float:
        """Upper bound on ``max_ij c(x_i, y_j)``: for a named metric from the centred norms by
        the triangle inequality (``O((n + m) d)``); for a callable the exact maximum, computed
        block by block once (``O(n m d)``) and kept."""
        if self.cost.sqeuclidean:
            return float((np.sqrt(self.x_sq.max()) + np.sqrt(self.y_sq.max())) ** 2)
        if self.cost.translation_invariant:
            return float(self.cost.norms(self.Xc).max() + self.cost.norms(self.Yc).max())
        if self._max_cost is None:
            self._max_cost = largest_cost(self.Xc, self.Yc, self.cost)
        return self._max_cost

    def matmat(self, index: Any, V: np.ndarray, *, transpose: bool = False) -> np.ndarray:
        """``K[index, :] @ V`` (or ``K[:, index].T @ V``), ``O(len(index) m d)``."""
        own, other, cost = self._sides(transpose)
        if self.computes_on_device(cost):
            return self._device_rows(own[index], other, cost, V, "matmat")
        return gibbs_matmat(own[index], other, self.reg, V, cost)

    def log_matvec(self, index: Any, log_v: np.ndarray, *, transpose: bool = False) -> np.ndarray:
        """``log (K[index, :] @ exp(log_v))`` (or the transposed form), stable for any reg."""
        own, other, cost = self._sides(transpose)
        if self.computes_on_device(cost):
            return self._device_rows(own[index], other, cost, log_v, "log_matvec")
        return gibbs_log_matvec(own[index], other, self.reg, log_v, cost)

    def computes_on_device(self, cost: Cost | None = None) -> bool:
        """Whether the kernel's values are computed where the caller's points live: the
        context's :attr:`~sketchot._arrays.ArrayContext.device_kernels` (CUDA tensors, CuPy,
        JAX; other host arrays only with :data:`sketchot._arrays.HOST_ARRAYS_ON_DEVICE`),
        and a cost the device blocks compute (squared Euclidean or Euclidean; ``cost``
        defaults to the geometry's)."""
        cost = self.cost if cost is None else cost
        named = cost.name in ("sqeuclidean", "euclidean")
        return not self.context.is_numpy and self.context.device_kernels and named

    def _device_rows(
        self, own: np.ndarray, other: np.ndarray, cost: Cost, values: np.ndarray, what: str
    ) -> np.ndarray:
        """Row blocks of ``K(own, other)`` on the caller's device: ``K @ values``
        (``'matmat'``), ``log K @ exp(values)`` (``'log_matvec'``) or the softmax average
        ``sum_j softmax_j(w_j - c_j / reg) values_j`` with ``values = (log_w, V)``
        (``'softmax'``); NumPy float64 out."""
        on = DeviceArrays(self.context)
        xp = on.xp
        A, B = on.put(own), on.put(other)
        a_sq, b_sq = xp.sum(A * A, axis=1), xp.sum(B * B, axis=1)
        if what == "softmax":
            log_w, V = on.put(values[0]), on.put(values[1])
        else:
            V = on.put(values)
        out = []
        step = block_rows(other.shape[0])
        for start in range(0, own.shape[0], step):
            rows = slice(start, min(start + step, own.shape[0]))  # the standard's bounds
            logits = neg_cost_on_device(xp, A[rows, ...], a_sq[rows], B, b_sq, self.reg, cost)
            if what == "matmat":
                out.append(on.get(xp.exp(logits) @ V))
                continue
            if what == "log_matvec":
                logits += V[None, :]
                out.append(on.get(logsumexp_on_device(xp, logits, axis=1)))
                continue
            logits += log_w[None, :]
            logits -= xp.max(logits, axis=1, keepdims=True)
            weights = xp.exp(logits)
            weights /= xp.sum(weights, axis=1, keepdims=True)
            out.append(on.get(weights @ V))
        if not out:
            return np.zeros((0, *np.shape(values if what != "softmax" else values[1])[1:]))
        return np.concatenate(out, axis=0)

    def block(self, index: Any) -> np.ndarray:
        """True rows ``K[index, :]``."""
        return gibbs_block(self.Xc[index], self.Yc, self.reg, cost=self.cost)

    def log_block(self, rows: Any, dtype: np.dtype = FLOAT64) -> np.ndarray:
        """``-M[rows, :] / reg`` in ``dtype`` (float64 by default)."""
        return neg_cost_over_reg(
            self.Xc[rows], self.Yc, self.reg, self.x_sq[rows], self.y_sq, dtype, self.cost
        )

    def cost_block(self, rows: Any) -> np.ndarray:
        """The cost rows ``M[rows, :]`` in float64."""
        return self.cost.block(self.Xc[rows], self.Yc)

    def softmax_average(
        self,
        points: np.ndarray | None,
        log_weights: np.ndarray,
        values: np.ndarray,
        *,
        transpose: bool = False,
    ) -> np.ndarray:
        """``sum_j softmax_j(log_w_j - c(p, y_j) / reg) values_j`` for each point ``p``.

        ``points=None`` uses the fitted source points (target points when ``transpose``);
        otherwise ``points`` are in the original (uncentred) coordinates.
        """
        own, other, cost = self._sides(transpose)
        centred = own if points is None else points - self.center
        if self.computes_on_device(cost):
            return self._device_rows(centred, other, cost, (log_weights, values), "softmax")
        return gibbs_softmax_average(centred, other, self.reg, log_weights, values, cost)
