"""The Dask placements of the kernel classes: operators whose ``n``- and ``m``-sized arrays
are Dask arrays on a cluster.

The exact kernel (an :class:`~sketchot.kernels.ExactKernel` whose placement is
:class:`DaskStreamedExact`, built by :func:`dask_exact_kernel`) and the low-rank one (a
:class:`~sketchot.kernels.LowRankKernel` whose placement is :class:`DaskFactors`) keep
:class:`~sketchot.kernels.KernelOperator`'s contract and declare the ``'deferred'``
capability: their fused passes are lazy
(:class:`~sketchot.kernels.base.DeferredPass`), so the solver's one iteration
(:func:`sketchot.solver.engine.iterate`) builds the passes between two convergence checks
without computing them, then computes them in one go.

Low rank (``K = A B^T``): a pass over one side is ONE pass over the row chunks of ``A`` (or
``B``): each chunk's task runs the in-memory :func:`~sketchot.kernels.base.matrix_fused_pass`
on its rows (products, ratios and the partial projection ``F_chunk^T ratios`` together) and
returns the partial projection and its count of bad entries; a tree of additions reduces
them. Between half-steps the state is rank-sized, so the passes are tasks of one raw graph
(:class:`PassGraph`), each taking the previous pass's partial sums by key: the iterations of
a check block cost ONE scheduler call. The ratios (the scalings ``u``, ``v``) are never
stored: :class:`LazyRatios` is a chunk-local function of the rank-sized input, a Dask array
once that input is known.

Exact: each pass streams the true kernel per row chunk; its ``m``-sized projection stays on
the cluster (persisted, so with a distributed client the passes are queued, not waited for).
The log-stable solve runs the same kernel on a :class:`DaskStableExact` placement
(:func:`log_stable_kernel`: immediate passes, log-domain and absorbed forms), which shares
the persisted target cloud.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import dask
import dask.array as da
import dask.threaded
import numpy as np
from dask.array.utils import meta_from_array

from .._validation import describe
from ..gibbs import block_rows, gibbs_softmax_average, neg_cost_over_reg, row_slices
from ..kernels.base import (
    DeferredPass,
    FusedPass,
    ProjectedOnRead,
    RatioStep,
    blocked_fused_pass,
    identity_pass,
    matrix_fused_pass,
    ratios_and_bad,
    refuse_log,
)
from ..kernels.exact import AbsorbedExactKernel, ExactKernel, ExactPlacement
from ..kernels.lowrank import FactorMaps, FactorPlacement, LowRankKernel
from .geometry import SPLIT_EVERY, DaskGibbsGeometry, persist_now

#: Most passes chained in one graph before it is computed (50 iterations): a graph holds
#: about ``chunks + 2`` tasks per pass, and each cut costs one scheduler call.
MAX_CHAINED_PASSES = 100


def _power_of(step: RatioStep) -> float:
    """The power of a marginal step; a bounded step (a total-variation penalty) is refused:
    the passes ship only a power to the workers."""
    if step.bounded:
        raise NotImplementedError(
            "a bounded marginal step (unbalanced_type='TV') does not run on Dask arrays yet; "
            "use unbalanced_type='KL' or in-memory arrays"
        )
    return float(step.power)


def _ratios(numerator: np.ndarray, products: np.ndarray, exponent: float = 1.0) -> np.ndarray:
    return ratios_and_bad(numerator, products, RatioStep(exponent))[0]


def _bad(numerator: np.ndarray, products: np.ndarray) -> np.ndarray:
    return ratios_and_bad(numerator, products)[1]


def _add(*parts: np.ndarray) -> np.ndarray:
    total = parts[0].copy()
    for part in parts[1:]:
        total += part
    return total


# ------------------------------------------------------------------ lazy values in a graph
class PassGraph:
    """A raw task graph of passes over row chunks, computed in ONE scheduler call.

    The hot path of every iteration, so the graph is written directly (one task per chunk, a
    tree of additions ``SPLIT_EVERY`` at a time): no collection optimisation on the client,
    ~half the latency of the array expression. A task's input may be the key of an earlier
    task, so passes chain without a round trip. Task names are content hashes, so a repeated
    pass is the same graph. Once computed, a graph takes no more tasks: every :class:`Lazy`
    in it has its value, and later passes start from those values.
    """

    def __init__(self) -> None:
        self.graph: dict[Any, Any] = {}
        self.arrays: dict[str, da.Array] = {}
        self.pending: list[Lazy] = []
        self.passes = 0

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
    ) -> Lazy:
        """``sum_i function(*chunks_i, *shared)`` over the row chunks, lazily."""
        parts = self.partial_sums(function, row_arrays, shared)
        return Lazy(self, self.task(_add, *parts), parts)

    @staticmethod
    def compute(graphs: list[PassGraph]) -> None:
        """Every pending value of ``graphs``, from one call to the current scheduler."""
        from dask.base import get_scheduler

        graph: dict[Any, Any] = {}
        arrays: dict[str, da.Array] = {}
        pending: list[Lazy] = []
        for part in graphs:
            graph.update(part.graph)
            arrays.update(part.arrays)
            pending += part.pending
            part.pending = []
        keys = list(dict.fromkeys(lazy.key for lazy in pending))
        scheduler = get_scheduler(collections=list(arrays.values())) or dask.threaded.get
        values = dict(zip(keys, scheduler(graph, keys), strict=True))
        for lazy in pending:
            lazy.value = values[lazy.key]
            lazy.graph = None


class Lazy:
    """A value of a :class:`PassGraph`: its key (and, for a sum, the keys of the partial sums
    adding up to it) until the graph is computed, then the value itself."""

    def __init__(self, graph: PassGraph, key: Any, parts: list[Any] | None = None) -> None:
        self.graph: PassGraph | None = graph
        self.key = key
        self.parts = parts
        self.value: Any = None
        graph.pending.append(self)

    @property
    def pending(self) -> bool:
        """Whether the value is still a key of an uncomputed graph."""
        return self.graph is not None

    def result(self) -> Any:
        """The value (its graph is computed if it was not)."""
        if self.graph is not None:
            PassGraph.compute([self.graph])
        return self.value

    def summands(self) -> list[Any]:
        """What a task adds up to get this sum: the partial sums' keys, or the value."""
        return list(self.parts) if self.pending else [self.value]


class LazyCount:
    """The count of bad entries stored last in a pass total."""

    def __init__(self, total: Lazy) -> None:
        self.total = total

    def result(self) -> int:
        return int(np.asarray(self.total.result())[0, -1])


def _graph_of(value: Any) -> PassGraph | None:
    if isinstance(value, LazyCount):
        value = value.total
    return value.graph if isinstance(value, Lazy) else None


def evaluate(*values: Any) -> list[Any]:
    """The values of :class:`Lazy` values and counts (anything else passes through): every
    graph they belong to, in one scheduler call."""
    graphs = list({id(g): g for g in map(_graph_of, values) if g is not None}.values())
    if graphs:
        PassGraph.compute(graphs)
    return [value.result() if isinstance(value, Lazy | LazyCount) else value for value in values]


def _leading(total: Any, rank: int) -> np.ndarray:
    """``w``: the first ``rank`` entries of a total ``(1, r [+ 1])`` (a pass's projection and
    count of bad entries, or a projection), or a vector."""
    total = np.asarray(total, dtype=np.float64)
    return (total[0] if total.ndim == 2 else total)[:rank]


# ----------------------------------------------------------------------------- chunk tasks
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


def _tree_sum(partials: da.Array) -> da.Array:
    """Sum of per-chunk rows ``(chunks, k) -> (k,)`` by a tree reduction."""
    return partials.sum(axis=0, split_every=SPLIT_EVERY)


