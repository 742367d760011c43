"""Marginal penalties: what the problem says about ``P 1`` and ``P^T 1``, and their steps.

An entropic problem with marginal penalties ``D_a`` and ``D_b``,

.. math::

    \\min_{P \\ge 0} \\langle P, M \\rangle + \\mathrm{reg}\\, \\mathrm{KL}(P \\,|\\, a b^\\top)
    + D_a(P 1 \\,|\\, a) + D_b(P^\\top 1 \\,|\\, b),

is solved by Sinkhorn's alternate updates of the potentials ``f = reg log(u / a)``,
``g = reg log(v / b)`` (``P = diag(u) K diag(v)``, ``K = exp(-M / reg)``): each half-step
computes the balanced update ``h = -reg log(K v)`` and applies the penalty's anisotropic
proximal operator ``f = aprox(h)`` (Sejourne et al. 2019, Table 1):

==========================  ==========================  ==================================
penalty                     ``D(p | a)``                 ``aprox(h)``
==========================  ==========================  ==================================
:class:`Balanced`           0 if ``p = a``, else inf     ``h``
:class:`KL` (``reg_m``)     ``reg_m KL(p | a)``           ``rho h``, ``rho = reg_m / (reg_m + reg)``
:class:`TV` (``reg_m``)     ``reg_m ||p - a||_1``         ``clip(h, -reg_m, reg_m)``
==========================  ==========================  ==================================

In scalings, ``u = a exp(aprox(h) / reg)``: ``a / K v`` (balanced), ``a (K v)^-rho`` (KL),
``clip(a / K v, a e^(-reg_m / reg), a e^(reg_m / reg))`` (TV), POT's
``ot.solve(..., unbalanced_type=...)`` conventions. A penalty builds the step a kernel's
fused pass applies to its ratios (:class:`~sketchot.kernels.RatioStep`: a power and per-entry
bounds) in the pass's form (linear or log, absorbed offsets included), the fixed point's
marginal that the true-kernel check compares with, and its own term of the primal value.
Kernels never see the penalty, only its step.

References
----------
Chizat, L., Peyre, G., Schmitzer, B., Vialard, F.-X. (2018). Scaling algorithms for unbalanced
optimal transport problems. Mathematics of Computation 87(314).
Sejourne, T., Feydy, J., Vialard, F.-X., Trouve, A., Peyre, G. (2019). Sinkhorn divergences
for unbalanced optimal transport. arXiv:1910.12958.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..kernels import IDENTITY_STEP, RatioStep

#: The penalty types, by POT's ``unbalanced_type`` name (case-insensitive).
PENALTY_TYPES = ("KL", "TV")

#: Natural logarithms of float64's smallest and largest normal numbers: a linear pass's
#: numerator beyond them has underflowed (to a subnormal, then 0) or overflowed.
LOG_TINY = math.log(np.finfo(np.float64).tiny)
LOG_HUGE = math.log(np.finfo(np.float64).max)


@dataclass(frozen=True)
class LinearRange:
    """Why a penalty's step cannot run in the linear (multiplicative) form on given weights:
    its numerators ``c = w^(1 / rho)`` leave float64's normal range.

    Attributes
    ----------
    low, high : float
        The smallest and largest ``log c`` over the positive weights.
    exponent : float
        The step's power ``rho``.
    smallest_reg_m : float
        The smallest penalty (at the same ``reg``) whose numerators are normal floats:
        ``rho >= max(log w_min / LOG_TINY, log w_max / LOG_HUGE)`` (``inf``: none is).
    """

    low: float
    high: float
    exponent: float
    smallest_reg_m: float


@dataclass(frozen=True)
class Penalty:
    """One marginal's penalty (base class: a hard constraint, :class:`Balanced`).

    Attributes
    ----------
    reg_m : float
        The penalty's weight, in units of the cost (``inf``: a hard constraint).
    """

    reg_m: float = math.inf
    #: POT's ``unbalanced_type`` name.
    kind = "balanced"

    @property
    def hard(self) -> bool:
        """Whether the marginal is a hard constraint."""
        return math.isinf(self.reg_m)

    @property
    def power_step(self) -> bool:
        """Whether the step is a power of the ratios (KL and hard): the updates that only
        rescale the potentials, which some paths (several targets, Dask) need."""
        return True

    def exponent(self, reg: float) -> float:
        """The power of the ratios in the step (1: none)."""
        return 1.0

    def aprox(self, h: np.ndarray, reg: float) -> np.ndarray:
        """The proximal update of a potential from its balanced update ``h`` (cost units)."""
        return h

    def log_numerator(self, log_w: np.ndarray, reg: float) -> np.ndarray:
        """The logarithm of a pass's numerator ``c`` (the ratios are ``c / K v``)."""
        return log_w

    def numerator_shift(self, offset: Any, reg: float) -> Any:
        """What absorbed log-offsets add to :meth:`log_numerator` (0 unless the step is a
        power: ``s~ = s e^-offset`` then needs ``c~ = c e^(offset (1 - 1 / rho))``)."""
        return 0.0

    def step(self, log_w: np.ndarray, offset: Any, reg: float, log: bool) -> RatioStep:
        """The step of a pass in its form: ``log`` for log-domain passes, ``offset`` the
        absorbed log-scalings of this side (0 when none)."""
        return IDENTITY_STEP

    def linear_range(self, log_w: Any, reg: float) -> LinearRange | None:
        """``None`` when the step's numerators (:meth:`log_numerator`, exponentiated by a
        linear pass) are normal float64 numbers for the weights ``exp(log_w)``, else why
        not (:class:`LinearRange`). A hard or total-variation side divides ``w`` itself."""
        return None

    def log_scaling(self, log_w: np.ndarray, log_product: np.ndarray, reg: float) -> np.ndarray:
        """``log u`` of one update from ``log(K v)``: ``log w + aprox(-reg log(K v)) / reg``
        (``-inf`` where ``w = 0``)."""
        with np.errstate(invalid="ignore"):
            return np.where(np.isfinite(log_w), log_w + self._log_update(log_product, reg), -np.inf)

    def _log_update(self, log_product: np.ndarray, reg: float) -> np.ndarray:
        """``aprox(-reg log(K v)) / reg``: ``-rho log(K v)`` for a power step."""
        return -self.exponent(reg) * log_product

    def fixed_point_marginal(
        self, weights: np.ndarray, log_product: np.ndarray, reg: float
    ) -> np.ndarray:
        """The marginal ``u (K v)`` of a fixed point, given ``log(K v)``: ``w`` for a hard
        constraint. A check's residual ``|P 1 - target|`` is 0 exactly at the fixed point."""
        return weights

    def value(self, marginal: np.ndarray, weights: np.ndarray) -> float:
        """The penalty's term of the primal objective, ``D(marginal | weights)``."""
        return 0.0


