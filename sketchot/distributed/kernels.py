"""Kernel operators whose ``n``- and ``m``-sized arrays are Dask arrays on a cluster.

Both classes keep :class:`~sketchot.kernels.KernelOperator`'s contract. A fused pass over one
side (``K = L R^T``) is ONE pass over the row chunks of ``L`` (or ``R``): each chunk's task
runs the in-memory :func:`~sketchot.kernels.base.blocked_fused_pass` on its rows (products,
ratios and the partial projection ``F_chunk^T ratios`` together) and returns the partial
projection and its count of bad entries; a tree reduction adds them, and one scheduler
call brings the rank-sized sum and the count to the client. The products and
ratios are returned lazily (a chunk-local recomputation, ``O(chunk r)``), so the solver
only materialises the scalings it keeps. :class:`PassGraph` chains passes: the next pass
takes the last one's sum by key, so many half-steps cost one scheduler call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dask
import dask.array as da
import dask.threaded
import numpy as np

from ..gibbs import block_rows, gibbs_softmax_average, neg_cost_over_reg, row_slices
from ..kernels.base import (
    FusedPass,
    KernelInfo,
    KernelOperator,
    blocked_fused_pass,
    matrix_fused_pass,
    ratios_and_bad,
)
from ..kernels.lowrank import LowRankKernel
from .geometry import SPLIT_EVERY, DaskGibbsGeometry, persist_now


@dataclass(frozen=True)
class DaskFusedPass(FusedPass):
    """A :class:`~sketchot.kernels.FusedPass` whose ``products``, ``ratios`` and ``bad`` are
    lazy Dask arrays; ``count`` (the number of bad entries) is already computed."""

    count: int = 0

    @property
    def n_bad(self) -> int:
        return self.count


def _ratios(numerator: np.ndarray, products: np.ndarray) -> np.ndarray:
    return ratios_and_bad(numerator, products)[0]


def _bad(numerator: np.ndarray, products: np.ndarray) -> np.ndarray:
    return ratios_and_bad(numerator, products)[1]


def _add(*parts: np.ndarray) -> np.ndarray:
    total = parts[0].copy()
    for part in parts[1:]:
        total += part
    return total


class PassGraph:
    """A raw task graph of one or more passes over row chunks, computed in ONE scheduler call.

    The hot path of every iteration, so the graph is written directly (one task per chunk, a
    tree of additions ``SPLIT_EVERY`` at a time): no collection optimisation on the client,
    ~half the latency of the array expression. A task's input may be the key of an earlier
    task, so several passes chain without a round trip. Task names are content hashes, so a
    repeated pass is the same graph.
    """

    def __init__(self) -> None:
        self.graph: dict[Any, Any] = {}
        self.arrays: dict[str, da.Array] = {}

    def blocks(self, array: da.Array) -> list[tuple[Any, ...]]:
        """The keys of ``array``'s row chunks (its graph is added once)."""
        if array.name not in self.arrays:
            self.graph.update(array.__dask_graph__())
            self.arrays[array.name] = array
        tail = (0,) * (array.ndim - 1)
        return [(array.name, i, *tail) for i in range(array.numblocks[0])]

    def task(self, function: Callable[..., Any], *args: Any) -> tuple[str, int]:
        """``function(*args)`` as one task (an argument may be the key of another); its key."""
        from dask.base import tokenize

        key = (f"{function.__name__}-{tokenize(function, args)}", 0)
        self.graph[key] = (function, *args)
        return key

    def partial_sums(
        self, function: Callable[..., np.ndarray], row_arrays: list[da.Array], shared: tuple
    ) -> list[tuple[str, int]]:
        """Keys of at most ``SPLIT_EVERY`` partial sums adding up to ``sum_i function(*chunks_i,
        *shared)`` over the row chunks: the tree without its root, so that the tasks of the
        next pass can add them themselves (one scheduler hop less per pass)."""
        from dask.base import tokenize

        name = f"{function.__name__}-{tokenize(function, [a.name for a in row_arrays], shared)}"
        blocks = [self.blocks(array) for array in row_arrays]
        keys = []
        for i, chunk_keys in enumerate(zip(*blocks, strict=True)):
            self.graph[(name, i)] = (function, *chunk_keys, *shared)
            keys.append((name, i))
        level = 0
        while len(keys) > SPLIT_EVERY:
            level += 1
            groups = [keys[j : j + SPLIT_EVERY] for j in range(0, len(keys), SPLIT_EVERY)]
            keys = [(f"{name}-sum{level}", j) for j in range(len(groups))]
            self.graph.update(
                {key: (_add, *group) for key, group in zip(keys, groups, strict=True)}
            )
        return keys

    def sum_over_chunks(
        self, function: Callable[..., np.ndarray], row_arrays: list[da.Array], shared: tuple
    ) -> tuple[str, int]:
        """The key of ``sum_i function(*chunks_i, *shared)`` over the row chunks."""
        parts = self.partial_sums(function, row_arrays, shared)
        return parts[0] if len(parts) == 1 else self.task(_add, *parts)

    def compute(self, items: list[Any]) -> list[Any]:
        """The values of ``items`` (keys of this graph; anything else is its own value), from
        one call to the current scheduler."""
        from dask.base import get_scheduler

        keys = list(dict.fromkeys(item for item in items if isinstance(item, tuple)))
        scheduler = get_scheduler(collections=list(self.arrays.values())) or dask.threaded.get
        values = dict(zip(keys, scheduler(self.graph, keys), strict=True))
        return [values[item] if isinstance(item, tuple) else item for item in items]


