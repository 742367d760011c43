"""Plans ``P = diag(u) K diag(v)`` from scalings, without their ``n x m`` array.

Marginals, costs, plan products, barycentric maps and the true-kernel check. They reach the
kernel through its products and the TRUE kernel through its geometry
(:class:`~sketchot.gibbs.GibbsGeometry`), so they work for every backend. For an operator that
declares the ``'exact'`` capability, scalings outside float64's range (log-domain results can
have ``u = inf`` where ``K = 0``) are handled in log form, entry by entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._defaults import DEFAULT_MAX_DENSE_BYTES
from .._parallel import Part, reduce_parts
from ..cost_matrix import block_dim, has_points
from ..gibbs import block_rows, row_slices, sq_norms
from ..kernels import KernelOperator
from ..kernels.base import MIN_DENOMINATOR_RATIO, THREADED_PASS_MIN_ENTRIES, check_operand
from ..kernels.device import runs_on_device
from .penalties import BALANCED, Penalty

# exp() of a sum of log-scalings above this would overflow float64 (with margin).
SAFE_LOG = 650.0


@dataclass(frozen=True)
class PlanSummary:
    """Marginals, cost ``<P, M>`` and mass ``1^T P 1`` of a plan, and its first moments.

    ``row_moments = P Yc`` (shape (n, d)) and ``col_moments = P^T Xc`` (shape (m, d)) in the
    geometry's centred coordinates, where the summary's products give them at no extra pass
    (``None`` otherwise): the barycentric maps of the fitted points are
    ``row_moments / row_marginal`` and the divergence's position gradients
    ``2 (row_marginal Xc - row_moments)`` follow without another product.
    """

    row_marginal: np.ndarray
    col_marginal: np.ndarray
    cost: float
    mass: float
    row_moments: np.ndarray | None = None
    col_moments: np.ndarray | None = None


def _log_form(kernel: KernelOperator, log_u: np.ndarray, log_v: np.ndarray) -> bool:
    """Whether the plan must be evaluated entry by entry in log form (scalings beyond the
    range of the kernel's storage precision: products run in it)."""
    if "exact" not in kernel.info.capabilities:
        return False
    # float32 products overflow above e^88: keep the same margin below it as SAFE_LOG has
    safe = min(SAFE_LOG, float(np.log(np.finfo(kernel.dtype).max)) - 59.0)
    with np.errstate(invalid="ignore"):  # inf + -inf of a broken run: not finite, log form
        top_u, top_v = log_u.max(), log_v.max()
        # each scaling finite, and their products too (u = inf times K v = 0 is NaN)
        return not (max(top_u, top_v, top_u + top_v) < safe and log_u.min() > -safe)


def _log_kernel(kernel: KernelOperator, log_u: np.ndarray, log_v: np.ndarray) -> bool:
    """Whether plan products go through the operator's log-domain products."""
    return "log_products" in kernel.info.capabilities and "exact" not in kernel.info.capabilities


def _log_plan_product(
    kernel: KernelOperator, log_u: np.ndarray, log_v: np.ndarray, V: np.ndarray, transpose: bool
) -> np.ndarray:
    """``P V`` (or ``P^T V``) for ``V`` of any sign, through log-domain kernel products: the
    positive and negative parts of each column separately, so no scaling is ever formed."""
    left, right = (log_v, log_u) if transpose else (log_u, log_v)
    n_left = left.size
    if transpose:

        def log_product(log_w):
            return kernel.project("rows", log_w, log=True)
    else:

        def log_product(log_w):
            # the products of a log pass; its projection is not needed here
            return kernel.fused_pass("rows", log_w, np.zeros(n_left), log=True).products

    columns = V.reshape(V.shape[0], -1)
    out = np.zeros((left.size, columns.shape[1]))
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        for k, column in enumerate(columns.T):
            for sign in (1.0, -1.0):
                part = np.maximum(sign * column, 0.0)
                if part.any():
                    out[:, k] += sign * np.exp(left + log_product(right + np.log(part)))
    return out[:, 0] if V.ndim == 1 else out


def _log_blocks(kernel: KernelOperator, log_u: np.ndarray, log_v: np.ndarray):
    """Row blocks ``(rows, log P[rows, :], -M[rows, :] / reg)`` of the exact plan."""
    g = kernel.geometry
    step = block_rows(g.shape[1], dim=block_dim(g))
    for rows in row_slices(g.shape[0], step):
        neg_cost = g.log_block(rows)
        yield rows, neg_cost + log_u[rows, None] + log_v[None, :], neg_cost


def _blockwise_cost(kernel: KernelOperator, log_u: np.ndarray, log_v: np.ndarray) -> float:
    """``<P, M> = sum_i u_i sum_j K~_ij v_j M_ij`` for any cost, over row blocks of the
    operator's own entries (``K~[rows, :]`` from its factors) and of the geometry's cost:
    ``O(n m (r + d))`` time for a rank-``r`` operator, ``O(block x m)`` memory."""
    g = kernel.geometry
    step = block_rows(g.shape[1], dim=block_dim(g))
    total = 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        u, v = np.exp(log_u), np.exp(log_v)
        for rows in row_slices(g.shape[0], step):
            block = kernel.to_dense(rows=rows) * g.cost_block(rows)
            total += float(u[rows] @ (block @ v))
    return total


def _stored_scalings(absorbed: Any, log_u: np.ndarray, log_v: np.ndarray):
    """``(u~, v~)`` with ``P = diag(u~) K~ diag(v~)`` when the iteration ended on a stored
    float64 absorbed kernel ``K~ = diag(e^alpha) K diag(e^beta)`` (its entries are already
    computed: its products are plain BLAS passes), ``None`` otherwise."""
    stored = getattr(absorbed, "is_dense", False) and not runs_on_device(absorbed.geometry)
    if not stored or absorbed.dtype != np.float64:
        return None
    scalings = []
    for log_s, offset in ((log_u, absorbed.alpha), (log_v, absorbed.beta)):
        active = np.isfinite(log_s)
        with np.errstate(invalid="ignore"):
            shift = np.where(active, log_s - offset, 0.0)
        # the absorbed form keeps the scalings near 1; far from it, the log form is safer
        if not np.all(np.isfinite(shift)) or np.abs(shift).max(initial=0.0) > SAFE_LOG / 2:
            return None
        scalings.append(np.where(active, np.exp(shift), 0.0))
    return scalings[0], scalings[1]


def _log_form_summary(kernel: KernelOperator, log_u: np.ndarray, log_v: np.ndarray):
    """The summary entry by entry in log form, over row blocks on the pool's threads: ``O(n m
    d)`` time, one block's memory per thread; the column sums add in a fixed group order (the
    same bits with any number of threads)."""
    g = kernel.geometry
    n, m = g.shape
    if hasattr(g, "plan_entries"):  # a sparse cost matrix: its stored entries, O(nnz)
        rows_of, cols_of, plan = g.plan_entries(log_u, log_v)
        row = np.bincount(rows_of, weights=plan, minlength=n)
        col = np.bincount(cols_of, weights=plan, minlength=m)
        cost = float(plan @ (g.M.data - g.offset))  # <P, M - offset>, as the blocks below
        return PlanSummary(row, col, cost, float(row.sum()))
    # a cost matrix has no coordinates: no moments (barycentric maps need points)
    points = has_points(g)
    d = g.Xc.shape[1] if points else 0
    row = np.empty(n)
    row_moments = np.empty((n, d))
    step = block_rows(m, dim=block_dim(g))

    def run(part: Part[slice]):
        col = np.zeros(m)
        col_moments = np.zeros((m, d))
        cost = 0.0
        for rows in part:
            neg_cost = g.log_block(rows)
            plan = neg_cost + log_u[rows, None]
            plan += log_v[None, :]
            np.exp(plan, out=plan)
            row[rows] = plan.sum(axis=1)
            if points:
                row_moments[rows] = plan @ g.Yc
            col += plan.sum(axis=0)
            if points:
                col_moments += plan.T @ g.Xc[rows]
            cost -= g.reg * float(np.einsum("ij,ij->", plan, neg_cost))
        return col, col_moments, cost

    def add(total, more):
        return total[0] + more[0], total[1] + more[1], total[2] + more[2]

    slices = list(row_slices(n, step))
    col, col_moments, cost = reduce_parts(run, slices, n * m >= THREADED_PASS_MIN_ENTRIES, add)
    if not points:
        return PlanSummary(row, col, cost, float(row.sum()))
    return PlanSummary(row, col, cost, float(row.sum()), row_moments, col_moments)


def plan_summary(
    kernel: KernelOperator,
    log_u: np.ndarray,
    log_v: np.ndarray,
    *,
    absorbed: Any = None,
    log_products: tuple[np.ndarray, np.ndarray] | None = None,
    symmetric: bool = False,
    absorbed_products: tuple[np.ndarray, np.ndarray] | None = None,
    column_moments: bool = True,
) -> PlanSummary:
    """Marginals, ``<P, M>``, mass and first moments of ``P = diag(u) K diag(v)``.

    For the squared-Euclidean cost, ``||x - y||^2 = ||x||^2 + ||y||^2 - 2 x.y`` in centred
    coordinates: ``K`` through one ``matmat`` and one ``rmatmat`` with ``d + 1`` columns,
    ``O((n + m) r d)`` for a rank-``r`` operator. Any other cost is summed block by block
    from the cost's rows: entry by entry in log form for an exact kernel
    (``O(n m d)``), from the operator's rows otherwise (:func:`_blockwise_cost`,
    ``O(n m (r + d))``). Never an ``n x m`` array beyond one the iteration stored.

    Parameters
    ----------
    kernel : KernelOperator
        The operator the scalings were computed with (its cost and ``reg``).
    log_u, log_v : ndarray, shapes (n,) and (m,)
        Log-scalings.
    absorbed : KernelOperator, optional
        The absorbed kernel the iteration ended on (:attr:`Iterate.absorbed`, with its
        offsets ``alpha``, ``beta``): when it is stored in float64, the summary is two BLAS
        products with it instead of a recomputation of every entry.
    log_products : tuple of ndarray, optional
        ``(log(K v), log(K^T u))`` for these scalings, as the iteration's last passes left
        them (:attr:`~sketchot.solver.engine.Iterate.log_products`): the marginals of a
        log-domain operator then take no product.
    symmetric : bool
        ``u = v`` on a symmetric ``K`` (the symmetric iteration): ``P = P^T``, so the column
        side is the row side's mirror and takes no product.
    absorbed_products : tuple of ndarray, optional
        ``(K~ v~, K~^T u~)`` on ``absorbed`` for these scalings
        (:attr:`~sketchot.solver.drivers.Iterate.absorbed_products`).
    column_moments : bool, default=True
        ``False``: with a stored ``absorbed`` and ``absorbed_products``, the column sums are
        ``v~ K~^T u~`` and ``P^T Xc`` is left out (``None``): one product with the stored
        kernel instead of two, for callers that read only the row side's moments.

    Returns
    -------
    PlanSummary
        Row and column sums of ``P``, ``<P, M>``, the mass ``1^T P 1`` and, where the
        products give them, the moments ``P Yc`` and ``P^T Xc``.
    """
    g = kernel.geometry
    sqeuclidean = g.cost.sqeuclidean
    stored = _stored_scalings(absorbed, log_u, log_v) if sqeuclidean else None
    if stored is not None:
        u, v = stored
        rows_p = absorbed.matmat(np.column_stack([v, v[:, None] * g.Yc]))
        if symmetric:
            row, P_y = u * rows_p[:, 0], u[:, None] * rows_p[:, 1:]
            return _from_products(g, row, P_y, row, P_y)
        if not column_moments and absorbed_products is not None:
            return _from_products(
                g, u * rows_p[:, 0], u[:, None] * rows_p[:, 1:], v * absorbed_products[1], None
            )
        cols_p = absorbed.rmatmat(np.column_stack([u, u[:, None] * g.Xc]))
        return _from_products(
            g, u * rows_p[:, 0], u[:, None] * rows_p[:, 1:], v * cols_p[:, 0],
            v[:, None] * cols_p[:, 1:],
        )  # fmt: skip
    if sqeuclidean and _log_form(kernel, log_u, log_v) and _exact_means(kernel):
        return _log_means_summary(kernel, log_u, log_v, symmetric)
    if _log_form(kernel, log_u, log_v) or (not sqeuclidean and "exact" in kernel.info.capabilities):
        return _log_form_summary(kernel, log_u, log_v)
    if _log_kernel(kernel, log_u, log_v):
        # one log product per column: the marginals (none when the iteration's last passes
        # gave them), then P Yc for the squared-Euclidean cost (P^T Xc, d more products,
        # when asked for: first_moments)
        if log_products is not None:
            with np.errstate(over="ignore", invalid="ignore"):
                row, col = np.exp(log_u + log_products[0]), np.exp(log_v + log_products[1])
        else:
            row = _log_plan_product(kernel, log_u, log_v, np.ones(g.shape[1]), transpose=False)
            col = row if symmetric else _log_plan_product(
                kernel, log_u, log_v, np.ones(g.shape[0]), transpose=True
            )  # fmt: skip
        P_y = first_moments(kernel, log_u, log_v, row) if sqeuclidean else None
        Pt_x = P_y if symmetric else None
    else:
        # the squared-Euclidean cost from K Y: the coordinates as extra columns
        # (any other cost: no coordinate columns, so a cost matrix needs no points here)
        if sqeuclidean:
            Yc, Xc = g.Yc, g.Xc
        else:
            Yc, Xc = np.zeros((g.shape[1], 0)), np.zeros((g.shape[0], 0))
        with np.errstate(over="ignore", invalid="ignore"):
            u, v = np.exp(log_u), np.exp(log_v)
            products = kernel.matmat(np.column_stack([v, v[:, None] * Yc]))
            rproducts = (
                products if symmetric else kernel.rmatmat(np.column_stack([u, u[:, None] * Xc]))
            )
            row = u * products[:, 0]
            col = v * rproducts[:, 0]
            P_y = u[:, None] * products[:, 1:]
            Pt_x = v[:, None] * rproducts[:, 1:]
    if not sqeuclidean:
        return PlanSummary(row, col, _blockwise_cost(kernel, log_u, log_v), float(row.sum()))
    return _from_products(g, row, P_y, col, Pt_x)


def _exact_means(kernel: KernelOperator) -> bool:
    """Whether an exact operator gives a log-domain plan's moments through its own
    ``'log_means'`` passes (on the caller's device) instead of the host's entry-by-entry
    blocks."""
    return {"exact", "log_means"} <= kernel.info.capabilities


def _log_means_summary(
    kernel: KernelOperator, log_u: np.ndarray, log_v: np.ndarray, symmetric: bool
) -> PlanSummary:
    """The summary of a squared-Euclidean plan in log form from the operator's
    ``log_means`` passes: ``P 1 = u * K v`` and ``P Yc = diag(P 1)`` times the means, each
    side one pass over the entries where the operator computes them (``O(n m d)`` there,
    ``O((n + m) d)`` numbers here); the cost from the moments (:func:`_from_products`)."""
    with np.errstate(over="ignore", invalid="ignore"):
        log_rows, row_means = kernel.log_means("rows", log_v)
        row = np.exp(log_u + log_rows)
        P_y = row[:, None] * row_means
        if symmetric:
            return _from_products(kernel.geometry, row, P_y, row, P_y)
        log_cols, col_means = kernel.log_means("cols", log_u)
        col = np.exp(log_v + log_cols)
        return _from_products(kernel.geometry, row, P_y, col, col[:, None] * col_means)


def _from_products(g, row, P_y, col, Pt_x) -> PlanSummary:
    """The summary of a squared-Euclidean plan from its marginals and moments."""
    with np.errstate(over="ignore", invalid="ignore"):
        cross = float(np.einsum("ij,ij->", g.Xc, P_y))
        cost = row @ sq_norms(g.Xc) + col @ sq_norms(g.Yc) - 2.0 * cross
    return PlanSummary(row, col, float(cost), float(row.sum()), P_y, Pt_x)


def first_moments(
    kernel: KernelOperator,
    log_u: np.ndarray,
    log_v: np.ndarray,
    marginal: np.ndarray,
    *,
    transpose: bool = False,
) -> np.ndarray:
    """``P Yc`` (or ``P^T Xc`` when ``transpose``) in the geometry's centred coordinates.

    ``marginal`` is the plan's row (column) sums. An operator with ``'log_means'`` gives the
    means of the coordinates under ``K diag(v)`` in one product's work (``P Yc`` is
    ``diag(P 1)`` times them); through other log-domain products the coordinates are shifted
    to be positive so that each takes one log product (``d`` in all, instead of one per
    sign): ``P (Yc - s) + (P 1) s``; through the plan's products (:class:`LazyPlan`)
    otherwise.
    """
    g = kernel.geometry
    coords = g.Xc if transpose else g.Yc
    has_means = "log_means" in kernel.info.capabilities
    if has_means and (_log_kernel(kernel, log_u, log_v) or _log_form(kernel, log_u, log_v)):
        # P Yc = diag(P 1) (the means of Yc under K diag(v)): one product's work
        _, means = kernel.log_means("cols" if transpose else "rows", log_u if transpose else log_v)
        return marginal[:, None] * means
    if _log_kernel(kernel, log_u, log_v):
        shift = coords.min(axis=0, initial=np.inf) - 1.0
        shifted = _log_plan_product(kernel, log_u, log_v, coords - shift, transpose)
        return shifted + marginal[:, None] * shift
    plan = LazyPlan(kernel, log_u, log_v)
    return plan.rmatmat(coords) if transpose else plan.matmat(coords)


class LazyPlan:
    """The plan ``P = diag(u) K diag(v)`` without its ``n x m`` array.

    Products cost one kernel product each; rows are computed on demand; :meth:`to_dense` is
    for small problems only.
    """

    def __init__(self, kernel: KernelOperator, log_u: np.ndarray, log_v: np.ndarray) -> None:
        self.kernel = kernel
        self._log_u = log_u
        self._log_v = log_v

    @property
    def shape(self) -> tuple[int, int]:
        return self.kernel.shape

    def _product(self, values: Any, name: str, *, transpose: bool, vector: bool) -> np.ndarray:
        n, m = self.shape
        values = check_operand(values, n if transpose else m, name, vector=vector)
        log_left, log_right = (
            (self._log_v, self._log_u)
            if transpose
            else (
                self._log_u,
                self._log_v,
            )
        )
        log_form = _log_form(self.kernel, self._log_u, self._log_v)
        if log_form and not runs_on_device(self.kernel.geometry):
            out = np.zeros((m if transpose else n, *values.shape[1:]))
            for rows, log_plan, _ in _log_blocks(self.kernel, self._log_u, self._log_v):
                plan = np.exp(log_plan)
                if transpose:
                    out += plan.T @ values[rows]
                else:
                    out[rows] = plan @ values
            return out
        if log_form or _log_kernel(self.kernel, self._log_u, self._log_v):
            # on a device, the exact kernel's own log passes: no block comes to the host
            return _log_plan_product(self.kernel, self._log_u, self._log_v, values, transpose)
        with np.errstate(over="ignore", invalid="ignore"):
            right = np.exp(log_right)
            scaled = right * values if values.ndim == 1 else right[:, None] * values
            out = self.kernel.rmatmat(scaled) if transpose else self.kernel.matmat(scaled)
            left = np.exp(log_left)
            return left * out if out.ndim == 1 else left[:, None] * out

    def matvec(self, x: Any) -> np.ndarray:
        """``P x``."""
        return self._product(x, "x", transpose=False, vector=True)

    def rmatvec(self, y: Any) -> np.ndarray:
        """``P^T y``."""
        return self._product(y, "y", transpose=True, vector=True)

    def matmat(self, X: Any) -> np.ndarray:
        """``P X`` for ``X`` of shape (m, k)."""
        return self._product(X, "X", transpose=False, vector=False)

    def rmatmat(self, Y: Any) -> np.ndarray:
        """``P^T Y`` for ``Y`` of shape (n, k)."""
        return self._product(Y, "Y", transpose=True, vector=False)

    def rows(self, index: Any) -> np.ndarray:
        """Dense rows ``P[index, :]``."""
        index = np.arange(self.shape[0])[index]
        if "exact" in self.kernel.info.capabilities:
            neg_cost = self.kernel.geometry.log_block(index)
            return np.exp(neg_cost + self._log_u[index, None] + self._log_v[None, :])
        rows = self.kernel.to_dense(rows=index)
        return np.exp(self._log_u[index])[:, None] * rows * np.exp(self._log_v)[None, :]

    def to_dense(self, max_bytes: int = DEFAULT_MAX_DENSE_BYTES) -> np.ndarray:
        """The whole plan (refuses above ``max_bytes``)."""
        n, m = self.shape
        if n * m * 8 > max_bytes:
            raise MemoryError(
                f"the dense plan would take {n * m * 8 / 2**20:.0f} MiB > max_bytes={max_bytes}; "
                "use matvec, matmat or rows instead"
            )
        return self.rows(np.arange(n))


def barycentric(
    kernel: KernelOperator,
    points: np.ndarray | None,
    log_w: np.ndarray,
    values: np.ndarray,
    *,
    transpose: bool = False,
) -> tuple[np.ndarray, int]:
    """``T(p) = sum_j K(p, y_j) w_j values_j / sum_j K(p, y_j) w_j`` (or the transposed form).

    ``points=None`` maps the fitted points. Exact kernels use a log-stable softmax. For an
    approximation, rows whose denominator is not positive (a signed kernel can do that) are
    recomputed with the true kernel; returns the map and the number of such rows.
    """
    g = kernel.geometry
    if "exact" in kernel.info.capabilities:
        return g.softmax_average(points, log_w, values, transpose=transpose), 0
    if points is None and "log_products" in kernel.info.capabilities:
        # the fitted points: the plan's own barycentric projection, in log form
        n, m = kernel.shape
        zeros_left = np.zeros(m if transpose else n)
        stacked = np.column_stack([values, np.ones(values.shape[0])])
        if transpose:
            products = _log_plan_product(kernel, log_w, zeros_left, stacked, transpose=True)
        else:
            products = _log_plan_product(kernel, zeros_left, log_w, stacked, transpose=False)
        return products[:, :-1] / products[:, -1:], 0
    # Scalings enter only through ratios: shift them so the largest weight is 1.
    finite = np.isfinite(log_w)
    weights = np.exp(log_w - log_w[finite].max())
    stacked = np.column_stack([weights[:, None] * values, weights])
    if points is None:
        products = kernel.rmatmat(stacked) if transpose else kernel.matmat(stacked)
    else:
        products = kernel.apply_new(points, stacked, side="target" if transpose else "source")
    numerator, denominator = products[:, :-1], products[:, -1]
    scale = np.abs(denominator).max() if denominator.size else 0.0
    bad = ~(denominator > MIN_DENOMINATOR_RATIO * scale) | ~np.all(np.isfinite(numerator), axis=1)
    out = np.empty_like(numerator)
    good = ~bad
    out[good] = numerator[good] / denominator[good, None]
    if bad.any():
        if points is None:
            own = g.Y if transpose else g.X
            points_bad = own[bad]
        else:
            points_bad = points[bad]
        out[bad] = g.softmax_average(points_bad, log_w, values, transpose=transpose)
    return out, int(bad.sum())


@dataclass(frozen=True)
class TrueKernelCheck:
    """L1 marginal errors of the scalings against the EXACT kernel, from sampled rows/columns.

    ``error_a`` estimates ``||u * (K v) - a||_1`` with the true ``K`` from ``n_rows`` rows drawn
    uniformly without replacement (scaled by ``n / n_rows``), ``error_b`` likewise for
    ``||v * (K^T u) - b||_1``; ``relative_*`` divide by the total mass. ``bound_a`` and
    ``bound_b`` are upper confidence bounds on the relative errors: the estimate plus two
    standard errors of the sample mean (with the finite-population correction), about 97.5%
    one-sided for sums of many rows; they equal the estimates when ``exhaustive`` (every row
    and column used: the values are then exact).
    """

    error_a: float
    error_b: float
    relative_a: float
    relative_b: float
    n_rows: int
    n_cols: int
    exhaustive: bool
    bound_a: float = float("nan")
    bound_b: float = float("nan")

    @property
    def relative(self) -> float:
        """``max(relative_a, relative_b)``."""
        return max(self.relative_a, self.relative_b)

    @property
    def bound(self) -> float:
        """``max(bound_a, bound_b)``: what the accuracy contract is checked against."""
        return max(self.bound_a, self.bound_b)

    def __str__(self) -> str:
        kind = "exact" if self.exhaustive else f"sampled {self.n_rows} rows / {self.n_cols} cols"
        return (
            f"true-kernel L1 marginal errors ({kind}): a {self.error_a:.3e} "
            f"(relative {self.relative_a:.2e}), b {self.error_b:.3e} "
            f"(relative {self.relative_b:.2e}); upper bound {self.bound:.2e}"
        )


def _sampled_l1(errors: np.ndarray, size: int, mass: float) -> tuple[float, float]:
    """``(estimated L1 error, upper bound of the relative error)`` from sampled entries."""
    k = errors.size
    estimate = float(errors.sum() * size / k)
    if k >= size:
        return estimate, estimate / mass
    spread = float(errors.std(ddof=1)) if k > 1 else float(errors.max())
    correction = np.sqrt(max(0.0, 1.0 - k / size))
    return estimate, (estimate + 2.0 * size * spread * correction / np.sqrt(k)) / mass


def value_error_estimate(
    f: np.ndarray, g: np.ndarray, error_a: Any, error_b: Any, balanced: bool = True
) -> np.ndarray:
    """First-order gap between the primal and dual values of a plan: ``e_a max|f - s| +
    e_b max|g + s|`` over each row of ``f`` and ``g`` (the dual potentials, NaN where the
    weight is 0), with ``e`` the absolute L1 marginal errors of the plan and ``s`` the
    midpoint of ``f`` (balanced potentials are defined up to ``(f + s, g - s)``; 0
    unbalanced). An estimate of the error of the plan's value, not a bound.

    Parameters
    ----------
    f, g : ndarray, shape (B, n), (B, m)
        Potentials of ``B`` problems (one row each).
    error_a, error_b : float or ndarray of shape (B,)
    balanced : bool

    Returns
    -------
    ndarray, shape (B,)
        0 for a problem without a positive weight on either side.
    """
    f, g = np.atleast_2d(f), np.atleast_2d(g)
    empty = np.isnan(f).all(axis=1) | np.isnan(g).all(axis=1)
    f = np.where(empty[:, None], 0.0, f)
    g = np.where(empty[:, None], 0.0, g)
    mid = 0.5 * (np.nanmax(f, axis=1) + np.nanmin(f, axis=1)) if balanced else np.zeros(len(f))
    gap = np.asarray(error_a) * np.nanmax(np.abs(f - mid[:, None]), axis=1)
    gap = gap + np.asarray(error_b) * np.nanmax(np.abs(g + mid[:, None]), axis=1)
    return np.where(empty, 0.0, gap)


def true_kernel_check(
    kernel: KernelOperator,
    a: np.ndarray,
    b: np.ndarray,
    log_u: np.ndarray,
    log_v: np.ndarray,
    rows: np.ndarray,
    cols: np.ndarray,
    penalties: tuple[Penalty, Penalty] = (BALANCED, BALANCED),
) -> TrueKernelCheck:
    """The true-kernel check on given rows and columns, in log-sum-exp form:
    ``O((len(rows) m + len(cols) n) d)``, finite for any ``reg``.

    Parameters
    ----------
    kernel : KernelOperator
        Any operator; only its geometry (the clouds, ``reg`` and the cost) is used, so the
        check is against the TRUE kernel whatever the operator approximates.
    a, b : ndarray, shapes (n,) and (m,)
        The weights.
    log_u, log_v : ndarray, shapes (n,) and (m,)
        Log-scalings to check.
    rows, cols : ndarray of int
        The rows and columns to evaluate (all of them for an exhaustive check; the residuals
        are scaled by ``n / len(rows)`` and ``m / len(cols)``).
    penalties : pair of Penalty, default=(Balanced(), Balanced())
        The problem's marginal penalties: each gives the marginal the fixed point must have
        (:meth:`~sketchot.solver.penalties.Penalty.fixed_point_marginal`).

    Returns
    -------
    TrueKernelCheck
        L1 residuals of both sides, relative to ``sum(a)``, with upper confidence bounds.
    """
    g = kernel.geometry
    n, m = g.shape
    with np.errstate(over="ignore", invalid="ignore"):
        log_kv = g.log_matvec(rows, log_v)
        log_ktu = g.log_matvec(cols, log_u, transpose=True)
        row_mass = np.exp(log_u[rows] + log_kv)
        col_mass = np.exp(log_v[cols] + log_ktu)
    row_target = penalties[0].fixed_point_marginal(a[rows], log_kv, g.reg)
    col_target = penalties[1].fixed_point_marginal(b[cols], log_ktu, g.reg)
    return check_from_masses(row_mass, col_mass, row_target, col_target, (n, m), float(a.sum()))


def sampled_true_kernel_check(
    kernel: KernelOperator,
    a: np.ndarray,
    b: np.ndarray,
    log_u: np.ndarray,
    log_v: np.ndarray,
    n_samples: int,
    generator: np.random.Generator,
    penalties: tuple[Penalty, Penalty] = (BALANCED, BALANCED),
) -> TrueKernelCheck:
    """:func:`true_kernel_check` of any scalings on ``n_samples`` rows and columns drawn
    uniformly without replacement (all of them when there are fewer), rows first, as
    :meth:`SinkhornResult.check_true_kernel <sketchot.SinkhornResult.check_true_kernel>`
    draws them.

    Parameters
    ----------
    kernel : KernelOperator
        Any operator of the geometry; the TRUE kernel is evaluated, never the operator.
    a, b : ndarray
        Weights.
    log_u, log_v : ndarray
        Log-scalings (``-inf`` allowed), e.g. of another solver's plain scalings.
    n_samples : int
        Rows and columns to sample.
    generator : numpy.random.Generator
        The draw.
    penalties : pair of Penalty, default=(Balanced(), Balanced())
        The problem's marginal penalties (:attr:`Problem.penalties`).

    Returns
    -------
    TrueKernelCheck
    """
    n, m = kernel.shape
    rows, cols = (sample_indices(size, n_samples, generator) for size in (n, m))
    return true_kernel_check(kernel, a, b, log_u, log_v, rows, cols, penalties)


def check_from_masses(
    row_mass: np.ndarray,
    col_mass: np.ndarray,
    a_rows: np.ndarray,
    b_cols: np.ndarray,
    shape: tuple[int, int],
    mass: float,
) -> TrueKernelCheck:
    """The check from the true-kernel marginals of sampled rows and columns and the
    marginals they must have (the weights, for balanced transport); ``shape`` is ``(n, m)``,
    ``mass`` the total mass of ``a``."""
    n, m = shape
    row_err = np.abs(np.where(a_rows > 0, row_mass, 0.0) - a_rows)
    col_err = np.abs(np.where(b_cols > 0, col_mass, 0.0) - b_cols)
    error_a, bound_a = _sampled_l1(row_err, n, mass)
    error_b, bound_b = _sampled_l1(col_err, m, mass)
    if not (np.isfinite(error_a) and np.isfinite(error_b)):
        bound_a = bound_b = float("inf")
    return TrueKernelCheck(
        error_a,
        error_b,
        error_a / mass,
        error_b / mass,
        int(a_rows.size),
        int(b_cols.size),
        a_rows.size == n and b_cols.size == m,
        bound_a,
        bound_b,
    )


def sample_indices(size: int, n_samples: int, generator: np.random.Generator) -> np.ndarray:
    """``n_samples`` sorted indices drawn without replacement (all of them if fewer)."""
    if n_samples >= size:
        return np.arange(size)
    return np.sort(generator.choice(size, size=n_samples, replace=False))
