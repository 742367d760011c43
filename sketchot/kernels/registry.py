"""One record per backend, and :func:`make_kernel`, the one way to build an operator.

A :class:`Backend` record holds everything the rest of sketchot knows about a backend: its
builder, its parameters and their defaults (read from the builder's signature), the parameter
that sets its rank, its setting at a given rank (for equal-rank comparisons) and at the
paper's "comparable cost", whether its kernel can go negative, small parameters for the
contract tests, and what to try when it is not accurate enough. The solver, the colour
layer, the examples, the benchmarks and the tests read these records; adding a backend is
one call to :func:`register_backend`, from a module of sketchot or from a user's own code.
:func:`build_backend` builds one at given parameters (:mod:`.build` has the public entries).
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

from .._defaults import DEFAULT_ACCURACY
from .._memory import check_fits
from .._validation import check_dtype, check_int, describe, unknown_names
from ..gibbs import Cost, GibbsGeometry
from .device import default_dtype

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
    factor_maps : callable or None
        For a low-rank backend, ``factor_maps(geometry, *, rng, dtype, **params)`` (every
        parameter given) returning the fitted
        :class:`~sketchot.kernels.lowrank.FactorMaps` without applying them, for
        geometries that apply row maps themselves (chunked clouds,
        :mod:`sketchot.distributed`).
    advice : str
        What to try when its true-kernel check misses the target (shown in warnings).
    summary : str
        One line for tables and ``--help``.
    kind : {'exact', 'low_rank', 'local'}
        What ``'auto'`` (:mod:`sketchot.kernels.auto`) does with it: the true kernel (tried
        first on small problems and last otherwise), a global low rank (tried at a doubling
        rank while it pays), or an accurate kernel of its own cost (tried when its predicted
        iteration, ``iteration_cost``, beats the exact kernel's). Default: ``'exact'`` when
        ``exact``, ``'low_rank'`` with a ``rank_parameter``, ``'local'`` otherwise.
    auto_order : float or None
        Its place in ``'auto'``'s ladder among records of the same kind (smaller first);
        ``None``: ``'auto'`` never tries it.
    auto_params : mapping
        Parameters ``'auto'`` builds it with (besides the rank).
    streamed_params : mapping
        For the exact kind: parameters that stream the kernel instead of storing it.
    min_dimension, max_dimension : int or None
        Dimensions ``d`` where ``'auto'`` tries it (``None``: no bound).
    iteration_cost : callable or None
        ``kernel -> seconds`` of one iteration PREDICTED from counted work
        (:mod:`sketchot.kernels.cost`: one core, the committed constants), never timed: a
        function of the kernel's parameters and the points only, so that ``'auto'``
        chooses the same on a busy machine. ``'auto'`` tries a ``'local'`` record only when
        it beats the exact kernel's prediction (``None``: always).
    metrics : tuple of str or 'any'
        The costs its kernel represents, by name (:data:`~sketchot.gibbs.METRICS`;
        ``'callable'`` for a callable cost), or ``'any'``: it builds the Gibbs kernel of
        whatever cost the geometry carries. Building it on another cost is refused.
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
    factor_maps: Callable[..., Any] | None = None
    advice: str = ""
    summary: str = ""
    kind: str = "low_rank"
    auto_order: float | None = None
    auto_params: Mapping[str, Any] = field(default_factory=dict)
    streamed_params: Mapping[str, Any] = field(default_factory=dict)
    min_dimension: int | None = None
    max_dimension: int | None = None
    iteration_cost: Callable[[Any], float] | None = None
    metrics: tuple[str, ...] | str = ("sqeuclidean",)

    def supports(self, cost: Cost) -> bool:
        """Whether its kernel represents ``cost``."""
        return self.metrics == "any" or cost.name in self.metrics

    def applies_to(self, dimension: int) -> bool:
        """Whether ``'auto'`` tries it in dimension ``dimension``."""
        return (self.min_dimension is None or dimension >= self.min_dimension) and (
            self.max_dimension is None or dimension <= self.max_dimension
        )


#: The kinds of backend ``'auto'`` knows (:attr:`Backend.kind`).
EXACT_KIND, LOW_RANK_KIND, LOCAL_KIND = KINDS = ("exact", "low_rank", "local")

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
    factor_maps: Callable[..., Any] | None = None,
    advice: str = "",
    summary: str = "",
    kind: str | None = None,
    auto_order: float | None = None,
    auto_params: Mapping[str, Any] | None = None,
    streamed_params: Mapping[str, Any] | None = None,
    min_dimension: int | None = None,
    max_dimension: int | None = None,
    iteration_cost: Callable[[Any], float] | None = None,
    metrics: tuple[str, ...] | str = ("sqeuclidean",),
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
    sizing_parameters, params_for_rank, paper_cost, signed, exact, test_params, memory,
    factor_maps, advice, summary, kind, auto_order, auto_params, streamed_params,
    min_dimension, max_dimension, iteration_cost, metrics
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
        if metrics != "any" and (
            isinstance(metrics, str) or not all(isinstance(m, str) for m in metrics)
        ):
            raise ValueError(
                f"metrics must be 'any' or a tuple of metric names; got {describe(metrics)}"
            )
        if rank_parameter is not None and rank_parameter not in defaults:
            raise ValueError(
                f"rank_parameter must be one of the builder's parameters {sorted(defaults)}; "
                f"got {rank_parameter!r}"
            )
        chosen_kind = kind or (
            EXACT_KIND if exact else LOW_RANK_KIND if rank_parameter is not None else LOCAL_KIND
        )
        if chosen_kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}; got {describe(kind)}")
        if chosen_kind == LOW_RANK_KIND and rank_parameter is None:
            raise ValueError("a backend of kind 'low_rank' needs a rank_parameter")
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
            factor_maps=factor_maps,
            advice=advice,
            summary=summary,
            kind=chosen_kind,
            auto_order=auto_order,
            auto_params=MappingProxyType(dict(auto_params or {})),
            streamed_params=MappingProxyType(dict(streamed_params or {})),
            min_dimension=min_dimension,
            max_dimension=max_dimension,
            iteration_cost=iteration_cost,
            metrics=metrics if metrics == "any" else tuple(metrics),
        )
        return function

    return record if builder is None else record(builder)


def unregister_backend(name: str) -> None:
    """Remove a backend registered with :func:`register_backend`.

    Parameters
    ----------
    name : str
        A registered name (built-in backends can be removed too; importing
        :mod:`sketchot.kernels` again does not bring them back).

    Raises
    ------
    ValueError
        ``name`` is not registered.

    Examples
    --------
    >>> import sketchot
    >>> record = sketchot.get_backend("rff")
    >>> _ = sketchot.register_backend("my_rff", record.builder, rank_parameter="n_features")
    >>> "my_rff" in sketchot.available_backends()
    True
    >>> sketchot.unregister_backend("my_rff")
    >>> "my_rff" in sketchot.available_backends()
    False
    """
    get_backend(name)
    del _REGISTRY[name]


def available_backends() -> tuple[str, ...]:
    """Names of the registered backends, sorted.

    Returns
    -------
    tuple of str
        Every name ``backend=`` accepts besides ``'auto'``: the built-in ``'exact'``,
        ``'nystrom'``, ``'polyts'``, ``'polyts_local'``, ``'rff'`` and those added with
        :func:`register_backend`.

    Examples
    --------
    >>> import sketchot
    >>> {"exact", "nystrom", "polyts", "polyts_local", "rff"} <= set(sketchot.available_backends())
    True
    """
    return tuple(sorted(_REGISTRY))


def get_backend(name: Any) -> Backend:
    """The record of a registered backend, with a clear error for unknown names.

    Parameters
    ----------
    name : str
        A name of :func:`available_backends` (``'auto'`` is a choice among them, not a
        backend, and is refused with that explanation).

    Returns
    -------
    Backend
        The record: builder, parameter ``defaults``, ``rank_parameter``, supported
        ``metrics``, and what ``'auto'`` reads (``kind``, ``auto_order``, dimension bounds).

    Raises
    ------
    ValueError
        ``name`` is ``'auto'``, not a string, or not registered (the message lists the
        registered names).

    Examples
    --------
    >>> import sketchot
    >>> record = sketchot.get_backend("nystrom")
    >>> record.rank_parameter, record.kind
    ('n_landmarks', 'low_rank')
    """
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


def auto_backends(
    kind: str, dimension: int, among: Any = None, cost: Any = None
) -> tuple[Backend, ...]:
    """The records of a kind that ``'auto'`` tries in dimension ``dimension``, in their
    declared order (``among``: only these names, e.g. the backends that run on Dask;
    ``cost``: only those whose kernel represents it)."""
    return tuple(
        sorted(
            (
                record
                for record in _REGISTRY.values()
                if record.kind == kind
                and record.auto_order is not None
                and record.applies_to(dimension)
                and (among is None or record.name in among)
                and (cost is None or record.supports(cost))
            ),
            key=lambda record: (record.auto_order, record.name),
        )
    )


def backend_parameters(backend: str) -> tuple[str, ...]:
    """Keyword parameters a backend accepts besides ``rng``, ``dtype`` and ``rank``.

    Parameters
    ----------
    backend : str
        A registered backend name.

    Returns
    -------
    tuple of str
        The names of its builder's keyword parameters (the keys of its record's
        ``defaults``).
    """
    return tuple(get_backend(backend).defaults)


def rebuild_parameters(backend: str, params: dict[str, Any]) -> dict[str, Any]:
    """The parameters that build a fitted kernel of ``backend`` again, on other points: those
    of its ``info.params`` that the backend's builder accepts (a rank that ``'auto'`` chose,
    a tolerance); the others describe the fit (clusters, degree, error bounds) and are
    refused by the builder.

    Parameters
    ----------
    backend : str
        A registered backend name.
    params : dict
        A kernel's ``info.params``.

    Returns
    -------
    dict
    """
    accepted = get_backend(backend).defaults
    return {name: value for name, value in params.items() if name in accepted}


def comparable_parameters(
    sketch_dim: int = PAPER_SKETCH_DIM, degree: int = PAPER_DEGREE
) -> dict[str, dict[str, int]]:
    """The paper's "comparable cost" setting of every backend that declares one.

    For a Poly-TensorSketch of sketch dimension ``m`` and degree ``r``: RFF with ``D = m r``
    features and Nystrom with ``s = ceil(max(sqrt(r m), r))`` landmarks (Han et al. 2020,
    Section 4.3 and Appendix C). With the paper's ``m = 20, r = 3``: ``D = 60``, ``s = 8``.

    Parameters
    ----------
    sketch_dim : int, default=20
        The sketch dimension ``m`` of the Poly-TensorSketch.
    degree : int, default=3
        Its polynomial degree ``r``.

    Returns
    -------
    dict of str to dict
        For each backend whose record declares a paper cost, the keyword parameters of that
        setting (e.g. ``{'nystrom': {'n_landmarks': 8}, ...}``), ready for
        ``sketchot.sinkhorn(..., backend=name, **params)``.

    Examples
    --------
    >>> import sketchot
    >>> sketchot.comparable_parameters()["rff"]
    {'n_features': 60}
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


