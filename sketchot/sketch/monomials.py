"""Exact symmetric monomial features: ``<phi_j(u), phi_j(v)> = (u . v)^j`` with no variance.

By the multinomial theorem,

.. math::
    (u \\cdot v)^j = \\sum_{|\\alpha| = j} \\binom{j}{\\alpha} u^\\alpha v^\\alpha,
    \\qquad \\binom{j}{\\alpha} = \\frac{j!}{\\alpha_1! \\cdots \\alpha_d!},

so ``phi_j(u)_alpha = sqrt(binom(j, alpha)) u^alpha`` over the ``C(d + j - 1, j)`` multi-indices
``alpha`` of degree ``j`` is an exact feature map of ``(u . v)^j``. Where this count fits a
degree's share of the feature budget it beats any sketch of that size, whose variance is
positive (Han et al. 2020, improved variant of :class:`~sketchot.sketch.PolyTensorSketch`).

The multi-indices of each degree are in colex order (``alpha`` as a non-decreasing tuple of
coordinates, compared from its last entry): then the monomials of degree ``j - 1`` whose
coordinates are all ``<= c`` form a prefix, and those of degree ``j`` ending in ``c`` are that
prefix times ``u_c``. Every feature costs one product of contiguous columns, written straight
into its place, and the scale updates as ``sqrt(j! / alpha!) = sqrt((j-1)! / alpha'!)
sqrt(j / alpha_c)``.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np

from .._validation import check_dtype, check_int, check_matrix

# Rows per block: the (features, rows) working block of a few degrees stays in cache.
BLOCK_ROWS = 2048


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
def colex_monomials(n_features: int, degree: int) -> tuple[tuple[int, ...], ...]:
    """The multi-indices of degree ``j`` as non-decreasing coordinate tuples, in colex order.

    A loop over the ``C(d + j - 1, j)`` multi-indices, never over rows.
    """
    if degree == 0:
        return ((),)
    previous = colex_monomials(n_features, degree - 1)
    return tuple(
        (*combo, c) for c in range(n_features) for combo in previous if not combo or combo[-1] <= c
    )


@lru_cache(maxsize=64)
def _extension_factors(d: int, degree: int) -> list[np.ndarray]:
    """``sqrt(j / alpha_c)`` for the degree ``j - 1`` prefix extended by each coordinate ``c``."""
    previous = colex_monomials(d, degree - 1)
    factors = []
    for c in range(d):
        prefix = previous[: math.comb(c + degree - 1, degree - 1)]
        factors.append(np.sqrt(degree / np.array([combo.count(c) + 1.0 for combo in prefix])))
    return factors


def stacked_monomial_features(
    U: Any,
    max_degree: int,
    *,
    weights: Any = None,
    row_scale: np.ndarray | None = None,
    dtype: Any = np.float64,
    out: np.ndarray | None = None,
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
    row_scale : ndarray of shape (n,), optional
        Multiply row ``i`` by ``row_scale[i]`` (folded into the same pass).
    dtype : numpy.float64 or numpy.float32
        Precision of the computation and of the result.
    out : ndarray of shape (n, sum_j C(d + j - 1, j)) and dtype ``dtype``, optional
        Where to write (e.g. a column slice of a larger feature matrix); allocated if omitted.

    Returns
    -------
    ndarray, shape (n, sum_j C(d + j - 1, j))
        Block ``j`` (in order) is ``w_j phi_j(U)``, so that the Gram matrix of two such maps
        is ``sum_j w_j^2 (U V^T)^j``.

    Notes
    -----
    A few products per output entry (each monomial extends one of the previous degree, then
    its scale): ``O(n sum_j C(d + j - 1, j))`` time. Rows are processed in blocks, computed
    transposed (features x rows, so that every product runs along rows) in a cache-sized
    buffer and written out once.
    """
    dtype = check_dtype(dtype)
    U = check_matrix(U, "U").astype(dtype, copy=False)
    e = check_int(max_degree, "max_degree", minimum=0)
    n, d = U.shape
    counts = [math.comb(d + j - 1, j) for j in range(1, e + 1)]
    w = np.ones(e) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != (e,):
        raise ValueError(f"weights must have shape ({e},); got shape {w.shape}")
    if out is None:
        out = np.empty((n, sum(counts)), dtype=dtype)
    elif out.shape != (n, sum(counts)):
        raise ValueError(f"out must have shape {(n, sum(counts))}; got {out.shape}")
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    extension = [[f.astype(dtype) for f in _extension_factors(d, j)] for j in range(1, e + 1)]
    width = offsets[-1]
    for start in range(0, n, BLOCK_ROWS):
        rows = slice(start, min(start + BLOCK_ROWS, n))
        coordinates = np.ascontiguousarray(U[rows].T)  # (d, b): long inner loops over rows
        block = np.empty((width, coordinates.shape[1]), dtype=dtype)
        if e >= 1:
            block[: counts[0]] = coordinates  # phi_1 = u
        for j in range(2, e + 1):
            source, target = offsets[j - 2], offsets[j - 1]
            for c, factor in enumerate(extension[j - 1]):
                length = factor.shape[0]
                piece = block[target : target + length]
                np.multiply(block[source : source + length], coordinates[c], out=piece)
                piece *= factor[:, None]
                target += length
        # weights and row scales last: every degree above is built from the unweighted one
        for j in range(1, e + 1):
            block[offsets[j - 1] : offsets[j]] *= dtype.type(w[j - 1])
        if row_scale is not None:
            block *= row_scale[rows].astype(dtype)[None, :]
        out[rows] = block.T
    return out


