"""The numerical forms of the Sinkhorn half-step: multiplicative, absorbed and log-domain.

A strategy owns the iterate's form and everything that depends on it: the start, the fused
pass of one half-step (products, ratios, the next projection) and what it does with bad
denominators, the residual's vector, Anderson mixing's change of variables, the symmetric
iteration's product and average, and the tests and repairs between iterations (the
safeguard's rebalancing, absorptions, exact log-domain resets). The drivers of
:mod:`~sketchot.solver.engine` call them in the order of the iteration and know nothing of the
form (see the engine's module notes for the strategies themselves).

:func:`make_strategy` picks the class from the strategy's name and the kernel's capabilities:
:class:`Multiplicative` (:class:`Deferred` for a kernel with lazy passes), :class:`Absorbed`
or :class:`LogDomain`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..kernels import KernelOperator, RatioStep
from ..kernels.base import LOG_FLOOR, fast_ratios_and_bad
from .errors import LinearRangeError
from .penalties import LOG_HUGE, LOG_TINY
from .problem import Problem
from .safeguard import Safeguard
from .stopping import ResidualNorm

#: Absorption thresholds ``tau`` on ``|log u~|``, ``|log v~|`` per storage precision, at any
#: size (see :class:`sketchot.kernels.exact.AbsorbedExactKernel` for why the entry floor is
#: harmless); smaller problems get more (:func:`absorb_threshold`).
ABSORB_THRESHOLD = {np.dtype(np.float64): 100.0, np.dtype(np.float32): 20.0}

#: The largest thresholds :func:`absorb_threshold` gives. Columns of an absorbed kernel are
#: not normalised, so float32 products can grow beyond ``e^(2 tau)``: at 32, a batch of 5 x 10
#: points at reg 1e-3 broke down where 20 and 30 did not, and 30 left no more pairs
#: unconverged than 20 over 288 small pairs at reg 1e-2 to 1e-3 (both measured before
#: batches solved such pairs alone).
ABSORB_THRESHOLD_MAX = {np.dtype(np.float64): 100.0, np.dtype(np.float32): 30.0}


def absorb_threshold(dtype: Any, rows: int, cols: int, smallest_weight: float) -> float:
    """The absorption threshold ``tau`` of a kernel stored in ``dtype`` whose blocks have
    ``rows x cols`` entries, for weights of at least ``smallest_weight``.

    An entry clamped at the floor ``t`` (:data:`~sketchot.kernels.base.LOG_FLOOR`) changes
    a row sum by at most ``m t e^(2 tau) / a_i`` relative
    (:class:`~sketchot.kernels.exact.AbsorbedExactKernel`), a column sum by ``n t e^(2 tau) /
    b_j``. ``tau`` is the largest that keeps both at most the precision's epsilon, but never
    below :data:`ABSORB_THRESHOLD` (the bound falls below it beyond about 3 x 10^6 points
    in float32, where the old threshold is kept) and at most :data:`ABSORB_THRESHOLD_MAX`.
    Fewer absorptions in float32 for small problems: 200 x 200 points of uniform weights get
    ``tau = 29.7`` instead of 20 (batches absorb about a third fewer entries). Depends on
    the dtype, the shape and the weights alone.
    """
    dtype = np.dtype(dtype)
    base = ABSORB_THRESHOLD.get(dtype, 20.0)
    cap = ABSORB_THRESHOLD_MAX.get(dtype, base)
    if dtype not in LOG_FLOOR or not smallest_weight > 0.0:
        return base
    allowed = 0.5 * (
        math.log(np.finfo(dtype).eps) - LOG_FLOOR[dtype] - math.log(max(rows, cols, 1))
        + math.log(smallest_weight)
    )  # fmt: skip
    return max(base, min(cap, allowed))


#: Breakdowns repaired by an exact log-domain iteration before the run gives up.
MAX_RESETS = 20

STRATEGIES = ("multiplicative", "absorb", "log")


class Strategy:
    """The state every form shares: the kernel and its absorbed version, the problem's
    weights, penalties and supports, absorbed offsets and counters. The linear forms'
    behaviour is the default; :class:`LogDomain` overrides it.

    Parameters
    ----------
    kernel : KernelOperator
        The kernel at ``problem.reg``.
    problem : Problem
        Weights, ``reg``, marginal penalties and an optional warm start.
    guard : Safeguard, optional
        Policy for bad denominators (multiplicative strategy).
    """

    #: The strategy's name in :attr:`~sketchot.solver.engine.Iterate.strategy`.
    name = "multiplicative"
    #: Whether the iterate holds logarithms.
    log = False
    #: Whether the scalings are tested (finite, bounds) and repaired between iterations.
    tests_iterates = True

    def __init__(self, kernel: KernelOperator, problem: Problem, guard: Safeguard | None = None):
        self.kernel, self.problem, self.guard = kernel, problem, guard
        self.active = {"rows": problem.a > 0, "cols": problem.b > 0}
        self.all_active = bool(self.active["rows"].all() and self.active["cols"].all())
        with np.errstate(divide="ignore"):
            self.log_weights = {"rows": np.log(problem.a), "cols": np.log(problem.b)}
        self.penalty = {"rows": problem.penalties[0], "cols": problem.penalties[1]}
        caps = kernel.info.capabilities
        self.blocks = kernel.info.params["batch"] if "block_diagonal" in caps else 1
        self.counts = {"absorptions": 0, "resets": 0}
        # absorbed log-scalings (alpha, beta); a scalar zero until the first absorption
        self.offset = {"rows": 0.0, "cols": 0.0}
        self.op = kernel
        positive = [w[w > 0] for w in (problem.a, problem.b)]
        smallest = min((float(w.min()) for w in positive if w.size), default=0.0)
        rows, cols = (size // self.blocks for size in kernel.shape)
        self.tau = absorb_threshold(kernel.dtype, rows, cols, smallest)

    # ------------------------------------------------------------ numerators
    def log_numerator(self, side: str) -> np.ndarray:
        """The logarithm of the passes' numerator, from the side's penalty (``log w / rho``
        for a KL penalty: ``s = w (K s')^-rho`` is ``(w^(1/rho) / K s')^rho``)."""
        return self.penalty[side].log_numerator(self.log_weights[side], self.problem.reg)

    def shifted_log_numerator(self, side: str) -> np.ndarray:
        """The numerator's logarithm in the form's variables (:class:`Absorbed` shifts it)."""
        return self.log_numerator(side)

    def numerator(self, side: str) -> np.ndarray:
        """The numerator of the passes, in their form."""
        if self.penalty[side].exponent(self.problem.reg) == 1.0:
            return self.problem.a if side == "rows" else self.problem.b
        log_numerator = self.shifted_log_numerator(side)
        with np.errstate(over="ignore", invalid="ignore"):
            return np.where(self.active[side], np.exp(log_numerator), 0.0)

    def step(self, side: str, log: bool | None = None, offset: Any = None) -> RatioStep:
        """The side's penalty step in the form of the passes (the current offsets unless
        ``offset`` is given; ``log`` defaults to the form's)."""
        return self.penalty[side].step(
            self.log_weights[side],
            self.offset[side] if offset is None else offset,
            self.problem.reg,
            self.log if log is None else log,
        )

    # ------------------------------------------------------------ the half-step
    def fused_pass(self, side: str, w: np.ndarray):
        """``(numerator, pass)``: one fused pass of the current operator."""
        numerator = self.numerator(side)
        result = self.op.fused_pass(side, w, numerator, log=self.log, step=self.step(side))
        return numerator, result

    def half_step(self, side: str, w: np.ndarray, other: np.ndarray):
        """One fused pass: ``(new scaling of side, its projection, pass)``; the safeguard
        repairs bad entries (without one they keep the pass's zero ratios)."""
        numerator, result = self.fused_pass(side, w)
        if not result.n_bad or self.guard is None:
            return result.ratios, result.projection, result
        ratios, projection = self.guard.apply(side, result, numerator, other, self.step(side))
        return ratios, projection, result

    def project(self, side: str, s: np.ndarray) -> np.ndarray:
        """The projection of one side's scaling, in the form."""
        return self.op.project(side, s, log=self.log)

    # ------------------------------------------------------------ start and logarithms
    def enter(self, log_u: np.ndarray, log_v: np.ndarray, exact_first: bool = False):
        """The start ``(u, v)`` in the form, from log-scalings; ``exact_first``: POT's cold
        start, which an absorbing strategy may replace by an exact log-domain iteration."""
        with np.errstate(over="ignore"):
            return np.exp(log_u), np.exp(log_v)

    def unit(self, side: str) -> np.ndarray:
        return self.active[side].astype(np.float64)

    def log_scalings(self, u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Total log-scalings of the iterate (offsets included)."""
        with np.errstate(divide="ignore"):
            log_u = np.where(self.active["rows"], self.offset["rows"] + np.log(u), -np.inf)
            log_v = np.where(self.active["cols"], self.offset["cols"] + np.log(v), -np.inf)
        return log_u, log_v

    def exact_iteration(self, log_u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One iteration in the log domain on the kernel itself (``'log_products'``)."""
        kernel = self.kernel
        z = kernel.project("rows", log_u, log=True)
        cols = kernel.fused_pass(
            "cols", z, self.log_numerator("cols"), log=True,
            step=self.step("cols", log=True, offset=0.0),
        )  # fmt: skip
        rows = kernel.fused_pass(
            "rows", cols.projection, self.log_numerator("rows"), log=True,
            step=self.step("rows", log=True, offset=0.0),
        )  # fmt: skip
        return rows.ratios, cols.ratios

    # ------------------------------------------------------------ the residual
    def difference(self, v: np.ndarray, products: np.ndarray, ratios: np.ndarray) -> np.ndarray:
        """``K^T u * (v - v_next)`` from the columns pass's ``products`` and ``ratios``."""
        return products * v - products * ratios

    def residual(self, v, products, ratios, measure: ResidualNorm) -> float:
        """The fixed-point residual of the columns in ``measure``'s norm (engine notes)."""
        diff = self.difference(v, products, ratios)
        if not self.all_active:
            diff = np.where(self.active["cols"], diff, 0.0)
        return measure(diff)

    def check_error(self, v: np.ndarray, result: Any, measure: ResidualNorm) -> float:
        """The residual at a check, from the columns pass ``result`` of the scaling ``v``."""
        return self.residual(v, result.products, result.ratios, measure)

    # ------------------------------------------------------------ Anderson mixing
    def mix(self, mixer: Any, side: str, previous: np.ndarray, new: np.ndarray):
        """``(update, whether it was extrapolated)``: Anderson mixing of the side's total
        log-potentials (offsets included), back in the form."""
        offset = self.offset[side]
        with np.errstate(divide="ignore"):
            x, g = offset + np.log(previous), offset + np.log(new)
        mixed = mixer.step(x, g)
        if mixed is g:
            return new, False
        return np.where(self.active[side], np.exp(mixed - offset), 0.0), True

    # ------------------------------------------------------------ the symmetric iteration
    def symmetric_product(self, s: np.ndarray):
        """``(K s, the plain update of s, bad entries)`` in the form: one product."""
        numerator, step = self.numerator("rows"), self.step("rows")
        products = self.op.matvec(s)
        ratios, bad = fast_ratios_and_bad(numerator, products, step)
        return products, ratios, bad

    def average(self, s: np.ndarray, ratios: np.ndarray) -> np.ndarray:
        """``(log s + log T(s)) / 2`` in the form."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.sqrt(s * ratios)

    def keep_in_bounds(self, s: np.ndarray) -> np.ndarray:
        """The symmetric scaling after an absorption if one is due (:class:`Absorbed`)."""
        return s

    # ------------------------------------------------------------ between iterations
    def tidy(self, u: np.ndarray, v: np.ndarray):
        """After an iteration of finite scalings: ``None`` when they stay as they are, else
        ``(scalings, projection of the rows)``, rebalanced after repairs."""
        if self.guard is None or not self.guard.repaired:
            return None
        u, v = rebalance(u, v)
        return {"rows": u, "cols": v}, self.op.project("rows", u)

    def can_reset(self, n_iter: int, max_iter: int) -> bool:
        """Whether a breakdown is repaired by an exact log-domain iteration (:class:`Absorbed`)."""
        return False

    def finish(self) -> None:
        """Settle what is still lazy (:class:`Deferred`)."""


class Multiplicative(Strategy):
    """Passes on plain scalings; bad denominators of a signed approximation go to the
    :class:`~sketchot.solver.safeguard.Safeguard`. Refused up front when a KL penalty's
    numerators ``w^(1 / rho)`` leave float64 (:func:`check_linear_range`)."""

    def __init__(self, kernel: KernelOperator, problem: Problem, guard: Safeguard | None = None):
        super().__init__(kernel, problem, guard)
        check_linear_range(kernel, problem, self.log_weights)


class Deferred(Multiplicative):
    """The multiplicative strategy on an operator whose passes are lazy (the ``'deferred'``
    capability): the passes between two checks stay unevaluated; at a check their bad
    entries and the residual are computed in one evaluation (engine notes). No per-iteration
    tests: they would force the values."""

    tests_iterates = False

    def __init__(self, kernel: KernelOperator, problem: Problem, guard: Safeguard | None = None):
        super().__init__(kernel, problem, guard)
        # passes whose bad entries are not counted yet
        self.pending: list[tuple[str, Any]] = []

    def half_step(self, side: str, w: np.ndarray, other: np.ndarray):
        _, result = self.fused_pass(side, w)
        self.pending.append((side, result))
        return result.ratios, result.projection, result

    def check_error(self, v: np.ndarray, result: Any, measure: ResidualNorm) -> float:
        lazy = result.residual(v, measure.norm)
        return self.settle(lazy)[0] / measure.mass

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

    def finish(self) -> None:
        if self.pending:
            self.settle()


class Absorbed(Strategy):
    """Multiplicative passes on the absorbed kernel ``diag(e^alpha) K diag(e^beta)``; a
    scaling that leaves ``[e^-tau, e^tau]`` is moved into the offsets (Schmitzer 2019); a
    vanished product is a breakdown, repaired by an exact log-domain iteration."""

    name = "absorb"

    def shifted_log_numerator(self, side: str) -> np.ndarray:
        """The numerator's logarithm shifted by the offsets as the penalty says
        (``w^(1/rho) e^(offset (1 - 1/rho))`` for a KL penalty), so that the absorbed scaling
        ``s~ = s e^-offset`` follows the update of ``s``."""
        shift = self.penalty[side].numerator_shift(self.offset[side], self.problem.reg)
        return self.log_numerator(side) + shift

    def half_step(self, side: str, w: np.ndarray, other: np.ndarray):
        _, result = self.fused_pass(side, w)
        if not result.n_bad:
            return result.ratios, result.projection, result
        # a vanished product of the absorbed exact kernel is a breakdown (repaired by an
        # exact log-domain iteration), never a kernel to repair row by row
        ratios = result.ratios.copy()
        ratios[result.bad] = np.inf
        return ratios, result.projection, result

    def enter(self, log_u: np.ndarray, log_v: np.ndarray, exact_first: bool = False):
        if exact_first and not self.underflow_free():
            # POT's start would underflow in the linear kernel: one exact log-domain
            # iteration first (finite for any reg), then absorb it.
            log_u, log_v = self.exact_iteration(log_u)
            self.counts["first_exact"] = 1
        self.absorb(log_u, log_v)
        return self.unit("rows"), self.unit("cols")

    def underflow_free(self) -> bool:
        """No entry of ``diag(1/n) K`` (POT's start) can fall below float's tiny."""
        g = self.kernel.geometry
        n, m = self.kernel.shape
        spread = g.max_cost() / g.reg
        tiny = -math.log(np.finfo(self.kernel.dtype).tiny)
        return spread + self.tau + math.log(max(n, m)) < tiny - 1.0

    def absorb(self, log_u: np.ndarray, log_v: np.ndarray) -> None:
        """Move the log-scalings into the kernel: ``(alpha, beta) = (log u, log v)``."""
        self.offset = {"rows": log_u, "cols": log_v}
        previous = None if self.op is self.kernel else self.op
        self.op = self.kernel.absorbed(log_u, log_v, previous=previous)

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

    def tidy(self, u: np.ndarray, v: np.ndarray):
        tidied = super().tidy(u, v)
        if tidied is not None:
            u, v = tidied[0]["rows"], tidied[0]["cols"]
        if not self.out_of_bounds(u, v):
            return tidied
        scaling = self.absorb_out_of_bounds(u, v)
        self.counts["absorptions"] += 1
        return scaling, self.op.project("rows", scaling["rows"])

    def keep_in_bounds(self, s: np.ndarray) -> np.ndarray:
        if not self.out_of_bounds(s, s):
            return s
        log_s, _ = self.log_scalings(s, s)
        self.absorb(log_s, log_s)
        self.counts["absorptions"] += 1
        return self.unit("rows")

    def can_reset(self, n_iter: int, max_iter: int) -> bool:
        return self.counts["resets"] < MAX_RESETS and n_iter < max_iter

    def reset(self, u: np.ndarray):
        """An exact log-domain iteration from the last finite ``u``, absorbed: the new
        ``(scalings, projection)``."""
        log_u, _ = self.log_scalings(u, self.unit("cols"))
        log_u, log_v = self.exact_iteration(log_u)
        self.counts["resets"] += 1
        self.absorb(log_u, log_v)
        u = self.unit("rows")
        return {"rows": u, "cols": self.unit("cols")}, self.op.project("rows", u)


class LogDomain(Strategy):
    """Passes on logarithms (the ``'log_products'`` capability): no repairs, no tests."""

    name = "log"
    log = True
    tests_iterates = False

    def numerator(self, side: str) -> np.ndarray:
        return self.log_numerator(side)

    def half_step(self, side: str, w: np.ndarray, other: np.ndarray):
        _, result = self.fused_pass(side, w)
        return result.ratios, result.projection, result

    def enter(self, log_u: np.ndarray, log_v: np.ndarray, exact_first: bool = False):
        return log_u, log_v

    def log_scalings(self, u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return u, v

    def difference(self, v: np.ndarray, products: np.ndarray, ratios: np.ndarray) -> np.ndarray:
        return np.exp(products + v) - np.exp(products + ratios)

    def mix(self, mixer: Any, side: str, previous: np.ndarray, new: np.ndarray):
        mixed = mixer.step(previous, new)
        return mixed, mixed is not new

    def symmetric_product(self, s: np.ndarray):
        # a log-domain pass projects lazily: only K s is computed
        w = self.op.project("cols", s, log=True)
        _, result = self.fused_pass("rows", w)
        return result.products, result.ratios, result.bad

    def average(self, s: np.ndarray, ratios: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.active["rows"], 0.5 * (s + ratios), -np.inf)


def check_linear_range(
    kernel: KernelOperator, problem: Problem, log_weights: dict[str, Any]
) -> None:
    """Refuse the linear iteration when a side's step cannot be represented: a KL penalty
    ``reg_m`` much below ``reg`` raises the weights to ``1 / rho = 1 + reg / reg_m``, and
    ``w^(1 / rho)`` underflows (every scaling of the side 0: a plan of mass 0) or overflows.
    The advice is computed from the data: the log-stable iteration when the kernel has one
    (``log_domain='auto'``), else a backend that has one, or the smallest ``reg_m`` whose
    numerators are normal floats (:meth:`~sketchot.solver.penalties.Penalty.linear_range`).
    """
    for side, letter, penalty in zip(("rows", "cols"), "ab", problem.penalties, strict=True):
        found = penalty.linear_range(log_weights[side], problem.reg)
        if found is None:
            continue
        caps = kernel.info.capabilities
        smallest = _round_up(found.smallest_reg_m)
        fewer = (
            f" or {{reg_m}} >= {smallest:.2g} on this side (the smallest KL penalty whose "
            "numerators are normal floats at this reg)"
            if math.isfinite(smallest)
            else ""
        )
        if "deferred" in caps:
            fix = f"solve in memory (the log-stable iteration has no such limit){fewer}"
        elif caps & {"absorb", "log_products"}:
            fix = (
                f"pass log_domain='auto' (or True): the log-stable iteration has no such "
                f"limit{fewer.replace(' or ', '; or, for the plain one, ', 1)}"
            )
        else:
            fix = (
                f"backend {kernel.info.backend!r} offers only linear products: pass "
                f"backend='exact' (its log-stable iteration has no such limit){fewer}"
            )
        raise LinearRangeError(
            f"the plain multiplicative iteration (log_domain=False, or a kernel with linear "
            f"products only) cannot solve this problem: the KL penalty {{reg_m}}="
            f"{penalty.reg_m:g} on {letter} at reg={problem.reg:g} raises its weights to "
            f"1 / rho = {1.0 / found.exponent:.4g}, and the numerators {letter}^(1 / rho) "
            f"span e^{found.low:.4g} to e^{found.high:.4g}, outside float64's normal range "
            f"[e^{LOG_TINY:.1f}, e^{LOG_HUGE:.1f}] (the scalings would underflow to 0 or "
            f"overflow): {fix}",
            reg_m="reg_m",
        )


def _round_up(value: float) -> float:
    """``value`` rounded up to two significant digits (advice that is at least what is
    needed)."""
    if not (math.isfinite(value) and value > 0):
        return value
    unit = 10.0 ** (math.floor(math.log10(value)) - 1)
    return math.ceil(value / unit * (1 - 1e-12)) * unit


def rebalance(u: np.ndarray, v: np.ndarray):
    """Repaired denominators mix the exact and the approximate kernel, so mass is no longer
    conserved and ``u``, ``v`` can drift apart geometrically; ``P`` is invariant under
    ``(u / c, v c)``."""
    balance = np.sqrt(np.max(u) / np.max(v))
    if np.isfinite(balance) and balance > 0:
        return u / balance, v * balance
    return u, v


def make_strategy(
    kernel: KernelOperator, problem: Problem, name: str, guard: Safeguard | None = None
) -> Strategy:
    """The strategy ``name`` (:data:`STRATEGIES`) for ``kernel``: :class:`Deferred` for the
    multiplicative strategy on a kernel with lazy passes (which runs no other)."""
    if name not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}; got {name!r}")
    if name == "log":
        return LogDomain(kernel, problem, guard)
    if name == "absorb":
        return Absorbed(kernel, problem, guard)
    if "deferred" in kernel.info.capabilities:
        return Deferred(kernel, problem, guard)
    return Multiplicative(kernel, problem, guard)
