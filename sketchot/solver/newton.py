"""Sinkhorn-Newton: the final stage of a balanced exact solve the first-order iteration
could not finish.

Below the squared spacing of a grid (POT's 1-D tests: ``dist0(100)`` at ``reg`` 1e-2 and
smaller, where the largest cost over ``reg`` is 1e6 and more), the plan is close to a
monotone staircase and Sinkhorn's contraction factor is close to 1: the alternate
projections move mass one cell per iteration, and the epsilon schedule only brings them near.
Newton's method on the dual converges quadratically there (Brauer, Clason, Lorenz and Wirth
2017). With the log-scalings ``alpha = f / reg``, ``beta = g / reg`` and
``P_ij = exp(alpha_i + beta_j - M_ij / reg)``, the dual

.. math:: \\Phi(\\alpha, \\beta) = \\langle a, \\alpha \\rangle + \\langle b, \\beta \\rangle
          - \\sum_{ij} P_{ij}

is concave with gradient ``(a - P 1, b - P^T 1)`` and Hessian
``-[[diag(P 1), P], [P^T, diag(P^T 1)]]``. The row potentials follow ``beta``: ``alpha`` is
always the exact row update (maximising ``Phi`` for ``beta``, so that the row marginal is
``a`` and the residual is the column marginal's, in the run's norm), and each step is
Newton's on the reduced dual ``Psi(beta) = max_alpha Phi``. The step's ``beta`` part solves
the whole ``(n + m)`` system (the Schur complement ``diag(P^T 1) - P^T diag(1 / P 1) P``
cancels to rounding on its diagonal where a column is served by one row), Jacobi-scaled,
with couplings below rounding cut so that the pieces of the plan's support (joined only by
entries of e^-100) are exactly apart, and one column pinned per piece (the Hessian is
singular along each piece's ``(1, -1)``); a Cholesky factorisation and one step of
iterative refinement. Three safeguards make it work from where the first-order run left:

* columns whose plan mass is far below their weight (entries that underflowed) take the
  exact log-domain column update instead (Newton's step there is the gap over a mass of
  almost 0);
* Levenberg-Marquardt damping on the scaled system, grown when a step is refused or cut and
  shrunk to 0 after full steps (quadratic convergence near the solution);
* a step length ``1, 1/2, ...`` that raises ``Psi`` by Armijo's share of the model's rise,
  the gain computed from the plan's rows (``sum_i a_i log sum_j pi_ij e^(t d_j)``) so that
  it keeps its digits where the potentials are 1e8.

It runs on the support of ``a`` and ``b`` with the dense cost and plan: ``O((n + m)^3)`` a
step, so only up to :data:`NEWTON_MAX_SIZE` points (:func:`applies`); it continues the
epsilon schedule from the last ``reg`` the first-order run reached down to the problem's,
each stage at most :data:`NEWTON_MAX_STEPS` steps. Measured coverage and limits:
``benchmarks/small_reg_grids.py``.

References
----------
C. Brauer, C. Clason, D. Lorenz, B. Wirth, "A Sinkhorn-Newton method for entropic optimal
transport", arXiv:1710.06635, 2017.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.linalg
import scipy.sparse
import scipy.sparse.csgraph
from scipy.special import logsumexp

from .._memory import check_fits
from .engine import STAGE_TOL, Iterate, epsilon_schedule
from .problem import Problem

#: Points on the support (``n + m``) up to which the dense Newton stage runs: the cost and
#: plan are ``n m`` floats, the Hessian ``(n + m)^2``, a step ``(n + m)^3 / 3`` flops.
NEWTON_MAX_SIZE = 3000
#: ``max_iter`` from which a run that reached it goes on with Newton (the solvers'
#: default, 1000; a smaller one caps the work).
NEWTON_MIN_BUDGET = 1000
#: Newton steps per stage of the schedule at most (quadratic convergence needs a handful
#: once near; the rest is the damped phase).
NEWTON_MAX_STEPS = 60
#: Armijo's fraction: a step is taken when it raises the dual by this share of the rise
#: the quadratic model predicts.
ARMIJO = 1e-4
#: A column whose plan mass is below this share of its weight gets the exact log-domain
#: update instead of a Newton step (its curvature is about its plan mass).
STARVED = 1e-2
#: A stage stops as stalled when its residual has not fallen below this share of its best
#: over :data:`STALL_STEPS` steps.
STALL_FACTOR = 0.99
STALL_STEPS = 8
#: Levenberg-Marquardt damping (added to the Jacobi-scaled Hessian's unit diagonal): its
#: range, and its factors after a refused and an accepted step.
MIN_DAMPING, MAX_DAMPING = 1e-10, 1e8
DAMPING_UP, DAMPING_DOWN = 10.0, 0.25
#: Jacobi-scaled couplings below this are cut (rounding of the unit diagonal).
EDGE = 1e-13
#: A continuation that missed ``tol`` is run again from this many times its first reg.
RETRY_FACTOR = 2.0**10
#: Halvings of a damped step before the damping grows instead.
MAX_HALVINGS = 8


@dataclass
class NewtonStage:
    """One ``reg`` of the Newton continuation: steps taken and the residual reached."""

    reg: float
    steps: int
    error: float
    status: str


@dataclass
class _Dual:
    """The dual on the support at one ``reg``: cost over ``reg`` and the weights."""

    full_cost: np.ndarray  # M on the support, (n', m')
    a: np.ndarray
    b: np.ndarray
    norm: str
    report: Callable[[float], None] | None = None
    cost: np.ndarray | None = None  # M / reg at the stage's reg
    stages: list[NewtonStage] = field(default_factory=list)
    damping: float = 0.0  # Levenberg-Marquardt's, carried from step to step

    def log_plan(self, alpha: np.ndarray, beta: np.ndarray) -> np.ndarray:
        return alpha[:, None] + beta[None, :] - self.cost

    def row_update(self, beta: np.ndarray) -> np.ndarray:
        """The ``alpha`` that maximises the dual for ``beta``: row marginal ``a``."""
        return np.log(self.a) - logsumexp(beta[None, :] - self.cost, axis=1)

    def error(self, columns: np.ndarray) -> float:
        """The run's residual of the column marginal (rows are exact): ``'l2'`` relative to
        ``sum(b)``, ``'l1'`` relative to ``sum(a)``."""
        gap = columns - self.b
        if self.norm == "l1":
            return float(np.abs(gap).sum() / self.a.sum())
        return float(np.linalg.norm(gap) / self.b.sum())


def wanted(state: Iterate, max_iter: int) -> bool:
    """Whether a first-order run calls for the Newton stage: it stalled or broke down, or it
    used a budget of at least :data:`NEWTON_MIN_BUDGET` iterations without converging. A
    smaller ``max_iter`` is read as a cap on the work (a rough answer asked for), and kept."""
    if state.converged:
        return False
    return state.status in ("stalled", "breakdown") or max_iter >= NEWTON_MIN_BUDGET


def applies(kernel: Any, problem: Problem, strategy: str) -> bool:
    """Whether a non-converged solve gets the Newton stage: balanced transport on the exact
    kernel (the true cost is at hand), with at most :data:`NEWTON_MAX_SIZE`
    points carrying weight."""
    if not problem.balanced or strategy == "multiplicative":
        return False
    if "exact" not in kernel.info.capabilities or not hasattr(kernel, "at_reg"):
        return False
    support = int(np.count_nonzero(problem.a)) + int(np.count_nonzero(problem.b))
    return support <= NEWTON_MAX_SIZE


def newton_stage(
    kernel: Any,
    problem: Problem,
    state: Iterate,
    *,
    tol: float,
    norm: str,
    report: Callable[[float], None] | None = None,
) -> Iterate | None:
    """Continue a non-converged first-order run with Newton steps (module notes).

    Parameters
    ----------
    kernel : KernelOperator
        The exact kernel at ``problem.reg`` (:func:`applies`).
    problem : Problem
        The balanced problem.
    state : Iterate
        The first-order run: its potentials at ``problem.reg`` and, when an epsilon schedule
        ran out of iterations early, the last ``reg`` it reached (``info['stages']``).
    tol : float
        The run's stopping residual.
    norm : {'l2', 'l1'}
        The run's residual norm.
    report : callable, optional
        Called with the residual after each step (the live progress line).

    Returns
    -------
    Iterate or None
        The continued iterate (``strategy='newton'``; ``info['newton']`` lists the stages),
        or ``None`` when Newton did not reach the problem's ``reg`` with a finite residual.
    """
    rows, cols = np.flatnonzero(problem.a > 0), np.flatnonzero(problem.b > 0)
    n, m = rows.size, cols.size
    # the cost, the plan and its logits on the support, and the Hessian
    check_fits(8.0 * (3 * n * m + 2 * (n + m) ** 2), "the Newton stage's dense arrays", "n, m")
    reg = problem.reg
    cost = kernel.geometry.cost_block(rows)[:, cols]
    a, b = problem.a[rows], problem.b[cols]
    stages = state.info.get("stages") or []
    start = stages[-1]["reg"] if stages and stages[-1]["status"] != "converged" else reg
    # potentials in cost units: the run's log-scalings are at problem.reg
    f, g = reg * state.log_u[rows], reg * state.log_v[cols]
    start = max(start, reg)
    f, g = _finite_potentials(cost / start, a, b, f / start, g / start)
    if f is None:
        return None
    dual = _Dual(cost, a, b, norm, report=report)
    f, g, error, done = _continuation(dual, tol, start * f, start * g, start, reg)
    if not error <= tol:
        # loose stages (or a stall) left potentials Newton cannot mend at this reg; at a
        # larger reg the same potentials (near the unregularised duals) are a close start
        higher = min(start * RETRY_FACTOR, max(float(cost.max()), start))
        f2, g2, error2, more = _continuation(dual, tol, f, g, higher, reg)
        done = done + more
        if error2 < error:
            f, g, error = f2, g2, error2
    if not np.isfinite(error):
        return None
    log_u = np.full(problem.a.shape, -np.inf)
    log_v = np.full(problem.b.shape, -np.inf)
    log_u[rows], log_v[cols] = f / reg, g / reg
    converged = error <= tol
    info = {**state.info, "newton": [vars(stage) for stage in done]}
    info["newton_steps"] = sum(stage.steps for stage in done)
    return Iterate(
        log_u, log_v, state.n_iter, converged, [*state.history, (state.n_iter, error)],
        "converged" if converged else done[-1].status, "newton", info,
    )  # fmt: skip


def _finite_potentials(
    cost: np.ndarray, a: np.ndarray, b: np.ndarray, alpha: np.ndarray, beta: np.ndarray
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``(alpha, beta)`` with the entries an absorbed run let underflow (a scaling of 0:
    ``-inf``) replaced by their exact log-domain update from the other side; ``(None,
    None)`` when both sides have such entries."""
    bad_rows, bad_cols = ~np.isfinite(alpha), ~np.isfinite(beta)
    if bad_rows.any() and bad_cols.any():
        return None, None
    if bad_cols.any():
        beta = beta.copy()
        beta[bad_cols] = np.log(b[bad_cols]) - logsumexp(alpha[:, None] - cost[:, bad_cols], axis=0)
    if bad_rows.any():
        alpha = alpha.copy()
        alpha[bad_rows] = np.log(a[bad_rows]) - logsumexp(beta[None, :] - cost[bad_rows], axis=1)
    return alpha, beta


