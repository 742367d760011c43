"""The Gibbs geometry of two clouds held as Dask arrays, chunked by rows.

:class:`DaskGibbsGeometry` has the members of :class:`~sketchot.gibbs.GibbsGeometry` that the
builders and the solver use (``shape``, ``reg``, ``center``, ``Xc``, ``Yc``, ``x_sq``,
``y_sq``, ``max_cost``, ``rows``, ``union_rows``, ``fit_clouds``) with every ``n``- or
``m``-sized array a persisted Dask array, so that the backends' fitting code runs on it
unchanged (:mod:`.builders`). Only small things reach the client: the centre (``d``), norms'
maxima, and fixed-size row samples for fitting.
"""

from __future__ import annotations

import copy
from typing import Any

import dask
import dask.array as da
import numpy as np

from .._validation import check_matrix, describe
from ..gibbs import Cost, largest_cost, make_cost, sq_norms

#: Rows per side the polynomial sketch is fitted on. Up to this size the fit uses every row
#: (then the fitted state is the in-memory one); beyond, a uniform sample drawn with ``rng``.
FIT_ROWS = 1 << 14

#: Branching of the tree reductions (partial sums are added ``SPLIT_EVERY`` at a time).
SPLIT_EVERY = 8


def as_dask_cloud(value: Any, name: str, row_chunks: Any = None) -> da.Array:
    """A 2-D real Dask array in float64, chunked by rows only (one chunk across columns).

    A NumPy array (the other operand of a call where one is Dask) is validated as in memory
    (:func:`~sketchot._validation.check_matrix`) and wrapped with chunks of the other cloud's
    row-chunk size ``row_chunks`` (its chunks, or an int; Dask's default when ``None``).
    """
    if not hasattr(value, "chunks"):
        array = check_matrix(value, name)
        if isinstance(row_chunks, tuple):
            # the other cloud's largest row chunk: its chunk tuple sums to ITS length, not ours
            row_chunks = max(row_chunks) if row_chunks else None
        value = da.from_array(array, chunks=(row_chunks or "auto", -1))
    if value.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array (n, d); got shape {value.shape}")
    if np.dtype(value.dtype).kind not in "biuf":
        raise TypeError(f"{name} must be a real numeric array; got dtype {value.dtype}")
    if any(np.isnan(size) for size in value.shape):
        raise ValueError(
            f"{name} must have known chunk sizes; got shape {value.shape} "
            "(call compute_chunk_sizes() first)"
        )
    if value.shape[0] == 0 or value.shape[1] == 0:
        raise ValueError(f"{name} must be non-empty; got shape {value.shape}")
    return value.astype(np.float64).rechunk({1: -1})


def persist_now(*arrays: da.Array) -> tuple[da.Array, ...]:
    """``dask.persist`` and wait until the chunks are in memory (with a distributed client,
    persist returns at once): build times then mean something, and build errors show here."""
    persisted = dask.persist(*arrays)
    try:
        from distributed import futures_of, wait
    except ImportError:  # only the local schedulers: persist has already computed
        return persisted
    futures = futures_of(persisted)
    if futures:
        wait(futures)
    return persisted


