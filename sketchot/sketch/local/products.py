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
from .device import _MOMENT_BYTES
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
# Padded rows per batch of a truncated product: the pairs are kept per batch
# (:class:`_Sparsity`), so smaller batches form fewer. Counted at 10^5 uniform points, reg
# 0.01, tau 4: 1.76e10 multiply-adds an iteration instead of 2.83e10 at
# clusters._ROW_BLOCK (4096 rows), in 1110 batched products instead of 278.
_TRUNCATED_ROWS = 1024
# Groups of output clusters whose moments (at most this many times the moments' bytes) a
# truncated product forms together, reading each input batch's features once for all.
_SHARED_GROUPS = 4
# Exactly handled output clusters per chunk of a truncated product (neighbours: the input
# clusters a chunk keeps are few).
_EXACT_CLUSTERS = 16

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
    lower: np.ndarray | None = None,
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
    fraction ``truncate`` of its sum. Groups are then spatial, so that they keep few. Within
    a group only the kept pairs are formed and read, at the granularity of the batches
    (:class:`_Sparsity`: each pair left out is one the bound skips, so the error bound is
    unchanged), and step 1 runs for several groups at once, input batch by input batch, so
    that features recomputed per block are computed once for all of them
    (:meth:`_Product.shared_input_pass`); on the host those groups' moments are one compact
    array of the computed pairs only, each input batch one product for all of their columns
    (:class:`_Compact`).

    Clusters below ``exact_below`` points use exact entries (:func:`_exact_scaled`), merged
    with :func:`_combine`. A truncated product bounds these pairs with the others (one budget
    per row, :func:`_kept_pairs` over every input cluster; an exactly handled input cluster
    is skipped only within float64's epsilon of the row, so a product whose clusters are all
    exactly handled stays exact to rounding) and computes the exact entries of the pairs it
    keeps only (:meth:`_Product.exact_pieces`): counted at 10^5 uniform points, reg 0.003,
    tau 4, 8.1e7 exact entries an iteration instead of 2.1e8 (beside 6.4e10 multiply-adds of
    the expanded pairs). ``values=None`` means a single column of ones (log-domain products),
    for which ``Z_i >= e^-tau`` whenever a weight is non-zero, so ``log Z`` is safe.

    ``means`` (with ``values=None``): ``Z`` has the columns ``1`` and the input points'
    coordinates (``1 + d``) from the single column's input moments: in step 2 the centres
    ``c_B`` weight ``M_iB`` and the offsets' share is ``sqrt(reg / 2) Phi'_A H^k_A`` with
    ``H^k`` read from ``G`` (:class:`_MeansPlan`).

    ``stride > 1`` computes only every ``stride``-th group of output clusters and every
    ``stride``-th exactly handled row (truncated: chunk of them; the others are left at
    ``Z = 0``): a spatially even
    sample of the work, for timing (:meth:`LocalGaussianExpansion.iteration_seconds`).

    ``work`` (a dict): nothing is computed; the same plan (groups, kept pairs, batches) is
    made and the work it would do is added to ``work`` (:func:`_count_group`,
    :func:`_count_exact_and_groups`), for :meth:`LocalGaussianExpansion.iteration_work`;
    returns ``(None, None)``.

    ``on``: the per-point work (exponents, moments, output rows, exact entries) runs on that
    device, in its Array API namespace, on copies of the sides' arrays kept there
    (:class:`_DeviceArrays`); the cluster-level planning (groups, kept pairs, batches) stays
    on the host, and ``log_w``, ``values`` and the result are NumPy arrays on the host.

    ``lower`` (truncated products, shape ``(out.n_clusters,)`` in ``out``'s cluster order):
    each output cluster's row-sum lower bound over more inputs than ``inn`` (every block of
    a cloud split in blocks, :mod:`.blocks`), so that the pairs skipped are those the whole
    product would skip at this ``truncate``.

    :class:`_Product` holds the plan and assembles the rows, :class:`_Group` runs steps 1 and
    2 for one group of output clusters.
    """
    product = _Product(out, inn, log_w, values, plan, reg, truncate, means, on, lower)
    if work is not None:
        one_group = functools.partial(product.one_group, work=work)
        _count_exact_and_groups(work, product, stride, one_group)
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
        lower: np.ndarray | None = None,
    ) -> None:
        self.out, self.inn, self.plan, self.reg = out, inn, plan, reg
        self.lower = lower  # row-sum lower bounds given by the caller (:func:`_apply`)
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
        self.max_rows = _TRUNCATED_ROWS if self.truncated else None  # None: _ROW_BLOCK
        self.in_batches = inn.batches(kb + self.all_inputs, max_clusters, self.max_rows)
        # truncated: the bounds of every input cluster (exactly handled ones first), and
        # the exact pairs the groups keep, (sorted output rows, sorted input rows) each
        self.in_bounds = None
        self.exact_jobs: list[tuple[np.ndarray, np.ndarray]] = []
        if self.truncated and inn.n_clusters:
            self.in_bounds = _input_bounds(inn, self.w_sorted, first=0)
            self.small_sq = np.einsum("ij,ij->i", inn.centers[:kb], inn.centers[:kb])

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
        planned = self.plan_group(ids)
        if planned is None:  # every input weight is zero: the rows stay empty
            return
        group, batches, out_batches, pair_sq = planned
        if work is not None:  # the plan's work, counted instead of done
            R = self.plan.n_features
            shape = (ids.size, group.kept.size) if group.sparsity is None else group.sparsity
            _count_group(work, batches, out_batches, shape, R, self.d, self.n_values)
            return
        group.run(batches, out_batches, pair_sq, parallel)

    def shared_input_pass(self, groups: list[np.ndarray], parallel: bool) -> None:
        """Steps 1 and 2 of a truncated product for the output clusters ``groups``, step 1
        input-major: the groups whose moments fit ``_SHARED_GROUPS`` times the moments'
        bytes run step 1 together, batch by batch of input clusters, so that a batch's
        features (recomputed per block when the side does not store them: 36% of a product
        at 10^6 points) are read once for all of those groups instead of once per group.
        On the host the groups of a chunk form their moments together (:class:`_Compact`),
        in one buffer the chunks reuse (a fresh page faults on its first write: an array a
        chunk cost 0.5 s of system time a product at 10^5 points, reg 0.003, against 0.03 s);
        the same pairs as :meth:`one_group`, to rounding (a wider matrix product may round
        a moment differently), and the same plan whatever the thread count."""
        planned = [p for p in map(self.plan_group, groups) if p is not None]
        # a device computes features cheaply and sizes its groups by its free memory
        budget = self.A_in.moment_bytes() * (_SHARED_GROUPS if self.A_in.on_host else 1)
        # on the host the moments of the computed pairs only (:class:`_Compact`)
        sizes = [group.moment_rows(batches) for group, batches, _, _ in planned]
        R = self.plan.n_features
        chunks, start = [], 0
        while start < len(planned):
            stop, size = start, 0
            while stop < len(planned):
                size += sizes[stop] * R * 8
                if stop > start and size > budget:
                    break
                stop += 1
            chunks.append((start, stop))
            start = stop
        buffer = None
        if self.A_in.on_host and chunks:
            # the largest chunk's rows and the empty row
            buffer = np.empty((max(sum(sizes[a:b]) for a, b in chunks) + 1, R))
        for start, stop in chunks:
            chunk = planned[start:stop]
            # per input batch (its first cluster), the groups that keep it and its place there
            users: dict[int, list[tuple[_Group, _Batch]]] = {}
            for group, batches, _, _ in chunk:
                for batch in batches:
                    users.setdefault(int(batch.ids[0]), []).append((group, batch))
            shared = [batch for batch in self.in_batches if int(batch.ids[0]) in users]
            compact = None if buffer is None else _Compact(shared, users, buffer)

            def inputs(part: list[_Batch], users=users, compact=compact) -> None:
                for batch in part:
                    features = _BatchFeatures(self.A_in, batch, self.plan.n_features)
                    if compact is not None:
                        compact.input_batch(batch, features)
                        continue
                    for group, local_batch in users[int(batch.ids[0])]:
                        group.input_batch(local_batch, features)

            for group, *_ in chunk:
                group.allocate(compact)
            with np.errstate(under="ignore", invalid="ignore"):
                run_parts(inputs, shared, parallel)
            for group, _, out_batches, pair_sq in chunk:
                group.outputs(out_batches, pair_sq, parallel)
                group.release()

    def plan_group(self, ids: np.ndarray) -> tuple[_Group, list[_Batch], list[_Batch], Any] | None:
        """The output clusters ``ids``' :class:`_Group` (the inputs it keeps and which pairs
        it computes), its input and output batches and its centres' squared distances;
        ``None`` when a truncated product keeps no input (every weight zero)."""
        out, inn, kb = self.out, self.inn, self.kb
        pair_sq = np.einsum("ij,ij->i", out.centers[ids], out.centers[ids])[:, None] + self.in_sq
        pair_sq -= 2.0 * out.centers[ids] @ inn.centers[kb:].T
        np.maximum(pair_sq, 0.0, out=pair_sq)
        kept, batches, keep = self.all_inputs, self.in_batches, None
        if self.truncated:
            kept, batches, keep = self._kept_inputs(ids, pair_sq)
            if kept is None:
                return None
        out_batches = out.batches(ids, ids.size, self.max_rows)
        sparsity = _Sparsity.of(keep, batches, out_batches)
        return _Group(self, ids, kept, sparsity), batches, out_batches, pair_sq

    def _kept_inputs(
        self, ids: np.ndarray, pair_sq: np.ndarray
    ) -> tuple[np.ndarray | None, list[_Batch], np.ndarray | None]:
        """The input clusters a truncated product keeps for the output clusters ``ids``, in
        whole batches (neighbours: their padded features are read as stored), renumbered
        from 0, and the kept pairs among them (``|ids| x kept``, :func:`_kept_pairs`);
        ``(None, [], None)`` when it keeps none."""
        out, kb = self.out, self.kb
        keep = self.kept_pairs(ids, pair_sq)
        if kb:  # the exactly handled input clusters some pair keeps: one exact job
            small = np.flatnonzero(keep[:, :kb].any(axis=0))
            if small.size:
                self.exact_jobs.append((_cluster_rows(out, ids), _cluster_rows(self.inn, small)))
            keep = keep[:, kb:]
        chosen = keep.any(axis=0)
        if not chosen.any():
            return None, [], None
        batches, position = [], 0
        for batch in self.in_batches:
            if chosen[batch.ids - kb].any():
                size = batch.stop - batch.first
                batches.append(replace(batch, first=position, stop=position + size))
                position += size
        kept = np.concatenate([batch.ids for batch in batches]) - kb
        return kept, batches, keep[:, kept]

    def kept_pairs(self, ids: np.ndarray, pair_sq: np.ndarray | None = None) -> np.ndarray:
        """:func:`_kept_pairs` of the output clusters ``ids`` against every input cluster (the
        exactly handled ones first, then the expanded ones whose squared distances
        ``pair_sq`` are, when given): one budget ``truncate`` per row over all of them, the
        exactly handled ones skipped within rounding only (``exact_first``)."""
        out, inn, kb = self.out, self.inn, self.kb
        centers = out.centers[ids]
        near = np.einsum("ij,ij->i", centers, centers)[:, None]
        small_sq = near + self.small_sq - 2.0 * centers @ inn.centers[:kb].T
        if pair_sq is None:
            pair_sq = near + self.in_sq - 2.0 * centers @ inn.centers[kb:].T
        every = np.maximum(np.concatenate([small_sq, pair_sq], axis=1), 0.0)
        radius = out.cluster_radius[ids]
        lower = None if self.lower is None else self.lower[ids]
        return _kept_pairs(
            every, centers, radius, self.in_bounds, self.reg, self.truncate, exact_first=kb,
            lower=lower,
        )  # fmt: skip

    def small_jobs(self, stride: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """The exact jobs of a truncated product's exactly handled output clusters (every
        ``stride``-th chunk of :data:`_EXACT_CLUSTERS`): (rows, the input clusters' rows the
        chunk keeps)."""
        jobs = []
        for start in range(0, self.out.n_small, _EXACT_CLUSTERS * stride):
            ids = np.arange(start, min(start + _EXACT_CLUSTERS, self.out.n_small))
            chosen = np.flatnonzero(self.kept_pairs(ids).any(axis=0))
            jobs.append((_cluster_rows(self.out, ids), _cluster_rows(self.inn, chosen)))
        return jobs

    def exact_pieces(
        self, jobs: list[tuple[np.ndarray, np.ndarray]], parallel: bool
    ) -> list[tuple[np.ndarray, Any, Any]]:
        """``(rows, scale, Z)`` of each exact job: its output rows against its input rows
        (jobs on the pool, in a fixed order); a job without inputs gives empty rows."""
        A_out, A_in, xp = self.A_out, self.A_in, self.xp
        values = self.exact_values

        def run(part) -> list[tuple[np.ndarray, Any, Any]]:
            done = []
            for rows, inputs in part:
                if inputs.size == 0:
                    done.append(self.empty_rows(rows))
                    continue
                on = A_in.put_index(inputs)
                scale, Z = _exact_scaled(
                    A_out,
                    xp.take(A_out.points, A_out.put_index(rows), axis=0),
                    xp.take(A_in.points, on, axis=0),
                    xp.take(self.w_on, on, axis=0),
                    None if values is None else xp.take(values, on, axis=0),
                    self.reg,
                    False,
                )
                done.append((rows, scale, Z))
            return done

        with np.errstate(under="ignore"):
            return [piece for part in run_parts(run, jobs, parallel) for piece in part]

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
        if small_out and self.in_bounds is not None:
            # truncated: each chunk of small output clusters against the inputs it keeps
            parts.extend(self.exact_pieces(self.small_jobs(stride), parallel))
        elif small_out:
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
        if self.k_in or (self.in_bounds is not None and inn.n_small):
            # (truncated, only small inputs: the groups plan their exact jobs alone)
            groups = out.expanded_groups(self.group, spatial=self.truncated)[::stride]
            if self.truncated:
                self.shared_input_pass(groups, parallel)
            else:
                for ids in groups:
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
        if small_in and expanded[0].size and self.in_bounds is not None:
            # the exact pairs the groups kept, aligned with the rows (-inf, 0 where none)
            exact = self.rows_of(self.exact_pieces(self.exact_jobs, parallel))
            exact = self.rows_of([exact, self.empty_rows(np.array([out.n_points]))])
            position = np.full(out.n_points + 1, exact[0].size - 1, dtype=np.int64)
            position[exact[0]] = np.arange(exact[0].size)
            on = A_out.put_index(position[expanded[0]])
            rows, scale, Z = expanded
            aligned = (xp.take(exact[1], on, axis=0), xp.take(exact[2], on, axis=0))
            expanded = (rows, *_combine(xp, scale, Z, *aligned))
        elif small_in and expanded[0].size:
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


class _BatchFeatures:
    """The features of one input batch (``rows=None``) or of a row block of its single
    cluster, computed (or read) when first asked for and kept for the batch's other groups
    (:meth:`_Product.shared_input_pass`); the blocks of a cluster above ``_MOMENT_BYTES``
    of features are not kept (they would take its rows x R at once)."""

    def __init__(self, A_in: Any, batch: _Batch, n_features: int) -> None:
        self.A_in, self.batch, self.kept = A_in, batch, {}
        rows = batch.rows
        self.keep_blocks = rows is None or (rows.stop - rows.start) * n_features * 8 <= (
            _MOMENT_BYTES
        )

    def __call__(self, rows: slice | None) -> Any:
        key = None if rows is None else rows.start
        features = self.kept.get(key)
        if features is None:
            if rows is None:
                features = self.A_in.batch_features(self.batch)
            else:
                features = self.A_in.block_features(rows)[None, ...]
            if rows is None or self.keep_blocks:
                self.kept[key] = features
        return features


class _Sparsity:
    """The pairs a truncated group computes: per batch of kept input clusters, the output
    clusters of the group that keep one of its clusters (its moments' columns), and per
    batch of output clusters, the input clusters one of its clusters keeps (the moments its
    rows read). Every kept pair is computed; a pair computed by neither side's batch has
    shift ``-inf`` and zero moments, and adds nothing, as a pair the bound skips.

    Before, each input batch formed its moments for the whole group and each output row
    read every input the group kept: 2.4 times the kept pairs at 10^5 uniform points, reg
    0.01, tau = 4, truncate 2e-4. At 10^6 points each cluster is a batch of its own, so
    only the kept pairs are computed: counted, 1.54e11 multiply-adds an iteration instead
    of 3.43e11 (``benchmarks/local_products.py``). ``None`` in a dict: every column
    (input) of the group.
    """

    def __init__(self, keep: np.ndarray, in_batches: list[_Batch], out_batches: list[_Batch]):
        self.shape = keep.shape
        self.columns: dict[int, np.ndarray | None] = {}
        for batch in in_batches:
            columns = np.flatnonzero(keep[:, batch.first : batch.stop].any(axis=1))
            self.columns[batch.first] = None if columns.size == keep.shape[0] else columns
        self.inputs: dict[int, np.ndarray | None] = {}
        for batch in out_batches:
            inputs = np.flatnonzero(keep[batch.first : batch.stop].any(axis=0))
            self.inputs[batch.first] = None if inputs.size == keep.shape[1] else inputs

    @classmethod
    def of(cls, keep: np.ndarray | None, in_batches, out_batches) -> _Sparsity | None:
        """The sparsity of the kept pairs ``keep`` (``None``: every pair, untruncated)."""
        return None if keep is None else cls(keep, in_batches, out_batches)

    def n_columns(self, batch: _Batch) -> int:
        columns = self.columns[batch.first]
        return self.shape[0] if columns is None else columns.size

    def n_inputs(self, batch: _Batch) -> int:
        inputs = self.inputs[batch.first]
        return self.shape[1] if inputs is None else inputs.size


class _Compact:
    """The moments of the groups that run step 1 together (:meth:`_Product.shared_input_pass`,
    host, truncated): only the pairs their input batches compute, as rows of R.

    Per shared input batch, the columns of every group that keeps it, side by side: one
    exponent, exponential and matrix product for all of them, written straight into a
    contiguous block of ``store`` (clusters x columns x R), then an appended empty row (zero
    moments; its pairs keep shift ``-inf``). Each group's ``positions`` (kept x group) name a
    pair's row there, or the empty row. Before, each group filled a zeroed dense array (kept
    x group x R, mostly zeros) by a scatter, and each input batch ran one product a group
    with few columns (a memory-bound product: measured 2-10 GFMA/s below 16 columns).
    """

    def __init__(
        self,
        shared: list[_Batch],
        users: dict[int, list[tuple[_Group, _Batch]]],
        buffer: np.ndarray,
    ) -> None:
        self.blocks: dict[int, tuple[int, int, list[tuple[_Group, _Batch, np.ndarray]]]] = {}
        start = 0
        layout = []
        for batch in shared:
            parts, width = [], 0
            for group, local_batch in users[int(batch.ids[0])]:
                sparsity = group.sparsity
                columns = None if sparsity is None else sparsity.columns[local_batch.first]
                columns = np.arange(group.n_group) if columns is None else columns
                parts.append((group, local_batch, columns))
                width += columns.size
            self.blocks[int(batch.ids[0])] = (start, width, parts)
            layout.append((start, width, parts))
            start += (batch.stop - batch.first) * width
        self.store = buffer[: start + 1]  # rows of R, reused by the product's chunks
        self.store[start] = 0.0
        self.positions: dict[int, np.ndarray] = {}
        for start, width, parts in layout:
            at = 0
            for group, local_batch, columns in parts:
                position = self.positions.get(id(group))
                if position is None:
                    position = np.full((group.kept.size, group.n_group), self.store.shape[0] - 1)
                    self.positions[id(group)] = position
                clusters = np.arange(local_batch.stop - local_batch.first)[:, None]
                position[local_batch.first : local_batch.stop, columns] = (
                    start + clusters * width + at + np.arange(columns.size)[None, :]
                )
                at += columns.size

    def input_batch(self, batch: _Batch, features: _BatchFeatures) -> None:
        """Shifts and moments of the input batch ``batch`` (of the product's list) for every
        group that keeps it."""
        start, width, parts = self.blocks[int(batch.ids[0])]
        group = parts[0][0]
        coupling = np.concatenate([g.out_coupling[:, columns] for g, _, columns in parts], axis=1)
        size = batch.stop - batch.first
        out = self.store[start : start + size * width].reshape(size, width, -1)
        top, _ = group.batch_moments(batch, coupling, features, out)
        at = 0
        for group, local_batch, columns in parts:
            rows = slice(local_batch.first, local_batch.stop)
            group.shifts[rows, columns] = top[:, at : at + columns.size]
            at += columns.size


class _Group:
    """Steps 1 and 2 of :func:`_apply` for one group of output clusters against the input
    clusters ``kept`` (numbered from 0 among the expanded ones): the input-side shifts and
    moments (clusters kept x group x R, input-major, so that a batch's moments are one
    contiguous write; truncated on the host, the rows of a :class:`_Compact` that
    ``position`` names), then the output rows; with ``sparsity`` (truncated products) only
    the pairs it names (:class:`_Sparsity`)."""

    def __init__(
        self, product: _Product, ids: np.ndarray, kept: np.ndarray, sparsity: _Sparsity | None
    ) -> None:
        p = self.product = product
        self.xp, self.A_in, self.A_out = p.xp, p.A_in, p.A_out
        self.kept, self.n_group, self.R = kept, ids.size, p.plan.n_features
        self.sparsity = sparsity
        self.out_coupling = p.A_in.put((2.0 / p.reg) * p.out.centers[ids].T)  # (d, n_group)
        coupling = p.in_coupling[:, kept] if p.truncated else p.in_coupling
        self.kept_coupling = p.A_out.put(coupling)
        self.kept_centers = p.A_out.put(p.inn.centers[p.kb :][kept])
        # -inf marks a pair whose input block has only zero weights: it stays out of row maxima.
        self.shifts: Any = None
        self.moments: Any = None
        self.totals: Any = None
        # compact moments (:class:`_Compact`): each pair's row there (kept x group), or the
        # appended empty row where the pair is not computed
        self.position: np.ndarray | None = None

    def moment_rows(self, batches: list[_Batch]) -> int:
        """Rows of R moments the group holds: on the host with ``sparsity``, the pairs its
        input batches compute (:class:`_Compact`), else ``kept x group``."""
        if self.sparsity is None or not self.A_in.on_host:
            return self.kept.size * self.n_group
        return sum((b.stop - b.first) * self.sparsity.n_columns(b) for b in batches)

    def allocate(self, compact: _Compact | None = None) -> None:
        """The shifts and moments step 1 fills (not at planning: a product plans all of
        its groups first); with ``compact`` (the host, truncated) the moments are its rows,
        shared by the groups that run step 1 together."""
        p = self.product
        self.shifts = p.A_in.full((self.kept.size, self.n_group), -np.inf)
        if compact is not None:
            self.moments, self.position = compact.store, compact.positions[id(self)]
            return
        shape = (self.kept.size, self.n_group * p.n_values, self.R)
        self.moments = p.A_in.empty(shape)

    def release(self) -> None:
        """Drop the group's moments once its rows are out."""
        self.shifts = self.moments = self.totals = self.position = None

    def run(
        self,
        in_batches: list[_Batch],
        out_batches: list[_Batch],
        pair_sq: np.ndarray,
        parallel: bool,
    ) -> None:
        """Step 1 on ``in_batches``, then step 2 on ``out_batches`` (each on the pool); a
        truncated group on the host as a :class:`_Compact` of its own."""
        with np.errstate(under="ignore", invalid="ignore"):
            if self.product.truncated and self.A_in.on_host:
                users = {int(batch.ids[0]): [(self, batch)] for batch in in_batches}
                buffer = np.empty((self.moment_rows(in_batches) + 1, self.R))
                compact = _Compact(in_batches, users, buffer)
                self.allocate(compact)

                def inputs(part: list[_Batch]) -> None:
                    for batch in part:
                        compact.input_batch(batch, _BatchFeatures(self.A_in, batch, self.R))

                run_parts(inputs, in_batches, parallel)
            else:
                self.allocate()
                run_parts(self.input_batches, in_batches, parallel)
        self.outputs(out_batches, pair_sq, parallel)
        self.release()

    def outputs(self, out_batches: list[_Batch], pair_sq: np.ndarray, parallel: bool) -> None:
        """Step 2 on ``out_batches`` (on the pool), once step 1 has run."""
        with np.errstate(under="ignore", invalid="ignore"):
            pair = self.A_in.put(pair_sq[:, self.kept])
            self.totals = self.shifts.T - pair / self.product.reg
            run_parts(self.output_batches, out_batches, parallel)

    # ------------------------------------------------------------------ step 1
    def input_batches(self, batches: list[_Batch]) -> None:
        """Shifts and moments of the input batches ``batches``."""
        for batch in batches:
            self.input_batch(batch, _BatchFeatures(self.A_in, batch, self.R))

    def input_batch(self, batch: _Batch, features: _BatchFeatures) -> None:
        """Shifts and moments of the input batch ``batch`` (its place in ``kept``), whose
        features ``features`` gives."""
        xp, A_in = self.xp, self.A_in
        columns = None if self.sparsity is None else self.sparsity.columns[batch.first]
        if columns is None:
            top, block = self.batch_moments(batch, self.out_coupling, features)
        else:
            # the output clusters that keep one of the batch's clusters (n_values = 1);
            # the others read an appended empty pair: shift -inf, zero moments (a gather
            # and a slice write, as the Array API allows)
            on = A_in.put_index(columns)
            coupling = xp.take(self.out_coupling, on, axis=1)
            top, block = self.batch_moments(batch, coupling, features)
            size = block.shape[0]
            top = xp.concat([top, A_in.full((size, 1), -np.inf)], axis=1)
            block = xp.concat([block, A_in.full((size, 1, self.R), 0.0)], axis=1)
            position = np.full(self.n_group, columns.size, dtype=np.int64)
            position[columns] = np.arange(columns.size)
            position = A_in.put_index(position)
            top, block = xp.take(top, position, axis=1), xp.take(block, position, axis=1)
        rows = slice(batch.first, batch.stop)
        self.shifts = A_in.assign(self.shifts, (rows, slice(None)), top)
        self.moments = A_in.assign(self.moments, (rows, Ellipsis), block)

    def batch_moments(
        self, batch: _Batch, coupling: Any, features: _BatchFeatures, out: Any = None
    ) -> tuple[Any, Any]:
        """``(shift, moments)`` of one input batch against the output clusters whose
        ``2 c_A / reg`` are the columns of ``coupling``; the moments written into ``out``
        when given (host)."""
        xp = self.xp
        blocks = batch.row_blocks() if batch.index is None else []
        if len(blocks) > 1:
            # One large cluster: its maximum first, then the moments block by block.
            tops = [
                xp.max(self.exponents(batch, coupling, rows)[0, ...], axis=0) for rows in blocks
            ]
            top = xp.max(xp.stack(tops), axis=0)[None, ...]
            block = sum(
                self.weighted_moments(
                    self.exponents(batch, coupling, rows), batch, rows, top, features(rows)
                )
                for rows in blocks
            )
            if out is not None:
                out[...] = block
            return top, block
        E = self.exponents(batch, coupling)
        top = xp.max(E, axis=1)  # (clusters, columns)
        return top, self.weighted_moments(E, batch, None, top, features(None), out)

    def exponents(self, batch: _Batch, coupling: Any, rows: slice | None = None) -> Any:
        """``E_jA = base_j + log_w_j + 2 c_A . q_j / reg``, shape (clusters, size, columns)."""
        A_in, base_and_w = self.A_in, self.product.base_and_w
        if rows is not None:  # a slice of one large cluster
            E = A_in.local[rows, ...] @ coupling
            E += base_and_w[rows][:, None]
            return E[None, ...]
        E = A_in.gather(batch, A_in.local) @ coupling  # (clusters, size, columns)
        E += A_in.gather(batch, base_and_w)[:, :, None]
        if batch.padding is not None:
            E += A_in.padding(batch)[:, :, None]
        return E

    def weighted_moments(
        self, E: Any, batch: _Batch, rows: slice | None, top: Any, F, out: Any = None
    ) -> Any:
        """``Psi_B^T (exp(E - top) * values)``, shape (clusters, n_group * k, R); written
        into ``out`` when given (host)."""
        xp, A_in, v_on = self.xp, self.A_in, self.product.v_on
        E -= xp.where(xp.isfinite(top), top, xp.zeros_like(top))[:, None, :]
        E = xp.exp(E)
        if v_on is not None:
            V = v_on[rows, ...][None, ...] if rows is not None else A_in.gather(batch, v_on)
            E = xp.reshape(E[..., None] * V[:, :, None, :], (*E.shape[:2], -1))
        if out is not None:
            return np.matmul(E.mT, F, out=out)
        return E.mT @ F  # (clusters, n_group * k, R)

    # ------------------------------------------------------------------ step 2
    def output_batches(self, batches: list[_Batch]) -> None:
        """The output rows of the batches ``batches``, appended to the product's pieces."""
        xp, A_out, pieces = self.xp, self.A_out, self.product.pieces
        n_values = self.product.n_values
        for batch in batches:
            G = None
            if self.position is None:
                G = xp.reshape(self.moments, (self.kept.size, self.n_group, n_values, self.R))
                G = G[:, batch.first : batch.stop, ...]
            tot = self.totals[batch.first : batch.stop, :]
            coupling, centers = self.kept_coupling, self.kept_centers
            inputs = None if self.sparsity is None else self.sparsity.inputs[batch.first]
            if inputs is not None and inputs.size == 0:  # no kept pair: the rows stay empty
                continue
            if self.position is not None:
                # compact moments (n_values = 1): the batch's pairs as whole rows of R, in
                # (output cluster, input) order; a pair not computed reads the empty row
                at = self.position[:, batch.first : batch.stop]
                at = at if inputs is None else at[inputs]
                G = self.moments[at.T.ravel()]
                # (clusters, R, inputs): each matrix transposed (BLAS reads it as is)
                G = xp.reshape(G, (batch.stop - batch.first, -1, self.R)).mT
            if inputs is not None:
                # only the input clusters one of the batch's clusters keeps
                inputs = A_out.put_index(inputs)
                if self.position is None:
                    G = xp.take(G, inputs, axis=0)
                tot = xp.take(tot, inputs, axis=1)
                coupling = xp.take(coupling, inputs, axis=1)
                centers = xp.take(centers, inputs, axis=0)
            if self.position is None:
                # (clusters, R, kept * k): a strided view for one column (BLAS reads it as is)
                G = xp.permute_dims(G, (1, 3, 0, 2))
                G = xp.reshape(G, (batch.stop - batch.first, self.R, -1))
            H = self.offset_moments(G)
            pair = (coupling, centers)
            if batch.index is None:
                for rows in batch.row_blocks():
                    safe, z = self.output_rows(
                        G,
                        H,
                        tot,
                        A_out.local[rows, ...][None, ...],
                        A_out.base[rows][None, ...],
                        A_out.block_features(rows)[None, ...],
                        *pair,
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
                *pair,
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

    def output_rows(
        self, G: Any, H: Any, totals_rows: Any, local: Any, base: Any, F: Any, coupling, centers
    ):
        """``(scale, Z)`` of padded rows ``(clusters, size)`` against the input clusters
        whose ``2 c_B / reg`` and ``c_B`` are ``coupling``'s columns and ``centers``' rows."""
        xp, p = self.xp, self.product
        T = local @ coupling  # (clusters, size, inputs)
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
        centres = (T * M[..., 0]) @ centers
        offsets = xp.reshape(F[..., : p.means.n_features] @ H, (*T.shape[:2], p.d, -1))
        centres += p.half_width * (offsets @ T[..., None])[..., 0]
        return safe, xp.concat([z, centres], axis=2)


def _cluster_rows(side: _Side, clusters: np.ndarray) -> np.ndarray:
    """The sorted rows of ``clusters`` (ascending ids: ascending rows)."""
    starts, sizes = side.offsets[clusters], np.diff(side.offsets)[clusters]
    ends = np.cumsum(sizes)
    return np.repeat(starts - (ends - sizes), sizes) + np.arange(int(ends[-1]) if sizes.size else 0)


def _padded_rows(batch: _Batch) -> int:
    """Rows a batched product computes for ``batch``, padding included."""
    return int(batch.index.size if batch.index is not None else batch.rows.stop - batch.rows.start)


def _count_group(work, in_batches, out_batches, sparsity, R, d, n_values) -> None:
    """Add one group's work (:func:`_apply`'s steps 1 and 2) to ``work``: per input row and
    output cluster it computes an exponent (``d`` multiply-adds and an exponential) and its
    moments (``R k``); per output row and input cluster it reads the same exponent,
    ``F G`` (``R k``) and the sum (``k``); ``sparsity`` (a :class:`_Sparsity`, or the
    group's shape ``(|group|, kept)`` when every pair is computed) says which.
    ``'entries'``: the (row, cluster) pairs; ``'fma'``: multiply-adds in the batched
    products; ``'exp'``: exponentials; ``'calls'``: batched products (each one's fixed
    cost: gathers, temporaries, the interpreter)."""
    if isinstance(sparsity, tuple):
        n_group, kept = sparsity
        inputs = sum(_padded_rows(batch) for batch in in_batches) * n_group
        outputs = sum(_padded_rows(batch) for batch in out_batches) * kept
    else:
        inputs = sum(_padded_rows(batch) * sparsity.n_columns(batch) for batch in in_batches)
        outputs = sum(_padded_rows(batch) * sparsity.n_inputs(batch) for batch in out_batches)
    work["entries"] += inputs + outputs
    work["exp"] += inputs + outputs
    work["calls"] += len(in_batches) + len(out_batches)
    work["fma"] += inputs * (d + n_values * R) + outputs * (d + n_values * (R + 1))


def _count_exact_and_groups(work, product: _Product, stride: int, one_group) -> None:
    """The counting branch of :func:`_apply`: the expanded groups (every ``stride``-th,
    scaled by the share of the expanded rows they hold) and the exactly handled rows
    (``'exact'``: entries computed from the points, each ``d`` multiply-adds and an
    exponential; a truncated product's, from its exact jobs: those of the sampled groups,
    scaled alike, and every chunk of small output clusters)."""
    out, inn = product.out, product.inn
    truncated = product.in_bounds is not None
    expanded_rows = out.n_points - out.small_rows
    exact = 0.0
    if product.k_in or (truncated and inn.n_small):
        before = dict(work)
        sampled = out.expanded_groups(product.group, spatial=product.truncated)[::stride]
        for ids in sampled:
            one_group(ids, False)
        rows = sum(int(np.sum(out.offsets[ids + 1] - out.offsets[ids])) for ids in sampled)
        share = expanded_rows / rows if rows else 0.0
        for key in ("entries", "exp", "fma", "calls"):
            work[key] = before[key] + (work[key] - before[key]) * share
        exact += share * sum(rows.size * inputs.size for rows, inputs in product.exact_jobs)
    if truncated and out.n_small:
        jobs = product.small_jobs(stride)
        sampled_rows = sum(rows.size for rows, _ in jobs)
        small = sum(rows.size * inputs.size for rows, inputs in jobs)
        exact += small * out.small_rows / sampled_rows
    elif not truncated:
        exact += out.small_rows * inn.n_points + expanded_rows * inn.small_rows
    work["exact"] += exact
    work["entries"] += exact


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
            nonlocal Z, scale
            Z = arrays.assign(
                Z,
                (rows, slice(None)),
                xp.sum(logits, axis=1, keepdims=True) if values is None else logits @ values,
            )
            scale = arrays.assign(scale, rows, safe)

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
