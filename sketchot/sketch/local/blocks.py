"""The block-local expansion of clouds split into blocks of whole clusters.

A cloud too large for one memory is split into blocks, each a set of whole clusters of the
cover (no cluster straddles two blocks), and every product is a sum over blocks:
``(K w)_i = sum_t (K_{s t} w_t)_i`` for the block ``s`` of row ``i``. Each term is the
in-memory product of one output block against one input block
(:meth:`BlockExpansion.product`), so the per-point work is that of the whole product,
spread over the blocks. What a sum over blocks needs beyond that is the truncation's
reference: a truncated product skips the cluster pairs whose bounded contribution is a
small fraction of the row's *whole* sum, which no single input block knows. Each input
block therefore summarises its clusters for the current weights (:meth:`BlockExpansion.bounds`,
``O(k d)`` numbers), and each output block bounds its rows' whole sums from all of them
(:meth:`BlockExpansion.lower_bounds`); a term over ``S`` input blocks, truncated at
``truncate / S`` against that bound, misses at most ``truncate`` of each row in all, the
whole product's guarantee (the far pairs go as they do there; the shares keep a few more),
so the per-entry certificate holds as for the whole product.

This is the sketch-level piece of :mod:`sketchot.distributed.local`, which places the
blocks on a Dask cluster; nothing here knows about Dask.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, fields
from math import comb
from typing import Any

import numpy as np

from ..._validation import check_float, check_int, check_matrix, check_rng
from .clusters import _cover, _Side
from .expansion import check_log_weights
from .fit import _fit_exp_degree, _MeansPlan, _MonomialPlan
from .products import _apply, _combine
from .truncation import (
    _every_pair_skipped,
    _input_bounds,
    _InputBounds,
    _row_sum_lower_bound,
)

EPS = np.finfo(np.float64).eps
#: Output clusters whose lower bounds are computed at once (their ``k x total`` distances).
_BOUND_GROUP = 256


@dataclass(eq=False)
class ClusterBlock:
    """One block of a cloud: whole clusters, sorted, with what the products read (opaque;
    made by :meth:`BlockExpansion.block`).

    Attributes
    ----------
    n_points : int
    n_clusters : int
    centers : ndarray, shape (n_clusters, d)
        The clusters' centres (the expansion's centred coordinates), sorted as the products
        read them.
    """

    side: _Side

    @property
    def n_points(self) -> int:
        return self.side.n_points

    @property
    def n_clusters(self) -> int:
        return self.side.n_clusters

    @property
    def centers(self) -> np.ndarray:
        return self.side.centers


@dataclass(frozen=True)
class ClusterBounds(_InputBounds):
    """What the truncation reads of some input clusters for given weights, and their
    centres.

    The fields of the in-memory bounds (per cluster its log size, the largest, smallest and
    mean log weight, its radius, centroid and spread) and ``center``, made by
    :meth:`BlockExpansion.bounds`; the bounds of several blocks concatenate
    (:meth:`concat`)."""

    center: np.ndarray

    @classmethod
    def concat(cls, parts: list[ClusterBounds]) -> ClusterBounds:
        """The bounds of every cluster of ``parts``, in order."""
        return cls(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(cls)))

    @property
    def n_clusters(self) -> int:
        return self.log_size.shape[0]


@dataclass(eq=False)
class BlockExpansion:
    """The block-local expansion (:class:`~sketchot.sketch.LocalGaussianExpansion`'s
    polynomial, features and products) for clouds split into blocks of whole clusters
    (module notes).

    Parameters
    ----------
    reg : float
        Entropic regularisation, ``> 0``.
    d : int
        Dimension of the points.
    tau, rtol, max_features, exact_below :
        As :class:`~sketchot.sketch.LocalGaussianExpansion` (``degree`` chosen from
        ``rtol``).

    Attributes
    ----------
    rho_ : float
        Cluster radius bound ``sqrt(tau reg / 2)``.
    degree_, coef_, poly_error_, n_features_ :
        The fitted polynomial, as :class:`~sketchot.sketch.LocalGaussianExpansion`.
    supports_means : bool
        Whether :meth:`product` can return means (degree at least 3).

    Notes
    -----
    Every entry of a product is the true one times ``1 + delta`` with ``|delta|`` at most
    :meth:`entry_error_bound`, as for the in-memory expansion (the same polynomial and
    features); truncated products miss at most ``truncate`` of each row on top.
    """

    reg: float
    d: int
    _: KW_ONLY
    tau: float = 1.0
    rtol: float = 1e-9
    max_features: int = 1000
    exact_below: int = 8

    def __post_init__(self) -> None:
        self.reg = check_float(self.reg, "reg", positive=True)
        self.d = check_int(self.d, "d", minimum=1)
        self.tau = check_float(self.tau, "tau", positive=True)
        if self.tau > 4.0:
            raise ValueError(
                f"tau must be <= 4 (rounding of the expansion grows like e^(2 tau)); got {self.tau}"
            )
        self.rtol = check_float(self.rtol, "rtol", positive=True)
        self.max_features = check_int(self.max_features, "max_features", minimum=1)
        self.exact_below = check_int(self.exact_below, "exact_below", minimum=0)
        degree, coef, error = _fit_exp_degree(self.tau, self.rtol)
        n_features = comb(degree + self.d, self.d)
        if n_features > self.max_features:
            raise ValueError(
                f"d = {self.d}: the local expansion of degree {degree} needs "
                f"C({degree} + {self.d}, {self.d}) = {n_features} monomial features, above "
                f"max_features = {self.max_features}; use a lower-dimensional embedding, a "
                "larger rtol or the exact kernel"
            )
        self.rho_ = float(np.sqrt(self.tau * self.reg / 2.0))
        self.degree_, self.coef_, self.poly_error_ = degree, coef, error
        self.n_features_ = n_features
        self._monomials = _MonomialPlan(self.d, degree, coef)
        self._means = _MeansPlan.build(self._monomials, self.tau)

    @property
    def supports_means(self) -> bool:
        return self._means is not None

    def entry_error_bound(self, max_exponent: float) -> float:
        """Bound on ``|K~_ij / K_ij - 1|`` for clouds whose largest ``||x - y||^2 / reg`` is
        at most ``max_exponent``: the polynomial's error plus rounding of the feature sum
        and of the exponent (as :attr:`LocalGaussianExpansion.entry_error_bound_`)."""
        R, r = self.n_features_, self.degree_
        return float(
            self.poly_error_ + (R + 2 * r + 8) * np.exp(2 * self.tau) * EPS
            + 8 * EPS * max_exponent
        )  # fmt: skip

    # ------------------------------------------------------------------ clusters
    def cover(
        self, points: Any, rng: Any = None, centers: Any = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(labels, centers)`` with every row of ``points`` within :attr:`rho_` of its
        centre, ``centers`` (if given) first and used where they reach, new ones (a
        farthest-point pass on samples drawn with ``rng``) for the rest; only the centres
        some row uses are returned, relabelled. ``O(n log k + s k)``."""
        points = check_matrix(points, "points", n_features=self.d, feature_name="d")
        given = None if centers is None else check_matrix(centers, "centers", n_features=self.d)
        return _cover(points, self.rho_, check_rng(rng), given)

    def block(self, centred: Any, labels: Any, centers: Any, *, store: bool = True) -> ClusterBlock:
        """One block of whole clusters: its points (centred coordinates), their labels into
        ``centers`` (``0..k-1``, every centre used, every point within :attr:`rho_` of its
        own), the features stored when ``store`` (else recomputed per product)."""
        centred = check_matrix(centred, "centred", n_features=self.d, feature_name="d")
        centers = np.asarray(centers, dtype=np.float64).reshape(-1, self.d)
        labels = np.asarray(labels, dtype=np.int64)
        if labels.shape != (centred.shape[0],) or (
            labels.size and (labels.min() < 0 or labels.max() >= centers.shape[0])
        ):
            raise ValueError(
                f"labels must be {centred.shape[0]} indices into {centers.shape[0]} centres; "
                f"got shape {labels.shape}"
            )
        side = _Side.build(
            centred, labels, centers, self._monomials, self.reg, bool(store), self.exact_below
        )
        return ClusterBlock(side)

    # ------------------------------------------------------------------ truncation
    def bounds(self, block: ClusterBlock, log_w: Any) -> ClusterBounds:
        """The truncation's summary of ``block``'s clusters under the log weights ``log_w``
        (the block's points' order), ``O(block)``."""
        log_w = check_log_weights(log_w, block.n_points, "log_w")
        side = block.side
        b = _input_bounds(side, log_w[side.order], first=0)
        return ClusterBounds(*(getattr(b, f.name) for f in fields(b)), side.centers)

    def lower_bounds(self, out: ClusterBlock, bounds: ClusterBounds) -> np.ndarray:
        """``L_A`` per cluster of ``out`` (its sorted order): every row of ``A`` sums at
        least ``e^{L_A}`` over the input clusters ``bounds`` describes (every block's).
        ``O(k_out k_in d)`` in groups of :data:`_BOUND_GROUP` output clusters."""
        side = out.side
        lower = np.full(side.n_clusters, -np.inf)
        if bounds.n_clusters == 0:
            return lower
        in_centers = bounds.center
        in_sq = np.einsum("ij,ij->i", in_centers, in_centers)
        for start in range(0, side.n_clusters, _BOUND_GROUP):
            ids = slice(start, min(start + _BOUND_GROUP, side.n_clusters))
            c = side.centers[ids]
            sq = np.einsum("ij,ij->i", c, c)[:, None] + in_sq - 2.0 * c @ in_centers.T
            distance = np.sqrt(np.maximum(sq, 0.0))
            lower[ids] = _row_sum_lower_bound(
                distance, c, side.cluster_radius[ids], bounds, self.reg
            )
        return lower

    # ------------------------------------------------------------------ products
    def product(
        self,
        out: ClusterBlock,
        inn: ClusterBlock,
        log_w: Any,
        *,
        means: bool = False,
        truncate: float = 0.0,
        lower: Any = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``sum_j exp(log_w_j) K_ij [1, y_j]`` over the input block, rows of the output
        block in its points' order, as ``exp(scale_i) Z_i``: ``Z`` has one column (the
        log product's), or ``1 + d`` with ``means`` (the weighted sums of the input points,
        centred coordinates). ``truncate`` skips the pairs whose bounds sum to at most that
        fraction of ``e^{lower_A}`` (``lower``: :meth:`lower_bounds` over every block; a
        block pair none of whose cluster pairs is kept returns the empty term, ``scale =
        -inf`` and ``Z = 0``, from the bounds alone); terms of several blocks add up with
        :meth:`combine`."""
        log_w = check_log_weights(log_w, inn.n_points, "log_w")
        truncate = check_float(truncate, "truncate", minimum=0.0)
        if lower is not None:
            lower = np.asarray(lower, dtype=np.float64)
            if lower.shape != (out.n_clusters,):
                raise ValueError(f"lower must have shape ({out.n_clusters},); got {lower.shape}")
        plan = None
        if means:
            if self._means is None:
                raise NotImplementedError(
                    f"means need degree >= 3; this expansion has degree {self.degree_}"
                )
            plan = self._means
        if (
            truncate > 0
            and lower is not None
            and self._out_of_reach(out, inn, log_w, truncate, lower)
        ):
            width = 1 + self.d if means else 1
            return np.full(out.n_points, -np.inf), np.zeros((out.n_points, width))
        scale, Z = _apply(
            out.side, inn.side, log_w, None, self._monomials, self.reg, truncate,
            means=plan, lower=lower,
        )  # fmt: skip
        return _empty_is_minus_inf(scale, Z)

    def _out_of_reach(
        self, out: ClusterBlock, inn: ClusterBlock, log_w: np.ndarray, truncate: float,
        lower: np.ndarray,
    ) -> bool:  # fmt: skip
        """Whether the truncation skips every cluster pair of ``out`` against ``inn``: the
        term is then empty, found from the bounds alone (``O(k_out k_in d)``) before the
        product's ``O(block)`` setup (a far block of a cloud split in many)."""
        b = self.bounds(inn, log_w)
        side = out.side
        return _every_pair_skipped(
            side.centers, side.cluster_radius, b.center, b, self.reg, truncate, lower,
            exact_first=inn.side.n_small,
        )  # fmt: skip

    @staticmethod
    def combine(
        first: tuple[np.ndarray, np.ndarray], second: tuple[np.ndarray, np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray]:
        """The sum of two terms ``exp(scale) Z`` of the same rows (an empty row, ``Z = 0``,
        keeps ``scale = -inf``, so that it adds nothing to a later term)."""
        with np.errstate(invalid="ignore", over="ignore"):
            scale, Z = _combine(np, first[0], first[1], second[0], second[1])
        return _empty_is_minus_inf(scale, Z)


def _empty_is_minus_inf(scale: np.ndarray, Z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(scale, Z)`` with ``scale = -inf`` on the rows whose ``Z`` is 0: a row whose pairs a
    block skips (or the sum of two such rows) holds ``Z = 0`` under any finite scale, which
    would swamp another block's term when added to it."""
    return np.where(np.any(Z != 0, axis=1), scale, -np.inf), Z