class DaskGibbsGeometry:
    """Two Dask clouds and ``reg``: :class:`~sketchot.gibbs.GibbsGeometry` on a cluster.

    Parameters
    ----------
    X : dask.array or ndarray, shape (n, d)
        Source points, chunked by rows (a NumPy array is wrapped with ``Y``'s row chunks).
    Y : dask.array or ndarray, shape (m, d)
    reg : float
    metric : str or callable, default='sqeuclidean'
        The ground cost, as :class:`~sketchot.gibbs.GibbsGeometry` takes it (a named metric
        on the centred clouds; a callable on the clouds as given, uncentred).
    p : float, default=2
        The order of ``metric='minkowski'``.

    Notes
    -----
    Building costs two passes over the clouds (centre and finiteness, then centred copies and
    their norms, persisted): ``O((n + m) d)`` work on the workers, ``O(d)`` to the client.
    Worker memory ``O((n + m) (d + 1))`` floats for the persisted centred clouds and norms.
    """

    def __init__(self, X: Any, Y: Any, reg: float, metric: Any = "sqeuclidean", p: Any = 2.0):
        X_chunks = X.chunks[0] if hasattr(X, "chunks") else None
        Y_chunks = Y.chunks[0] if hasattr(Y, "chunks") else None
        X = as_dask_cloud(X, "X", Y_chunks)
        Y = as_dask_cloud(Y, "Y", X_chunks)
        if X.shape[1] != Y.shape[1]:
            raise ValueError(
                f"Y must have the same number of columns as X ({X.shape[1]}); got {Y.shape[1]}"
            )
        self.reg = float(reg)
        self.cost: Cost = make_cost(metric, p)
        n, m = X.shape[0], Y.shape[0]
        sums_x, sums_y, finite_x, finite_y = dask.compute(
            X.sum(axis=0, split_every=SPLIT_EVERY),
            Y.sum(axis=0, split_every=SPLIT_EVERY),
            da.isfinite(X).all(),
            da.isfinite(Y).all(),
        )
        for name, finite in (("X", finite_x), ("Y", finite_y)):
            if not finite:
                raise ValueError(f"{name} must contain only finite values; got NaN or inf")
        # Same formula as GibbsGeometry (only the summation order of the sums differs).
        self.center = (sums_x + sums_y) / (n + m)
        if not self.cost.translation_invariant:  # a callable sees the points as given
            self.center = np.zeros_like(self.center)
        self.X, self.Y = X, Y
        self.Xc, self.Yc = persist_now(X - self.center, Y - self.center)
        self.x_sq, self.y_sq = persist_now(
            self.Xc.map_blocks(sq_norms, drop_axis=1, dtype=np.float64),
            self.Yc.map_blocks(sq_norms, drop_axis=1, dtype=np.float64),
        )
        self._max_sq = None
        self._max_cost: float | None = None

    def computes_on_device(self, cost: Any = None) -> bool:
        """Never: Dask chunks are NumPy arrays (the in-memory geometry's rule, for callers
        that take either)."""
        del cost
        return False

    @property
    def shape(self) -> tuple[int, int]:
        """``(n, m)``."""
        return (self.X.shape[0], self.Y.shape[0])

    @property
    def row_chunks(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Row chunks of ``X`` and of ``Y``."""
        return self.Xc.chunks[0], self.Yc.chunks[0]

    def max_sq_norms(self) -> tuple[float, float]:
        """``(max ||x_i - c||^2, max ||y_j - c||^2)``, computed once."""
        if self._max_sq is None:
            self._max_sq = tuple(float(v) for v in dask.compute(self.x_sq.max(), self.y_sq.max()))
        return self._max_sq

    def max_cost(self) -> float:
        """Upper bound on ``max_ij c(x_i, y_j)``, as :meth:`GibbsGeometry.max_cost`: from the
        centred norms by the triangle inequality for a named metric (``O((n + m) d)`` on the
        workers), the exact maximum for a callable (``O(n m d)`` on the workers, once)."""
        if self.cost.sqeuclidean:
            x_max, y_max = self.max_sq_norms()
            return float((np.sqrt(x_max) + np.sqrt(y_max)) ** 2)
        if self._max_cost is None:
            if self.cost.translation_invariant:
                norms = [
                    c.map_blocks(self.cost.norms, drop_axis=1, dtype=np.float64).max()
                    for c in (self.Xc, self.Yc)
                ]
                self._max_cost = float(sum(dask.compute(*norms)))
            else:
                Y = self.Yc.rechunk({0: -1}).to_delayed().ravel()[0]
                tops = [
                    dask.delayed(largest_cost, pure=True)(x, Y, self.cost)
                    for x in self.Xc.to_delayed().ravel()
                ]
                self._max_cost = float(max(dask.compute(*tops), default=0.0))
        return self._max_cost

    def at_reg(self, reg: float) -> DaskGibbsGeometry:
        """The same persisted clouds and cost at another ``reg`` (nothing is recomputed)."""
        geometry = copy.copy(self)
        geometry.reg = float(reg)
        return geometry

    # ----------------------------------------------------- samples for fitting
    def rows(self, side: str, index: np.ndarray) -> np.ndarray:
        """Centred rows ``Xc[index]`` (``side='x'``) or ``Yc[index]`` as NumPy (a small gather)."""
        own = self.Xc if side == "x" else self.Yc
        index = np.asarray(index)
        order = np.argsort(index, kind="stable")
        gathered = own[index[order]].compute()
        out = np.empty_like(gathered)
        out[order] = gathered
        return out

    def union_rows(self, index: np.ndarray | None = None) -> np.ndarray:
        """Rows of ``vstack([Xc, Yc])`` (all of them when ``index`` is None), as NumPy.

        The values are those of the in-memory geometry's union, so a landmark search run on
        them with the same generator picks the same landmarks.
        """
        n, m = self.shape
        index = np.arange(n + m) if index is None else np.asarray(index)
        from_x = index < n
        out = np.empty((index.size, self.Xc.shape[1]))
        if from_x.any():
            out[from_x] = self.rows("x", index[from_x])
        if (~from_x).any():
            out[~from_x] = self.rows("y", index[~from_x] - n)
        return out

    def fit_clouds(self, generator: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Uncentred rows to fit a data-dependent sketch on, as NumPy.

        Each side with at most :data:`FIT_ROWS` rows is used whole (no draw from
        ``generator``: the fit is then the in-memory one). A larger side contributes
        ``FIT_ROWS`` rows drawn uniformly without replacement with ``generator`` (sorted),
        plus its row of largest norm, so the sketch's scale covers every point.
        """
        clouds = []
        for side, sq in (("x", self.x_sq), ("y", self.y_sq)):
            size = sq.shape[0]
            if size <= FIT_ROWS:
                index = np.arange(size)
            else:
                sample = generator.choice(size, size=FIT_ROWS, replace=False)
                farthest = int(sq.argmax().compute())
                index = np.unique(np.append(sample, farthest))
            clouds.append(self.rows(side, index) + self.center)
        return clouds[0], clouds[1]

    def __repr__(self) -> str:
        n, m = self.shape
        return (
            f"<DaskGibbsGeometry {n}x{m} reg={self.reg:g} chunks={len(self.Xc.chunks[0])}+"
            f"{len(self.Yc.chunks[0])}>"
        )


def check_reg_and_clouds(
    X: Any, Y: Any, reg: Any, metric: Any = "sqeuclidean", p: Any = 2.0
) -> DaskGibbsGeometry:
    """Validated Dask geometry, with the in-memory path's error for a missing ``Y``."""
    from .._validation import check_float

    if Y is None:
        raise TypeError(
            f"sketchot.sinkhorn(a, b, X, Y, reg) takes two point clouds; got Y={describe(Y)}"
        )
    return DaskGibbsGeometry(X, Y, check_float(reg, "reg", positive=True), metric, p)
