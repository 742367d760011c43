"""Element-wise functions ``f`` for ``f(U V^T)``.

Built in: :class:`Exponential` (``exp(s t + o)``) and :class:`Sigmoid`
(``1 / (1 + exp(-s t))``). Any vectorised callable is wrapped by :class:`CallableFunction`.
Each function evaluates on arrays and gives its Taylor coefficients around a point; the
built-ins use closed forms, a callable uses a Cauchy contour integral (so it must accept
complex arrays, as numpy ufuncs do).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.polynomial import polynomial as P

from .._validation import check_float, check_int, describe


class ElementwiseFunction(ABC):
    """A scalar function applied entry by entry. Subclasses implement ``__call__``."""

    name = "function"

    @abstractmethod
    def __call__(self, t: np.ndarray) -> np.ndarray:
        """Evaluate ``f`` on every entry of ``t``."""

    def taylor_coefficients(self, center: float, degree: int) -> np.ndarray:
        """Coefficients ``d_j = f^{(j)}(center) / j!``, ``j = 0..degree``, of ``(t - center)^j``."""
        return _contour_taylor(self, center, degree, radius=0.5)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Exponential(ElementwiseFunction):
    """``f(t) = exp(scale * t + offset)``.

    The offset lets callers evaluate a rescaled exponential ``exp(s (t - t_max))`` that stays
    below 1 on an interval, instead of ``exp(s t)`` that may overflow.
    """

    name = "exp"

    def __init__(self, scale: float = 1.0, offset: float = 0.0) -> None:
        self.scale = check_float(scale, "scale")
        self.offset = check_float(offset, "offset")

    def __call__(self, t: np.ndarray) -> np.ndarray:
        out = np.multiply(self.scale, t, dtype=np.float64)
        out += self.offset
        return np.exp(out, out=out)  # in place: the coreset evaluates ~k n values

    def taylor_coefficients(self, center: float, degree: int) -> np.ndarray:
        degree = check_int(degree, "degree", minimum=0)
        value = math.exp(self.scale * center + self.offset)
        return np.array([value * self.scale**j / math.factorial(j) for j in range(degree + 1)])

    def __repr__(self) -> str:
        return f"Exponential(scale={self.scale!r}, offset={self.offset!r})"


class Sigmoid(ElementwiseFunction):
    """``f(t) = 1 / (1 + exp(-scale * t))``.

    Parameters
    ----------
    scale : float, default=1.0
        Slope at the origin is ``scale / 4``. Evaluated without overflow for any ``t``.
    """

    name = "sigmoid"

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = check_float(scale, "scale")

    def __call__(self, t: np.ndarray) -> np.ndarray:
        z = self.scale * np.asarray(t, dtype=np.float64)
        # exp of a non-positive argument only: no overflow for large |t|
        e = np.exp(-np.abs(z))
        return np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))

    def taylor_coefficients(self, center: float, degree: int) -> np.ndarray:
        # d/dt g(sigma) = g'(sigma) * sigma (1 - sigma) * scale: each derivative of the
        # sigmoid is a polynomial in sigma, obtained by this recurrence.
        degree = check_int(degree, "degree", minimum=0)
        sigma = float(self(np.array(center)))
        poly = np.array([0.0, 1.0])  # sigma itself
        logistic = np.array([0.0, 1.0, -1.0])  # sigma - sigma^2
        coefs = []
        for j in range(degree + 1):
            coefs.append(P.polyval(sigma, poly) * self.scale**j / math.factorial(j))
            poly = P.polymul(P.polyder(poly), logistic)
        return np.array(coefs)

    def __repr__(self) -> str:
        return f"Sigmoid(scale={self.scale!r})"


class CallableFunction(ElementwiseFunction):
    """Wrap a vectorised callable ``f(t) -> array``.

    Parameters
    ----------
    func : callable
        Must map a float array to an array of the same shape. For Taylor coefficients it must
        also accept complex arrays (analytic ``f``), since they come from a contour integral.
    taylor_radius : float
        Radius of the contour around the expansion point; it must stay inside the disc where
        ``f`` is analytic (e.g. below ``pi`` for ``tanh``).
    """

    def __init__(self, func: Callable[[np.ndarray], np.ndarray], taylor_radius: float = 0.5):
        if not callable(func):
            raise TypeError(f"function must be callable; got {describe(func)}")
        self.func = func
        self.taylor_radius = check_float(taylor_radius, "taylor_radius", positive=True)
        self.name = getattr(func, "__name__", "callable")

    def __call__(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t)
        values = np.asarray(self.func(t))
        if values.shape != t.shape:
            raise ValueError(
                f"function {self.name!r} must be element-wise: input of shape {t.shape} gave "
                f"output of shape {values.shape}"
            )
        return values

    def taylor_coefficients(self, center: float, degree: int) -> np.ndarray:
        return _contour_taylor(self, center, degree, radius=self.taylor_radius)

    def __repr__(self) -> str:
        return f"CallableFunction({self.name})"


def _contour_taylor(
    f: ElementwiseFunction, center: float, degree: int, radius: float
) -> np.ndarray:
    """Taylor coefficients by the trapezoidal rule on a circle (Cauchy's formula).

    ``d_j = (1 / N) sum_k f(c + rho w^k) w^{-jk} / rho^j`` with ``w = exp(2 pi i / N)``;
    the trapezoidal rule converges geometrically for analytic ``f``.
    """
    degree = check_int(degree, "degree", minimum=0)
    n_nodes = max(64, 4 * (degree + 1))
    nodes = center + radius * np.exp(2j * np.pi * np.arange(n_nodes) / n_nodes)
    try:
        values = np.asarray(f(nodes), dtype=np.complex128)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"Taylor coefficients of {f!r} are computed by a contour integral and need the "
            "function to accept complex arrays; use coefficients='chebyshev' or 'coreset' "
            "instead"
        ) from exc
    if not np.all(np.isfinite(values)):
        raise ValueError(
            f"{f!r} is not finite on the circle of radius {radius} around {center}; "
            "reduce taylor_radius or use another coefficient method"
        )
    spectrum = np.fft.fft(values) / n_nodes
    return np.real(spectrum[: degree + 1]) / radius ** np.arange(degree + 1)


def as_function(function: Any) -> ElementwiseFunction:
    """Resolve ``'exp'``, ``'sigmoid'``, an :class:`ElementwiseFunction` or a callable.

    Parameters
    ----------
    function : {'exp', 'sigmoid'}, ElementwiseFunction or callable
        A name (``exp(t)`` or ``1 / (1 + exp(-t))``), a function object (returned as it
        is), or a vectorised callable ``f(t) -> array`` (wrapped in
        :class:`CallableFunction`).

    Returns
    -------
    ElementwiseFunction

    Raises
    ------
    ValueError
        An unknown name.
    TypeError
        Neither a string nor a callable.

    Examples
    --------
    >>> import numpy as np
    >>> from sketchot.sketch import as_function
    >>> f = as_function("sigmoid")
    >>> float(f(np.array([0.0]))[0])
    0.5
    """
    if isinstance(function, ElementwiseFunction):
        return function
    if isinstance(function, str):
        if function == "exp":
            return Exponential()
        if function == "sigmoid":
            return Sigmoid()
        raise ValueError(f"function must be 'exp', 'sigmoid' or a callable; got {function!r}")
    if callable(function):
        return CallableFunction(function)
    raise TypeError(f"function must be 'exp', 'sigmoid' or a callable; got {describe(function)}")
