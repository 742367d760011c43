"""The truncation of log-domain products: bounds, from the clusters' radii and the weights'
extremes in each cluster, on what each pair of clusters adds to every row, and the pairs a
product must compute so that each row misses at most a given fraction of its sum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy.special import logsumexp

from ...gibbs import sq_norms

if TYPE_CHECKING:
    from .clusters import _Side


#: The share of a row's sum that the exactly handled input clusters a product skips may hold
#: (float64's epsilon: what rounding their entries loses anyway).
EXACT_SKIP = float(np.finfo(np.float64).eps)


@dataclass(frozen=True)
class _InputBounds:
    """What the truncation bounds read of input clusters (the expanded ones, or every one,
    the exactly handled ones first), for given log weights
    ``w`` (sorted order): per cluster ``B``, ``log |B|``, the largest, smallest and mean ``w``,
    the radius ``r_B``, the centroid ``ybar_B`` (centred coordinates) and the spread
    ``mean_j ||y_j - ybar_B||^2``."""

    log_size: np.ndarray
    top: np.ndarray
    low: np.ndarray
    mean: np.ndarray
    radius: np.ndarray
    centroid: np.ndarray
    spread: np.ndarray


def _input_bounds(side: _Side, w_sorted: np.ndarray, first: int | None = None) -> _InputBounds:
    """:class:`_InputBounds` of ``side``'s clusters ``first:`` (default: the expanded ones,
    ``n_small:``; ``0``: every cluster, the exactly handled ones first) for the log weights
    ``w_sorted``."""
    kb = side.n_small if first is None else first
    starts = side.offsets[kb:-1]  # a suffix of the clusters: reduceat's last is right
    sizes = np.diff(side.offsets)[kb:]
    return _InputBounds(
        np.log(sizes),
        np.maximum.reduceat(w_sorted, starts),
        np.minimum.reduceat(w_sorted, starts),
        # a zero weight (-inf; +inf is refused) makes the mean -inf: the Jensen term drops out
        np.add.reduceat(w_sorted, starts) / sizes,
        side.cluster_radius[kb:],
        side.centers[kb:] + side.centroid_offset[kb:],
        side.spread[kb:],
    )


def _kept_pairs(
    pair_sq: np.ndarray,
    out_centers: np.ndarray,
    out_radius: np.ndarray,
    inputs: _InputBounds,
    reg: float,
    truncate: float,
    exact_first: int = 0,
    lower: np.ndarray | None = None,
) -> np.ndarray:
    """Which cluster pairs ``(A, B)`` a product truncated at ``truncate`` must compute.

    For ``x_i`` in ``A`` and ``y_j`` in ``B`` the distance is at least
    ``near = max(0, ||c_A - c_B|| - r_A - r_B)`` (``r`` the clusters' largest radii), so with
    ``w_B^max`` the largest log weight of ``B``:

    .. math::
        S_{iB} = \\sum_{j \\in B} e^{w_j - \\|x_i - y_j\\|^2 / reg}
              \\le \\exp(\\log|B| + w_B^{max} - near_{AB}^2 / reg) =: e^{U_{AB}}.

    Every row of ``A`` sums to at least ``e^{L_A}``, the largest of three lower bounds:
    ``LSE_B(log|B| + w_B^min - far_AB^2/reg)`` and ``max_B(w_B^max - far_AB^2/reg)`` with
    ``far = ||c_A - c_B|| + r_A + r_B``, and Jensen's inequality over each ``B``
    (``mean_j ||x - y_j||^2 = ||x - ybar_B||^2 + s_B`` for the centroid ``ybar_B`` and spread
    ``s_B``, and ``||x_i - ybar_B|| <= ||c_A - ybar_B|| + r_A``):

    .. math::
        S_{iB} \\ge |B| \\exp\\big(\\bar w_B - ((\\|c_A - \\bar y_B\\| + r_A)^2 + s_B)
              / reg\\big),

    summed over ``B`` by a log-sum-exp (it loses only ``B``'s spread, not its radius, and
    ``A``'s radius once). The pairs of ``A`` with the smallest ``U_AB`` are skipped as long as
    their bounds sum to at most ``truncate e^{L_A}``: the skipped pairs of a row hold at most
    ``truncate`` of its sum (the polynomial's own relative error comes on top).
    ``O(|group| k log k)``.

    The first ``exact_first`` columns are exactly handled input clusters, whose entries a
    product computes to rounding: one of them is skipped only while the running sum stays
    within :data:`EXACT_SKIP` ``e^{L_A}`` (float64's epsilon), so a product whose clusters are
    all exactly handled stays exact to rounding (solves ask such products for marginals at
    1e-11), while far pairs are still skipped. Every skipped pair's running sum is within
    ``truncate e^{L_A}`` either way, so the skipped pairs of a row hold at most ``truncate``.

    ``lower`` (shape ``(|group|,)``): row-sum lower bounds ``L_A`` known from more inputs
    than ``inputs`` (a product over one block of a cloud split in blocks, whose rows sum
    over every block: :mod:`.blocks`); the larger of it and this one's own is used.

    Returns
    -------
    ndarray of bool, shape (|group|, k)
    """
    distance = np.sqrt(pair_sq)
    near = np.maximum(distance - out_radius[:, None] - inputs.radius[None, :], 0.0)
    upper = inputs.log_size + inputs.top - near * near / reg
    given = lower
    lower = _row_sum_lower_bound(distance, out_centers, out_radius, inputs, reg)
    if given is not None:
        lower = np.maximum(lower, given)
    limit = lower + np.log(truncate)
    exact_limit = lower + np.log(min(truncate, EXACT_SKIP)) if exact_first else limit
    keep = np.zeros_like(upper, dtype=bool)
    with np.errstate(invalid="ignore", divide="ignore"):
        # Skip the smallest bounds while their sum stays within truncate e^L. A bound at most
        # the row's smallest limit less log k is skipped whatever comes before it (k such
        # terms sum to at most the limit): only the others are sorted and summed in order,
        # after the sum of those (the same pairs to rounding of the sums; at 10^5 uniform
        # points, reg 0.003, the selection took 0.18 s a product instead of 0.30 s).
        sure = upper <= (exact_limit - np.log(upper.shape[1]))[:, None]
        top = np.max(np.where(sure, upper, -np.inf), axis=1, keepdims=True)
        safe = np.where(np.isfinite(top), top, 0.0)
        below = np.log(np.sum(np.exp(np.where(sure, upper - safe, -np.inf)), axis=1)) + safe[:, 0]
        rows, columns = np.nonzero(~sure)  # row-major: each row's candidates together
        if rows.size == 0:
            return keep
        counts = np.bincount(rows, minlength=upper.shape[0])
        place = np.arange(rows.size) - np.repeat(np.cumsum(counts) - counts, counts)
        # each row's candidates, padded with +inf (sorted last, never compared)
        candidates = np.full((upper.shape[0], int(counts.max())), np.inf)
        candidates[rows, place] = upper[rows, columns]
        index = np.zeros(candidates.shape, dtype=np.int64)
        index[rows, place] = columns
        order = np.argsort(candidates, axis=1)
        ascending = np.take_along_axis(candidates, order, axis=1)
        index = np.take_along_axis(index, order, axis=1)
        running = np.logaddexp.accumulate(
            np.concatenate([below[:, None], ascending], axis=1), axis=1
        )[:, 1:]
        skipped = running <= limit[:, None]
        if exact_first:
            # exactly handled inputs: skipped only within rounding of the row's sum
            skipped &= (index >= exact_first) | (running <= exact_limit[:, None])
    real = np.arange(candidates.shape[1])[None, :] < counts[:, None]
    at = np.nonzero(real)
    keep[at[0], index[at]] = ~skipped[at]
    return keep


def _every_pair_skipped(
    out_centers: np.ndarray,
    out_radius: np.ndarray,
    in_centers: np.ndarray,
    inputs: _InputBounds,
    reg: float,
    truncate: float,
    lower: np.ndarray,
    exact_first: int = 0,
    group: int = 256,
) -> bool:
    """Whether :func:`_kept_pairs` would skip every pair of these output clusters (row-sum
    lower bounds ``lower``) against the input clusters centred at ``in_centers``: each
    output cluster's bounds ``U_AB`` sum to at most ``truncate e^{L_A}`` (at most
    :data:`EXACT_SKIP` ``e^{L_A}`` when some input cluster is exactly handled,
    ``exact_first > 0``). That sum bounds every running sum of :func:`_kept_pairs`, so no
    pair it keeps is skipped. First the inputs as one (their centres' bounding box), then
    ``O(k_out k_in d)`` in groups of ``group`` output clusters, stopping at the first group
    some pair of which is kept.
    """
    share = min(truncate, EXACT_SKIP) if exact_first else truncate
    if in_centers.shape[0] == 0:
        return True
    limit = lower + np.log(share)
    # First the whole inputs as one: their centres' bounding box, total size, largest weight
    # and radius (O(k_out d); a far block of a cloud split in many is settled here).
    gap = np.maximum(np.maximum(in_centers.min(axis=0) - out_centers, 0.0),
                     out_centers - in_centers.max(axis=0))  # fmt: skip
    near = np.maximum(np.sqrt(sq_norms(gap)) - out_radius - inputs.radius.max(), 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        coarse = logsumexp(inputs.log_size) + inputs.top.max() - near * near / reg
    if np.all(coarse <= limit):
        return True
    in_sq = sq_norms(in_centers)
    for start in range(0, out_centers.shape[0], group):
        ids = slice(start, start + group)
        c = out_centers[ids]
        distance = np.sqrt(np.maximum(sq_norms(c)[:, None] + in_sq - 2.0 * c @ in_centers.T, 0.0))
        near = np.maximum(distance - out_radius[ids, None] - inputs.radius[None, :], 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            total = logsumexp(inputs.log_size + inputs.top - near * near / reg, axis=1)
            if not np.all(total <= limit[ids]):
                return False
    return True


def _row_sum_lower_bound(
    distance: np.ndarray,
    out_centers: np.ndarray,
    out_radius: np.ndarray,
    inputs: _InputBounds,
    reg: float,
) -> np.ndarray:
    """``L_A``, shape ``(|group|,)``: every row of output cluster ``A`` sums to at least
    ``e^{L_A}`` over the input clusters of ``inputs`` (the three bounds of :func:`_kept_pairs`);
    ``distance`` is ``||c_A - c_B||``, shape ``(|group|, k)``."""
    far = distance + out_radius[:, None] + inputs.radius[None, :]
    far_sq = far * far / reg
    to_centroid = np.sqrt(
        np.maximum(
            sq_norms(out_centers)[:, None]
            + sq_norms(inputs.centroid)[None, :]
            - 2.0 * out_centers @ inputs.centroid.T,
            0.0,
        )
    )
    jensen_sq = (to_centroid + out_radius[:, None]) ** 2 + inputs.spread[None, :]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.maximum.reduce(
            [
                logsumexp(inputs.log_size + inputs.low - far_sq, axis=1),
                np.max(inputs.top - far_sq, axis=1),
                logsumexp(inputs.log_size + inputs.mean - jensen_sq / reg, axis=1),
            ]
        )
