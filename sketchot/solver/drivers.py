"""The drivers of the Sinkhorn iteration: the order of the half-steps, checks and repairs.

A driver runs one stage (one kernel, one ``reg``) of :func:`~sketchot.solver.engine.iterate`:
it asks its strategy (:mod:`~sketchot.solver.strategies`) for the half-steps, its
:class:`~sketchot.solver.stopping.Stopper` whether to stop, and mixes the column
log-potentials (Anderson). :class:`TwoSidedRun` is POT's iteration (``v`` then ``u``, a check
every ``check_every`` iterations); :class:`SymmetricRun` the averaged update of one scaling,
checked at every iteration. Both share the stopper and the result's assembly (:class:`Run`);
the paper's plain protocol has its own driver (:mod:`~sketchot.solver.paper`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..kernels import KernelOperator
from ..kernels.base import IdentityPass
from .acceleration import AndersonMixer, BlockAndersonMixer
from .problem import Problem
from .safeguard import Safeguard
from .stopping import ResidualNorm, Stopper
from .strategies import make_strategy


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
    absorbed_products : tuple of ndarray or None
        ``(K~ v~, K~^T u~)`` of the final scalings relative to :attr:`absorbed` (the absorbing
        strategy's last two passes, when no absorption came after them): the plan's column
        sums ``v~ K~^T u~`` without a product. ``None`` otherwise.
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
    absorbed_products: tuple[np.ndarray, np.ndarray] | None = None


def is_check(iteration: int, final: bool, warm: bool, check_every: int) -> bool:
    """Whether the two-sided run checks at ``iteration`` (1-based, its columns pass done):
    every ``check_every`` iterations from the second, at the last, and at the first after a
    warm start whose rows are exact (the start's own error)."""
    if iteration == 1:
        return warm
    return (iteration - 2) % check_every == 0 or final


class Run:
    """One stage of the iteration on one kernel: what every driver shares (the strategy,
    Anderson mixing, the residual's norm, the start and the result).

    Parameters
    ----------
    kernel : KernelOperator
        The kernel at ``problem.reg``.
    problem : Problem
        Weights, ``reg``, marginal penalties and an optional warm start.
    strategy : {'multiplicative', 'absorb', 'log'}
        The strategy's name.
    anderson : int
        Anderson memory (0: none).
    guard : Safeguard, optional
        Policy for bad denominators.
    progress : object, optional
        Receives the checks (:class:`~sketchot.solver.stopping.Stopper`).
    norm : {'l2', 'l1'}
        The residual's norm.
    """

    def __init__(
        self,
        kernel: KernelOperator,
        problem: Problem,
        strategy: str,
        anderson: int,
        guard: Safeguard | None,
        progress: Any,
        norm: str = "l2",
    ) -> None:
        if "deferred" in kernel.info.capabilities and (strategy != "multiplicative" or anderson):
            raise ValueError(
                f"backend {kernel.info.backend!r} computes its passes lazily ('deferred'): it "
                f"runs the plain multiplicative iteration (got strategy={strategy!r}, "
                f"anderson={anderson})"
            )
        self.kernel, self.problem, self.progress = kernel, problem, progress
        self.strategy = make_strategy(kernel, problem, strategy, guard)
        active, blocks = self.strategy.active["cols"], self.strategy.blocks
        self.mixer = None
        if anderson and blocks > 1:
            self.mixer = BlockAndersonMixer(anderson, active, blocks)
        elif anderson:
            self.mixer = AndersonMixer(anderson, active)
        self.measure = ResidualNorm(norm, problem.a, problem.b, blocks)

    def initial_logs(self) -> tuple[np.ndarray, np.ndarray]:
        """The start's log-scalings: the warm start's, else POT's ``u = 1/n`` and
        :meth:`cold_log_v`."""
        p, active = self.problem, self.strategy.active
        if p.log_u0 is not None:
            log_u = np.where(active["rows"], p.log_u0, -np.inf)
        else:
            log_u = np.where(active["rows"], -math.log(self.kernel.shape[0]), -np.inf)
        if p.log_v0 is not None:
            return log_u, np.where(active["cols"], p.log_v0, -np.inf)
        return log_u, self.cold_log_v()

    def cold_log_v(self) -> np.ndarray:
        """POT's ``v = 1/m`` (zero weights excluded)."""
        active = self.strategy.active["cols"]
        return np.where(active, -math.log(self.kernel.shape[1]), -np.inf)

    def result(self, log_u, log_v, n_iter, status, history, times, scalings, products=None):
        """The :class:`Iterate` of the run (``times``: ``None`` when not timed)."""
        st = self.strategy
        info = dict(st.counts)
        info["anderson_restarts"] = 0 if self.mixer is None else self.mixer.restarts
        if times is not None:
            info["iteration_times"] = times
        plain = scalings if st.name == "multiplicative" else None
        absorbed = st.op if st.name == "absorb" and st.op is not st.kernel else None
        return Iterate(
            log_u, log_v, n_iter, status == "converged", history, status, st.name, info,
            plain, absorbed, products,
        )  # fmt: skip


class TwoSidedRun(Run):
    """POT's iteration: from ``u = 1/n`` (or a warm start), ``v = b / K^T u`` then
    ``u = a / K v``; the residual of the columns at the columns pass of a check, so that
    the returned ``u`` makes the rows exact. Breakdowns of the absorbed strategy are repaired
    by an exact log-domain iteration (:meth:`reset`); a multiplicative breakdown returns the
    last finite iterate."""

    def begin(self) -> bool:
        """Set the start's scalings and projection; whether the run checks the start (a
        log-domain warm start given on both sides)."""
        st, p = self.strategy, self.problem
        u, v = st.enter(*self.initial_logs(), exact_first=p.log_v0 is None)
        self.scaling = {"rows": u, "cols": v}
        # the last pass over the rows side: log(K v) of the current v (and its operator)
        self.rows_pass = self.rows_op = None
        self.n_iter = 0
        warm = st.log and p.log_u0 is not None and p.log_v0 is not None
        if warm:
            # a warm start's v is used, not discarded: a rows half-step from it gives u and
            # the projection the first columns pass needs (the products a projection of u
            # would cost, half an iteration further on); its rows are then exact, so the
            # first columns pass already measures the start's error (a start that meets
            # tol takes no iteration)
            w = st.op.project("cols", v, log=True)
            self.scaling["rows"], self.projection, self.rows_pass = st.half_step("rows", w, v)
        else:
            self.projection = st.project("rows", u)
        self.last_finite = (self.scaling["rows"], self.scaling["cols"])
        return warm

    def run(self, tol, max_iter, check_every, timed, offset=0) -> Iterate:
        warm = self.begin()
        stopper = Stopper(tol, self.progress, offset)
        times: list[float] | None = [] if timed else None
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            status, result = self.iterate(stopper, max_iter, check_every, warm, times)
        return self.finish(stopper, status or "max_iter", result, times)

    def iterate(
        self, stopper: Stopper, max_iter: int, check_every: int, warm: bool, times: Any
    ) -> tuple[str | None, Any]:
        """The iterations: ``(status, the last columns pass)``; ``times`` (a list, or
        ``None``) takes each iteration's seconds."""
        st = self.strategy
        status = result = None
        for iteration in range(1, max_iter + 2):
            begin = time.perf_counter()
            final = iteration == max_iter + 1
            new, proj_first, result = st.half_step("cols", self.projection, self.scaling["rows"])
            if is_check(iteration, final, warm, check_every):
                status = self.check(stopper, iteration, result, max_iter)
                if status == "reset":
                    status = None
                    continue
                if status is not None:
                    break
            if final:
                break
            self.update(new, proj_first, result)
            self.n_iter = iteration
            if times is not None:
                times.append(time.perf_counter() - begin)
            status = self.after_iteration(max_iter) if st.tests_iterates else None
            if status is not None:
                break
        return status, result

    def finish(self, stopper: Stopper, status: str, result: Any, times: Any) -> Iterate:
        """The run's :class:`Iterate`, with the final passes' products where both passes
        read the final scalings (``result``: the last columns pass)."""
        st = self.strategy
        st.finish()
        log_u, log_v = st.log_scalings(self.scaling["rows"], self.scaling["cols"])
        # the check read K^T u of the final u; the last rows pass K v of the final v
        final_passes = (
            status in ("converged", "stalled", "max_iter")
            and self.rows_pass is not None
            and isinstance(result, IdentityPass)
        )
        products = (self.rows_pass.products, result.products) if final_passes and st.log else None
        scalings = (self.scaling["rows"], self.scaling["cols"])
        iterate = self.result(
            log_u, log_v, self.n_iter, status, stopper.history, times, scalings, products
        )
        if final_passes and iterate.absorbed is not None and self.rows_op is st.op:
            # both passes on the final absorbed kernel (no absorption after the rows pass)
            iterate.absorbed_products = (self.rows_pass.products, result.products)
        return iterate

    def check(self, stopper: Stopper, iteration: int, result: Any, max_iter: int) -> str | None:
        """The stopper's status at a check (``'reset'``: a breakdown repaired, go on)."""
        st = self.strategy
        error = st.check_error(self.scaling["cols"], result, self.measure)
        status = stopper.check(iteration - 1, error)
        if status == "breakdown" and st.can_reset(self.n_iter, max_iter):
            self.reset()
            self.n_iter = iteration  # the exact iteration
            return "reset"
        return status

    def update(self, new: np.ndarray, proj_first: np.ndarray, result: Any) -> None:
        """The rest of an iteration after its columns pass: mixing, then the rows pass."""
        st = self.strategy
        new, mixed = self.mix(new, result)
        if mixed:
            proj_first = st.project("cols", new)
        self.scaling["cols"] = new
        self.scaling["rows"], self.projection, self.rows_pass = st.half_step(
            "rows", proj_first, new
        )
        self.rows_op = st.op

    def mix(self, new: np.ndarray, result: Any) -> tuple[np.ndarray, bool]:
        """``(column update, whether it was extrapolated)``: Anderson mixing of the column
        log-potentials, restarted after a pass with bad entries (the map itself changed)."""
        if self.mixer is None:
            return new, False
        if result.n_bad:
            self.mixer.reset()
            return new, False
        return self.strategy.mix(self.mixer, "cols", self.scaling["cols"], new)

    def after_iteration(self, max_iter: int) -> str | None:
        """Tests and repairs of the scalings after an iteration (``'breakdown'``: the last
        finite iterate is restored and the run stops)."""
        st = self.strategy
        u, v = self.scaling["rows"], self.scaling["cols"]
        if not (math.isfinite(u.sum()) and math.isfinite(v.sum())):
            if st.can_reset(self.n_iter, max_iter):
                self.reset()
                return None
            self.scaling = {"rows": self.last_finite[0], "cols": self.last_finite[1]}
            self.n_iter -= 1
            return "breakdown"
        tidied = st.tidy(u, v)
        if tidied is not None:
            self.scaling, self.projection = tidied
        self.last_finite = (self.scaling["rows"], self.scaling["cols"])
        return None

    def reset(self) -> None:
        """An exact log-domain iteration from the last finite ``u``, absorbed; Anderson's
        history restarts (the map's variables changed)."""
        self.scaling, self.projection = self.strategy.reset(self.last_finite[0])
        self.rows_pass = None
        if self.mixer is not None:
            self.mixer.reset()


class SymmetricRun(Run):
    """The symmetric iteration (engine notes): one scaling ``s`` (the rows' and the
    columns'), one product per iteration, checked before each update."""

    def start_scaling(self) -> np.ndarray:
        """The start in the strategy's form: the mean of the warm start's two log-scalings
        (both start the same scaling), else ``u = a`` (potential 0)."""
        p, st = self.problem, self.strategy
        given = [x for x in (p.log_u0, p.log_v0) if x is not None]
        with np.errstate(divide="ignore"):
            log_s = sum(given) / len(given) if given else np.log(p.a)
        log_s = np.where(st.active["rows"], log_s, -np.inf)
        # absorbed: the diagonal keeps every product of K~ = diag(u) K diag(u) positive, no
        # underflow guard is needed at any reg
        return st.enter(log_s, log_s)[0]

    def averaged(self, s: np.ndarray, ratios: np.ndarray) -> np.ndarray:
        """``(log s + log T(s)) / 2`` in the strategy's form, Anderson-mixed."""
        new = self.strategy.average(s, ratios)
        if self.mixer is None:
            return new
        return self.strategy.mix(self.mixer, "rows", s, new)[0]

    def run(self, tol, max_iter, check_every, timed, offset=0) -> Iterate:
        # the check costs nothing (the product of the update gives it): every iteration,
        # the start's too when it is a warm start (a cold start is not a solve: as the
        # two-sided run, it takes one iteration at least)
        st = self.strategy
        warm = self.problem.log_u0 is not None or self.problem.log_v0 is not None
        s = self.start_scaling()
        stopper = Stopper(tol, self.progress, offset)
        times: list[float] = []
        status, n_iter, products = None, 0, None
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            for iteration in range(max_iter + 1):
                begin = time.perf_counter()
                products, ratios, bad = st.symmetric_product(s)
                # K s * (s - T(s)): the marginal error u * K u - a when balanced
                error = math.inf if bad.any() else st.residual(s, products, ratios, self.measure)
                status = stopper.check(iteration, error, record=iteration > 0 or warm)
                if status is not None or iteration == max_iter:
                    break
                s = self.averaged(s, ratios)
                n_iter = iteration + 1
                if timed:
                    times.append(time.perf_counter() - begin)
                s = st.keep_in_bounds(s)
        status = status or "max_iter"
        log_u, _ = st.log_scalings(s, s)
        # the last product is K u of the returned u: the summary's marginals need none
        fresh = st.log and status != "breakdown" and products is not None
        return self.result(
            log_u, log_u.copy(), n_iter, status, stopper.history, times if timed else None,
            (s, s), (products, products) if fresh else None,
        )  # fmt: skip