def _continuation(
    dual: _Dual, tol: float, f: np.ndarray, g: np.ndarray, start: float, reg: float
) -> tuple[np.ndarray, np.ndarray, float, list[NewtonStage]]:
    """Newton stages from ``start`` down to ``reg`` (:func:`epsilon_schedule`) from the
    potentials ``(f, g)`` in cost units: the final ones, their residual and the stages."""
    cost, dual.stages, dual.damping = dual.full_cost, [], 0.0
    error = float("nan")
    for stage_reg in epsilon_schedule(reg, start):
        dual.cost = cost / stage_reg
        alpha, beta, error = _solve_stage(dual, f / stage_reg, g / stage_reg, stage_reg, tol)
        f, g = stage_reg * alpha, stage_reg * beta
        if stage_reg > reg and error > max(tol, STAGE_TOL):
            # a stage that missed leaves a worse start for the next: stop here
            return f, g, float("inf"), dual.stages
    return f, g, error, dual.stages


def _solve_stage(
    dual: _Dual, alpha: np.ndarray, beta: np.ndarray, reg: float, tol: float
) -> tuple[np.ndarray, np.ndarray, float]:
    """Steps at one ``reg`` from ``(alpha, beta)`` until the residual meets ``tol``, the step
    budget ends or the residual stops improving. Returns the potentials and residual."""
    alpha = dual.row_update(beta)
    error = dual.error(np.exp(dual.log_plan(alpha, beta)).sum(axis=0))
    status, steps, best, since = "max_iter", 0, error, 0
    while True:
        if error <= tol:
            status = "converged"
            break
        if steps == NEWTON_MAX_STEPS:
            break
        alpha, beta, error = _step(dual, alpha, beta)
        steps += 1
        if dual.report is not None:
            dual.report(error)
        best, since = (error, 0) if error < STALL_FACTOR * best else (best, since + 1)
        if since >= STALL_STEPS or not np.isfinite(error):
            status = "stalled"
            break
    dual.stages.append(NewtonStage(reg, steps, error, status))
    return alpha, beta, error


