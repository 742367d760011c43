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
log-potentials and an epsilon schedule (:func:`epsilon_schedule`, for kernels that can be
rebuilt at another ``reg``) are options of the same loop. The paper's plain protocol
(``order='paper'``: from ``v = 1``, ``u`` first, a fixed number of iterations, no check) has
its own driver (:mod:`~sketchot.solver.paper`), with the same strategies' half-steps.

The pieces: the strategies (:mod:`~sketchot.solver.strategies`: the form of the iterate and
its half-step), the stopper (:mod:`~sketchot.solver.stopping`: the residual's norm, checks,
stalls and history) and the drivers (:mod:`~sketchot.solver.drivers`: the two-sided and the
symmetric iteration, which share the stopper). This module picks and chains them: the
strategy from the kernel's capabilities, the symmetric iteration and its fallback, the stages
of an epsilon schedule and the log-domain retry of an absorbed breakdown.

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
from functools import partial
from typing import Any

import numpy as np

from ..kernels import KernelOperator
from .drivers import Iterate, Run, SymmetricRun, TwoSidedRun
from .paper import PaperRun
from .problem import Problem
from .safeguard import Safeguard
from .stopping import NORMS, STALL_CHECKS, STALL_IMPROVEMENT, STALL_ITERATIONS
from .strategies import ABSORB_THRESHOLD, MAX_RESETS, STRATEGIES

__all__ = [
    "ABSORB_THRESHOLD", "MAX_RESETS", "NORMS", "ORDERS", "STAGE_TOL", "STALL_CHECKS",
    "STALL_IMPROVEMENT", "STALL_ITERATIONS", "STRATEGIES", "Iterate", "annealing_kernels",
    "choose_strategy", "epsilon_schedule", "is_symmetric", "iterate",
]  # fmt: skip

#: Intermediate stages of the epsilon schedule stop at this residual (in the run's norm, relative
#: to its mass); the last stage dominates whatever the choice.
STAGE_TOL = 1e-3

ORDERS = ("pot", "paper")


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
        problem.penalties[0] == problem.penalties[1]
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
        Weights, ``reg``, marginal penalties and an optional warm start.
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
        ``'paper'``: from ``v = 1``, ``u`` first, ``max_iter`` iterations, no check (the
        paper benchmark's protocol, its own driver: :class:`~sketchot.solver.paper.PaperRun`).
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
            progress, timed, schedule)  # fmt: skip
    if order == "paper":
        return _iterate(PaperRun, *args)
    if not symmetric:
        return _iterate(TwoSidedRun, *args)
    result = _iterate(SymmetricRun, *args)
    if result.status in ("breakdown", "stalled"):
        # a signed approximation's non-positive product (or a kernel far from positive
        # semi-definite, where the averaged update need not contract): the two-sided
        # iteration has the safeguard that repairs it
        result = _iterate(TwoSidedRun, *args)
        result.info["fallback"] = "two-sided"
    else:
        result.info["symmetric"] = True
    return result


def _iterate(
    runner: type[Run], kernel, problem, tol, max_iter, norm, check_every, strategy, anderson,
    guard, progress, timed, schedule,
) -> Iterate:  # fmt: skip
    """:func:`iterate` with one driver (two-sided, symmetric or the paper's)."""
    stage = partial(_stage, runner, anderson=anderson, guard=guard, progress=progress, norm=norm)
    if schedule:
        return _scheduled(stage, kernel, problem, schedule, tol, max_iter, check_every, strategy,
                          timed)  # fmt: skip
    result = stage(kernel, problem, strategy, tol, max_iter, check_every, timed)
    if result.status == "breakdown" and _log_fallback(kernel, problem, strategy):
        # marginals below float64's range (far outliers of unbalanced transport): the
        # linear absorbed kernel cannot hold them, its log-domain passes can
        result = stage(kernel, problem, "log", tol, max_iter, check_every, timed)
        result.info["fallback"] = "log"
    return result


def _stage(
    runner, kernel, problem, strategy, tol, max_iter, check_every, timed, offset=0, *,
    anderson, guard, progress, norm,
) -> Iterate:  # fmt: skip
    """One run of ``runner`` on one kernel."""
    run = runner(kernel, problem, strategy, anderson, guard, progress, norm)
    return run.run(tol, max_iter, check_every, timed, offset=offset)


def _scheduled(
    stage, kernel, problem, schedule, tol, max_iter, check_every, strategy, timed
) -> Iterate:
    """The stages of an epsilon schedule, then ``kernel``: each warm-started from the
    previous potentials in cost units, the iteration budget shared."""
    total, history, stages, info = 0, [], [], {"absorptions": 0, "resets": 0}
    log_u = log_v = None
    for stage_kernel in [*schedule, kernel]:
        last = stage_kernel is kernel
        reg = stage_kernel.geometry.reg
        stage_problem = problem.at_reg(reg, log_u, log_v)
        stage_tol = tol if last else max(tol, STAGE_TOL)  # residuals are relative already
        every = check_every if last else 1  # checks are free: don't overshoot a loose tol
        result = stage(stage_kernel, stage_problem, strategy, stage_tol, max_iter - total,
                       every, timed, total)  # fmt: skip
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
