"""The in-memory solve on a cost matrix ``M`` (no point cloud): POT's
``ot.sinkhorn(a, b, M, reg)`` and ``ot.sinkhorn_unbalanced(a, b, M, reg, reg_m)`` on the
one solver.

:func:`sinkhorn_matrix` validates ``M`` (:func:`~sketchot.cost_matrix.check_cost_matrix`),
the weights against its shape and the problem, builds the exact kernel ``exp(-M / reg)``
(:func:`~sketchot.kernels.build_exact_from_cost`) and runs
:func:`~sketchot.solver.sinkhorn.solve`: the same iteration, epsilon schedule, Newton stage,
checks and result as a solve on point clouds. It is the body a public entry with POT's
names (``sketchot.solve(M, a, b, reg=...)``) calls.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._defaults import DEFAULT_MAX_DENSE_BYTES
from ..kernels import build_exact_from_cost
from .options import SolverOptions
from .problem import make_problem
from .result import SinkhornResult
from .sinkhorn import solve, warm_start


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
    warmstart: Any = None,
    rng: Any = None,
    dtype: Any = np.float64,
    max_dense_bytes: int = DEFAULT_MAX_DENSE_BYTES,
) -> SinkhornResult:
    """Entropic OT on the cost matrix ``M`` with the exact kernel ``exp(-M / reg)``.

    Parameters
    ----------
    a, b : array_like or None, shapes (n,) and (m,)
        Weights of the rows and of the columns of ``M`` (``None``: uniform).
    M : array_like, shape (n, m)
        Finite costs ``>= 0``.
    reg : float
        Entropic regularisation, ``> 0``.
    options : SolverOptions
        The solver's options (``log_domain``, ``epsilon_scaling``, ``accuracy``, ...).
    reg_m : float or pair, optional
        KL marginal penalties (``None``: balanced transport).
    warmstart : tuple of ndarray, optional
        ``(log u, log v)`` to start from.
    rng : None, int or numpy.random.Generator
        Only for ``result.check_true_kernel``-style draws (the exact kernel draws nothing).
    dtype : {numpy.float64, numpy.float32}
        Precision of the kernel's storage and products.
    max_dense_bytes : int
        ``exp(-M / reg)`` is stored when it takes at most this many bytes, streamed from
        ``M`` otherwise.

    Returns
    -------
    SinkhornResult
        As for point clouds; the barycentric maps and moments are refused (they need
        points).
    """
    kernel = build_exact_from_cost(M, reg, dtype=dtype, max_dense_bytes=max_dense_bytes)
    n, m = kernel.shape
    check_weights_length(a, "a", n, "rows")
    check_weights_length(b, "b", m, "columns")
    problem = make_problem(a, b, (n, m), kernel.geometry.reg, reg_m, **warm_start(warmstart))
    return solve(problem, kernel, options, rng=rng)