def sum_over_chunks(
    function: Callable[..., np.ndarray], row_arrays: list[da.Array], shared: tuple[Any, ...]
) -> np.ndarray:
    """``sum_i function(*chunks_i, *shared)`` over the row chunks, computed now (first row)."""
    graph = PassGraph()
    (total,) = graph.compute([graph.sum_over_chunks(function, row_arrays, shared)])
    return np.asarray(total)[0]


def _tree_sum(partials: da.Array) -> da.Array:
    """Sum of per-chunk rows ``(chunks, k) -> (k,)`` by a tree reduction."""
    return partials.sum(axis=0, split_every=SPLIT_EVERY)


def _lazy_pass(
    numerator: da.Array, products: da.Array, projection: Any, count: int
) -> DaskFusedPass:
    ratios = da.map_blocks(_ratios, numerator, products, dtype=np.float64)
    bad = da.map_blocks(_bad, numerator, products, dtype=bool)
    return DaskFusedPass(products, ratios, projection, bad, count)


def _align(vector: Any, chunks: tuple[int, ...], name: str) -> da.Array:
    """A 1-D Dask array in float64 with the given chunks (a NumPy array is wrapped)."""
    length = sum(chunks)
    if getattr(vector, "ndim", None) != 1 or vector.shape[0] != length:
        raise ValueError(
            f"{name} must be a vector of length {length}; got shape {getattr(vector, 'shape', ())}"
        )
    if not hasattr(vector, "chunks"):
        return da.from_array(np.asarray(vector, dtype=np.float64), chunks=(chunks,))
    return vector.astype(np.float64).rechunk((chunks,))


def per_chunk(
    function: Callable[..., np.ndarray],
    row_arrays: list[da.Array],
    shared: tuple[Any, ...],
    width: int | None,
    *,
    partial: bool = False,
) -> da.Array:
    """One task per row chunk: ``function(*chunk_blocks, *shared)``.

    ``row_arrays`` share their row chunks (and have one chunk across columns); ``shared``
    are whole single-chunk Dask arrays (sent to every task) or small NumPy values. Each task
    returns ``(chunk_rows, width)`` (``(chunk_rows,)`` when ``width`` is None), or
    ``(1, width)`` when ``partial`` (a per-chunk partial sum, for :func:`_tree_sum`).
    """
    blocks = [array.to_delayed().ravel() for array in row_arrays]
    whole = [s.to_delayed().ravel()[0] if hasattr(s, "chunks") else s for s in shared]
    task = dask.delayed(function, pure=True)
    parts = []
    for i, rows in enumerate(row_arrays[0].chunks[0]):
        shape = (1, width) if partial else (rows,) if width is None else (rows, width)
        value = task(*(b[i] for b in blocks), *whole)
        parts.append(da.from_delayed(value, shape=shape, dtype=np.float64))
    return da.concatenate(parts, axis=0)


