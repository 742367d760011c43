"""The clusters of the block-local expansion: a cover of each cloud by balls of a given
radius (farthest points on a sample, then a k-d tree), and each cloud sorted by cluster with
what every product reads (local coordinates, per-point exponents, features, batches).
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.spatial import cKDTree

from ..._parallel import get_num_threads
from .device import _DeviceArrays, _HostArrays
from .fit import _local_monomials, _MonomialPlan

if TYPE_CHECKING:
    from ..._arrays import DeviceArrays

# Rows of an output cluster handled at once (its rows x target clusters temporaries).
_ROW_BLOCK = 4096
# Points per sample of the radius-stopped farthest-point pass (the rest is assigned by a tree).
_SAMPLE = 20000


# ---------------------------------------------------------------------- clustering
def _farthest_points(points: np.ndarray, radius: float) -> np.ndarray:
    """Greedy farthest-point centres (row indices) until every row is within ``radius``.

    ``O(s k)`` for ``s`` rows and ``k`` centres (Gonzalez 1985 with a radius stop).
    """
    sq = np.einsum("ij,ij->i", points, points)
    centers = [0]
    dist = np.maximum(sq - 2.0 * points @ points[0] + sq[0], 0.0)
    limit = radius * radius
    while True:
        far = int(np.argmax(dist))
        if dist[far] <= limit:
            return np.array(centers)
        centers.append(far)
        np.minimum(dist, np.maximum(sq - 2.0 * points @ points[far] + sq[far], 0.0), out=dist)


def _cover(
    points: np.ndarray,
    radius: float,
    generator: np.random.Generator,
    centers: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Labels and centres with every point within ``radius`` of its (nearest) centre.

    Rounds: assign the uncovered points to their nearest centre with a k-d tree; run the
    radius-stopped farthest-point pass on a sample of the still uncovered ones and add its
    centres. The first round covers the sample, so the leftovers are rare outliers and two or
    three rounds suffice. Empty clusters are dropped. ``O(n log k + s k)``.
    """
    n, d = points.shape
    labels = np.full(n, -1, dtype=np.int64)
    centers = np.empty((0, d)) if centers is None else np.asarray(centers, dtype=np.float64)
    todo = np.arange(n)
    # 0.999: the tree's distances and the features' norms round differently; keep a margin.
    limit = radius * 0.999
    while True:
        if centers.shape[0]:
            dist, nearest = cKDTree(centers).query(points[todo], workers=get_num_threads())
            covered = dist <= limit
            labels[todo[covered]] = nearest[covered]
            todo = todo[~covered]
        if todo.size == 0:
            break
        sample = todo if todo.size <= _SAMPLE else generator.choice(todo, _SAMPLE, replace=False)
        new = points[sample][_farthest_points(points[sample], limit)]
        centers = np.concatenate([centers, new])
    used, labels = np.unique(labels, return_inverse=True)
    return labels, centers[used]


# ---------------------------------------------------------------------- one side
@dataclass
class _Batch:
    """Clusters ``ids`` of one side (ascending, so of similar sizes), padded to a common size
    for batched products.

    ``first:stop`` are the clusters' positions in the list the batch was cut from. ``index``
    (clusters x padded size) holds sorted row indices, padding repeating each cluster's first
    row, ``valid`` marks the real rows and ``padding`` adds ``-inf`` to the others' exponents
    (0 to the real ones); all three are ``None`` for a single cluster, read as its contiguous
    ``rows``.
    """

    ids: np.ndarray
    first: int
    stop: int
    rows: slice | None
    index: np.ndarray | None
    valid: np.ndarray | None
    padding: np.ndarray | None

    @classmethod
    def make(cls, ids: np.ndarray, first: int, offsets: np.ndarray, sizes: np.ndarray) -> _Batch:
        stop = first + ids.size
        if ids.size == 1:
            cluster = int(ids[0])
            rows = slice(int(offsets[cluster]), int(offsets[cluster + 1]))
            return cls(ids, first, stop, rows, None, None, None)
        steps = np.arange(int(sizes[ids].max()))
        valid = steps[None, :] < sizes[ids, None]
        index = np.where(valid, offsets[ids, None] + steps[None, :], offsets[ids, None])
        return cls(ids, first, stop, None, index, valid, np.where(valid, 0.0, -np.inf))

    def gather(self, values: np.ndarray) -> np.ndarray:
        """``values`` of the batch's rows, shape ``(clusters, padded size, ...)``."""
        if self.index is None:
            return values[self.rows][None]
        return values[self.index]

    def row_blocks(self) -> list[slice]:
        """A single cluster's ``rows`` in blocks of at most ``_ROW_BLOCK`` (one block when it
        fits), so that its temporaries (rows x clusters of the other side) stay bounded."""
        start, stop = self.rows.start, self.rows.stop
        return [slice(at, min(at + _ROW_BLOCK, stop)) for at in range(start, stop, _ROW_BLOCK)]


