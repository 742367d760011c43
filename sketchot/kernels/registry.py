"""One record per backend, and :func:`make_kernel`, the one way to build an operator.

A :class:`Backend` record holds everything the rest of sketchot knows about a backend: its
builder, its parameters and their defaults (read from the builder's signature), the parameter
that sets its rank, its setting at a given rank (for equal-rank comparisons) and at the
paper's "comparable cost", whether its kernel can go negative, small parameters for the
contract tests, and what to try when it is not accurate enough. The solver, the colour
layer, the examples, the benchmarks and the tests read these records; adding a backend is
one call to :func:`register_backend`, from a module of sketchot or from a user's own code.
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from .._dask import any_dask, require_dask
from .._defaults import DEFAULT_ACCURACY
from .._memory import check_fits
from .._validation import check_dtype, check_float, check_int, check_matrix, describe
from ..gibbs import GibbsGeometry

#: The paper's Sinkhorn setting (Han et al. 2020, Section 4.3): sketch dimension and degree.
PAPER_SKETCH_DIM = 20
PAPER_DEGREE = 3


def _paper_rank(sketch_dim: int, degree: int) -> int:
    """Features of the paper's sketch: ``m r`` (its constant feature aside)."""
    return sketch_dim * degree


@dataclass(frozen=True)
class Backend:
    """The facts of one backend.

    Attributes
    ----------
    name : str
    builder : callable
        ``builder(geometry, *, rng, dtype, **params) -> KernelOperator``.
    defaults : mapping
        Keyword parameters (besides ``rng`` and ``dtype``) and their defaults.
    rank_parameter : str or None
        The parameter that sets the number of features (``None``: not a low-rank backend).
    sizing_parameters : tuple of str
        Every parameter that sizes the rank (``rank_parameter`` and the like): a caller who
        sets one of them has chosen the size.
    params_for_rank : callable or None
        ``rank -> params`` giving about ``rank`` features.
    paper_cost : callable or None
        ``(sketch_dim, degree) -> params``: the paper's comparable cost to a Poly-TensorSketch
        of sketch dimension ``m`` and degree ``r`` (Han et al. 2020, Section 4.3).
    signed : bool
        Whether kernel entries (and so ``K v``) can be negative or zero.
    exact : bool
        Whether the operator is the true kernel.
    test_params : mapping
        Small parameters under which it is a reasonable kernel on ~100 points (contract tests).
    memory : callable or None
        ``(n, m, d, params, itemsize) -> bytes``: the build's peak memory, estimated before
        it starts (refused above the budget, naming ``rank_parameter``).
    advice : str
        What to try when its true-kernel check misses the target (shown in warnings).
    summary : str
        One line for tables and ``--help``.
    """

    name: str
    builder: Callable[..., Any]
    defaults: Mapping[str, Any]
    rank_parameter: str | None = None
    sizing_parameters: tuple[str, ...] = ()
    params_for_rank: Callable[[int], dict[str, Any]] | None = None
    paper_cost: Callable[[int, int], dict[str, Any]] | None = None
    signed: bool = True
    exact: bool = False
    test_params: Mapping[str, Any] = field(default_factory=dict)
    memory: Callable[[int, int, int, dict[str, Any], int], float] | None = None
    advice: str = ""
    summary: str = ""


_REGISTRY: dict[str, Backend] = {}