def _align(vector: Any, chunks: tuple[int, ...], name: str) -> da.Array:
    """A 1-D Dask array in float64 with the given chunks (a NumPy array is wrapped)."""
    if isinstance(vector, LazyVector):
        vector = vector.to_dask()
    length = sum(chunks)
    if getattr(vector, "ndim", None) != 1 or vector.shape[0] != length:
        raise ValueError(
            f"{name} must be a vector of length {length}; got shape {getattr(vector, 'shape', ())}"
        )
    if not hasattr(vector, "chunks"):
        return da.from_array(np.asarray(vector, dtype=np.float64), chunks=(chunks,))
    return vector.astype(np.float64).rechunk((chunks,))


#: The exponent of each residual norm (:data:`sketchot.solver.engine.NORMS`).
NORM_POWERS = {"l2": 2, "l1": 1}


def _scaled_norm_parts(values: np.ndarray, norm: str = "l2") -> list[float]:
    """``[max |x|, sum |x / max|^p]`` of one chunk, ``p`` the norm's power (0 for the sum
    when the max is 0 or not finite)."""
    top = float(np.max(np.abs(values))) if values.size else 0.0
    if not np.isfinite(top) or top == 0.0:
        return [top, 0.0]
    return [top, float(np.sum(np.abs(values / top) ** NORM_POWERS[norm]))]


def _norm_of_chunks(*parts: list[float], norm: str = "l2") -> float:
    """The norm from per-chunk ``[max, sum |x / max|^p]``, scaled by the largest entry (no
    overflow; as the solver's residual)."""
    top = max(part[0] for part in parts)
    if not np.isfinite(top) or top == 0.0:
        return top
    power = NORM_POWERS[norm]
    total = sum(part * (peak / top) ** power for peak, part in parts)
    return top * float(total ** (1.0 / power))


def _residual_values(
    numerator: np.ndarray, products: np.ndarray, scaling: np.ndarray, exponent: float
) -> np.ndarray:
    """``products * scaling - products * ratios`` where the numerator is positive, 0
    elsewhere (the solver's residual, chunk by chunk)."""
    ratios = _ratios(numerator, products, exponent)
    return np.where(numerator > 0, products * scaling - products * ratios, 0.0)


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


def _pass_chunk(
    F: np.ndarray, numerator: np.ndarray, dtype: np.dtype, exponent: float, *w_parts: Any
) -> np.ndarray:
    """``[F^T ratios, n_bad]`` of one chunk, shape (1, r + 1), by the in-memory pass, with
    ``w`` the first ``r`` entries of the sum of ``w_parts`` (the previous pass's partial
    sums, added in the same order on every chunk, or its total)."""
    w = _leading(_add(*w_parts), F.shape[1])
    result = matrix_fused_pass(F, w, numerator, dtype, RatioStep(exponent))
    return np.append(result.projection, result.n_bad)[None, :]