def resolve_parameters(
    backend: str,
    params: dict[str, Any],
    *,
    rank: int | str | None = None,
    accuracy: float = DEFAULT_ACCURACY,
) -> tuple[Backend, dict[str, Any]]:
    """``(record, params)``: a backend's parameters checked against its record, with ``rank``
    turned into the backend's own parameter and ``accuracy`` passed to builders that take it.

    ``rank='auto'`` is checked (the backend must have a rank, not also given by name) and left
    to the caller; the parameters are then returned as given.
    """
    record = get_backend(backend)
    unknown = sorted(set(params) - set(record.defaults))
    if unknown:
        accepted = ", ".join(record.defaults) or "no parameters"
        raise TypeError(
            f"backend {backend!r} got unexpected parameter(s) "
            f"{unknown_names(unknown, [*record.defaults, 'rank'])}; "
            f"it accepts: {accepted}" + (", rank" if record.rank_parameter else "")
        )
    if rank is not None:
        if record.params_for_rank is None:
            raise TypeError(f"backend {backend!r} has no rank; do not pass rank=")
        if isinstance(rank, str) and rank == "auto":
            if record.rank_parameter in params:
                raise TypeError(
                    f"pass either rank= or {record.rank_parameter}= to backend {backend!r}, "
                    "not both"
                )
            return record, params
        rank = check_int(rank, "rank", minimum=1)
        clash = [name for name in record.sizing_parameters if name in params]
        if clash:
            raise TypeError(
                f"pass either rank= or {', '.join(clash)}= to backend {backend!r}, not both"
            )
        params = {**record.params_for_rank(rank), **params}
    if "accuracy" in record.defaults and "accuracy" not in params:
        params = {**params, "accuracy": accuracy}  # the builder adapts itself to the target
    return record, params


