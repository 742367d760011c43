"""The public entries, and the one place where Dask inputs part from in-memory ones.

``sketchot.sinkhorn``, ``sinkhorn2``, ``sinkhorn_unbalanced``, ``solve_sample``,
``sinkhorn_kernel`` and ``make_kernel`` own their signatures and documentation here: every
parameter is named, the solver's options (:class:`~sketchot.SolverOptions`, whose defaults
and documentation they read) included; only the backend's own parameters (its registry
record's ``defaults``) arrive as further keywords, checked by name with a did-you-mean. Dask
arrays (and kernels built on them) go to :mod:`sketchot.distributed`, imported only then
(Dask is an optional dependency), everything else to :mod:`sketchot.solver` and
:mod:`sketchot.kernels`, which never see a Dask array. The top layer: nothing in the package
imports it but ``sketchot/__init__.py`` and the jobs built on the public solves.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

# the in-memory bodies by module (their names are the public ones: no aliases to follow)
from . import kernels, policy, solver
from ._arrays import NUMPY, ArrayContext, array_context, in_user_arrays
from ._dask import any_dask, require_dask
from ._validation import RenamableError, check_dtype, describe, unknown_names
from .grid import RegularGrid, check_grid
from .kernels import EXACT_BACKEND, GRID_BACKEND
from .solver import (
    ResultView,
    SolverOptions,
    check_unbalanced_type,
    in_points_dtype,
    several_targets,
)

#: The options' defaults, read from their one definition.
_DEFAULT = SolverOptions()


def _options(values: dict[str, Any]) -> SolverOptions:
    """The validated solver options of a call: its ``options`` object, or its flat keywords
    (one or the other: a flat keyword that differs from its default next to ``options=`` is
    refused by name, since either choice would silently drop the other)."""
    flat = {name: values[name] for name in SolverOptions.names()}
    options = values.get("options")
    if options is None:
        return SolverOptions(**flat)
    if not isinstance(options, SolverOptions):
        raise TypeError(
            f"options must be a sketchot.SolverOptions or None; got {type(options).__name__}"
        )
    given = [name for name, value in flat.items() if not _is_default(name, value)]
    if given:
        listed = ", ".join(f"{name}={flat[name]!r}" for name in given)
        raise TypeError(
            f"pass the solver's options either as options= or as keywords, not both; got "
            f"options= and {listed}: use dataclasses.replace(options, {given[0]}=...)"
        )
    return options


def _is_default(name: str, value: Any) -> bool:
    """Whether ``value`` is the option ``name``'s default (what an omitted keyword gives)."""
    return _same(value, getattr(_DEFAULT, name))


def _same(value: Any, default: Any) -> bool:
    """``value`` is ``default``, or equal to it with the same type (``1`` is not ``True``)."""
    return value is default or (type(value) is type(default) and value == default)


def _options_doc() -> str:
    """The options' numpydoc entries, from :class:`SolverOptions`'s own documentation, and
    the ``options`` entry that takes them as one object."""
    doc = SolverOptions.__doc__ or ""
    entries = doc[doc.index("----------\n") + len("----------\n") :].rstrip()
    return entries + _OPTIONS_OBJECT_DOC


#: The ``options`` entry of the solves' documentation.
_OPTIONS_OBJECT_DOC = """
    options : SolverOptions or None, default=None
        The options above as one object (``sketchot.SolverOptions(tol=1e-9, max_iter=5000)``,
        reusable across calls and checked once); not together with any of them as a keyword
        that differs from its default."""


#: ``dtype``'s entry, shared by the solves and :func:`make_kernel`.
_DTYPE_DOC = """    dtype : numpy.float64, numpy.float32 or None, default=None
        Precision of the stored kernel or factors (and of the exact kernel's passes on a
        GPU). ``None``: float64, except for the exact kernel on an accelerator (CUDA
        tensors), which takes float32 when ``accuracy`` is at least ten times float32's
        rounding of its exponents (``1.2e-7 * max_cost / reg``; the true-kernel check stays
        float64). See :func:`sketchot.kernels.device.default_dtype`."""


def _documented(func):
    """Fill ``{options}`` and ``{dtype}`` in ``func``'s docstring with their entries."""
    doc = func.__doc__.replace("    {options}", _options_doc())
    func.__doc__ = doc.replace("    {dtype}", _DTYPE_DOC)
    return func


def _named_only(hint: str):
    """Reject keywords that ``func``'s signature does not name with a did-you-mean and
    ``hint`` (Python's own error names the first one only and suggests nothing)."""

    def decorate(func):
        accepted = list(inspect.signature(func).parameters)

        @functools.wraps(func)
        def checked(*args: Any, **kwargs: Any):
            unknown = sorted(set(kwargs) - set(accepted))
            if unknown:
                raise TypeError(
                    f"{func.__name__}() got unexpected keyword argument(s) "
                    f"{unknown_names(unknown, accepted)}; {hint}; it accepts: "
                    f"{', '.join(accepted)}"
                )
            return func(*args, **kwargs)

        return checked

    return decorate


@contextlib.contextmanager
def _in_terms_of(caller: str, **names: str) -> Iterator[None]:
    """Re-raise the :class:`~sketchot._validation.RenamableError`s of a call to
    :func:`sinkhorn` in the terms of the public function ``caller`` that made it, whose
    arguments ``names`` maps from :func:`sinkhorn`'s (``reg_m`` is ``solve_sample``'s
    ``unbalanced``)."""
    try:
        yield
    except RenamableError as error:
        raise error.renamed(caller=caller, **names) from None


def _distributed():
    """:mod:`sketchot.distributed`, with a clear error when Dask is not installed."""
    require_dask()
    from . import distributed

    return distributed


def on_dask(*values: Any) -> bool:
    """Whether any of ``values`` (or an item of a list or tuple among them) is a Dask array:
    the jobs built on the public entries ask here, the one place that tells Dask inputs
    apart, and then call their Dask form (:func:`sinkhorn_divergence_dask`,
    :func:`barycenter_dask`)."""
    listed = [value if isinstance(value, (list, tuple)) else [value] for value in values]
    return any_dask(*(item for items in listed for item in items))


def sinkhorn_divergence_dask(X: Any, Y: Any, a: Any, b: Any, *args: Any, **kwargs: Any) -> Any:
    """:func:`sketchot.sinkhorn_divergence` of Dask arrays
    (:func:`sketchot.distributed.jobs.sinkhorn_divergence_dask`, the policy passed in)."""
    _refuse_on_dask(kwargs.pop("metric", "sqeuclidean"), "sinkhorn_divergence")
    return _distributed().sinkhorn_divergence_dask(X, Y, a, b, *args, policy=policy, **kwargs)


def barycenter_dask(clouds: Any, *args: Any, **kwargs: Any) -> Any:
    """:func:`sketchot.barycenter` of Dask clouds
    (:func:`sketchot.distributed.jobs.barycenter_dask`, the policy passed in)."""
    _refuse_on_dask(kwargs.pop("metric", "sqeuclidean"), "barycenter")
    return _distributed().barycenter_dask(clouds, *args, policy=policy, **kwargs)


