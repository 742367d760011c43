"""Polynomial coefficients for Poly-TensorSketch (Han, Avron and Shin 2020, Sections 3.2-3.3).

Every method returns monomial coefficients ``c_0..c_r`` with ``f(t) ~ sum_j c_j t^j`` on
``[-a, a]``:

``taylor``
    Truncated Taylor series of ``f`` around a point.
``chebyshev``
    Interpolation at the ``r + 1`` Chebyshev points of ``[-a, a]``.
``optimal``
    The generalized ridge regression of eq. (optc) over all ``n1 n2`` entries of ``U V^T``,

    .. math:: c^* = \\arg\\min_c \\|X c - f\\|_2^2 + \\|W c\\|_2^2,

    where ``X`` is the Vandermonde matrix of the entries and ``W`` the diagonal regulariser
    that bounds the TensorSketch variance of each degree. The design is accumulated in
    blocks (normal equations), so ``n1 n2`` values are never held at once.
``coreset``
    The same regression restricted to (k-center centres of one side) x (all rows of the other
    side), entries weighted by cluster size (Algorithms 3 and 4).

The regression is solved in the Chebyshev basis of ``[-a, a]`` for conditioning:
``(X_c^T D X_c + (W R)^T (W R)) c' = X_c^T D f`` and ``c = R c'``, where ``R`` maps
Chebyshev coefficients to monomial ones (including the change of variable ``t -> t / a``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.polynomial import chebyshev as C
from numpy.polynomial import polynomial as P
from scipy.optimize import nnls

from .._validation import check_choice, check_int
from .functions import ElementwiseFunction
from .kcenter import greedy_k_center

COEFFICIENT_METHODS = ("coreset", "optimal", "chebyshev", "taylor")
REGULARIZERS = ("shifted", "theorem", "none")

# Entries of U V^T evaluated per block by the 'optimal' method: about 8 MB per design column.
OPTIMAL_BLOCK_ENTRIES = 1 << 20


@dataclass
class CoefficientFit:
    """Monomial coefficients and how they were obtained.

    Attributes
    ----------
    coef : ndarray, shape (r + 1,)
        Monomial coefficients ``c_j`` of ``t^j``.
    method : str
    chebyshev_coef : ndarray or None
        The Chebyshev-basis solution ``c'`` on ``[-a, a]`` (regression and interpolation).
    details : dict
        Method-specific diagnostics (coreset side, epsilon of the coreset, ...).
    """

    coef: np.ndarray
    method: str
    chebyshev_coef: np.ndarray | None = None
    details: dict[str, Any] = field(default_factory=dict)


def chebyshev_to_monomial(degree: int, half_width: float) -> np.ndarray:
    """Matrix ``R`` with ``sum_j (R c')_j t^j = sum_j c'_j T_j(t / a)``.

    Parameters
    ----------
    degree : int
        Polynomial degree ``r``.
    half_width : float
        ``a > 0``, the half width of the interval ``[-a, a]``.

    Returns
    -------
    ndarray, shape (r + 1, r + 1)
        Column ``j`` holds the monomial coefficients of ``T_j(t / a)``.
    """
    R = np.zeros((degree + 1, degree + 1))
    for j in range(degree + 1):
        unit = np.zeros(j + 1)
        unit[j] = 1.0
        R[: j + 1, j] = C.cheb2poly(unit)
    return R / half_width ** np.arange(degree + 1)[:, None]


def power_sums(sq_norms: np.ndarray, max_power: int) -> np.ndarray:
    """``S_p = sum_i ||u_i||^(2p)`` for ``p = 0..max_power``."""
    sums = np.empty(max_power + 1)
    power = np.ones_like(sq_norms)
    for p in range(max_power + 1):
        sums[p] = power.sum()
        power *= sq_norms  # repeated products: cheaper than a pow per power on n values
    return sums


def ridge_diagonal(
    sq_norms_u: np.ndarray,
    sq_norms_v: np.ndarray,
    degree: int,
    sketch_dim: int,
    convention: str = "shifted",
) -> np.ndarray:
    """Diagonal of the regulariser ``W`` (Definition 3), one weight per degree ``0..r``.

    ``W_0 = 0`` (the constant term has no sketch variance). For ``j >= 1``:

    * ``'shifted'`` (default, the authors' reference code, Definition 3 read literally with
      1-based indices): ``W_j = sqrt(r (2 + 3^(j+1)) S_(j+1)(U) S_(j+1)(V) / m)``;
    * ``'theorem'`` (Proposition 1 / Theorem 3): ``W_j = sqrt(r (2 + 3^j) S_j(U) S_j(V) / m)``;
    * ``'none'``: ``W = 0``, plain least squares.

    ``S_p(U) = sum_i ||u_i||^(2p)``; ``sq_norms_*`` hold the ``||u_i||^2``.
    """
    convention = check_choice(convention, "regularizer", REGULARIZERS)
    weights = np.zeros(degree + 1)
    if convention == "none" or degree == 0:
        return weights
    shift = 1 if convention == "shifted" else 0
    su = power_sums(sq_norms_u, degree + shift)
    sv = power_sums(sq_norms_v, degree + shift)
    for j in range(1, degree + 1):
        p = j + shift
        weights[j] = np.sqrt(degree * (2.0 + 3.0**p) * su[p] * sv[p] / sketch_dim)
    return weights


def chebyshev_normal_equations(
    t: np.ndarray,
    values: np.ndarray,
    row_weights: np.ndarray | None,
    degree: int,
    half_width: float,
    block_entries: int = OPTIMAL_BLOCK_ENTRIES,
) -> tuple[np.ndarray, np.ndarray]:
    """``(X_c^T D X_c, X_c^T D f)`` for entries ``t`` with values ``f`` and weights ``D``.

    ``X_c[e, j] = T_j(t_e / a)``. ``t`` and ``values`` are 1-D, or 2-D with one weight per row
    (``row_weights``, the cluster sizes of a coreset); ``None`` means unit weights.

    The Gram matrix needs only the weighted moments ``mu_p = sum_e w_e T_p(y_e)``,
    ``p = 0..2r``, because ``T_j T_k = (T_(j+k) + T_|j-k|) / 2``; they come from the
    three-term recurrence, block by block, so no design matrix is ever built.
    ``O(len(t) r)`` time, ``O(block_entries)`` memory.
    """
    t = np.atleast_2d(t)
    values = np.atleast_2d(values)
    weights = np.ones(t.shape[0]) if row_weights is None else np.asarray(row_weights, float)
    moments = np.zeros(2 * degree + 1)
    projections = np.zeros(degree + 1)
    columns = max(1, block_entries // t.shape[0])
    for start in range(0, t.shape[1], columns):
        block = slice(start, start + columns)
        y = np.clip(t[:, block] / half_width, -1.0, 1.0)
        f = values[:, block]
        previous, current = np.ones_like(y), y
        moments[0] += weights.sum() * y.shape[1]
        projections[0] += weights @ f.sum(axis=1)
        for p in range(1, 2 * degree + 1):
            if p > 1:
                following = y * current
                following *= 2.0
                following -= previous
                previous, current = current, following
            moments[p] += weights @ current.sum(axis=1)
            if p <= degree:
                projections[p] += weights @ np.einsum("ij,ij->i", f, current)
    index = np.arange(degree + 1)
    gram = (
        moments[index[:, None] + index[None, :]] + moments[np.abs(index[:, None] - index[None, :])]
    ) / 2.0
    return gram, projections


def solve_regression(
    gram: np.ndarray,
    moment: np.ndarray,
    ridge: np.ndarray,
    half_width: float,
    *,
    nonnegative: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Solve the generalized ridge regression in the Chebyshev basis.

    Minimises ``c'^T G c' - 2 h^T c' + ||W R c'||^2`` with ``G = X_c^T D X_c`` and
    ``h = X_c^T D f``; returns ``(c, c')`` with ``c = R c'`` the monomial coefficients.

    With ``nonnegative=True`` the monomial coefficients are constrained to ``c_j >= 0``. The
    problem is solved by NNLS in the rescaled variables ``e_j = c_j a^j`` (monomials of
    ``t / a``, bounded by 1 on the interval), through the square root of the quadratic form.
    """
    degree = gram.shape[0] - 1
    R = chebyshev_to_monomial(degree, half_width)
    WR = ridge[:, None] * R
    system = gram + WR.T @ WR
    # Symmetric diagonal scaling first: W can exceed the data term by many orders of
    # magnitude, and an unscaled least-squares solve would cut the data directions as noise.
    diagonal = np.sqrt(np.maximum(np.diag(system), np.finfo(float).tiny))
    scaled = system / np.outer(diagonal, diagonal)
    cheb = np.linalg.lstsq(scaled, moment / diagonal, rcond=None)[0] / diagonal
    coef = R @ cheb
    if not nonnegative or np.all(coef >= 0):
        return np.maximum(coef, 0.0) if nonnegative else coef, cheb
    # e = P c' with P the monomial coefficients of T_j(y): the quadratic form in e is
    # Q = P^{-T} system P^{-1}, the linear term q = P^{-T} h.
    scale = half_width ** np.arange(degree + 1)
    to_e = R * scale[:, None]  # = P
    inverse = np.linalg.inv(to_e)
    Q = inverse.T @ system @ inverse
    q = inverse.T @ moment
    eigvals, eigvecs = np.linalg.eigh((Q + Q.T) / 2)
    keep = eigvals > eigvals.max() * 1e-13
    root = np.sqrt(eigvals[keep])[:, None] * eigvecs[:, keep].T  # Q = root^T root
    target = (eigvecs[:, keep].T @ q) / np.sqrt(eigvals[keep])
    e, _ = nnls(root, target, maxiter=50 * (degree + 1))
    coef = e / scale
    return coef, inverse @ e


def taylor_coefficients(f: ElementwiseFunction, degree: int, center: float = 0.0) -> CoefficientFit:
    """Monomial coefficients of the degree-``r`` Taylor polynomial of ``f`` around ``center``."""
    shifted = f.taylor_coefficients(center, degree)
    coef = P.Polynomial(shifted)(P.Polynomial([-center, 1.0])).coef
    out = np.zeros(degree + 1)
    out[: coef.shape[0]] = coef[: degree + 1]
    return CoefficientFit(out, "taylor", details={"center": center})


def chebyshev_coefficients(
    f: ElementwiseFunction, degree: int, half_width: float
) -> CoefficientFit:
    """Interpolate ``f`` at the ``r + 1`` Chebyshev points (first kind) of ``[-a, a]``."""
    cheb = C.chebinterpolate(lambda y: f(half_width * y), degree)
    coef = chebyshev_to_monomial(degree, half_width) @ cheb
    return CoefficientFit(coef, "chebyshev", chebyshev_coef=cheb)


def regression_coefficients(
    U: np.ndarray,
    V: np.ndarray,
    f: ElementwiseFunction,
    degree: int,
    half_width: float,
    ridge: np.ndarray,
    *,
    coreset_size: int | None = None,
    rng: np.random.Generator | None = None,
    nonnegative: bool = False,
    block_entries: int = OPTIMAL_BLOCK_ENTRIES,
) -> CoefficientFit:
    """Ridge regression of ``f`` on entries of ``U V^T``: all of them, or a coreset.

    ``coreset_size=None`` (``'optimal'``, eq. optc): all ``n1 n2`` entries in row blocks of
    about ``block_entries``, ``O(n1 n2 (d + r^2))`` time, ``O(block_entries r)`` memory.

    ``coreset_size=k`` (``'coreset'``, Coreset-TS, Algorithm 4): greedy k-center (drawn with
    ``rng``) runs on the rows of ``U`` and of ``V``. With ``eps_U`` the sum of distances of
    the rows of ``U`` to their centres (likewise ``eps_V``), the ``U`` coreset is used when
    ``eps_U * sum_i ||v_i|| < eps_V * sum_j ||u_j||`` (the smaller second term of the bound of
    Theorem 4); the regression then runs on the ``k n2`` entries ``u_bar_c . v_j``, each
    weighted by the size of cluster ``c`` (so the weights sum to ``n1 n2``), else on
    ``u_i . v_bar_c`` symmetrically. ``O((n1 + n2) k (d + r^2))`` time.
    """
    gram = np.zeros((degree + 1, degree + 1))
    moment = np.zeros(degree + 1)
    if coreset_size is None:
        rows = max(1, block_entries // V.shape[0])
        # lazily: one row block of U V^T at a time
        blocks = ((U[start : start + rows] @ V.T, None) for start in range(0, U.shape[0], rows))
        method, details = "optimal", {}
    else:
        entries = coreset_entries(U, V, coreset_size, rng)
        blocks = [(entries.centers @ entries.others.T, entries.cluster_sizes)]
        method, details = "coreset", entries.details()
    for t, weights in blocks:
        g, h = chebyshev_normal_equations(t, evaluate_finite(f, t), weights, degree, half_width)
        gram += g
        moment += h
    coef, cheb = solve_regression(gram, moment, ridge, half_width, nonnegative=nonnegative)
    return CoefficientFit(coef, method, chebyshev_coef=cheb, details=details)


@dataclass
class CoresetEntries:
    """The coreset of Algorithm 4: entries ``centers[c] . others[i]``, weight ``cluster_sizes[c]``.

    Attributes
    ----------
    side : {'U', 'V'}
        Which side's k-center centres were kept.
    centers : ndarray, shape (k, d)
        The centres (rows of ``side``).
    others : ndarray, shape (n_other, d)
        Every row of the other side.
    cluster_sizes : ndarray of int, shape (k,)
    center_indices : ndarray of int, shape (k,)
    epsilon_u, epsilon_v : float
        k-center costs of both sides.
    """

    side: str
    centers: np.ndarray
    others: np.ndarray
    cluster_sizes: np.ndarray
    center_indices: np.ndarray
    epsilon_u: float
    epsilon_v: float

    def details(self) -> dict[str, Any]:
        """Diagnostics of a coreset fit (:attr:`CoefficientFit.details`)."""
        return {
            "side": self.side,
            "epsilon_U": self.epsilon_u,
            "epsilon_V": self.epsilon_v,
            "centers": self.center_indices,
            "cluster_sizes": self.cluster_sizes,
        }


def coreset_entries(
    U: np.ndarray, V: np.ndarray, coreset_size: int, rng: np.random.Generator
) -> CoresetEntries:
    """Greedy k-center on both sides and the choice of side of Algorithm 4.

    The ``U`` coreset is used when ``eps_U * sum_i ||v_i|| < eps_V * sum_j ||u_j||``, else the
    ``V`` one (the entries ``u . v`` are symmetric in the roles). ``O((n1 + n2) k d)`` time.
    """
    coreset_size = check_int(
        coreset_size, "coreset_size", minimum=1, maximum=min(U.shape[0], V.shape[0])
    )
    clusters_u = greedy_k_center(U, coreset_size, rng)
    clusters_v = greedy_k_center(V, coreset_size, rng)
    bound_u = clusters_u.cost * np.linalg.norm(V, axis=1).sum()
    bound_v = clusters_v.cost * np.linalg.norm(U, axis=1).sum()
    if bound_u < bound_v:
        side, clusters, own, others = "U", clusters_u, U, V
    else:
        side, clusters, own, others = "V", clusters_v, V, U
    return CoresetEntries(
        side,
        own[clusters.centers],
        others,
        clusters.cluster_sizes,
        clusters.centers,
        clusters_u.cost,
        clusters_v.cost,
    )


def evaluate_finite(f: ElementwiseFunction, t: np.ndarray) -> np.ndarray:
    """``f(t)`` as float64, with a clear error if any value is not finite."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        values = np.asarray(f(t), dtype=np.float64)
    if not np.all(np.isfinite(values)):
        bad = t[~np.isfinite(values)]
        raise ValueError(
            f"function {f!r} is not finite on the interpolation interval: "
            f"f({bad[0]:.6g}) = {values[~np.isfinite(values)][0]} "
            f"({bad.size} of {t.size} points); rescale the inputs or the function"
        )
    return values
