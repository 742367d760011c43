"""Building operators: :func:`make_kernel` from point clouds, :func:`build_kernel` from a
validated geometry; ``backend='auto'`` and ``rank='auto'`` go to the policy the caller passes
in (``policy=``: :mod:`sketchot.policy`, a layer above, which this layer never imports),
fixed parameters to :func:`~sketchot.kernels.registry.build_backend`."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._arrays import NUMPY, ArrayContext
from .._defaults import DEFAULT_ACCURACY
from .._validation import check_dtype, check_float, check_matrix, check_rng
from ..gibbs import GibbsGeometry, make_cost
from .judge import kernel_judge
from .registry import build_backend, resolve_parameters


def make_kernel(
    X: Any,
    Y: Any,
    reg: float,
    backend: str = "auto",
    *,
    rng: Any = None,
    dtype: Any = None,
    rank: int | str | None = None,
    metric: Any = "sqeuclidean",
    p: float = 2.0,
    accuracy: float = DEFAULT_ACCURACY,
    policy: Any = None,
    context: ArrayContext = NUMPY,
    **params: Any,
):
    """The in-memory body of :func:`sketchot.make_kernel` (whose signature and documentation
    are the public ones): validate the clouds, ``reg`` and the cost, then let ``'auto'``
    choose the operator (``policy.choose``; see :func:`require_policy`) or build the named
    backend's, on the caller's arrays' placement ``context``."""
    X = check_matrix(X, "X")
    Y = check_matrix(Y, "Y", n_features=X.shape[1], feature_name="X")
    reg = check_float(reg, "reg", positive=True)
    geometry = GibbsGeometry(X, Y, reg, make_cost(metric, p), context=context)
    accuracy = check_float(accuracy, "accuracy", positive=True)
    if backend == "auto":
        if params or rank is not None:
            raise TypeError(
                "backend='auto' chooses its own parameters (pass accuracy= to steer it) "
                f"(got {', '.join(sorted(params)) or 'rank'})"
            )
        generator = check_rng(rng)
        choice = require_policy(policy, "backend='auto'").choose(
            geometry, kernel_judge(accuracy, generator), accuracy=accuracy, rng=generator,
            dtype=None if dtype is None else check_dtype(dtype),
        )  # fmt: skip
        choice.kernel.info.reason = choice.reason
        return choice.kernel
    return build_kernel(
        geometry, backend, rng=rng, dtype=dtype, rank=rank, accuracy=accuracy, policy=policy,
        **params,
    )  # fmt: skip


def build_kernel(
    geometry: GibbsGeometry,
    backend: str,
    *,
    rng: Any = None,
    dtype: Any = np.float64,
    rank: int | str | None = None,
    accuracy: float = DEFAULT_ACCURACY,
    policy: Any = None,
    **params: Any,
):
    """:func:`make_kernel` on an already validated geometry (``accuracy`` is the target of
    ``rank='auto'``, which ``policy.adaptive_rank`` runs)."""
    if isinstance(rank, str) and rank == "auto":
        dtype = check_dtype(dtype)
        resolve_parameters(backend, params, rank=rank)
        return require_policy(policy, "rank='auto'").adaptive_rank(
            geometry, backend, accuracy=accuracy, rng=rng, dtype=dtype, **params
        )
    return build_backend(
        geometry, backend, rng=rng, dtype=dtype, rank=rank, accuracy=accuracy, **params
    )


def require_policy(policy: Any, wanted: str) -> Any:
    """The policy that makes the ``'auto'`` choices, passed in by a layer above this one.

    Parameters
    ----------
    policy : object or None
        Anything with the functions of :mod:`sketchot.policy` that the caller needs
        (``choose``, ``adaptive_rank``, ``solve_auto``); the public entries pass that package.
    wanted : str
        What asked for it (``"backend='auto'"``, ``"rank='auto'"``), for the error.

    Returns
    -------
    object
        ``policy``, unchanged.

    Raises
    ------
    TypeError
        When ``policy`` is None: the kernels and the solver sit below the policy and never
        import it.
    """
    if policy is None:
        raise TypeError(
            f"{wanted} needs the policy that chooses: pass policy=sketchot.policy, or call the "
            "public entries (sketchot.make_kernel, sketchot.sinkhorn), which pass it"
        )
    return policy
