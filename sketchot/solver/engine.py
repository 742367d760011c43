"""The one Sinkhorn iteration of sketchot: every problem, every kernel, every strategy.

For a problem (:class:`~sketchot.solver.problem.Problem`: weights ``a``, ``b``, ``reg`` and
the marginal penalties ``reg_m``) and a kernel operator ``K``, the iteration alternates the
two half-steps

.. math:: v \\leftarrow b \\odot (K^\\top u)^{-\\rho_b}, \\qquad
          u \\leftarrow a \\odot (K v)^{-\\rho_a}, \\qquad
          \\rho = \\frac{\\mathrm{reg}_m}{\\mathrm{reg}_m + \\mathrm{reg}},

(``rho = 1`` for a hard constraint: balanced transport; Chizat et al. 2018 for the
unbalanced case, with the entropic term ``reg KL(P | a b^T)`` of POT's default
``reg_type='kl'``). A pass computes it as ``(w^(1/rho) / K s')^rho``, in POT's order from
``u = 1/n`` (or from given potentials). The state is the
pair of log-potentials; each half-step is ONE fused pass of the operator (products, ratios and
the next projection). The strategies are options of this one loop, chosen from the kernel's
declared capabilities and the solver options:

``multiplicative``
    Passes on plain scalings; bad denominators of a signed approximation go to the
    :class:`~sketchot.solver.safeguard.Safeguard`.
``absorb``
    For kernels with the ``'absorb'`` capability (the exact kernel): multiplicative passes on
    the absorbed kernel ``diag(e^alpha) K diag(e^beta)``; when a scaling leaves
    ``[e^-tau, e^tau]`` it is moved into ``(alpha, beta)`` and the kernel re-absorbed
    (Schmitzer 2019, Sec. 3). Finite for any ``reg``; one exponential per entry per
    absorption, not per iteration. A breakdown (a vanished product) is repaired by one exact
    log-domain iteration.
``log``
    For kernels with the ``'log_products'`` capability: passes on logarithms.

Anderson mixing (:class:`~sketchot.solver.acceleration.AndersonMixer`) of the column
log-potentials, an epsilon schedule (:func:`epsilon_schedule`, for kernels that can be
rebuilt at another ``reg``) and the paper's plain protocol (``order='paper'``: from ``v = 1``,
``u`` first, a fixed number of iterations, no check) are options of the same loop.

Stopping: at each check (every ``check_every`` iterations) a norm of the fixed-point residual
of the columns, ``K^T u * (v - v_next)``: ``norm='l2'``, ``||.||_2 / sum(b)``, for balanced
transport POT's column-marginal error ``||v * K^T u - b||_2 / sum(b)``; ``norm='l1'``,
``||.||_1 / sum(a)``, the error the true-kernel check measures (the row marginal is exact
after the ``u`` half-step). A run whose best error has not
improved by :data:`STALL_IMPROVEMENT` over :data:`STALL_CHECKS` checks and
:data:`STALL_ITERATIONS` iterations stops as stalled.

Symmetric problems (``symmetric=True``: the same cloud and weights on both sides, so that
``K = K^T`` and the solution has ``u = v``; Feydy et al. 2019, Sec. 3.1): one scaling and
the averaged update

.. math:: \\log u \\leftarrow \\tfrac12 \\big(\\log u + \\rho \\log (a^{1/\\rho} / K u)\\big),

ONE product per iteration instead of two. At the solution the Jacobian of the plain update
is ``-diag(1/a) P`` (eigenvalues in ``[-1, 0]`` for a positive semi-definite kernel such as
the Gibbs kernel of the squared Euclidean cost), so the averaged one contracts by at least
1/2 per iteration whatever ``reg`` (Anderson mixing on top). Its check is the marginal error of
the scaling it has just multiplied (``u * K u`` against ``a``): the returned scaling is the
checked one. A run that breaks down (a non-positive product of a signed approximation) or
stalls is solved again by the two-sided iteration.

Block-diagonal kernels (the ``'block_diagonal'`` capability: many independent problems
stacked, one pass over all of them per half-step): the error is the largest block's residual,
each relative to its own mass, so that a run converges when every problem has; Anderson
mixing runs block by block (:class:`~sketchot.solver.acceleration.BlockAndersonMixer`: each
problem its own coefficients and restarts), and an absorption recomputes only the blocks whose
scalings left ``[e^-tau, e^tau]``.

Deferred operators (the ``'deferred'`` capability, e.g. on a cluster): their passes are lazy
(:class:`~sketchot.kernels.base.DeferredPass`) and the loop never forces one between checks.
At a check, the pass's own :meth:`~sketchot.kernels.base.DeferredPass.residual` and the bad
entries of every pass since the last check are computed in ONE evaluation; the counts then go
to the safeguard, which cannot repair entries it never sees
(:meth:`~sketchot.solver.safeguard.Safeguard.count_deferred`). Per-iteration tests (finite
scalings, absorption bounds) and Anderson mixing need the values, so such operators run the
plain multiplicative strategy and a breakdown shows up as a non-finite residual.

References
----------
M. Cuturi, "Sinkhorn distances", NeurIPS 2013.
L. Chizat, G. Peyre, B. Schmitzer, F.-X. Vialard, "Scaling algorithms for unbalanced optimal
transport problems", Math. Comp. 87, 2018.
B. Schmitzer, "Stabilized sparse scaling algorithms for entropy regularized transport
problems", SIAM J. Sci. Comput. 41(3), 2019.
J. Feydy, T. Sejourne, F.-X. Vialard, S. Amari, A. Trouve, G. Peyre, "Interpolating between
optimal transport and MMD using Sinkhorn divergences", AISTATS 2019.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..kernels import KernelOperator
from ..kernels.base import IdentityPass, fast_ratios_and_bad
from .acceleration import AndersonMixer, BlockAndersonMixer
from .problem import Problem
from .safeguard import Safeguard

#: Absorption thresholds ``tau`` on ``|log u~|``, ``|log v~|`` per storage precision (see
#: :class:`sketchot.kernels.exact.AbsorbedExactKernel` for why the entry floor is harmless).
ABSORB_THRESHOLD = {np.dtype(np.float64): 100.0, np.dtype(np.float32): 20.0}

#: Breakdowns repaired by an exact log-domain iteration before the run gives up.
MAX_RESETS = 20

#: A run stops as stalled when its best error improved by less than this factor over the
#: last :data:`STALL_CHECKS` checks (rounding has taken over: e.g. float64 potentials of a
#: tiny ``reg``, where ``C / reg`` leaves too few significant digits).
STALL_IMPROVEMENT = 0.99
STALL_CHECKS = 30
#: ... and over this many iterations: frequent checks (a check every iteration) must not
#: take a slow stretch of a small ``reg`` for a stall.
STALL_ITERATIONS = 300

#: Intermediate stages of the epsilon schedule stop at this residual (in the run's norm, relative
#: to its mass); the last stage dominates whatever the choice.
STAGE_TOL = 1e-3

ORDERS = ("pot", "paper")
NORMS = ("l2", "l1")
STRATEGIES = ("multiplicative", "absorb", "log")


@dataclass
class Iterate:
    """What the iteration returns.

    Attributes
    ----------
    log_u, log_v : ndarray
        Log-scalings of ``P = diag(u) K diag(v)`` (``-inf`` where the weight is 0).
    n_iter : int
        Iterations run (a pair of half-steps each, over every stage).
    converged : bool
        Whether the last check met ``tol``.
    history : list of (int, float)
        ``(iteration, error)`` at every check.
    status : str
        ``'converged'``, ``'max_iter'``, ``'stalled'``, ``'breakdown'`` or ``'fixed'`` (the
        plain protocol's fixed iteration count).
    strategy : str
        ``'multiplicative'``, ``'absorb'`` or ``'log'``.
    info : dict
        Counters: ``absorptions``, ``resets``, ``anderson_restarts``, ``stages``,
        ``iteration_times`` (only with ``timed=True``).
    scalings : tuple of ndarray or None
        ``(u, v)`` themselves for the multiplicative strategy (no ``exp(log u)`` rounding;
        negative or non-finite entries kept as the ``'propagate'`` safeguard left them); the
        operator's lazy values for a deferred one.
    absorbed : KernelOperator or None
        For the absorbing strategy, the absorbed kernel the final scalings are relative to
        (offsets ``alpha``, ``beta``): a stored one gives the plan's summary by plain
        products (:func:`sketchot.solver.plans.plan_summary`). Not kept in results.
    log_products : tuple of ndarray or None
        ``(log(K v), log(K^T u))`` of the final scalings, for the log-domain strategy on a
        kernel whose columns pass is the identity (``L = K``): the last two passes computed
        them, so the summary's marginals need no product. ``None`` otherwise.
    """

    log_u: np.ndarray
    log_v: np.ndarray
    n_iter: int
    converged: bool
    history: list[tuple[int, float]]
    status: str
    strategy: str
    info: dict[str, Any] = field(default_factory=dict)
    scalings: tuple[np.ndarray, np.ndarray] | None = None
    absorbed: Any = None
    log_products: tuple[np.ndarray, np.ndarray] | None = None


def choose_strategy(kernel: KernelOperator, log_domain: bool | str) -> str:
    """The strategy for a kernel: its capabilities and the ``log_domain`` option."""
    caps = kernel.info.capabilities
    if log_domain is False:
        return "multiplicative"
    if "absorb" in caps:
        return "absorb"
    if "log_products" in caps:
        return "log"
    if log_domain is True:
        raise ValueError(
            f"log_domain=True needs a kernel with the 'absorb' or 'log_products' capability; "
            f"backend {kernel.info.backend!r} only offers linear products"
        )
    return "multiplicative"


def is_symmetric(kernel: KernelOperator, problem: Problem) -> bool:
    """Whether the symmetric iteration applies: the same cloud on both sides of the kernel
    (equal arrays: every backend builds ``K(X, X)`` symmetric, with the same draws on both
    sides), equal weights and penalties, and a kernel whose passes are immediate and not
    block-diagonal. ``O((n + m) d)`` comparisons."""
    caps = kernel.info.capabilities
    if "deferred" in caps or "block_diagonal" in caps or kernel.shape[0] != kernel.shape[1]:
        return False
    g = kernel.geometry
    X, Y = getattr(g, "X", None), getattr(g, "Y", None)
    if not isinstance(X, np.ndarray) or not isinstance(Y, np.ndarray):
        return False
    return (
        problem.reg_m[0] == problem.reg_m[1]
        and np.array_equal(problem.a, problem.b)
        and X.shape == Y.shape
        and (X is Y or np.array_equal(X, Y))
    )


def epsilon_schedule(reg: float, spread: float, factor: float = 0.5) -> list[float]:
    """Geometric regularisations from ``spread`` down to ``reg``: ``reg_k = spread q^k``,
    ``q = (reg / spread)^(1/K) >= factor``, the last exactly ``reg`` (``[reg]`` when
    ``spread <= reg``); ``factor`` in (0, 1)."""
    if not 0.0 < factor < 1.0:
        raise ValueError(f"factor must be in (0, 1); got {factor!r}")
    if spread <= reg:
        return [reg]
    count = math.ceil(math.log(spread / reg) / math.log(1.0 / factor) - 1e-12)
    return [reg * (spread / reg) ** ((count - k) / count) for k in range(count)] + [reg]


def annealing_kernels(kernel: KernelOperator) -> list[KernelOperator]:
    """The kernel at the larger regs of :func:`epsilon_schedule` from the largest cost down
    (``iterate``'s ``schedule``); the kernel must rebuild itself (``at_reg``)."""
    g = kernel.geometry
    return [kernel.at_reg(reg) for reg in epsilon_schedule(g.reg, g.max_cost())[:-1]]


def iterate(
    kernel: KernelOperator,
    problem: Problem,
    *,
    tol: float,
    max_iter: int,
    norm: str = "l2",
    check_every: int = 10,
    strategy: str = "multiplicative",
    anderson: int = 0,
    guard: Safeguard | None = None,
    progress: Any = None,
    order: str = "pot",
    timed: bool = False,
    schedule: list[KernelOperator] | None = None,
    symmetric: bool = False,
) -> Iterate:
    """Run the Sinkhorn iteration (see the module notes).

    Parameters
    ----------
    kernel : KernelOperator
        The kernel at ``problem.reg``.
    problem : Problem
        Weights, ``reg``, marginal exponents and an optional warm start.
    tol : float
        Stop when the residual (module notes) falls below ``tol``; ``0`` never stops early.
    max_iter : int
        Iterations at most, over all stages.
    norm : {'l2', 'l1'}
        The residual's norm (module notes): ``'l2'`` relative to ``sum(b)`` (POT's
        criterion), ``'l1'`` relative to ``sum(a)``.
    check_every : int
        Iterations between checks.
    strategy : {'multiplicative', 'absorb', 'log'}
        From :func:`choose_strategy`.
    anderson : int
        Anderson memory on the column log-potentials (0: the plain iteration).
    guard : Safeguard, optional
        Policy for bad denominators (multiplicative strategy); none: they are left at 0.
    progress : object, optional
        Receives ``update(iteration, error=, target=)`` at every check and ``log(text)``.
    order : {'pot', 'paper'}
        ``'paper'``: from ``v = 1``, ``u`` first, ``max_iter`` iterations, no check.
    timed : bool
        Record the seconds of every iteration in ``info['iteration_times']``.
    schedule : list of KernelOperator, optional
        Kernels at decreasing ``reg`` (the epsilon schedule), solved before ``kernel``, each
        warm-started from the previous potentials (in cost units).
    symmetric : bool
        The symmetric iteration (module notes): the caller has checked that both sides are
        the same cloud with the same weights and penalties (:func:`is_symmetric`). Not for
        ``order='paper'`` nor deferred kernels.

    Returns
    -------
    Iterate
    """
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}; got {order!r}")
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}; got {strategy!r}")
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}; got {norm!r}")
    if symmetric and (order != "pot" or "deferred" in kernel.info.capabilities):
        raise ValueError(
            "symmetric=True runs the order='pot' iteration on kernels with immediate passes"
        )
    args = (kernel, problem, tol, max_iter, norm, check_every, strategy, anderson, guard,
            progress, order, timed, schedule)  # fmt: skip
    if not symmetric:
        return _iterate(_Run, *args)
    result = _iterate(_SymmetricRun, *args)
    if result.status in ("breakdown", "stalled"):
        # a signed approximation's non-positive product (or a kernel far from positive
        # semi-definite, where the averaged update need not contract): the two-sided
        # iteration has the safeguard that repairs it
        result = _iterate(_Run, *args)
        result.info["fallback"] = "two-sided"
    else:
        result.info["symmetric"] = True
    return result


