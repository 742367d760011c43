"""Exact symmetric monomial features: ``<phi_j(u), phi_j(v)> = (u . v)^j`` with no variance.

By the multinomial theorem,

.. math::
    (u \\cdot v)^j = \\sum_{|\\alpha| = j} \\binom{j}{\\alpha} u^\\alpha v^\\alpha,
    \\qquad \\binom{j}{\\alpha} = \\frac{j!}{\\alpha_1! \\cdots \\alpha_d!},

so ``phi_j(u)_alpha = sqrt(binom(j, alpha)) u^alpha`` over the ``C(d + j - 1, j)`` multi-indices
``alpha`` of degree ``j`` is an exact feature map of ``(u . v)^j``. Where this count fits a
degree's share of the feature budget it beats any sketch of that size, whose variance is
positive (Han et al. 2020, improved variant of :class:`~sketchot.sketch.PolyTensorSketch`).

The multi-indices are enumerated as ``itertools.combinations_with_replacement(range(d), j)``
(non-decreasing coordinate tuples), and the monomials of degree ``j`` are computed from those
of degree ``j - 1`` with one product each: ``u^(i_1..i_j) = u^(i_1..i_(j-1)) u_(i_j)``.
"""

from __future__ import annotations

import itertools
import math
from functools import lru_cache
from typing import Any

import numpy as np

from .._validation import check_dtype, check_int, check_matrix


def monomial_count(n_features: int, degree: int) -> int:
    """Number ``C(d + j - 1, j)`` of monomials of degree ``j`` in ``d`` variables.

    Parameters
    ----------
    n_features : int
        ``d >= 1``.
    degree : int
        ``j >= 0`` (``C(d - 1, 0) = 1``: the constant).
    """
    d = check_int(n_features, "n_features", minimum=1)
    j = check_int(degree, "degree", minimum=0)
    return math.comb(d + j - 1, j)


@lru_cache(maxsize=64)
def _recursion(d: int, degree: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(parent, last, scale)`` of the degree-``j`` monomials, ``j >= 1``.

    ``u^alpha = u^(parent's alpha) * u[last]`` with the parent indexed among the degree
    ``j - 1`` monomials (the constant for ``j = 1``), and ``scale = sqrt(binom(j, alpha))``.
    A loop over the ``C(d + j - 1, j)`` multi-indices, never over rows.
    """
    previous = {
        combo: i
        for i, combo in enumerate(itertools.combinations_with_replacement(range(d), degree - 1))
    }
    combos = list(itertools.combinations_with_replacement(range(d), degree))
    parent = np.array([previous[c[:-1]] for c in combos], dtype=np.int64)
    last = np.array([c[-1] for c in combos], dtype=np.int64)
    denominators = [
        math.prod(math.factorial(len(list(g))) for _, g in itertools.groupby(c)) for c in combos
    ]
    scale = np.sqrt(math.factorial(degree) / np.array(denominators, dtype=np.float64))
    return parent, last, scale


def stacked_monomial_features(
    U: Any, max_degree: int, *, weights: Any = None, dtype: Any = np.float64
) -> np.ndarray:
    """Exact features of every degree ``1..e`` side by side.

    Parameters
    ----------
    U : array-like, shape (n, d)
    max_degree : int
        ``e >= 0``; ``e = 0`` returns an ``(n, 0)`` array.
    weights : array-like of shape (e,), optional
        Multiply the block of degree ``j`` by ``weights[j - 1]`` (e.g. polynomial
        coefficients). Default 1.
    dtype : numpy.float64 or numpy.float32
        Precision of the computation and of the result.

    Returns
    -------
    ndarray, shape (n, sum_j C(d + j - 1, j))
        Block ``j`` (in order) is ``w_j phi_j(U)``, so that the Gram matrix of two such maps
        is ``sum_j w_j^2 (U V^T)^j``.

    Notes
    -----
    One multiplication per output entry (each monomial extends one of the previous degree):
    ``O(n sum_j C(d + j - 1, j))`` time, no memory beyond the output.
    """
    dtype = check_dtype(dtype)
    U = check_matrix(U, "U").astype(dtype, copy=False)
    e = check_int(max_degree, "max_degree", minimum=0)
    n, d = U.shape
    counts = [math.comb(d + j - 1, j) for j in range(1, e + 1)]
    w = np.ones(e) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != (e,):
        raise ValueError(f"weights must have shape ({e},); got shape {w.shape}")
    out = np.empty((n, sum(counts)), dtype=dtype)
    previous = np.ones((n, 1), dtype=dtype)
    start = 0
    for j, count in enumerate(counts, start=1):
        parent, last, scale = _recursion(d, j)
        block = out[:, start : start + count]
        np.multiply(previous[:, parent], U[:, last], out=block)
        previous = block.copy()  # unscaled monomials: the parents of the next degree
        block *= (w[j - 1] * scale).astype(dtype)
        start += count
    return out


def monomial_features(U: Any, degree: int, *, dtype: Any = np.float64) -> np.ndarray:
    """Exact feature map ``phi_j`` of ``(u . v)^j``.

    Parameters
    ----------
    U : array-like, shape (n, d)
    degree : int
        ``j >= 0``; degree 0 is the constant feature 1.
    dtype : numpy.float64 or numpy.float32

    Returns
    -------
    ndarray, shape (n, C(d + j - 1, j))
        ``phi_j(U)[:, alpha] = sqrt(j! / alpha!) U^alpha`` for the multi-indices ``alpha`` in
        the order of ``itertools.combinations_with_replacement(range(d), j)``; for every pair
        of rows ``phi_j(u) . phi_j(v) = (u . v)^j`` up to rounding.

    Notes
    -----
    ``O(n C(d + j, j))`` time (the lower degrees are built on the way).

    Examples
    --------
    >>> import numpy as np
    >>> u, v = np.array([[1.0, 2.0]]), np.array([[3.0, -1.0]])
    >>> (monomial_features(u, 3) @ monomial_features(v, 3).T).item()  # (1*3 - 2*1)^3
    1.0
    """
    j = check_int(degree, "degree", minimum=0)
    U = check_matrix(U, "U")
    if j == 0:
        return np.ones((U.shape[0], 1), dtype=check_dtype(dtype))
    start = sum(math.comb(U.shape[1] + i - 1, i) for i in range(1, j))
    return stacked_monomial_features(U, j, dtype=dtype)[:, start:]
