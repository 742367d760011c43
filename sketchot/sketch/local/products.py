"""The products of the block-local expansion: ``sum_j exp(log_w_j) K_ij values_j`` in the
stabilised scaled form ``exp(scale_i) Z_i``, planned on the host cluster by cluster (groups
of output clusters, kept pairs, batches) and computed where the sides' arrays are
(:mod:`sketchot.sketch.local.device`), with the clusters below ``exact_below`` points taken
exactly.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..._parallel import get_num_threads, run_parts
from ...gibbs import BLOCK_BYTES, SQEUCLIDEAN, block_rows, neg_cost_on_device, row_slices
from .truncation import _input_bounds, _kept_pairs

if TYPE_CHECKING:
    from ..._arrays import DeviceArrays
    from .clusters import _Batch, _Side
    from .device import _HostArrays
    from .fit import _MeansPlan, _MonomialPlan

# Input clusters per batch of a truncated product: a batch is kept or skipped whole, so few
# neighbours (more clusters per batch only save Python overhead).
_IN_BATCH = 16
# Output clusters per group of a truncated product (at least, memory allowing).
_TRUNCATED_GROUP = 32

_BLAS_CONTROLLER: Any = None


@contextmanager
def _pool_without_blas_threads() -> Iterator[bool]:
    """Yield whether the products may run on the library pool.

    Each pool thread calls BLAS on small blocks; a multi-threaded BLAS under it oversubscribes
    the cores (measured 25x slower at n = 2e4 on 2 cores). With ``threadpoolctl`` BLAS is held
    to one thread for the duration (process-wide), also when sketchot runs one thread (a
    multi-threaded BLAS rounds its products differently: the same call with 1 and 2 threads
    gave products 2e-15 apart), and the pool shares the clusters; without it the clusters run
    in the calling thread and BLAS keeps its own threads, whatever the thread count.
    """
    global _BLAS_CONTROLLER
    if _BLAS_CONTROLLER is None:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:
            _BLAS_CONTROLLER = False
        else:
            _BLAS_CONTROLLER = ThreadpoolController()
    if _BLAS_CONTROLLER is False:
        yield False
        return
    with _BLAS_CONTROLLER.limit(limits=1, user_api="blas"):
        yield get_num_threads() > 1


def _apply(
    out: _Side,
    inn: _Side,
    log_w: np.ndarray,
    values: np.ndarray | None,
    plan: _MonomialPlan,
    reg: float,
    truncate: float = 0.0,
    stride: int = 1,
    means: _MeansPlan | None = None,
    on: DeviceArrays | None = None,
    work: dict[str, float] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``sum_j exp(log_w_j) K_ij values_j`` as ``exp(scale_i) Z_i``, in the caller's order.

    For each group of expanded output clusters ``A`` (sized so that the moments fit
    ``_MOMENT_BYTES``; on a device a share of its free memory) and the expanded input clusters
    ``B`` it keeps:

    1. per batch of input clusters ``B`` of similar sizes (threads): exponents
       ``E_jA = base_j + log_w_j + 2 c_A . q_j / reg`` (``|B| x |group|``), shift
       ``s_AB = max_j E_jA``, weights ``exp(E - s) <= 1`` and moments
       ``G_AB = Psi_B^T (weights * values)`` (``R x k`` per pair), one batched matrix product
       per batch;
    2. per batch of output clusters (threads): ``T_iB = base_i + 2 c_B . p_i / reg
       - ||c_A - c_B||^2 / reg + s_AB``, ``M = Phi_A G_A`` and
       ``Z_i = sum_B exp(T_iB - max_B T_iB) M_iB``, ``scale_i = max_B T_iB``.

    ``truncate > 0`` (log-domain products, ``values=None``): a group keeps the input clusters
    that some pair of it needs by :func:`_kept_pairs`; every row then misses at most a
    fraction ``truncate`` of its sum. Groups are then spatial, so that they keep few.

    Clusters below ``exact_below`` points use exact entries (:func:`_exact_scaled`), merged
    with :func:`_combine`. ``values=None`` means a single column of ones (log-domain
    products), for which ``Z_i >= e^-tau`` whenever a weight is non-zero, so ``log Z`` is safe.

    ``means`` (with ``values=None``): ``Z`` has the columns ``1`` and the input points'
    coordinates (``1 + d``) from the single column's input moments: in step 2 the centres
    ``c_B`` weight ``M_iB`` and the offsets' share is ``sqrt(reg / 2) Phi'_A H^k_A`` with
    ``H^k`` read from ``G`` (:class:`_MeansPlan`).

    ``stride > 1`` computes only every ``stride``-th group of output clusters and every
    ``stride``-th exactly handled row (the others are left at ``Z = 0``): a spatially even
    sample of the work, for timing (:meth:`LocalGaussianExpansion.iteration_seconds`).

    ``work`` (a dict): nothing is computed; the same plan (groups, kept pairs, batches) is
    made and the work it would do is added to ``work`` (:func:`_count_group`,
    :func:`_count_exact_and_groups`), for :meth:`LocalGaussianExpansion.iteration_work`;
    returns ``(None, None)``.

    ``on``: the per-point work (exponents, moments, output rows, exact entries) runs on that
    device, in its Array API namespace, on copies of the sides' arrays kept there
    (:class:`_DeviceArrays`); the cluster-level planning (groups, kept pairs, batches) stays
    on the host, and ``log_w``, ``values`` and the result are NumPy arrays on the host.

    :class:`_Product` holds the plan and assembles the rows, :class:`_Group` runs steps 1 and
    2 for one group of output clusters.
    """
    product = _Product(out, inn, log_w, values, plan, reg, truncate, means, on)
    if work is not None:
        one_group = functools.partial(product.one_group, work=work)
        _count_exact_and_groups(
            work, out, inn, product.group, product.truncated, product.k_in, stride, one_group
        )
        return None, None
    # host-only pool (a device runs its own parallel work)
    with _pool_without_blas_threads() as parallel:
        rows = product.rows(stride, parallel and product.A_in.on_host)
    return product.in_caller_order(rows)


