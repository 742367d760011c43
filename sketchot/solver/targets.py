"""Several targets on one kernel: POT's ``b`` of shape ``(m, k)``, ``k`` problems solved
together with ONE matrix product per half-iteration.

The ``k`` problems share the source weights ``a``, the kernel and ``reg``; target ``j`` has
the weights ``b[:, j]``. The scalings are ``(n, k)`` and ``(m, k)`` arrays and each
half-iteration is one product ``K @ V`` (or ``K^T @ U``) with the ``k`` columns of the
targets still running (the contract's ``matmat`` / ``rmatmat``: BLAS-3 on a stored kernel,
``O((n + m) r k)`` on a rank-``r`` one), in POT's order (``v`` first, from ``u = 1/n``)::

    v <- (b / K^T u)^rho_b,    u <- (a / K v)^rho_a,    rho = reg_m / (reg_m + reg).

**Per target.** Each target has its own residual, the engine's (:mod:`.engine`): at a check,
``||K^T u * (v - v_next)||`` (POT's column-marginal error for balanced transport) relative
to ``sum(a)`` (``'l1'``, the accuracy's rule) or to ``sum(b[:, j])`` (``'l2'``, a caller's
``tol``), its own stop (converged, stalled by the engine's rule, max_iter) and its own
iteration count: a target that stopped stops changing and leaves the products. Each target
is certified on its own (the true-kernel check: exhaustive from the plan's marginals for
the exact kernel, on rows and columns sampled once and shared by the targets otherwise).

**Small reg.** On a kernel with the ``'absorb'`` capability (the exact kernel, on points
or on a cost matrix) the products run on ``diag(e^alpha) K diag(e^beta)`` with offsets
SHARED by the targets (the median over the running targets of each row's and column's
log-scaling), re-absorbed when a running target's relative scaling leaves ``[e^-tau,
e^tau]`` (Schmitzer 2019, with one absorbed kernel for all targets), and a cold start at a
large ``max_cost / reg`` runs the engine's epsilon schedule (:func:`.engine.epsilon_schedule`)
on all targets at once. A target whose scalings cannot share the offsets (its relative
products vanish: a breakdown), or whose products go non-positive on a signed approximation,
is solved again alone by :func:`~sketchot.solver.sinkhorn.solve` (safeguard, log-domain
passes, Newton stage), and the result says so in ``notes``.

Anderson mixing (:class:`~sketchot.solver.acceleration.AndersonMixer`, ``anderson``) runs
on each target's column log-scalings on its own, as in the single solve. Not here: the
Newton stage and the coarse-to-fine start of the single solve (``coarse_to_fine=True`` is
refused by name), the symmetric iteration.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._defaults import DEFAULT_ACCURACY
from .._validation import (
    RenamableValueError,
    check_int,
    check_rng,
    describe,
    user_stacklevel,
)
from ..cost_matrix import has_points
from ..kernels import KernelOperator, build_kernel, require_policy
from ..kernels.judge import Verdict, candidate_rng
from .acceleration import AndersonMixer
from .engine import STAGE_TOL, annealing_kernels
from .errors import AccuracyWarning, InvalidResultError, InvalidResultWarning
from .options import SolverOptions
from .penalties import Penalty, make_penalty
from .plans import (
    TrueKernelCheck,
    check_from_masses,
    plan_summary,
    sample_indices,
    true_kernel_check,
)
from .problem import Problem, check_reg_m, make_problem
from .sinkhorn import (
    EPSILON_SCALING_SPREAD,
    EXHAUSTIVE_CHECK_ENTRIES,
    LOWER_BOUND_RTOL,
    SAMPLED_CHECK_SIZE,
    check_backend_params,
    check_kernel_metric,
    check_problem,
    solve,
)
from .stopping import STALL_CHECKS, STALL_IMPROVEMENT, STALL_ITERATIONS
from .strategies import ABSORB_THRESHOLD

#: A target whose relative log-scalings (to the shared offsets) exceed this in absolute
#: value leaves the shared iteration (solved alone) and the shared summary: a plan entry of
#: at least ``e^-30`` then has an absorbed kernel entry above ``e^(-30 - 2 * 330)``, above
#: the absorbed kernel's floor (``e^-708`` in float64), so no such entry is lost.
SHARED_RANGE = 330.0

#: The shared offsets are moved when a running target's relative log-scaling exceeds this
#: (the single solve's ``tau`` when the targets are alike; more when they differ, since
#: the median offsets cannot bring every target nearer).
SHARED_TRIGGER = 250.0

#: Entries per row block of the summary's passes over the exact kernel.
SUMMARY_BLOCK_ENTRIES = 1 << 20


# ------------------------------------------------------------------------------- problem
@dataclass(frozen=True)
class TargetsProblem:
    """``k`` problems on one kernel: ``a`` (n,), ``B`` (m, k), ``reg``, the penalties and an
    optional warm start ``(log_u0, log_v0)`` of shapes (n, k), (m, k)."""

    a: np.ndarray
    B: np.ndarray
    reg: float
    reg_m: tuple[float, float]
    log_u0: np.ndarray | None = None
    log_v0: np.ndarray | None = None
    notes: tuple[str, ...] = ()

    @property
    def k(self) -> int:
        """The number of targets."""
        return int(self.B.shape[1])

    @property
    def balanced(self) -> bool:
        """Whether both marginals are hard constraints."""
        return math.isinf(self.reg_m[0]) and math.isinf(self.reg_m[1])

    @property
    def penalties(self) -> tuple[Penalty, Penalty]:
        """The KL penalties (or hard constraints) of the two sides: the targets' iteration
        raises its ratios to powers, so it solves KL penalties only."""
        return tuple(make_penalty(r, "KL") for r in self.reg_m)

    @property
    def exponents(self) -> tuple[float, float]:
        """``(rho_a, rho_b)`` (1 for a hard side)."""
        return tuple(p.exponent(self.reg) for p in self.penalties)

    def column(self, j: int, log_u0: Any = None, log_v0: Any = None) -> Problem:
        """Target ``j`` as a one-target :class:`Problem` (for a solve alone)."""
        return Problem(self.a, self.B[:, j], self.reg, self.reg_m, log_u0, log_v0)

    def at_reg(self, reg: float) -> TargetsProblem:
        """The same targets at another ``reg`` (a stage of the epsilon schedule)."""
        return TargetsProblem(self.a, self.B, reg, self.reg_m, notes=self.notes)


def several_targets(b: Any) -> bool:
    """Whether ``b`` holds targets as columns: a 2-D array-like (POT's ``n_hists`` rule:
    ``(m, 1)`` is one target solved as such, with ``(1,)`` values)."""
    if b is None:
        return False
    shape = getattr(b, "shape", None)
    if shape is None and isinstance(b, (list, tuple)):
        try:
            shape = np.shape(b)
        except ValueError:  # ragged: the weights' own check names it
            return False
    return shape is not None and len(shape) == 2


def check_targets(b: Any, m: int, name: str = "b") -> np.ndarray:
    """``b`` as a float64 ``(m, k)`` array (a copy: never written), or a ``ValueError`` /
    ``TypeError`` naming ``name``, what was expected and what was received."""
    try:
        array = np.asarray(b)
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"{name} must be a real array of shape ({m}, k); got {describe(b)}"
        ) from error
    if array.dtype.kind not in "biuf":
        raise TypeError(
            f"{name} must be a real array of shape ({m}, k) (k targets' weights); got {describe(b)}"
        )
    if array.ndim != 2 or array.shape[0] != m or array.shape[1] < 1:
        raise ValueError(
            f"{name} must have shape ({m}, k): one column of {m} weights per target (POT's "
            f"several histograms); got shape {array.shape}"
        )
    return np.array(array, dtype=np.float64, order="F")


def make_targets(
    a: Any,
    b: Any,
    shape: tuple[int, int],
    reg: Any,
    reg_m: Any = None,
    *,
    log_u0: Any = None,
    log_v0: Any = None,
) -> TargetsProblem:
    """Validate ``a`` (n,), ``b`` (m, k), ``reg``, ``reg_m`` and a warm start of shapes
    (n, k), (m, k) for ``k`` problems on a kernel of ``shape``.

    Each column is checked as one target's weights (:func:`make_problem`). Balanced
    transport needs every column's mass equal to ``sum(a)`` (up to the single solve's
    tolerance, then rescaled): POT's ``sinkhorn`` takes other masses silently and returns
    the values of the columns rescaled to ``sum(a)``; here they are refused, naming the
    columns (rescale them, or pass a finite ``reg_m``).
    """
    B = check_targets(b, shape[1])
    pair = check_reg_m(reg_m, reg)
    starts = _check_target_start(log_u0, log_v0, B.shape[1], shape)
    a_checked = make_problem(a, None, shape, reg, reg_m).a  # a's own checks, by name
    if math.isinf(pair[0]) and math.isinf(pair[1]):
        masses = B.sum(axis=0)
        wrong = np.flatnonzero(~np.isclose(masses, a_checked.sum(), rtol=1e-6, atol=0.0))
        if wrong.size and np.all(np.isfinite(B)) and np.all(B >= 0):
            shown = ", ".join(f"b[:, {j}] sums to {masses[j]:.8g}" for j in wrong[:3])
            more = f" (and {wrong.size - 3} more)" if wrong.size > 3 else ""
            raise RenamableValueError(
                f"every column of b must have the mass of a (sum(a) = {a_checked.sum():.8g}) "
                f"for balanced transport ({{reg_m}}=None); got {shown}{more}. POT's sinkhorn "
                "rescales such columns to sum(a) silently; rescale them "
                "(b / b.sum(axis=0) * a.sum()), or pass a finite {reg_m} for unbalanced "
                "transport",
                reg_m="reg_m",
            )
    columns, notes, rescaled = [], [], []
    for j in range(B.shape[1]):
        try:
            problem = make_problem(
                a_checked, B[:, j], shape, reg, reg_m,
                log_u0=None if starts is None else starts[0][:, j],
                log_v0=None if starts is None else starts[1][:, j],
            )  # fmt: skip
        except ValueError as error:
            raise type(error)(f"b[:, {j}]: {error}") from None
        columns.append(problem.b)
        if problem.notes:
            rescaled.append(j)
    B = np.column_stack(columns) if columns else B
    if rescaled:
        notes.append(
            f"{len(rescaled)} column(s) of b were rescaled to the mass of a (within the "
            f"single solve's tolerance): columns {_columns(rescaled)}"
        )
    return TargetsProblem(
        a_checked, B, float(reg), pair, *(starts or (None, None)), notes=tuple(notes)
    )


def _check_target_start(log_u0, log_v0, k, shape):
    """A warm start of ``k`` targets: both or neither, shapes (n, k) and (m, k)."""
    if log_u0 is None and log_v0 is None:
        return None
    if log_u0 is None or log_v0 is None:
        raise ValueError(
            "warmstart must be None or a pair (log_u, log_v) of shapes (n, k) and (m, k); got "
            "one of them None"
        )
    out = []
    for index, value, size in ((0, log_u0, shape[0]), (1, log_v0, shape[1])):
        array = np.asarray(value, dtype=np.float64)
        if array.shape != (size, k):
            raise ValueError(
                f"warmstart[{index}] must have shape ({size}, {k}) with {k} targets (a "
                f"previous result's potentials[{index}]); got shape {array.shape}"
            )
        out.append(array)
    return out


# ------------------------------------------------------------------------------- result
@dataclass
class TargetsResult:
    """The ``k`` solves of :func:`solve_targets`, in POT's conventions for several
    histograms: ``value_linear`` holds the ``k`` values ``<P_j, M>`` (what POT's
    ``sinkhorn`` and ``sinkhorn2`` return for a ``b`` of shape ``(m, k)``), the potentials
    and marginals have one column per target.

    Attributes
    ----------
    kernel : KernelOperator
    problem : TargetsProblem
    potentials : tuple of ndarray
        ``(log_u, log_v)``, shapes (n, k), (m, k) (POT's ``log['log_u']``, ``log['log_v']``;
        ``P_j = diag(u_j) K diag(v_j)``).
    value_linear : ndarray, shape (k,)
        ``<P_j, M>``.
    marginals : tuple of ndarray
        ``(P_j 1, P_j^T 1)`` stacked: shapes (n, k), (m, k).
    mass : ndarray, shape (k,)
    n_iter : ndarray of int, shape (k,)
        Iterations each target ran (over every stage).
    stops : list of str
        Why each target stopped: ``'converged'``, ``'max_iter'``, ``'stalled'``, ...
    tol : float
        The residual each target stopped at (the stopping rule's).
    true_kernel : list of TrueKernelCheck or None
        Each target's check against the exact kernel (``None``: no ``accuracy``).
    """

    kernel: KernelOperator
    problem: TargetsProblem
    potentials: tuple[np.ndarray, np.ndarray]
    value_linear: np.ndarray
    marginals: tuple[np.ndarray, np.ndarray]
    mass: np.ndarray
    n_iter: np.ndarray
    stops: list[str]
    tol: float
    true_kernel: list[TrueKernelCheck] | None
    options: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    error_history: list[tuple[int, float]] = field(default_factory=list)
    iteration_info: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    attempts: list[Any] = field(default_factory=list)
    replay: dict[str, Any] = field(default_factory=dict)
    #: POT's ``ot.solve`` regulariser (``'kl'`` or ``'entropy'``) when ``value`` is to be
    #: POT's balanced value (:meth:`pot_value`); ``None``: the generalised objective.
    regulariser: str | None = None

    @property
    def backend(self) -> str:
        """The kernel's backend."""
        return self.kernel.info.backend

    @property
    def n_targets(self) -> int:
        """``k``."""
        return self.problem.k

    @property
    def reg(self) -> float:
        return self.problem.reg

    @property
    def reg_m(self) -> tuple[float, float]:
        return self.problem.reg_m

    @property
    def a(self) -> np.ndarray:
        return self.problem.a

    @property
    def b(self) -> np.ndarray:
        """The targets' weights, shape (m, k)."""
        return self.problem.B

    @property
    def converged(self) -> np.ndarray:
        """Whether each target converged, shape (k,)."""
        return np.array([stop == "converged" for stop in self.stops])

    @property
    def status(self) -> list[str]:
        """Each target's status: ``'converged'``, or why not (``'max_iter reached'``, ...)."""
        return [{"max_iter": "max_iter reached"}.get(stop, stop) for stop in self.stops]

    @property
    def accuracy_met(self) -> np.ndarray | None:
        """Whether each target's true-kernel bound meets ``accuracy`` (``None``: no check)."""
        target = self.options.get("accuracy")
        if target is None or self.true_kernel is None:
            return None
        return np.array([check.bound <= target for check in self.true_kernel])

    @property
    def potential_a(self) -> np.ndarray:
        """``log u``, shape (n, k)."""
        return self.potentials[0]

    @property
    def potential_b(self) -> np.ndarray:
        """``log v``, shape (m, k)."""
        return self.potentials[1]

    @property
    def marginal_a(self) -> np.ndarray:
        return self.marginals[0]

    @property
    def marginal_b(self) -> np.ndarray:
        return self.marginals[1]

    @property
    def value(self) -> np.ndarray:
        """Each target's objective ``<P, M> + reg KL(P | a b^T)`` plus the marginal
        penalties (the generalised KL, as :attr:`SinkhornResult.value`), shape (k,); from
        :func:`sketchot.solve`, balanced, POT's value (:meth:`pot_value`)."""
        if self.regulariser is not None and self.problem.balanced:
            return self.pot_value(self.regulariser)
        row, col = self.marginals
        log_u, log_v = self.potentials
        with np.errstate(divide="ignore", invalid="ignore"):
            log_a, log_b = np.log(self.a)[:, None], np.log(self.b)
            entropic = _masked_sum(row, log_u - log_a) + _masked_sum(col, log_v - log_b)
        totals = float(self.a.sum()) * self.b.sum(axis=0)
        value = self.reg * (entropic - self.mass + totals)
        for penalty, marginal, weights in zip(
            self.reg_m, self.marginals, (self.a[:, None], self.b), strict=True
        ):
            if np.isfinite(penalty):
                value = value + penalty * _kl_columns(marginal, weights)
        return value

    def pot_value(self, regulariser: str = "kl") -> np.ndarray:
        """POT's balanced ``ot.solve`` value of each target: ``<P, M> + reg sum P log(P /
        (a b^T))`` (``'kl'``) or ``<P, M> + reg sum P log P`` (``'entropy'``)."""
        row, col = self.marginals
        log_u, log_v = self.potentials
        entropy = _masked_sum(row, log_u) + _masked_sum(col, log_v)
        if regulariser == "kl":
            with np.errstate(divide="ignore"):
                entropy = entropy - _masked_sum(row, np.log(self.a)[:, None])
                entropy = entropy - _masked_sum(col, np.log(self.b))
        return self.reg * entropy

    @property
    def plan(self) -> Any:
        """Refused: POT returns the ``k`` values for several histograms, not ``k`` plans."""
        raise NotImplementedError(
            "several targets (b of shape (m, k)) give k values (value_linear, POT's return "
            "value for several histograms) and potentials of shapes (n, k), (m, k), not k "
            "plans; the plan of target j is exp(log_u[:, j, None] + log_v[None, :, j] - M / "
            "reg), or solve that column alone for its SinkhornResult"
        )

    @property
    def log(self) -> dict[str, Any]:
        """POT's ``log`` of several histograms: ``'u'``, ``'v'``, ``'log_u'``, ``'log_v'``
        (shapes (n, k), (m, k)), ``'niter'`` (the most iterations of a target) and
        ``'err'`` (the checks' largest residual over the running targets)."""
        log_u, log_v = self.potentials
        return {
            "u": np.exp(log_u),
            "v": np.exp(log_v),
            "log_u": log_u,
            "log_v": log_v,
            "niter": int(self.n_iter.max(initial=0)),
            "err": [error for _, error in self.error_history],
        }

    def __repr__(self) -> str:
        n, m = self.kernel.shape
        done = int(self.converged.sum())
        return (
            f"<TargetsResult {self.n_targets} targets {n}x{m} backend={self.backend!r} "
            f"reg={self.reg:g} converged={done}/{self.n_targets}>"
        )


def _masked_sum(weights: np.ndarray, logs: np.ndarray) -> np.ndarray:
    """``sum_i w_ij log_ij`` per column over ``w_ij != 0`` (``0 log 0 = 0``)."""
    logs = np.broadcast_to(logs, weights.shape)
    return np.where(weights != 0, weights * np.where(weights != 0, logs, 0.0), 0.0).sum(axis=0)


def _kl_columns(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The generalised ``KL(p | q) = sum p log(p / q) - p + q`` per column."""
    q = np.broadcast_to(q, p.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * np.log(p / q), 0.0)
    return (terms - p + q).sum(axis=0)


# ---------------------------------------------------------------------------- iteration
@dataclass
class _Run:
    """The state a run of the shared iteration leaves: absolute log-scalings, per target
    the iterations, the stop and the last residual."""

    log_u: np.ndarray
    log_v: np.ndarray
    n_iter: np.ndarray
    stops: list[str]
    errors: np.ndarray
    history: list[tuple[int, float]]
    absorptions: int = 0


def _span(logs: np.ndarray) -> np.ndarray:
    """Each column's largest finite ``|log|`` (0 for none)."""
    return np.max(np.where(np.isfinite(logs), np.abs(logs), 0.0), axis=0, initial=0.0)


def _offsets(logs: np.ndarray) -> np.ndarray:
    """Each row's median over the columns of its finite log-scalings (0 when none is
    finite: a zero weight)."""
    finite = np.isfinite(logs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows: zero weights
        median = np.nanmedian(np.where(finite, logs, np.nan), axis=1)
    return np.where(np.isfinite(median), median, 0.0)


def _ratios(weights, positive, products, exponent, offset):
    """The update ``w p^-rho e^((rho - 1) offset)`` in the offsets' frame (the engine's
    ``u = a (K v)^-rho``: the reference measure ``a b^T``), 0 where ``w = 0``, and the mask
    of the columns with a bad product (not positive or not finite where ``w > 0``)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        healthy = (products > 0) & np.isfinite(products)
        denominator = np.where(healthy, products, 1.0)
        if exponent != 1.0:
            denominator **= exponent
        out = np.where(positive & healthy, weights / denominator, 0.0)
        if exponent != 1.0:
            out *= np.exp((exponent - 1.0) * offset)[:, None]
    bad = np.any(positive & ~healthy, axis=0) | ~np.all(np.isfinite(out), axis=0)
    return out, bad


def _iterate(
    kernel: KernelOperator,
    problem: TargetsProblem,
    start: tuple[np.ndarray, np.ndarray] | None,
    *,
    tol: float,
    norm: str,
    max_iter: int,
    check_every: int,
    absorb: bool,
    memory: int = 0,
    offset: int = 0,
    printer: Any = None,
    running: np.ndarray | None = None,
) -> _Run:
    """The shared iteration at ``problem.reg`` on ``kernel`` (see the module notes)."""
    n, m = kernel.shape
    k = problem.k
    a, B = problem.a, problem.B
    rho_a, rho_b = problem.exponents
    A = np.broadcast_to(a[:, None], (n, k))
    a_pos, B_pos = A > 0, B > 0
    with np.errstate(divide="ignore"):
        if start is None:  # POT's start: u = 1/n (zero weights: u = 0)
            log_u = np.where(a_pos, -math.log(n), -np.inf)
            log_v = np.zeros((m, k))
        else:
            log_u, log_v = (np.array(side, dtype=np.float64) for side in start)
    mass = float(a.sum()) if norm == "l1" else B.sum(axis=0)
    mass = np.broadcast_to(np.asarray(mass, dtype=np.float64), (k,))
    tau = ABSORB_THRESHOLD.get(kernel.dtype, 20.0)
    # targets that broke down at an earlier stage stay out (solved alone at the end)
    active = np.ones(k, dtype=bool) if running is None else running.copy()
    stops = ["max_iter" if on else "breakdown" for on in active]
    n_iter = np.zeros(k, dtype=np.int64)
    errors = np.full(k, np.nan)
    best, best_check, best_iter = np.full(k, np.inf), np.zeros(k, int), np.zeros(k, int)
    checks = np.zeros(k, int)
    history: list[tuple[int, float]] = []
    absorptions = 0
    mixers: dict[int, AndersonMixer] = {}
    trigger = tau

    def frame(cols):
        alpha = _offsets(log_u[:, cols]) if absorb else np.zeros(n)
        beta = _offsets(log_v[:, cols]) if absorb else np.zeros(m)
        return alpha, beta

    alpha, beta = frame(np.flatnonzero(active))
    operator = kernel.absorbed(alpha, beta) if absorb else kernel
    with np.errstate(over="ignore", invalid="ignore"):
        U = np.exp(log_u - alpha[:, None])
        V = np.exp(log_v - beta[:, None])

    def freeze(cols) -> None:
        with np.errstate(divide="ignore"):
            log_u[:, cols] = alpha[:, None] + np.log(U[:, cols])
            log_v[:, cols] = beta[:, None] + np.log(V[:, cols])

    iteration = 0
    while iteration < max_iter and active.any():
        iteration += 1
        idx = np.flatnonzero(active)
        with np.errstate(over="ignore", invalid="ignore"):
            KtU = operator.rmatmat(U[:, idx])
        V_next, bad = _ratios(B[:, idx], B_pos[:, idx], KtU, rho_b, beta)
        stop_now = np.zeros(idx.size, dtype=bool)
        if iteration % check_every == 0 or iteration == max_iter:
            with np.errstate(over="ignore", invalid="ignore"):
                diff = KtU * (V[:, idx] - V_next)
                diff[~B_pos[:, idx] & ~np.isfinite(diff)] = 0.0
                scale = np.max(np.abs(diff), axis=0, initial=0.0)
                safe = np.where((scale > 0) & np.isfinite(scale), scale, 1.0)
                order = 1 if norm == "l1" else 2
                err = safe * np.linalg.norm(diff / safe, ord=order, axis=0) / mass[idx]
            err = np.where(bad, np.inf, err)
            errors[idx] = err
            finite = err[np.isfinite(err)]
            if finite.size:
                history.append((offset + iteration, float(finite.max())))
            for pos, j in enumerate(idx):
                e = err[pos]
                if not np.isfinite(e):
                    stops[j], stop_now[pos] = "breakdown", True
                    continue
                checks[j] += 1
                if e < tol:
                    stops[j], stop_now[pos] = "converged", True
                elif e < STALL_IMPROVEMENT * best[j]:
                    best[j], best_check[j], best_iter[j] = e, checks[j], iteration
                elif (
                    checks[j] - best_check[j] >= STALL_CHECKS
                    and iteration - best_iter[j] >= STALL_ITERATIONS
                ):
                    stops[j], stop_now[pos] = "stalled", True
            if printer is not None and finite.size:
                printer(offset + iteration, float(finite.max()), int(active.sum()))
        else:
            for pos in np.flatnonzero(bad):
                stops[idx[pos]], stop_now[pos] = "breakdown", True
        stopped = idx[stop_now]
        n_iter[stopped] = iteration
        if stopped.size:
            freeze(stopped)
            active[stopped] = False
        keep = ~stop_now
        cont = idx[keep]
        if not cont.size:
            break
        V_before = V[:, cont].copy()
        V_next = V_next[:, keep]
        if memory:  # each target's column log-scalings Anderson-mixed on their own
            with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
                for pos, j in enumerate(cont):
                    if j not in mixers:
                        mixers[j] = AndersonMixer(memory, B_pos[:, j])
                    x = beta + np.log(V_before[:, pos])
                    mixed = mixers[j].step(x, beta + np.log(V_next[:, pos]))
                    V_next[:, pos] = np.exp(mixed - beta)
        V[:, cont] = V_next
        with np.errstate(over="ignore", invalid="ignore"):
            KV = operator.matmat(V[:, cont])
        U_next, bad = _ratios(A[:, cont], a_pos[:, cont], KV, rho_a, alpha)
        if bad.any():  # a vanished product: the last good iterate, solved alone later
            broken = cont[bad]
            V[:, broken] = V_before[:, bad]
            for j in broken:
                stops[j] = "breakdown"
            n_iter[broken] = iteration
            freeze(broken)
            active[broken] = False
            cont, U_next = cont[~bad], U_next[:, ~bad]
        U[:, cont] = U_next
        if absorb and cont.size:
            with np.errstate(divide="ignore"):
                lu, lv = np.log(U[:, cont]), np.log(V[:, cont])
            top = max(_span(lu).max(initial=0.0), _span(lv).max(initial=0.0))
            if top > trigger:  # move the running targets' scalings into the shared offsets
                freeze(cont)
                alpha, beta = frame(cont)
                operator = kernel.absorbed(alpha, beta, operator)
                absorptions += 1
                with np.errstate(over="ignore", invalid="ignore"):
                    lu = log_u[:, cont] - alpha[:, None]
                    lv = log_v[:, cont] - beta[:, None]
                    U[:, cont], V[:, cont] = np.exp(lu), np.exp(lv)
                spans = np.maximum(_span(lu), _span(lv))
                far = spans > SHARED_RANGE  # too far from the others: solved alone later
                for j in cont[far]:
                    stops[j] = "breakdown"
                n_iter[cont[far]] = iteration
                active[cont[far]] = False
                # targets that differ keep a wider margin: no absorption at every iteration
                near = spans[~far]
                trigger = max(tau, min(SHARED_RANGE, near.max(initial=0.0) + tau / 2))
    running = np.flatnonzero(active)
    n_iter[running] = iteration
    freeze(running)
    return _Run(log_u, log_v, n_iter, stops, errors, history, absorptions)


def _scheduled(kernel, problem, stages, start, *, tol, norm, max_iter, check_every, absorb,
               memory, printer):  # fmt: skip
    """The epsilon schedule's stages (kernels at larger ``reg``), then ``kernel``: all
    targets together, warm-started in cost units (``f = reg log u``), the budget shared."""
    used, history, info, absorptions = 0, [], [], 0
    totals = np.zeros(problem.k, dtype=np.int64)
    f = g = None
    if start is not None:
        f, g = problem.reg * start[0], problem.reg * start[1]
    run = None
    running = np.ones(problem.k, dtype=bool)
    for stage in [*stages, kernel]:
        last = stage is kernel
        reg = stage.geometry.reg
        begin = None if f is None else (f / reg, g / reg)
        run = _iterate(
            stage, problem.at_reg(reg), begin, tol=tol if last else max(tol, STAGE_TOL),
            norm=norm, max_iter=max_iter - used, check_every=check_every if last else 1,
            absorb=absorb, memory=memory, offset=used, printer=printer, running=running,
        )  # fmt: skip
        running &= np.array([stop != "breakdown" for stop in run.stops])
        stage_iter = int(run.n_iter.max(initial=0))
        used += stage_iter
        totals += run.n_iter
        history += run.history
        absorptions += run.absorptions
        info.append({"reg": reg, "n_iter": stage_iter,
                     "converged": int(sum(s == "converged" for s in run.stops))})  # fmt: skip
        f, g = reg * run.log_u, reg * run.log_v
        if used >= max_iter and not last:
            stops = ["max_iter" if on else "breakdown" for on in running]
            run = _Run(f / problem.reg, g / problem.reg, totals, stops, run.errors, history,
                       absorptions)  # fmt: skip
            break
    run.n_iter, run.history, run.absorptions = totals, history, absorptions
    return run, info


# -------------------------------------------------------------------------------- solve
def solve_targets(
    problem: TargetsProblem,
    kernel: KernelOperator,
    options: SolverOptions,
    *,
    rng: Any = None,
) -> TargetsResult:
    """Solve ``problem``'s ``k`` targets on ``kernel`` (module notes): iterate together,
    solve alone a target that broke down, summarise, certify each target.

    Parameters
    ----------
    problem : TargetsProblem
        From :func:`make_targets`.
    kernel : KernelOperator
        Built for ``problem``'s shape and ``reg``.
    options : SolverOptions
        The solver's options (``anderson`` and ``coarse_to_fine=True`` are refused).
    rng : int, Generator or None
        Draws of the sampled true-kernel check.

    Returns
    -------
    TargetsResult
    """
    _refuse_options(options)
    k = problem.k
    caps = kernel.info.capabilities
    absorb = "absorb" in caps and options.log_domain is not False
    if options.log_domain is True and not absorb:
        raise NotImplementedError(
            "log_domain=True with several targets needs a kernel with the 'absorb' capability "
            f"(the exact kernel); backend {kernel.info.backend!r} has none: pass "
            "log_domain='auto', or solve each column of b alone"
        )
    exact = "exact" in caps and hasattr(kernel, "at_reg")
    if options.epsilon_scaling is True and not exact:
        raise ValueError(
            "epsilon_scaling=True needs a kernel with the 'exact' capability (the kernel must "
            f"represent every intermediate reg); backend {kernel.info.backend!r} does not"
        )
    tol, norm = options.stopping(
        kernel.dtype == np.float32,
        lambda: float(np.max(np.linalg.norm(problem.B, axis=0) / problem.B.sum(axis=0))),
    )
    g = kernel.geometry
    cold = problem.log_u0 is None
    wanted = options.epsilon_scaling is True or (
        options.epsilon_scaling == "auto" and exact and absorb and cold
        and g.max_cost() / g.reg > EPSILON_SCALING_SPREAD
    )  # fmt: skip
    stages = annealing_kernels(kernel) if wanted else []
    every = options.check_interval(kernel.shape)
    memory = options.anderson_memory(absorb)
    notes = list(problem.notes)
    printer = _printer(options.verbose, k)
    start_time = time.perf_counter()
    start = None if cold else (problem.log_u0, problem.log_v0)
    # kernels that bound their own error stop first nearer the accuracy, then certify
    first = options.first_target(tol, norm, kernel.info.product_rtol)
    run, stage_info = _scheduled(
        kernel, problem, stages, start, tol=first, norm=norm, max_iter=options.max_iter,
        check_every=every, absorb=absorb, memory=memory, printer=printer,
    )  # fmt: skip
    alone = [j for j in range(k) if run.stops[j] == "breakdown"]
    if alone:
        _solve_alone(alone, problem, kernel, options, rng, run)
        notes.append(
            f"{len(alone)} target(s) broke down in the shared iteration (their scalings left "
            f"the range the shared offsets represent, or a product vanished) and were solved "
            f"alone: columns {_columns(alone)}"
        )
    elapsed = time.perf_counter() - start_time
    row, col, cost, mass = _summaries(kernel, run.log_u, run.log_v)
    checks = None
    if options.accuracy is not None:
        checks = _checks(kernel, problem, run.log_u, run.log_v, row, col, options, rng)
    stops = [j for j in range(k) if run.stops[j] == "converged"]
    missed = [j for j in stops if first > tol and checks[j].bound > options.accuracy]
    if missed:  # the check's margin missed: these targets go on to the full fraction, warm
        resumed = time.perf_counter()
        _resume(kernel, problem, run, missed, tol=tol, norm=norm, options=options,
                check_every=every, absorb=absorb, memory=memory, printer=printer)  # fmt: skip
        elapsed += time.perf_counter() - resumed
        notes.append(
            f"{len(missed)} target(s) stopped first at residual {first:.2g}, where the "
            f"true-kernel check missed accuracy {options.accuracy:g}; went on to {tol:.2g}: "
            f"columns {_columns(missed)}"
        )
        row, col, cost, mass = _summaries(kernel, run.log_u, run.log_v)
        checks = _checks(kernel, problem, run.log_u, run.log_v, row, col, options, rng)
    else:
        tol = first
    log_u, log_v = run.log_u, run.log_v
    result = TargetsResult(
        kernel=kernel,
        problem=problem,
        potentials=(log_u, log_v),
        value_linear=cost,
        marginals=(row, col),
        mass=mass,
        n_iter=run.n_iter,
        stops=list(run.stops),
        tol=tol,
        true_kernel=checks,
        options=options.as_dict(),
        notes=notes,
        timings={
            "build": kernel.info.build_time,
            "iterations": elapsed,
            "per_iteration": elapsed / max(int(run.n_iter.max(initial=0)), 1),
        },
        error_history=run.history,
        iteration_info={
            "strategy": "absorb" if absorb else "multiplicative",
            "norm": norm,
            "absorptions": run.absorptions,
            "anderson": memory,
            "stages": stage_info,
            "alone": alone,
        },
    )
    _finish(result, options)
    return result


def _refuse_options(options: SolverOptions) -> None:
    """The single solve's accelerations that the shared iteration does not run."""
    if options.coarse_to_fine is True:
        raise NotImplementedError(
            "coarse_to_fine=True is not implemented with several targets (b of shape (m, k)); "
            "pass coarse_to_fine='auto' or False"
        )


def _columns(index: list[int]) -> str:
    shown = ", ".join(str(j) for j in index[:10])
    return shown + (f" (and {len(index) - 10} more)" if len(index) > 10 else "")


def _resume(kernel, problem, run, columns, *, tol, norm, options, check_every, absorb,
            memory, printer) -> None:  # fmt: skip
    """Run the targets ``columns`` on from their potentials to ``tol`` and write the
    outcome into ``run``."""
    cols = np.asarray(columns)
    sub = TargetsProblem(problem.a, problem.B[:, cols], problem.reg, problem.reg_m)
    used = int(run.n_iter.max(initial=0))
    more = _iterate(
        kernel, sub, (run.log_u[:, cols], run.log_v[:, cols]), tol=tol, norm=norm,
        max_iter=max(options.max_iter - used, 1), check_every=check_every, absorb=absorb,
        memory=memory, offset=used, printer=printer,
    )  # fmt: skip
    run.log_u[:, cols], run.log_v[:, cols] = more.log_u, more.log_v
    run.n_iter[cols] += more.n_iter
    for pos, j in enumerate(cols):
        run.stops[j] = more.stops[pos]
    run.history += more.history
    run.absorptions += more.absorptions


def _solve_alone(columns, problem, kernel, options, rng, run) -> None:
    """Solve the targets ``columns`` one by one with the single solve (its safeguard,
    log-domain passes, Newton stage), cold, and write their potentials into ``run``."""
    from dataclasses import replace

    quiet = replace(options, warn=False, errors="warn", verbose=False)
    for j in columns:
        single = solve(problem.column(j), kernel, quiet, rng=rng)
        run.log_u[:, j], run.log_v[:, j] = single.potentials
        run.n_iter[j] += single.n_iter
        run.stops[j] = single.stop


def _printer(verbose: bool, k: int):
    if not verbose:
        return None

    def show(iteration: int, error: float, running: int) -> None:
        print(f"  {iteration:6d}  largest residual {error:.3e}  running {running}/{k}")

    return show


# ---------------------------------------------------------------------- summary, checks
def _summaries(kernel: KernelOperator, log_u: np.ndarray, log_v: np.ndarray):
    """Marginals (n, k), (m, k), ``<P_j, M>`` and masses (k,) of every target, through the
    operator's own products on all targets at once (:func:`_shared_summaries`); a target
    whose scalings the shared form cannot hold is summarised alone (:func:`plan_summary`,
    in log form where needed)."""
    n, m = kernel.shape
    k = log_u.shape[1]
    row, col = np.zeros((n, k)), np.zeros((m, k))
    cost, mass = np.zeros(k), np.zeros(k)
    shared = np.zeros(k, dtype=bool)
    if not kernel.geometry.computes_on_device():
        shared = _shared_summaries(kernel, log_u, log_v, row, col, cost, mass)
    for j in np.flatnonzero(~shared):
        summary = plan_summary(kernel, log_u[:, j], log_v[:, j])
        row[:, j], col[:, j] = summary.row_marginal, summary.col_marginal
        cost[j], mass[j] = summary.cost, summary.mass
    return row, col, cost, mass


def _shared_summaries(kernel, log_u, log_v, row, col, cost, mass) -> np.ndarray:
    """Fill the summaries of the targets the shared form holds; return their mask.

    The scalings are taken relative to the shared offsets of an absorbed kernel (kernels
    with ``'absorb'``) or to each column's largest entry (the others), so that ``P_j =
    e^(c_j) diag(U_j) K~ diag(V_j)``: two products give the marginals, and the cost is
    ``sum_i U_ij (|x_i|^2 (K~ V_j)_i + (K~ (|y|^2 V_j))_i - 2 x_i . (K~ (V_j y))_i)`` for
    the squared-Euclidean cost on points (one product with ``k (d + 1)`` columns, any
    kernel), else a blocked pass over the exact kernel's cost rows (``O(n m)``, exact
    kernels only)."""
    n, m = kernel.shape
    g = kernel.geometry
    caps = kernel.info.capabilities
    points = has_points(g)
    squared = points and g.cost.sqeuclidean
    if not squared and "exact" not in caps:
        return np.zeros(log_u.shape[1], dtype=bool)
    absorb = "absorb" in caps
    with np.errstate(over="ignore", invalid="ignore"):
        if absorb:
            alpha, beta = _offsets(log_u), _offsets(log_v)
            lu, lv = log_u - alpha[:, None], log_v - beta[:, None]
            scale = np.zeros(log_u.shape[1])
        else:
            alpha, beta = np.zeros(n), np.zeros(m)
            top_u = np.max(np.where(np.isfinite(log_u), log_u, -np.inf), axis=0)
            top_v = np.max(np.where(np.isfinite(log_v), log_v, -np.inf), axis=0)
            top_u, top_v = (
                np.where(np.isfinite(top_u), top_u, 0.0),
                np.where(np.isfinite(top_v), top_v, 0.0),
            )
            lu, lv = log_u - top_u, log_v - top_v
            scale = top_u + top_v
    limit = SHARED_RANGE if absorb else 2 * SHARED_RANGE  # one-sided (<= 0) without offsets
    shared = np.maximum(_span(lu), _span(lv)) < limit
    cols = np.flatnonzero(shared)
    if not cols.size:
        return shared
    operator = kernel.absorbed(alpha, beta) if absorb else kernel
    U, V = np.exp(lu[:, cols]), np.exp(lv[:, cols])
    factor = np.exp(scale[cols])
    with np.errstate(over="ignore", invalid="ignore"):
        KV = operator.matmat(V)
        row[:, cols] = U * KV * factor
        col[:, cols] = V * operator.rmatmat(U) * factor
        if squared:
            d = g.Xc.shape[1]
            moments = (V[:, :, None] * g.Yc[:, None, :]).reshape(m, -1)
            products = operator.matmat(np.hstack([V * g.y_sq[:, None], moments]))
            count = cols.size
            weighted = g.x_sq[:, None] * KV + products[:, :count]
            cross = products[:, count:].reshape(n, count, d)
            weighted -= 2.0 * np.einsum("id,ikd->ik", g.Xc, cross)
            cost[cols] = np.einsum("ik,ik->k", U, weighted) * factor
        else:
            total = np.zeros(cols.size)
            step = max(1, SUMMARY_BLOCK_ENTRIES // max(m, 1))
            for start in range(0, n, step):
                rows = slice(start, min(start + step, n))
                logits = g.log_block(rows)
                costs = logits * -g.reg
                logits += alpha[rows, None]
                logits += beta[None, :]
                np.exp(logits, out=logits)
                total += np.einsum("ik,ik->k", U[rows], (logits * costs) @ V)
            cost[cols] = total * factor
    mass[cols] = row[:, cols].sum(axis=0)
    finite = np.isfinite(cost[cols]) & np.all(np.isfinite(row[:, cols]), axis=0)
    finite &= np.all(np.isfinite(col[:, cols]), axis=0) & np.all(row[:, cols] >= 0, axis=0)
    shared[cols[~finite]] = False  # an overflow: that target alone, in log form
    return shared


def _checks(kernel, problem, log_u, log_v, row, col, options, rng) -> list[TrueKernelCheck]:
    """Each target's true-kernel check: from the plan's marginals for the exact kernel (or a
    single point on one side), else on rows and columns sampled once for every target."""
    n, m = kernel.shape
    pen_a, pen_b = problem.penalties
    a = problem.a
    if "exact" in kernel.info.capabilities or (problem.balanced and min(n, m) == 1):
        out = []
        for j in range(problem.k):
            b = problem.B[:, j]
            with np.errstate(divide="ignore", invalid="ignore"):
                log_kv = np.log(row[:, j]) - log_u[:, j]
                log_ktu = np.log(col[:, j]) - log_v[:, j]
            out.append(
                check_from_masses(
                    np.where(a > 0, row[:, j], 0.0),
                    np.where(b > 0, col[:, j], 0.0),
                    pen_a.fixed_point_marginal(a, log_kv, problem.reg),
                    pen_b.fixed_point_marginal(b, log_ktu, problem.reg),
                    (n, m),
                    float(a.sum()),
                )
            )
        return out
    samples = options.true_kernel_samples
    if samples == "auto":
        samples = max(n, m) if n * m <= EXHAUSTIVE_CHECK_ENTRIES else SAMPLED_CHECK_SIZE
    samples = check_int(samples, "true_kernel_samples", minimum=1)
    generator = check_rng(rng)
    rows, cols = (sample_indices(size, samples, generator) for size in (n, m))
    return [
        true_kernel_check(
            kernel, a, problem.B[:, j], log_u[:, j], log_v[:, j], rows, cols, (pen_a, pen_b)
        )
        for j in range(problem.k)
    ]


def _finish(result: TargetsResult, options: SolverOptions) -> None:
    """Refuse impossible values (per target), then warn once for the targets that missed
    the accuracy or stopped early."""
    g = result.kernel.geometry
    rounding = LOWER_BOUND_RTOL * g.max_cost() * np.abs(result.mass)
    tiny = (result.value_linear < 0) & (-result.value_linear <= rounding)
    result.value_linear = np.where(tiny, 0.0, result.value_linear)
    wrong = ~np.isfinite(result.value_linear) | (result.value_linear < 0)
    wrong |= ~np.isfinite(result.mass) | (result.mass <= 0)
    for marginal in result.marginals:
        wrong |= ~np.all(np.isfinite(marginal), axis=0) | (marginal.min(axis=0) < 0)
    if wrong.any():
        bad = np.flatnonzero(wrong).tolist()
        message = (
            f"backend {result.backend!r} at reg={result.reg:g} gave impossible results "
            f"(negative or non-finite cost, mass or marginals) for target(s) {_columns(bad)}"
        )
        if options.errors == "raise":
            raise InvalidResultError(message + "; pass errors='warn' to get them anyway")
        warnings.warn(message, InvalidResultWarning, stacklevel=user_stacklevel())
    if not options.warn:
        return
    met = result.accuracy_met
    if met is not None and not met.all():
        missed = np.flatnonzero(~met).tolist()
        worst = max(result.true_kernel[j].bound for j in missed)
        if "exact" in result.kernel.info.capabilities:  # exact products: the iteration's
            advice = "raise max_iter (the iteration stopped before the accuracy's residual)"
        else:  # the approximation's own error
            advice = (
                "the kernel's approximation error: backend='auto' sizes the kernel to the "
                "accuracy, backend='exact' has none"
            )
        warnings.warn(
            f"backend {result.backend!r}: against the exact kernel {len(missed)} of "
            f"{result.n_targets} targets miss accuracy={options.accuracy:g} (columns "
            f"{_columns(missed)}; largest bound {worst:.2g}); {advice}",
            AccuracyWarning,
            stacklevel=user_stacklevel(),
        )
    early = [j for j, stop in enumerate(result.stops) if stop != "converged"]
    if early:
        stops = sorted({result.stops[j] for j in early})
        warnings.warn(
            f"Sinkhorn stopped before convergence ({', '.join(stops)}) for {len(early)} of "
            f"{result.n_targets} targets (columns {_columns(early)}) after at most "
            f"{int(result.n_iter.max())} iterations; raise max_iter or loosen tol",
            UserWarning,
            stacklevel=user_stacklevel(),
        )


# ---------------------------------------------------------------------- public bodies
def sinkhorn_targets(
    a: Any,
    b: Any,
    X: Any,
    Y: Any,
    reg: float,
    backend: str,
    *,
    options: SolverOptions,
    reg_m: Any = None,
    metric: Any = "sqeuclidean",
    p: float = 2.0,
    warmstart: Any = None,
    rng: Any = None,
    policy: Any = None,
    **backend_params: Any,
) -> TargetsResult:
    """The in-memory body of :func:`sketchot.sinkhorn` for ``b`` of shape ``(m, k)``:
    validate, build the kernel (``'auto'``: the policy's ladder, each candidate judged by
    the true-kernel checks of all the targets' solves), solve the targets together."""
    check_backend_params("sinkhorn", backend, backend_params)
    geometry = check_problem(X, Y, reg, metric, p)
    if backend_params.get("dtype") is None and options.accuracy is None:
        backend_params["dtype"] = np.float64
    start = {} if warmstart is None else _pair(warmstart)
    problem = make_targets(a, b, geometry.shape, geometry.reg, reg_m, **start)
    accuracy = options.accuracy if options.accuracy is not None else DEFAULT_ACCURACY
    if backend != "auto":
        kernel = build_kernel(
            geometry, backend, rng=rng, accuracy=accuracy, policy=policy, **backend_params
        )
        return solve_targets(problem, kernel, options, rng=rng)
    return _solve_auto(problem, geometry, options, rng, require_policy(policy, "backend='auto'"),
                       backend_params.get("dtype") or np.float64)  # fmt: skip


def _pair(warmstart: Any) -> dict[str, Any]:
    if not isinstance(warmstart, (tuple, list)) or len(warmstart) != 2:
        raise TypeError(
            "warmstart must be None or a pair (log_u, log_v) of arrays of shapes (n, k) and "
            f"(m, k) (a result's potentials); got {describe(warmstart)}"
        )
    return {"log_u0": warmstart[0], "log_v0": warmstart[1]}


def _solve_auto(problem, geometry, options, rng, policy, dtype) -> TargetsResult:
    """``backend='auto'``: the ladder of :func:`sketchot.policy.choose`, a candidate
    accepted when every target's check meets the accuracy."""
    from dataclasses import replace

    target = options.accuracy if options.accuracy is not None else DEFAULT_ACCURACY
    generator = check_rng(rng)
    seed = candidate_rng(rng, generator)
    quiet = replace(options, warn=False, errors="warn", verbose=False)

    def judge(kernel: Any, kind: str | None, error: float) -> Verdict:
        if kind is None:
            return Verdict(np.nan, True, "", solve_targets(problem, kernel, options, rng=seed))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = solve_targets(problem, kernel, quiet, rng=seed)
        checks = result.true_kernel or []
        measured = max((check.bound for check in checks), default=np.inf)
        accepted = bool(
            result.accuracy_met is not None
            and result.accuracy_met.all()
            and np.all(np.isfinite(result.value_linear))
            and np.all(result.value_linear >= 0)
        )
        return Verdict(measured, accepted, "largest true-kernel error of the targets", result)

    choice = policy.choose(
        geometry, judge, accuracy=target, rng=generator, dtype=dtype, verbose=options.verbose
    )
    outcome = choice.outcome
    outcome.reason, outcome.attempts = choice.reason, list(choice.attempts)
    outcome.options = options.as_dict()
    outcome.replay = dict(choice.replay)
    return outcome


def sinkhorn_targets_matrix(
    a: Any,
    b: Any,
    M: Any,
    reg: Any,
    *,
    options: SolverOptions,
    reg_m: Any = None,
    warmstart: Any = None,
    rng: Any = None,
    dtype: Any = np.float64,
) -> TargetsResult:
    """:func:`~sketchot.solver.matrix.sinkhorn_matrix` for ``b`` of shape ``(m, k)``: the
    exact kernel ``exp(-M / reg)``, the ``k`` targets together."""
    from ..kernels import build_exact_from_cost

    kernel = build_exact_from_cost(M, reg, dtype=dtype)
    smallest = kernel.geometry.min_cost
    if smallest < 0:
        # the one-target path solves M - min(M) and puts the result back (solver.matrix's
        # unshift); the targets' results have no such step yet: refused, not misreported
        raise ValueError(
            f"M has negative costs (smallest {smallest:.6g}): several targets (b of shape "
            "(m, k)) are solved on costs >= 0 only; pass M - M.min() (balanced transport: "
            "the same plans; M's values are those plus min(M) times the mass) or solve the "
            "targets one by one"
        )
    n, m = kernel.shape
    shape = np.shape(a) if a is not None else None
    if shape is not None and len(shape) == 1 and shape[0] != n:
        raise ValueError(f"a must have one weight per row of M ({n}); got {shape[0]} weights")
    start = {} if warmstart is None else _pair(warmstart)
    problem = make_targets(a, b, (n, m), kernel.geometry.reg, reg_m, **start)
    return solve_targets(problem, kernel, options, rng=rng)


def sinkhorn_kernel_targets(
    a: Any,
    b: Any,
    kernel: KernelOperator,
    *,
    options: SolverOptions,
    reg_m: Any = None,
    metric: Any = None,
    p: Any = None,
    warmstart: Any = None,
    rng: Any = None,
) -> TargetsResult:
    """The in-memory body of :func:`sketchot.sinkhorn_kernel` for ``b`` of shape
    ``(m, k)``: the ``k`` targets on a prebuilt operator."""
    if not isinstance(kernel, KernelOperator):
        raise TypeError(f"kernel must be a sketchot KernelOperator; got {describe(kernel)}")
    check_kernel_metric(kernel, metric, p)
    start = {} if warmstart is None else _pair(warmstart)
    problem = make_targets(a, b, kernel.shape, kernel.geometry.reg, reg_m, **start)
    return solve_targets(problem, kernel, options, rng=rng)
