"""Building operators on Dask clouds: the backends that run on a cluster, and ``'auto'``.

The exact backend is :func:`~sketchot.distributed.kernels.dask_exact_kernel` (the exact kernel
on a :class:`~sketchot.distributed.kernels.DaskStreamedExact` placement); every backend
whose registry record has ``factor_maps`` (the low-rank ones: ``nystrom``, ``rff``, the global
``polyts`` variants) is fitted on the client exactly as in memory and its factors built chunk
by chunk (:func:`~sketchot.distributed.kernels.dask_low_rank_from_maps`). Parameters are
checked against the same records as in memory (:func:`~sketchot.kernels.registry.
resolve_parameters`). ``'auto'`` runs the policy's one strategy (:mod:`sketchot.policy`) with these
builders, a sampled kernel check on the cluster (:func:`dask_kernel_error`) and only the
records that run on Dask (:func:`dask_backends`): the low-rank ones at a doubling rank while
their error falls, else the exact kernel (nothing is ever stored whole).
"""

from __future__ import annotations

import time
from typing import Any

import dask
import dask.array as da
import numpy as np

from .._defaults import DEFAULT_ACCURACY
from .._validation import check_dtype, check_float, check_rng
from ..gibbs import gibbs_matmat
from ..kernels import KernelOperator, available_backends, get_backend, require_policy
from ..kernels.judge import KERNEL_CHECK_ROWS, Attempt, kernel_judge
from ..kernels.registry import (
    EXACT_KIND,
    LOCAL_KIND,
    POINTS_SUPPORT,
    check_metric,
    resolve_parameters,
)
from .geometry import DaskGibbsGeometry, check_reg_and_clouds, persist_now
from .kernels import _tree_sum, dask_exact_kernel, dask_low_rank_from_maps, per_chunk
from .local import dask_local_kernel


def _exact(geometry: DaskGibbsGeometry, *, dtype: Any, **params: Any) -> KernelOperator:
    """The exact kernel streamed on the workers (``max_dense_bytes``: nothing is stored;
    no draws: ``rng``)."""
    del params
    return dask_exact_kernel(geometry, dtype=dtype)


def _local(geometry: DaskGibbsGeometry, *, dtype: Any, rng: Any = None, **params: Any):
    """The block-local kernel in blocks of whole clusters on the workers."""
    return dask_local_kernel(geometry, rng=rng, dtype=dtype, **params)


#: Kinds of point backend (:attr:`~sketchot.kernels.registry.Backend.kind`) with a builder
#: of their own on Dask (the low-rank ones need ``factor_maps``).
DASK_BUILDERS = {EXACT_KIND: _exact, LOCAL_KIND: _local}


def _dask_builder(record: Any) -> Any:
    """The Dask builder of a backend's record, or ``None``."""
    if record.support != POINTS_SUPPORT:
        return None
    return DASK_BUILDERS.get(record.kind)


def dask_backends(cost: Any = None) -> tuple[str, ...]:
    """The registered backends that run on Dask arrays (``cost``: only those whose kernel
    represents it, as in memory)."""
    return tuple(
        name
        for name in available_backends()
        if (
            _dask_builder(get_backend(name)) is not None
            or get_backend(name).factor_maps is not None
        )
        and (cost is None or get_backend(name).supports(cost))
    )


def build_dask_backend(
    geometry: DaskGibbsGeometry,
    backend: str,
    *,
    rng: Any = None,
    dtype: Any = np.float64,
    rank: int | None = None,
    accuracy: float = DEFAULT_ACCURACY,
    **params: Any,
) -> KernelOperator:
    """A backend's operator on Dask clouds at given parameters (an integer ``rank`` or none),
    with ``info.build_time`` set."""
    dtype = check_dtype(dtype)
    record, params = resolve_parameters(backend, params, rank=rank, accuracy=accuracy)
    check_metric(record, geometry.cost)
    params = {**record.defaults, **params}
    start = time.perf_counter()
    builder = _dask_builder(record)
    if builder is not None:
        operator = builder(geometry, dtype=dtype, rng=rng, **params)
    elif record.factor_maps is not None:
        maps = record.factor_maps(geometry, rng=rng, dtype=dtype, **params)
        operator = dask_low_rank_from_maps(geometry, maps)
    else:
        raise NotImplementedError(
            f"backend {backend!r} does not run on Dask arrays (its record has no factor_maps); "
            f"on Dask: 'auto', {', '.join(map(repr, dask_backends()))}"
        )
    operator.info.build_time = time.perf_counter() - start
    return operator


def build_dask_kernel(
    geometry: DaskGibbsGeometry,
    backend: str,
    *,
    rng: Any = None,
    dtype: Any = np.float64,
    rank: int | str | None = None,
    accuracy: float = DEFAULT_ACCURACY,
    policy: Any = None,
    **params: Any,
) -> KernelOperator:
    """:func:`build_dask_backend`, or with ``rank='auto'`` the doubling-rank ladder of
    ``policy.adaptive_rank`` (:func:`sketchot.policy.adaptive_rank`, passed in by a layer
    above) checked on the cluster."""
    if isinstance(rank, str) and rank == "auto":
        dtype = check_dtype(dtype)
        resolve_parameters(backend, params, rank=rank)
        return require_policy(policy, "rank='auto'").adaptive_rank(
            geometry, backend, accuracy=accuracy, rng=rng, dtype=dtype,
            build=build_dask_backend, measure=dask_kernel_error, **params,
        )  # fmt: skip
    return build_dask_backend(
        geometry, backend, rng=rng, dtype=dtype, rank=rank, accuracy=accuracy, **params
    )