def stacked_monomial_features_on_device(
    U: Any, max_degree: int, xp: Any, weights: np.ndarray, row_scale: Any = None
) -> Any:
    """:func:`stacked_monomial_features` of ``U`` (``n x d``, float64) on the device it is
    on, in the Array API namespace ``xp``: each degree's block is the previous degree's
    prefixes times a coordinate times its factor, as there (the same order of products),
    weighted, then row-scaled; shape ``(n, sum_j C(d + j - 1, j))``."""
    d = U.shape[1]
    blocks, previous = [U], U
    for j in range(2, max_degree + 1):
        pieces = []
        for c, factor in enumerate(_extension_factors(d, j)):
            scale = xp.asarray(factor, device=U.device)
            pieces.append(previous[:, : factor.shape[0]] * U[:, c : c + 1] * scale)
        previous = xp.concat(pieces, axis=1)
        blocks.append(previous)
    features = xp.concat(
        [block * float(w) for block, w in zip(blocks, weights, strict=True)], axis=1
    )
    return features if row_scale is None else features * row_scale[:, None]


def monomial_features(U: Any, degree: int, *, dtype: Any = np.float64) -> np.ndarray:
    """Exact feature map ``phi_j`` of ``(u^T v)^j``.

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
        the order of :func:`colex_monomials`; for every pair
        of rows ``phi_j(u) . phi_j(v) = (u . v)^j`` up to rounding.

    Notes
    -----
    ``O(n C(d + j, j))`` time (the lower degrees are built on the way).

    Examples
    --------
    >>> import numpy as np
    >>> u, v = np.array([[1.0, 2.0]]), np.array([[3.0, -1.0]])
    >>> round((monomial_features(u, 3) @ monomial_features(v, 3).T).item(), 12)  # (3 - 2)^3
    1.0
    """
    j = check_int(degree, "degree", minimum=0)
    U = check_matrix(U, "U")
    if j == 0:
        return np.ones((U.shape[0], 1), dtype=check_dtype(dtype))
    start = sum(math.comb(U.shape[1] + i - 1, i) for i in range(1, j))
    return stacked_monomial_features(U, j, dtype=dtype)[:, start:]
