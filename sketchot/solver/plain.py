"""The plain Sinkhorn iteration in a fixed order, without safeguard: for protocols and benchmarks.

:func:`~sketchot.sinkhorn_kernel` owns a safeguarded, fused iteration. Reproducing a paper's
protocol needs the bare update instead: a fixed number of iterations in a fixed order, each one
timed, bad denominators counted and left to propagate. :func:`plain_sinkhorn` runs it as an
option of the one iteration (:mod:`~sketchot.solver.engine`: ``order='paper'``, the
``'propagate'`` safeguard); :func:`plan_summaries` then evaluates the plans of several such
scaling pairs in one pass over a kernel, from the scalings themselves (not their logarithms, so
no ``exp(log u)`` rounding enters the costs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._validation import check_choice, check_int
from ..gibbs import sq_norms
from ..kernels import KernelOperator
from .engine import iterate
from .plans import PlanSummary, plan_summary
from .problem import Problem
from .safeguard import Safeguard

#: Orders of :func:`plain_sinkhorn`.
PLAIN_ORDERS = ("paper", "pot")


@dataclass
class PlainRun:
    """Scalings after :func:`plain_sinkhorn` and what happened on the way.

    Attributes
    ----------
    u, v : ndarray
        The scalings (plain, not logarithms) after the last iteration.
    iteration_times : list of float
        ``time.perf_counter`` seconds of each iteration (both half-steps).
    faults : int
        Non-positive or non-finite entries of the denominators ``K v`` and ``K^T u``, summed
        over all iterations (counted outside the timed region).
    """

    u: np.ndarray
    v: np.ndarray
    iteration_times: list[float]
    faults: int

    @property
    def valid(self) -> bool:
        """Whether every entry of ``u`` and ``v`` is finite and positive (a plan is defined)."""
        return all(np.all(np.isfinite(s) & (s > 0)) for s in (self.u, self.v))


def plain_sinkhorn(
    kernel: KernelOperator, a: Any, b: Any, n_iter: int = 10, order: str = "paper"
) -> PlainRun:
    """``n_iter`` plain Sinkhorn iterations through ``kernel.matvec`` and ``kernel.rmatvec``.

    Parameters
    ----------
    kernel : KernelOperator
        Any operator (exact or approximate, possibly signed).
    a, b : ndarray of shape (n,) and (m,)
        Weights.
    n_iter : int, default=10
        Iterations (each a pair of half-steps); no convergence test.
    order : {'paper', 'pot'}, default='paper'
        ``'paper'``: from ``v = 1``, ``u = a / (K v)`` then ``v = b / (K^T u)`` (Algorithm 1 of
        Han et al. 2020, the protocol of their Figure 2); ``'pot'``: from ``u = 1 / n``,
        ``v = b / (K^T u)`` then ``u = a / (K v)`` (POT's and :func:`sketchot.sinkhorn_kernel`'s
        order, without its fused passes).

    Returns
    -------
    PlainRun
        No safeguard: a non-positive or non-finite denominator is counted in ``faults`` and
        propagates (numpy's floating-point warnings are raised as usual); check
        :attr:`PlainRun.valid` before using the scalings.

    Notes
    -----
    Two kernel products per iteration: ``O((n + m) r)`` for a rank-``r`` operator.

    Examples
    --------
    >>> import numpy as np, sketchot
    >>> from sketchot.solver import plain_sinkhorn
    >>> X = np.random.default_rng(0).random((50, 3))
    >>> kernel = sketchot.make_kernel(X, X, 1.0, "exact")
    >>> run = plain_sinkhorn(kernel, np.full(50, 0.02), np.full(50, 0.02), n_iter=5)
    >>> len(run.iteration_times), run.faults, run.valid
    (5, 0, True)
    """
    n_iter = check_int(n_iter, "n_iter", minimum=1)
    check_choice(order, "order", PLAIN_ORDERS)
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    problem = Problem(a, b, kernel.geometry.reg)
    guard = Safeguard(kernel, "propagate")
    # a fixed number of iterations: tol = 0 never stops early; 'pot' checks never run past
    # max_iter, 'paper' has no check at all
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        state = iterate(
            kernel, problem, tol=0.0, max_iter=n_iter, check_every=n_iter + 1,
            strategy="multiplicative", guard=guard, order="paper" if order == "paper" else "pot",
            timed=True,
        )  # fmt: skip
    u, v = state.scalings
    return PlainRun(u, v, state.info["iteration_times"], guard.faults)


def plan_summaries(
    kernel: KernelOperator, scalings: list[tuple[np.ndarray, np.ndarray]]
) -> list[PlanSummary]:
    """:class:`PlanSummary` of ``P = diag(u) K diag(v)`` for several plain scaling pairs at once.

    Parameters
    ----------
    kernel : KernelOperator
        The kernel of the plans (the exact one gives the true costs of approximate scalings).
    scalings : list of (u, v)
        Plain, finite, positive scalings (e.g. :attr:`PlainRun.u`, :attr:`PlainRun.v`).

    Returns
    -------
    list of PlanSummary
        One per pair, in order. The cost uses ``||x - y||^2 = ||x||^2 + ||y||^2 - 2 x.y`` in
        centred coordinates: one ``matmat`` with ``d + 1`` columns per pair and one
        ``rmatmat`` with one column per pair for all of them, i.e. a single pass over a dense
        kernel. Unlike :func:`plan_summary` (log-scalings, any range) the scalings enter as
        they are.

    Examples
    --------
    >>> import numpy as np, sketchot
    >>> from sketchot.solver import plan_summaries, plain_sinkhorn
    >>> X = np.random.default_rng(0).random((40, 2))
    >>> kernel = sketchot.make_kernel(X, X, 1.0, "exact")
    >>> run = plain_sinkhorn(kernel, np.full(40, 0.025), np.full(40, 0.025), n_iter=50)
    >>> [summary] = plan_summaries(kernel, [(run.u, run.v)])
    >>> round(summary.mass, 6)
    1.0
    """
    if not scalings:
        return []
    g = kernel.geometry
    if not g.cost.sqeuclidean:  # the expansion below is the squared-Euclidean cost's
        with np.errstate(divide="ignore"):
            return [plan_summary(kernel, np.log(u), np.log(v)) for u, v in scalings]
    d = g.Yc.shape[1]
    right = np.hstack([np.column_stack([v, v[:, None] * g.Yc]) for _, v in scalings])
    K_right = kernel.matmat(right)
    Kt_left = kernel.rmatmat(np.column_stack([u for u, _ in scalings]))
    x_sq, y_sq = sq_norms(g.Xc), sq_norms(g.Yc)
    out = []
    for index, (u, v) in enumerate(scalings):
        block = K_right[:, index * (d + 1) : (index + 1) * (d + 1)]
        row, col = u * block[:, 0], v * Kt_left[:, index]
        cross = np.einsum("i,ij,ij->", u, g.Xc, block[:, 1:])
        cost = float(row @ x_sq + col @ y_sq - 2.0 * cross)
        out.append(PlanSummary(row, col, cost, float(row.sum())))
    return out


def entropic_dual(
    a: np.ndarray, b: np.ndarray, u: np.ndarray, v: np.ndarray, mass: float, reg: float
) -> float:
    """Dual value ``reg (<a, log u> + <b, log v>) - reg (mass - sum a)`` of plain scalings.

    Parameters
    ----------
    a, b : ndarray
        Weights.
    u, v : ndarray
        Positive scalings.
    mass : float
        ``u^T K v`` for the kernel of interest (:attr:`PlanSummary.mass`).
    reg : float
        Entropic regularisation.

    Returns
    -------
    float
        The entropic dual objective at ``(reg log u, reg log v)``; with uniform weights it is
        dominated by ``-2 reg log n``.
    """
    return float(reg * (a @ np.log(u) + b @ np.log(v) - (mass - a.sum())))