@dataclass
class _Side:
    """One cloud sorted by cluster, with what every product needs.

    ``local`` are the local coordinates ``p = x - c_A`` (sorted); ``base`` is
    ``-(||p||^2 + 2 c_A . p) / reg``; ``features`` the scaled monomials of ``p sqrt(2/reg)``
    (``None`` when recomputed per block); ``cluster_radius`` the largest ``||p||`` of each
    cluster (the truncation bounds' reach).
    """

    order: np.ndarray
    offsets: np.ndarray
    centers: np.ndarray
    local: np.ndarray
    base: np.ndarray
    features: np.ndarray | None
    radius: float
    plan: _MonomialPlan
    reg: float
    points: np.ndarray
    n_small: int
    cluster_radius: np.ndarray
    # per cluster: the mean of p (the centroid's offset from the centre) and the mean of
    # ||p - mean p||^2 (the truncation's Jensen lower bound)
    centroid_offset: np.ndarray
    spread: np.ndarray
    # padded features of the batches products read again and again, within padded_budget;
    # the products' pool threads fill it: the lock guards the dict and its byte count
    padded: dict = field(default_factory=dict)
    padded_budget: int = 0
    padded_bytes: int = 0
    padded_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # copies of the per-point arrays on the device products run on (:class:`_DeviceArrays`)
    device: Any = field(default=None, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        # pickled (a result sent to Dask workers, a process pool): the cache of padded
        # features stays behind, and a new lock guards the new one
        state = dict(self.__dict__)
        state.update(padded={}, padded_bytes=0, padded_lock=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, padded_lock=threading.Lock())

    @classmethod
    def build(cls, centred, labels, centers, plan, reg, store, exact_below) -> _Side:
        # Clusters numbered by size class (sizes within a factor 5/4; the exactly handled small
        # ones first), neighbours together within a class: a range of clusters has similar
        # sizes, so it pads into one batched product, and lies close together, so a truncated
        # product keeps or skips it whole.
        counts = np.bincount(labels, minlength=centers.shape[0])
        size_class = np.where(
            counts < exact_below, -1.0, np.floor(np.log(np.maximum(counts, 1)) / np.log(1.25))
        )
        spatial = np.empty(counts.size, dtype=np.int64)
        spatial[cKDTree(centers).indices] = np.arange(counts.size)
        by_size = np.lexsort((spatial, size_class))
        rank = np.empty_like(by_size)
        rank[by_size] = np.arange(by_size.size)
        labels, centers, counts = rank[labels], centers[by_size], counts[by_size]
        order = np.argsort(labels, kind="stable")
        offsets = np.concatenate([[0], np.cumsum(counts)])
        local = centred[order] - centers[labels[order]]
        base = (
            -(
                np.einsum("ij,ij->i", local, local)
                + 2.0 * np.einsum("ij,ij->i", local, centers[labels[order]])
            )
            / reg
        )
        sq_local = np.einsum("ij,ij->i", local, local)
        cluster_radius = np.sqrt(np.maximum.reduceat(sq_local, offsets[:-1]))
        radius = float(cluster_radius.max())
        sizes = np.maximum(counts, 1)[:, None]
        centroid_offset = np.add.reduceat(local, offsets[:-1], axis=0) / sizes
        deviation = local - centroid_offset[labels[order]]
        spread = np.add.reduceat(np.einsum("ij,ij->i", deviation, deviation), offsets[:-1])
        spread = spread / sizes[:, 0]
        # The clusters handled exactly are a prefix.
        n_small = int(np.count_nonzero(counts < exact_below))
        side = cls(
            order,
            offsets,
            centers,
            local,
            base,
            None,
            radius,
            plan,
            reg,
            centred[order],
            n_small,
            cluster_radius,
            centroid_offset,
            spread,
        )
        if store:
            side.features = _local_monomials(local * np.sqrt(2.0 / reg), plan)
        return side

    def arrays(self, on: DeviceArrays | None) -> _HostArrays:
        """The per-point arrays products read: the side's own (``on=None``), or copies on
        ``on``'s device, made once."""
        if on is None:
            return _HostArrays(self)
        if self.device is None or self.device.on is not on:
            self.device = _DeviceArrays(self, on)
        return self.device

    @functools.cached_property
    def inverse_order(self) -> np.ndarray:
        """The sorted position of each point in the caller's order."""
        return np.argsort(self.order)

    @property
    def n_points(self) -> int:
        return self.local.shape[0]

    @property
    def small_rows(self) -> int:
        """Rows ``0:small_rows`` (sorted order) belong to the exactly handled clusters."""
        return int(self.offsets[self.n_small])

    @property
    def n_clusters(self) -> int:
        return self.centers.shape[0]

    def rows(self, cluster: int) -> slice:
        return slice(int(self.offsets[cluster]), int(self.offsets[cluster + 1]))

    def batches(
        self, ids: np.ndarray, max_clusters: int, max_rows: int | None = None
    ) -> list[_Batch]:
        """Clusters ``ids`` (ascending: size classes in order) in batches, each padded.

        A batch has at most ``max_clusters`` clusters and about ``max_rows`` (default
        ``_ROW_BLOCK``) padded rows;
        sizes within a batch differ by at most a factor 5/4 (plus 4 rows), so padding wastes
        little. A cluster above ``_ROW_BLOCK`` rows is a batch of its own (unpadded).
        """
        sizes = np.diff(self.offsets)
        max_rows = _ROW_BLOCK if max_rows is None else max_rows
        out: list[_Batch] = []
        c0 = 0
        while c0 < ids.size:
            c1, width = c0 + 1, sizes[ids[c0]]
            while (
                c1 < ids.size
                and c1 - c0 < max_clusters
                and sizes[ids[c1]] <= 1.25 * sizes[ids[c0]] + 4
                and (c1 - c0 + 1) * max(width, sizes[ids[c1]]) <= max_rows
            ):
                width = max(width, sizes[ids[c1]])
                c1 += 1
            out.append(_Batch.make(ids[c0:c1], c0, self.offsets, sizes))
            c0 = c1
        return out

    def expanded_groups(self, size: int, spatial: bool) -> list[np.ndarray]:
        """The expanded clusters in groups of at most ``size``, each ascending (size classes).

        ``spatial``: neighbouring clusters together (consecutive leaves of a k-d tree on the
        centres), so that the input clusters a truncated product keeps for a group are few;
        otherwise consecutive sizes (the fewest padded batches).
        """
        ids = np.arange(self.n_small, self.n_clusters)
        if spatial and ids.size > size:
            ids = ids[cKDTree(self.centers[self.n_small :], leafsize=size).indices]
        return [np.sort(ids[start : start + size]) for start in range(0, ids.size, size)]

    def batch_features(self, batch: _Batch) -> np.ndarray:
        """Features of a batch, shape ``(clusters, padded size, R)`` (a view when unpadded)."""
        if batch.index is None:
            return self.block_features(batch.rows)[None]
        if self.features is not None:
            key = batch.ids.tobytes()
            cached = self.padded.get(key)
            if cached is None:
                cached = self.features[batch.index]
                with self.padded_lock:
                    fits = self.padded_bytes + cached.nbytes <= self.padded_budget
                    if fits and key not in self.padded:
                        self.padded[key] = cached
                        self.padded_bytes += cached.nbytes
            return cached
        flat = self.block_features_of(batch.index.ravel())
        return flat.reshape(*batch.index.shape, -1)

    def block_features_of(self, index: np.ndarray) -> np.ndarray:
        return _local_monomials(self.local[index] * np.sqrt(2.0 / self.reg), self.plan, False)

    def block_features(self, rows: slice) -> np.ndarray:
        if self.features is not None:
            return self.features[rows]
        return _local_monomials(self.local[rows] * np.sqrt(2.0 / self.reg), self.plan, False)

    def points_centred(self) -> np.ndarray:
        """The centred points in the caller's (unsorted) order."""
        sizes = np.diff(self.offsets)
        out = np.empty_like(self.local)
        out[self.order] = self.local + np.repeat(self.centers, sizes, axis=0)
        return out
