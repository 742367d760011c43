"""The improved Poly-TensorSketch plan: exact low degrees, calibrated sketch sizes, relative fit.

For a budget of ``R`` features (the constant included) the improved variant of
:class:`~sketchot.sketch.PolyTensorSketch` approximates

.. math::
    f(u \\cdot v) \\approx c_0 + \\sum_{j=1}^{e} c_j \\langle \\phi_j(u), \\phi_j(v) \\rangle
                  + \\sum_{j=e+1}^{r} c_j \\langle T^{(j)}_{m_j}(u), T^{(j)}_{m_j}(v) \\rangle,

with exact monomial features ``phi_j`` (:mod:`~sketchot.sketch.monomials`, ``C(d + j - 1, j)``
columns, zero variance) for the degrees ``1..e`` and TensorSketches of per-degree sizes ``m_j``
for ``e + 1..r``, ``1 + sum_{j <= e} C(d + j - 1, j) + sum_{j > e} m_j = R``.

Everything is chosen on the k-center coreset of Algorithm 4 (entries ``t = u_c . v``, weights
``D`` = cluster sizes), for the RELATIVE error: entry weights ``w = D / f(t)^2``. For given
``(e, r, m)`` the expected weighted squared error is bias plus sketch variance,

.. math::
    J(c) = \\sum_e w_e (p_c(t_e) - f(t_e))^2 + \\sum_{j > e} c_j^2 \\bar V_j / m_j, \\qquad
    \\bar V_j = \\sum_e w_e (\\|u_e\\|^{2j} \\|v_e\\|^{2j} + t_e^{2j}),

the calibrated TensorSketch variance model (measured within 0.8-1.1x of the empirical variance
for ``d >= 19`` up to degree 5, where the paper's ``(2 + 3^j)`` bound overstates it 5-1000x).
``J`` is a generalized ridge regression (the paper's eq. optc with ``W_j^2 = V_j / m_j``), and
for fixed ``c`` the sizes minimising it under ``sum m_j = B`` are ``m_j ~ |c_j| sqrt(V_j)``;
the two are alternated a few times. Every split ``(e, r)`` that fits the budget is tried
(``O(r_max^2)`` small problems); the winner minimises ``J`` with the variance term replaced by
``(sum_j |c_j| sqrt(V_j / m_j))^2``, the bound for fully correlated errors: the sketched
degrees share the first hashes of the recursion (Algorithm 2 at one FFT length
``max m_j``, each degree folded to its ``m_j``, see :func:`~sketchot.sketch.fold_buckets`).

References
----------
I. Han, H. Avron, J. Shin. Polynomial Tensor Sketch for Element-wise Function of Low-Rank
Matrix. ICML 2020 (Algorithms 2-4, eq. optc). N. Pham, R. Pagh. Fast and scalable polynomial
kernels via explicit feature maps. KDD 2013 (TensorSketch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.polynomial import chebyshev as C
from scipy.optimize import nnls

from .coefficients import (
    CoefficientFit,
    chebyshev_to_monomial,
    coreset_entries,
    evaluate_finite,
)
from .functions import ElementwiseFunction

#: Largest degree searched when no ``degree`` is given.
MAX_AUTO_DEGREE = 16

#: Rows of the other side kept in the coreset regression (uniform subsample beyond): the fit
#: is then O(k POOL r) whatever n, and 4096 rows per centre pin down a degree-16 polynomial.
CORESET_POOL = 4096

# Alternations of (coefficients | sizes): a few rounds, not tuned (sizes are integers).
ALLOCATION_ROUNDS = 3

# Relative weights 1 / f^2 are capped at this ratio to the largest: keeps them finite in
# float64 where f underflows, far beyond any error a polynomial sketch can reach there.
MAX_WEIGHT_RATIO = 1e200

# Rows per step of the blocked QR of the design (see triangular_factor).
QR_BLOCK_ROWS = 256


class VanishingFunctionError(ValueError):
    """``f`` is zero (or underflows) on every sampled entry of ``U V^T``: there is nothing to
    fit, and a global expansion cannot represent ``f`` on this data."""


@dataclass
class ImprovedPlan:
    """Degrees, sizes and coefficients of the improved sketch.

    Attributes
    ----------
    degree : int
        Polynomial degree ``r``.
    exact_degree : int
        Degrees ``1..e`` use exact monomial features.
    sketch_sizes : ndarray of int, shape (r - e,)
        TensorSketch size ``m_j`` of degree ``j = e + 1..r``.
    fit : CoefficientFit
        Coefficients (``method='coreset-relative'``) and diagnostics: ``objective`` (the
        predicted relative weighted error ``J / sum_e w_e f_e^2``), ``bias``, ``variance`` and
        ``candidates`` (``(e, r, objective)`` of every split tried).
    """

    degree: int
    exact_degree: int
    sketch_sizes: np.ndarray
    fit: CoefficientFit = field(repr=False)

    @property
    def n_features(self) -> int:
        """``1 + sum_{j <= e} C(d + j - 1, j) + sum_j m_j`` (set by :func:`plan_improved`)."""
        return int(self.fit.details["n_features"])


def allocate_sizes(importance: np.ndarray, total: int) -> np.ndarray:
    """Integers ``m_j >= 1`` summing to ``total``, proportional to ``importance`` otherwise.

    Largest-remainder rounding of ``total * importance / sum(importance)`` after reserving one
    bucket per degree (every sketched degree needs at least one). ``total >= len(importance)``.
    """
    k = importance.shape[0]
    share = np.maximum(np.nan_to_num(importance, nan=0.0, posinf=0.0), 0.0)
    spare = total - k
    if share.sum() <= 0.0:
        share = np.ones(k)
    ideal = spare * share / share.sum()
    sizes = np.floor(ideal).astype(np.int64)
    left = spare - int(sizes.sum())
    sizes[np.argsort(sizes - ideal)[:left]] += 1  # largest fractional parts first
    return sizes + 1


def plan_improved(
    U: np.ndarray,
    V: np.ndarray,
    f: ElementwiseFunction,
    half_width: float,
    rank: int,
    max_degree: int,
    coreset_size: int,
    rng: np.random.Generator,
    *,
    nonnegative: bool = False,
    pool_size: int = CORESET_POOL,
) -> ImprovedPlan:
    """Choose ``(e, r, m_j, c_j)`` for a budget of ``rank`` features (see the module docstring).

    Parameters
    ----------
    U, V : ndarray, shape (n1, d) and (n2, d)
    f : ElementwiseFunction
    half_width : float
        ``a``: the Chebyshev basis of the regression lives on ``[-a, a]``.
    rank : int
        Total number of features ``R >= 1``.
    max_degree : int
        Largest degree ``r`` searched.
    coreset_size : int
        k-center clusters ``k``.
    rng : Generator
        k-center starts and the subsample of the other side.
    nonnegative : bool
        Constrain every ``c_j >= 0``.
    pool_size : int
        Rows of the other side kept (uniformly) when it has more.

    Notes
    -----
    ``O((n1 + n2) k d)`` for the coreset, ``O(k P r_max^2)`` for the QR of the design (``P``
    pooled rows) and ``O(r_max^2 ALLOCATION_ROUNDS r_max^3)`` for the search: the triangular
    factor of degree ``r`` is the leading block of the one of ``r_max``, so the search never
    revisits entries.
    """
    d = U.shape[1]
    entries = coreset_entries(U, V, coreset_size, rng)
    others, pool_weight = entries.others, 1.0
    if others.shape[0] > pool_size:
        pool_weight = others.shape[0] / pool_size
        others = others[np.sort(rng.choice(others.shape[0], size=pool_size, replace=False))]
    t = entries.centers @ others.T  # (k, P)
    values = evaluate_finite(f, t).ravel()
    # relative to the largest value, so that squaring neither underflows nor overflows
    largest = float(np.abs(values).max())
    if largest == 0.0:
        raise VanishingFunctionError(
            f"f is 0 in float64 on all {values.size} sampled entries of U V^T (entries in "
            f"[{t.min():.3g}, {t.max():.3g}]); a global polynomial of f cannot be fitted here"
        )
    relative = np.abs(values) / largest
    weights = np.repeat(entries.cluster_sizes * pool_weight, others.shape[0])
    weights = weights / np.maximum(relative, 1.0 / np.sqrt(MAX_WEIGHT_RATIO)) ** 2
    weights /= weights.max()
    weights[weights < 1e-100] = 0.0  # nothing at float64 precision next to the largest, 1
    t = t.ravel()

    # Weighted Chebyshev design on [-a, a] up to r_max, reduced by one QR: the QR of the
    # first r + 1 columns is the leading block, so every degree's least-squares problem is
    # an (r + 1)-row one. QR, not normal equations: 1 / f^2 spans up to 1e26 on colours at
    # reg 0.1, where squaring the condition number lost the fit (true-kernel Sinkhorn error
    # 0.64 instead of 0.11 at rank 241, measured). The target
    # rides along as a last column, so Q is never formed: R = [[T, z], [0, rho]].
    r_max = max_degree
    root = np.sqrt(weights)
    # zero rows change no least-squares problem and give R its full r_max + 2 rows
    augmented = np.zeros((max(t.shape[0], r_max + 2), r_max + 2))
    augmented[: t.shape[0], :-1] = C.chebvander(np.clip(t / half_width, -1.0, 1.0), r_max)
    augmented[: t.shape[0], :-1] *= root[:, None]
    # f / max|f|: the fit is linear in f, and tiny values would underflow when squared
    augmented[: t.shape[0], -1] = values / largest * root
    reduced = triangular_factor(augmented)
    triangle, projection = reduced[: r_max + 1, : r_max + 1], reduced[: r_max + 1, -1]
    energy = float(augmented[:, -1] @ augmented[:, -1])
    if energy == 0.0:  # every entry where f is not 0 has a weight that underflowed
        raise VanishingFunctionError(
            f"f is 0 in float64, or weighs nothing, on all {values.size} sampled entries of "
            f"U V^T (entries in [{t.min():.3g}, {t.max():.3g}]); a global polynomial of f "
            "cannot be fitted here"
        )
    outside = float(reduced[r_max + 1, -1] ** 2)  # beyond degree r_max
    variances = _variance_sums(entries.centers, others, t, weights, r_max)
    # T_j(t / a) has monomials of degree <= j only: every degree's map is a leading block.
    to_monomial = chebyshev_to_monomial(r_max, half_width)

    counts = [math.comb(d + j - 1, j) for j in range(r_max + 1)]
    best: tuple[float, Any] | None = None
    candidates = []
    exact_cost = 0  # features of the exact degrees 1..e
    for e in range(r_max + 1):
        if e > 0:
            exact_cost += counts[e]
        budget = rank - 1 - exact_cost
        if budget < 0:
            break
        # Every free feature is spent on sketched degrees: with the variance in the ridge a
        # sketched degree never raises J (c_j = 0 is feasible), so r = e only when nothing is left.
        first = e + 1 if budget > 0 and e < r_max else e
        for r in range(first, min(r_max, e + budget) + 1):
            result = _fit_split(
                triangle,
                projection,
                outside,
                variances,
                to_monomial,
                half_width,
                e,
                r,
                budget,
                nonnegative,
            )
            candidates.append((e, r, result[0]))
            if best is None or result[0] < best[0]:
                best = (result[0], (e, r, *result[1:]))
    assert best is not None  # e = 0, r = 0 is always feasible for rank >= 1
    objective, (e, r, coef, cheb, sizes, bias, variance) = best
    coef = np.maximum(coef, 0.0) if nonnegative else coef  # NNLS zeros can come back as -1e-17
    coef, cheb = coef * largest, cheb * largest  # undo the scaling of f (ratios below keep it)
    n_features = 1 + sum(counts[1 : e + 1]) + int(sizes.sum())
    details = {
        **entries.details(),
        "objective": objective / energy,
        "bias": bias / energy,
        "variance": variance / energy,
        "candidates": candidates,
        "pooled_rows": int(others.shape[0]),
        "n_features": n_features,
    }
    fit = CoefficientFit(coef, "coreset-relative", chebyshev_coef=cheb, details=details)
    return ImprovedPlan(r, e, sizes, fit)


def triangular_factor(matrix: np.ndarray, block_rows: int = QR_BLOCK_ROWS) -> np.ndarray:
    """``R`` of ``matrix = Q R`` (up to the signs of its rows), by QR of stacked row blocks.

    Each step factors the previous ``R`` stacked on the next ``block_rows`` rows (TSQR), so
    every LAPACK call is small: one QR of 41k x 18 took 1 s on a loaded 2-core machine, where
    multi-threaded BLAS spun against other processes (measured; 10 ms unloaded). Row signs
    do not matter to the least-squares problems built from ``R``. ``O(rows cols^2)`` time.
    """
    reduced = None
    for start in range(0, matrix.shape[0], block_rows):
        chunk = matrix[start : start + block_rows]
        stacked = chunk if reduced is None else np.vstack([reduced, chunk])
        reduced = np.linalg.qr(stacked, mode="r")
    return reduced


def _variance_sums(
    centers: np.ndarray, others: np.ndarray, t: np.ndarray, weights: np.ndarray, r_max: int
) -> np.ndarray:
    """``V_j = sum_e w_e ((||u_e||^2 ||v_e||^2)^j + t_e^(2j))`` for ``j = 0..r_max``.

    Both terms are powers of values ``x_e <= x_max``, summed as ``x_max^j sum w (x / x_max)^j``
    with ratios below ``1e-12`` dropped: with weights down to ``1e-100`` their products would
    turn subnormal by degree 16, and subnormal arithmetic is about 100x slower; they weigh
    ``< 1e-12`` of the largest.
    """
    norms = np.outer(np.einsum("ij,ij->i", centers, centers), np.einsum("ij,ij->i", others, others))
    sums = np.zeros(r_max + 1)
    for values in (norms.ravel(), t * t):
        top = float(values.max())
        if top <= 0.0:
            continue
        ratio = values / top
        ratio[ratio < 1e-12] = 0.0
        power = np.ones_like(ratio)
        for j in range(1, r_max + 1):
            power *= ratio
            # an elementwise sum, not a BLAS dot: no threads to spin on a busy machine
            sums[j] += float(np.sum(weights * power)) * top**j
    return sums


def _fit_split(
    triangle: np.ndarray,
    projection: np.ndarray,
    outside: float,
    variances: np.ndarray,
    to_monomial: np.ndarray,
    half_width: float,
    e: int,
    r: int,
    budget: int,
    nonnegative: bool,
) -> tuple[float, np.ndarray, np.ndarray, np.ndarray, float, float]:
    """Alternate ridge fit and size allocation for one split; ``(J, c, c', m, bias, var)``.

    With ``sqrt(w) X_c = Q T`` (``T`` upper triangular) the bias of Chebyshev coefficients
    ``c'`` of degree ``r`` is ``||T_r c' - z_r||^2 + sum_{i > r} z_i^2 + outside`` with
    ``z = Q^T sqrt(w) f``.
    """
    block = slice(0, r + 1)
    sketched = np.arange(e + 1, r + 1)
    to_monomial = to_monomial[block, block]
    tail = float(projection[r + 1 :] @ projection[r + 1 :]) + outside
    sizes = allocate_sizes(np.ones(sketched.size), budget) if sketched.size else np.zeros(0, int)
    rounds = ALLOCATION_ROUNDS if sketched.size else 1
    for round_ in range(rounds):
        ridge = np.zeros(r + 1)
        ridge[sketched] = np.sqrt(variances[sketched] / sizes)
        cheb = _ridge_least_squares(
            triangle[block, block], projection[block], ridge, to_monomial, half_width, nonnegative
        )
        coef = to_monomial @ cheb
        if round_ < rounds - 1:  # the last coefficients are fitted for the final sizes
            sizes = allocate_sizes(np.abs(coef[sketched]) * np.sqrt(variances[sketched]), budget)
    residual = triangle[block, block] @ cheb - projection[block]
    bias = float(residual @ residual) + tail
    # The degrees share the first hashes of the recursion, so their errors correlate: rank
    # splits by the Cauchy-Schwarz bound (sum of standard deviations)^2, exact when they are
    # fully correlated. The sum of variances let 3-4-bucket sketches of degrees up to 16 in,
    # whose heavy tail over hash draws cost 1 trial in 100 a 15x error (Figure 1 protocol).
    deviations = np.abs(coef[sketched]) * np.sqrt(variances[sketched] / np.maximum(sizes, 1))
    variance = float(deviations.sum() ** 2)
    return bias + variance, coef, cheb, sizes, bias, variance


def _ridge_least_squares(
    triangle: np.ndarray,
    projection: np.ndarray,
    ridge: np.ndarray,
    to_monomial: np.ndarray,
    half_width: float,
    nonnegative: bool,
) -> np.ndarray:
    """``argmin ||T c' - z||^2 + ||W R c'||^2`` (optionally ``R c' >= 0``), Chebyshev ``c'``.

    Solved as one stacked least-squares problem, never through its normal equations. The
    non-negative problem is NNLS in ``e_j = c_j a^j`` (monomials of ``t / a``, bounded by 1).
    """
    system = np.vstack([triangle, ridge[:, None] * to_monomial])
    rhs = np.concatenate([projection, np.zeros(ridge.shape[0])])
    norms = np.linalg.norm(system, axis=0)
    norms[norms == 0.0] = 1.0  # an all-zero column: its coefficient is 0 either way
    cheb = np.linalg.lstsq(system / norms, rhs, rcond=None)[0] / norms
    if not nonnegative or np.all(to_monomial @ cheb >= 0):
        return cheb
    scale = half_width ** np.arange(ridge.shape[0])
    inverse = np.linalg.inv(to_monomial * scale[:, None])  # e -> c'
    scaled = system @ inverse
    column = np.linalg.norm(scaled, axis=0)
    column[column == 0.0] = 1.0
    e, _ = nnls(scaled / column, rhs, maxiter=50 * ridge.shape[0])
    return inverse @ (e / column)