def map_image_dask(result: Any, image: Any, *, mapper: Any, **options: Any) -> Any:
    """:func:`sketchot.map_image` of a Dask image
    (:func:`sketchot.distributed.images.map_image_dask`: ``mapper``, the in-memory mapping,
    runs on each chunk); returns ``(mapped image, counts)``, lazy."""
    return _distributed().map_image_dask(result, image, mapper=mapper, **options)


def visible_pixels_dask(image: Any, name: str = "image") -> Any:
    """The visible pixels of a Dask image for :func:`sketchot.sample_pixels`, gathered on
    demand (:class:`sketchot.distributed.VisiblePixels`)."""
    return _distributed().visible_pixels_dask(image, name)


def _refuse_on_dask(metric: Any, job: str) -> None:
    """The divergence and barycentres on Dask use the squared-Euclidean cost (their
    gradients and support updates are those of ``||x - y||^2``); ``sinkhorn`` and
    ``make_kernel`` take every metric on Dask."""
    if not (isinstance(metric, str) and metric == "sqeuclidean"):
        name = metric if isinstance(metric, str) else "a callable"
        raise NotImplementedError(
            f"metric={name!r} is not implemented for {job} on Dask arrays (squared Euclidean "
            "only; sketchot.sinkhorn and make_kernel take every metric there); compute the "
            "clouds (numpy arrays) for another metric"
        )


def _on_dask(kernel: Any, *weights: Any) -> bool:
    """Whether a solve on ``kernel`` runs with Dask: a kernel built on Dask clouds, or Dask
    weights."""
    geometry = getattr(kernel, "geometry", None)
    return any_dask(getattr(geometry, "X", None), *weights)


def _penalty_type(unbalanced_type: Any, b: Any, on_dask: bool) -> str:
    """The validated ``unbalanced_type``; a penalty other than KL is refused by name with
    several targets and on Dask, whose iterations only raise the ratios to powers."""
    unbalanced_type = check_unbalanced_type(unbalanced_type)
    if unbalanced_type != "KL" and (several_targets(b) or on_dask):
        where = "several targets (b of shape (m, k))" if several_targets(b) else "Dask arrays"
        raise NotImplementedError(
            f"unbalanced_type={unbalanced_type!r} is not implemented with {where}: their "
            "iterations raise the ratios to powers (KL penalties); solve each problem alone "
            "in memory, or pass unbalanced_type='KL'"
        )
    return unbalanced_type


def _build(rank: Any, dtype: Any) -> dict[str, Any]:
    """``rank`` and ``dtype`` as the builders take them (``rank=None``: not given)."""
    if dtype is not None:
        check_dtype(dtype)  # named here, not by NumPy inside the kernel's choice
    return {"dtype": dtype} if rank is None else {"dtype": dtype, "rank": rank}


