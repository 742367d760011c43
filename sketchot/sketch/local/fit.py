"""The fit of the block-local expansion: a polynomial for ``exp`` on ``[-tau, tau]`` fitted
for relative error, and the scaled monomial features that expand ``(u.w)^j`` exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import factorial

import numpy as np
from numpy.polynomial import chebyshev as C

from ..._parallel import run_parts
from ..coefficients import chebyshev_to_monomial

# Largest degree tried when the degree is chosen from the tolerance.
_MAX_DEGREE = 30
# Points per block of the feature computation (R x block doubles stay in cache).
_FEATURE_BLOCK = 2048
# Share of the memory available at fit that stored features and their padded copies may take.
_FEATURE_MEMORY_SHARE = 0.25


# ---------------------------------------------------------------------- polynomial fit
def _fit_exp_relative(tau: float, degree: int) -> tuple[np.ndarray, float]:
    """Monomial coefficients of a near-minimax *relative* fit of ``exp`` on ``[-tau, tau]``.

    Least squares of ``p(t) e^(-t) - 1`` at 8 (r + 1) Chebyshev points, solved in the
    Chebyshev basis for conditioning (a discrete weighted L2 fit is within a small factor
    of the minimax error). Returns ``(coef, max relative error on a dense grid)``.
    """
    nodes = tau * np.cos(np.pi * (np.arange(8 * (degree + 1)) + 0.5) / (8 * (degree + 1)))
    design = C.chebvander(nodes / tau, degree) * np.exp(-nodes)[:, None]
    cheb = np.linalg.lstsq(design, np.ones_like(nodes), rcond=None)[0]
    coef = chebyshev_to_monomial(degree, tau) @ cheb
    grid = np.linspace(-tau, tau, 20001)
    error = float(np.max(np.abs(np.polynomial.polynomial.polyval(grid, coef) * np.exp(-grid) - 1)))
    if not np.all(coef > 0):
        # Real features need c_j > 0 (square roots); exp's fits have them up to high degree.
        raise ValueError(
            f"degree {degree} gives a non-positive coefficient for tau = {tau}; use a lower "
            "degree or degree=None"
        )
    return coef, error


def _fit_exp_degree(tau: float, rtol: float) -> tuple[int, np.ndarray, float]:
    """Smallest degree whose relative fit error on ``[-tau, tau]`` is at most ``rtol``."""
    for degree in range(1, _MAX_DEGREE + 1):
        try:
            coef, error = _fit_exp_relative(tau, degree)
        except ValueError:
            break
        if error <= rtol:
            return degree, coef, error
    raise ValueError(
        f"no polynomial of degree <= {_MAX_DEGREE} reaches rtol = {rtol:g} on [-{tau}, {tau}]: "
        "increase rtol (>= 1e-13) or decrease tau"
    )


# ---------------------------------------------------------------------- monomial features
class _MonomialPlan:
    """Index plan of the ``C(r + d, d)`` monomials ``u^a``, ``|a| <= r``, degree by degree.

    Each monomial of degree ``j`` is a monomial of degree ``j - 1`` (its *parent*) times one
    coordinate not below the parent's last coordinate, so every multi-index appears once.
    ``scale`` holds ``sqrt(c_|a| |a|! / a!)``.
    """

    def __init__(self, d: int, degree: int, coef: np.ndarray) -> None:
        self.d = d
        self.degree = degree
        parents: list[np.ndarray] = []
        coords: list[np.ndarray] = []
        last = np.arange(d)  # last coordinate of each degree-1 monomial
        exponents = [np.zeros((1, d), dtype=np.int64), np.eye(d, dtype=np.int64)]
        for _ in range(2, degree + 1):
            parent_ids, coord_ids = [], []
            for parent, low in enumerate(last):
                for coord in range(low, d):
                    parent_ids.append(parent)
                    coord_ids.append(coord)
            parent_ids, coord_ids = np.array(parent_ids), np.array(coord_ids)
            parents.append(parent_ids)
            coords.append(coord_ids)
            step = exponents[-1][parent_ids].copy()
            step[np.arange(len(coord_ids)), coord_ids] += 1
            exponents.append(step)
            last = coord_ids
        self.parents = parents
        self.coords = coords
        alpha = np.concatenate(exponents)
        total = alpha.sum(axis=1)
        multinomial = np.array(
            [
                factorial(int(t)) / np.prod([factorial(int(a)) for a in row])
                for t, row in zip(total, alpha, strict=True)
            ]
        )
        self.scale = np.sqrt(coef[total] * multinomial)
        self.n_features = alpha.shape[0]
        self.exponents, self.total, self.multinomial = alpha, total, multinomial


@dataclass(frozen=True)
class _MeansPlan:
    """What a product with first moments (:meth:`LocalGaussianExpansion.log_means`) reads of
    the plain moments: ``w_k exp(u.w)`` by a polynomial of degree ``r - 1`` in ``u.w``
    (coefficients ``c'``, fitted for relative error on ``[-tau, tau]``), whose moments are
    the plain ones of degree ``<= r`` rescaled, since ``w_k w^a = w^(a + e_k)``.

    ``index[k, a]`` is the position of ``a + e_k`` among the ``R`` monomials for the
    ``R' = C(r - 1 + d, d)`` monomials ``a`` of degree ``<= r - 1`` (a prefix: monomials are
    ordered by degree), and ``factor[k, a] = c'_|a| (|a|! / a!) / (s_a s_(a + e_k))`` with
    ``s`` the plain features' scales, so that ``F[:, :R'] (factor * G[index])`` evaluates the
    degree ``r - 1`` polynomial of the output features ``F`` against the ``w_k``-weighted
    inputs; ``poly_error`` is that polynomial's relative error on ``[-tau, tau]``.
    """

    index: np.ndarray
    factor: np.ndarray
    n_features: int
    poly_error: float

    @classmethod
    def build(cls, plan: _MonomialPlan, tau: float) -> _MeansPlan | None:
        """``None`` when degree ``r - 1`` is below 2 or has no fit (first moments then
        take a log product per coordinate)."""
        if plan.degree < 3:
            return None
        try:
            coef, error = _fit_exp_relative(tau, plan.degree - 1)
        except ValueError:  # a non-positive coefficient: the fit is not trusted
            return None
        small = np.flatnonzero(plan.total <= plan.degree - 1)
        position = {tuple(row): i for i, row in enumerate(plan.exponents)}
        index = np.empty((plan.d, small.size), dtype=np.int64)
        for k in range(plan.d):
            step = np.eye(plan.d, dtype=np.int64)[k]
            index[k] = [position[tuple(plan.exponents[a] + step)] for a in small]
        weight = coef[plan.total[small]] * plan.multinomial[small]
        factor = weight[None, :] / (plan.scale[small][None, :] * plan.scale[index])
        return cls(index, factor, int(small.size), error)


def _local_monomials(U: np.ndarray, plan: _MonomialPlan, parallel: bool = True) -> np.ndarray:
    """Scaled monomial features ``phi(u)`` of each row, shape ``(n, R)``.

    ``phi(u) . phi(w) = sum_j c_j (u . w)^j`` exactly (up to rounding). One gather-multiply
    per degree, ``O(n R)`` time, computed feature-major (each monomial a contiguous row of
    the ``(R, n)`` result) in column blocks that stay in cache; the returned array is the
    Fortran-ordered transpose, which BLAS reads without a copy.
    """
    n = U.shape[0]
    out = np.empty((plan.n_features, n))
    blocks = [slice(start, min(start + _FEATURE_BLOCK, n)) for start in range(0, n, _FEATURE_BLOCK)]

    def fill(part) -> None:
        for cols in part:
            _monomials_into(U[cols].T, plan, out[:, cols])

    # Never parallel inside a product: its blocks already run on the pool (no nested waits).
    run_parts(fill, blocks, parallel and n >= 4 * _FEATURE_BLOCK)
    return out.T


def _monomials_into(UT: np.ndarray, plan: _MonomialPlan, out: np.ndarray) -> None:
    """Fill ``out`` (``R x b``) with the scaled monomials of the columns of ``UT`` (``d x b``)."""
    out[0] = 1.0
    out[1 : 1 + plan.d] = UT
    start, width = 1, plan.d
    for parents, coords in zip(plan.parents, plan.coords, strict=True):
        stop = start + width
        nxt = stop + len(parents)
        np.multiply(out[start:stop][parents], UT[coords], out=out[stop:nxt])
        start, width = stop, len(parents)
    out *= plan.scale[:, None]