def _iterate(
    runner, kernel, problem, tol, max_iter, norm, check_every, strategy, anderson, guard,
    progress, order, timed, schedule,
) -> Iterate:  # fmt: skip
    """:func:`iterate` with one kind of run (two-sided or symmetric)."""
    if not schedule:
        result = runner(kernel, problem, strategy, anderson, guard, progress, order, norm).run(
            tol, max_iter, check_every, timed
        )
        if result.status == "breakdown" and _log_fallback(kernel, problem, strategy):
            # marginals below float64's range (far outliers of unbalanced transport): the
            # linear absorbed kernel cannot hold them, its log-domain passes can
            result = runner(kernel, problem, "log", anderson, guard, progress, order, norm).run(
                tol, max_iter, check_every, timed
            )
            result.info["fallback"] = "log"
        return result
    total, history, stages, info = 0, [], [], {"absorptions": 0, "resets": 0}
    log_u = log_v = None
    for stage_kernel in [*schedule, kernel]:
        last = stage_kernel is kernel
        reg = stage_kernel.geometry.reg
        stage_problem = problem.at_reg(reg, log_u, log_v)
        stage_tol = tol if last else max(tol, STAGE_TOL)  # residuals are relative already
        every = check_every if last else 1  # checks are free: don't overshoot a loose tol
        result = runner(
            stage_kernel, stage_problem, strategy, anderson, guard, progress, order, norm
        ).run(stage_tol, max_iter - total, every, timed, offset=total)
        history.extend(result.history)
        total += result.n_iter
        for key in ("absorptions", "resets"):
            info[key] += result.info.get(key, 0)
        error = result.history[-1][1] if result.history else float("nan")
        stages.append(
            {"reg": reg, "n_iter": result.n_iter, "status": result.status, "error": error}
        )
        # potentials in cost units carry over: f = reg log u
        log_u, log_v = reg * result.log_u, reg * result.log_v
        if total >= max_iter and not last:
            break
    info["stages"] = stages
    if not last:
        # the budget ran out before the target reg: the potentials carry over to it
        target = problem.reg
        return Iterate(
            log_u / target, log_v / target, total, False, history, "max_iter",
            result.strategy, info,
        )  # fmt: skip
    return Iterate(
        result.log_u, result.log_v, total, result.converged, history, result.status,
        result.strategy, info, absorbed=result.absorbed,
    )  # fmt: skip