def register_backend(
    name: str,
    builder: Callable[..., Any] | None = None,
    *,
    rank_parameter: str | None = None,
    sizing_parameters: tuple[str, ...] = (),
    params_for_rank: Callable[[int], dict[str, Any]] | None = None,
    paper_cost: Callable[[int, int], dict[str, Any]] | None = None,
    signed: bool = True,
    exact: bool = False,
    test_params: Mapping[str, Any] | None = None,
    memory: Callable[[int, int, int, dict[str, Any], int], float] | None = None,
    advice: str = "",
    summary: str = "",
) -> Any:
    """Register a backend by name (usable as a decorator when ``builder`` is omitted).

    Parameters
    ----------
    name : str
        The name users pass as ``backend=``.
    builder : callable
        ``builder(geometry, *, rng, dtype, **params)`` returning a
        :class:`~sketchot.kernels.KernelOperator`; its keyword-only parameters with defaults
        are the backend's parameters. ``geometry`` is a :class:`~sketchot.gibbs.GibbsGeometry`.
    rank_parameter : str, optional
        The parameter that sets the number of features; with it, ``rank=`` works for this
        backend (``params_for_rank`` defaults to ``{rank_parameter: rank}``).
    sizing_parameters, params_for_rank, paper_cost, signed, exact, test_params, memory, advice,
    summary
        See :class:`Backend`.

    Returns
    -------
    The builder (so that it can decorate a function).

    Examples
    --------
    >>> import numpy as np, sketchot
    >>> from sketchot.kernels import LowRankKernel, KernelInfo
    >>> def build_landmark_rows(geometry, *, rng=None, dtype=np.float64, n_rows=50):
    ...     A = geometry.block(slice(0, n_rows))  # an example kernel, not a good one
    ...     return LowRankKernel(geometry, KernelInfo("my_backend", {"n_rows": n_rows}),
    ...                          A.T, A.T, left_map=None, right_map=None, dtype=dtype)
    >>> _ = sketchot.register_backend("my_backend", build_landmark_rows, rank_parameter="n_rows")
    >>> "my_backend" in sketchot.available_backends()
    True
    >>> sketchot.unregister_backend("my_backend")
    """

    def record(function: Callable[..., Any]) -> Callable[..., Any]:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"name must be an identifier string; got {describe(name)}")
        if name in _REGISTRY or name == "auto":
            raise ValueError(f"backend {name!r} is already registered")
        defaults = {
            key: p.default
            for key, p in inspect.signature(function).parameters.items()
            if p.kind is inspect.Parameter.KEYWORD_ONLY and key not in ("rng", "dtype")
        }
        if rank_parameter is not None and rank_parameter not in defaults:
            raise ValueError(
                f"rank_parameter must be one of the builder's parameters {sorted(defaults)}; "
                f"got {rank_parameter!r}"
            )
        for_rank = params_for_rank
        if for_rank is None and rank_parameter is not None:

            def for_rank(rank: int) -> dict[str, Any]:
                return {rank_parameter: rank}

        _REGISTRY[name] = Backend(
            name=name,
            builder=function,
            defaults=MappingProxyType(defaults),
            rank_parameter=rank_parameter,
            sizing_parameters=tuple(
                dict.fromkeys((*(rank_parameter,) * bool(rank_parameter), *sizing_parameters))
            ),
            params_for_rank=for_rank,
            paper_cost=paper_cost,
            signed=bool(signed),
            exact=bool(exact),
            test_params=MappingProxyType(dict(test_params or {})),
            memory=memory,
            advice=advice,
            summary=summary,
        )
        return function

    return record if builder is None else record(builder)


def unregister_backend(name: str) -> None:
    """Remove a backend registered with :func:`register_backend`."""
    get_backend(name)
    del _REGISTRY[name]


def available_backends() -> tuple[str, ...]:
    """Names of the registered backends, sorted."""
    return tuple(sorted(_REGISTRY))


def get_backend(name: Any) -> Backend:
    """The record of a registered backend, with a clear error for unknown names."""
    if name == "auto":
        raise ValueError(
            "'auto' is not a backend but a choice among them (sinkhorn(..., backend='auto') "
            "and make_kernel(..., backend='auto') make it); get_backend takes one of "
            f"{', '.join(map(repr, available_backends()))}"
        )
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(
            f"backend must be 'auto' or one of {', '.join(map(repr, available_backends()))}; "
            f"got {describe(name)}"
        )
    return _REGISTRY[name]


def backend_parameters(backend: str) -> tuple[str, ...]:
    """Keyword parameters a backend accepts besides ``rng``, ``dtype`` and ``rank``."""
    return tuple(get_backend(backend).defaults)


def comparable_parameters(
    sketch_dim: int = PAPER_SKETCH_DIM, degree: int = PAPER_DEGREE
) -> dict[str, dict[str, int]]:
    """The paper's "comparable cost" setting of every backend that declares one.

    For a Poly-TensorSketch of sketch dimension ``m`` and degree ``r``: RFF with ``D = m r``
    features and Nystrom with ``s = ceil(max(sqrt(r m), r))`` landmarks (Han et al. 2020,
    Section 4.3 and Appendix C). With the paper's ``m = 20, r = 3``: ``D = 60``, ``s = 8``.
    """
    sketch_dim = check_int(sketch_dim, "sketch_dim", minimum=1)
    degree = check_int(degree, "degree", minimum=0)
    return {
        name: record.paper_cost(sketch_dim, degree)
        for name, record in sorted(_REGISTRY.items())
        if record.paper_cost is not None
    }


def paper_nystrom_landmarks(sketch_dim: int, degree: int) -> int:
    """``s = ceil(max(sqrt(r m), r))``: the paper's Nystrom rank for a sketch ``(m, r)``."""
    return max(1, math.ceil(max(math.sqrt(degree * sketch_dim), degree)))