# ---------------------------------------------------------------------------- low rank
def _factor_chunk(points: np.ndarray, feature_map: Callable, dtype: np.dtype) -> np.ndarray:
    return np.ascontiguousarray(feature_map(points), dtype=dtype)


def dask_factors(
    geometry: DaskGibbsGeometry,
    left_factor: Callable[[np.ndarray], np.ndarray],
    right_factor: Callable[[np.ndarray], np.ndarray],
    dtype: Any,
) -> tuple[da.Array, da.Array]:
    """``A = left_factor(X)`` and ``B = right_factor(Y)`` built chunk by chunk on the workers
    (``map_blocks``) and persisted; the row maps carry the state fitted on the client."""
    dtype = np.dtype(dtype)
    # Probe one row for the rank: the maps are cheap and the factors are built lazily.
    rank = np.asarray(left_factor(geometry.union_rows(np.array([0])) + geometry.center))
    rank = rank.shape[1]
    return persist_now(
        *(
            cloud.map_blocks(
                _factor_chunk, feature_map, dtype, chunks=(cloud.chunks[0], (rank,)), dtype=dtype
            )
            for cloud, feature_map in ((geometry.X, left_factor), (geometry.Y, right_factor))
        )
    )


def _low_rank_pass_chunk(
    F: np.ndarray, numerator: np.ndarray, w: np.ndarray, dtype: np.dtype
) -> np.ndarray:
    """``[F^T ratios, n_bad]`` of one chunk, shape (1, r + 1), by the in-memory pass."""
    result = matrix_fused_pass(F, w, numerator, dtype)
    return np.append(result.projection, result.n_bad)[None, :]


def _chained_pass_chunk(
    F: np.ndarray, numerator: np.ndarray, dtype: np.dtype, *w_parts: np.ndarray
) -> np.ndarray:
    """:func:`_low_rank_pass_chunk` with ``w`` the first ``r`` entries of the sum of the
    previous pass's partial sums (the same sum, in the same order, on every chunk)."""
    return _low_rank_pass_chunk(F, numerator, _leading(_add(*w_parts), F.shape[1]), dtype)


def _leading(total: np.ndarray, rank: int) -> np.ndarray:
    """``w``: the first ``rank`` entries of a pass's ``[projection, n_bad]`` (1, r + 1), or
    of a projection (1, r)."""
    return np.asarray(total)[0, :rank]


