"""The kernel-operator interface shared by every backend, and the shared low-rank operator.

A :class:`KernelOperator` represents the Gibbs kernel ``K_ij = exp(-||x_i - y_j||^2 / reg)``
between two point clouds ``X`` (n x d) and ``Y`` (m x d), exactly or approximately. The
Sinkhorn solver and everything above it talk to this interface only:

* linear-operator products in SciPy's names: :meth:`~KernelOperator.matvec` (``K v``),
  :meth:`~KernelOperator.rmatvec` (``K^T u``), :meth:`~KernelOperator.matmat`,
  :meth:`~KernelOperator.rmatmat`, :meth:`~KernelOperator.to_dense`, and an adapter
  :meth:`~KernelOperator.aslinearoperator`;
* out-of-sample products ``K(X_new, Y) V`` and ``K(X, Y_new)^T U`` without refitting;
* reference values of the exact kernel on a few rows or columns, for safeguards and checks;
* fused Sinkhorn sweeps (see below) and plan summaries.

**Fused sweeps.** Every operator is viewed as ``K = L R^T`` (low-rank: ``L = A``, ``R = B``;
exact: ``L = K``, ``R = I``). A Sinkhorn half-step ``u = a / (K v)`` followed by the next
product ``K^T u`` touches ``L`` twice; :meth:`~KernelOperator.sweep_left` does both in one
blocked pass over ``L``: given ``y = R^T v`` it returns ``u``, ``z = L^T u`` and ``K v``.
:meth:`~KernelOperator.sweep_right` does the same over ``R``. An iteration is bound by memory
bandwidth (it streams the factors), so one pass instead of two pays: at n = 10^6 and rank 61,
a half-iteration took 76 ms instead of 212 ms in float64 and 57 ms instead of 109 ms in
float32 (2-core x86). A streamed exact kernel computes each block's exponentials once instead
of twice.

Low-rank backends (``rff``, ``nystrom``, ``polyts``) only build their factors ``A, B`` and
feature maps; :class:`LowRankKernel` does every product, in ``O((n + m) r)`` memory and time.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from scipy.sparse.linalg import LinearOperator

from .._parallel import run_parts
from .._validation import check_matrix, describe
from ..gibbs import (
    gibbs_block,
    gibbs_log_matvec,
    gibbs_matmat,
    gibbs_softmax_average,
    sq_norms,
)

#: ``guard(denominators, index, bad)`` repairs ``denominators[bad]`` in place (``index`` is
#: the slice of the full side the block covers). It is how the solver's safeguard policy
#: reaches inside a fused sweep.
Guard = Callable[[np.ndarray, slice, np.ndarray], None]

# A scaling numerator / denominator above 1 / MIN_DENOMINATOR_RATIO is treated as a
# breakdown: the scaling would overflow or is meaningless.
MIN_DENOMINATOR_RATIO = 1e-300

# Entries per block of a threaded fused pass: the block stays in cache between its two products
# (4096 x 61 was measured fastest for rank 61 on 2-core x86), and each matrix-vector product
# stays below the ~460k entries where OpenBLAS goes multi-threaded, which made the many small
# products of a pass 3-40x slower on a busy 2-core machine.
PASS_BLOCK_ENTRIES = 1 << 18


def pass_block_rows(n_cols: int, entries: int = PASS_BLOCK_ENTRIES) -> int:
    """Rows per block of a fused pass over a matrix with ``n_cols`` columns."""
    return max(1, entries // max(1, n_cols))


# Largest dense array to_dense() builds unless told otherwise.
DEFAULT_MAX_DENSE_BYTES = 1 << 30


@dataclass(frozen=True)
class PlanSummary:
    """Marginals, cost and mass of a plan ``P = diag(u) K diag(v)``.

    Attributes
    ----------
    row_marginal : ndarray, shape (n,)
        ``P 1``.
    col_marginal : ndarray, shape (m,)
        ``P^T 1``.
    cost : float
        ``<P, M>`` with ``M_ij = ||x_i - y_j||^2``.
    mass : float
        ``1^T P 1``.
    """

    row_marginal: np.ndarray
    col_marginal: np.ndarray
    cost: float
    mass: float


class KernelOperator(ABC):
    """Gibbs kernel ``exp(-||x - y||^2 / reg)`` between ``X`` and ``Y`` as a linear operator.

    Parameters
    ----------
    X : ndarray, shape (n, d)
    Y : ndarray, shape (m, d)
    reg : float
        Entropic regularisation; ``K = exp(-M / reg)`` as in POT.
    dtype : numpy dtype
        Storage and product precision of the kernel (float64 or float32). Results of the
        products are returned as float64.
    params : dict
        The backend parameters the operator was built with (for reports and repr).

    Attributes
    ----------
    center : ndarray, shape (d,)
        Common translation (mean of all points) used for every exact evaluation: the kernel is
        translation invariant and centred coordinates keep ``||x||^2 + ||y||^2 - 2 x.y`` exact.
    build_time : float
        Seconds spent building the operator (set by :func:`~sketchot.make_kernel`).
    """

    backend: ClassVar[str] = ""
    is_exact: ClassVar[bool] = False

    def __init__(
        self, X: np.ndarray, Y: np.ndarray, reg: float, *, dtype: Any, params: dict[str, Any]
    ) -> None:
        self.X = X
        self.Y = Y
        self.reg = float(reg)
        self.dtype = np.dtype(dtype)
        self.params = dict(params)
        self.center = (X.sum(axis=0) + Y.sum(axis=0)) / (X.shape[0] + Y.shape[0])
        self._Xc = X - self.center
        self._Yc = Y - self.center
        self.build_time = 0.0

    # --------------------------------------------------------------- basics
    @property
    def shape(self) -> tuple[int, int]:
        """``(n, m)``."""
        return (self.X.shape[0], self.Y.shape[0])

    @property
    def rank(self) -> int | None:
        """Number of columns of the factors (``None`` for the exact kernel)."""
        return None

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return (
            f"<{type(self).__name__} '{self.backend}' {self.shape[0]}x{self.shape[1]} "
            f"reg={self.reg:g} dtype={self.dtype}{', ' + params if params else ''}>"
        )

    # ------------------------------------------------------------- products
    @abstractmethod
    def matmat(self, V: np.ndarray) -> np.ndarray:
        """``K @ V`` for ``V`` of shape (m,) or (m, k)."""

    @abstractmethod
    def rmatmat(self, U: np.ndarray) -> np.ndarray:
        """``K.T @ U`` for ``U`` of shape (n,) or (n, k)."""

    def matvec(self, v: Any) -> np.ndarray:
        """``K v`` for a vector ``v`` of length m."""
        return self.matmat(self._check_operand(v, self.shape[1], "v", vector=True))

    def rmatvec(self, u: Any) -> np.ndarray:
        """``K^T u`` for a vector ``u`` of length n."""
        return self.rmatmat(self._check_operand(u, self.shape[0], "u", vector=True))

    @abstractmethod
    def rows(self, index: Any) -> np.ndarray:
        """Dense rows ``K[index, :]`` (shape ``(len(index), m)``)."""

    def to_dense(self, max_bytes: int = DEFAULT_MAX_DENSE_BYTES) -> np.ndarray:
        """The whole ``n x m`` matrix, for small problems only (refuses above ``max_bytes``)."""
        n, m = self.shape
        if n * m * 8 > max_bytes:
            raise MemoryError(
                f"to_dense would build an {n} x {m} float64 array ({n * m * 8 / 2**20:.0f} MiB) "
                f"above max_bytes={max_bytes}; use matvec/matmat or rows() instead"
            )
        return self.rows(np.arange(n))

    @abstractmethod
    def matmat_new(self, X_new: Any, V: Any) -> np.ndarray:
        """Out of sample: ``K(X_new, Y) @ V`` for new source points, without refitting."""

    @abstractmethod
    def rmatmat_new(self, Y_new: Any, U: Any) -> np.ndarray:
        """Out of sample: ``K(X, Y_new).T @ U`` for new target points, without refitting."""

    def aslinearoperator(self) -> LinearOperator:
        """The kernel as a ``scipy.sparse.linalg.LinearOperator`` (float64)."""
        return LinearOperator(
            self.shape,
            matvec=self.matvec,
            rmatvec=self.rmatvec,
            matmat=self.matmat,
            rmatmat=self.rmatmat,
            dtype=np.float64,
        )

    # ------------------------------------------------------- exact reference
    def exact_rows_matmat(self, index: Any, V: np.ndarray) -> np.ndarray:
        """``K_exact[index, :] @ V`` with the true kernel, ``O(len(index) m d)``."""
        return gibbs_matmat(self._Xc[index], self._Yc, self.reg, V)

    def exact_cols_rmatmat(self, index: Any, U: np.ndarray) -> np.ndarray:
        """``K_exact[:, index].T @ U`` with the true kernel, ``O(len(index) n d)``."""
        return gibbs_matmat(self._Yc[index], self._Xc, self.reg, U)

    def exact_log_rows_matvec(self, index: Any, log_v: np.ndarray) -> np.ndarray:
        """``log (K_exact[index, :] @ exp(log_v))``, stable for any ``reg``."""
        return gibbs_log_matvec(self._Xc[index], self._Yc, self.reg, log_v)

    def exact_log_cols_rmatvec(self, index: Any, log_u: np.ndarray) -> np.ndarray:
        """``log (K_exact[:, index].T @ exp(log_u))``, stable for any ``reg``."""
        return gibbs_log_matvec(self._Yc[index], self._Xc, self.reg, log_u)

    def exact_rows(self, index: Any) -> np.ndarray:
        """True kernel rows ``K_exact[index, :]``."""
        return gibbs_block(self._Xc[index], self._Yc, self.reg)

    # -------------------------------------------------------- fused sweeps
    @abstractmethod
    def sweep_start(self, u: np.ndarray) -> np.ndarray:
        """``z = L^T u``: the state that :meth:`sweep_right` consumes."""

    @abstractmethod
    def sweep_left(
        self, y: np.ndarray, numerator: np.ndarray, guard: Guard
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One pass over ``L``: ``Kv = L y``, ``u = a / Kv`` (guarded), ``z = L^T u``.

        Returns ``(u, z, Kv)`` with ``Kv`` the raw (unrepaired) products.
        """

    @abstractmethod
    def sweep_right(
        self, z: np.ndarray, numerator: np.ndarray, guard: Guard
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One pass over ``R``: ``Ktu = R z``, ``v = b / Ktu`` (guarded), ``y = R^T v``.

        Returns ``(v, y, Ktu)`` with ``Ktu`` the raw (unrepaired) products.
        """

    # --------------------------------------------------------------- plans
    def plan_summary(self, log_u: np.ndarray, log_v: np.ndarray) -> PlanSummary:
        """Marginals, ``<P, M>`` and mass of ``P = diag(u) K diag(v)``.

        The cost uses ``||x - y||^2 = ||x||^2 + ||y||^2 - 2 x.y`` in centred coordinates, so it
        needs ``K`` only through ``matmat`` with ``d + 1`` columns: ``O((n + m) r d)`` for a
        rank-``r`` operator, never an ``n x m`` array.
        """
        u, v = np.exp(log_u), np.exp(log_v)
        Kv_and_KvY = self.matmat(np.column_stack([v, v[:, None] * self._Yc]))
        row = u * Kv_and_KvY[:, 0]
        col = v * self.rmatvec(u)
        cross = np.einsum("i,ij,ij->", u, self._Xc, Kv_and_KvY[:, 1:])
        cost = row @ sq_norms(self._Xc) + col @ sq_norms(self._Yc) - 2.0 * cross
        return PlanSummary(row, col, float(cost), float(row.sum()))

    def plan_rows(self, log_u: np.ndarray, log_v: np.ndarray, index: Any) -> np.ndarray:
        """Dense rows of ``P = diag(u) K diag(v)``."""
        return np.exp(log_u[index])[:, None] * self.rows(index) * np.exp(log_v)[None, :]

    def plan_matmat(self, log_u: np.ndarray, log_v: np.ndarray, V: np.ndarray) -> np.ndarray:
        """``P @ V``."""
        u, v = np.exp(log_u), np.exp(log_v)
        scaled = v * V if V.ndim == 1 else v[:, None] * V
        out = self.matmat(scaled)
        return u * out if out.ndim == 1 else u[:, None] * out

    def plan_rmatmat(self, log_u: np.ndarray, log_v: np.ndarray, U: np.ndarray) -> np.ndarray:
        """``P.T @ U``."""
        u, v = np.exp(log_u), np.exp(log_v)
        scaled = u * U if U.ndim == 1 else u[:, None] * U
        out = self.rmatmat(scaled)
        return v * out if out.ndim == 1 else v[:, None] * out

    # ------------------------------------------------------ barycentric maps
    def barycentric(
        self, X_new: np.ndarray | None, log_v: np.ndarray, values: np.ndarray
    ) -> tuple[np.ndarray, int]:
        """``T(x) = sum_j K(x, y_j) v_j values_j / sum_j K(x, y_j) v_j`` for source points.

        ``X_new=None`` maps the fitted ``X``. Rows whose approximate denominator is not
        positive (a signed approximation can do that) are recomputed with the exact kernel
        (a log-stable softmax). Returns the map and the number of such rows.
        """
        return self._barycentric(X_new, log_v, values, transpose=False)

    def rbarycentric(
        self, Y_new: np.ndarray | None, log_u: np.ndarray, values: np.ndarray
    ) -> tuple[np.ndarray, int]:
        """The same for target points: ``sum_i K(x_i, y) u_i values_i / sum_i K(x_i, y) u_i``."""
        return self._barycentric(Y_new, log_u, values, transpose=True)

    def _barycentric(self, points, log_w, values, *, transpose):
        if points is not None:
            points = self._check_new_points(points, "Y_new" if transpose else "X_new")
        # Scalings enter only through ratios: shift them so the largest weight is 1.
        finite = np.isfinite(log_w)
        weights = np.exp(log_w - log_w[finite].max())
        stacked = np.column_stack([weights[:, None] * values, weights])
        if points is None:
            products = self.rmatmat(stacked) if transpose else self.matmat(stacked)
        else:
            products = (
                self.rmatmat_new(points, stacked) if transpose else self.matmat_new(points, stacked)
            )
        numerator, denominator = products[:, :-1], products[:, -1]
        scale = np.abs(denominator).max() if denominator.size else 0.0
        bad = ~(denominator > MIN_DENOMINATOR_RATIO * scale) | ~np.all(
            np.isfinite(numerator), axis=1
        )
        out = np.empty_like(numerator)
        good = ~bad
        out[good] = numerator[good] / denominator[good, None]
        if bad.any():
            own = self._Yc if transpose else self._Xc
            other = self._Xc if transpose else self._Yc
            rows = own[bad] if points is None else points[bad] - self.center
            out[bad] = gibbs_softmax_average(rows, other, self.reg, log_w, values)
        return out, int(bad.sum())

    # -------------------------------------------------------------- helpers
    def _check_operand(self, value: Any, length: int, name: str, *, vector: bool) -> np.ndarray:
        array = np.asarray(value)
        if array.dtype.kind not in "biuf":
            raise TypeError(f"{name} must be a real array; got {describe(value)}")
        if vector and array.ndim != 1:
            raise ValueError(
                f"{name} must be a 1-D vector of length {length}; got shape {array.shape}"
            )
        if array.shape[0] != length:
            raise ValueError(f"{name} must have length {length}; got shape {array.shape}")
        return array.astype(np.float64, copy=False)

    def _check_new_points(self, points: Any, name: str) -> np.ndarray:
        return check_matrix(
            points, name, n_features=self.X.shape[1], feature_name="the fitted points"
        )


def divide_guarded(
    numerator: np.ndarray, denominator: np.ndarray, index: slice, guard: Guard
) -> np.ndarray:
    """``numerator / denominator`` where ``numerator > 0`` (0 elsewhere), after letting
    ``guard`` repair denominators that are not positive, not finite or too small.

    Zero weights give zero scalings whatever the denominator, so they never produce NaN.
    """
    den = np.array(denominator, dtype=np.float64)
    active = numerator > 0
    with np.errstate(invalid="ignore"):
        healthy = (den >= numerator * MIN_DENOMINATOR_RATIO) & np.isfinite(den)
    bad = active & ~healthy
    if bad.any():
        guard(den, index, bad)
    out = np.zeros_like(den)
    np.divide(numerator, den, out=out, where=active)
    return out


def fused_pass(
    slices: Sequence[slice],
    block_of: Callable[[slice], np.ndarray],
    n_rows: int,
    w: np.ndarray,
    numerator: np.ndarray,
    guard: Guard,
    out_dim: int,
    dtype: np.dtype,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One blocked pass over a row-partitioned matrix ``F``.

    For each block ``F_b = block_of(rows)``: ``den_b = F_b w``, ``s_b = numerator_b / den_b``
    (guarded), ``proj += F_b^T s_b``. Returns ``(s, proj, den)``. Products run in ``dtype``
    (float32 factors are never copied to float64); scalings and accumulation are float64.

    Large passes are split over worker threads (numpy releases the GIL in its products and
    ufuncs): worker ``k`` takes blocks ``k, k + W, k + 2W, ...`` in order and the partial
    projections are added in worker order, so the result does not depend on scheduling.
    Measured at n = 10^6, rank 61, float32 on 2 cores: 33-44 ms per pass with 2 threads
    against 54-57 ms with one.
    """
    w_cast = w.astype(dtype, copy=False)
    den = np.empty(n_rows)
    scaling = np.empty(n_rows)
    # Per-pass constants of the fast path, which almost every block takes: every weight
    # positive and every denominator healthy, so one division and no masks.
    all_active = numerator.min() > 0
    floor = MIN_DENOMINATOR_RATIO * numerator.max()

    def run(part: Sequence[slice]) -> np.ndarray:
        proj = np.zeros(out_dim)
        # A diverging approximation can overflow in the products; the guard repairs them.
        with np.errstate(over="ignore", invalid="ignore"):
            for index in part:
                F = block_of(index)
                block_den = den[index]
                block_den[...] = F @ w_cast
                smallest = block_den.min()
                if (
                    all_active
                    and smallest >= floor
                    and smallest > 0
                    and np.isfinite(block_den.max())
                ):
                    s = np.divide(numerator[index], block_den, out=scaling[index])
                else:
                    s = scaling[index]
                    s[...] = divide_guarded(numerator[index], block_den, index, guard)
                proj += s.astype(dtype, copy=False) @ F
        return proj

    partial = run_parts(run, slices, n_rows * out_dim >= THREADED_PASS_MIN_ENTRIES)
    proj = partial[0]
    for more in partial[1:]:
        proj += more
    return scaling, proj, den


# Passes over fewer entries than this run in the calling thread: the thread hand-off costs
# more than it saves on small problems.
THREADED_PASS_MIN_ENTRIES = 1 << 22

# Entries per block of a pass that runs in the calling thread. Larger than PASS_BLOCK_ENTRIES
# so that BLAS may use its own threads on these mid-sized products: at n = 10^4, rank 61 an
# iteration took 0.64-0.66 ms with it against 1.0-1.4 ms with 2^18-entry blocks (2 cores),
# level with POT's unblocked loop (0.64 ms).
SERIAL_PASS_ENTRIES = 1 << 20


class LowRankKernel(KernelOperator):
    """``K ~ A B^T`` from factors ``A`` (n x r) and ``B`` (m x r); the one shared operator.

    Parameters
    ----------
    X, Y, reg, dtype, params
        As in :class:`KernelOperator`.
    left, right : ndarray
        The factors ``A`` and ``B`` (stored in ``dtype``).
    left_map, right_map : callable
        Feature maps for new points: ``left_map(X_new) @ left_projection`` is the row of ``A``
        of each new point, so ``K(X_new, Y) ~ left_map(X_new) left_projection B^T`` (likewise
        on the right). They apply the fitted randomness, so they are consistent with ``A``
        and ``B``.
    left_projection, right_projection : ndarray, optional
        A fixed matrix applied after the map (``None``: identity). Products with new points
        fold it into the small side, ``left_map(X_new) @ (P @ (B^T V))``, which matters when
        the map is wider than the rank of the product (Nystrom: ``K(x, Z)`` then whitening).

    Notes
    -----
    Memory ``O((n + m) r)``; ``matvec``/``rmatvec`` cost ``O((n + m) r)``; no ``n x m`` array is
    ever formed except by an explicit :meth:`to_dense` or :meth:`rows` call.
    """

    def __init__(
        self,
        X: np.ndarray,
        Y: np.ndarray,
        reg: float,
        left: np.ndarray,
        right: np.ndarray,
        *,
        left_map: Callable[[np.ndarray], np.ndarray],
        right_map: Callable[[np.ndarray], np.ndarray],
        backend: str,
        dtype: Any,
        params: dict[str, Any],
        left_projection: np.ndarray | None = None,
        right_projection: np.ndarray | None = None,
    ) -> None:
        super().__init__(X, Y, reg, dtype=dtype, params=params)
        self.backend = backend
        self.left = np.ascontiguousarray(left, dtype=self.dtype)
        self.right = np.ascontiguousarray(right, dtype=self.dtype)
        self._left_map = left_map
        self._right_map = right_map
        self._left_projection = left_projection
        self._right_projection = right_projection

    @property
    def rank(self) -> int:
        return self.left.shape[1]

    @property
    def factors(self) -> tuple[np.ndarray, np.ndarray]:
        """``(A, B)`` with ``K ~ A B^T``; they can be passed to POT's
        ``ot.lowrank.sinkhorn_low_rank_kernel(A, B, a, b)``."""
        return self.left, self.right

    def matmat(self, V: np.ndarray) -> np.ndarray:
        V = self._check_operand(V, self.shape[1], "V", vector=False)
        inner = self.right.T @ V.astype(self.dtype, copy=False)
        return (self.left @ inner).astype(np.float64, copy=False)

    def rmatmat(self, U: np.ndarray) -> np.ndarray:
        U = self._check_operand(U, self.shape[0], "U", vector=False)
        inner = self.left.T @ U.astype(self.dtype, copy=False)
        return (self.right @ inner).astype(np.float64, copy=False)

    def rows(self, index: Any) -> np.ndarray:
        return (self.left[index] @ self.right.T).astype(np.float64, copy=False)

    def matmat_new(self, X_new: Any, V: Any) -> np.ndarray:
        X_new = self._check_new_points(X_new, "X_new")
        V = self._check_operand(V, self.shape[1], "V", vector=False)
        inner = self.right.T @ V.astype(self.dtype)
        return self._new_products(X_new, self._left_map, self._left_projection, inner)

    def rmatmat_new(self, Y_new: Any, U: Any) -> np.ndarray:
        Y_new = self._check_new_points(Y_new, "Y_new")
        U = self._check_operand(U, self.shape[0], "U", vector=False)
        inner = self.left.T @ U.astype(self.dtype)
        return self._new_products(Y_new, self._right_map, self._right_projection, inner)

    def _new_products(self, points, feature_map, projection, inner):
        if projection is not None:
            inner = projection.astype(self.dtype, copy=False) @ inner
        out = np.empty((points.shape[0], *inner.shape[1:]))
        # Features of new points are built block by block: about 32 MB of them at a time.
        width = self.rank if projection is None else projection.shape[0]
        block = max(1, (1 << 22) // max(1, width))
        for start in range(0, points.shape[0], block):
            rows = slice(start, start + block)
            out[rows] = feature_map(points[rows]) @ inner
        return out

    def sweep_start(self, u: np.ndarray) -> np.ndarray:
        return (self.left.T @ u.astype(self.dtype)).astype(np.float64)

    def sweep_left(self, y, numerator, guard):
        return self._sweep(self.left, y, numerator, guard)

    def sweep_right(self, z, numerator, guard):
        return self._sweep(self.right, z, numerator, guard)

    def _sweep(self, factor, w, numerator, guard):
        step = pass_block_rows(
            factor.shape[1],
            PASS_BLOCK_ENTRIES if factor.size >= THREADED_PASS_MIN_ENTRIES else SERIAL_PASS_ENTRIES,
        )
        slices = [slice(start, start + step) for start in range(0, factor.shape[0], step)]
        return fused_pass(
            slices, factor.__getitem__, factor.shape[0], w, numerator, guard, self.rank, self.dtype
        )