@_documented
@in_user_arrays("a", "b", "X", "Y", "warmstart")
def sinkhorn(
    a: Any,
    b: Any,
    X: Any,
    Y: Any = None,
    reg: float | None = None,
    backend: str = "auto",
    *,
    reg_m: Any = None,
    unbalanced_type: str = "KL",
    metric: Any = "sqeuclidean",
    p: float = 2.0,
    warmstart: Any = None,
    rank: Any = None,
    dtype: Any = None,
    rng: Any = None,
    max_iter: int = _DEFAULT.max_iter,
    tol: float | None = _DEFAULT.tol,
    check_every: int | str = _DEFAULT.check_every,
    safeguard: str = _DEFAULT.safeguard,
    log_domain: bool | str = _DEFAULT.log_domain,
    coarse_to_fine: bool | str = _DEFAULT.coarse_to_fine,
    epsilon_scaling: bool | str = _DEFAULT.epsilon_scaling,
    anderson: int | str = _DEFAULT.anderson,
    accuracy: float | None = _DEFAULT.accuracy,
    certify_first: bool = _DEFAULT.certify_first,
    true_kernel_samples: int | str = _DEFAULT.true_kernel_samples,
    errors: str = _DEFAULT.errors,
    warn: bool = _DEFAULT.warn,
    verbose: bool = _DEFAULT.verbose,
    options: SolverOptions | None = None,
    _arrays: ArrayContext = NUMPY,
    **backend_params: Any,
):
    """Entropic optimal transport between two point clouds with a pluggable Gibbs kernel.

    Solves ``min_P <P, M> + reg KL(P | a b^T) + reg_m_a KL(P 1 | a) + reg_m_b KL(P^T 1 | b)``
    over non-negative plans, ``M_ij = c(x_i, y_j)`` (``||x_i - y_j||^2`` by default) and the
    generalised ``KL(p | q) = sum p log(p / q) - p + q`` (POT's
    ``ot.unbalanced.sinkhorn_unbalanced`` with ``reg_type='kl'``; ``reg_m=None``, the
    default, is balanced transport, a hard constraint on both sides), by Sinkhorn's scaling
    iteration on ``K = exp(-M / reg)``, where ``K`` is exact or approximated by ``backend``
    (:mod:`sketchot.solver.engine`).

    Parameters
    ----------
    a : array-like of shape (n,) or None
        Source weights (non-negative; ``None`` for uniform ``1/n``). Zero weights are allowed.
        If any of ``a``, ``b``, ``X``, ``Y`` is a Dask array, the solve runs with Dask
        (:mod:`sketchot.distributed`; ``pip install ".[dask]"`` in a clone). PyTorch tensors (or
        another Array API library's arrays) give a result in that library, on their device,
        in the points' dtype, the kernel's products run there (``pip install
        ".[torch]"`` in a clone; the user guide's page on arrays).
    b : array-like of shape (m,), (m, k) or None
        Target weights; the same total mass as ``a`` for balanced transport. POT's ``b`` of
        shape ``(m, k)`` solves ``k`` targets on one kernel, one matrix product per
        half-iteration (:mod:`sketchot.solver.targets`), and returns a
        :class:`~sketchot.solver.TargetsResult`: ``value_linear`` holds the ``k`` values
        (what POT's ``sinkhorn`` returns then), ``potentials`` have shapes ``(n, k)`` and
        ``(m, k)``, each target converges and is certified on its own. NumPy arrays only
        (not Dask, not tensors), no gradient; every column needs the mass of ``a`` unless
        ``reg_m`` is finite (POT rescales such columns silently; here they are refused).
    X : array-like, shape (n, d)
        Source points (integer arrays such as pixels are converted to float). NumPy float32
        points give float32 arrays and values (POT's convention; the solve runs in float64).
    Y : array-like, shape (m, d)
        Target points. For a precomputed cost matrix ``M`` use :func:`sketchot.solve`
        (``sketchot.solve(M, a, b, reg=...)``, POT's ``ot.solve`` names).
    reg : float
        Entropic regularisation (> 0), required as in POT's ``ot.sinkhorn(a, b, M, reg)``
        (a ``TypeError`` names it when missing). The paper's ``gamma`` is ``1 / reg``.
    backend : str, default='auto'
        ``'auto'`` (the cheapest kernel that meets ``accuracy``, escalating when the check
        fails: :mod:`sketchot.policy.solve`) or a registered backend
        (:func:`sketchot.available_backends`), used as it is.
    reg_m : None, float or pair of float, default=None
        KL penalties of the marginals (POT's ``reg_m``, in units of the cost): ``None`` for
        balanced transport, a number for both sides, ``(reg_m_a, reg_m_b)`` for each, with
        ``float('inf')`` for a hard side (``(inf, s)`` is semi-relaxed). Unequal masses of
        ``a`` and ``b`` are allowed only with a finite penalty.
    unbalanced_type : {{'KL', 'TV'}}, default='KL'
        The type of the finite penalties (POT's ``ot.solve`` name, case-insensitive):
        ``'KL'`` is ``reg_m KL(P 1 | a)``; ``'TV'`` is ``reg_m ||P 1 - a||_1`` (total
        variation: each potential is clipped to ``[-reg_m, reg_m]``, Sejourne et al. 2019),
        on every backend, in memory (not on Dask arrays, not with several targets).
    metric : str or callable, default='sqeuclidean'
        The cost, with POT's ``ot.dist`` names: ``'sqeuclidean'`` ``||x - y||^2``,
        ``'euclidean'`` ``||x - y||``, ``'cityblock'`` ``||x - y||_1``, ``'minkowski'``
        ``||x - y||_p``, or a callable ``metric(A, B)`` returning the cost block of shape
        ``(len(A), len(B))``. Squared Euclidean is the only cost of the polynomial and
        Fourier kernels; a backend that does not declare the metric
        (``sketchot.get_backend(name).metrics``) is refused; ``'exact'`` and ``'nystrom'``
        take any (Nystrom needs a positive semi-definite kernel; the true-kernel check
        judges it), and ``'auto'`` chooses among the backends that take it; on Dask arrays
        too (evaluated chunk by chunk on the workers).
    p : float, default=2
        The order of ``metric='minkowski'`` (``>= 1``), as in ``ot.dist``.
    warmstart : None or pair of array-like, default=None
        Initial log-scalings ``(log u, log v)``, shapes ``(n,)`` and ``(m,)`` (POT's
        ``warmstart``; a previous result's ``potentials``), e.g. for a sequence of nearby
        problems. A warm start is never annealed (``epsilon_scaling='auto'`` applies to cold
        starts). On Dask arrays, Dask or NumPy vectors.
    rank : int or 'auto', optional
        The size of a low-rank backend's factors (it sets the record's rank parameter:
        ``n_features``, ``n_landmarks``, ...; :func:`sketchot.make_kernel`); not with
        ``backend='auto'``, which sizes them itself.
    {dtype}
    rng : None, int, Generator, ...
        Randomness of the approximate backends and of the sampled true-kernel check.
    {options}
    **backend_params
        The backend's own parameters, by name (``sketchot.get_backend(backend).defaults``,
        e.g. ``degree`` of ``'polyts'``); a name that is neither one of them nor a parameter
        above is rejected with a did-you-mean. None with ``backend='auto'``.

    Returns
    -------
    SinkhornResult or TargetsResult
        For ``b`` of shape ``(m, k)``: a :class:`~sketchot.TargetsResult` (the ``k``
        values ``value_linear`` and ``value``, potentials of shapes ``(n, k)``, ``(m, k)``,
        each target's stop and true-kernel check; float64 whatever the points' dtype).
        Otherwise the scalings (``potentials = (log u, log v)``, ``P = diag(u) K diag(v)``),
        the lazy plan (``lazy_plan``; ``plan`` for the dense array when it fits),
        ``value_linear = <P, M>``, ``value`` (the objective above, penalties included), the
        marginals, the iterations, the stop reason, and ``true_kernel``: the check of the
        scalings against the exact kernel (for unbalanced transport, the L1 residual of the
        fixed point ``u = (a / K v)^rho_a``, ``v = (b / K^T u)^rho_b``, relative to
        ``sum(a)``), with ``accuracy_met``. For tensors, or NumPy float32 points, a
        ``sketchot.solver.result.ResultView`` of it: arrays in the caller's library and the
        points' dtype, ``value`` and ``value_linear`` scalars of that dtype (0-d tensors).
        Tensors that require grad make ``value`` differentiable with respect to ``X``, ``Y``
        (squared Euclidean cost), ``a`` and ``b`` (the envelope theorem,
        :mod:`sketchot._autograd`); ``backend='auto'`` then solves with the exact kernel,
        the only one whose value has that gradient, and other backends, costs or an
        unconverged iteration are refused. ``value_linear`` carries no gradient.

    Raises
    ------
    TypeError, ValueError
        On invalid input, naming the argument, what was expected and what was received.
    InvalidResultError
        When the answer would be impossible (negative or non-finite cost or mass) and
        ``errors='raise'``.

    Notes
    -----
    Time per iteration: ``O((n + m) r)`` for rank-``r`` backends, ``O(n m)`` for the exact one
    (``O(n m d)`` when streamed). Memory ``O((n + m) r)`` for low-rank backends.

    References
    ----------
    Cuturi, M. (2013). Sinkhorn distances: lightspeed computation of optimal transport.
    Chizat, L., Peyre, G., Schmitzer, B., Vialard, F.-X. (2018). Scaling algorithms for
    unbalanced optimal transport problems. Han, I., Avron, H., Shin, J. (2020). Polynomial
    tensor sketch for element-wise function of low-rank matrix. ICML.

    Examples
    --------
    >>> import numpy as np, sketchot
    >>> rng = np.random.default_rng(0)
    >>> X, Y = rng.random((500, 3)), rng.random((400, 3))
    >>> res = sketchot.sinkhorn(None, None, X, Y, reg=1.0, backend="nystrom", rank=50, rng=0)
    >>> bool(res.converged), res.backend, bool(res.accuracy_met)
    (True, 'nystrom', True)
    >>> res = sketchot.sinkhorn(None, None, X, Y, reg=0.1, reg_m=0.5, rng=0)   # unbalanced
    >>> bool(res.mass < 1.0), bool(res.accuracy_met)
    (True, True)
    """
    options = _options(locals())
    build = _build(rank, dtype)
    unbalanced_type = _penalty_type(unbalanced_type, b, any_dask(a, b, X, Y))
    if several_targets(b):
        if any_dask(a, b, X, Y):
            raise NotImplementedError(
                "several targets (b of shape (m, k)) are not implemented on Dask arrays; "
                "compute the arrays, or solve each column of b with Dask"
            )
        return solver.sinkhorn_targets(
            a, b, X, Y, reg, backend, options=options, reg_m=reg_m, metric=metric, p=p,
            warmstart=warmstart, rng=rng, policy=policy, **build, **backend_params,
        )  # fmt: skip
    if any_dask(a, b, X, Y):
        return _distributed().sinkhorn_dask(
            a, b, X, Y, reg, backend, reg_m=reg_m, rng=rng, policy=policy, warmstart=warmstart,
            metric=metric, p=p, **options.as_dict(), **build, **backend_params,
        )  # fmt: skip
    return solver.sinkhorn(
        a, b, X, Y, reg, backend, options=options, reg_m=reg_m,
        unbalanced_type=unbalanced_type, metric=metric, p=p, warmstart=warmstart, rng=rng,
        policy=policy, context=_arrays, **build, **backend_params,
    )  # fmt: skip


