"""Results of :func:`sketchot.sinkhorn`: scalings, values, lazy plan, maps and checks.

Attribute names follow POT's ``OTResult`` where they overlap (``potentials``,
``value``, ``value_linear``, ``lazy_plan``, ``plan``, ``marginals``, ``status``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._validation import check_int, check_rng
from ..kernels import KernelOperator
from ..kernels.base import DEFAULT_MAX_DENSE_BYTES


class LazyPlan:
    """The plan ``P = diag(u) K diag(v)`` without its ``n x m`` array.

    Products cost two kernel applications; rows are computed on demand; :meth:`to_dense`
    is only for small problems.
    """

    def __init__(self, kernel: KernelOperator, log_u: np.ndarray, log_v: np.ndarray) -> None:
        self.kernel = kernel
        self._log_u = log_u
        self._log_v = log_v

    @property
    def shape(self) -> tuple[int, int]:
        return self.kernel.shape

    def matvec(self, x: Any) -> np.ndarray:
        """``P x``."""
        x = self.kernel._check_operand(x, self.shape[1], "x", vector=True)
        return self.kernel.plan_matmat(self._log_u, self._log_v, x)

    def rmatvec(self, y: Any) -> np.ndarray:
        """``P^T y``."""
        y = self.kernel._check_operand(y, self.shape[0], "y", vector=True)
        return self.kernel.plan_rmatmat(self._log_u, self._log_v, y)

    def matmat(self, X: Any) -> np.ndarray:
        """``P X`` for ``X`` of shape (m, k)."""
        X = self.kernel._check_operand(X, self.shape[1], "X", vector=False)
        return self.kernel.plan_matmat(self._log_u, self._log_v, X)

    def rmatmat(self, Y: Any) -> np.ndarray:
        """``P^T Y`` for ``Y`` of shape (n, k)."""
        Y = self.kernel._check_operand(Y, self.shape[0], "Y", vector=False)
        return self.kernel.plan_rmatmat(self._log_u, self._log_v, Y)

    def rows(self, index: Any) -> np.ndarray:
        """Dense rows ``P[index, :]``."""
        return self.kernel.plan_rows(self._log_u, self._log_v, index)

    def to_dense(self, max_bytes: int = DEFAULT_MAX_DENSE_BYTES) -> np.ndarray:
        """The whole plan (refuses above ``max_bytes``)."""
        n, m = self.shape
        if n * m * 8 > max_bytes:
            raise MemoryError(
                f"the dense plan would take {n * m * 8 / 2**20:.0f} MiB > max_bytes={max_bytes}; "
                "use matvec, matmat or rows instead"
            )
        return self.rows(np.arange(n))


@dataclass(frozen=True)
class TrueKernelCheck:
    """L1 marginal errors of the scalings against the EXACT kernel, estimated from samples.

    ``error_a`` estimates ``||u * (K v) - a||_1`` with the true ``K`` from ``n_rows`` sampled
    rows (scaled by ``n / n_rows``); ``error_b`` likewise for ``||v * (K^T u) - b||_1``.
    ``relative_*`` divide by the total mass. ``exhaustive`` is True when every row and column
    was used (the values are then exact, not estimates).
    """

    error_a: float
    error_b: float
    relative_a: float
    relative_b: float
    n_rows: int
    n_cols: int
    exhaustive: bool

    def __str__(self) -> str:
        kind = "exact" if self.exhaustive else f"sampled {self.n_rows} rows / {self.n_cols} cols"
        return (
            f"true-kernel L1 marginal errors ({kind}): a {self.error_a:.3e} "
            f"(relative {self.relative_a:.2e}), b {self.error_b:.3e} "
            f"(relative {self.relative_b:.2e})"
        )


@dataclass
class SinkhornResult:
    """Output of :func:`sketchot.sinkhorn`.

    Attributes
    ----------
    kernel : KernelOperator
        The (approximate) kernel the iterations used.
    a, b : ndarray
        The weights.
    reg : float
    potentials : tuple of ndarray
        ``(log u, log v)``, as POT's ``OTResult`` for Sinkhorn (``-inf`` for zero weights).
    n_iter : int
        Iterations run (a pair of half-steps each).
    converged : bool
        Whether the L2 column-marginal error fell below ``tol``.
    marginal_errors : tuple of float
        L1 errors ``(||P 1 - a||_1, ||P^T 1 - b||_1)`` of the plan with the kernel used.
    value_linear : float
        ``<P, M>`` for ``P = diag(u) K diag(v)`` (``K`` the kernel used), computed from
        products with the operator, never from an ``n x m`` matrix for low-rank backends.
    value : float
        Entropic objective ``<P, M> + reg sum P log P`` evaluated through the scalings
        (``log P_ij = log u_i + log v_j - M_ij / reg``), POT's convention.
    value_dual : float
        Dual objective ``reg (<a, log u> + <b, log v>) - reg (1^T P 1 - sum a)``; equal to
        ``value`` at convergence.
    log_domain : bool
        Whether the stabilised (log-sum-exp) iteration was used.
    safeguard : dict
        Counts of repaired denominators (``rows_repaired``, ``cols_repaired``, ``clipped``)
        and the policy.
    timings : dict
        ``build`` (kernel construction), ``iterations`` (the loop) and ``per_iteration``
        seconds.
    error_history : list of (int, float)
        ``(iteration, L2 column-marginal error)`` at every check.
    true_kernel : TrueKernelCheck or None
        For approximate backends, the check against the exact kernel that the solver ran on
        evenly spaced rows and columns (``true_kernel_samples`` of each); ``None`` for the
        exact backend or when skipped. :meth:`check_true_kernel` runs a larger, random one.
    """

    kernel: KernelOperator
    a: np.ndarray
    b: np.ndarray
    reg: float
    potentials: tuple[np.ndarray, np.ndarray]
    n_iter: int
    converged: bool
    tol: float
    marginals: tuple[np.ndarray, np.ndarray]
    value_linear: float
    mass: float
    log_domain: bool
    safeguard: dict[str, Any]
    timings: dict[str, float]
    error_history: list[tuple[int, float]] = field(default_factory=list)
    true_kernel: TrueKernelCheck | None = None

    # ---------------------------------------------------------------- values
    @property
    def u(self) -> np.ndarray:
        """Scaling ``u = exp(potentials[0])`` (may overflow for extreme log-domain results)."""
        with np.errstate(over="ignore"):
            return np.exp(self.potentials[0])

    @property
    def v(self) -> np.ndarray:
        """Scaling ``v = exp(potentials[1])``."""
        with np.errstate(over="ignore"):
            return np.exp(self.potentials[1])

    @property
    def potential_a(self) -> np.ndarray:
        return self.potentials[0]

    @property
    def potential_b(self) -> np.ndarray:
        return self.potentials[1]

    @property
    def marginal_a(self) -> np.ndarray:
        return self.marginals[0]

    @property
    def marginal_b(self) -> np.ndarray:
        return self.marginals[1]

    @property
    def marginal_errors(self) -> tuple[float, float]:
        return (
            float(np.abs(self.marginals[0] - self.a).sum()),
            float(np.abs(self.marginals[1] - self.b).sum()),
        )

    @property
    def value(self) -> float:
        # sum P log P = <P 1, log u> + <P^T 1, log v> - <P, M> / reg
        row, col = self.marginals
        return self.reg * (
            _masked_dot(row, self.potentials[0]) + _masked_dot(col, self.potentials[1])
        )

    @property
    def value_dual(self) -> float:
        dual = _masked_dot(self.a, self.potentials[0]) + _masked_dot(self.b, self.potentials[1])
        return self.reg * (dual - (self.mass - float(self.a.sum())))

    @property
    def status(self) -> str:
        return "converged" if self.converged else "max_iter reached"

    # ----------------------------------------------------------------- plans
    @property
    def lazy_plan(self) -> LazyPlan:
        """The plan as a :class:`LazyPlan` (products and rows on demand)."""
        return LazyPlan(self.kernel, *self.potentials)

    @property
    def plan(self) -> np.ndarray:
        """The dense plan; only for problems whose ``n x m`` array fits 1 GiB."""
        return self.lazy_plan.to_dense()

    # ------------------------------------------------------- barycentric maps
    def barycentric_map(
        self, X_new: Any = None, *, return_fallbacks: bool = False
    ) -> np.ndarray | tuple[np.ndarray, int]:
        """Barycentric projection of source points onto the target cloud ``Y``.

        ``T(x) = sum_j K(x, y_j) v_j y_j / sum_j K(x, y_j) v_j``; for the fitted points this is
        ``(P Y) / (P 1)``. ``X_new`` (default: the fitted ``X``) uses the out-of-sample
        operator: ``O(len(X_new) r)`` for low-rank backends, streamed for the exact one.
        Rows with a non-positive approximate denominator are recomputed with the exact kernel;
        ``return_fallbacks=True`` also returns how many.
        """
        mapped, fallbacks = self.kernel.barycentric(X_new, self.potentials[1], self.kernel.Y)
        return (mapped, fallbacks) if return_fallbacks else mapped

    def inverse_barycentric_map(
        self, Y_new: Any = None, *, return_fallbacks: bool = False
    ) -> np.ndarray | tuple[np.ndarray, int]:
        """Barycentric projection of target points onto the source cloud ``X``."""
        mapped, fallbacks = self.kernel.rbarycentric(Y_new, self.potentials[0], self.kernel.X)
        return (mapped, fallbacks) if return_fallbacks else mapped

    # ------------------------------------------------------------------ check
    def check_true_kernel(self, n_samples: int = 1000, rng: Any = None) -> TrueKernelCheck:
        """Estimate the L1 marginal errors of ``(u, v)`` against the EXACT kernel.

        Samples ``n_samples`` rows and columns (all of them when there are fewer) and evaluates
        the true kernel on them in log-sum-exp form: ``O(n_samples (n + m) d)`` time. An
        approximate solver can converge perfectly on a wrong kernel; this says whether the
        scalings are also right for the true one.
        """
        n_samples = check_int(n_samples, "n_samples", minimum=1)
        generator = check_rng(rng)
        n, m = self.kernel.shape
        return self._check_on(_sample(n, n_samples, generator), _sample(m, n_samples, generator))

    def _check_on(self, rows: np.ndarray, cols: np.ndarray) -> TrueKernelCheck:
        """The true-kernel check on given rows and columns (scaled up to all of them)."""
        log_u, log_v = self.potentials
        n, m = self.kernel.shape
        with np.errstate(over="ignore", invalid="ignore"):
            row_mass = np.exp(log_u[rows] + self.kernel.exact_log_rows_matvec(rows, log_v))
            col_mass = np.exp(log_v[cols] + self.kernel.exact_log_cols_rmatvec(cols, log_u))
        error_a = float(np.abs(row_mass - self.a[rows]).sum() * n / rows.size)
        error_b = float(np.abs(col_mass - self.b[cols]).sum() * m / cols.size)
        return TrueKernelCheck(
            error_a,
            error_b,
            error_a / self.a.sum(),
            error_b / self.b.sum(),
            int(rows.size),
            int(cols.size),
            rows.size == n and cols.size == m,
        )

    def __repr__(self) -> str:
        err_a, err_b = self.marginal_errors
        return (
            f"SinkhornResult(backend={self.kernel.backend!r}, shape={self.kernel.shape}, "
            f"reg={self.reg:g}, n_iter={self.n_iter}, converged={self.converged}, "
            f"value_linear={self.value_linear:.6g}, marginal_errors=({err_a:.2e}, "
            f"{err_b:.2e}))"
        )


def _masked_dot(weights: np.ndarray, logs: np.ndarray) -> float:
    """``sum_i w_i log_i`` over entries with ``w_i != 0`` (``0 * -inf`` counts as 0)."""
    mask = weights != 0
    return float(weights[mask] @ logs[mask])


def strided_sample(size: int, n_samples: int) -> np.ndarray:
    """``n_samples`` evenly spaced indices of ``range(size)`` (all of them if fewer)."""
    if n_samples >= size:
        return np.arange(size)
    return np.unique(np.linspace(0, size - 1, n_samples).astype(np.int64))


def _sample(size: int, n_samples: int, generator: np.random.Generator) -> np.ndarray:
    if n_samples >= size:
        return np.arange(size)
    return np.sort(generator.choice(size, size=n_samples, replace=False))