def _step(dual: _Dual, alpha: np.ndarray, beta: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """One damped Newton step in ``beta`` from row-exact ``(alpha, beta)`` (module notes).
    Returns the row-exact potentials and their residual (unchanged when no step raises
    the dual)."""
    plan = np.exp(dual.log_plan(alpha, beta))
    starved = plan.sum(axis=0) < STARVED * dual.b
    if starved.any():
        # columns far below their mass (their entries underflowed at this reg) have almost
        # no curvature: Newton's step there is the gap over the mass. Their exact
        # log-domain update instead (Sinkhorn's, on those columns only)
        beta = beta.copy()
        beta[starved] = np.log(dual.b[starved]) - logsumexp(
            alpha[:, None] - dual.cost[:, starved], axis=0
        )
        alpha = dual.row_update(beta)
        plan = np.exp(dual.log_plan(alpha, beta))
    rows, cols = plan.sum(axis=1), plan.sum(axis=0)
    gradient = dual.b - cols
    system = _NewtonSystem(plan, rows, cols, gradient, ~starved)
    conditional = plan / rows[:, None]
    while system.usable and dual.damping <= MAX_DAMPING:
        direction = system.direction(dual.damping)
        t = None if direction is None else _step_length(dual, conditional, direction, gradient)
        if t is not None:
            # a full step: trust the model more; a shortened one: less, next time
            dual.damping *= DAMPING_DOWN if t == 1.0 else DAMPING_UP
            dual.damping = 0.0 if dual.damping < MIN_DAMPING else min(dual.damping, MAX_DAMPING)
            beta = beta + t * direction
            alpha = dual.row_update(beta)
            plan = np.exp(dual.log_plan(alpha, beta))
            break
        dual.damping = max(dual.damping * DAMPING_UP, MIN_DAMPING)
    else:
        dual.damping = min(dual.damping, MAX_DAMPING)
    return alpha, beta, dual.error(plan.sum(axis=0))


def _step_length(
    dual: _Dual, conditional: np.ndarray, direction: np.ndarray, gradient: np.ndarray
) -> float | None:
    """The first ``t = 1, 1/2, ...`` (at most :data:`MAX_HALVINGS` halvings) for which
    ``beta + t direction`` passes :func:`_rises`; ``None`` when none does."""
    t = 1.0
    for _ in range(MAX_HALVINGS + 1):
        if _rises(dual, conditional, t * direction, gradient):
            return t
        t *= 0.5
    return None


def _rises(
    dual: _Dual, conditional: np.ndarray, direction: np.ndarray, gradient: np.ndarray
) -> bool:
    """Whether ``beta + direction`` raises the reduced dual ``Psi`` by Armijo's share of
    the model's first-order rise ``<gradient, direction>``.

    ``Psi(beta + d) - Psi(beta) = <b, d> - sum_i a_i log sum_j pi_ij e^(d_j)`` with the
    plan's rows ``pi = diag(1 / P 1) P``: no potential of size ``cost / reg`` enters, so the
    gain keeps its digits where the potentials are 1e8."""
    rise = float(gradient @ direction)
    if not (np.isfinite(rise) and rise > 0):
        return False
    shift = float(np.max(direction))  # e^(d_j - shift) <= 1: no overflow
    with np.errstate(divide="ignore"):
        logs = np.log(conditional @ np.exp(direction - shift)) + shift
    gain = float(dual.b @ direction) - float(dual.a @ logs)
    return bool(np.isfinite(gain) and gain >= ARMIJO * rise)


def _unpinned(coupling: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Columns that stay free: all but the heaviest of each connected piece of the plan's
    support (bipartite graph of the nonzero ``coupling``), whose Hessian is singular along
    that piece's ``(1, -1)``."""
    n, m = coupling.shape
    graph = scipy.sparse.bmat(
        [[None, scipy.sparse.csr_matrix(coupling)], [scipy.sparse.csr_matrix(coupling.T), None]]
    )
    _, labels = scipy.sparse.csgraph.connected_components(graph, directed=False)
    col_labels = labels[n:]
    free = np.ones(m, dtype=bool)
    order = np.lexsort((-cols, col_labels))  # by piece, heaviest first
    first = np.ones(m, dtype=bool)
    first[1:] = col_labels[order][1:] != col_labels[order][:-1]
    free[order[first]] = False
    return free


class _NewtonSystem:
    """``[[diag(rows), P], [P^T, diag(cols)]] x = (0, gradient)`` (the rows are exact) on
    the ``free`` columns, Jacobi-scaled (unit diagonal), with the heaviest column's variable
    pinned to 0 (the ``(1, -1)`` null direction; a light column barely anchors the rest).
    Solved whole rather than through the Schur complement
    ``diag(cols) - P^T diag(1 / rows) P``, whose diagonal cancels to rounding where a column
    is served by one row. :meth:`direction` adds Levenberg-Marquardt's ``damping`` to the
    unit diagonal: near-null directions (pieces of the plan joined by entries of e^-100)
    take steps of the gradient's size instead of the gap over the coupling."""

    def __init__(
        self, plan: np.ndarray, rows: np.ndarray, cols: np.ndarray, gradient: np.ndarray,
        free: np.ndarray,
    ) -> None:  # fmt: skip
        n, m = plan.shape
        # Jacobi scaling; couplings below rounding of the unit diagonal are cut, so that the
        # plan's pieces (joined only by underflowed entries) are exactly apart
        coupling = plan / np.sqrt(rows)[:, None] / np.sqrt(cols)[None, :]
        coupling[~(coupling > EDGE)] = 0.0
        self.free = free & _unpinned(coupling, cols)
        self.usable = bool(self.free.any())
        block = coupling[:, self.free]
        size = n + int(self.free.sum())
        self.scaled = np.eye(size)
        self.scaled[:n, n:] = block
        self.scaled[n:, :n] = block.T
        self.scale = np.sqrt(np.concatenate([rows, cols[self.free]]))
        self.rhs = np.concatenate([np.zeros(n), gradient[self.free]]) / self.scale
        self.n, self.m = n, m

    def direction(self, damping: float) -> np.ndarray | None:
        """The step in ``beta`` (0 on the pinned and non-free columns), or ``None``."""
        matrix = self.scaled + damping * np.eye(self.scaled.shape[0])
        try:
            factor = scipy.linalg.cho_factor(matrix, check_finite=False)
            solution = scipy.linalg.cho_solve(factor, self.rhs, check_finite=False)
            # one step of iterative refinement: a graph Laplacian whose weights span many
            # orders of magnitude at small reg
            solution += scipy.linalg.cho_solve(
                factor, self.rhs - matrix @ solution, check_finite=False
            )
        except np.linalg.LinAlgError:
            return None  # singular: a larger damping makes it definite
        if not np.all(np.isfinite(solution)):
            return None
        direction = np.zeros(self.m)
        direction[self.free] = (solution / self.scale)[self.n :]
        return direction