def check_metric(record: Backend, cost: Cost) -> None:
    """Refuse a backend whose record does not declare the problem's cost, naming those that
    do."""
    if record.supports(cost):
        return
    able = [name for name, other in sorted(_REGISTRY.items()) if other.supports(cost)]
    declared = record.metrics if isinstance(record.metrics, tuple) else ()
    supported = " or ".join(f"metric={name!r}" for name in declared) or "no metric"
    raise ValueError(
        f"backend {record.name!r} supports {supported} only; got {cost}; use "
        f"backend={' or '.join(map(repr, able))}"
    )


def build_backend(
    geometry: GibbsGeometry,
    backend: str,
    *,
    rng: Any = None,
    dtype: Any = np.float64,
    rank: int | None = None,
    accuracy: float = DEFAULT_ACCURACY,
    **params: Any,
):
    """A backend's operator on an in-memory geometry at given parameters (an integer
    ``rank`` or none), its memory checked first, with ``info.build_time`` set. ``dtype=None``:
    the exact kernel's precision where the points live (:func:`~.device.default_dtype`: float32
    on a GPU where it holds ``accuracy``), float64 for the approximations (their signed factors
    cancel in products: float32's rounding is not bounded by the entries')."""
    record, params = resolve_parameters(backend, params, rank=rank, accuracy=accuracy)
    if dtype is None:
        dtype = default_dtype(geometry, accuracy) if record.exact else np.float64
    dtype = check_dtype(dtype)
    check_metric(record, geometry.cost)
    # the size parameter a refusal names: the one the caller passed (rank= or the backend's)
    sized_by = (
        "rank"
        if rank is not None
        else (record.rank_parameter or next(iter(record.defaults), "the problem size"))
    )
    if record.memory is not None:
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