def _refuse_matrix_call(function: str, Y: Any) -> None:
    """POT's ``ot.<function>(a, b, M, reg)`` called here puts ``reg`` where a cloud goes:
    point to the cost-matrix entries with POT's signatures."""
    if isinstance(Y, (int, float, np.number)) and not isinstance(Y, bool):
        raise TypeError(
            f"{function}() takes point clouds: {function}(a, b, X, Y, reg=...); got the number "
            f"{Y!r} as Y, as in POT's ot.{function}(a, b, M, reg, ...). For a cost matrix M "
            f"call sketchot.matrix.{function}(a, b, M, reg, ...) (POT's signature and return "
            "values) or sketchot.solve(M, a, b, reg=reg) (the full result)"
        )


def _require_reg(reg: Any, function: str) -> None:
    """POT's Sinkhorn entries take ``reg`` as required; a silent default would solve another
    problem than the caller meant."""
    if reg is None:
        raise TypeError(
            f"{function}() needs reg, the entropic regularisation (> 0), as POT's "
            "ot.sinkhorn(a, b, M, reg) does; got none. For exact (unregularised) transport "
            "call sketchot.solve_sample(X_a, X_b) without reg (POT's exact solver)"
        )


def _one_target(b: Any) -> None:
    """Exact transport (POT's solver) takes one target: ``b`` of shape ``(m, k)`` is
    refused there by name."""
    if several_targets(b):
        shape = np.shape(b)
        raise ValueError(
            f"b must have shape (m,) = ({shape[0]},) without reg; got shape {tuple(shape)}: "
            "several targets in one call (POT's b of shape (m, k)) are solved with reg > 0 "
            "only (POT's exact solver takes one target); solve each column of b separately"
        )


def _targets_in_numpy(arguments: dict[str, Any]) -> None:
    """Several targets are solved on NumPy arrays, without gradients: others are refused
    by name."""
    for name in _ARRAYS:
        value = arguments.get(name)
        values = value if isinstance(value, (tuple, list)) and name == "warmstart" else [value]
        for item in values:
            context = array_context(**{name: item})
            if not context.is_numpy:
                raise TypeError(
                    f"several targets (b of shape (m, k)) take NumPy arrays; got {name} from "
                    f"{context.library}: convert the inputs (e.g. .numpy()), or solve each "
                    "column of b with tensors"
                )


def _refuse_unproven_gradient(result: Any, wanted: list[str], metric: Any) -> None:
    """Gradients only where the value's gradient is the envelope formula's."""
    positions = [name for name in wanted if name in ("X", "Y")]
    if positions and not (isinstance(metric, str) and metric == "sqeuclidean"):
        name = metric if isinstance(metric, str) else "a callable"
        raise TypeError(
            f"{positions[0]} requires grad, and the gradient of value with respect to the "
            f"points is implemented for metric='sqeuclidean' only; got metric={name!r}. "
            "Detach the points (gradients with respect to a and b hold for every cost)"
        )
    if "exact" not in result.kernel.info.capabilities:
        raise TypeError(
            f"{wanted[0]} requires grad, and backend={result.backend!r} approximates the "
            "kernel, whose value's gradient is not the plan's envelope formula; pass "
            "backend='exact' (backend='auto' picks it when a tensor requires grad)"
        )
    if not result.converged:
        raise RuntimeError(
            f"{wanted[0]} requires grad, and the iteration stopped with status "
            f"{result.status!r}: the gradient of value (the envelope theorem) holds at "
            "convergence only; raise max_iter or loosen tol"
        )
    for name in ("a", "b"):
        weights = result.a if name == "a" else result.b
        if name in wanted and not np.all(weights > 0):
            raise ValueError(
                f"{name} requires grad and has zero entries, where the value's gradient "
                f"(log {name}) is not defined; detach {name} or make its entries positive"
            )


