"""One record per backend, and :func:`make_kernel`, the one way to build an operator.

A :class:`Backend` record holds the facts of a backend's kernel: its builder, its
parameters and their defaults (read from the builder's signature), the parameter that sets
its rank, its setting at a given rank (for equal-rank comparisons), whether its kernel can
go negative, the costs it represents, its memory, and what to try when it is not accurate
enough. Whether and how ``'auto'`` tries it is policy (:mod:`sketchot.policy.table`); its
setting at the paper's "comparable cost" is the paper's (:mod:`.paper`); the contract
tests' small parameters are the tests' (``tests/backend_params.py``). Adding a backend is
one call to :func:`register_backend`, from a module of sketchot or from a user's own code.
:func:`build_backend` builds one at given parameters (:mod:`.build` has the public entries).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from .._defaults import DEFAULT_ACCURACY
from .._memory import check_fits
from .._validation import check_dtype, check_int, describe, unknown_names
from ..cost_matrix import block_dim
from ..gibbs import Cost, GibbsGeometry
from .device import default_dtype, runs_on_device


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
    signed : bool
        Whether kernel entries (and so ``K v``) can be negative or zero.
    exact : bool
        Whether the operator is the true kernel.
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
    support : {'points', 'grids'}
        The clouds it builds on: ``'points'``, any; ``'grids'``, tensor-product grids only
        (both clouds full grids, in any order; others are refused by name). ``'auto'``
        chooses a ``'grids'`` backend when both clouds are grids.
    kind : {'exact', 'low_rank', 'local'}
        What its kernel is: the true kernel, a global low rank (its cost and accuracy set
        by a rank), or an accurate kernel of its own cost (local expansions). ``'auto'``
        (:mod:`sketchot.policy`) tries each kind its own way. Default: ``'exact'`` when
        ``exact``, ``'low_rank'`` with a ``rank_parameter``, ``'local'`` otherwise.
    metrics : tuple of str or 'any'
        The costs its kernel represents, by name (:data:`~sketchot.gibbs.METRICS`;
        ``'callable'`` for a callable cost), or ``'any'``: it builds the Gibbs kernel of
        whatever cost of points the geometry carries. A cost matrix (``'precomputed'``,
        no points) is represented by the exact kernel and by backends that name it
        (``('any', 'precomputed')``: both). Building it on another cost is refused.
    """

    name: str
    builder: Callable[..., Any]
    defaults: Mapping[str, Any]
    rank_parameter: str | None = None
    sizing_parameters: tuple[str, ...] = ()
    params_for_rank: Callable[[int], dict[str, Any]] | None = None
    signed: bool = True
    exact: bool = False
    memory: Callable[[int, int, int, dict[str, Any], int], float] | None = None
    factor_maps: Callable[..., Any] | None = None
    advice: str = ""
    summary: str = ""
    kind: str = "low_rank"
    metrics: tuple[str, ...] | str = ("sqeuclidean",)
    support: str = "points"

    def supports(self, cost: Cost) -> bool:
        """Whether its kernel represents ``cost``. ``'any'`` is any cost of points: a cost
        matrix (``'precomputed'``, no points to fit on) takes the exact kernel and the
        backends that declare it."""
        names = (self.metrics,) if isinstance(self.metrics, str) else self.metrics
        if cost.name == "precomputed":
            return self.exact or cost.name in names
        return "any" in names or cost.name in names


#: The kinds of kernel (:attr:`Backend.kind`).
EXACT_KIND, LOW_RANK_KIND, LOCAL_KIND = KINDS = ("exact", "low_rank", "local")

#: The clouds a backend builds on (:attr:`Backend.support`).
SUPPORTS = POINTS_SUPPORT, GRIDS_SUPPORT = ("points", "grids")

_REGISTRY: dict[str, Backend] = {}


def register_backend(
    name: str,
    builder: Callable[..., Any] | None = None,
    *,
    rank_parameter: str | None = None,
    sizing_parameters: tuple[str, ...] = (),
    params_for_rank: Callable[[int], dict[str, Any]] | None = None,
    signed: bool = True,
    exact: bool = False,
    memory: Callable[[int, int, int, dict[str, Any], int], float] | None = None,
    factor_maps: Callable[..., Any] | None = None,
    advice: str = "",
    summary: str = "",
    kind: str | None = None,
    metrics: tuple[str, ...] | str = ("sqeuclidean",),
    support: str = "points",
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
    sizing_parameters, params_for_rank, signed, exact, memory, factor_maps, advice, summary,
    kind, metrics, support
        See :class:`Backend`. Whether ``'auto'`` tries the backend is the policy's
        (:func:`sketchot.policy.register_auto`).

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
        if support not in SUPPORTS:
            raise ValueError(f"support must be one of {SUPPORTS}; got {describe(support)}")
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
            signed=bool(signed),
            exact=bool(exact),
            memory=memory,
            factor_maps=factor_maps,
            advice=advice,
            summary=summary,
            kind=chosen_kind,
            metrics=metrics if metrics == "any" else tuple(metrics),
            support=support,
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
        ``'nystrom'``, ``'polyts'``, ``'polyts_local'``, ``'rff'``, ``'cur'`` (the skeleton
        of a cost matrix's kernel) and those added with :func:`register_backend`.

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
        ``metrics``, ``kind``.

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


def backends_of_kind(kind: str, cost: Any = None) -> tuple[Backend, ...]:
    """The records of a kind (:data:`KINDS`), by name (``cost``: only those whose kernel
    represents it)."""
    return tuple(
        record
        for _, record in sorted(_REGISTRY.items())
        if record.kind == kind and (cost is None or record.supports(cost))
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
    cancel in products: float32's rounding is not bounded by the entries'). Where the caller's
    library holds no float64 (JAX without ``jax_enable_x64``) every kernel on its device is
    float32; the true-kernel check stays float64 on the host, so a miss is reported."""
    record, params = resolve_parameters(backend, params, rank=rank, accuracy=accuracy)
    if dtype is None:
        dtype = default_dtype(geometry, accuracy) if record.exact else np.float64
    dtype = check_dtype(dtype)
    if runs_on_device(geometry) and not geometry.context.float64:
        dtype = np.dtype(np.float32)  # JAX without x64: its float32 rounding is declared
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
            record.memory(n, m, block_dim(geometry), {**record.defaults, **params}, dtype.itemsize),
            f"building backend {backend!r} on {n} x {m} points",
            sized_by,
        )
    start = time.perf_counter()
    operator = record.builder(geometry, rng=rng, dtype=dtype, **params)
    operator.info.build_time = time.perf_counter() - start
    return operator