@dataclass(frozen=True)
class Balanced(Penalty):
    """A hard marginal constraint: ``P 1 = a``."""


@dataclass(frozen=True)
class KL(Penalty):
    """``reg_m KL(p | a)`` (generalised KL: ``sum p log(p / a) - p + a``)."""

    kind = "KL"

    def exponent(self, reg: float) -> float:
        return self.reg_m / (self.reg_m + reg)

    def aprox(self, h: np.ndarray, reg: float) -> np.ndarray:
        return self.exponent(reg) * h

    def log_numerator(self, log_w: np.ndarray, reg: float) -> np.ndarray:
        # u = w (K v)^-rho = (w^(1 / rho) / K v)^rho
        return log_w / self.exponent(reg)

    def numerator_shift(self, offset: Any, reg: float) -> Any:
        return offset * (1.0 - 1.0 / self.exponent(reg))

    def linear_range(self, log_w: Any, reg: float) -> LinearRange | None:
        # NumPy or Dask weights: the two extremes of the finite logarithms (-inf: w = 0)
        with np.errstate(invalid="ignore"):
            finite = np.isfinite(log_w)
            lo = float(np.where(finite, log_w, np.inf).min())
            hi = float(np.where(finite, log_w, -np.inf).max())
        rho = self.exponent(reg)
        if not math.isfinite(lo) or (lo / rho >= LOG_TINY and hi / rho <= LOG_HUGE):
            return None
        needed = max(lo / LOG_TINY, hi / LOG_HUGE, 0.0)
        smallest = reg * needed / (1.0 - needed) if needed < 1.0 else math.inf
        return LinearRange(lo / rho, hi / rho, rho, smallest)

    def step(self, log_w: np.ndarray, offset: Any, reg: float, log: bool) -> RatioStep:
        return RatioStep(self.exponent(reg))

    def fixed_point_marginal(
        self, weights: np.ndarray, log_product: np.ndarray, reg: float
    ) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            log_w = np.log(weights)
            rho = self.exponent(reg)
            return np.where(weights > 0, np.exp(log_w + (1.0 - rho) * log_product), 0.0)

    def value(self, marginal: np.ndarray, weights: np.ndarray) -> float:
        return self.reg_m * kl_divergence(marginal, weights)