class _Product:
    """One call of :func:`_apply`: its inputs where the per-point work runs (``A_in``,
    ``A_out``), the plan shared by its groups of output clusters, and the pieces of the
    result (sorted output rows, scale, Z), in any order (threads append)."""

    def __init__(
        self,
        out: _Side,
        inn: _Side,
        log_w: np.ndarray,
        values: np.ndarray | None,
        plan: _MonomialPlan,
        reg: float,
        truncate: float,
        means: _MeansPlan | None,
        on: DeviceArrays | None,
    ) -> None:
        self.out, self.inn, self.plan, self.reg = out, inn, plan, reg
        self.truncate, self.means = truncate, means
        self.A_out, self.A_in = out.arrays(on), inn.arrays(on)
        xp = self.xp = self.A_in.xp
        self.n_values = 1 if values is None else values.shape[1]
        self.truncated = truncate > 0.0 and values is None
        self.w_sorted = log_w[inn.order]
        self.w_on = self.A_in.put(self.w_sorted)
        # the input rows' exponents before the pair's coupling
        self.base_and_w = self.A_in.base + self.w_on
        self.v_on = None if values is None else self.A_in.put(values[inn.order])
        self.d = inn.local.shape[1]
        self.n_out = self.n_values + (self.d if means is not None else 0)
        # the exactly handled clusters take the coordinates as plain columns
        self.exact_values = self.v_on
        self.means_index = self.means_factor = None
        if means is not None:
            points = self.A_in.points
            self.exact_values = xp.concat([xp.ones_like(points[:, :1]), points], axis=1)
            self.means_index = self.A_in.put_index(means.index.ravel())
            self.means_factor = self.A_in.put(means.factor)
        self.half_width = float(np.sqrt(reg / 2.0))  # q = w sqrt(reg / 2) for the features' w
        # Only the expanded (large) input clusters kb: take part in the pairs.
        self.kb = kb = inn.n_small
        self.k_in = inn.n_clusters - kb
        self.in_sq = np.einsum("ij,ij->i", inn.centers[kb:], inn.centers[kb:])
        self.in_coupling = (2.0 / reg) * inn.centers[kb:].T  # (d, k_in)
        self.pieces: list[tuple[np.ndarray, Any, Any]] = []
        self.group = self._group_size()
        self.all_inputs = np.arange(self.k_in)
        max_clusters = _IN_BATCH if self.truncated else inn.n_clusters
        self.in_batches = inn.batches(kb + self.all_inputs, max_clusters)
        self.in_bounds = None
        if self.truncated and self.k_in:
            self.in_bounds = _input_bounds(inn, self.w_sorted)

    def _group_size(self) -> int:
        """Output clusters per group: their moments fit the input side's moment bytes."""
        per_cluster = self.plan.n_features * max(self.k_in, 1) * self.n_values * 8
        group = max(1, self.A_in.moment_bytes() // per_cluster)
        if self.truncated:
            # Neighbours in a group keep few inputs between them, but each group reads the kept
            # inputs' features once: no smaller than the memory allows, and never below
            # _TRUNCATED_GROUP where four times the moments' budget allows that.
            group = max(group, min(_TRUNCATED_GROUP, 4 * group))
        return min(group, self.out.n_clusters)

    # ------------------------------------------------------------------ one group
    def one_group(
        self, ids: np.ndarray, parallel: bool, work: dict[str, float] | None = None
    ) -> None:
        """Steps 1 and 2 for the output clusters ``ids``; with ``work``, their count only."""
        out, inn, kb = self.out, self.inn, self.kb
        pair_sq = np.einsum("ij,ij->i", out.centers[ids], out.centers[ids])[:, None] + self.in_sq
        pair_sq -= 2.0 * out.centers[ids] @ inn.centers[kb:].T
        np.maximum(pair_sq, 0.0, out=pair_sq)
        kept, batches = self.all_inputs, self.in_batches
        if self.truncated:
            kept, batches = self._kept_inputs(ids, pair_sq)
            if kept is None:  # every input weight is zero: the rows stay empty
                return
        n_group = ids.size
        if work is not None:  # the plan's work, counted instead of done
            R = self.plan.n_features
            out_batches = out.batches(ids, n_group)
            _count_group(work, batches, out_batches, kept.size, n_group, R, self.d, self.n_values)
            return
        _Group(self, ids, kept).run(batches, out.batches(ids, n_group), pair_sq, parallel)

    def _kept_inputs(
        self, ids: np.ndarray, pair_sq: np.ndarray
    ) -> tuple[np.ndarray | None, list[_Batch]]:
        """The input clusters a truncated product keeps for the output clusters ``ids``, in
        whole batches (neighbours: their padded features are read as stored), renumbered
        from 0; ``(None, [])`` when it keeps none."""
        out, kb = self.out, self.kb
        radius, bounds = out.cluster_radius[ids], self.in_bounds
        keep = _kept_pairs(pair_sq, out.centers[ids], radius, bounds, self.reg, self.truncate)
        chosen = keep.any(axis=0)
        if not chosen.any():
            return None, []
        batches, position = [], 0
        for batch in self.in_batches:
            if chosen[batch.ids - kb].any():
                size = batch.stop - batch.first
                batches.append(replace(batch, first=position, stop=position + size))
                position += size
        return np.concatenate([batch.ids for batch in batches]) - kb, batches

    # ------------------------------------------------------------------ the rows
    def rows_of(self, kept: list) -> tuple[np.ndarray, Any, Any]:
        """The pieces as one ``(rows, scale, Z)`` (empty when none)."""
        A_out, xp = self.A_out, self.xp
        if not kept:
            return (
                np.zeros(0, dtype=np.int64),
                A_out.full((0,), 0.0),
                A_out.full((0, self.n_out), 0.0),
            )
        return (
            np.concatenate([piece[0] for piece in kept]),
            xp.concat([piece[1] for piece in kept]),
            xp.concat([piece[2] for piece in kept]),
        )

    def empty_rows(self, rows: np.ndarray) -> tuple[np.ndarray, Any, Any]:
        """``rows`` with an empty sum: ``scale = -inf``, ``Z = 0``."""
        A_out = self.A_out
        return rows, A_out.full((rows.size,), -np.inf), A_out.full((rows.size, self.n_out), 0.0)

    def rows(self, stride: int, parallel: bool) -> tuple[np.ndarray, Any, Any]:
        """Every output row (every ``stride``-th group and exactly handled row, the others
        empty) as ``(sorted rows, scale, Z)``."""
        out = self.out
        small_out = out.small_rows
        parts = [self.expanded_rows(stride, parallel)]
        if small_out:
            # small output clusters against every input point, exactly
            sampled = np.arange(0, small_out, stride)
            points = self.A_out.points[0:small_out:stride, ...]
            others, w_on, values = self.A_in.points, self.w_on, self.exact_values
            exact = _exact_scaled(self.A_out, points, others, w_on, values, self.reg, parallel)
            parts.append((sampled, *exact))
        rows = self.rows_of(parts)
        if stride > 1:  # the rows the sample left out
            missing = np.setdiff1d(np.arange(out.n_points), rows[0], assume_unique=True)
            rows = self.rows_of([rows, self.empty_rows(missing)])
        return rows

    def expanded_rows(self, stride: int, parallel: bool) -> tuple[np.ndarray, Any, Any]:
        """The rows of the expanded output clusters: the groups' pieces, the rows no piece
        holds (zero weights) and, exactly, their sums over the small input clusters."""
        out, inn, A_out, A_in, xp = self.out, self.inn, self.A_out, self.A_in, self.xp
        if self.k_in:
            for ids in out.expanded_groups(self.group, spatial=self.truncated)[::stride]:
                self.one_group(ids, parallel)
        # the pool's threads append pieces as they finish: a fixed order (by first row) keeps
        # each row's place in the exact products below, so their rounding, the same
        pieces = sorted(self.pieces, key=lambda piece: piece[0][0] if piece[0].size else -1)
        expanded = self.rows_of(pieces)
        small_out, small_in = out.small_rows, inn.small_rows
        all_rows = np.arange(small_out, out.n_points, stride)
        if (stride == 1 or not self.k_in) and expanded[0].size < all_rows.size:
            # every row the sample covers, the empty ones (zero weights) included
            unseen = np.setdiff1d(all_rows, expanded[0], assume_unique=True)
            expanded = self.rows_of([expanded, self.empty_rows(unseen)])
        if small_in and expanded[0].size:
            # the expanded output rows against the small input clusters, exactly
            rows, scale, Z = expanded
            exact_values = self.exact_values
            exact = _exact_scaled(
                A_out,
                xp.take(A_out.points, A_out.put_index(rows), axis=0),
                A_in.points[:small_in, ...],
                self.w_on[:small_in],
                None if exact_values is None else exact_values[:small_in, ...],
                self.reg,
                parallel,
            )
            expanded = (rows, *_combine(xp, scale, Z, *exact))
        return expanded

    def in_caller_order(self, rows: tuple[np.ndarray, Any, Any]) -> tuple[np.ndarray, np.ndarray]:
        """``(scale, Z)`` of the pieces ``rows`` in the caller's order, on the host: one
        gather from the pieces' order to the caller's."""
        out, A_out, xp = self.out, self.A_out, self.xp
        position = np.empty(out.n_points, dtype=np.int64)
        position[rows[0]] = np.arange(out.n_points)
        caller = A_out.put_index(position[out.inverse_order])
        return (
            A_out.get(xp.take(rows[1], caller, axis=0)),
            A_out.get(xp.take(rows[2], caller, axis=0)),
        )


class _Group:
    """Steps 1 and 2 of :func:`_apply` for one group of output clusters against the input
    clusters ``kept`` (numbered from 0 among the expanded ones): the input-side shifts and
    moments (clusters kept x group x R, input-major, so that a batch's moments are one
    contiguous write), then the output rows."""

    def __init__(self, product: _Product, ids: np.ndarray, kept: np.ndarray) -> None:
        p = self.product = product
        self.xp, self.A_in, self.A_out = p.xp, p.A_in, p.A_out
        self.kept, self.n_group, self.R = kept, ids.size, p.plan.n_features
        self.out_coupling = p.A_in.put((2.0 / p.reg) * p.out.centers[ids].T)  # (d, n_group)
        coupling = p.in_coupling[:, kept] if p.truncated else p.in_coupling
        self.kept_coupling = p.A_out.put(coupling)
        self.kept_centers = p.A_out.put(p.inn.centers[p.kb :][kept])
        # -inf marks a pair whose input block has only zero weights: it stays out of row maxima.
        self.shifts = p.A_in.full((kept.size, self.n_group), -np.inf)
        self.moments = p.A_in.empty((kept.size, self.n_group * p.n_values, self.R))
        self.totals: Any = None

    def run(
        self,
        in_batches: list[_Batch],
        out_batches: list[_Batch],
        pair_sq: np.ndarray,
        parallel: bool,
    ) -> None:
        """Step 1 on ``in_batches``, then step 2 on ``out_batches`` (each on the pool)."""
        with np.errstate(under="ignore", invalid="ignore"):
            run_parts(self.input_batches, in_batches, parallel)
            pair = self.A_in.put(pair_sq[:, self.kept])
            self.totals = self.shifts.T - pair / self.product.reg
            run_parts(self.output_batches, out_batches, parallel)

    # ------------------------------------------------------------------ step 1
    def input_batches(self, batches: list[_Batch]) -> None:
        """Shifts and moments of the input batches ``batches``."""
        for batch in batches:
            top, block = self.batch_moments(batch)
            self.shifts[batch.first : batch.stop, :] = top
            self.moments[batch.first : batch.stop, ...] = block

    def batch_moments(self, batch: _Batch) -> tuple[Any, Any]:
        """``(shift, moments)`` of one input batch against the group."""
        xp = self.xp
        blocks = batch.row_blocks() if batch.index is None else []
        if len(blocks) > 1:
            # One large cluster: its maximum first, then the moments block by block.
            tops = [xp.max(self.exponents(batch, rows)[0, ...], axis=0) for rows in blocks]
            top = xp.max(xp.stack(tops), axis=0)[None, ...]
            block = sum(
                self.weighted_moments(self.exponents(batch, rows), batch, rows, top)
                for rows in blocks
            )
            return top, block
        E = self.exponents(batch)
        top = xp.max(E, axis=1)  # (clusters, n_group)
        return top, self.weighted_moments(E, batch, None, top)

    def exponents(self, batch: _Batch, rows: slice | None = None) -> Any:
        """``E_jA = base_j + log_w_j + 2 c_A . q_j / reg``, shape (clusters, size, n_group)."""
        A_in, base_and_w = self.A_in, self.product.base_and_w
        if rows is not None:  # a slice of one large cluster
            E = A_in.local[rows, ...] @ self.out_coupling
            E += base_and_w[rows][:, None]
            return E[None, ...]
        E = A_in.gather(batch, A_in.local) @ self.out_coupling  # (clusters, size, n_group)
        E += A_in.gather(batch, base_and_w)[:, :, None]
        if batch.padding is not None:
            E += A_in.padding(batch)[:, :, None]
        return E

    def weighted_moments(self, E: Any, batch: _Batch, rows: slice | None, top: Any) -> Any:
        """``Psi_B^T (exp(E - top) * values)``, shape (clusters, n_group * k, R)."""
        xp, A_in, v_on = self.xp, self.A_in, self.product.v_on
        E -= xp.where(xp.isfinite(top), top, xp.zeros_like(top))[:, None, :]
        E = xp.exp(E)
        if v_on is not None:
            V = v_on[rows, ...][None, ...] if rows is not None else A_in.gather(batch, v_on)
            E = xp.reshape(E[..., None] * V[:, :, None, :], (*E.shape[:2], -1))
        F = A_in.batch_features(batch) if rows is None else A_in.block_features(rows)[None, ...]
        return E.mT @ F  # (clusters, n_group * k, R)

    # ------------------------------------------------------------------ step 2
    def output_batches(self, batches: list[_Batch]) -> None:
        """The output rows of the batches ``batches``, appended to the product's pieces."""
        xp, A_out, pieces = self.xp, self.A_out, self.product.pieces
        n_values = self.product.n_values
        for batch in batches:
            # (clusters, R, kept * k): a strided view for one column (BLAS reads it as is)
            G = xp.reshape(self.moments, (self.kept.size, self.n_group, n_values, self.R))
            G = xp.permute_dims(G[:, batch.first : batch.stop, ...], (1, 3, 0, 2))
            G = xp.reshape(G, (batch.stop - batch.first, self.R, -1))
            H = self.offset_moments(G)
            tot = self.totals[batch.first : batch.stop, :]
            if batch.index is None:
                for rows in batch.row_blocks():
                    safe, z = self.output_rows(
                        G,
                        H,
                        tot,
                        A_out.local[rows, ...][None, ...],
                        A_out.base[rows][None, ...],
                        A_out.block_features(rows)[None, ...],
                    )
                    pieces.append((np.arange(rows.start, rows.stop), safe[0, ...], z[0, ...]))
                continue
            safe, z = self.output_rows(
                G,
                H,
                tot,
                A_out.gather(batch, A_out.local),
                A_out.gather(batch, A_out.base),
                A_out.batch_features(batch),
            )
            pieces.append(
                (
                    batch.index[batch.valid],
                    A_out.take_valid(batch, safe),
                    A_out.take_valid(batch, z),
                )
            )

    def offset_moments(self, G: Any) -> Any:
        """``H`` of :class:`_MeansPlan` for plain moments ``G`` (clusters, R, kept):
        shape (clusters, R', d * kept); ``None`` without means."""
        means, xp = self.product.means, self.xp
        if means is None:
            return None
        H = xp.take(G, self.product.means_index, axis=1)
        H = xp.reshape(H, (G.shape[0], self.product.d, means.n_features, -1))
        H = H * self.product.means_factor[None, :, :, None]
        H = xp.permute_dims(H, (0, 2, 1, 3))
        return xp.reshape(H, (G.shape[0], means.n_features, -1))

    def output_rows(self, G: Any, H: Any, totals_rows: Any, local: Any, base: Any, F: Any):
        """``(scale, Z)`` of padded rows ``(clusters, size)`` against the kept clusters."""
        xp, p = self.xp, self.product
        T = local @ self.kept_coupling  # (clusters, size, kept)
        T += base[:, :, None]
        T += totals_rows[:, None, :]
        top = xp.max(T, axis=2)
        safe = xp.where(xp.isfinite(top), top, xp.zeros_like(top))
        T -= safe[:, :, None]
        T = xp.exp(T)
        M = xp.reshape(F @ G, (*T.shape, p.n_values))
        z = (T[:, :, None, :] @ M)[:, :, 0, :]  # sum_B T_iB M_iB, batched
        if H is None:
            return safe, z
        # means: y = c_B + q, the centres weighting the plain terms, the offsets from H
        centres = (T * M[..., 0]) @ self.kept_centers
        offsets = xp.reshape(F[..., : p.means.n_features] @ H, (*T.shape[:2], p.d, -1))
        centres += p.half_width * (offsets @ T[..., None])[..., 0]
        return safe, xp.concat([z, centres], axis=2)


def _padded_rows(batch: _Batch) -> int:
    """Rows a batched product computes for ``batch``, padding included."""
    return int(batch.index.size if batch.index is not None else batch.rows.stop - batch.rows.start)


def _count_group(work, in_batches, out_batches, kept, n_group, R, d, n_values) -> None:
    """Add one group's work (:func:`_apply`'s steps 1 and 2) to ``work``: per input row and
    output cluster an exponent (``d`` multiply-adds and an exponential) and its moments
    (``R k``); per output row and kept input cluster the same exponent, ``F G`` (``R k``) and
    the sum (``k``). ``'entries'``: the (row, cluster) pairs; ``'fma'``: multiply-adds in the
    batched products; ``'exp'``: exponentials; ``'calls'``: batched products (each one's
    fixed cost: gathers, temporaries, the interpreter)."""
    inputs = sum(_padded_rows(batch) for batch in in_batches) * n_group
    outputs = sum(_padded_rows(batch) for batch in out_batches) * kept
    work["entries"] += inputs + outputs
    work["exp"] += inputs + outputs
    work["calls"] += len(in_batches) + len(out_batches)
    work["fma"] += inputs * (d + n_values * R) + outputs * (d + n_values * (R + 1))


def _count_exact_and_groups(work, out, inn, group, truncated, k_in, stride, one_group) -> None:
    """The counting branch of :func:`_apply`: the expanded groups (every ``stride``-th,
    scaled by the share of the expanded rows they hold) and the exactly handled rows
    (``'exact'``: entries computed from the points, each ``d`` multiply-adds and an
    exponential)."""
    expanded_rows = out.n_points - out.small_rows
    if k_in:
        before = dict(work)
        sampled = out.expanded_groups(group, spatial=truncated)[::stride]
        for ids in sampled:
            one_group(ids, False)
        rows = sum(int(np.sum(out.offsets[ids + 1] - out.offsets[ids])) for ids in sampled)
        share = expanded_rows / rows if rows else 0.0
        for key in ("entries", "exp", "fma", "calls"):
            work[key] = before[key] + (work[key] - before[key]) * share
    small_in = expanded_rows * inn.small_rows
    work["exact"] += out.small_rows * inn.n_points + small_in
    work["entries"] += out.small_rows * inn.n_points + small_in


def _exact_scaled(
    arrays: _HostArrays,
    points: Any,
    others: Any,
    log_w: Any,
    values: Any,
    reg: float,
    parallel: bool,
) -> tuple[Any, Any]:
    """Exact ``sum_j exp(log_w_j) K_ij values_j`` as ``(scale, Z)``, for arrays where
    ``arrays``' products run; row blocks on the pool (host) or of ``BLOCK_BYTES`` (device)."""
    xp = arrays.xp
    scale = arrays.empty((points.shape[0],))
    Z = arrays.empty((points.shape[0], 1 if values is None else values.shape[1]))
    others_sq = xp.sum(others * others, axis=1)

    def blocks(part) -> None:
        for rows in part:
            X = points[rows, :]
            x_sq = xp.sum(X * X, axis=1)
            logits = neg_cost_on_device(xp, X, x_sq, others, others_sq, reg, SQEUCLIDEAN)
            logits += log_w[None, :]
            top = xp.max(logits, axis=1)
            safe = xp.where(xp.isfinite(top), top, xp.zeros_like(top))
            logits -= safe[:, None]
            logits = xp.exp(logits)
            Z[rows, :] = (
                xp.sum(logits, axis=1, keepdims=True) if values is None else logits @ values
            )
            scale[rows] = safe

    target = None if arrays.on_host else BLOCK_BYTES  # a device wants large blocks
    rows_per_block = block_rows(others.shape[0], target_bytes=target, dim=points.shape[1])
    run_parts(blocks, list(row_slices(points.shape[0], rows_per_block)), parallel)
    return scale, Z


def _combine(xp: Any, s1: Any, Z1: Any, s2: Any, Z2: Any) -> tuple[Any, Any]:
    """``exp(s) Z = exp(s1) Z1 + exp(s2) Z2`` with ``s = max(s1, s2)`` (``-inf`` allowed), in
    the Array API namespace ``xp``."""
    top = xp.maximum(s1, s2)
    safe = xp.where(xp.isfinite(top), top, xp.zeros_like(top))
    return safe, Z1 * xp.exp(s1 - safe)[:, None] + Z2 * xp.exp(s2 - safe)[:, None]


def _log_of_scaled(scale: np.ndarray, Z: np.ndarray) -> np.ndarray:
    """``scale + log(Z)`` with ``Z = 0`` (all weights zero) giving ``-inf``."""
    with np.errstate(divide="ignore"):
        return scale + np.log(Z)