def _log_fallback(kernel: KernelOperator, problem: Problem, strategy: str) -> bool:
    """Whether a broken-down absorbed run is retried with log-domain passes: unbalanced
    problems, whose plan marginals can fall below float64's range, on kernels that have
    them."""
    return (
        strategy == "absorb" and not problem.balanced and "log_products" in kernel.info.capabilities
    )


class _Run:
    """One stage of the iteration on one kernel (see :func:`iterate`)."""

    def __init__(self, kernel, problem, strategy, anderson, guard, progress, order, norm="l2"):
        self.deferred = "deferred" in kernel.info.capabilities
        if self.deferred and (strategy != "multiplicative" or anderson):
            raise ValueError(
                f"backend {kernel.info.backend!r} computes its passes lazily ('deferred'): it "
                f"runs the plain multiplicative iteration (got strategy={strategy!r}, "
                f"anderson={anderson})"
            )
        # passes whose bad entries are not counted yet (deferred operators)
        self.pending: list[tuple[str, Any]] = []
        self.kernel, self.problem, self.strategy = kernel, problem, strategy
        self.guard, self.progress, self.order = guard, progress, order
        self.log = strategy == "log"
        self.active = {"rows": problem.a > 0, "cols": problem.b > 0}
        self.all_active = bool(self.active["rows"].all() and self.active["cols"].all())
        with np.errstate(divide="ignore"):
            self.log_weights = {"rows": np.log(problem.a), "cols": np.log(problem.b)}
        self.exponent = {"rows": problem.exponents[0], "cols": problem.exponents[1]}
        caps = kernel.info.capabilities
        self.blocks = kernel.info.params["batch"] if "block_diagonal" in caps else 1
        self.mixer = None
        if anderson and self.blocks > 1:
            self.mixer = BlockAndersonMixer(anderson, self.active["cols"], self.blocks)
        elif anderson:
            self.mixer = AndersonMixer(anderson, self.active["cols"])
        self.norm = norm
        mass = problem.a if norm == "l1" else problem.b
        self.mass = float(mass.sum())
        # a block-diagonal kernel's blocks are independent problems: each its own mass
        self.block_mass = mass.reshape(self.blocks, -1).sum(axis=1) if self.blocks > 1 else None
        self.counts = {"absorptions": 0, "resets": 0}
        # absorbed log-scalings (alpha, beta); a scalar zero until the first absorption
        self.offset = {"rows": 0.0, "cols": 0.0}
        self.op = kernel
        self.tau = ABSORB_THRESHOLD.get(kernel.dtype, 20.0)

    # ------------------------------------------------------------ numerators
    def log_numerator(self, side: str) -> np.ndarray:
        """``log w / rho``: the KL-penalised update ``s = w (K s')^-rho`` is
        ``(w^(1/rho) / K s')^rho`` (module notes)."""
        rho = self.exponent[side]
        return self.log_weights[side] if rho == 1.0 else self.log_weights[side] / rho

    def numerator(self, side: str) -> np.ndarray:
        """The numerator of the passes, in their form.

        Absorbed: ``w^(1/rho) e^(offset (1 - 1/rho))``, so that the absorbed scaling
        ``s~ = s e^-offset`` follows ``s = w (K s')^-rho``.
        """
        rho = self.exponent[side]
        if self.log:
            return self.log_numerator(side)
        if rho == 1.0:
            return self.problem.a if side == "rows" else self.problem.b
        log_numerator = self.log_numerator(side)
        if self.strategy == "absorb":
            log_numerator = log_numerator + self.offset[side] * (1.0 - 1.0 / rho)
        with np.errstate(over="ignore", invalid="ignore"):
            return np.where(self.active[side], np.exp(log_numerator), 0.0)

    # ------------------------------------------------------------ one half-step
    def half_step(self, side: str, w: np.ndarray, other: np.ndarray):
        """One fused pass: ``(new scaling of side, its projection, pass)``; the safeguard
        handles bad entries of the multiplicative strategy."""
        numerator = self.numerator(side)
        result = self.op.fused_pass(side, w, numerator, log=self.log, exponent=self.exponent[side])
        if self.deferred:
            self.pending.append((side, result))
            return result.ratios, result.projection, result
        if not result.n_bad or self.log:
            return result.ratios, result.projection, result
        if self.strategy == "absorb":
            # a vanished product of the absorbed exact kernel is a breakdown (repaired by an
            # exact log-domain iteration), never a kernel to repair row by row
            ratios = result.ratios.copy()
            ratios[result.bad] = np.inf
            return ratios, result.projection, result
        if self.guard is None:
            return result.ratios, result.projection, result
        ratios, projection = self.guard.apply(
            side, result, numerator, other, exponent=self.exponent[side]
        )
        return ratios, projection, result

    # ------------------------------------------------------------ start
    def start(self):
        """Initial ``(u, v)`` in the strategy's form and the projection of the first side."""
        p, kernel = self.problem, self.kernel
        n, m = kernel.shape
        if p.log_u0 is not None:
            log_u = np.where(self.active["rows"], p.log_u0, -np.inf)
        else:
            log_u = np.where(self.active["rows"], -math.log(n), -np.inf)
        if p.log_v0 is not None:
            log_v = np.where(self.active["cols"], p.log_v0, -np.inf)
        elif self.order == "paper":
            log_v = np.zeros_like(self.log_weights["cols"])
        else:
            log_v = np.where(self.active["cols"], -math.log(m), -np.inf)
        if self.strategy == "absorb":
            if p.log_v0 is None and not self._underflow_free():
                # POT's start would underflow in the linear kernel: one exact log-domain
                # iteration first (finite for any reg), then absorb it.
                log_u, log_v = self.exact_iteration(log_u)
                self.counts["first_exact"] = 1
            self.absorb(log_u, log_v)
            return self.unit("rows"), self.unit("cols")
        if self.log:
            return log_u, log_v
        with np.errstate(over="ignore"):
            return np.exp(log_u), np.exp(log_v)

    def _underflow_free(self) -> bool:
        """No entry of ``diag(1/n) K`` (POT's start) can fall below float's tiny."""
        g = self.kernel.geometry
        n, m = self.kernel.shape
        spread = g.max_cost() / g.reg
        tiny = -math.log(np.finfo(self.kernel.dtype).tiny)
        return spread + self.tau + math.log(max(n, m)) < tiny - 1.0

    def unit(self, side: str) -> np.ndarray:
        return self.active[side].astype(np.float64)

    def absorb(self, log_u: np.ndarray, log_v: np.ndarray) -> None:
        """Move the log-scalings into the kernel: ``(alpha, beta) = (log u, log v)``."""
        self.offset = {"rows": log_u, "cols": log_v}
        self.op = self.kernel.absorbed(log_u, log_v, previous=None if self.op is self.kernel
                                       else self.op)  # fmt: skip

    def exact_iteration(self, log_u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One iteration in the log domain on the kernel itself (``'log_products'``)."""
        kernel = self.kernel
        z = kernel.project("rows", log_u, log=True)
        cols = kernel.fused_pass(
            "cols", z, self.log_numerator("cols"), log=True, exponent=self.exponent["cols"]
        )
        rows = kernel.fused_pass(
            "rows", cols.projection, self.log_numerator("rows"), log=True,
            exponent=self.exponent["rows"],
        )  # fmt: skip
        return rows.ratios, cols.ratios

    def log_scalings(self, u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Total log-scalings of the iterate (offsets included)."""
        if self.log:
            return u, v
        with np.errstate(divide="ignore"):
            log_u = np.where(self.active["rows"], self.offset["rows"] + np.log(u), -np.inf)
            log_v = np.where(self.active["cols"], self.offset["cols"] + np.log(v), -np.inf)
        return log_u, log_v

    # ------------------------------------------------------------ the loop
    def run(self, tol, max_iter, check_every, timed, offset=0) -> Iterate:
        u, v = self.start()
        first, second = ("cols", "rows") if self.order == "pot" else ("rows", "cols")
        scaling = {"rows": u, "cols": v}
        rows_pass = None  # the last pass over the rows side: log(K v) of the current v
        p = self.problem
        warm = self.log and self.order == "pot" and p.log_u0 is not None and p.log_v0 is not None
        if warm:
            # a warm start's v is used, not discarded: a rows half-step from it gives u and
            # the projection the first columns pass needs (the products a projection of u
            # would cost, half an iteration further on); its rows are then exact, so the
            # first columns pass already measures the start's error (a start that meets
            # tol takes no iteration)
            w = self.op.project("cols", v, log=True)
            scaling["rows"], projection, rows_pass = self.half_step("rows", w, v)
        else:
            # projection of the side the first half-step multiplies
            projection = self.op.project(second, scaling[second], log=self.log)
        history: list[tuple[int, float]] = []
        times: list[float] = []
        status, n_iter, best, best_at, best_iter = "max_iter", 0, math.inf, 0, 0
        checks = 0
        last_finite = (scaling["rows"], scaling["cols"])
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            iteration = 1
            while iteration <= max_iter + 1:
                begin = time.perf_counter()
                final = iteration == max_iter + 1
                if final and self.order == "paper":
                    break
                new, proj_first, result = self.half_step(first, projection, scaling[second])
                if self.order == "pot" and (
                    (iteration > 1 and ((iteration - 2) % check_every == 0 or final))
                    or (iteration == 1 and warm)
                ):
                    if self.deferred:
                        lazy = result.residual(scaling["cols"], self.norm)
                        error = self.settle(lazy)[0] / self.mass
                    else:
                        error = self.residual(scaling["cols"], result.products, result.ratios)
                    if not math.isfinite(error):
                        status = "breakdown"
                    else:
                        checks += 1
                        history.append((offset + iteration - 1, error))
                        if self.progress is not None:
                            self.progress.update(offset + iteration - 1, error=error, target=tol)
                        if error < tol:
                            status = "converged"
                        elif error < STALL_IMPROVEMENT * best:
                            best, best_at, best_iter = error, checks, iteration
                        elif (
                            checks - best_at >= STALL_CHECKS
                            and iteration - best_iter >= STALL_ITERATIONS
                        ):
                            status = "stalled"
                    if status == "breakdown" and self.can_reset(n_iter, max_iter):
                        scaling, projection = self.reset(last_finite[0])
                        rows_pass = None
                        n_iter = iteration
                        iteration += 1
                        status = "max_iter"
                        continue
                    if status != "max_iter":
                        break
                if final:
                    break
                new, mixed = self.mix(first, scaling[first], new, result)
                if mixed:
                    proj_first = self.op.project(first, new, log=self.log)
                scaling[first] = new
                scaling[second], projection, rows_pass = self.half_step(second, proj_first, new)
                n_iter = iteration
                if timed:
                    times.append(time.perf_counter() - begin)
                iteration += 1
                if self.log or self.order == "paper" or self.deferred:
                    continue
                u, v = scaling["rows"], scaling["cols"]
                if not (math.isfinite(u.sum()) and math.isfinite(v.sum())):
                    if self.can_reset(n_iter, max_iter):
                        scaling, projection = self.reset(last_finite[0])
                        continue
                    scaling = {"rows": last_finite[0], "cols": last_finite[1]}
                    status, n_iter = "breakdown", n_iter - 1
                    break
                if self.guard is not None and self.guard.repaired:
                    u, v = self.rebalance(u, v)
                    scaling = {"rows": u, "cols": v}
                    projection = self.op.project(second, scaling[second])
                if self.strategy == "absorb" and self.out_of_bounds(u, v):
                    scaling = self.absorb_out_of_bounds(u, v)
                    self.counts["absorptions"] += 1
                    projection = self.op.project(second, scaling[second])
                last_finite = (scaling["rows"], scaling["cols"])
            if self.order == "paper":
                status = "fixed"
        if self.pending:
            self.settle()
        log_u, log_v = self.log_scalings(scaling["rows"], scaling["cols"])
        info = dict(self.counts)
        info["anderson_restarts"] = 0 if self.mixer is None else self.mixer.restarts
        if timed:
            info["iteration_times"] = times
        plain = (scaling["rows"], scaling["cols"]) if self.strategy == "multiplicative" else None
        absorbed = self.op if self.strategy == "absorb" and self.op is not self.kernel else None
        products = None
        consistent = self.order == "pot" and status in ("converged", "stalled", "max_iter")
        if consistent and self.log and rows_pass is not None and isinstance(result, IdentityPass):
            # the check read K^T u of the final u; the last rows pass K v of the final v
            products = (rows_pass.products, result.products)
        return Iterate(
            log_u, log_v, n_iter, status == "converged", history, status, self.strategy, info,
            plain, absorbed, products,
        )  # fmt: skip

    def settle(self, *values) -> list:
        """Values of a deferred operator's lazy ``values`` and the bad-entry counts of the
        passes since the last settle, in one evaluation; the counts go to the safeguard in
        pass order (without one, bad entries keep their zero ratios)."""
        pending, self.pending = self.pending, []
        computed = pending[-1][1].evaluate(*values, *(result.n_bad for _, result in pending))
        if self.guard is not None:
            for (side, _), count in zip(pending, computed[len(values) :], strict=True):
                if count:
                    self.guard.count_deferred(side, int(count))
        return computed[: len(values)]

    def residual(self, v: np.ndarray, products: np.ndarray, ratios: np.ndarray) -> float:
        """``||K^T u * (v - v_next)||`` over the mass, in the run's norm, from the columns
        pass's ``products`` (``K^T u``) and ``ratios`` (``v_next``) (module notes); for a
        block-diagonal kernel the largest block's, over its own mass."""
        if self.log:
            diff = np.exp(products + v) - np.exp(products + ratios)
        else:
            diff = products * v - products * ratios
        if not self.all_active:
            diff = np.where(self.active["cols"], diff, 0.0)
        scale = float(np.max(np.abs(diff))) if diff.size else 0.0
        if not math.isfinite(scale) or scale == 0.0:
            return scale
        ord_ = 1 if self.norm == "l1" else 2
        if self.block_mass is not None:
            norms = np.linalg.norm((diff / scale).reshape(self.blocks, -1), ord=ord_, axis=1)
            return scale * float(np.max(norms / self.block_mass))
        return scale * float(np.linalg.norm(diff / scale, ord=ord_)) / self.mass

    def mix(self, side: str, previous: np.ndarray, new: np.ndarray, result) -> tuple:
        """``(column update, whether it was extrapolated)``: Anderson mixing of the column
        log-potentials, restarted after a pass with bad entries (the map itself changed)."""
        if self.mixer is None or side != "cols":
            return new, False
        if result.n_bad:
            self.mixer.reset()
            return new, False
        if self.log:
            mixed = self.mixer.step(previous, new)
            return mixed, mixed is not new
        beta = self.offset["cols"]
        with np.errstate(divide="ignore"):
            x, g = beta + np.log(previous), beta + np.log(new)
        mixed = self.mixer.step(x, g)
        if mixed is g:
            return new, False
        return np.where(self.active["cols"], np.exp(mixed - beta), 0.0), True

    def out_of_bounds(self, u: np.ndarray, v: np.ndarray) -> bool:
        bound = math.exp(self.tau)
        if u.max() > bound or v.max() > bound:
            return True
        low = 1.0 / bound
        if self.all_active:
            return bool(u.min() < low or v.min() < low)
        return bool(np.any(u[self.active["rows"]] < low) or np.any(v[self.active["cols"]] < low))

    def absorb_out_of_bounds(self, u: np.ndarray, v: np.ndarray) -> dict[str, np.ndarray]:
        """Absorb the scalings (:meth:`absorb`) and return the new ones. A block-diagonal
        kernel re-absorbs only the blocks whose scalings left ``[e^-tau, e^tau]`` (one
        exponential per entry of those blocks, not of the whole stack); the others keep
        their offsets and scalings."""
        log_u, log_v = self.log_scalings(u, v)
        if self.blocks == 1 or self.op is self.kernel:
            self.absorb(log_u, log_v)
            return {"rows": self.unit("rows"), "cols": self.unit("cols")}
        bound = math.exp(self.tau)
        out = np.zeros(self.blocks, dtype=bool)
        for side, s in (("rows", u), ("cols", v)):
            s = s.reshape(self.blocks, -1)
            low = (s < 1.0 / bound) & self.active[side].reshape(self.blocks, -1)
            out |= ((s > bound) | low | ~np.isfinite(s)).any(axis=1)
        rows = np.repeat(out, u.size // self.blocks)
        cols = np.repeat(out, v.size // self.blocks)
        self.offset = {
            "rows": np.where(rows, log_u, self.offset["rows"]),
            "cols": np.where(cols, log_v, self.offset["cols"]),
        }
        self.op = self.kernel.absorbed(
            self.offset["rows"], self.offset["cols"], previous=self.op, blocks=out
        )
        return {
            "rows": np.where(rows, self.unit("rows"), u),
            "cols": np.where(cols, self.unit("cols"), v),
        }

    def can_reset(self, n_iter: int, max_iter: int) -> bool:
        return (
            self.strategy == "absorb" and self.counts["resets"] < MAX_RESETS and n_iter < max_iter
        )

    def reset(self, u: np.ndarray):
        """An exact log-domain iteration from the last finite ``u``, absorbed: the new
        ``(scalings, projection)``."""
        log_u, _ = self.log_scalings(u, self.unit("cols"))
        log_u, log_v = self.exact_iteration(log_u)
        self.counts["resets"] += 1
        if self.mixer is not None:
            self.mixer.reset()
        self.absorb(log_u, log_v)
        u = self.unit("rows")
        return {"rows": u, "cols": self.unit("cols")}, self.op.project("rows", u)

    @staticmethod
    def rebalance(u: np.ndarray, v: np.ndarray):
        """Repaired denominators mix the exact and the approximate kernel, so mass is no
        longer conserved and ``u``, ``v`` can drift apart geometrically; ``P`` is invariant
        under ``(u / c, v c)``."""
        balance = np.sqrt(np.max(u) / np.max(v))
        if np.isfinite(balance) and balance > 0:
            return u / balance, v * balance
        return u, v


class _SymmetricRun(_Run):
    """One stage of the symmetric iteration (module notes): one scaling ``s`` (the rows' and
    the columns'), one product per iteration, checked before each update."""

    def start_scaling(self) -> np.ndarray:
        """The start in the strategy's form: the mean of the warm start's two log-scalings
        (both start the same scaling), else ``u = a`` (potential 0)."""
        p = self.problem
        given = [x for x in (p.log_u0, p.log_v0) if x is not None]
        with np.errstate(divide="ignore"):
            log_s = sum(given) / len(given) if given else np.log(p.a)
        log_s = np.where(self.active["rows"], log_s, -np.inf)
        if self.strategy == "absorb":
            # the diagonal keeps every product of K~ = diag(u) K diag(u) positive: no
            # underflow guard is needed at any reg
            self.absorb(log_s, log_s)
            return self.unit("rows")
        if self.log:
            return log_s
        with np.errstate(over="ignore"):
            return np.exp(log_s)

    def product(self, s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(K s, the plain update of s, bad entries)`` in the strategy's form: one product
        (a log-domain pass projects lazily, so only ``K s`` is computed)."""
        numerator, exponent = self.numerator("rows"), self.exponent["rows"]
        if self.log:
            w = self.op.project("cols", s, log=True)
            result = self.op.fused_pass("rows", w, numerator, log=True, exponent=exponent)
            return result.products, result.ratios, result.bad
        products = self.op.matvec(s)
        ratios, bad = fast_ratios_and_bad(numerator, products, exponent)
        return products, ratios, bad

    def averaged(self, s: np.ndarray, ratios: np.ndarray) -> np.ndarray:
        """``(log s + log T(s)) / 2`` in the strategy's form, Anderson-mixed."""
        with np.errstate(divide="ignore", invalid="ignore"):
            if self.log:
                new = np.where(self.active["rows"], 0.5 * (s + ratios), -np.inf)
            else:
                new = np.sqrt(s * ratios)
        if self.mixer is None:
            return new
        if self.log:
            return self.mixer.step(s, new)
        alpha = self.offset["rows"]
        with np.errstate(divide="ignore"):
            x, g = alpha + np.log(s), alpha + np.log(new)
        mixed = self.mixer.step(x, g)
        if mixed is g:
            return new
        return np.where(self.active["rows"], np.exp(mixed - alpha), 0.0)

    def run(self, tol, max_iter, check_every, timed, offset=0) -> Iterate:
        # the check costs nothing (the product of the update gives it): every iteration,
        # the start's too when it is a warm start (a cold start is not a solve: as the
        # two-sided run, it takes one iteration at least)
        warm = self.problem.log_u0 is not None or self.problem.log_v0 is not None
        s = self.start_scaling()
        history: list[tuple[int, float]] = []
        times: list[float] = []
        status, n_iter, best, best_at = "max_iter", 0, math.inf, 0
        products = None
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            for iteration in range(max_iter + 1):
                begin = time.perf_counter()
                products, ratios, bad = self.product(s)
                # K s * (s - T(s)): the marginal error u * K u - a when balanced
                error = math.inf if bad.any() else self.residual(s, products, ratios)
                if not math.isfinite(error):
                    status = "breakdown"
                    break
                if iteration > 0 or warm:
                    history.append((offset + iteration, error))
                    if self.progress is not None:
                        self.progress.update(offset + iteration, error=error, target=tol)
                    if error < tol:
                        status = "converged"
                        break
                    if error < STALL_IMPROVEMENT * best:
                        best, best_at = error, iteration
                    elif iteration - best_at >= STALL_ITERATIONS:  # >= STALL_CHECKS checks
                        status = "stalled"
                        break
                if iteration == max_iter:
                    break
                s = self.averaged(s, ratios)
                n_iter = iteration + 1
                if timed:
                    times.append(time.perf_counter() - begin)
                if self.strategy == "absorb" and self.out_of_bounds(s, s):
                    log_s, _ = self.log_scalings(s, s)
                    self.absorb(log_s, log_s)
                    self.counts["absorptions"] += 1
                    s = self.unit("rows")
        log_u, _ = self.log_scalings(s, s)
        info = dict(self.counts)
        info["anderson_restarts"] = 0 if self.mixer is None else self.mixer.restarts
        if timed:
            info["iteration_times"] = times
        plain = (s, s) if self.strategy == "multiplicative" else None
        absorbed = self.op if self.strategy == "absorb" and self.op is not self.kernel else None
        # the last product is K u of the returned u: the summary's marginals need none
        fresh = self.log and status != "breakdown" and products is not None
        log_products = (products, products) if fresh else None
        return Iterate(
            log_u, log_u.copy(), n_iter, status == "converged", history, status,
            self.strategy, info, plain, absorbed, log_products,
        )  # fmt: skip