@dataclass(frozen=True)
class TV(Penalty):
    """``reg_m ||p - a||_1`` (total variation): the potential is the balanced update clipped
    to ``[-reg_m, reg_m]``, so mass is created or destroyed only where moving it would cost
    more than ``2 reg_m``."""

    kind = "TV"

    @property
    def power_step(self) -> bool:
        return False

    def aprox(self, h: np.ndarray, reg: float) -> np.ndarray:
        return np.clip(h, -self.reg_m, self.reg_m)

    def _log_update(self, log_product: np.ndarray, reg: float) -> np.ndarray:
        t = self.reg_m / reg
        return np.clip(-log_product, -t, t)

    def step(self, log_w: np.ndarray, offset: Any, reg: float, log: bool) -> RatioStep:
        # s~ = s e^-offset with s = clip(w / K v, w e^-t, w e^t), t = reg_m / reg
        t = self.reg_m / reg
        with np.errstate(invalid="ignore"):
            lower = log_w - t - offset
            upper = log_w + t - offset
        if log:
            return RatioStep(1.0, lower, upper)
        with np.errstate(over="ignore"):
            return RatioStep(1.0, np.exp(lower), np.exp(upper))

    def fixed_point_marginal(
        self, weights: np.ndarray, log_product: np.ndarray, reg: float
    ) -> np.ndarray:
        t = self.reg_m / reg
        with np.errstate(over="ignore", invalid="ignore"):
            # u K v = clip(w / K v, w e^-t, w e^t) K v = w clip(1, K v e^-t, K v e^t)
            factor = np.clip(1.0, np.exp(log_product - t), np.exp(log_product + t))
        return np.where(weights > 0, weights * factor, 0.0)

    def value(self, marginal: np.ndarray, weights: np.ndarray) -> float:
        return self.reg_m * float(np.abs(marginal - weights).sum())


#: The hard constraint (every balanced side shares it).
BALANCED = Balanced()


def make_penalty(reg_m: float, kind: str) -> Penalty:
    """The penalty of weight ``reg_m`` (``inf``: :class:`Balanced`) and type ``kind``."""
    if math.isinf(reg_m):
        return BALANCED
    return {"KL": KL, "TV": TV}[kind](reg_m)


def kl_divergence(p: np.ndarray, q: np.ndarray) -> float:
    """Generalised ``KL(p | q) = sum p log(p / q) - p + q`` (``0 log 0 = 0``)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * (np.log(p) - np.log(q)), 0.0)
    return float(terms.sum() - p.sum() + q.sum())