def _project_chunk(F: np.ndarray, values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return (values.astype(dtype) @ F).astype(np.float64)[None, :]


def _products_chunk(F: np.ndarray, w: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return (F @ w.astype(dtype, copy=False)).astype(np.float64, copy=False)


def _error_chunk(
    F: np.ndarray, numerator: np.ndarray, w_scaling: np.ndarray, w: np.ndarray, dtype: np.dtype
) -> list[float]:
    """``[max |e|, sum (e / max)^2]`` of ``e = ratios(numerator, F w_scaling) F w - numerator``
    on one chunk: the marginal error of the scalings from ``w_scaling`` against ``F w``
    (both given as pass totals, :func:`_leading`)."""
    w_scaling, w = _leading(w_scaling, F.shape[1]), _leading(w, F.shape[1])
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        scaling = _ratios(numerator, _products_chunk(F, w_scaling, dtype))
        error = scaling * _products_chunk(F, w, dtype) - numerator
        top = float(np.max(np.abs(error))) if error.size else 0.0
        if not np.isfinite(top) or top == 0.0:
            return [top, 0.0]
        return [top, float(np.sum((error / top) ** 2))]


def _norm_of_chunks(*parts: list[float]) -> float:
    """The L2 norm from per-chunk ``[max, sum (x / max)^2]``, scaled by the largest entry
    (no overflow; as :func:`sketchot.solver.sinkhorn._norm`)."""
    top = max(part[0] for part in parts)
    if not np.isfinite(top) or top == 0.0:
        return top
    return top * float(np.sqrt(sum(total * (peak / top) ** 2 for peak, total in parts)))


class DaskLowRankKernel(LowRankKernel):
    """``K ~ A B^T`` with ``A`` (n x r) and ``B`` (m x r) persisted Dask arrays
    (``factors`` gives them; a :class:`~sketchot.kernels.LowRankKernel` whose products,
    passes and out-of-sample maps run on the cluster).

    Parameters
    ----------
    geometry : DaskGibbsGeometry
    info : KernelInfo
    left, right : dask.array
        ``A`` and ``B`` chunked as ``X`` and ``Y`` by rows, persisted, in ``dtype``
        (:func:`dask_factors`).
    left_map, right_map, left_projection, right_projection : see LowRankKernel
        Out-of-sample maps (``apply_new``).
    dtype : numpy dtype

    Notes
    -----
    Worker memory: ``(chunk_rows r itemsize)`` per factor chunk held, ``O((n + m) r)`` over the
    cluster. A fused pass costs ``O(n r)`` work over the workers and moves ``O(r)`` floats per
    chunk; the client receives ``r + 1`` numbers.
    """

    def _hold(self, factor: da.Array) -> da.Array:
        """The persisted Dask factor itself (never gathered)."""
        return factor

    # ------------------------------------------------------------- products
    def _small(self, factor: da.Array, values: Any) -> np.ndarray:
        """``factor^T values`` (r x k), reduced over chunks and brought to the client."""
        if np.ndim(values) == 1:
            return self._project(factor, _align(values, factor.chunks[0], "values")).compute()
        if np.ndim(values) != 2 or values.shape[0] != factor.shape[0]:
            raise ValueError(
                f"values must have shape ({factor.shape[0]},) or ({factor.shape[0]}, k); "
                f"got shape {np.shape(values)}"
            )
        values = _as_dask(values).rechunk((factor.chunks[0], -1))
        return (factor.T.astype(np.float64) @ values).compute()

    def matmat(self, V: Any) -> da.Array:
        """``A (B^T V)``: ``B^T V`` is reduced to the client (``r x k``), then broadcast."""
        inner = self._small(self.right, V)
        return self.left.astype(np.float64) @ inner

    def rmatmat(self, U: Any) -> da.Array:
        inner = self._small(self.left, U)
        return self.right.astype(np.float64) @ inner

    def _rows(self, index: np.ndarray) -> np.ndarray:
        return (self.left[index] @ self.right.T).astype(np.float64).compute()

    def _apply_new(self, points: Any, values: Any, transpose: bool) -> Any:
        fitted_other = self.left if transpose else self.right
        feature_map = self._maps[1 if transpose else 0]
        projection = self._projections[1 if transpose else 0]
        inner = self._small(fitted_other, values).astype(self.dtype)
        if projection is not None:
            inner = projection.astype(self.dtype, copy=False) @ inner
        if not hasattr(points, "chunks"):
            return np.asarray(feature_map(points) @ inner, dtype=np.float64)
        points = points.astype(np.float64).rechunk({1: -1})

        def chunk(block: np.ndarray) -> np.ndarray:
            return np.asarray(feature_map(block) @ inner, dtype=np.float64)

        if inner.ndim == 1:
            return points.map_blocks(chunk, drop_axis=1, dtype=np.float64)
        return points.map_blocks(
            chunk, chunks=(points.chunks[0], (inner.shape[1],)), dtype=np.float64
        )

    def apply_new(self, points: Any, values: Any, *, side: str = "source") -> Any:
        """Out-of-sample products; ``points`` may be a Dask array (then the result is one)."""
        if side not in ("source", "target"):
            raise ValueError(f"side must be 'source' or 'target'; got {side!r}")
        return self._apply_new(points, values, side == "target")

    # -------------------------------------------------------- fused passes
    def _project(self, factor: da.Array, values: da.Array) -> da.Array:
        partials = per_chunk(
            _project_chunk, [factor, values], (self.dtype,), factor.shape[1], partial=True
        )
        return _tree_sum(partials)

    def fused_pass(self, side: str, w: np.ndarray, numerator: Any) -> DaskFusedPass:
        """One pass over the chunks of ``A`` (``'rows'``) or ``B`` (``'cols'``).

        ``w`` (r,) is NumPy; ``numerator`` a Dask vector. One call to the scheduler
        (:func:`sum_over_chunks`) returns the projection (r,) and the number of bad entries.
        """
        factor = self._factor(side)
        numerator = _align(numerator, factor.chunks[0], "numerator")
        w = np.asarray(w, dtype=np.float64)
        total = sum_over_chunks(_low_rank_pass_chunk, [factor, numerator], (w, self.dtype))
        products = per_chunk(_products_chunk, [factor], (w, self.dtype), None)
        return _lazy_pass(numerator, products, total[:-1], int(total[-1]))

    # ------------------------------------------- passes chained in one graph
    def first_projection(self, graph: PassGraph, side: str, values: Any) -> tuple[Any, list]:
        """``F^T values`` in ``graph``: the keys of its total (1, r) and of its partial sums
        (what :meth:`chained_pass` takes)."""
        factor = self._factor(side)
        values = _align(values, factor.chunks[0], "values")
        parts = graph.partial_sums(_project_chunk, [factor, values], (self.dtype,))
        return graph.task(_add, *parts), parts

    def chained_pass(
        self, graph: PassGraph, side: str, w_parts: list, numerator: da.Array
    ) -> tuple[Any, list]:
        """:meth:`fused_pass` as tasks of ``graph``, with ``w`` the leading ``r`` entries of
        the sum of ``w_parts`` (keys of the previous pass's partial sums, or arrays).

        Returns the keys of the total ``[projection, n_bad]`` (1, r + 1), for the client,
        and of the partial sums, for the next pass: passes chain with one scheduler hop
        each and no round trip to the client.
        """
        factor = self._factor(side)
        numerator = _align(numerator, factor.chunks[0], "numerator")
        parts = graph.partial_sums(_chained_pass_chunk, [factor, numerator], (self.dtype, *w_parts))
        return graph.task(_add, *parts), parts

    def marginal_error(
        self, graph: PassGraph, side: str, numerator: da.Array, scaling_total: Any, total: Any
    ) -> tuple[str, int]:
        """The key of ``||s * (F w) - numerator||_2`` with ``s = ratios(numerator, F
        w_scaling)``, ``w`` and ``w_scaling`` the leading entries of two pass totals: with
        ``'cols'``, the column-marginal error of ``(u, v)`` when ``w = A^T u`` and ``v`` came
        from ``w_scaling``."""
        factor = self._factor(side)
        numerator = _align(numerator, factor.chunks[0], "numerator")
        blocks = zip(graph.blocks(factor), graph.blocks(numerator), strict=True)
        parts = [
            graph.task(_error_chunk, F, b, scaling_total, total, self.dtype) for F, b in blocks
        ]
        return graph.task(_norm_of_chunks, *parts)

    def scalings(self, side: str, total: np.ndarray, numerator: Any) -> da.Array:
        """``ratios(numerator, F w)`` as a lazy Dask vector (chunk-local, ``O(chunk r)``),
        ``w`` the leading ``r`` entries of a pass total."""
        factor = self._factor(side)
        numerator = _align(numerator, factor.chunks[0], "numerator")
        w = _leading(total, factor.shape[1]).copy()
        products = per_chunk(_products_chunk, [factor], (w, self.dtype), None)
        return da.map_blocks(_ratios, numerator, products, dtype=np.float64)

    def project(self, side: str, values: Any, index: Any = None) -> np.ndarray:
        """``F^T values`` over every row, computed to NumPy (``index`` is not supported)."""
        if index is not None:
            raise NotImplementedError(
                "project(side, values, index) with an index is not available on Dask arrays"
            )
        factor = self._factor(side)
        return self._project(factor, _align(values, factor.chunks[0], "values")).compute()


# ---------------------------------------------------------------------------- exact
def _exact_block(Xc, x_sq, Yc, y_sq, reg, dtype):
    """The function giving the rows ``K[rows]`` of a chunk (computed, never stored)."""

    def block_of(rows: slice) -> np.ndarray:
        block = neg_cost_over_reg(Xc[rows], Yc, reg, x_sq[rows], y_sq, dtype)
        return np.exp(block, out=block)

    return block_of


def _exact_slices(n_rows: int, m: int, dtype: Any) -> list[slice]:
    return list(row_slices(n_rows, block_rows(m, np.dtype(dtype).itemsize)))


def _exact_pass_chunk(Xc, x_sq, numerator, Yc, y_sq, w, reg, dtype) -> np.ndarray:
    """``[K_chunk^T ratios, n_bad]`` (1, m + 1), streamed in row blocks of the chunk."""
    m = Yc.shape[0]
    result = blocked_fused_pass(
        _exact_slices(Xc.shape[0], m, dtype),
        _exact_block(Xc, x_sq, Yc, y_sq, reg, dtype),
        Xc.shape[0],
        m,
        w,
        numerator,
        np.dtype(dtype),
    )
    return np.append(result.projection, result.n_bad)[None, :]


def _exact_matmat_chunk(Xc, x_sq, Yc, y_sq, V, reg, dtype) -> np.ndarray:
    """``K_chunk V`` (V of shape (m, k)) streamed in row blocks."""
    block_of = _exact_block(Xc, x_sq, Yc, y_sq, reg, dtype)
    out = np.empty((Xc.shape[0], V.shape[1]))
    V = V.astype(dtype, copy=False)
    for rows in _exact_slices(Xc.shape[0], Yc.shape[0], dtype):
        out[rows] = block_of(rows) @ V
    return out


def _exact_rmatmat_chunk(Xc, x_sq, U, Yc, y_sq, reg, dtype) -> np.ndarray:
    """``K_chunk^T U_chunk`` flattened to (1, m k), streamed in row blocks."""
    block_of = _exact_block(Xc, x_sq, Yc, y_sq, reg, dtype)
    out = np.zeros((Yc.shape[0], U.shape[1]))
    U = U.astype(dtype, copy=False)
    for rows in _exact_slices(Xc.shape[0], Yc.shape[0], dtype):
        out += block_of(rows).T @ U[rows]
    return out.reshape(1, -1)


class DaskExactKernel(KernelOperator):
    """The exact Gibbs kernel on a cluster, never stored: every product streams row blocks.

    ``K = L R^T`` with ``L = K`` and ``R = I``: a rows pass gives each task one row chunk of
    ``X`` and the whole of ``Y`` (``m x d``), computes ``K_chunk`` block by block
    (``O(block m)`` memory, blocks of about 16 MB), and returns ``K_chunk^T ratios``
    (``m``); a tree reduction adds them into an ``m``-sized projection that stays on the
    cluster (persisted), with the count of bad entries in the same computation.

    Notes
    -----
    ``O(n m d)`` work per pass over the workers; per task ``O(chunk d + m d + 16 MB)``
    memory. Meant for moderate ``m`` (the whole target cloud and an ``m``-vector go to every
    task); the log-domain iteration is not available on Dask.
    """

    def __init__(self, geometry: DaskGibbsGeometry, *, dtype: Any = np.float64) -> None:
        info = KernelInfo("exact", {}, capabilities=frozenset({"exact", "nonnegative"}))
        super().__init__(geometry, info, dtype)
        # The whole target side as one chunk: every row task needs all of it.
        self._Yc, self._y_sq = persist_now(geometry.Yc.rechunk({0: -1}), geometry.y_sq.rechunk(-1))
        self.is_dense = False

    def _shared(self) -> tuple[Any, ...]:
        return (self._Yc, self._y_sq)

    def _matmat_2d(self, V: da.Array) -> da.Array:
        g = self.geometry
        return per_chunk(
            _exact_matmat_chunk,
            [g.Xc, g.x_sq],
            (*self._shared(), V.rechunk({0: -1, 1: -1}), g.reg, self.dtype),
            V.shape[1],
        )

    def matmat(self, V: Any) -> da.Array:
        """``K V`` for ``V`` (m,) or (m, k): a Dask array (n,) or (n, k)."""
        V = _as_dask(V)
        if V.ndim == 1:
            return self._matmat_2d(V[:, None])[:, 0]
        return self._matmat_2d(V)

    def rmatmat(self, U: Any) -> da.Array:
        """``K^T U`` (tree-reduced over the row chunks)."""
        g = self.geometry
        U = _as_dask(U)
        vector = U.ndim == 1
        U2 = (U[:, None] if vector else U).rechunk((g.Xc.chunks[0], -1))
        k = U2.shape[1]
        partials = per_chunk(
            _exact_rmatmat_chunk,
            [g.Xc, g.x_sq, U2],
            (*self._shared(), g.reg, self.dtype),
            self.shape[1] * k,
            partial=True,
        )
        total = _tree_sum(partials)
        return total if not vector else total.reshape(self.shape[1])

    def _rows(self, index: np.ndarray) -> np.ndarray:
        g = self.geometry
        Yc, y_sq = dask.compute(self._Yc, self._y_sq)
        block = neg_cost_over_reg(g.rows("x", index), Yc, g.reg, y_sq=y_sq)
        return np.exp(block, out=block)

    def fused_pass(self, side: str, w: Any, numerator: Any) -> DaskFusedPass:
        """Rows: one streamed pass (projection ``K^T ratios`` persisted, ``m``-sized).
        Cols: ``R = I``, elementwise on the ``m``-vector ``w``."""
        g = self.geometry
        if side == "cols":
            numerator = _align(numerator, g.Yc.chunks[0], "numerator")
            products = _align(w, g.Yc.chunks[0], "w")
            ratios = da.map_blocks(_ratios, numerator, products, dtype=np.float64)
            bad = da.map_blocks(_bad, numerator, products, dtype=bool)
            ratios, count = dask.persist(ratios, bad.sum())
            return DaskFusedPass(products, ratios, ratios, bad, int(count.compute()))
        numerator = _align(numerator, g.Xc.chunks[0], "numerator")
        w = _align(w, (self.shape[1],), "w")
        m = self.shape[1]
        partials = per_chunk(
            _exact_pass_chunk,
            [g.Xc, g.x_sq, numerator],
            (*self._shared(), w, g.reg, self.dtype),
            m + 1,
            partial=True,
        )
        total = _tree_sum(partials)
        projection, count = dask.persist(total[:m], total[m])
        products = self._matmat_2d(w[:, None])[:, 0]
        return _lazy_pass(numerator, products, projection, int(count.compute()))

    def project(self, side: str, values: Any, index: Any = None) -> Any:
        """``K^T values`` (rows; persisted) or ``values`` itself (cols)."""
        if index is not None:
            raise NotImplementedError(
                "project(side, values, index) with an index is not available on Dask arrays"
            )
        if side == "cols":
            return values
        return self.rmatmat(values).persist()

    def softmax_average(self, log_weights: Any, values: Any) -> da.Array:
        """``sum_j softmax_j(log_w_j - ||x_i - y_j||^2 / reg) values_j`` for every fitted
        ``x_i``, streamed per row chunk (the exact barycentric map)."""
        g = self.geometry
        return per_chunk(
            _softmax_chunk,
            [g.Xc],
            (
                self._Yc,
                _align(log_weights, (self.shape[1],), "log_weights"),
                _as_dask(values).rechunk({0: -1, 1: -1}),
                g.reg,
            ),
            values.shape[1],
        )


def _softmax_chunk(Xc, Yc, log_w, values, reg) -> np.ndarray:
    return gibbs_softmax_average(Xc, Yc, reg, log_w, values)


def _as_dask(value: Any) -> da.Array:
    """A float64 Dask array (NumPy input wrapped in one chunk)."""
    if not hasattr(value, "chunks"):
        value = da.from_array(np.asarray(value, dtype=np.float64), chunks=-1)
    return value.astype(np.float64)
