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

from .._validation import (
    RenamableTypeError,
    RenamableValueError,
    check_float,
    check_weights,
    describe,
)
from .penalties import PENALTY_TYPES, Penalty, make_penalty

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
    unbalanced_type : {'KL', 'TV'}
        The type of the finite penalties (POT's ``unbalanced_type``): :attr:`penalties`.
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
    unbalanced_type: str = "KL"

    @property
    def balanced(self) -> bool:
        """Whether both marginals are hard constraints."""
        return math.isinf(self.reg_m[0]) and math.isinf(self.reg_m[1])

    @property
    def penalties(self) -> tuple[Penalty, Penalty]:
        """The marginal penalties ``(D_a, D_b)`` (:mod:`~sketchot.solver.penalties`): the
        steps of the passes, the fixed point's marginals and the value's terms."""
        return tuple(make_penalty(r, self.unbalanced_type) for r in self.reg_m)

    @property
    def exponents(self) -> tuple[float, float]:
        """``(rho_a, rho_b)``, ``rho = reg_m / (reg_m + reg)`` (1 for a hard side): the
        powers of KL penalties, for the paths whose updates are powers only (several
        targets, Dask); other penalties are refused there by name."""
        penalties = self.penalties
        if not all(p.power_step for p in penalties):
            raise NotImplementedError(
                f"unbalanced_type={self.unbalanced_type!r} is not a power of the ratios; "
                "this path solves KL penalties (unbalanced_type='KL') only"
            )
        return tuple(p.exponent(self.reg) for p in penalties)

    def at_reg(self, reg: float, f: np.ndarray | None, g: np.ndarray | None) -> Problem:
        """The same problem at another ``reg``, warm-started from potentials in cost units
        (``f = reg log u``; ``None``: this problem's own start)."""
        if f is None or g is None:
            return replace(self, reg=reg)
        return replace(self, reg=reg, log_u0=f / reg, log_v0=g / reg)


def _check_start(value: Any, index: int, weights: np.ndarray, points: str) -> np.ndarray:
    """One side of a warm start (``log u`` or ``log v``) as float64, errors naming
    ``{warmstart}[index]``."""
    name = f"{{warmstart}}[{index}]"
    side = "log u" if index == 0 else "log v"
    try:
        array = np.asarray(value)
    except (TypeError, ValueError):
        array = np.asarray(None)
    if array.dtype.kind not in "biuf":
        raise RenamableTypeError(
            f"{name} ({side}) must be a 1-D real array of shape {weights.shape} (one entry per "
            f"row of {points}); got {describe(value)}",
            warmstart="warmstart",
        )
    if array.shape != weights.shape:
        raise RenamableValueError(
            f"{name} ({side}) must have shape {weights.shape} (one entry per row of "
            f"{points}); got shape {array.shape}",
            warmstart="warmstart",
        )
    array = array.astype(np.float64)
    bad = ~np.isfinite(array) & (weights > 0)
    if bad.any():
        raise RenamableValueError(
            f"{name} ({side}) must be finite where the weight is positive; got "
            f"{int(bad.sum())} NaN or inf entries (first at index {int(np.flatnonzero(bad)[0])})",
            warmstart="warmstart",
        )
    return array


def _as_number(value: Any) -> float | None:
    """``float(value)`` for a real number (a Python or NumPy scalar, a one-entry array or
    tensor); ``None`` for anything else, strings and bools included (``float("1")`` and
    ``float(True)`` would accept them)."""
    if isinstance(value, (bool, np.bool_, str, bytes)):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def check_reg_m(reg_m: Any, reg: float) -> tuple[float, float]:
    """``reg_m`` as ``(reg_m_a, reg_m_b)``: ``None`` is balanced ``(inf, inf)``, a number both
    sides, a pair each side; every entry a real number ``> 0`` (``inf`` allowed). Errors are
    :class:`~sketchot._validation.RenamableError`s naming ``{reg_m}``."""
    del reg
    if reg_m is None:
        return (math.inf, math.inf)
    if isinstance(reg_m, (tuple, list)) or (isinstance(reg_m, np.ndarray) and reg_m.ndim > 0):
        values = tuple(reg_m) if isinstance(reg_m, (tuple, list)) else tuple(reg_m.ravel())
        if len(values) == 1:  # POT's convention: one entry is both sides
            values = (values[0], values[0])
        if len(values) != 2:
            raise RenamableValueError(
                "{reg_m} must be None, a number, a pair (reg_m_a, reg_m_b) or one entry for "
                f"both sides; got {len(values)} entries: "
                f"{describe(reg_m)}",
                reg_m="reg_m",
            )
    else:
        values = (reg_m, reg_m)
    out = []
    for side, value in zip(("a", "b"), values, strict=True):
        where = "" if values[0] is values[1] else f" (the {side} side: {describe(value)})"
        number = _as_number(value)
        if number is None:
            raise RenamableTypeError(
                "{reg_m} must be None, a real number or a pair of real numbers (a string or "
                f"a bool is not read as one); got {describe(reg_m)}{where}",
                reg_m="reg_m",
            )
        if not number > 0:
            raise RenamableValueError(
                "{reg_m} must be > 0 on each side (float('inf') for a hard constraint); got "
                f"{describe(reg_m)}{where}",
                reg_m="reg_m",
            )
        out.append(number)
    return (out[0], out[1])


def check_unbalanced_type(unbalanced_type: Any) -> str:
    """POT's ``unbalanced_type`` as ``'KL'`` or ``'TV'`` (case-insensitive); ``'L2'`` and
    anything else are refused by name (:class:`UnknownPenaltyError`)."""
    if not isinstance(unbalanced_type, str):
        raise TypeError(
            f"unbalanced_type must be one of {list(PENALTY_TYPES)} (case-insensitive); got "
            f"{describe(unbalanced_type)}"
        )
    kind = unbalanced_type.upper()
    if kind not in PENALTY_TYPES:
        hint = (
            ": the quadratic penalty has no closed-form Sinkhorn step (POT solves it with "
            "L-BFGS-B, ot.unbalanced.lbfgsb_unbalanced)"
            if kind == "L2"
            else ""
        )
        raise UnknownPenaltyError(
            f"unbalanced_type must be one of {list(PENALTY_TYPES)} (case-insensitive); got "
            f"{unbalanced_type!r}{hint}"
        )
    return kind


class UnknownPenaltyError(ValueError, NotImplementedError):
    """An ``unbalanced_type`` the solver does not have: a ``ValueError`` (a bad argument) and
    the ``NotImplementedError`` POT's ``ot.solve`` raises for it, so POT's tests port as
    they are."""


def make_problem(
    a: Any,
    b: Any,
    shape: tuple[int, int],
    reg: Any,
    reg_m: Any = None,
    *,
    log_u0: Any = None,
    log_v0: Any = None,
    unbalanced_type: Any = "KL",
) -> Problem:
    """Validate weights against the clouds' sizes ``shape = (n, m)``, ``reg`` and ``reg_m``.

    Balanced transport needs equal masses (up to :data:`MASS_RTOL`, then ``b`` is rescaled);
    unequal masses are allowed only with a finite ``reg_m`` on some side. The warm start's
    errors name the public ``{warmstart}`` (``warmstart[0]`` for ``log_u0``) and those of the
    penalties ``{reg_m}`` (:class:`~sketchot._validation.RenamableError`: an entry that takes
    them under other names re-raises them in its caller's terms).
    """
    n, m = shape
    reg = check_float(reg, "reg", positive=True)
    pair = check_reg_m(reg_m, reg)
    kind = check_unbalanced_type(unbalanced_type)
    a = check_weights(a, "a", n, "X")
    b = check_weights(b, "b", m, "Y")
    notes: list[str] = []
    if math.isinf(pair[0]) and math.isinf(pair[1]):
        mass_a, mass_b = a.sum(), b.sum()
        if not np.isclose(mass_a, mass_b, rtol=MASS_RTOL, atol=0.0):
            masses = f"sum(a) = {mass_a:.8g} and sum(b) = {mass_b:.8g}"
            if reg_m is None:
                raise RenamableValueError(
                    "a and b must have the same total mass for balanced transport (the "
                    f"default, {{reg_m}}=None); got {masses}. Pass a finite {{reg_m}} (a KL "
                    "penalty on the marginals, in units of the cost) for unbalanced transport.",
                    reg_m="reg_m",
                )
            raise RenamableValueError(
                f"{{reg_m}}={describe(reg_m)} makes both marginals hard constraints, which "
                f"needs a and b of the same total mass; got {masses}. Make {{reg_m}} finite "
                "on at least one side (a KL penalty, in units of the cost) to let the masses "
                "differ, or rescale a or b.",
                reg_m="reg_m",
            )
        if mass_a != mass_b:
            b = b * (mass_a / mass_b)
            notes.append(f"b was rescaled by {mass_a / mass_b:.12g} to the mass of a")
    if (log_u0 is None) != (log_v0 is None):
        given, missing = ("[0]", "[1]") if log_v0 is None else ("[1]", "[0]")
        raise RenamableValueError(
            f"{{warmstart}} must be None or a pair (log_u, log_v) of arrays; got "
            f"{{warmstart}}{given} and None as {{warmstart}}{missing}: pass both (a result's "
            "potentials) or neither",
            warmstart="warmstart",
        )
    starts = []
    for index, value, weights, points in ((0, log_u0, a, "X"), (1, log_v0, b, "Y")):
        if value is None:
            starts.append(None)
            continue
        starts.append(_check_start(value, index, weights, points))
    return Problem(a, b, reg, pair, starts[0], starts[1], tuple(notes), kind)