def choose_dask_kernel(
    geometry: DaskGibbsGeometry,
    *,
    accuracy: float = DEFAULT_ACCURACY,
    rng: Any = None,
    dtype: Any = np.float64,
    verbose: bool = False,
    policy: Any = None,
) -> tuple[KernelOperator, str, list[Attempt]]:
    """``backend='auto'`` on Dask: ``policy.choose`` (:func:`sketchot.policy.choose`, passed
    in by a layer above) over the backends that run on Dask, without the stored exact kernel,
    each candidate judged by its sampled kernel error on the cluster. Returns ``(kernel,
    reason, attempts)``."""
    generator = check_rng(rng)
    choice = require_policy(policy, "backend='auto'").choose(
        geometry, kernel_judge(accuracy, generator, dask_kernel_error), accuracy=accuracy,
        rng=generator, dtype=check_dtype(dtype), build=build_dask_backend,
        measure=dask_kernel_error, store=False, among=dask_backends(geometry.cost),
        verbose=verbose,
    )  # fmt: skip
    return choice.kernel, choice.reason, list(choice.attempts)


def make_kernel_dask(
    X: Any,
    Y: Any,
    reg: float,
    backend: str = "auto",
    *,
    rng: Any = None,
    dtype: Any = np.float64,
    rank: int | str | None = None,
    policy: Any = None,
    metric: Any = "sqeuclidean",
    p: Any = 2.0,
    **params: Any,
) -> KernelOperator:
    """:func:`sketchot.make_kernel` on Dask clouds (same parameters, every metric; it
    dispatches here, and passes the policy that ``'auto'`` needs)."""
    geometry = check_reg_and_clouds(X, Y, reg, metric, p)
    accuracy = check_float(params.pop("accuracy", DEFAULT_ACCURACY), "accuracy", positive=True)
    if backend == "auto":
        if params or rank is not None:
            raise TypeError(
                "backend='auto' chooses its own parameters; it accepts only accuracy= "
                f"(got {', '.join(sorted(params)) or 'rank'})"
            )
        kernel, reason, _ = choose_dask_kernel(
            geometry, accuracy=accuracy, rng=rng, dtype=dtype, policy=policy
        )
        kernel.info.reason = reason
        return kernel
    return build_dask_kernel(
        geometry, backend, rng=rng, dtype=dtype, rank=rank, accuracy=accuracy, policy=policy,
        **params,
    )  # fmt: skip


def _true_products_chunk(other: np.ndarray, V: np.ndarray, own: np.ndarray, reg: float, cost):
    """``K(own, other_chunk) V_chunk`` flattened to (1, 2 k): a chunk's part of the true
    products of the ``k`` sampled rows ``own``."""
    return gibbs_matmat(own, other, reg, V, cost).reshape(1, -1)


def dask_kernel_error(
    kernel: KernelOperator, rng: Any = None, n_rows: int = KERNEL_CHECK_ROWS
) -> float:
    """:func:`sketchot.kernels.judge.kernel_error` on Dask: the largest relative error of
    ``K~ v`` and ``K~^T u`` against the true kernel on ``n_rows`` sampled rows and columns,
    for an all-ones and a random positive vector (drawn on the workers from a seed of
    ``rng``); ``O(n_rows (n + m) d)`` work on the workers, one computation per side."""
    generator = check_rng(rng)
    g = kernel.geometry
    n, m = kernel.shape
    worst = 0.0
    for transpose, size, other in ((False, n, m), (True, m, n)):
        index = np.sort(generator.choice(size, size=min(n_rows, size), replace=False))
        cloud = g.Xc if transpose else g.Yc
        draws = da.random.default_rng(int(generator.integers(2**63))).random(
            other, chunks=(cloud.chunks[0],)
        )
        probes = da.stack([da.ones_like(draws), draws + 0.1], axis=1).rechunk({1: -1})
        # persisted first: the two graphs below then name finished keys, never two different
        # task specs for one key (which the scheduler warns can deadlock)
        (probes,) = persist_now(probes)
        own = g.rows("y" if transpose else "x", index)
        cost = g.cost.transposed() if transpose else g.cost
        truth = _tree_sum(
            per_chunk(_true_products_chunk, [cloud, probes], (own, g.reg, cost), 2 * index.size,
                      partial=True)
        )  # fmt: skip
        approx = kernel.rmatmat(probes) if transpose else kernel.matmat(probes)
        truth, approx = dask.compute(truth, _as_array(approx)[index])
        truth = truth.reshape(index.size, 2)
        with np.errstate(divide="ignore", invalid="ignore"):
            error = np.abs(approx - truth) / truth
        worst = max(worst, float(np.nanmax(np.where(np.isfinite(error), error, np.inf))))
    return worst


def _as_array(value: Any) -> Any:
    return value if hasattr(value, "chunks") else da.from_array(np.asarray(value))
