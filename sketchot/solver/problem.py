"""The entropic transport problem, validated once: weights, ``reg``, marginal constraints.

.. math::

    \\min_{P \\ge 0} \\langle P, M \\rangle + \\mathrm{reg}\\, \\mathrm{KL}(P \\,|\\, a b^\\top)
    + \\mathrm{reg}_{m,a} \\mathrm{KL}(P 1 \\,|\\, a)
    + \\mathrm{reg}_{m,b} \\mathrm{KL}(P^\\top 1 \\,|\\, b)

with the generalised ``KL(p | q) = sum p log(p / q) - p + q`` (POT's
``ot.unbalanced.sinkhorn_unbalanced(a, b, M, reg, reg_m)``, ``reg_type='kl'``). A penalty
``reg_m = inf`` is a hard constraint on that side: both infinite is balanced transport (then
``a`` and ``b`` must have the same mass), one infinite is semi-relaxed. The Sinkhorn update
of a side with penalty ``reg_m`` raises its ratio to ``rho = reg_m / (reg_m + reg)``
(Chizat et al. 2018), ``rho = 1`` for a hard side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .._validation import check_float, check_weights, describe

#: Masses that differ by less than this (relative) are treated as equal in balanced
#: transport; ``b`` is then rescaled to ``a``'s mass so that ``tol`` stays reachable.
MASS_RTOL = 1e-6


@dataclass(frozen=True)
class Problem:
    """Weights, ``reg``, marginal penalties and an optional warm start.

    Attributes
    ----------
    a, b : ndarray, shape (n,), (m,)
        Non-negative weights (float64).
    reg : float
        Entropic regularisation (> 0).
    reg_m : tuple of float
        ``(reg_m_a, reg_m_b)``; ``inf`` is a hard constraint.
    log_u0, log_v0 : ndarray or None
        Warm-start log-scalings (both or neither).
    notes : tuple of str
        What validation changed (e.g. ``b`` rescaled to ``a``'s mass).
    """

    a: np.ndarray
    b: np.ndarray
    reg: float
    reg_m: tuple[float, float] = (math.inf, math.inf)
    log_u0: np.ndarray | None = None
    log_v0: np.ndarray | None = None
    notes: tuple[str, ...] = ()

    @property
    def balanced(self) -> bool:
        """Whether both marginals are hard constraints."""
        return math.isinf(self.reg_m[0]) and math.isinf(self.reg_m[1])

    @property
    def exponents(self) -> tuple[float, float]:
        """``(rho_a, rho_b)``, ``rho = reg_m / (reg_m + reg)`` (1 for a hard side)."""
        return tuple(1.0 if math.isinf(r) else r / (r + self.reg) for r in self.reg_m)

    def at_reg(self, reg: float, f: np.ndarray | None, g: np.ndarray | None) -> Problem:
        """The same problem at another ``reg``, warm-started from potentials in cost units
        (``f = reg log u``; ``None``: this problem's own start)."""
        if f is None or g is None:
            return replace(self, reg=reg)
        return replace(self, reg=reg, log_u0=f / reg, log_v0=g / reg)


def check_reg_m(reg_m: Any, reg: float) -> tuple[float, float]:
    """``reg_m`` as ``(reg_m_a, reg_m_b)``: ``None`` is balanced ``(inf, inf)``, a scalar both
    sides, a pair each side; every entry ``> 0`` (``inf`` allowed)."""
    del reg
    if reg_m is None:
        return (math.inf, math.inf)
    values = reg_m if isinstance(reg_m, (tuple, list, np.ndarray)) else (reg_m, reg_m)
    values = tuple(np.ravel(np.asarray(values, dtype=object)))
    if len(values) != 2:
        raise ValueError(
            f"reg_m must be None, a number or a pair (reg_m_a, reg_m_b); got {describe(reg_m)}"
        )
    out = []
    for side, value in zip(("reg_m_a", "reg_m_b"), values, strict=True):
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise TypeError(
                f"reg_m must be None, a number or a pair of numbers; got {describe(reg_m)} "
                f"({side} = {describe(value)})"
            ) from None
        if not number > 0:
            raise ValueError(
                f"reg_m must be > 0 on each side (float('inf') for a hard constraint); got "
                f"{side} = {number!r}"
            )
        out.append(number)
    return (out[0], out[1])


def make_problem(
    a: Any,
    b: Any,
    shape: tuple[int, int],
    reg: Any,
    reg_m: Any = None,
    *,
    log_u0: Any = None,
    log_v0: Any = None,
) -> Problem:
    """Validate weights against the clouds' sizes ``shape = (n, m)``, ``reg`` and ``reg_m``.

    Balanced transport needs equal masses (up to :data:`MASS_RTOL`, then ``b`` is rescaled);
    unequal masses are allowed only with a finite ``reg_m`` on some side.
    """
    n, m = shape
    reg = check_float(reg, "reg", positive=True)
    pair = check_reg_m(reg_m, reg)
    a = check_weights(a, "a", n, "X")
    b = check_weights(b, "b", m, "Y")
    notes: list[str] = []
    if math.isinf(pair[0]) and math.isinf(pair[1]):
        mass_a, mass_b = a.sum(), b.sum()
        if not np.isclose(mass_a, mass_b, rtol=MASS_RTOL, atol=0.0):
            raise ValueError(
                f"a and b must have the same total mass for balanced transport; got sum(a) = "
                f"{mass_a:.8g} and sum(b) = {mass_b:.8g}. Pass reg_m (a KL penalty on the "
                "marginals) for unbalanced transport."
            )
        if mass_a != mass_b:
            b = b * (mass_a / mass_b)
            notes.append(f"b was rescaled by {mass_a / mass_b:.12g} to the mass of a")
    if (log_u0 is None) != (log_v0 is None):
        raise ValueError("pass both log_u0 and log_v0 for a warm start, or neither")
    starts = []
    for name, value, weights in (("log_u0", log_u0, a), ("log_v0", log_v0, b)):
        if value is None:
            starts.append(None)
            continue
        value = np.asarray(value, dtype=np.float64)
        if value.shape != weights.shape:
            raise ValueError(f"{name} must have shape {weights.shape}; got {value.shape}")
        if not np.all(np.isfinite(value[weights > 0])):
            raise ValueError(f"{name} must be finite where the weight is positive")
        starts.append(value)
    return Problem(a, b, reg, pair, starts[0], starts[1], tuple(notes))
