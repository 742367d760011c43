"""The block-local kernel (``backend='polyts_local'``) on Dask arrays: clusters as the unit
of partition.

The in-memory kernel (:class:`~sketchot.kernels.LocalPolyKernel`) covers both clouds by
balls of radius ``rho = sqrt(tau reg / 2)`` and expands each pair of clusters; its products
cost ``O((n k_Y + m k_X) R)``, spread over groups of neighbouring clusters. On a cluster:

1. **Clusters, on the workers**: the farthest-point cover of a sample of at most
   :data:`COVER_SAMPLE` rows of each cloud (drawn with ``rng``, brought to the client); each
   chunk then covers the points that sample's centres do not reach with centres of its own
   (returned to the client, ``O(k d)``) and labels every point with its nearest centre; each
   chunk's cluster counts are added up on the cluster.
2. **Blocks of whole clusters**: the clusters, in the spatial order of a k-d tree over their
   centres, are cut into ``max(2, ceil(n /`` :data:`BLOCK_POINTS` ``))`` blocks of about
   equal numbers of points (from ``n``, not the user's chunks: fine chunks would make many
   small blocks, each term's work growing with their number); every chunk sends each block
   its points (one all-to-all, once), and each block sorts and stores its clusters
   (:class:`~sketchot.sketch.local.blocks.ClusterBlock`, features within
   :data:`BLOCK_FEATURE_BYTES`) on its worker, persisted.
3. **Passes**: a product is a sum over pairs of an output and an input block
   (:meth:`~sketchot.sketch.local.blocks.BlockExpansion.product`); a truncated log product
   misses at most what the whole in-memory product may miss of each row, its truncation
   read against each input block's summary of its clusters under the current weights and
   each output block's bound on its rows' whole sums (:mod:`sketchot.sketch.local.blocks`).
   A far block pair keeps no cluster pair: its term is settled from the bounds alone
   (``O(k_out d)`` for the input block's bounding box, before any ``O(block)`` setup). The
   rows' vectors stay on the cluster (user order, chunked like ``X``: each pass routes them
   to the blocks and back, ``O(n)`` floats in ``chunks x blocks`` small tasks), the
   columns' on the client, as in the log-stable exact path
   (:class:`~.kernels.DaskStableExact`): every pass is one scheduler call.

Memory per worker: its blocks' points and features (``O((n + m) / W (d + R))`` within the
feature budget, recomputed per product above it). Work per pass: the in-memory product's,
plus the bounds (``O(k_X k_Y)`` over all blocks).

The clustering differs from the in-memory one (each chunk covers its own outliers), so a
Dask solve agrees with an in-memory one to the kernels' certified accuracy, not to the bit.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import dask
import dask.array as da
import numpy as np
from scipy.spatial import cKDTree

from .._defaults import DEFAULT_ACCURACY
from .._validation import check_dtype, check_float, check_int, check_rng
from ..gibbs import GibbsGeometry
from ..kernels.base import (
    FusedPass,
    KernelInfo,
    ProjectedOnRead,
    RatioStep,
    identity_pass,
    log_ratios_and_bad,
)
from ..kernels.local import (
    LOCAL_BACKEND,
    TAU_CANDIDATES,
    TAU_GAIN,
    LocalPolyKernel,
    build_local,
    local_iteration_cost,
    rtol_for,
)
from ..sketch.local.blocks import BlockExpansion, ClusterBounds
from .geometry import SPLIT_EVERY, DaskGibbsGeometry, persist_now

#: Rows of each cloud the first cover is computed on, on the client.
COVER_SAMPLE = 20000
#: A block stores its features when they take at most this many bytes (else a product
#: recomputes them per block of rows).
BLOCK_FEATURE_BYTES = 1 << 28
#: Points per block of a cloud, about (at least two blocks, so that two workers share a
#: pass). Larger blocks do less work: a term reads its output rows' features once per input
#: block it reaches (measured in ``benchmarks/results/dask_local_blocks.md``).
BLOCK_POINTS = 1 << 20


# ---------------------------------------------------------------------- one cloud
@dataclass(eq=False)
class DaskClusterBlocks:
    """One cloud on the cluster in blocks of whole clusters (module notes, steps 1 and 2).

    Attributes
    ----------
    parts : list of dask.delayed.Delayed
        Per block, persisted: its :class:`~sketchot.sketch.local.blocks.ClusterBlock`.
    rows : list of dask.delayed.Delayed
        Per block, persisted: its rows in the cloud's order (the block's points in that
        order), apart from the block: routing a vector reads them only.
    sizes : tuple of int
        Points per block.
    chunks : tuple of int
        The cloud's row chunks (the user's order).
    routes : list of dask.delayed.Delayed
        Per chunk, persisted: the block of each of its rows.
    n_clusters : int
    """

    parts: list[Any]
    rows: list[Any]
    sizes: tuple[int, ...]
    chunks: tuple[int, ...]
    routes: list[Any]
    n_clusters: int

    @property
    def n_blocks(self) -> int:
        return len(self.parts)

    def to_blocks(self, values: da.Array) -> list[Any]:
        """A vector in the cloud's order (chunked like it) as one delayed vector per block,
        in the block's order (``chunks x blocks`` small tasks)."""
        values = values.astype(np.float64).rechunk((self.chunks,))
        split = dask.delayed(_split_by_block, pure=True, nout=self.n_blocks)
        pieces = [
            split(v, route, self.n_blocks)
            for v, route in zip(values.to_delayed().ravel(), self.routes, strict=True)
        ]
        join = dask.delayed(_join_pieces, pure=True)
        return [join(*[p[s] for p in pieces]) for s in range(self.n_blocks)]

    def to_cloud(self, blocks: list[Any], width: int | None = None) -> da.Array:
        """Per-block delayed rows (``(n_s,)`` or ``(n_s, width)``) as a Dask array in the
        cloud's order, chunked like it."""
        starts = np.concatenate([[0], np.cumsum(self.chunks)])
        scatter = dask.delayed(_split_by_chunk, pure=True, nout=len(self.chunks))
        pieces = [scatter(b, rows, starts) for b, rows in zip(blocks, self.rows, strict=True)]
        place = dask.delayed(_place_pieces, pure=True)
        out = []
        for c, rows in enumerate(self.chunks):
            shape = (rows,) if width is None else (rows, width)
            task = place(rows, width, *[p[c] for p in pieces])
            out.append(da.from_delayed(task, shape=shape, dtype=np.float64))
        return da.concatenate(out, axis=0)