def _project_chunk(F: np.ndarray, values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return (values.astype(dtype) @ F).astype(np.float64)[None, :]


def _products_chunk(F: np.ndarray, w: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return (F @ w.astype(dtype, copy=False)).astype(np.float64, copy=False)


def _low_rank_residual_chunk(
    F: np.ndarray,
    numerator: np.ndarray,
    scaling: np.ndarray,
    total: np.ndarray,
    dtype: np.dtype,
    exponent: float,
    norm: str = "l2",
) -> list[float]:
    """:func:`_scaled_norm_parts` of the residual on one chunk in ``norm``, with products
    ``F w`` (``w`` from the pass input ``total``) and ``scaling`` either the chunk's values
    or, given as a total ``(1, r [+ 1])``, the ratios of a pass with that input."""
    rank = F.shape[1]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        products = _products_chunk(F, _leading(total, rank), dtype)
        if scaling.ndim == 2:
            scaling = _ratios(
                numerator, _products_chunk(F, _leading(scaling, rank), dtype), exponent
            )
        return _scaled_norm_parts(_residual_values(numerator, products, scaling, exponent), norm)


def _input_of(w: Any) -> tuple[PassGraph | None, list[Any]]:
    """``(graph, summands)`` of a pass input: a pending :class:`Lazy` sum chains into its
    graph; a computed one, or a vector, starts a new graph."""
    if isinstance(w, Lazy):
        return w.graph, w.summands()
    return None, [np.asarray(w, dtype=np.float64).reshape(1, -1)]


def _value_arg(value: Any, graph: PassGraph) -> Any:
    """A :class:`Lazy` as a task argument of ``graph``: its key while pending there, else
    its value."""
    if isinstance(value, Lazy):
        if value.pending and value.graph is not graph:
            value.result()
        return value.key if value.pending else value.value
    return np.asarray(value, dtype=np.float64)


def _quietly(ufunc: np.ufunc, *blocks: Any) -> np.ndarray:
    with np.errstate(all="ignore"):
        return ufunc(*blocks)


class LazyVector(ABC):
    """A lazy ``n``- or ``m``-sized vector of a deferred pass (a pass's ratios): a Dask array
    once asked for (:meth:`to_dask`). NumPy ufuncs and functions apply to that array, ufuncs
    block by block with floating-point warnings off, as the solver's ``np.errstate`` does in
    memory (``np.log`` of the zero scalings of zero weights)."""

    @abstractmethod
    def to_dask(self) -> da.Array:
        """The vector as a Dask array."""

    @staticmethod
    def _unwrap(values: Any) -> tuple[Any, ...]:
        return tuple(v.to_dask() if isinstance(v, LazyVector) else v for v in values)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        inputs = self._unwrap(inputs)
        if method != "__call__" or kwargs:
            return getattr(ufunc, method)(*inputs, **kwargs)
        probes = [np.ones(1, x.dtype) if hasattr(x, "dtype") else x for x in inputs]
        dtype = _quietly(ufunc, *probes).dtype
        return da.map_blocks(_quietly, ufunc, *inputs, dtype=dtype)

    def __array_function__(self, func, types, args, kwargs):
        return func(*self._unwrap(args), **kwargs)


class DaskVector(LazyVector):
    """A Dask vector as a :class:`LazyVector` (the exact kernel's ratios)."""

    def __init__(self, array: da.Array) -> None:
        self.array = array
        self.shape, self.ndim, self.dtype = array.shape, 1, array.dtype

    def to_dask(self) -> da.Array:
        return self.array


class LazyRatios(LazyVector):
    """A low-rank pass's ratios ``(numerator / (F w))^exponent`` (0 where the product is not
    healthy), ``w`` the pass's rank-sized input, possibly not computed yet: a chunk-local
    recomputation (``O(chunk r)``) once ``w`` is known (computed first if needed)."""

    def __init__(
        self, kernel: LowRankKernel, side: str, w: Any, numerator: da.Array, exponent: float
    ) -> None:
        self.kernel, self.side, self.w = kernel, side, w
        self.numerator, self.exponent = numerator, exponent
        self.shape, self.ndim, self.dtype = numerator.shape, 1, np.dtype(np.float64)
        self._array: da.Array | None = None

    def to_dask(self) -> da.Array:
        """The ratios as a lazy Dask vector."""
        if self._array is None:
            factor = self.kernel.factor(self.side)
            w = self.w.result() if isinstance(self.w, Lazy) else self.w
            w = _leading(w, factor.shape[1]).copy()
            products = per_chunk(_products_chunk, [factor], (w, self.kernel.dtype), None)
            self._array = da.map_blocks(
                _ratios, self.numerator, products, self.exponent, dtype=np.float64
            )
        return self._array

    def __repr__(self) -> str:
        return f"<LazyRatios {self.side} of length {self.shape[0]}>"


class ChainedPass(DeferredPass):
    """A low-rank pass in a :class:`PassGraph` (see :class:`DeferredPass`): ``projection``
    is the lazy total ``[F^T ratios, n_bad]``, ``ratios`` a :class:`LazyRatios`."""

    def __init__(
        self,
        kernel: LowRankKernel,
        side: str,
        w: Any,
        numerator: da.Array,
        exponent: float,
        total: Lazy,
    ) -> None:
        self.kernel, self.side, self.w, self.numerator = kernel, side, w, numerator
        self.exponent = exponent
        self.projection = total
        self.ratios = LazyRatios(kernel, side, w, numerator, exponent)
        self.n_bad = LazyCount(total)

    def _products(self) -> da.Array:
        w = _leading(self.w.result() if isinstance(self.w, Lazy) else self.w, self.kernel.rank)
        factor = self.kernel.factor(self.side)
        return per_chunk(_products_chunk, [factor], (w.copy(), self.kernel.dtype), None)

    @property
    def products(self) -> da.Array:
        return self._products()

    @property
    def bad(self) -> da.Array:
        return da.map_blocks(_bad, self.numerator, self._products(), dtype=bool)

    def residual(self, scaling: Any, norm: str = "l2") -> Lazy:
        factor = self.kernel.factor(self.side)
        graph = self.projection.graph or (self.w.graph if isinstance(self.w, Lazy) else None)
        graph = graph or PassGraph()
        w = _value_arg(self.w, graph)
        if isinstance(scaling, LazyRatios) and scaling.kernel is self.kernel:
            scalings = [_value_arg(scaling.w, graph)] * factor.numblocks[0]
        else:
            scalings = graph.blocks(_align(scaling, factor.chunks[0], "scaling"))
        chunks = zip(graph.blocks(factor), graph.blocks(self.numerator), scalings, strict=True)
        parts = [
            graph.task(_low_rank_residual_chunk, F, b, s, w, self.kernel.dtype, self.exponent, norm)
            for F, b, s in chunks
        ]
        return Lazy(graph, graph.task(_norm_of_parts, norm, *parts))

    def evaluate(self, *values: Any) -> list[Any]:
        return evaluate(*values)


class DaskFactors(FactorPlacement):
    """The placement of a :class:`~sketchot.kernels.LowRankKernel` whose factors ``A``
    (n x r) and ``B`` (m x r) are persisted Dask arrays: its products, passes and
    out-of-sample maps run on the cluster, and its passes are lazy (the kernel declares
    ``'deferred'``). The kernel's ``left`` and ``right`` are chunked as ``X`` and ``Y`` by
    rows, persisted, in ``dtype`` (:func:`dask_factors`); ``factors`` gives them, never
    gathered.

    Notes
    -----
    Worker memory: ``(chunk_rows r itemsize)`` per factor chunk held, ``O((n + m) r)`` over the
    cluster. A fused pass costs ``O(n r)`` work over the workers and moves ``O(r)`` floats per
    chunk; the client receives ``r + 1`` numbers per pass, once per check block.
    """

    deferred = True

    def hold(self, factor: da.Array, dtype: Any) -> da.Array:
        """The persisted Dask factor itself (never gathered)."""
        return factor

    def to_host(self, held: da.Array, dtype: Any) -> da.Array:
        """The Dask factor itself: ``left`` and ``right`` stay on the cluster."""
        return held

    # ------------------------------------------------------------- products
    def operand(self, values: Any, length: int, name: str) -> Any:
        """The values as given (NumPy or Dask): :meth:`_small` checks their shape."""
        return values

    def _small(self, factor: da.Array, values: Any, dtype: Any) -> np.ndarray:
        """``factor^T values`` (r x k), reduced over chunks and brought to the client."""
        if np.ndim(values) == 1:
            return self.project_now(factor, _align(values, factor.chunks[0], "values"), dtype)
        if np.ndim(values) != 2 or values.shape[0] != factor.shape[0]:
            raise ValueError(
                f"values must have shape ({factor.shape[0]},) or ({factor.shape[0]}, k); "
                f"got shape {np.shape(values)}"
            )
        values = _as_dask(values).rechunk((factor.chunks[0], -1))
        return (factor.T.astype(np.float64) @ values).compute()

    def project_now(self, factor: da.Array, values: da.Array, dtype: Any) -> np.ndarray:
        """``factor^T values``, computed."""
        graph = PassGraph()
        total = graph.sum_over_chunks(_project_chunk, [factor, values], (dtype,))
        return _leading(total.result(), factor.shape[1])

    def product(self, first: da.Array, second: da.Array, values: Any, dtype: Any) -> da.Array:
        """``first (second^T values)``: ``second^T values`` is reduced to the client
        (``r x k``), then broadcast."""
        inner = self._small(second, values, dtype)
        return first.astype(np.float64) @ inner

    def rows(self, left: da.Array, right: da.Array, index: np.ndarray) -> np.ndarray:
        return (left[index] @ right.T).astype(np.float64).compute()

    def apply_new(self, kernel: LowRankKernel, points: Any, values: Any, side: str) -> Any:
        """Out-of-sample products; ``points`` may be a Dask array (then the result is one)."""
        if side not in ("source", "target"):
            raise ValueError(f"side must be 'source' or 'target'; got {side!r}")
        transpose = side == "target"
        fitted_other = kernel.left if transpose else kernel.right
        feature_map, projection = kernel.new_points_map(side)
        inner = self._small(fitted_other, values, kernel.dtype).astype(kernel.dtype)
        if projection is not None:
            inner = projection.astype(kernel.dtype, copy=False) @ inner
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

    # -------------------------------------------------------- fused passes
    def fused_pass(
        self,
        kernel: LowRankKernel,
        side: str,
        factor: da.Array,
        w: Any,
        numerator: Any,
        step: RatioStep,
    ) -> ChainedPass:
        """One lazy pass over the chunks of ``A`` (``'rows'``) or ``B`` (``'cols'``).

        ``w`` is a rank-sized vector or the ``projection`` of an earlier pass (then this pass
        is chained into that pass's graph, unless :data:`MAX_CHAINED_PASSES` are there
        already: the graph is then computed first); ``numerator`` a Dask vector.
        """
        numerator = _align(numerator, factor.chunks[0], "numerator")
        graph, summands = _input_of(w)
        if graph is not None and graph.passes >= MAX_CHAINED_PASSES:
            PassGraph.compute([graph])
            graph, summands = _input_of(w)
        graph = graph or PassGraph()
        exponent = _power_of(step)
        total = graph.sum_over_chunks(
            _pass_chunk, [factor, numerator], (kernel.dtype, exponent, *summands)
        )
        graph.passes += 1
        return ChainedPass(kernel, side, w, numerator, exponent, total)

    def project(self, kernel: LowRankKernel, factor: da.Array, values: Any, index: Any) -> Lazy:
        """``F^T values`` over every row, lazily (a sum that :meth:`fused_pass` takes as
        ``w``; ``.result()[0]`` computes it); ``index`` is not supported."""
        if index is not None:
            raise NotImplementedError(
                "project(side, values, index) with an index is not available on Dask arrays"
            )
        values = _align(values, factor.chunks[0], "values")
        return PassGraph().sum_over_chunks(_project_chunk, [factor, values], (kernel.dtype,))


def dask_low_rank_from_maps(geometry: DaskGibbsGeometry, maps: FactorMaps) -> LowRankKernel:
    """The low-rank operator of fitted maps on Dask arrays: its factors built chunk by chunk
    on the workers (:func:`dask_factors`), its placement :class:`DaskFactors`."""
    left, right = dask_factors(geometry, maps.left_factor, maps.right_factor, maps.dtype)
    operator = LowRankKernel(
        geometry, maps.info, left, right, **maps.operator_arguments(), placement=DaskFactors()
    )
    for name, value in maps.attributes.items():
        setattr(operator, name, value)
    return operator


# ---------------------------------------------------------------------------- exact
def _exact_block(Xc, x_sq, Yc, y_sq, reg, dtype, cost):
    """The function giving the rows ``K[rows]`` of a chunk (computed, never stored)."""

    def block_of(rows: slice) -> np.ndarray:
        block = neg_cost_over_reg(Xc[rows], Yc, reg, x_sq[rows], y_sq, dtype, cost=cost)
        return np.exp(block, out=block)

    return block_of


def _exact_slices(n_rows: int, m: int, dtype: Any) -> list[slice]:
    return list(row_slices(n_rows, block_rows(m, np.dtype(dtype).itemsize)))


def _exact_pass_chunk(Xc, x_sq, numerator, Yc, y_sq, w, reg, dtype, exponent, cost):
    """``[K_chunk^T ratios, n_bad]`` (1, m + 1), streamed in row blocks of the chunk."""
    m = Yc.shape[0]
    result = blocked_fused_pass(
        _exact_slices(Xc.shape[0], m, dtype),
        _exact_block(Xc, x_sq, Yc, y_sq, reg, dtype, cost),
        Xc.shape[0],
        m,
        w,
        numerator,
        np.dtype(dtype),
        RatioStep(exponent),
    )
    return np.append(result.projection, result.n_bad)[None, :]


def _exact_matmat_chunk(Xc, x_sq, Yc, y_sq, V, reg, dtype, cost) -> np.ndarray:
    """``K_chunk V`` (V of shape (m, k)) streamed in row blocks."""
    block_of = _exact_block(Xc, x_sq, Yc, y_sq, reg, dtype, cost)
    out = np.empty((Xc.shape[0], V.shape[1]))
    V = V.astype(dtype, copy=False)
    for rows in _exact_slices(Xc.shape[0], Yc.shape[0], dtype):
        out[rows] = block_of(rows) @ V
    return out


def _exact_rmatmat_chunk(Xc, x_sq, U, Yc, y_sq, reg, dtype, cost) -> np.ndarray:
    """``K_chunk^T U_chunk`` flattened to (1, m k), streamed in row blocks."""
    block_of = _exact_block(Xc, x_sq, Yc, y_sq, reg, dtype, cost)
    out = np.zeros((Yc.shape[0], U.shape[1]))
    U = U.astype(dtype, copy=False)
    for rows in _exact_slices(Xc.shape[0], Yc.shape[0], dtype):
        out += block_of(rows).T @ U[rows]
    return out.reshape(1, -1)


def _residual_chunk(numerator, products, scaling, exponent, norm) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        values = _residual_values(numerator, products, scaling, exponent)
        return np.array([_scaled_norm_parts(values, norm)])


def _norm_of_parts(norm: str, *parts: list[float]) -> float:
    return _norm_of_chunks(*parts, norm=norm)


def _norm_of_rows(parts: np.ndarray, norm: str) -> float:
    return _norm_of_chunks(*parts.tolist(), norm=norm)


class ArrayPass(DeferredPass):
    """A pass whose members are Dask collections (see :class:`DeferredPass`); what the next
    pass reads is persisted, so with a distributed client the passes are queued on the
    cluster and only :meth:`evaluate` waits."""

    def __init__(self, products, ratios, projection, bad, n_bad, numerator, exponent) -> None:
        self.products, self.ratios, self.projection = products, ratios, projection
        self.bad, self.n_bad = bad, n_bad
        self.numerator, self.exponent = numerator, exponent

    def residual(self, scaling: Any, norm: str = "l2") -> Any:
        chunks = self.numerator.chunks[0]
        scaling = _align(scaling, chunks, "scaling")
        products = _align(self.products, chunks, "products")
        parts = da.map_blocks(
            _residual_chunk, self.numerator, products, scaling, self.exponent, norm,
            chunks=((1,) * self.numerator.numblocks[0], (2,)), new_axis=1, dtype=np.float64,
        )  # fmt: skip
        return dask.delayed(_norm_of_rows, pure=True)(parts, norm)

    def evaluate(self, *values: Any) -> list[Any]:
        lazy = [i for i, value in enumerate(values) if dask.is_dask_collection(value)]
        computed = dask.compute(*(values[i] for i in lazy))
        out = list(values)
        for i, value in zip(lazy, computed, strict=True):
            out[i] = value
        return out


def _softmax_chunk(Xc, Yc, log_w, values, reg, cost) -> np.ndarray:
    return gibbs_softmax_average(Xc, Yc, reg, log_w, values, cost=cost)


def _column_logits(Xc, log_w, Yc, y_sq, reg, cost):
    """``(rows, log_w_i - c(x_i, y_j) / reg)`` of the chunk's row blocks (about 16 MB each)."""
    for rows in row_slices(Xc.shape[0], block_rows(Yc.shape[0], dim=Xc.shape[1])):
        logits = neg_cost_over_reg(Xc[rows], Yc, reg, y_sq=y_sq, cost=cost)
        logits += log_w[rows, None]
        yield rows, logits


def _column_max_chunk(Xc, log_w, Yc, y_sq, reg, cost) -> np.ndarray:
    """``(1, m)``: each column's largest logit over the chunk's rows."""
    top = np.full(Yc.shape[0], -np.inf)
    for _, logits in _column_logits(Xc, log_w, Yc, y_sq, reg, cost):
        np.maximum(top, logits.max(axis=0), out=top)
    return top[None, :]


def _column_sums_chunk(Xc, log_w, values, Yc, y_sq, top, reg, cost) -> np.ndarray:
    """``(1, m (k + 1))``: ``sum_i e^(logit_ij - top_j) [values_i, 1]`` over the chunk's
    rows, row-major (a column whose logits are all ``-inf`` sums to 0)."""
    m, k = Yc.shape[0], values.shape[1]
    shift = np.where(np.isfinite(top), top, 0.0)
    out = np.zeros((m, k + 1))
    for rows, logits in _column_logits(Xc, log_w, Yc, y_sq, reg, cost):
        logits -= shift[None, :]
        np.exp(logits, out=logits)
        out[:, :k] += logits.T @ values[rows]
        out[:, k] += logits.sum(axis=0)
    return out.reshape(1, -1)


def _as_dask(value: Any) -> da.Array:
    """A float64 Dask array (NumPy input wrapped in one chunk)."""
    if not hasattr(value, "chunks"):
        value = da.from_array(np.asarray(value, dtype=np.float64), chunks=-1)
    return value.astype(np.float64)


# ------------------------------------------------------------- exact, log-stable
def _delayed_whole(array: Any) -> Any:
    """One key holding ``array`` (a single-chunk Dask array, or NumPy): sent once to each
    worker that runs a task needing it, not embedded in every task."""
    if hasattr(array, "chunks"):
        return array.rechunk(-1).to_delayed().ravel()[0]
    return dask.delayed(np.ascontiguousarray(array, dtype=np.float64), pure=True)


def _absorbed_block(Xc, x_sq, alpha, Yc, y_sq, beta, reg, dtype, cost):
    """The rows of ``exp(max(alpha_i + beta_j - c(x_i, y_j) / reg, floor))`` of a chunk,
    by :class:`~sketchot.kernels.exact.AbsorbedExactKernel`'s rules: the product form of the
    exponents (``d + 2`` inner terms) for the squared distance with finite offsets,
    elementwise otherwise."""
    from ..kernels.exact import LOG_FLOOR

    floor = LOG_FLOOR[np.dtype(dtype)]
    factors = None
    if cost.sqeuclidean and np.isfinite(alpha).all() and np.isfinite(beta).all():
        left = np.column_stack([Xc * (2.0 / reg), alpha - x_sq / reg, np.ones(len(alpha))])
        right = np.column_stack([Yc, np.ones(len(beta)), beta - y_sq / reg]).T
        factors = (left, np.ascontiguousarray(right))

    def block_of(rows: slice) -> np.ndarray:
        if factors is not None:
            block = factors[0][rows] @ factors[1]
        else:
            with np.errstate(invalid="ignore"):
                block = neg_cost_over_reg(Xc[rows], Yc, reg, x_sq[rows], y_sq, cost=cost)
                block += alpha[rows, None]
                block += beta[None, :]
        np.maximum(block, floor, out=block)
        np.exp(block, out=block)
        return block if np.dtype(dtype) == np.float64 else block.astype(dtype)

    return block_of


def _absorbed_pass_chunk(
    Xc, x_sq, alpha, numerator, Yc, y_sq, beta, w, reg, dtype, exponent, cost
):  # fmt: skip
    """One chunk of an absorbed rows pass: ``([products, ratios, bad] (rows, 3),
    [K~_chunk^T ratios, n_bad] (1, m + 1))``, streamed in row blocks of the chunk."""
    m = Yc.shape[0]
    block_of = _absorbed_block(Xc, x_sq, alpha, Yc, y_sq, beta, reg, dtype, cost)
    result = blocked_fused_pass(
        list(row_slices(Xc.shape[0], block_rows(m, 8))), block_of, Xc.shape[0], m, w,
        numerator, np.dtype(dtype), RatioStep(exponent),
    )  # fmt: skip
    vectors = np.column_stack([result.products, result.ratios, result.bad.astype(np.float64)])
    ratios = result.ratios
    with np.errstate(invalid="ignore"):
        stats = [ratios.sum(), ratios.max(initial=-np.inf), ratios.min(initial=np.inf)]
    return vectors, np.concatenate([result.projection, [result.n_bad], stats])[None, :]


class ScalingVector(da.Array):
    """A row scaling on the cluster whose whole-array ``sum``, ``max`` and ``min`` were
    computed with the pass that made it: the absorbing strategy's tests after every
    iteration (finite, within ``[e^-tau, e^tau]``) then cost no scheduler call. Any other
    operation is the plain Dask array's."""

    def __new__(cls, array: da.Array, stats: dict[str, float]) -> ScalingVector:
        self = super().__new__(
            cls, array.dask, array.name, array.chunks, meta=meta_from_array(array)
        )
        self._stats = stats
        return self

    def _cached(self, name: str, args: tuple, kwargs: dict) -> Any:
        if not args and not kwargs and name in getattr(self, "_stats", {}):
            return np.float64(self._stats[name])
        return getattr(da.Array, name)(self, *args, **kwargs)

    def sum(self, *args: Any, **kwargs: Any) -> Any:
        return self._cached("sum", args, kwargs)

    def max(self, *args: Any, **kwargs: Any) -> Any:
        return self._cached("max", args, kwargs)

    def min(self, *args: Any, **kwargs: Any) -> Any:
        return self._cached("min", args, kwargs)


def _absorbed_project_chunk(Xc, x_sq, alpha, values, Yc, y_sq, beta, reg, dtype, cost):
    """``K~_chunk^T values_chunk`` (1, m), streamed in row blocks."""
    m = Yc.shape[0]
    block_of = _absorbed_block(Xc, x_sq, alpha, Yc, y_sq, beta, reg, dtype, cost)
    out = np.zeros(m)
    for rows in row_slices(Xc.shape[0], block_rows(m, 8)):
        out += values[rows].astype(dtype) @ block_of(rows)
    return out[None, :]


def _log_pass_chunk(Xc, numerator, Yc, log_w, reg, exponent, cost):
    """One chunk of a log-domain rows pass: ``[log K w, log ratios, bad]`` (rows, 3)."""
    from ..gibbs import gibbs_log_matvec
    from ..kernels.base import log_ratios_and_bad

    products = gibbs_log_matvec(Xc, Yc, reg, log_w, cost)
    ratios, bad = log_ratios_and_bad(numerator, products, RatioStep(exponent))
    return np.column_stack([products, ratios, bad.astype(np.float64)])


def _log_project_chunk(Xc, log_u, Yc, reg, cost):
    """``log sum_{i in chunk} exp(log_u_i - c(x_i, y_j) / reg)`` for every ``j``: (1, m)."""
    from ..gibbs import gibbs_log_matvec

    return gibbs_log_matvec(Yc, Xc, reg, log_u, cost.transposed())[None, :]


def _log_plan_chunk(Xc, x_sq, log_u, Yc, y_sq, log_v, reg, cost):
    """One chunk of the log-stable plan summary: ``row marginal`` (rows,) and
    ``[column marginal partial, <P_chunk, C_chunk>]`` (1, m + 1), with
    ``P_ij = exp(log_u_i + log_v_j - ||x_i - y_j||^2 / reg)`` streamed in row blocks (its
    entries are at most the plan's mass: no overflow at any reg)."""
    m = Yc.shape[0]
    rows_out = np.zeros(Xc.shape[0])
    cols = np.zeros(m + 1)
    finite_v = np.isfinite(log_v)
    lv = np.where(finite_v, log_v, 0.0)
    for rows in row_slices(Xc.shape[0], block_rows(m, 8)):
        logits = neg_cost_over_reg(Xc[rows], Yc, reg, x_sq[rows], y_sq, cost=cost)
        costs = np.maximum(-reg * logits, 0.0)
        lu = log_u[rows]
        finite_u = np.isfinite(lu)
        logits += np.where(finite_u, lu, 0.0)[:, None]
        logits += lv[None, :]
        logits[~finite_u] = -np.inf  # zero weights: no mass (never 0 * inf)
        logits[:, ~finite_v] = -np.inf
        plan = np.exp(logits, out=logits)
        rows_out[rows] = plan.sum(axis=1)
        cols[:m] += plan.sum(axis=0)
        cols[m] += float(np.sum(plan * costs))
    return rows_out, cols[None, :]


def _rows_of(parts: list[Any], chunks: tuple[int, ...], width: int | None) -> da.Array:
    """Dask array of per-chunk delayed row blocks."""
    arrays = [
        da.from_delayed(part, shape=(rows,) if width is None else (rows, width), dtype=np.float64)
        for part, rows in zip(parts, chunks, strict=True)
    ]
    return da.concatenate(arrays, axis=0)


class CountedPass(FusedPass):
    """A rows pass whose bad entries were counted with its projection (one computation)."""

    def __init__(self, products, ratios, projection, bad, count: int) -> None:
        super().__init__(products, ratios, projection, bad)
        object.__setattr__(self, "_count", count)

    @property
    def n_bad(self) -> int:
        return self._count


# ------------------------------------------------------------- exact: the placements
class DaskExact(ExactPlacement):
    """The placement of an :class:`~sketchot.kernels.ExactKernel` whose clouds are Dask
    arrays on a cluster (a :class:`~.geometry.DaskGibbsGeometry`): the kernel is never stored,
    every product streams its rows per row chunk of ``X`` on the workers, and each of those
    tasks receives the whole target cloud, persisted once as one chunk and shared by every
    kernel derived from it (``at_reg``, ``absorbed``, :func:`log_stable_kernel`).

    The two forms differ in their passes: :class:`DaskStreamedExact` (deferred, the plain
    iteration) and :class:`DaskStableExact` (immediate, the log-stable solve).

    Parameters
    ----------
    shared : DaskExact, optional
        A placement whose persisted target cloud this one uses (nothing is recomputed).

    Attributes
    ----------
    targets : tuple of dask.array.Array or None
        The centred targets ``Yc`` (m, d) and their squared norms ``y_sq`` (m,), each one
        persisted chunk (``None`` until a kernel is built on this placement).

    Notes
    -----
    ``O(n m d)`` work per product or pass over the workers; per task ``O(chunk d + m d)``
    memory plus a row block of about 16 MB. Meant for moderate ``m`` (the whole target cloud
    and an ``m``-vector go to every task).
    """

    stores_whole = False

    def __init__(self, shared: DaskExact | None = None) -> None:
        self.targets: tuple[da.Array, da.Array] | None = None
        self.targets_of: str | None = None
        if shared is not None:
            self.targets, self.targets_of = shared.targets, shared.targets_of

    def hold(self, kernel: ExactKernel) -> None:
        """Persist the whole target cloud as one chunk (unless this placement holds it
        already: the same clouds at another ``reg``). A placement holding another target
        cloud is refused: its chunk would silently answer for it."""
        g = kernel.geometry
        if self.targets_of is not None:
            if self.targets_of != g.Yc.name:
                raise ValueError(
                    "placement holds the persisted target cloud of another kernel; pass a new "
                    f"{type(self).__name__}() for a kernel of other clouds"
                )
            return
        # the whole target side as one chunk: every row task needs all of it
        self.targets = persist_now(g.Yc.rechunk({0: -1}), g.y_sq.rechunk(-1))
        self.targets_of = g.Yc.name

    def whole_targets(self) -> tuple[da.Array, da.Array]:
        """``(Yc, y_sq)``: the persisted whole target cloud and its squared norms."""
        if self.targets is None:
            raise RuntimeError("no kernel has been built on this placement yet")
        return self.targets

    def rows_per_block(self, kernel: ExactKernel) -> int:
        """Rows of a block streamed inside a task (about 16 MB)."""
        return block_rows(kernel.shape[1], kernel.dtype.itemsize)

    def stored(self, kernel: ExactKernel) -> Any:
        raise NotImplementedError("a kernel on Dask arrays is never stored whole")

    def time_one_pass(self, kernel: ExactKernel) -> None:
        """Not measured: a pass's time is the cluster's."""
        return None

    def computed_block(self, kernel: ExactKernel, rows: slice) -> Any:
        raise NotImplementedError("a kernel on Dask arrays computes its blocks on the workers")

    def operand(self, values: Any, length: int, name: str) -> Any:
        """The values as given (NumPy or Dask): each product aligns them to its chunks."""
        return values

    def matmat(self, kernel: ExactKernel, V: Any) -> da.Array:
        """``K V`` for ``V`` (m,) or (m, k): a Dask array (n,) or (n, k), streamed per row
        chunk."""
        V = _as_dask(V)
        if V.ndim == 1:
            return self._matmat_2d(kernel, V[:, None])[:, 0]
        return self._matmat_2d(kernel, V)

    def _matmat_2d(self, kernel: ExactKernel, V: da.Array) -> da.Array:
        g = kernel.geometry
        return per_chunk(
            _exact_matmat_chunk,
            [g.Xc, g.x_sq],
            (*self.whole_targets(), V.rechunk({0: -1, 1: -1}), g.reg, kernel.dtype, g.cost),
            V.shape[1],
        )

    def rows(self, kernel: ExactKernel, index: np.ndarray) -> np.ndarray:
        """``K[index]`` (gathered rows of ``X`` and the whole target cloud)."""
        g = kernel.geometry
        Yc, y_sq = dask.compute(*self.whole_targets())
        block = neg_cost_over_reg(g.rows("x", index), Yc, g.reg, y_sq=y_sq, cost=g.cost)
        return np.exp(block, out=block)

    def softmax_average(
        self, kernel: ExactKernel, log_weights: Any, values: Any, *, transpose: bool = False
    ) -> da.Array:
        """Streamed per row chunk on the workers: a Dask array (n, k), or (m, k) with
        ``transpose`` (:meth:`_softmax_over_sources`)."""
        if transpose:
            return self._softmax_over_sources(kernel, log_weights, values)
        g = kernel.geometry
        return per_chunk(
            _softmax_chunk,
            [g.Xc],
            (
                self.whole_targets()[0],
                _align(log_weights, (kernel.shape[1],), "log_weights"),
                _as_dask(values).rechunk({0: -1, 1: -1}),
                g.reg,
                g.cost,
            ),
            values.shape[1],
        )

    def _softmax_over_sources(self, kernel: ExactKernel, log_w: Any, values: Any) -> da.Array:
        """``sum_i softmax_i(log_w_i - c(x_i, y_j) / reg) values_i`` for every target ``y_j``
        (``log_w`` (n,) and ``values`` (n, k) on the rows' chunks): two tree reductions over
        the row chunks, the columns' maxima first, then the shifted sums (each column's sum
        is at least 1: no underflow at any ``reg``). A Dask array (m, k) on the targets'
        chunks; ``O(m (k + 1))`` floats from each task, twice the products' work."""
        g = kernel.geometry
        Yc, y_sq = self.whole_targets()
        log_w = _align(log_w, g.Xc.chunks[0], "log_weights")
        values = _as_dask(values).rechunk((g.Xc.chunks[0], -1))
        m, k = kernel.shape[1], values.shape[1]
        maxima = per_chunk(
            _column_max_chunk, [g.Xc, log_w], (Yc, y_sq, g.reg, g.cost), m, partial=True
        )
        # lazy, in the same graph as the sums: a persisted copy would be released with this
        # frame before the caller computes
        top = maxima.max(axis=0, split_every=SPLIT_EVERY).rechunk(-1)
        partials = per_chunk(
            _column_sums_chunk,
            [g.Xc, log_w, values],
            (Yc, y_sq, top, g.reg, g.cost),
            m * (k + 1),
            partial=True,
        )
        sums = _tree_sum(partials).reshape(m, k + 1)
        mapped = sums[:, :k] / sums[:, k:]
        return mapped.rechunk((g.Yc.chunks[0], k))

    def log_matvec(
        self, kernel: ExactKernel, log_w: np.ndarray, *, transpose: bool, rows: Any
    ) -> np.ndarray:
        raise NotImplementedError(
            f"{type(self).__name__} runs no log-domain products (log_stable_kernel's does, "
            "over the columns)"
        )

    def apply_new(
        self, kernel: ExactKernel, points: np.ndarray, values: np.ndarray, transpose: bool
    ) -> np.ndarray:
        raise NotImplementedError("the exact kernel on Dask arrays has no out-of-sample products")

    def absorbed_block(self, kernel: AbsorbedExactKernel, rows: slice, out: Any) -> Any:
        raise NotImplementedError("a kernel on Dask arrays computes its blocks on the workers")

    def absorbed_rows(self, kernel: AbsorbedExactKernel, index: np.ndarray) -> np.ndarray:
        raise NotImplementedError("the absorbed Dask kernel runs the solver's passes only")


class DaskStreamedExact(DaskExact):
    """The exact kernel on a cluster for the plain (multiplicative) iteration: its passes are
    deferred (``'deferred'``: :class:`ArrayPass`), so the solver builds the passes between two
    convergence checks and computes them in one go.

    ``K = L R^T`` with ``L = K`` and ``R = I``: a rows pass gives each task one row chunk of
    ``X`` and the whole of ``Y``, computes ``K_chunk`` block by block and returns
    ``K_chunk^T ratios`` (``m``); a tree reduction adds them into an ``m``-sized projection
    that stays on the cluster (persisted), with the count of bad entries. Products are Dask
    arrays; ``K^T U`` is tree-reduced over the row chunks. Any metric of the geometry.
    """

    def capabilities(self, kernel: ExactKernel, capabilities: frozenset) -> frozenset:
        # lazy linear passes only: the log-stable solve runs on log_stable_kernel's form
        return capabilities - {"absorb", "log_products", "out_of_sample"} | {"deferred"}

    def rmatmat(self, kernel: ExactKernel, U: Any) -> da.Array:
        """``K^T U`` (m,) or (m, k), a lazy tree sum over the row chunks."""
        g = kernel.geometry
        U = _as_dask(U)
        vector = U.ndim == 1
        U2 = (U[:, None] if vector else U).rechunk((g.Xc.chunks[0], -1))
        k = U2.shape[1]
        partials = per_chunk(
            _exact_rmatmat_chunk,
            [g.Xc, g.x_sq, U2],
            (*self.whole_targets(), g.reg, kernel.dtype, g.cost),
            kernel.shape[1] * k,
            partial=True,
        )
        total = _tree_sum(partials)  # K^T U flattened row-major: m rows of k
        m = kernel.shape[1]
        return total.reshape(m) if vector else total.reshape(m, k)

    def fused_pass(
        self,
        kernel: ExactKernel,
        side: str,
        w: Any,
        numerator: Any,
        *,
        log: bool,
        step: RatioStep,
    ) -> ArrayPass:
        """Rows: :meth:`linear_pass`. Cols: ``R = I``, elementwise on the ``m``-vector ``w``
        (the ratios persisted: they are the next pass's input)."""
        refuse_log(kernel, log)
        if side == "rows":
            return self.linear_pass(kernel, w, numerator, step)
        exponent = _power_of(step)
        chunks = kernel.geometry.Yc.chunks[0]
        numerator = _align(numerator, chunks, "numerator")
        products = _align(w, chunks, "w")
        ratios = da.map_blocks(_ratios, numerator, products, exponent, dtype=np.float64)
        bad = da.map_blocks(_bad, numerator, products, dtype=bool)
        ratios, count = dask.persist(ratios, bad.sum())
        return ArrayPass(products, DaskVector(ratios), ratios, bad, count, numerator, exponent)

    def linear_pass(self, kernel: ExactKernel, w: Any, numerator: Any, step: RatioStep) -> Any:
        """One streamed rows pass, deferred: the projection ``K^T ratios`` (persisted,
        ``m``-sized) and its count of bad entries; products, ratios and bad entries lazy."""
        g = kernel.geometry
        exponent = _power_of(step)
        numerator = _align(numerator, g.Xc.chunks[0], "numerator")
        m = kernel.shape[1]
        w = _align(w, (m,), "w")
        partials = per_chunk(
            _exact_pass_chunk,
            [g.Xc, g.x_sq, numerator],
            (*self.whole_targets(), w, g.reg, kernel.dtype, exponent, g.cost),
            m + 1,
            partial=True,
        )
        total = _tree_sum(partials)
        projection, count = dask.persist(total[:m], total[m])
        products = self._matmat_2d(kernel, w[:, None])[:, 0]
        ratios = da.map_blocks(_ratios, numerator, products, exponent, dtype=np.float64)
        bad = da.map_blocks(_bad, numerator, products, dtype=bool)
        return ArrayPass(products, DaskVector(ratios), projection, bad, count, numerator, exponent)

    def project(self, kernel: ExactKernel, side: str, values: Any, index: Any, *, log: bool):
        """``K^T values`` (rows; persisted) or ``values`` itself (cols)."""
        refuse_log(kernel, log)
        _refuse_index(index)
        if side == "cols":
            return values
        return kernel.rmatmat(values).persist()

    def hold_absorbed(self, kernel: Any, parent: Any, previous: Any) -> None:
        raise NotImplementedError(
            "the deferred Dask kernel has no absorbed form; its log-stable form "
            "(log_stable_kernel) has"
        )


class DaskStableExact(DaskExact):
    """The exact kernel on a cluster for the solver's log-stable strategies (``'absorb'`` and
    ``'log_products'``, with ``at_reg`` for an epsilon schedule), usually made from a
    :class:`DaskStreamedExact` kernel by :func:`log_stable_kernel` (sharing its persisted
    target cloud).

    Its passes are immediate (not ``'deferred'``): the absorbing strategy tests the scalings
    after every iteration, and each pass streams ``O(n m d)`` entries, so one scheduler call
    per half-step costs nothing in comparison. The rows side (``n``-sized: scalings,
    products, offsets ``alpha``) stays on the cluster as persisted Dask vectors; the columns
    side (``m``-sized: a pass's projection, the column scalings, ``beta``) is a NumPy vector
    on the client, as every row task receives the whole target cloud anyway. Per pass each
    row chunk returns ``O(m)`` floats. A linear pass of the kernel itself is the absorbed
    pass with zero offsets; an absorbed kernel
    (:class:`~sketchot.kernels.exact.AbsorbedExactKernel` on this placement) holds ``alpha``
    persisted on the rows' chunks and ``beta`` as an ``m``-vector sent once to each worker
    per pass, never stored, with the in-memory floor and product form of the exponents.
    """

    def capabilities(self, kernel: ExactKernel, capabilities: frozenset) -> frozenset:
        # no out-of-sample products on Dask arrays
        return capabilities - {"out_of_sample"}

    # ------------------------------------------------------------- offsets
    def offsets(self, parent: ExactKernel, alpha: Any, beta: Any) -> tuple[da.Array, np.ndarray]:
        """``alpha`` persisted on the rows' chunks, ``beta`` an ``m``-vector on the client."""
        (alpha,) = persist_now(_align(alpha, parent.geometry.Xc.chunks[0], "alpha"))
        beta = np.asarray(beta.compute() if hasattr(beta, "chunks") else beta, dtype=np.float64)
        return alpha, beta

    def hold_absorbed(
        self, kernel: AbsorbedExactKernel, parent: ExactKernel, previous: Any
    ) -> None:
        """Nothing to hold: the absorbed kernel is never stored (``previous`` has nothing to
        reuse), its offsets are :meth:`offsets`'."""

    def _offsets_of(self, kernel: ExactKernel) -> tuple[da.Array, np.ndarray]:
        """The absorbed kernel's offsets, or zeros for the kernel itself."""
        if isinstance(kernel, AbsorbedExactKernel):
            return kernel.alpha, kernel.beta
        n, m = kernel.shape
        chunks = kernel.geometry.Xc.chunks[0]
        return self.offsets(kernel, da.zeros(n, chunks=(chunks,)), np.zeros(m))

    def _whole_y(self) -> tuple[Any, Any]:
        Yc, y_sq = self.whole_targets()
        return _delayed_whole(Yc), _delayed_whole(y_sq)

    def _chunks(self, kernel: ExactKernel, alpha: da.Array, *vectors: Any) -> list[Any]:
        g = kernel.geometry
        return [v.to_delayed().ravel() for v in (g.Xc, g.x_sq, alpha, *vectors)]

    # ------------------------------------------------------------- products
    def matmat(self, kernel: ExactKernel, V: Any) -> da.Array:
        if isinstance(kernel, AbsorbedExactKernel):
            raise NotImplementedError("the absorbed Dask kernel runs the solver's passes only")
        return super().matmat(kernel, V)

    def rmatmat(self, kernel: ExactKernel, U: Any) -> np.ndarray:
        """``K^T u`` (or ``K~^T u``) of a vector, gathered as an ``m``-vector."""
        if np.ndim(U) == 1:
            return self._absorbed_project(kernel, U)
        raise NotImplementedError("the absorbed Dask kernel runs the solver's passes only")

    def _absorbed_project(self, kernel: ExactKernel, values: Any) -> np.ndarray:
        """``K~^T values`` (m,), ``K~`` the kernel with its offsets (zeros for the kernel
        itself), streamed per row chunk and summed on the client."""
        g = kernel.geometry
        alpha, beta = self._offsets_of(kernel)
        values = _align(values, g.Xc.chunks[0], "values")
        Yc, y_sq = self._whole_y()
        beta = _delayed_whole(beta)
        task = dask.delayed(_absorbed_project_chunk, pure=True)
        parts = [
            da.from_delayed(
                task(x, xs, al, v, Yc, y_sq, beta, g.reg, kernel.dtype, g.cost),
                shape=(1, kernel.shape[1]),
                dtype=np.float64,
            )
            for x, xs, al, v in zip(*self._chunks(kernel, alpha, values), strict=True)
        ]
        return da.concatenate(parts, axis=0).sum(axis=0, split_every=SPLIT_EVERY).compute()

    def log_rmatvec(self, kernel: ExactKernel, log_u: Any) -> np.ndarray:
        """``log (K^T exp(log_u))`` (m,): per-chunk log-sum-exps combined on the client."""
        g = kernel.geometry
        Xc = g.Xc.to_delayed().ravel()
        lu = _align(log_u, g.Xc.chunks[0], "log_u").to_delayed().ravel()
        Yc, _ = self._whole_y()
        task = dask.delayed(_log_project_chunk, pure=True)
        parts = dask.compute(*[task(x, u, Yc, g.reg, g.cost) for x, u in zip(Xc, lu, strict=True)])
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.logaddexp.reduce(np.concatenate(parts, axis=0), axis=0)

    def log_matvec(
        self, kernel: ExactKernel, log_w: np.ndarray, *, transpose: bool, rows: Any
    ) -> np.ndarray:
        """Over the columns and every row only (:meth:`log_rmatvec`)."""
        if transpose and rows is None:
            return self.log_rmatvec(kernel, log_w)
        raise NotImplementedError(
            "log products on Dask arrays run over the columns and every row only"
        )

    # -------------------------------------------------------- passes
    def fused_pass(
        self,
        kernel: ExactKernel,
        side: str,
        w: Any,
        numerator: Any,
        *,
        log: bool,
        step: RatioStep,
    ) -> FusedPass:
        """Cols: elementwise on the client (``R = I``). Rows, ``log``: ``log K exp(w)`` and
        its log ratios per row chunk (persisted), the projection ``log K^T exp(ratios)`` when
        first read. Rows, linear: :meth:`linear_pass`."""
        if side == "cols":
            return identity_pass(np.asarray(w), np.asarray(numerator), log=log, step=step)
        if not log:
            return self.linear_pass(kernel, w, numerator, step)
        g = kernel.geometry
        exponent = _power_of(step)
        Xc = g.Xc.to_delayed().ravel()
        num = _align(numerator, g.Xc.chunks[0], "numerator").to_delayed().ravel()
        Yc, _ = self._whole_y()
        log_w = _delayed_whole(np.asarray(w, dtype=np.float64))
        task = dask.delayed(_log_pass_chunk, pure=True)
        parts = [
            task(x, c, Yc, log_w, g.reg, exponent, g.cost) for x, c in zip(Xc, num, strict=True)
        ]
        (vectors,) = persist_now(_rows_of(parts, g.Xc.chunks[0], 3))
        ratios = vectors[:, 1]
        return ProjectedOnRead(
            vectors[:, 0], ratios, vectors[:, 2] > 0, lambda log_u: self.log_rmatvec(kernel, log_u)
        )

    def linear_pass(
        self, kernel: ExactKernel, w: Any, numerator: Any, step: RatioStep
    ) -> CountedPass:
        """One streamed pass per row chunk of the kernel with its offsets (products, ratios,
        bad entries persisted; the ``m``-sized projection and the count summed on the
        client)."""
        g = kernel.geometry
        m = kernel.shape[1]
        exponent = _power_of(step)
        alpha, beta = self._offsets_of(kernel)
        numerator = _align(numerator, g.Xc.chunks[0], "numerator")
        Yc, y_sq = self._whole_y()
        beta = _delayed_whole(beta)
        weights = _delayed_whole(np.asarray(w, dtype=np.float64))
        task = dask.delayed(_absorbed_pass_chunk, pure=True, nout=2)
        outs = [
            task(x, xs, al, c, Yc, y_sq, beta, weights, g.reg, kernel.dtype, exponent, g.cost)
            for x, xs, al, c in zip(*self._chunks(kernel, alpha, numerator), strict=True)
        ]
        vectors = _rows_of([o[0] for o in outs], g.Xc.chunks[0], 3)
        parts = [da.from_delayed(o[1], shape=(1, m + 4), dtype=np.float64) for o in outs]
        partials = da.concatenate(parts, axis=0)
        # persisted without waiting: the reduction below runs the same tasks (one round trip)
        vectors = vectors.persist()
        table = partials.compute()
        total = table[:, : m + 2].sum(axis=0)
        with np.errstate(invalid="ignore"):
            stats = {
                "sum": total[m + 1],
                "max": table[:, m + 2].max(),
                "min": table[:, m + 3].min(),
            }
        ratios = ScalingVector(vectors[:, 1], stats)
        return CountedPass(vectors[:, 0], ratios, total[:m], vectors[:, 2] > 0, int(total[m]))

    def project(
        self, kernel: ExactKernel, side: str, values: Any, index: Any, *, log: bool
    ) -> np.ndarray:
        """Cols: ``values`` on the client; rows: ``K^T values`` (or its log form; ``K~^T
        values`` of an absorbed kernel) gathered as an ``m``-vector."""
        if isinstance(kernel, AbsorbedExactKernel):
            if log:
                raise NotImplementedError("an absorbed kernel runs linear passes only")
            _refuse_index(index)
            if side == "cols":
                return np.asarray(values, dtype=np.float64)
            return self._absorbed_project(kernel, values)
        if side == "cols":
            out = np.full(kernel.shape[1], -np.inf if log else 0.0)
            out[slice(None) if index is None else index] = np.asarray(values)
            return out
        _refuse_index(index)
        if log:
            return self.log_rmatvec(kernel, values)
        return self._absorbed_project(kernel, values)


def _refuse_index(index: Any) -> None:
    if index is not None:
        raise NotImplementedError(
            "project(side, values, index) with an index is not available on Dask arrays"
        )


def dask_exact_placement(kernel: Any) -> DaskExact | None:
    """The Dask placement of an exact kernel on Dask arrays (not of an absorbed form, whose
    operator is the solver's only), else ``None``."""
    placement = getattr(kernel, "placement", None)
    plain = isinstance(kernel, ExactKernel) and not isinstance(kernel, AbsorbedExactKernel)
    return placement if plain and isinstance(placement, DaskExact) else None


def dask_exact_kernel(geometry: DaskGibbsGeometry, *, dtype: Any = np.float64) -> ExactKernel:
    """The exact kernel of Dask clouds for the plain iteration: an
    :class:`~sketchot.kernels.ExactKernel` on a :class:`DaskStreamedExact` placement (never
    stored; deferred passes streamed on the workers; any metric)."""
    return ExactKernel(geometry, dtype=dtype, placement=DaskStreamedExact())


def log_stable_kernel(kernel: ExactKernel) -> ExactKernel:
    """The log-stable form of an exact kernel on Dask arrays (the same clouds, ``reg`` and
    precision): an :class:`~sketchot.kernels.ExactKernel` on a :class:`DaskStableExact`
    placement sharing ``kernel``'s persisted target cloud, with its build time."""
    if not isinstance(getattr(kernel, "placement", None), DaskExact):
        raise TypeError(
            f"log_stable_kernel takes an exact kernel on Dask arrays; got {describe(kernel)}"
        )
    stable = ExactKernel(
        kernel.geometry,
        dtype=kernel.dtype,
        max_dense_bytes=kernel.max_dense_bytes,
        placement=DaskStableExact(kernel.placement),
    )
    stable.info.build_time = kernel.info.build_time
    return stable


def log_plan_summary(
    kernel: Any, log_u: Any, log_v: np.ndarray
) -> tuple[da.Array, da.Array, float]:
    """``(row marginal, column marginal, <P, C>)`` of ``P = diag(e^log_u) K diag(e^log_v)``
    streamed per row chunk (finite at any reg): the rows stay on the cluster (persisted),
    ``O(m)`` floats per chunk come back."""
    g = kernel.geometry
    m = kernel.shape[1]
    Yc, y_sq = (_delayed_whole(v) for v in kernel.placement.whole_targets())
    lv = _delayed_whole(np.asarray(log_v, dtype=np.float64))
    task = dask.delayed(_log_plan_chunk, pure=True, nout=2)
    blocks = [
        v.to_delayed().ravel() for v in (g.Xc, g.x_sq, _align(log_u, g.Xc.chunks[0], "log_u"))
    ]
    outs = [task(x, xs, u, Yc, y_sq, lv, g.reg, g.cost) for x, xs, u in zip(*blocks, strict=True)]
    rows = _rows_of([o[0] for o in outs], g.Xc.chunks[0], None)
    partials = da.concatenate(
        [da.from_delayed(o[1], shape=(1, m + 1), dtype=np.float64) for o in outs], axis=0
    )
    rows, partials = persist_now(rows, partials)
    total = partials.sum(axis=0, split_every=SPLIT_EVERY).compute()
    col = da.from_array(total[:m], chunks=(g.Yc.chunks[0],))
    return rows, col, float(total[m])
