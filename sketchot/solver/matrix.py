"""The in-memory solve on a cost matrix ``M`` (no point cloud): POT's
``ot.sinkhorn(a, b, M, reg)`` and ``ot.sinkhorn_unbalanced(a, b, M, reg, reg_m)`` on the
one solver.

:func:`sinkhorn_matrix` validates ``M`` (:class:`~sketchot.cost_matrix.CostMatrixGeometry`:
``+inf`` entries are forbidden pairs, negative entries are shifted away for balanced
transport), the weights against its shape, the problem and the allowed pairs, builds the
kernel (the exact ``exp(-M / reg)``, the skeleton ``'cur'``, or ``'auto'``'s choice) and
runs :func:`~sketchot.solver.sinkhorn.solve`: the same iteration, epsilon schedule, Newton
stage, checks and result as a solve on point clouds. It is the body of the public entries
with POT's names (``sketchot.solve(M, a, b, reg=...)``, ``sketchot.matrix.sinkhorn(a, b,
M, reg)``)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from .._defaults import DEFAULT_ACCURACY, DEFAULT_MAX_DENSE_BYTES
from .._validation import RenamableValueError, check_dtype
from ..cost_matrix import CostMatrixGeometry, check_support
from ..kernels import (
    EXACT_BACKEND,
    build_kernel,
    exact_cost_kernel,
    get_backend,
    require_policy,
)
from ..kernels.registry import EXACT_KIND
from ..sparse_cost import SparseCostMatrixGeometry, allowed_pairs, cost_geometry
from .options import SolverOptions
from .problem import make_problem
from .result import SinkhornResult
from .sinkhorn import check_backend_params, solve, warm_start


def check_weights_length(weights: Any, name: str, size: int, side: str) -> None:
    """Refuse 1-D weights whose length is not ``M``'s number of ``side`` (``'rows'`` or
    ``'columns'``), naming ``name`` and ``M`` (the other checks are the problem's)."""
    shape = np.shape(weights) if weights is not None else None
    if shape is not None and len(shape) == 1 and shape[0] != size:
        raise ValueError(
            f"{name} must have one weight per {side[:-1]} of M ({size}); got {shape[0]} weights"
        )


def sinkhorn_matrix(
    a: Any,
    b: Any,
    M: Any,
    reg: Any,
    *,
    options: SolverOptions,
    reg_m: Any = None,
    unbalanced_type: Any = "KL",
    warmstart: Any = None,
    rng: Any = None,
    dtype: Any = np.float64,
    max_dense_bytes: int = DEFAULT_MAX_DENSE_BYTES,
    backend: str = EXACT_BACKEND,
    policy: Any = None,
    **backend_params: Any,
) -> SinkhornResult:
    """Entropic OT on the cost matrix ``M`` with the kernel ``exp(-M / reg)``: exact, a
    registered backend that declares ``'precomputed'`` (the skeleton ``'cur'``), or
    ``'auto'``'s choice among them.

    Parameters
    ----------
    a, b : array_like or None, shapes (n,) and (m,)
        Weights of the rows and of the columns of ``M`` (``None``: uniform).
    M : array_like, shape (n, m), or CostMatrixGeometry
        Costs (:func:`~sketchot.cost_matrix.check_cost_matrix`): ``+inf`` is a forbidden
        pair (the weights are then checked against the allowed pairs:
        :func:`~sketchot.cost_matrix.check_support`); negative costs are solved on ``M -
        min(M)`` for balanced transport (the same plan; the result is put back in terms of
        ``M``: :func:`unshift`) and refused for unbalanced transport, which is not
        shift-invariant. A :class:`~sketchot.cost_matrix.CostMatrixGeometry` at ``reg``
        built without ``shift`` is solved on its costs as they are, negative ones included
        (unbalanced too; ``'auto'`` then takes the exact kernel).
    reg : float
        Entropic regularisation, ``> 0``.
    options : SolverOptions
        The solver's options (``log_domain``, ``epsilon_scaling``, ``accuracy``, ...).
    reg_m : float or pair, optional
        Marginal penalties (``None``: balanced transport).
    unbalanced_type : {'KL', 'TV'}, default='KL'
        Their type (:mod:`~sketchot.solver.penalties`).
    warmstart : tuple of ndarray, optional
        ``(log u, log v)`` to start from.
    rng : None, int or numpy.random.Generator
        The draws of a low-rank kernel and of a sampled true-kernel check.
    dtype : {numpy.float64, numpy.float32}
        Precision of the kernel's storage and products.
    max_dense_bytes : int
        The exact ``exp(-M / reg)`` is stored when it takes at most this many bytes,
        streamed from ``M`` otherwise (``backend='exact'``).
    backend : str, default='exact'
        ``'exact'``, ``'auto'`` (needs ``policy``; with forbidden pairs or negative costs it
        is the exact kernel: a low rank keeps neither the zeros nor, here, the shift) or a
        registered backend for cost matrices (``'cur'``).
    policy : module, optional
        :mod:`sketchot.policy`, passed in by the public layer, for ``backend='auto'``.
    **backend_params
        ``rank`` and the backend's own parameters (``n_pivots``, ``rcond`` for ``'cur'``).

    Returns
    -------
    SinkhornResult
        As for point clouds; the barycentric maps and moments are refused (they need
        points).
    """
    start = time.perf_counter()
    check_backend_params("solve", backend, {**backend_params, "dtype": dtype})
    # a geometry given unshifted: its costs as they are (negative ones included), e.g. the
    # reference-measure costs of sketchot.solve (unbalanced transport is not shift-invariant)
    geometry = M if isinstance(M, CostMatrixGeometry) else cost_geometry(M, reg, shift=True)
    n, m = geometry.shape
    check_weights_length(a, "a", n, "rows")
    check_weights_length(b, "b", m, "columns")
    problem = make_problem(
        a, b, (n, m), geometry.reg, reg_m, unbalanced_type=unbalanced_type,
        **warm_start(warmstart),
    )  # fmt: skip
    hard = tuple(bool(np.isinf(penalty)) for penalty in problem.reg_m)
    if geometry.offset and not all(hard):
        raise RenamableValueError(
            f"M has negative costs (smallest {geometry.min_cost:.6g}) and {{reg_m}}="
            f"{reg_m!r} makes the problem unbalanced, which is not invariant to a shift of M "
            "(a shift moves the optimal mass): sketchot solves it on costs >= 0 only. Shift "
            "M yourself if the shifted problem is the one you mean, or use POT's "
            "ot.sinkhorn_unbalanced(a, b, M, reg, reg_m), which iterates on exp(-M / reg) as "
            "given (its entries overflow once -min(M) / reg exceeds about 709)",
            reg_m="reg_m",
        )
    if geometry.offset and problem.log_u0 is not None:  # the warm start is M's: see unshift
        problem = dataclasses.replace(
            problem, log_u0=problem.log_u0 - geometry.offset / geometry.reg
        )
    if geometry.forbidden:
        check_support(allowed_pairs(geometry), problem.a, problem.b, hard)
    sparse = isinstance(geometry, SparseCostMatrixGeometry)
    if sparse and backend not in ("auto", EXACT_BACKEND):
        raise ValueError(
            f"backend={backend!r} on a sparse M: its missing entries are forbidden pairs "
            "(kernel 0), which no low-rank approximation keeps; use backend='exact' (or "
            "'auto'): the sparse exact kernel costs O(nnz) a product"
        )
    if geometry.offset and backend != "auto" and get_backend(backend).kind != EXACT_KIND:
        raise ValueError(
            f"backend={backend!r} on M with negative costs (smallest {geometry.min_cost:.6g}): "
            "the approximation is built on M - min(M) and its kernel is not put back in terms "
            "of M; use backend='exact' (or 'auto'), or pass M - M.min() (balanced transport: "
            "the same plan, the value lower by min(M) times the mass)"
        )
    dtype = check_dtype(dtype)
    negative = geometry.offset or geometry.min_cost < 0
    if backend == EXACT_BACKEND or (
        backend == "auto" and (geometry.forbidden or negative or sparse)
    ):
        kernel = exact_cost_kernel(geometry, dtype=dtype, max_dense_bytes=max_dense_bytes)
        kernel.info.build_time = time.perf_counter() - start
        if backend == "auto":
            kernel.info.reason = (
                "M has forbidden pairs (+inf) or negative costs, which no low rank keeps: "
                "the exact kernel"
            )
        result = solve(problem, kernel, options, rng=rng)
        if backend == "auto":
            result.reason = kernel.info.reason
    elif backend == "auto":
        result = require_policy(policy, "backend='auto'").solve_auto(
            problem, geometry, options, rng=rng, solve=solve, dtype=dtype
        )
    else:
        accuracy = options.accuracy if options.accuracy is not None else DEFAULT_ACCURACY
        kernel = build_kernel(
            geometry, backend, rng=rng, accuracy=accuracy, policy=policy, dtype=dtype,
            **backend_params,
        )  # fmt: skip
        result = solve(problem, kernel, options, rng=rng)
    return unshift(result) if geometry.offset else result


def unshift(result: SinkhornResult) -> SinkhornResult:
    """A balanced result solved on ``M - offset`` as the result of ``M`` itself: the same
    plan, ``log u`` moved by ``offset / reg`` (``P = diag(u) exp(-M / reg) diag(v)``), the
    cost raised by ``offset`` times the mass, on the kernel ``exp(-M / reg)`` (the value and
    the dual value follow from the potentials)."""
    old = result.kernel
    # the exact kernel of M itself (stored entries, if any, were of M - offset)
    kernel = exact_cost_kernel(
        old.geometry.unshifted(), dtype=old.dtype, max_dense_bytes=old.max_dense_bytes
    )
    kernel.info = old.info
    offset = result.kernel.geometry.offset
    log_u, log_v = result.potentials
    return dataclasses.replace(
        result,
        kernel=kernel,
        potentials=(log_u + offset / result.reg, log_v),
        value_linear=result.value_linear + offset * result.mass,
        notes=[
            *result.notes,
            f"M has negative costs: solved on M - ({offset:.6g}) (balanced transport: the "
            "same plan); potentials and values are those of M",
        ],
    )
