"""Results of :func:`sketchot.sinkhorn`: scalings, values, lazy plan, maps and checks.

Attribute names follow POT's ``OTResult`` where they overlap (``potentials``,
``value``, ``value_linear``, ``lazy_plan``, ``plan``, ``marginals``, ``status``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._arrays import ArrayContext, UserArrays
from .._validation import check_bool, check_int, check_matrix, check_rng, user_stacklevel
from ..cost_matrix import require_points
from ..kernels import KernelOperator
from ..kernels.base import MIN_DENOMINATOR_RATIO
from .advice import advise
from .errors import InvalidResultError, InvalidResultWarning
from .plans import (
    LazyPlan,
    TrueKernelCheck,
    barycentric,
    first_moments,
    sampled_true_kernel_check,
)
from .problem import Problem

# Relative slack of the bounding-box check of mapped points (rounding of the weighted means).
BOX_SLACK = 1e-9

# Plan rows below this mass are too close to float64's underflow to divide by (the log-stable
# map is used instead).
MIN_MAP_DENOMINATOR = 1e-250


@dataclass
class SinkhornResult:
    """Output of :func:`sketchot.sinkhorn`.

    Attributes
    ----------
    kernel : KernelOperator
        The (approximate) kernel the iterations used.
    problem : Problem
        The validated problem: weights ``a``, ``b``, ``reg``, marginal penalties ``reg_m``
        (also readable as ``result.a``, ``result.b``, ``result.reg``, ``result.reg_m``).
    potentials : tuple of ndarray
        ``(log u, log v)``, as POT's ``OTResult`` for Sinkhorn (``-inf`` for zero weights).
    n_iter : int
        Iterations run (a pair of half-steps each; one product each for the symmetric
        iteration, ``iteration_info['symmetric']``).
    stop : str
        Why the iteration stopped: ``'converged'``, ``'max_iter'``, ``'stalled'`` (no progress
        over the last checks) or ``'breakdown'`` (:mod:`sketchot.solver.engine`).
    converged : bool
        Whether the residual fell below ``tol``.
    marginal_errors : tuple of float
        L1 errors ``(||P 1 - a||_1, ||P^T 1 - b||_1)`` of the plan with the kernel used.
    value_linear : float
        ``<P, M>`` for ``P = diag(u) K diag(v)`` (``K`` the kernel used), computed from
        products with the operator, never from an ``n x m`` matrix for low-rank backends.
    value : float
        The objective ``<P, M> + reg KL(P | a b^T)`` plus, for unbalanced transport,
        ``reg_m_a KL(P 1 | a) + reg_m_b KL(P^T 1 | b)`` (generalised KL; the convention of
        POT's ``ot.solve_sample``), evaluated through the scalings
        (``log P_ij = log u_i + log v_j - M_ij / reg``) and the marginals.
    value_dual : float
        Balanced dual objective ``reg (<a, log u> + <b, log v>) - reg (1^T P 1 - sum a)``,
        shifted to ``value``'s convention; equal to ``value`` at convergence.
    log_domain : bool
        Whether the exact kernel's log-stable (absorption) path was used.
    safeguard : dict
        Counts of repaired denominators (``rows_repaired``, ``cols_repaired``, ``clipped``)
        and the policy.
    timings : dict
        ``build`` (kernel construction), ``iterations`` (the loop) and ``per_iteration``
        seconds.
    error_history : list of (int, float)
        ``(iteration, L2 column-marginal error)`` at every check.
    reason : str
        Why this kernel was used (``backend='auto'``).
    attempts : list
        The rungs ``backend='auto'`` tried, each with what was measured.
    replay : dict
        ``backend='auto'``: the keyword arguments of the explicit call that gives the same
        result, ``{'backend': name, 'dtype': ..., **parameters}`` (plus the solver options a
        candidate ran with, e.g. ``anderson``): ``sinkhorn(a, b, X, Y, reg, rng=seed,
        **res.replay)`` with the same seed returns the same bits. Empty otherwise.
    notes : list of str
        What the solver changed on the way (e.g. ``b`` rescaled to ``a``'s mass).
    options : dict
        The solver options in effect.
    true_kernel : TrueKernelCheck or None
        The check of the scalings against the exact kernel: the L1 residual of the fixed
        point (for balanced transport, of the marginals) relative to ``sum(a)``. Exact (every
        row and column) for the exact backend, where it costs nothing, and for approximate
        backends when ``n m <= 4e6``; on ``true_kernel_samples`` uniformly drawn rows and
        columns otherwise, with an upper confidence bound. ``None`` when ``accuracy=None``.
        :meth:`check_true_kernel` runs another one.
    iteration_info : dict
        The iteration's strategy (``'multiplicative'``, ``'absorb'``, ``'log'``),
        ``'symmetric': True`` where both sides were the same cloud and weights (the averaged
        iteration of :mod:`sketchot.solver.engine`; ``'fallback': 'two-sided'`` where it
        broke down) and counters (absorptions, resets, stages of an epsilon schedule).
    plan_moments : tuple of (ndarray or None)
        ``(P Yc, P^T Xc)``, shapes (n, d) and (m, d), in the kernel geometry's centred
        coordinates (``Xc = X - geometry.center``), where the plan's summary computed them
        (``None`` otherwise): the barycentric maps of the fitted points and the divergence's
        gradients read them instead of multiplying the plan again.
    """

    kernel: KernelOperator
    problem: Problem
    potentials: tuple[np.ndarray, np.ndarray]
    n_iter: int
    stop: str
    tol: float
    marginals: tuple[np.ndarray, np.ndarray]
    value_linear: float
    mass: float
    log_domain: bool
    safeguard: dict[str, Any]
    timings: dict[str, float]
    error_history: list[tuple[int, float]] = field(default_factory=list)
    true_kernel: TrueKernelCheck | None = None
    options: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    notes: list[str] = field(default_factory=list)
    attempts: list[Any] = field(default_factory=list)
    iteration_info: dict[str, Any] = field(default_factory=dict)
    replay: dict[str, Any] = field(default_factory=dict)
    plan_moments: tuple[np.ndarray | None, np.ndarray | None] = (None, None)

    a = property(lambda self: self.problem.a, doc="Source weights, shape (n,).")
    b = property(lambda self: self.problem.b, doc="Target weights, shape (m,).")
    reg = property(lambda self: self.problem.reg, doc="Entropic regularisation.")
    reg_m = property(lambda self: self.problem.reg_m, doc="Marginal penalties (inf: hard).")

    @property
    def converged(self) -> bool:
        """Whether the iteration stopped on its tolerance."""
        return self.stop == "converged"

    @property
    def backend(self) -> str:
        """Name of the backend whose kernel the iterations used."""
        return self.kernel.info.backend

    @property
    def accuracy_met(self) -> bool | None:
        """Whether the true-kernel check's upper bound meets ``accuracy`` (``None``: not
        checked)."""
        target = self.options.get("accuracy")
        if target is None or self.true_kernel is None:
            return None
        return bool(self.true_kernel.bound <= target)

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

    potential_a = property(lambda self: self.potentials[0], doc="``log u``, shape (n,).")
    potential_b = property(lambda self: self.potentials[1], doc="``log v``, shape (m,).")
    marginal_a = property(lambda self: self.marginals[0], doc="Row sums of the plan, (n,).")
    marginal_b = property(lambda self: self.marginals[1], doc="Column sums of the plan, (m,).")

    @property
    def marginal_errors(self) -> tuple[float, float]:
        return (
            float(np.abs(self.marginals[0] - self.a).sum()),
            float(np.abs(self.marginals[1] - self.b).sum()),
        )

    @property
    def value(self) -> float:
        # reg KL(P | a b^T) = reg (<P 1, log u - log a> + <P^T 1, log v - log b>) - <P, M>
        #                     - reg (1^T P 1 - sum a sum b)
        row, col = self.marginals
        with np.errstate(divide="ignore", invalid="ignore"):  # -inf - -inf at zero weights
            log_a, log_b = np.log(self.a), np.log(self.b)
            entropic = _masked_dot(row, self.potentials[0] - log_a) + _masked_dot(
                col, self.potentials[1] - log_b
            )
        total_a, total_b = float(self.a.sum()), float(self.b.sum())
        value = self.reg * (entropic - self.mass + total_a * total_b)
        sides = zip(self.problem.penalties, self.marginals, (self.a, self.b), strict=True)
        for penalty, marginal, weights in sides:
            value += penalty.value(marginal, weights)
        return float(value)

    @property
    def value_dual(self) -> float:
        dual = _masked_dot(self.a, self.potentials[0]) + _masked_dot(self.b, self.potentials[1])
        with np.errstate(divide="ignore"):
            constant = _masked_dot(self.a, np.log(self.a)) + _masked_dot(self.b, np.log(self.b))
        total_a, total_b = float(self.a.sum()), float(self.b.sum())
        return self.reg * (dual - constant - self.mass + total_a * total_b)

    @property
    def advice(self) -> str:
        """What to change when the accuracy was missed or the iteration stopped early,
        computed from what was measured (:func:`sketchot.solver.advice.advise`); ``''``
        otherwise."""
        if self.converged and self.accuracy_met is not False:
            return ""
        return advise(self)

    @property
    def status(self) -> str:
        """``'converged'``, or why not (``'max_iter reached'``, ``'stalled'``, ...)."""
        return {"max_iter": "max_iter reached"}.get(self.stop, self.stop)

    # ----------------------------------------------------------------- plans
    @property
    def lazy_plan(self) -> LazyPlan:
        """The plan as a :class:`LazyPlan` (products and rows on demand)."""
        return LazyPlan(self.kernel, *self.potentials)

    @property
    def plan(self) -> Any:
        """The dense plan; only for problems whose ``n x m`` array fits 1 GiB. On a sparse
        cost matrix, a ``scipy.sparse.csr_array`` on its pattern (the allowed pairs; POT's
        sparse-cost EMD returns its plan sparse too), ``O(nnz)``."""
        g = self.kernel.geometry
        if hasattr(g, "plan_entries"):
            return g.plan_matrix(*self.potentials)
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
        return_fallbacks = check_bool(return_fallbacks, "return_fallbacks")
        g = self.kernel.geometry
        require_points(g, "barycentric_map")
        mapped = None if X_new is not None else self._map_from_moments(0)
        fallbacks = 0
        if mapped is None:
            mapped, fallbacks = barycentric(
                self.kernel, _points(X_new, g, "X_new"), self.potentials[1], g.Y
            )
        self._check_inside(mapped, g.Y, "Y")
        return (mapped, fallbacks) if return_fallbacks else mapped

    def inverse_barycentric_map(
        self, Y_new: Any = None, *, return_fallbacks: bool = False
    ) -> np.ndarray | tuple[np.ndarray, int]:
        """Barycentric projection of target points onto the source cloud ``X``."""
        return_fallbacks = check_bool(return_fallbacks, "return_fallbacks")
        g = self.kernel.geometry
        require_points(g, "inverse_barycentric_map")
        mapped = None if Y_new is not None else self._map_from_moments(1)
        fallbacks = 0
        if mapped is None:
            mapped, fallbacks = barycentric(
                self.kernel, _points(Y_new, g, "Y_new"), self.potentials[0], g.X, transpose=True
            )
        self._check_inside(mapped, g.X, "X")
        return (mapped, fallbacks) if return_fallbacks else mapped

    def moments(self) -> tuple[np.ndarray, np.ndarray]:
        """The plan's first moments ``(P Yc, P^T Xc)`` (see :attr:`plan_moments`): those the
        summary did not compute (``d`` log products a side for a log-domain approximation,
        :func:`~sketchot.solver.plans.first_moments`) are computed now and kept."""
        return self.moment(0), self.moment(1)

    def moment(self, side: int) -> np.ndarray:
        """One side of :meth:`moments`: ``P Yc`` (``side`` 0) or ``P^T Xc`` (1), computed once."""
        if side not in (0, 1):
            raise ValueError(f"side must be 0 (P Yc) or 1 (P^T Xc); got {side!r}")
        require_points(self.kernel.geometry, "the plan's first moments (moments)")
        moments = list(self.plan_moments)
        if moments[side] is None:
            moments[side] = first_moments(
                self.kernel, *self.potentials, self.marginals[side], transpose=side == 1
            )
            self.plan_moments = (moments[0], moments[1])
        return moments[side]

    def _map_from_moments(self, side: int) -> np.ndarray | None:
        """The fitted points' barycentric map ``(P Yc) / (P 1) + center`` (``side`` 0; 1 for
        the inverse map) from the plan's moments, or ``None`` when a denominator is too small
        to divide by (zero weights, an approximation's non-positive rows): those maps are
        recomputed by :func:`barycentric`."""
        marginal = self.marginals[side]
        scale = np.abs(marginal).max(initial=0.0)
        if not (marginal > max(MIN_DENOMINATOR_RATIO * scale, MIN_MAP_DENOMINATOR)).all():
            return None
        mapped = self.moment(side) / marginal[:, None] + self.kernel.geometry.center
        return mapped if np.all(np.isfinite(mapped)) else None

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
        return sampled_true_kernel_check(
            self.kernel, self.a, self.b, *self.potentials, n_samples, generator,
            self.problem.penalties,
        )  # fmt: skip

    def _check_inside(self, mapped: np.ndarray, cloud: np.ndarray, name: str) -> None:
        """A barycentric map lies in the convex hull of ``cloud``; points outside its bounding
        box (an approximation's overshoot) are impossible results."""
        low, high = cloud.min(axis=0), cloud.max(axis=0)
        slack = BOX_SLACK * np.maximum(high - low, np.abs(high) + np.abs(low)) + 1e-300
        outside = ~np.all((mapped >= low - slack) & (mapped <= high + slack), axis=1)
        count = int(np.count_nonzero(outside))
        if not count:
            return
        message = (
            f"backend {self.backend!r}: {count} of {mapped.shape[0]} mapped points fall outside "
            f"the bounding box of {name} (an exact entropic map stays inside its convex hull). "
            f"{advise(self)}"
        )
        if self.options.get("errors", "raise") == "raise":
            raise InvalidResultError(message + " Pass errors='warn' to get them anyway.")
        warnings.warn(message, InvalidResultWarning, stacklevel=user_stacklevel())

    def __repr__(self) -> str:
        err_a, err_b = self.marginal_errors
        return (
            f"SinkhornResult(backend={self.backend!r}, shape={self.kernel.shape}, "
            f"reg={self.reg:g}, n_iter={self.n_iter}, converged={self.converged}, "
            f"value_linear={self.value_linear:.6g}, marginal_errors=({err_a:.2e}, "
            f"{err_b:.2e}))"
        )


def _masked_dot(weights: np.ndarray, logs: np.ndarray) -> float:
    """``sum_i w_i log_i`` over entries with ``w_i != 0`` (``0 * -inf`` counts as 0)."""
    mask = weights != 0
    return float(weights[mask] @ logs[mask])


def _points(points: Any, geometry: Any, name: str) -> np.ndarray | None:
    """New points checked against the fitted clouds' dimension (``None`` passes through)."""
    if points is None:
        return None
    return check_matrix(
        points, name, n_features=geometry.X.shape[1], feature_name="the fitted points"
    )


# ------------------------------------------------------------- the caller's dtype
@dataclass(frozen=True)
class NumpyInDtype(ArrayContext):
    """NumPy results in the points' floating dtype (POT's convention: float32 clouds give
    float32 plans, potentials and values); the solve itself ran in float64."""

    def to_user(self, value: np.ndarray) -> np.ndarray:
        if value.dtype.kind == "f" and value.dtype != self.dtype:
            return value.astype(self.dtype)
        return value

    def wrap(self, value: Any) -> Any:
        if isinstance(value, np.ndarray):
            return self.to_user(value)
        if getattr(value, "format", None) == "csr" and value.dtype.kind == "f":  # sparse plan
            return value.astype(self.dtype) if value.dtype != self.dtype else value
        if isinstance(value, np.floating):
            return self.dtype.type(value)
        if isinstance(value, (tuple, list)):
            items = [self.wrap(item) for item in value]
            return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
        if type(value).__module__.split(".")[0] == "sketchot" and not isinstance(value, UserArrays):
            return UserArrays(value, self)
        return value


class ResultView(UserArrays):
    """A :class:`SinkhornResult` seen in the caller's arrays and dtype.

    Arrays (``plan``, ``potentials``, ``marginals``, maps, ...) come back in the caller's
    library and the points' floating dtype; ``value`` and ``value_linear`` are scalars of that
    dtype (NumPy scalars for NumPy float32 points, 0-d tensors for tensors, as POT's
    ``OTResult``). ``values`` overrides them (a ``value`` tensor attached to autograd:
    :mod:`sketchot._autograd`). ``isinstance(view, SinkhornResult)`` holds; ``view.host`` is
    the float64 result itself.
    """

    __slots__ = ("_values",)

    def __init__(
        self, host: Any, context: ArrayContext, values: dict[str, Any] | None = None
    ) -> None:
        super().__init__(host, context)
        object.__setattr__(self, "_values", dict(values or {}))

    def _scalar(self, name: str) -> Any:
        if name in self._values:
            return self._values[name]
        number = getattr(self._host, name)
        if self._context.library == "numpy":
            return self._context.dtype.type(number)
        return self._context.to_user(np.asarray(number, dtype=np.float64))

    @property
    def value(self) -> Any:
        """:attr:`SinkhornResult.value` in the caller's dtype (with its gradient on tensors
        that require one)."""
        return self._scalar("value")

    @property
    def value_linear(self) -> Any:
        """:attr:`SinkhornResult.value_linear` in the caller's dtype (no gradient: the
        envelope theorem gives the gradient of ``value``, not of ``<P, M>``)."""
        return self._scalar("value_linear")


def in_points_dtype(result: Any, context: ArrayContext, X: Any, Y: Any = None) -> Any:
    """``result`` as the caller sees it: a :class:`ResultView` for tensors (``context``, the
    inputs' :class:`~sketchot._arrays.ArrayContext`) and for NumPy float32 points (the first
    of ``X``, ``Y`` that is a float32 or float64 matrix decides); ``result`` unchanged for
    float64 NumPy points and other libraries' arrays (whose values stay Python floats)."""
    if isinstance(result, UserArrays):
        return ResultView(result.host, context) if context.library == "torch" else result
    dtype = next(
        (p.dtype for p in (X, Y) if isinstance(p, np.ndarray) and p.ndim == 2
         and p.dtype in (np.float32, np.float64)),
        np.dtype(np.float64),
    )  # fmt: skip
    if dtype == np.float64 or not isinstance(result, SinkhornResult):
        return result
    return ResultView(result, NumpyInDtype("numpy", np, "cpu", np.dtype(dtype)))