def cluster_blocks(
    points: da.Array,
    expansion: BlockExpansion,
    generator: np.random.Generator,
    n_blocks: int | None = None,
) -> DaskClusterBlocks:
    """Cover a centred Dask cloud with clusters of radius ``expansion.rho_`` on the workers
    and split it in ``n_blocks`` blocks of whole clusters (default
    ``max(2, ceil(n / BLOCK_POINTS))``; at most one per cluster; module notes, steps 1 and
    2)."""
    n = points.shape[0]
    if n_blocks is None:
        n_blocks = max(2, -(-n // BLOCK_POINTS))
    n_blocks = check_int(n_blocks, "n_blocks", minimum=1)
    points = points.rechunk({1: -1})
    chunks = points.chunks[0]
    index = np.unique(generator.integers(0, n, COVER_SAMPLE)) if n > COVER_SAMPLE else None
    sample = points.compute() if index is None else points[index].compute()
    _, first = expansion.cover(sample, generator)
    seeds = generator.integers(0, 2**63 - 1, len(chunks))
    blocks = points.to_delayed().ravel()
    outliers = dask.delayed(_outlier_centers, pure=True)
    extra = dask.compute(
        *[outliers(b, first, expansion, int(s)) for b, s in zip(blocks, seeds, strict=True)]
    )
    centers = np.concatenate([first, *extra]) if extra else first
    label = dask.delayed(_labels, pure=True)
    # persisted once: the counts, the routes and the split all read them
    labels = list(dask.persist(*[label(b, centers) for b in blocks]))
    count = dask.delayed(functools.partial(_counts, size=centers.shape[0]), pure=True)
    counts = np.sum(dask.compute(*[count(lab) for lab in labels]), axis=0)
    used = np.flatnonzero(counts > 0)
    renumber = np.full(centers.shape[0], -1, dtype=np.int64)
    renumber[used] = np.arange(used.size)
    centers, counts = centers[used], counts[used]
    # blocks: runs of the k-d tree's spatial order of about equal numbers of points
    n_blocks = max(1, min(n_blocks, used.size))
    order = cKDTree(centers).indices if used.size > 1 else np.arange(used.size)
    filled = np.cumsum(counts[order]) - counts[order]
    block_of = np.empty(used.size, dtype=np.int64)
    block_of[order] = np.minimum((filled * n_blocks) // n, n_blocks - 1)
    present, block_of = np.unique(block_of, return_inverse=True)  # no empty block
    n_blocks = present.size
    route = dask.delayed(_route, pure=True)
    routes = [route(lab, renumber, block_of) for lab in labels]
    split = dask.delayed(_split_points, pure=True, nout=n_blocks)
    starts = np.concatenate([[0], np.cumsum(chunks)])
    pieces = [
        split(b, lab, r, renumber, int(start), n_blocks)
        for b, lab, r, start in zip(blocks, labels, routes, starts[:-1], strict=True)
    ]
    build = dask.delayed(_build_block, pure=True, nout=2)
    parts, rows = [], []
    for s in range(n_blocks):
        ids = np.flatnonzero(block_of == s)
        block, block_rows = build(expansion, centers[ids], ids, *[p[s] for p in pieces])
        parts.append(block)
        rows.append(block_rows)
    sizes = tuple(int(counts[block_of == s].sum()) for s in range(n_blocks))
    persisted = dask.persist(*parts, *rows, *routes)
    _wait(persisted)
    return DaskClusterBlocks(
        list(persisted[:n_blocks]), list(persisted[n_blocks : 2 * n_blocks]), sizes,
        tuple(chunks), list(persisted[2 * n_blocks :]), used.size,
    )  # fmt: skip


def _wait(objects: Any) -> None:
    """Wait for persisted objects on a distributed client (nothing to wait for otherwise)."""
    try:
        from distributed import futures_of, wait
    except ImportError:
        return
    futures = futures_of(objects)
    if futures:
        wait(futures)


def _outlier_centers(points, first, expansion: BlockExpansion, seed: int) -> np.ndarray:
    """The centres one chunk adds for its points beyond ``rho`` of the sample's centres."""
    if first.shape[0]:
        dist, _ = cKDTree(first).query(points)
        points = points[dist > expansion.rho_ * 0.999]
    if points.shape[0] == 0:
        return np.empty((0, first.shape[1]))
    _, centers = expansion.cover(points, np.random.default_rng(seed))
    return centers


def _labels(points, centers) -> np.ndarray:
    return cKDTree(centers).query(points)[1].astype(np.int64)


def _counts(labels, size: int) -> np.ndarray:
    return np.bincount(labels, minlength=size)


def _route(labels, renumber, block_of) -> np.ndarray:
    return block_of[renumber[labels]]


def _split_points(points, labels, route, renumber, start: int, n_blocks: int) -> list[tuple]:
    rows = start + np.arange(points.shape[0])
    return [
        (points[route == s], renumber[labels[route == s]], rows[route == s])
        for s in range(n_blocks)
    ]


def _build_block(expansion: BlockExpansion, centers, ids, *pieces) -> tuple[Any, np.ndarray]:
    points = np.concatenate([p[0] for p in pieces])
    labels = np.searchsorted(ids, np.concatenate([p[1] for p in pieces]))
    rows = np.concatenate([p[2] for p in pieces])
    store = points.shape[0] * expansion.n_features_ * 8 <= BLOCK_FEATURE_BYTES
    return expansion.block(points, labels, centers, store=store), rows


def _split_by_block(values, route, n_blocks: int) -> list[np.ndarray]:
    return [values[route == s] for s in range(n_blocks)]


def _join_pieces(*pieces) -> np.ndarray:
    return np.concatenate(pieces)


def _split_by_chunk(values, rows, starts) -> list[tuple[np.ndarray, np.ndarray]]:
    chunk = np.searchsorted(starts, rows, side="right") - 1
    return [(rows[chunk == c] - starts[c], values[chunk == c]) for c in range(len(starts) - 1)]


def _place_pieces(size: int, width: int | None, *pieces) -> np.ndarray:
    out = np.empty(size if width is None else (size, width))
    for positions, values in pieces:
        out[positions] = values
    return out


# ---------------------------------------------------------------------- products
def _bounds(expansion: BlockExpansion, block, log_w) -> ClusterBounds:
    return expansion.bounds(block, log_w)


def _lower(expansion: BlockExpansion, block, *bounds) -> np.ndarray:
    return expansion.lower_bounds(block, ClusterBounds.concat(list(bounds)))


def _term(expansion: BlockExpansion, out, inn, log_w, lower, truncate: float, means: bool):
    return expansion.product(out, inn, log_w, truncate=truncate, lower=lower, means=means)


def _total(*terms) -> tuple[np.ndarray, np.ndarray]:
    return functools.reduce(BlockExpansion.combine, terms)


def _log_of(total) -> np.ndarray:
    scale, Z = total
    with np.errstate(divide="ignore"):
        return scale + np.log(Z[:, 0])


def _log_and_means(total) -> np.ndarray:
    """``[log row sum, means (d)]`` per row (means 0 where the sum is empty)."""
    scale, Z = total
    with np.errstate(divide="ignore", invalid="ignore"):
        means = np.where(Z[:, :1] > 0, Z[:, 1:] / Z[:, :1], 0.0)
        return np.column_stack([scale + np.log(Z[:, 0]), means])


def _log_pass(total, numerator, step: RatioStep) -> np.ndarray:
    """``[log products, log ratios, bad]`` of one block's rows pass."""
    products = _log_of(total)
    ratios, bad = log_ratios_and_bad(numerator, products, step)
    return np.column_stack([products, ratios, bad.astype(np.float64)])


def _block_totals(
    expansion: BlockExpansion, outs: DaskClusterBlocks, inns: DaskClusterBlocks,
    log_w: list[Any], truncate: float, means: bool,
) -> list[Any]:  # fmt: skip
    """Per output block, the delayed ``(scale, Z)`` of its rows summed over every input
    block (module notes, step 3): the input blocks' bounds, each output block's lower
    bounds, then the block pairs' terms, each truncated at ``truncate / blocks``."""
    bounds = [
        dask.delayed(_bounds, pure=True)(expansion, part, w)
        for part, w in zip(inns.parts, log_w, strict=True)
    ]
    share = truncate / inns.n_blocks
    term, total = dask.delayed(_term, pure=True), dask.delayed(_total, pure=True)
    lower = dask.delayed(_lower, pure=True)
    totals = []
    for out in outs.parts:
        below = lower(expansion, out, *bounds) if truncate > 0 else None
        terms = [
            term(expansion, out, inn, w, below, share, means)
            for inn, w in zip(inns.parts, log_w, strict=True)
        ]
        totals.append(total(*terms))
    return totals


class DaskBlockLocal:
    """The placement of a :class:`~sketchot.kernels.LocalPolyKernel` whose clouds are Dask
    arrays: both clouds in blocks of whole clusters on the workers (module notes).

    Parameters
    ----------
    expansion : BlockExpansion
        The fitted polynomial and features.
    rows, cols : DaskClusterBlocks
        The blocks of ``X`` and of ``Y`` (:func:`cluster_blocks`).
    truncate : float
        Log products miss at most this fraction of each row's sum.

    Notes
    -----
    Passes run on logarithms only (the solver's ``'log'`` strategy): the rows' vectors are
    Dask arrays in ``X``'s order, the columns' NumPy vectors on the client. A rows pass and
    its projection are one scheduler call each. Linear products, rows of the kernel and
    products of new points are not available on Dask arrays.
    """

    capabilities = frozenset({"nonnegative", "log_products", "log_means"})

    def __init__(
        self,
        expansion: BlockExpansion,
        rows: DaskClusterBlocks,
        cols: DaskClusterBlocks,
        truncate: float,
    ) -> None:
        self.expansion, self.rows, self.cols, self.truncate = expansion, rows, cols, truncate
        # the columns' vectors in the blocks' order: the client's permutation
        self.col_order = np.concatenate(dask.compute(*cols.rows))

    # ----------------------------------------------------------- columns on the client
    def _cols_to_blocks(self, values: Any) -> list[np.ndarray]:
        ordered = np.asarray(values, dtype=np.float64)[self.col_order]
        return np.split(ordered, np.cumsum(self.cols.sizes)[:-1])

    def _cols_from_blocks(self, parts: list[np.ndarray]) -> np.ndarray:
        joined = np.concatenate(parts, axis=0)
        out = np.empty_like(joined)
        out[self.col_order] = joined
        return out

    # ----------------------------------------------------------- products
    def log_rows(self, log_v: Any, *, means: bool = False) -> list[Any]:
        """Per block of ``X``, the delayed ``(scale, Z)`` of ``K exp(log_v)``."""
        return _block_totals(
            self.expansion, self.rows, self.cols, self._cols_to_blocks(log_v),
            self.truncate, means,
        )  # fmt: skip

    def log_cols(self, log_u: Any, *, means: bool = False) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per block of ``Y``, ``(scale, Z)`` of ``K^T exp(log_u)`` (computed)."""
        log_u = (
            da.asarray(log_u)
            if hasattr(log_u, "chunks")
            else da.from_array(np.asarray(log_u, dtype=np.float64), chunks=(self.rows.chunks,))
        )
        pieces = self.rows.to_blocks(log_u)
        totals = _block_totals(self.expansion, self.cols, self.rows, pieces, self.truncate, means)
        return list(dask.compute(*totals))

    def log_rmatvec(self, log_u: Any) -> np.ndarray:
        """``log(K^T exp(log_u))`` (m,) on the client."""
        return self._cols_from_blocks([_log_of(t) for t in self.log_cols(log_u)])

    def log_matvec(self, log_v: Any) -> da.Array:
        """``log(K exp(log_v))`` (n,), persisted on the cluster in ``X``'s order."""
        to_log = dask.delayed(_log_of, pure=True)
        blocks = [to_log(t) for t in self.log_rows(log_v)]
        (out,) = persist_now(self.rows.to_cloud(blocks))
        return out

    def log_means(self, kernel: Any, side: str, log_w: Any) -> tuple[Any, Any]:
        """``(log(K e^w), means)`` (centred coordinates): rows as persisted Dask arrays,
        columns as NumPy arrays on the client."""
        d = self.expansion.d
        if side == "rows":
            pack = dask.delayed(_log_and_means, pure=True)
            blocks = [pack(t) for t in self.log_rows(log_w, means=True)]
            (table,) = persist_now(self.rows.to_cloud(blocks, width=d + 1))
            return table[:, 0], table[:, 1:]
        table = self._cols_from_blocks(
            [_log_and_means(t) for t in self.log_cols(log_w, means=True)]
        )
        return table[:, 0], table[:, 1:]

    def matmat(self, kernel: Any, V: Any) -> da.Array:
        """``K V`` of non-negative ``V`` (``(m,)`` or ``(m, k)``, gathered on the client), a
        log product per column, persisted on the cluster in ``X``'s order."""
        vector = np.ndim(V) == 1
        V = _nonnegative(V, kernel.shape[1], "V")
        columns = [da.exp(self.log_matvec(_log(V[:, j]))) for j in range(V.shape[1])]
        return columns[0] if vector else da.stack(columns, axis=1)

    def rmatmat(self, kernel: Any, U: Any) -> np.ndarray:
        """``K^T U`` of non-negative ``U`` (``(n,)`` or ``(n, k)``, in ``X``'s order), a log
        product per column, on the client."""
        U = da.asarray(U)
        vector = U.ndim == 1
        U = U[:, None] if vector else U
        if U.ndim != 2 or U.shape[0] != kernel.shape[0]:
            raise ValueError(
                f"U must have shape ({kernel.shape[0]},) or ({kernel.shape[0]}, k); got {U.shape}"
            )
        if bool((U < 0).any().compute()):
            raise ValueError(
                "U must be non-negative: the block-local kernel on Dask arrays takes linear "
                "products of non-negative values only (through its log products)"
            )
        with np.errstate(divide="ignore"):
            logs = [da.log(U[:, j]) for j in range(U.shape[1])]
        out = np.column_stack([np.exp(self.log_rmatvec(lw)) for lw in logs])
        return out[:, 0] if vector else out

    # ----------------------------------------------------------- the solver's passes
    def fused_pass(
        self, kernel: Any, side: str, w: Any, numerator: Any, *, log: bool, step: RatioStep
    ) -> FusedPass:
        """Cols: elementwise on the client (``R = I``). Rows (log): ``log K exp(w)``, its
        log ratios and bad entries per block, persisted in ``X``'s order; the projection
        ``log K^T exp(ratios)`` when first read."""
        if side == "cols":
            return identity_pass(np.asarray(w), np.asarray(numerator), log=log, step=step)
        if not log:
            raise NotImplementedError(
                "the block-local kernel on Dask arrays runs log-domain passes only"
            )
        num = self.rows.to_blocks(da.asarray(numerator))
        task = dask.delayed(_log_pass, pure=True)
        blocks = [task(t, c, step) for t, c in zip(self.log_rows(w), num, strict=True)]
        (table,) = persist_now(self.rows.to_cloud(blocks, width=3))
        return ProjectedOnRead(table[:, 0], table[:, 1], table[:, 2] > 0, self.log_rmatvec)

    def project(self, kernel: Any, side: str, values: Any, index: Any, *, log: bool) -> Any:
        """Cols: ``values`` on the client; rows: ``log K^T exp(values)``."""
        if index is not None:
            raise NotImplementedError(
                "project(side, values, index) with an index is not available on Dask arrays"
            )
        if not log:
            raise NotImplementedError(
                "the block-local kernel on Dask arrays runs log-domain passes only"
            )
        if side == "cols":
            return np.asarray(values, dtype=np.float64)
        return self.log_rmatvec(values)


def _nonnegative(V: Any, length: int, name: str) -> np.ndarray:
    V = np.asarray(V.compute() if hasattr(V, "chunks") else V, dtype=np.float64)
    if V.ndim not in (1, 2) or V.shape[0] != length:
        raise ValueError(f"{name} must have shape ({length},) or ({length}, k); got {V.shape}")
    if not np.all(np.isfinite(V)) or np.any(V < 0):
        raise ValueError(
            f"{name} must be finite and non-negative: the block-local kernel on Dask arrays "
            "takes linear products of non-negative values only (through its log products)"
        )
    return V.reshape(length, -1)


def _log(values: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(values)


def dask_local_placement(
    geometry: DaskGibbsGeometry,
    expansion: BlockExpansion,
    truncate: float,
    rng: Any,
    n_blocks: int | None = None,
) -> DaskBlockLocal:
    """Both clouds of ``geometry`` in blocks of whole clusters (:func:`cluster_blocks`,
    draws from ``rng``; ``n_blocks`` per cloud) and the placement of their products."""
    generator = check_rng(rng)
    rows = cluster_blocks(geometry.Xc, expansion, generator, n_blocks)
    cols = cluster_blocks(geometry.Yc, expansion, generator, n_blocks)
    return DaskBlockLocal(expansion, rows, cols, truncate)


def _sample_rows(points: da.Array, generator: np.random.Generator) -> np.ndarray:
    """At most :data:`COVER_SAMPLE` rows drawn uniformly by index, on the client."""
    n = points.shape[0]
    if n <= COVER_SAMPLE:
        return np.asarray(points.compute())
    return np.asarray(points[np.unique(generator.integers(0, n, COVER_SAMPLE))].compute())


def sampled_tau(
    geometry: DaskGibbsGeometry,
    rtol: float,
    max_features: int,
    generator: np.random.Generator,
    candidates: tuple[float, ...] = TAU_CANDIDATES,
) -> tuple[float, float]:
    """``tau='auto'`` on Dask: the in-memory rule's candidates
    (:data:`~sketchot.kernels.local.TAU_CANDIDATES`, each kept while its counted iteration
    is at most :data:`~sketchot.kernels.local.TAU_GAIN` of the best, its features and
    rounding within ``max_features`` and ``rtol``) judged on the block-local kernels of
    samples of at most :data:`COVER_SAMPLE` rows per side (counted work: the same draws,
    the same choice).
    Returns ``(tau, predicted seconds of an iteration on the whole clouds)``: the sample's
    counted iteration scaled by the points, ``(n + m) / (n_s + m_s)`` (a row keeps about as
    many cluster pairs in a uniform sample as in the cloud)."""
    small = GibbsGeometry(_sample_rows(geometry.Xc, generator),
                          _sample_rows(geometry.Yc, generator), geometry.reg)  # fmt: skip
    best: tuple[float, float] | None = None
    for tau in candidates:
        try:
            kernel = build_local(
                small, tau=tau, rtol=rtol, max_features=max_features, rng=generator
            )
        except ValueError:
            if best is None:
                raise
            break
        if best is not None and kernel.expansion.entry_error_bound_ > rtol:
            break
        cost = local_iteration_cost(kernel)
        if best is not None and cost > TAU_GAIN * best[1]:
            break
        best = (tau, cost)
    scale = sum(geometry.shape) / sum(small.shape)
    return best[0], best[1] * scale


def dask_local_kernel(
    geometry: DaskGibbsGeometry,
    *,
    rng: Any = None,
    dtype: Any = np.float64,
    tau: float | str = "auto",
    rtol: float | None = None,
    max_features: int = 1000,
    truncate: float | None = None,
    accuracy: float = DEFAULT_ACCURACY,
    n_blocks: int | None = None,
) -> LocalPolyKernel:
    """The block-local kernel of Dask clouds: a :class:`~sketchot.kernels.LocalPolyKernel`
    on a :class:`DaskBlockLocal` placement (module notes). Parameters as
    :func:`~sketchot.kernels.local.build_local`; ``tau='auto'`` is judged on samples
    (:func:`sampled_tau`), ``'timed'`` is refused (a cluster's timing is not this
    machine's); ``n_blocks`` per cloud as :func:`cluster_blocks`. Products run in float64
    whatever ``dtype``."""
    dtype = check_dtype(dtype)
    if geometry.cost.name != "sqeuclidean":
        raise ValueError(
            f"the block-local kernel expands the squared Euclidean cost; got metric "
            f"{geometry.cost.name!r}"
        )
    rtol = rtol_for(accuracy) if rtol is None else check_float(rtol, "rtol", positive=True)
    generator = check_rng(rng)
    if isinstance(tau, str) and tau != "auto":
        raise ValueError(f"tau must be a positive number or 'auto' on Dask arrays; got {tau!r}")
    # a given tau is counted on the samples too: 'auto' among backends reads the prediction
    given = not isinstance(tau, str)
    candidates = (check_float(tau, "tau", positive=True),) if given else TAU_CANDIDATES
    tau, predicted = sampled_tau(geometry, rtol, max_features, generator, candidates)
    expansion = BlockExpansion(
        geometry.reg, geometry.Xc.shape[1], tau=tau, rtol=rtol, max_features=max_features
    )
    truncate = rtol if truncate is None else check_float(truncate, "truncate", minimum=0.0)
    placement = dask_local_placement(geometry, expansion, truncate, generator, n_blocks)
    bound = expansion.entry_error_bound(geometry.max_cost() / geometry.reg)
    info = KernelInfo(
        LOCAL_BACKEND,
        {
            "tau": expansion.tau,
            "rtol": rtol,
            "truncate": truncate,
            "degree": expansion.degree_,
            "clusters": (placement.rows.n_clusters, placement.cols.n_clusters),
            "blocks": (placement.rows.n_blocks, placement.cols.n_blocks),
            "entry_error_bound": bound,
        },
        product_rtol=bound + truncate,
    )
    kernel = LocalPolyKernel(geometry, expansion, info, dtype, placement=placement)
    kernel.predicted_seconds = predicted
    return kernel


def is_block_local(kernel: Any) -> bool:
    """Whether ``kernel`` is the block-local kernel on a Dask placement."""
    return isinstance(getattr(kernel, "placement", None), DaskBlockLocal)


def local_plan_summary(kernel: LocalPolyKernel, log_u: da.Array, log_v: Any) -> tuple:
    """``(row marginal, column marginal, <P, C>)`` of ``P = diag(e^log_u) K diag(e^log_v)``
    from two log-domain passes: the rows' with means (``P Y = diag(P 1)`` times them), the
    columns' plain; ``<P, C> = <row, ||x||^2> + <col, ||y||^2> - 2 sum_i row_i x_i . mean_i``
    in centred coordinates. The rows stay on the cluster, the cost is lazy."""
    g = kernel.geometry
    log_v = np.asarray(log_v, dtype=np.float64)
    log_kv, means = kernel.log_means("rows", log_v)
    log_ktu = kernel.project("rows", log_u, log=True)
    row = da.exp(log_u + log_kv)
    col = da.from_array(np.exp(log_v + log_ktu), chunks=(g.Yc.chunks[0],))
    (row,) = persist_now(row)
    cross = (row[:, None] * g.Xc * means).sum(split_every=SPLIT_EVERY)
    cost = (
        (row * g.x_sq).sum(split_every=SPLIT_EVERY)
        + (col * g.y_sq).sum(split_every=SPLIT_EVERY)
        - 2.0 * cross
    )
    return row, col, cost


def local_barycentric(kernel: LocalPolyKernel, log_w: Any, *, transpose: bool) -> da.Array:
    """The barycentric map of the sources onto ``Y`` (``transpose``: of the targets onto
    ``X``) from one log-domain pass with means, persisted."""
    g = kernel.geometry
    if transpose:
        _, means = kernel.log_means("cols", log_w)
        return da.from_array(means + g.center, chunks=(g.Yc.chunks[0], -1))
    _, means = kernel.log_means("rows", np.asarray(log_w, dtype=np.float64))
    (mapped,) = persist_now(means + g.center)
    return mapped