def _with_gradient(
    view: ResultView, context: Any, tensors: dict[str, Any], wanted: list[str], metric: Any
) -> ResultView:
    """``view`` whose ``value`` is a 0-d tensor attached to the tensors that require grad."""
    # imports torch when called: the caller passed tensors
    from ._autograd import differentiable_value, position_gradients, weight_gradient

    host = view.host
    _refuse_unproven_gradient(host, wanted, metric)
    points = {}
    if "X" in wanted or "Y" in wanted:  # copies: an in-place update before backward is theirs
        points = {
            name: None if tensors[name] is None
            else np.array(context.to_host(tensors[name]), dtype=np.float64)
            for name in ("X", "Y")
        }  # fmt: skip

    def gradients(names: list[str]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if "X" in names or "Y" in names:
            out.update(position_gradients(host, points["X"], points["Y"]))
        for side, name in enumerate(("a", "b")):
            if name in names:
                out[name] = weight_gradient(host, side)
        return out

    value = differentiable_value(host.value, context.dtype, tensors, gradients)
    return ResultView(host, context, {"value": value})


#: The arguments of a solve whose library decides the answer's (``in_user_arrays``'s).
_ARRAYS = ("a", "b", "X", "Y", "warmstart")


def _public_solve(core):
    """The public face of a solve: ``reg`` required, the answer in the caller's dtype, and
    ``value`` differentiable on tensors that require grad (one target; several targets, ``b``
    of shape ``(m, k)``, are solved on NumPy arrays and returned as they are)."""
    signature = inspect.signature(core)

    @functools.wraps(core)
    def solve(*args: Any, **kwargs: Any):
        if kwargs.get("_arrays") is not None:  # a layer of sketchot: host arrays, no views
            return core(*args, **kwargs)
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return core(*args, **kwargs)  # Python's own message about the call
        arguments = bound.arguments
        _refuse_matrix_call(core.__name__, arguments.get("Y"))
        _require_reg(arguments.get("reg"), core.__name__)
        if several_targets(arguments.get("b")):
            _targets_in_numpy(arguments)
            return core(*bound.args, **bound.kwargs)
        tensors = {name: arguments.get(name) for name in ("X", "Y", "a", "b")}
        wanted = [name for name, value in tensors.items() if _requires_grad(value)]
        forced = bool(wanted) and arguments.get("backend", "auto") == "auto"
        if forced:
            arguments["backend"] = EXACT_BACKEND  # the only kernel whose value has this gradient
        context = array_context(**{name: arguments.get(name) for name in _ARRAYS})
        result = core(*bound.args, **bound.kwargs)
        view = in_points_dtype(result, context, arguments.get("X"), arguments.get("Y"))
        if wanted and isinstance(view, ResultView):
            metric = arguments.get("metric", "sqeuclidean")
            view = _with_gradient(view, context, tensors, wanted, metric)
            if forced:
                view.host.notes.append(
                    f"backend='auto' solved with the exact kernel: {wanted[0]} requires grad, "
                    "and only the exact kernel's value has the envelope gradient"
                )
        return view

    return solve


def _requires_grad(value: Any) -> bool:
    """Whether ``value`` is a tensor that requires grad (no import of torch)."""
    return bool(getattr(value, "requires_grad", False))


sinkhorn = _public_solve(sinkhorn)


@_documented
def sinkhorn2(
    a: Any,
    b: Any,
    X: Any,
    Y: Any = None,
    reg: float | None = None,
    backend: str = "auto",
    *,
    reg_m: Any = None,
    unbalanced_type: str = "KL",
    metric: Any = "sqeuclidean",
    p: float = 2.0,
    rank: Any = None,
    dtype: Any = None,
    rng: Any = None,
    warmstart: Any = None,
    max_iter: int = _DEFAULT.max_iter,
    tol: float | None = _DEFAULT.tol,
    check_every: int | str = _DEFAULT.check_every,
    safeguard: str = _DEFAULT.safeguard,
    log_domain: bool | str = _DEFAULT.log_domain,
    coarse_to_fine: bool | str = _DEFAULT.coarse_to_fine,
    epsilon_scaling: bool | str = _DEFAULT.epsilon_scaling,
    anderson: int | str = _DEFAULT.anderson,
    accuracy: float | None = _DEFAULT.accuracy,
    certify_first: bool = _DEFAULT.certify_first,
    true_kernel_samples: int | str = _DEFAULT.true_kernel_samples,
    errors: str = _DEFAULT.errors,
    warn: bool = _DEFAULT.warn,
    verbose: bool = _DEFAULT.verbose,
    options: SolverOptions | None = None,
    **backend_params: Any,
) -> Any:
    """``<P, M>`` of :func:`sinkhorn`'s plan (POT's ``sinkhorn2``: the linear cost, without
    the entropic term).

    Parameters
    ----------
    a, b, X, Y, reg, backend
        As in :func:`sinkhorn`.
    reg_m, warmstart
        As in :func:`sinkhorn`.
    unbalanced_type, metric, p, rank, dtype, rng
        As in :func:`sinkhorn`.
    {options}
    **backend_params
        The backend's own parameters, as in :func:`sinkhorn`.

    Returns
    -------
    numpy.float64, numpy.float32 or 0-d tensor
        ``value_linear`` of the result: ``sum_ij P_ij M_ij`` (the problem's cost), a scalar
        of the points' dtype as POT's ``sinkhorn2`` (``numpy.float64`` is a ``float``); a 0-d
        tensor for tensors. For ``b`` of shape ``(m, k)``, the ``k`` values (a float64
        array of shape ``(k,)``, as POT returns them). The full result (accuracy check,
        potentials) is :func:`sinkhorn`'s.

    Raises
    ------
    TypeError
        When ``reg`` is missing, or an input requires grad: ``<P, M>`` at the optimal plan is
        not the value whose gradient the envelope theorem gives; ``solve_sample(...).value``
        (the entropic value) is differentiable.

    Examples
    --------
    >>> import numpy as np, sketchot
    >>> rng = np.random.default_rng(0)
    >>> X, Y = rng.random((300, 2)), rng.random((200, 2)) + 1.0
    >>> print(round(sketchot.sinkhorn2(None, None, X, Y, reg=0.5, rng=0), 3))
    2.141
    """
    for name, value in (("a", a), ("b", b), ("X", X), ("Y", Y)):
        if _requires_grad(value):
            raise TypeError(
                f"{name} requires grad, and sinkhorn2 returns <P, M>, whose gradient is not the "
                "optimal plan's (envelope) formula; use sketchot.solve_sample(X, Y, a, b, "
                "reg=...).value, the entropic value <P, M> + reg KL(P | a b^T), which is "
                "differentiable, or detach the inputs"
            )
    _refuse_matrix_call("sinkhorn2", Y)
    _require_reg(reg, "sinkhorn2")
    options = _options(locals())
    with _in_terms_of("sinkhorn2"):
        value = sinkhorn(
            a, b, X, Y, reg, backend, reg_m=reg_m, unbalanced_type=unbalanced_type,
            metric=metric, p=p, warmstart=warmstart, rank=rank, dtype=dtype, rng=rng,
            options=options, **backend_params,
        ).value_linear  # fmt: skip
    return np.float64(value) if type(value) is float else value


@_documented
def sinkhorn_unbalanced(
    a: Any,
    b: Any,
    X: Any,
    Y: Any,
    reg: float,
    reg_m: Any,
    backend: str = "auto",
    *,
    unbalanced_type: str = "KL",
    metric: Any = "sqeuclidean",
    p: float = 2.0,
    rank: Any = None,
    dtype: Any = None,
    rng: Any = None,
    warmstart: Any = None,
    max_iter: int = _DEFAULT.max_iter,
    tol: float | None = _DEFAULT.tol,
    check_every: int | str = _DEFAULT.check_every,
    safeguard: str = _DEFAULT.safeguard,
    log_domain: bool | str = _DEFAULT.log_domain,
    coarse_to_fine: bool | str = _DEFAULT.coarse_to_fine,
    epsilon_scaling: bool | str = _DEFAULT.epsilon_scaling,
    anderson: int | str = _DEFAULT.anderson,
    accuracy: float | None = _DEFAULT.accuracy,
    certify_first: bool = _DEFAULT.certify_first,
    true_kernel_samples: int | str = _DEFAULT.true_kernel_samples,
    errors: str = _DEFAULT.errors,
    warn: bool = _DEFAULT.warn,
    verbose: bool = _DEFAULT.verbose,
    options: SolverOptions | None = None,
    **backend_params: Any,
):
    """Unbalanced entropic transport between point clouds (POT's name and argument order).

    Parameters
    ----------
    a, b, X, Y, reg, backend
        As in :func:`sinkhorn`; ``a`` and ``b`` may have different masses.
    reg_m : float or pair of float
        KL penalties of the marginals (required here): a number for both sides,
        ``(reg_m_a, reg_m_b)`` for each, ``float('inf')`` for a hard side.
    warmstart
        As in :func:`sinkhorn`.
    unbalanced_type, metric, p, rank, dtype, rng
        As in :func:`sinkhorn`.
    {options}
    **backend_params
        The backend's own parameters, as in :func:`sinkhorn`.

    Returns
    -------
    SinkhornResult
        As :func:`sinkhorn`'s; ``value`` includes the penalties, ``mass`` is the plan's.

    Examples
    --------
    >>> import numpy as np, sketchot
    >>> rng = np.random.default_rng(0)
    >>> X, Y = rng.random((300, 2)), rng.random((200, 2))
    >>> a, b = np.full(300, 1 / 300), np.full(200, 2 / 200)   # masses 1 and 2
    >>> res = sketchot.sinkhorn_unbalanced(a, b, X, Y, reg=0.1, reg_m=1.0, rng=0)
    >>> bool(1.0 < res.mass < 2.0)
    True
    """
    _refuse_matrix_call("sinkhorn_unbalanced", Y)
    _require_reg(reg, "sinkhorn_unbalanced")
    options = _options(locals())
    with _in_terms_of("sinkhorn_unbalanced"):
        return sinkhorn(
            a, b, X, Y, reg, backend, reg_m=reg_m, unbalanced_type=unbalanced_type,
            metric=metric, p=p, warmstart=warmstart, rank=rank, dtype=dtype, rng=rng,
            options=options, **backend_params,
        )  # fmt: skip


@_documented
def solve_sample(
    X_a: Any,
    X_b: Any,
    a: Any = None,
    b: Any = None,
    reg: float | None = None,
    unbalanced: Any = None,
    backend: str = "auto",
    potentials_init: Any = None,
    *,
    unbalanced_type: str = "KL",
    metric: Any = "sqeuclidean",
    p: float = 2.0,
    rank: Any = None,
    dtype: Any = None,
    rng: Any = None,
    max_iter: int = _DEFAULT.max_iter,
    tol: float | None = _DEFAULT.tol,
    check_every: int | str = _DEFAULT.check_every,
    safeguard: str = _DEFAULT.safeguard,
    log_domain: bool | str = _DEFAULT.log_domain,
    coarse_to_fine: bool | str = _DEFAULT.coarse_to_fine,
    epsilon_scaling: bool | str = _DEFAULT.epsilon_scaling,
    anderson: int | str = _DEFAULT.anderson,
    accuracy: float | None = _DEFAULT.accuracy,
    certify_first: bool = _DEFAULT.certify_first,
    true_kernel_samples: int | str = _DEFAULT.true_kernel_samples,
    errors: str = _DEFAULT.errors,
    warn: bool = _DEFAULT.warn,
    verbose: bool = _DEFAULT.verbose,
    options: SolverOptions | None = None,
    **backend_params: Any,
):
    """Transport between samples with the names and defaults of POT's ``ot.solve_sample``:
    entropic with ``reg``, exact (POT's own solver) without.

    Parameters
    ----------
    X_a, X_b : array-like, shapes (n, d), (m, d)
        The samples (:func:`sinkhorn`'s ``X``, ``Y``).
    a, b : array-like or None
        Their weights (``None``: uniform).
    reg : float or None, default=None
        Entropic regularisation (> 0). ``None``, as in POT, solves EXACT transport: the call
        goes to POT's ``ot.solve_sample(X_a, X_b, a, b, metric=..., reg=None,
        unbalanced=..., max_iter=...)`` (network simplex, a dense ``n x m`` cost: for
        problems that fit in memory) and returns POT's result (see Returns); sketchot's
        solver options are refused there.
    unbalanced : None, float or pair, default=None
        KL penalties of the marginals (:func:`sinkhorn`'s ``reg_m``).
    backend : str, default='auto'
        As in :func:`sinkhorn`.
    potentials_init : None or pair of array-like, default=None
        Initial log-scalings (:func:`sinkhorn`'s ``warmstart``; POT's name).
    unbalanced_type, metric, p, rank, dtype, rng
        As in :func:`sinkhorn`.
    {options}
    **backend_params
        The backend's own parameters, as in :func:`sinkhorn`.

    Returns
    -------
    SinkhornResult, TargetsResult or ot.utils.OTResult
        With ``reg``: :func:`sinkhorn`'s result (a view in the caller's arrays and dtype for
        tensors and float32 points; for ``b`` of shape ``(m, k)`` a
        :class:`~sketchot.TargetsResult` with ``(k,)`` values), with ``ot.solve_sample``'s
        fields: ``value``,
        ``value_linear``, ``potentials``, ``plan``, ``lazy_plan``, ``marginals``,
        ``status``; ``value`` is differentiable on tensors that require grad (see
        :func:`sinkhorn`). Without ``reg``: POT's own ``OTResult`` of the exact problem
        (``value``, ``value_linear``, ``plan``, ``potentials``, ``status``; on tensors
        POT's gradients), with ``notes`` saying that POT solved it.

    Examples
    --------
    >>> import numpy as np, sketchot
    >>> rng = np.random.default_rng(0)
    >>> res = sketchot.solve_sample(rng.random((200, 2)), rng.random((150, 2)), reg=0.1, rng=0)
    >>> res.status, res.plan.shape
    ('converged', (200, 150))
    >>> exact = sketchot.solve_sample(rng.random((20, 2)), rng.random((20, 2)))   # reg=None
    >>> exact.notes
    ['reg=None: exact transport solved by POT (ot.solve_sample)']
    """
    for theirs, ours in (("reg_m", "unbalanced"), ("warmstart", "potentials_init")):
        if theirs in backend_params:
            raise TypeError(
                f"solve_sample() takes sinkhorn's {theirs} as {ours} (POT's name); got "
                f"{theirs}={backend_params[theirs]!r:.60}"
            )
    if potentials_init is not None and not (
        isinstance(potentials_init, (tuple, list)) and len(potentials_init) == 2
    ):
        raise TypeError(
            "potentials_init must be None or a pair (log_u, log_v) of arrays of shapes (n,) "
            f"and (m,) (a result's potentials); got {type(potentials_init).__name__}"
        )
    if reg is None:
        arguments = dict(locals())  # (a comprehension has its own locals)
        given = {name: value for name, value in arguments.items() if _given(name, value)}
        return _exact_by_pot(X_a, X_b, a, b, unbalanced, backend, potentials_init, given)
    options = _options(locals())
    names = {"X": "X_a", "Y": "X_b", "reg_m": "unbalanced", "warmstart": "potentials_init"}
    with _in_terms_of("solve_sample", **names):
        return sinkhorn(
            a, b, X_a, X_b, reg, backend, reg_m=unbalanced, unbalanced_type=unbalanced_type,
            metric=metric, p=p, warmstart=potentials_init, rank=rank, dtype=dtype, rng=rng,
            options=options, **backend_params,
        )  # fmt: skip


#: solve_sample's keywords after ``potentials_init`` and their defaults (its exact solve by
#: POT tells which were given, by name).
_KEYWORD_DEFAULTS = {
    "unbalanced_type": "KL", "metric": "sqeuclidean", "p": 2.0, "rank": None, "dtype": None,
    "rng": None, "options": None,
}  # fmt: skip


def _given(name: str, value: Any) -> bool:
    """Whether solve_sample's keyword ``name`` was given a value other than its default
    (``backend_params`` by being non-empty)."""
    if name == "backend_params":
        return bool(value)
    if name in SolverOptions.names():
        return not _is_default(name, value)
    return name in _KEYWORD_DEFAULTS and not _same(value, _KEYWORD_DEFAULTS[name])


#: What an exact solve by POT takes besides the samples, weights and ``unbalanced``.
_EXACT_KEYWORDS = ("metric", "p", "max_iter")


def _exact_by_pot(X_a, X_b, a, b, unbalanced, backend, potentials_init, given):
    """``solve_sample`` without ``reg``: POT's exact solve (POT is a dependency). ``given``:
    the keywords the caller gave (other than their defaults), the backend's parameters
    among them as one dict."""
    import ot

    kwargs = {**given.pop("backend_params", {}), **given}
    refused = sorted(name for name in kwargs if name not in _EXACT_KEYWORDS)
    refused += ["backend"] if backend != "auto" else []
    refused += ["potentials_init"] if potentials_init is not None else []
    if refused:
        raise TypeError(
            "solve_sample() without reg solves exact transport with POT's ot.solve_sample, "
            f"which takes none of sketchot's {', '.join(refused)}; pass reg > 0 for an "
            "entropic solve with them"
        )
    if any_dask(X_a, X_b, a, b):
        raise NotImplementedError(
            "solve_sample() without reg (exact transport, POT's solver) is not implemented on "
            "Dask arrays; pass reg > 0 or compute the arrays"
        )
    _one_target(b)
    metric, p = kwargs.get("metric", "sqeuclidean"), kwargs.get("p", 2.0)
    if not isinstance(metric, str):
        raise TypeError(
            "solve_sample() without reg takes POT's metric names only (exact transport by "
            "ot.solve_sample); got a callable metric: pass reg > 0, or compute the cost "
            "matrix and call ot.solve(M, a, b)"
        )
    extra = {"max_iter": kwargs["max_iter"]} if "max_iter" in kwargs else {}
    if metric == "minkowski":
        result = ot.solve(ot.dist(X_a, X_b, metric=metric, p=p), a, b, unbalanced=unbalanced,
                          **extra)  # fmt: skip
    else:
        result = ot.solve_sample(X_a, X_b, a, b, metric=metric, unbalanced=unbalanced, **extra)
    result.notes = ["reg=None: exact transport solved by POT (ot.solve_sample)"]
    return result


@_named_only("the kernel already fixes reg, the cost and the backend's parameters")
@_documented
@in_user_arrays("a", "b", "kernel", "warmstart")
def sinkhorn_kernel(
    a: Any,
    b: Any,
    kernel: Any,
    *,
    reg_m: Any = None,
    unbalanced_type: str = "KL",
    metric: Any = None,
    p: Any = None,
    warmstart: Any = None,
    rng: Any = None,
    max_iter: int = _DEFAULT.max_iter,
    tol: float | None = _DEFAULT.tol,
    check_every: int | str = _DEFAULT.check_every,
    safeguard: str = _DEFAULT.safeguard,
    log_domain: bool | str = _DEFAULT.log_domain,
    coarse_to_fine: bool | str = _DEFAULT.coarse_to_fine,
    epsilon_scaling: bool | str = _DEFAULT.epsilon_scaling,
    anderson: int | str = _DEFAULT.anderson,
    accuracy: float | None = _DEFAULT.accuracy,
    certify_first: bool = _DEFAULT.certify_first,
    true_kernel_samples: int | str = _DEFAULT.true_kernel_samples,
    errors: str = _DEFAULT.errors,
    warn: bool = _DEFAULT.warn,
    verbose: bool = _DEFAULT.verbose,
    options: SolverOptions | None = None,
):
    """Sinkhorn on a prebuilt :class:`~sketchot.kernels.KernelOperator`: several solves with
    one kernel (other weights, penalties or options), the problem and result of
    :func:`sinkhorn`.

    Parameters
    ----------
    a, b : array-like or None
        Weights (``None``: uniform), as in :func:`sinkhorn`; ``b`` of shape ``(m, k)``
        solves ``k`` targets on the kernel (:func:`sinkhorn`'s ``b``).
    kernel : KernelOperator
        From :func:`sketchot.make_kernel` (or a user's own backend); it fixes ``reg``, the
        cost and the backend's parameters. A kernel built on Dask arrays is solved with Dask.
    reg_m : None, float or pair, default=None
        Marginal penalties, as in :func:`sinkhorn`.
    unbalanced_type : {{'KL', 'TV'}}, default='KL'
        Their type, as in :func:`sinkhorn`.
    metric, p : optional
        The kernel carries its cost (``make_kernel(..., metric=, p=)``); when given they
        must name that cost (a check, not a change).
    warmstart : None or pair of array-like, default=None
        Initial log-scalings ``(log u, log v)``, as in :func:`sinkhorn`.
    rng : None, int, Generator, ...
        Randomness of the sampled true-kernel check.
    {options}

    Returns
    -------
    SinkhornResult
        As :func:`sinkhorn`'s.

    Examples
    --------
    >>> import numpy as np, sketchot
    >>> rng = np.random.default_rng(0)
    >>> X, Y = rng.random((300, 2)), rng.random((200, 2))
    >>> K = sketchot.make_kernel(X, Y, reg=0.5, backend="exact")
    >>> balanced = sketchot.sinkhorn_kernel(None, None, K)
    >>> relaxed = sketchot.sinkhorn_kernel(None, None, K, reg_m=0.1)
    >>> bool(balanced.converged), bool(relaxed.mass < balanced.mass)
    (True, True)
    """
    options = _options(locals())
    unbalanced_type = _penalty_type(unbalanced_type, b, _on_dask(kernel, a, b))
    if several_targets(b):
        if _on_dask(kernel, a, b):
            raise NotImplementedError(
                "several targets (b of shape (m, k)) are not implemented on Dask arrays or "
                "kernels; solve each column of b"
            )
        return solver.sinkhorn_kernel_targets(
            a, b, kernel, options=options, reg_m=reg_m, metric=metric, p=p,
            warmstart=warmstart, rng=rng,
        )  # fmt: skip
    if _on_dask(kernel, a, b):
        _refuse_on_dask("sqeuclidean" if metric is None else metric, "sinkhorn_kernel")
        return _distributed().sinkhorn_kernel_dask(
            a, b, kernel, reg_m=reg_m, rng=rng, warmstart=warmstart, **options.as_dict()
        )
    return solver.sinkhorn_kernel(
        a, b, kernel, options=options, reg_m=reg_m, unbalanced_type=unbalanced_type,
        metric=metric, p=p, warmstart=warmstart, rng=rng,
    )  # fmt: skip


@_documented
@in_user_arrays("X", "Y")
def make_kernel(
    X: Any,
    Y: Any,
    reg: float,
    backend: str = "auto",
    *,
    metric: Any = "sqeuclidean",
    p: float = 2.0,
    rank: Any = None,
    dtype: Any = None,
    accuracy: float = _DEFAULT.accuracy,
    rng: Any = None,
    _arrays: ArrayContext = NUMPY,
    **backend_params: Any,
):
    """Build the Gibbs-kernel operator ``K = exp(-c(x, y) / reg)`` of a backend, ``c(x, y) =
    ||x - y||^2`` by default.

    Parameters
    ----------
    X : array-like, shape (n, d)
        Source points (integer arrays, e.g. pixels, are converted to float). A Dask array
        (chunked by rows) builds the operator on the cluster
        (:mod:`sketchot.distributed`; needs ``pip install ".[dask]"`` in a clone).
    Y : array-like, shape (m, d)
        Target points (a Dask array likewise).
    reg : float
        Entropic regularisation (> 0); ``K = exp(-M / reg)`` as in POT.
    backend : str, default='auto'
        One of :func:`available_backends`, or ``'auto'``: the cheapest representation whose
        sampled product error meets ``accuracy``: the exact kernel stored when ``n x m`` is
        small, else the low-rank backends at a doubling rank, else the block-local kernel
        when an iteration of it is cheaper than an exact one, else the exact kernel, stored
        when it fits 1 GiB, streamed otherwise (:func:`sketchot.policy.ladder.choose`;
        ``info.reason`` says which and why).
    metric : str or callable, default='sqeuclidean'
        The cost ``c`` (:func:`sinkhorn`'s ``metric``); the kernel's geometry carries it. A
        backend whose record does not declare it is refused (``'exact'`` and ``'nystrom'``
        take any); Dask clouds too.
    p : float, default=2
        The order of ``metric='minkowski'``.
    rank : int or 'auto', optional
        The size of a low-rank backend's factors: it sets the record's rank parameter
        (``n_features``, ``n_landmarks``, ...; not together with an explicit value of it).
        ``'auto'`` doubles it from 64 until a sampled relative error of ``K~ v`` against the
        true kernel meets ``accuracy``, or until an iteration would cost more than the exact
        kernel's (:func:`sketchot.policy.ladder.adaptive_rank`). Not with ``backend='auto'``.
    {dtype}
    accuracy : float, default=1e-3
        The accuracy the answer is asked for (:func:`sinkhorn`'s): what ``'auto'`` and
        ``rank='auto'`` size the kernel to, and what a backend fitting a sketch to a
        tolerance aims at.
    rng : None, int, Generator, ...
        Randomness of the approximation (``numpy.random.default_rng`` semantics).
    **backend_params
        The backend's own parameters, by name (``sketchot.get_backend(name).defaults``);
        others are rejected with a did-you-mean. None with ``backend='auto'``.

    Returns
    -------
    KernelOperator
        The operator (``matvec``, ``rmatvec``, ``matmat``, ``rmatmat``, the fused passes of
        the solver), with ``info`` (backend, parameters, build time, ``reason`` for
        ``'auto'``).

    Notes
    -----
    Build time and memory: ``O((n + m) r d)`` and ``O((n + m) r)`` for rank-``r`` backends;
    the exact kernel stores ``n m`` entries when they fit the dense budget and streams
    blocks otherwise.

    Examples
    --------
    >>> import numpy as np, sketchot
    >>> rng = np.random.default_rng(0)
    >>> X, Y = rng.random((400, 3)), rng.random((300, 3))
    >>> K = sketchot.make_kernel(X, Y, reg=1.0, backend="nystrom", rank=60, rng=0)
    >>> K.shape, K.matvec(np.ones(300)).shape
    ((400, 300), (400,))
    """
    if any_dask(X, Y):
        return _distributed().make_kernel_dask(
            X, Y, reg, backend, rng=rng, dtype=dtype, rank=rank, accuracy=accuracy, policy=policy,
            metric=metric, p=p, **backend_params,
        )  # fmt: skip
    return kernels.make_kernel(
        X, Y, reg, backend, rng=rng, dtype=dtype, rank=rank, metric=metric, p=p,
        accuracy=accuracy, policy=policy, context=_arrays, **backend_params,
    )  # fmt: skip


@dataclass(frozen=True)
class GridResult:
    """What :func:`solve_grid` returns: the solve on the grids' points, with the dual
    potentials as arrays of the grids' shapes.

    Attributes
    ----------
    value : float
        The entropic objective (:attr:`SinkhornResult.value`).
    value_linear : float
        ``<P, M>``, the transport cost alone (POT's ``sinkhorn2``).
    f, g : ndarray
        Dual potentials ``reg * log u`` and ``reg * log v`` on the source and target grids
        (``-inf`` where the weight is zero), shapes ``source.shape`` and ``target.shape``.
    accuracy_met : bool or None
        Whether the true-kernel check met the accuracy (exhaustive: the kernel is exact).
    grids : tuple of RegularGrid
        ``(source, target)``.
    result : SinkhornResult
        The whole result (plan summaries, ``true_kernel``, timings, ``lazy_plan``).
    """

    value: float
    value_linear: float
    f: np.ndarray
    g: np.ndarray
    accuracy_met: bool | None
    grids: tuple[RegularGrid, RegularGrid]
    result: Any


#: The name of solve_grid's ``grid`` argument in its errors.
GRID_ARGUMENT = "grid"


def _grid_weights(value: Any, name: str, grid: RegularGrid) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be a real array of the grid's shape; got {describe(value)}")
    if array.shape != grid.shape:
        raise ValueError(f"{name} must have the grid's shape {grid.shape}; got shape "
                         f"{array.shape}")  # fmt: skip
    return np.array(array, dtype=np.float64).ravel()  # a C-order copy: views and read-only


def solve_grid(
    a: Any,
    b: Any,
    reg: float,
    *,
    grid: Any = None,
    spacing: Any = None,
    extent: Any = None,
    reg_m: Any = None,
    **options: Any,
) -> GridResult:
    """Entropic optimal transport between two histograms on tensor-product grids (images,
    volumes, 1-D bins), squared-Euclidean cost, on the exact kernel applied axis by axis
    (backend ``'grid'``: ``O(N sum_k n_k)`` per product, no ``N x N`` array).

    The name follows GeomLoss's ``solve_grid``; ``reg``, ``reg_m`` and the result's
    ``value_linear`` follow POT (``ot.sinkhorn2``, ``ot.unbalanced.sinkhorn_unbalanced``).

    Parameters
    ----------
    a, b : array_like
        Non-negative weights of the grids' shapes (1-D, 2-D or 3-D); zero weights allowed.
        Balanced transport needs equal masses (``b`` is rescaled, with a note, as in
        :func:`sinkhorn`).
    reg : float
        Entropic regularisation, in squared coordinate units (e.g. ``1e-3 *
        grid.squared_diameter``).
    grid : RegularGrid or (RegularGrid, RegularGrid), optional
        The support of ``a`` and ``b`` (one grid for both, or one each). Default: a uniform
        grid of ``a``'s shape built from ``spacing`` or ``extent``
        (:meth:`RegularGrid.from_shape`; neither: ``extent=1``, POT's
        ``np.linspace(0, 1, n)`` axes as in ``convolutional_barycenter2d``).
    spacing, extent : float or sequence of float, optional
        See :meth:`RegularGrid.from_shape` (only without ``grid``).
    reg_m : float or (float, float), optional
        KL marginal penalty (unbalanced transport), as in :func:`sinkhorn`.
    **options
        Solver options of :func:`sinkhorn` (``max_iter``, ``tol``, ``accuracy``, ...).

    Returns
    -------
    GridResult

    Examples
    --------
    >>> import numpy as np, sketchot
    >>> a = np.zeros((32, 32)); a[4:8, 4:8] = 1
    >>> b = np.zeros((32, 32)); b[20:24, 20:24] = 1
    >>> res = sketchot.solve_grid(a / a.sum(), b / b.sum(), reg=1e-3)
    >>> round(res.value_linear, 2), res.f.shape, res.accuracy_met
    (0.53, (32, 32), True)
    """
    if "backend" in options:
        raise TypeError("solve_grid() always uses backend='grid'; do not pass backend=")
    if grid is None:
        shape = np.shape(a)
        if spacing is None and extent is None:
            extent = 1.0
        source = target = RegularGrid.from_shape(shape, spacing, extent=extent)
    else:
        if spacing is not None or extent is not None:
            raise TypeError("pass grid= or spacing=/extent=, not both")
        source, target = grid if isinstance(grid, tuple | list) else (grid, grid)
        check_grid(source, GRID_ARGUMENT)
        check_grid(target, GRID_ARGUMENT)
    wa = _grid_weights(a, "a", source)
    wb = _grid_weights(b, "b", target)
    X = source.points()
    Y = X if target is source else target.points()
    result = sinkhorn(wa, wb, X, Y, reg, GRID_BACKEND, reg_m=reg_m, **options)
    log_u, log_v = result.potentials
    reg_value = float(result.reg)
    with np.errstate(invalid="ignore"):
        f = np.where(wa > 0, reg_value * np.asarray(log_u), -np.inf).reshape(source.shape)
        g = np.where(wb > 0, reg_value * np.asarray(log_v), -np.inf).reshape(target.shape)
    return GridResult(
        float(result.value), float(result.value_linear), f, g, result.accuracy_met,
        (source, target), result,
    )  # fmt: skip
