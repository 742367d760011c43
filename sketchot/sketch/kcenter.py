"""Greedy k-center clustering (Gonzalez 1985; Han et al. 2020, Algorithm 3)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._validation import check_int, check_matrix, check_rng


@dataclass(frozen=True)
class KCenterResult:
    """Output of :func:`greedy_k_center`.

    Attributes
    ----------
    centers : ndarray of int, shape (k,)
        Row indices of the centres, in the order they were chosen (farthest-point sequence).
    assignment : ndarray of int, shape (n,)
        ``assignment[i]`` is the position in ``centers`` of the centre nearest to row ``i``
        (ties go to the centre chosen first).
    distances : ndarray, shape (n,)
        Euclidean distance from each row to its assigned centre.
    cluster_sizes : ndarray of int, shape (k,)
        Number of rows assigned to each centre; sums to ``n``.
    """

    centers: np.ndarray
    assignment: np.ndarray
    distances: np.ndarray
    cluster_sizes: np.ndarray

    @property
    def cost(self) -> float:
        """Sum of distances to the assigned centres (the ``epsilon`` of an epsilon-coreset)."""
        return float(self.distances.sum())


def greedy_k_center(
    points: Any, n_centers: int, rng: Any = None, *, first: int | None = None
) -> KCenterResult:
    """Greedy farthest-point k-center.

    The first centre is a uniformly random row (or ``first``); each next centre is the row
    farthest from the centres chosen so far (the first such row on ties). Every row is then
    assigned to its nearest centre. This is a 2-approximation of the optimal k-center radius.

    Parameters
    ----------
    points : array-like, shape (n, d)
    n_centers : int
        Number of centres ``k``, ``1 <= k <= n``.
    rng : None, int, Generator, ...
        Draws the first centre.
    first : int, optional
        Row of the first centre instead of a draw (``rng`` is then not used).

    Returns
    -------
    KCenterResult

    Notes
    -----
    ``O(n k d)`` time and ``O(n)`` extra memory: distances to the newest centre are folded
    into a running minimum, and the assignment is updated at the same time.
    """
    points = check_matrix(points, "points")
    n = points.shape[0]
    n_centers = check_int(n_centers, "n_centers", minimum=1, maximum=n)
    if first is None:
        first = int(check_rng(rng).integers(n))
    else:
        first = check_int(first, "first", minimum=0, maximum=n - 1)
    centers = [first]
    # Squared distances through ||p||^2 - 2 p.c + ||c||^2: one matrix-vector product per
    # centre instead of an n x d temporary (the k-center pass is memory bound).
    sq = np.einsum("ij,ij->i", points, points)
    distances = _sq_distances_to(points, sq, first)
    assignment = np.zeros(n, dtype=np.int64)
    for position in range(1, n_centers):
        farthest = int(np.argmax(distances))
        centers.append(farthest)
        to_new = _sq_distances_to(points, sq, farthest)
        closer = to_new < distances  # strict: ties stay with the earlier centre
        assignment[closer] = position
        np.minimum(distances, to_new, out=distances)
    np.sqrt(distances, out=distances)
    sizes = np.bincount(assignment, minlength=n_centers)
    return KCenterResult(np.array(centers), assignment, distances, sizes)


def _sq_distances_to(points: np.ndarray, sq_norms: np.ndarray, index: int) -> np.ndarray:
    """Squared distances from every row to row ``index`` (clipped at 0 against rounding)."""
    out = points @ (-2.0 * points[index])
    out += sq_norms
    out += sq_norms[index]
    out[index] = 0.0
    return np.maximum(out, 0.0, out=out)