def make_kernel(
    X: Any,
    Y: Any,
    reg: float,
    backend: str = "auto",
    *,
    rng: Any = None,
    dtype: Any = np.float64,
    rank: int | None = None,
    **params: Any,
):
    """Build the Gibbs-kernel operator ``exp(-||x - y||^2 / reg)`` of a backend.

    Parameters
    ----------
    X : array-like, shape (n, d)
        Source points (integer arrays, e.g. pixels, are converted to float). A Dask array
        (chunked by rows) builds the operator on the cluster
        (:mod:`sketchot.distributed`; needs ``pip install "sketchot[dask]"``).
    Y : array-like, shape (m, d)
        Target points (a Dask array likewise).
    reg : float
        Entropic regularisation (> 0); ``K = exp(-M / reg)`` as in POT.
    backend : str, default='auto'
        One of :func:`available_backends`, or ``'auto'``: the cheapest representation whose
        sampled product error meets ``accuracy`` (keyword, default 1e-3): the exact kernel
        stored when ``n x m`` fits 1 GiB, else Nystrom with a doubling rank, else the exact
        kernel streamed (:func:`sketchot.kernels.auto.choose_kernel`; ``info.reason`` says
        which and why).
    rng : None, int, Generator, ...
        Randomness of the approximation (``numpy.random.default_rng`` semantics).
    dtype : numpy.float64 or numpy.float32
        Precision of the stored kernel or factors.
    rank : int or 'auto', optional
        Number of features, for every low-rank backend (it sets the backend's own rank
        parameter: ``n_features``, ``n_landmarks``, ...); not with an explicit value of that
        parameter. ``'auto'`` doubles it from 64 until a sampled relative error of ``K~ v``
        against the true kernel meets ``accuracy`` (keyword, default 1e-3), or until an
        iteration would cost more than the exact kernel's
        (:func:`sketchot.kernels.auto.adaptive_rank`).
    **params
        Backend parameters (see ``sketchot.get_backend(name).defaults``).

    Returns
    -------
    KernelOperator
        With ``info.build_time`` set.
    """
    if any_dask(X, Y):
        # Dask arrays: the geometry stays on the cluster (sketchot.distributed)
        require_dask()
        from ..distributed.geometry import check_reg_and_clouds

        geometry = check_reg_and_clouds(X, Y, reg)
    else:
        X = check_matrix(X, "X")
        Y = check_matrix(Y, "Y", n_features=X.shape[1], feature_name="X")
        reg = check_float(reg, "reg", positive=True)
        geometry = GibbsGeometry(X, Y, reg)
    accuracy = check_float(params.pop("accuracy", DEFAULT_ACCURACY), "accuracy", positive=True)
    if backend == "auto":
        from .auto import choose_kernel  # the ladder builds through this module

        if params or rank is not None:
            raise TypeError(
                "backend='auto' chooses its own parameters; it accepts only accuracy= "
                f"(got {', '.join(sorted(params)) or 'rank'})"
            )
        kernel, reason, _ = choose_kernel(geometry, accuracy=accuracy, rng=rng, dtype=dtype)
        kernel.info.reason = reason
        return kernel
    return build_kernel(
        geometry, backend, rng=rng, dtype=dtype, rank=rank, accuracy=accuracy, **params
    )


def build_kernel(
    geometry: GibbsGeometry,
    backend: str,
    *,
    rng: Any = None,
    dtype: Any = np.float64,
    rank: int | str | None = None,
    accuracy: float = DEFAULT_ACCURACY,
    **params: Any,
):
    """:func:`make_kernel` on an already validated geometry (``accuracy`` is the target of
    ``rank='auto'``)."""
    dtype = check_dtype(dtype)
    record = get_backend(backend)
    unknown = sorted(set(params) - set(record.defaults))
    if unknown:
        accepted = ", ".join(record.defaults) or "no parameters"
        raise TypeError(
            f"backend {backend!r} got unexpected parameter(s) {', '.join(map(repr, unknown))}; "
            f"it accepts: {accepted}" + (", rank" if record.rank_parameter else "")
        )
    # the size parameter a refusal names: the one the caller passed (rank= or the backend's)
    sized_by = record.rank_parameter or next(iter(record.defaults), "the problem size")
    if rank is not None:
        sized_by = "rank"
        if record.params_for_rank is None:
            raise TypeError(f"backend {backend!r} has no rank; do not pass rank=")
        if isinstance(rank, str) and rank == "auto":
            from .auto import adaptive_rank  # the ladder builds through this function

            if record.rank_parameter in params:
                raise TypeError(
                    f"pass either rank= or {record.rank_parameter}= to backend {backend!r}, "
                    "not both"
                )
            return adaptive_rank(
                geometry, backend, accuracy=accuracy, rng=rng, dtype=dtype, **params
            )
        rank = check_int(rank, "rank", minimum=1)
        clash = [name for name in record.sizing_parameters if name in params]
        if clash:
            raise TypeError(
                f"pass either rank= or {', '.join(clash)}= to backend {backend!r}, not both"
            )
        params = {**record.params_for_rank(rank), **params}
    if "accuracy" in record.defaults and "accuracy" not in params:
        params = {**params, "accuracy": accuracy}  # the builder adapts itself to the target
    # The budget is this machine's memory: a distributed geometry keeps its factors on workers.
    if record.memory is not None and not getattr(geometry, "distributed", False):
        n, m = geometry.shape
        check_fits(
            record.memory(n, m, geometry.X.shape[1], {**record.defaults, **params}, dtype.itemsize),
            f"building backend {backend!r} on {n} x {m} points",
            sized_by,
        )
    start = time.perf_counter()
    operator = record.builder(geometry, rng=rng, dtype=dtype, **params)
    operator.info.build_time = time.perf_counter() - start
    return operator
