"""How accurate a fitted polynomial sketch is, measured after the fit, and what would help.

A polynomial of degree ``r`` follows ``f`` on ``[-a, a]`` only while ``a`` is moderate: ``exp``
on ``[-16, 16]`` needs a degree near 30 for a relative error of 1e-2 in the largest entries,
and a relative-error fit of the small ones needs more. Past that the features are wrong by
orders of magnitude, with nothing in the numbers to tell. So every fit measures its features
against the function itself on the entries of its k-center coreset (Algorithm 4: the centres
of one side against the rows of the other, weighted by cluster size, which stand for all
``n1 n2`` entries), and its polynomial against the function on entries it was not fitted on
(up to 256 rows of each side: a coreset of a few distinct points, as on integer data, is
interpolated exactly and says nothing of the other values of ``u . v``); the larger error is
the fit's. A fit above its ``fit_tolerance`` warns with the measured error and
with changes tried on the same coreset and random draws that meet the tolerance.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .improved import MAX_AUTO_DEGREE
from .kcenter import greedy_k_center

#: Relative error above which a fit warns (the default ``fit_tolerance``): the error of the
#: product ``F_U F_V^T`` against ``f(U V^T)``, in the Frobenius norm over the coreset entries.
DEFAULT_FIT_TOLERANCE = 0.05

#: Rows of the other side measured against the coreset centres (evenly spaced beyond): with
#: ``k`` centres, ``k x 1024`` entries, against features of ``k + 1024`` rows.
MEASURE_ROWS = 1024

#: Rows of each side on which the fitted polynomial itself is checked against ``f`` beyond the
#: coreset (evenly spaced, with the row of largest norm): the coreset entries the coefficients
#: were fitted on can miss values of ``u . v`` that other rows make (a few distinct points, as on
#: integer data, are interpolated exactly on the coreset and missed elsewhere).
POLYNOMIAL_CHECK_ROWS = 256

#: Advice must measure at most this fraction of the tolerance on the coreset it is tried on,
#: so that a refit with other random draws (another coreset, other hashes) meets it too.
ADVICE_MARGIN = 0.5

#: Multiples of the sketch size (``rank``, or ``sketch_dim`` for ``'paper'``) tried for advice.
SIZE_FACTORS = (1, 4, 16)

#: Interval factors tried for the advice to scale the inputs down: from 1 down to 2^-12 by a
#: bisection on the exponent (each step a full refit).
SMALLEST_SCALE = 2.0**-12
SCALE_STEPS = 4


class SketchAccuracyWarning(UserWarning):
    """A fitted polynomial sketch misses its function by more than ``fit_tolerance``."""


@dataclass(frozen=True)
class MeasuredEntries:
    """The entries ``U[left] . V[right]`` a fit is measured on, with their weights.

    Attributes
    ----------
    left, right : ndarray of int
        Rows of ``U`` and of ``V``; every pair is an entry.
    left_weights, right_weights : ndarray
        The weight of entry ``(i, j)`` is ``left_weights[i] * right_weights[j]``: cluster
        sizes on the coreset side, ``n / len(rows)`` on the subsampled side, so that the
        weights sum to ``n1 n2``.
    """

    left: np.ndarray
    right: np.ndarray
    left_weights: np.ndarray
    right_weights: np.ndarray

    @property
    def size(self) -> int:
        """Number of entries measured."""
        return self.left.shape[0] * self.right.shape[0]


def measured_entries(
    U: np.ndarray, V: np.ndarray, details: dict[str, Any], coreset_size: int
) -> MeasuredEntries:
    """The coreset of the fit when it had one (``details`` of a coreset fit), else a
    deterministic one: greedy k-center of ``U`` from its row of largest norm (the rows that
    make the ends of ``[-a, a]``). The other side is kept whole up to :data:`MEASURE_ROWS`
    rows, evenly spaced beyond. ``O((n1 + n2) k d)`` when a k-center runs, ``O(k)`` otherwise.
    """
    if "centers" in details and "cluster_sizes" in details:
        side, centers = details["side"], np.asarray(details["centers"])
        sizes = np.asarray(details["cluster_sizes"], dtype=np.float64)
    else:
        k = max(1, min(int(coreset_size), U.shape[0]))
        first = int(np.argmax(np.einsum("ij,ij->i", U, U)))
        clusters = greedy_k_center(U, k, first=first)
        side, centers = "U", clusters.centers
        sizes = clusters.cluster_sizes.astype(np.float64)
    n_other = (V if side == "U" else U).shape[0]
    rows = np.unique(np.linspace(0, n_other - 1, min(n_other, MEASURE_ROWS)).astype(np.int64))
    spread = np.full(rows.shape[0], n_other / rows.shape[0])
    if side == "U":
        return MeasuredEntries(centers, rows, sizes, spread)
    return MeasuredEntries(rows, centers, spread, sizes)


def checked_rows(W: np.ndarray, count: int = POLYNOMIAL_CHECK_ROWS) -> np.ndarray:
    """Up to ``count`` evenly spaced rows of ``W`` and its row of largest norm (the ends of
    ``[-a, a]``, where a polynomial strays first), sorted and unique."""
    n = W.shape[0]
    rows = np.linspace(0, n - 1, min(n, count)).astype(np.int64)
    largest = int(np.argmax(np.einsum("ij,ij->i", W, W)))
    return np.unique(np.append(rows, largest))


def polynomial_error(
    U: np.ndarray,
    V: np.ndarray,
    coef: np.ndarray,
    function: Callable[[np.ndarray], np.ndarray],
    log_row_scales: Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[float, int]:
    """``(relative error of p(U V^T) against f(U V^T), entries)`` on the entries of
    :func:`checked_rows` of both sides, ``p`` the polynomial of monomial coefficients ``coef``:
    the bias of the features (their expectation is ``p``), measured out of the coreset.

    ``log_row_scales(W)``: log of a factor of each row (the entry ``(i, j)`` of the matrix is
    ``s_i s_j f(u_i . v_j)``: the Gaussian kernel's ``exp(-||u||^2)``); ``None``: 1.
    ``O(k1 k2 (d + r))`` for ``k1 x k2`` entries.
    """
    left, right = checked_rows(U), checked_rows(V)
    t = U[left] @ V[right].T
    with np.errstate(over="ignore", invalid="ignore"):
        approx = np.polynomial.polynomial.polyval(t, coef)
        truth = np.asarray(function(t), dtype=np.float64)
    weights = []
    for W, rows in ((U, left), (V, right)):
        if log_row_scales is None:
            weights.append(np.ones(rows.shape[0]))
        else:  # squared scales weigh squared differences; divided by the largest: no overflow
            log_scales = log_row_scales(W[rows])
            weights.append(np.exp(2.0 * (log_scales - log_scales.max())))
    entries = MeasuredEntries(left, right, weights[0], weights[1])
    return relative_error(approx, truth, entries), entries.size


def relative_error(approx: np.ndarray, truth: np.ndarray, entries: MeasuredEntries) -> float:
    """``sqrt(sum w (approx - truth)^2 / sum w truth^2)`` with the weights of ``entries``;
    ``inf`` when the approximation is not finite, computed without overflow."""
    if not np.all(np.isfinite(approx)):
        return math.inf
    scale = max(float(np.abs(truth).max()), float(np.abs(approx).max()))
    if scale == 0.0:
        return 0.0
    weights = np.outer(entries.left_weights, entries.right_weights)
    error = float(np.sum(weights * ((approx - truth) / scale) ** 2))
    energy = float(np.sum(weights * (truth / scale) ** 2))
    if energy == 0.0:
        return 0.0 if error == 0.0 else math.inf
    return math.sqrt(error / energy)


def first_passing(
    candidates: Sequence[dict[str, Any]], trial: Callable[[dict[str, Any]], float], target: float
) -> tuple[dict[str, Any], float] | None:
    """The first candidate whose measured error is at most ``target``, with that error."""
    for changes in candidates:
        error = trial(changes)
        if error <= target:
            return changes, error
    return None


def largest_passing_scale(
    trial: Callable[[float], float], target: float
) -> tuple[float, float] | None:
    """The largest interval factor ``t`` in ``[SMALLEST_SCALE, 1)`` found to meet ``target``
    (bisection on ``log2 t``; only factors actually tried are returned), with its error."""
    if (error := trial(SMALLEST_SCALE)) > target:
        return None
    best = (SMALLEST_SCALE, error)
    low, high = math.log2(SMALLEST_SCALE), 0.0
    for _ in range(SCALE_STEPS):
        middle = (low + high) / 2
        error = trial(2.0**middle)
        if error <= target:
            low, best = middle, (2.0**middle, error)
        else:
            high = middle
    return best


def refit_error(
    sketch: Any, start: np.random.Generator, changes: dict[str, Any], *data: np.ndarray
) -> float:
    """``fit_error_`` of a copy of ``sketch`` with ``changes``, fitted on ``data`` from the
    random state ``start`` (the fit's own); ``inf`` when that fit fails."""
    trial = dataclasses.replace(sketch, **changes, fit_tolerance=None, rng=copy.deepcopy(start))
    try:
        return float(trial.fit(*data).fit_error_)
    except (ValueError, FloatingPointError, np.linalg.LinAlgError):
        return math.inf


def size_candidates(sketch: Any) -> tuple[list[dict[str, Any]], str]:
    """Larger sketches to try, fewest features first, and how to describe the largest.

    ``'paper'``: degrees ``r, r + 1, r + 2, r + 4, r + 8`` (at most 16) times sketch sizes
    ``m, 4m, 16m`` (as ``rank`` when the sketch was sized by rank). ``'improved'``: ``rank``
    times 4 and 16 (degree searched up to 16, or capped as given with rank).
    """
    if sketch.variant == "paper":
        r, m = sketch.degree_, sketch.sketch_dim_
        degrees = sorted({r} | {r + step for step in (1, 2, 4, 8) if r + step <= MAX_AUTO_DEGREE})
        grid = sorted(
            (1 + degree * size, degree, size)
            for degree in degrees
            for size in (m * factor for factor in SIZE_FACTORS)
            if (degree, size) != (r, m)
        )
        if sketch.rank is None:
            candidates = [{"degree": degree, "sketch_dim": size} for _, degree, size in grid]
        else:
            candidates = [{"degree": degree, "rank": rank} for rank, degree, _ in grid]
        return candidates, f"degree={degrees[-1]} and {SIZE_FACTORS[-1]} times the sketch size"
    degree = sketch.degree if sketch.rank is not None else None
    ranks = [sketch.rank_ * factor for factor in SIZE_FACTORS[1:]]
    candidates = [{"rank": rank, "sketch_dim": None, "degree": degree} for rank in ranks]
    return candidates, f"rank={ranks[-1]}"


def describe_changes(sketch: Any, changes: dict[str, Any]) -> str:
    """``name=value`` for each change that differs from the sketch's own parameter."""
    shown = [f"{k}={v!r}" for k, v in changes.items() if getattr(sketch, k) != v]
    return ", ".join(shown)
