"""``sketchot.solve(M, a, b, reg=...)``: POT's ``ot.solve`` on a cost matrix, with its names,
defaults and result fields, on the one solver.

With ``reg > 0`` the call runs :func:`sketchot.solver.matrix.sinkhorn_matrix` (the exact
kernel ``exp(-M / reg)``, the epsilon schedule, the Newton stage, the exhaustive true-kernel
check); with ``reg=None`` it goes to POT's own exact solver, as
:func:`sketchot.solve_sample` does without ``reg``. What the solver does not solve
(quadratic penalties, other regularisers, an initial plan) is refused by name, with what
was expected and what was received. A reference measure ``c`` (and ``reg_type='entropy'``
with ``unbalanced``, whose reference measure is ``c = 1``) is solved on the costs ``M + reg
log(a b^T / c)``: :class:`ReferenceMeasureResult`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from . import policy
from ._arrays import NUMPY, array_context
from ._parallel import thread_limit
from ._validation import RenamableError, check_int, describe, unknown_names
from .cost_matrix import CostMatrixGeometry, check_cost_matrix, reference_costs
from .kernels import EXACT_BACKEND, available_backends, get_backend
from .solver import (
    PENALTY_TYPES,
    NumpyInDtype,
    ResultView,
    SinkhornResult,
    SolverOptions,
    check_unbalanced_type,
    make_problem,
    several_targets,
    sinkhorn_matrix,
    sinkhorn_targets_matrix,
)
from .sparse_cost import check_sparse_cost, cost_geometry, is_sparse, sparse_reference_costs

#: POT's ``ot.solve`` arguments (the did-you-mean of an unknown keyword reads them too).
_POT_NAMES = (
    "M", "a", "b", "reg", "c", "reg_type", "unbalanced", "unbalanced_type", "method",
    "n_threads", "max_iter", "plan_init", "potentials_init", "tol", "verbose", "grad",
)  # fmt: skip

#: POT's gradient modes (``grad``): NumPy arrays carry no gradient, so each one is the same
#: solve here.
_GRAD_MODES = ("autodiff", "envelope", "last_step", "detach")

#: The solver's options taken by name besides POT's ``max_iter``, ``tol`` and ``verbose``,
#: and the solve's own ``rng`` and ``dtype``.
_EXTRA = (
    *(name for name in SolverOptions.names() if name not in ("max_iter", "tol", "verbose")),
    "rng",
    "dtype",
    "backend",
    "rank",
)

#: The issue that adds POT's quadratic and total-variation marginal penalties.


def solve(
    M: Any,
    a: Any = None,
    b: Any = None,
    reg: float | None = None,
    c: Any = None,
    reg_type: Any = "KL",
    unbalanced: Any = None,
    unbalanced_type: str = "KL",
    method: str | None = None,
    n_threads: int = 1,
    max_iter: int | None = None,
    plan_init: Any = None,
    potentials_init: Any = None,
    tol: float | None = None,
    verbose: bool = False,
    grad: str = "autodiff",
    **options: Any,
):
    """Optimal transport on a cost matrix with the names, defaults and result fields of
    POT's ``ot.solve``: entropic with ``reg`` (the one solver on ``exp(-M / reg)``), exact
    (POT's own solver) without.

    Solves ``min_P <P, M> + reg KL(P | a b^T) + u_a KL(P 1 | a) + u_b KL(P^T 1 | b)`` over
    non-negative plans (``unbalanced=None``: ``P 1 = a`` and ``P^T 1 = b`` exactly), with
    the generalised ``KL(p | q) = sum p log(p / q) - p + q``.

    Parameters
    ----------
    M : array-like, shape (n, m)
        The cost matrix: finite costs ``>= 0`` (any dtype NumPy converts; float32 gives a
        float32 answer, solved in float64). Read, never written; read-only and strided
        arrays are accepted. NumPy only: PyTorch tensors (or another library's arrays) are
        refused by name (POT's ``ot.solve`` differentiates through them; sketchot's
        differentiable entries take point clouds).
    a, b : array-like or None, shapes (n,) and (m,)
        Weights of the rows and the columns of ``M`` (``None``: uniform, as in POT); the
        same total mass when ``unbalanced`` is ``None``. ``b`` of shape ``(m, k)`` solves
        ``k`` targets on one kernel (POT's ``sinkhorn`` convention; POT 0.9.7's ``ot.solve``
        fails on it) and returns a :class:`~sketchot.solver.TargetsResult` whose ``value``,
        ``value_linear`` have shape ``(k,)`` and ``potentials`` shapes ``(n, k)``, ``(m, k)``.
    reg : float or None, default=None
        Entropic regularisation (``> 0``). ``None``, as in POT, solves EXACT transport: the
        call goes to POT's ``ot.solve(M, a, b, reg=None, ...)`` with every argument of POT's
        signature as given and returns POT's ``OTResult``, with ``notes`` saying that POT
        solved it; sketchot's options are refused there. ``reg=0`` is refused (POT reads it
        as ``None``; pass ``None``).
    c : None or array-like, shape (n, m)
        POT's reference measure of the regularisation, ``reg KL(P | c)`` (``None``: ``a
        b^T``, POT's default): finite entries ``>= 0``, ``0`` forbidding the pair. Solved on
        the costs ``M' = M + reg log(a b^T / c)`` (one more ``n x m`` array), which give the
        same plans for any penalties; unbalanced, ``M'`` is solved as it is, negative entries
        included. Balanced, POT 0.9.7's ``ot.solve`` ignores ``c`` (its answer is ``c = a
        b^T``'s); this solves the problem its docstring states. With ``'entropy'`` only
        ones (POT's ``c = 1``) are taken; one target only.
    reg_type : {'KL', 'entropy'}, default='KL'
        The regulariser (case-insensitive, as in POT). ``'KL'``: ``reg KL(P | a b^T)``.
        ``'entropy'``: Cuturi's ``reg sum P log P``. Balanced, it differs from ``'KL'`` by
        ``reg (<a, log a> + <b, log b>)`` on the constraint set: the same plan and
        potentials; ``value`` is POT's ``<P, M> + reg sum P log P``. Unbalanced, it is the
        reference measure ``c = 1`` (see ``c``), with POT's value ``<P, M> + reg (sum P log
        P - sum P)`` plus the penalties. POT's ``'L2'`` and ``(f, df)`` pairs are refused
        (``NotImplementedError``).
    unbalanced : None, float or pair of float, default=None
        KL penalties of the marginals (the solver's ``reg_m``, in units of the cost): a
        number (or a one-item sequence) for both sides, ``(u_a, u_b)`` for each,
        ``float('inf')`` for a hard side (``(inf, s)`` is semi-relaxed). ``None``: balanced.
    unbalanced_type : {'KL', 'TV'}, default='KL'
        The marginal penalty (case-insensitive): ``'KL'`` ``u KL(P 1 | a)``, ``'TV'``
        ``u ||P 1 - a||_1`` (total variation; one target only). POT's ``'L2'`` is refused
        with ``NotImplementedError`` (it has no Sinkhorn step); read only when
        ``unbalanced`` is given, as in POT.
    method : None
        POT's choice among its algorithms. sketchot runs its one solver (log-stable passes,
        an epsilon schedule at small ``reg``, a Newton stage), so only ``None`` is taken
        with ``reg``.
    n_threads : int, default=1
        Worker threads of the solve (:func:`sketchot.thread_limit`; the answer does not
        depend on it). POT's OpenMP threads of the exact solver with ``reg=None``.
    max_iter : int or None, default=None
        Iterations at most; ``None``: the solver's 1000 (POT's default for Sinkhorn).
    plan_init : None
        POT's initial plan, used by its non-Sinkhorn solvers only (POT's Sinkhorn ignores
        it); refused with ``reg`` (pass ``potentials_init``).
    potentials_init : None or pair of array-like, default=None
        A warm start ``(log u, log v)`` of shapes ``(n,)`` and ``(m,)``: a previous result's
        ``potentials`` (``P = diag(u) exp(-M / reg) diag(v)``). POT's balanced Sinkhorn
        ignores it; here it starts the iteration (never annealed).
    tol : float or None, default=None
        POT's stopping rule (``stopThr``): stop when the L2 column-marginal error
        ``||P^T 1 - b||_2`` (relative to ``sum(b)``, the same number for unit mass) is
        below ``tol``. ``None``: sketchot's default, stop at the accuracy asked for
        (``accuracy``, the L1 residual relative to ``sum(a)``; see
        :class:`~sketchot.SolverOptions`); POT's own default is ``1e-9``.
    verbose : bool, default=False
        Print the build, the error at every check and the true-kernel check.
    grad : {'autodiff', 'envelope', 'last_step', 'detach'}, default='autodiff'
        POT's gradient mode. NumPy arrays carry no gradient, so every mode gives the same
        solve; other values are refused.
    **options
        The solver's other options by name (:class:`~sketchot.SolverOptions`:
        ``accuracy``, ``log_domain``, ``epsilon_scaling``, ``anderson``, ``check_every``,
        ``safeguard``, ``certify_first``, ``true_kernel_samples``, ``errors``, ``warn``),
        ``dtype`` (float64 or float32 storage of ``exp(-M / reg)``), ``rng`` (a low-rank
        kernel's draws and the sampled true-kernel check when ``n m > 4e6``), ``backend``
        (default ``'auto'``: the exact kernel up to ``n m = 2.5e7`` entries; above, the
        skeleton ``'cur'`` of ``exp(-M / reg)`` at doubling ranks when its solve passes the
        true-kernel check, else the exact kernel; ``'exact'``; ``'cur'``), ``rank`` and the
        chosen backend's parameters (``n_pivots``, ``rcond`` of ``'cur'``; ``max_dense_bytes``
        of ``'exact'``). Other names are refused with a did-you-mean.

    Returns
    -------
    SinkhornResult or ot.utils.OTResult
        With ``reg``: the solver's result with POT's ``OTResult`` fields ``value``,
        ``value_linear``, ``plan``, ``lazy_plan``, ``potentials`` (``(log u, log v)``, POT's
        ``(log_u, log_v)`` of balanced Sinkhorn; POT's unbalanced ``logu`` is ``log u - log
        a``), ``potential_a``, ``potential_b``, ``marginals``, ``marginal_a``,
        ``marginal_b`` and ``status``, plus the check against the exact kernel
        (``true_kernel``, ``accuracy_met``); a view (arrays and values in float32) for a
        float32 ``M``. Balanced, ``value`` is POT's: ``<P, M> + reg sum P log(P / (a
        b^T))`` (``'KL'``) or ``<P, M> + reg sum P log P`` (``'entropy'``). Unbalanced, it
        is the objective above with the generalised KL (POT's formula with
        ``kl_div(..., mass=True)``; POT 0.9.7's ``ot.solve`` drops the mass terms
        ``sum q - p`` there, so its ``value`` is not the objective it minimises). With a
        reference measure, a :class:`ReferenceMeasureResult`: ``value_linear`` is ``<P,
        M>``, ``value`` the objective with ``reg KL(P | c)`` (POT's formulas above with
        ``c``), ``potentials`` those of ``M'``.
        Without ``reg``: POT's own ``OTResult``, with ``notes``.

    Raises
    ------
    TypeError, ValueError
        On invalid input, naming the argument, what was expected and what was received.
    NotImplementedError
        For POT's problems the solver does not solve (``reg_type``, ``unbalanced_type``; a
        reference measure with several targets), as POT raises it for names it does not
        know.

    Examples
    --------
    >>> import numpy as np, ot, sketchot
    >>> rng = np.random.default_rng(0)
    >>> M = ot.dist(rng.random((60, 2)), rng.random((40, 2)))
    >>> res = sketchot.solve(M, reg=0.05)
    >>> res.status, res.plan.shape, bool(res.accuracy_met)
    ('converged', (60, 40), True)
    >>> exact = sketchot.solve(M)   # reg=None: POT's exact solver
    >>> exact.notes
    ['reg=None: exact transport solved by POT (ot.solve)']
    """
    _numpy_only(M=M, a=a, b=b, potentials_init=potentials_init)
    if reg is None:
        return _exact_by_pot(
            M, a, b, c=c, reg_type=reg_type, unbalanced=unbalanced,
            unbalanced_type=unbalanced_type, method=method, n_threads=n_threads,
            max_iter=max_iter, plan_init=plan_init, potentials_init=potentials_init, tol=tol,
            verbose=verbose, grad=grad, options=options,
        )  # fmt: skip
    regulariser = _check_problem(reg, c, reg_type, unbalanced, unbalanced_type)
    if regulariser == "entropy" and c is not None:
        _check_reference(c, np.shape(M))  # ones of M's shape: the entropy's own reference
        c = None
    penalty = "KL" if unbalanced is None else check_unbalanced_type(unbalanced_type)
    _check_pot_arguments(method, plan_init, grad, potentials_init)
    n_threads = check_int(n_threads, "n_threads", minimum=1)
    backend, rank = options.pop("backend", "auto"), options.pop("rank", None)
    kernel_params = _kernel_parameters(backend, options)
    if rank is not None:
        kernel_params["rank"] = rank
    unknown = sorted(set(options) - set(_EXTRA))
    if unknown:
        raise TypeError(
            "solve() got unexpected keyword argument(s) "
            f"{unknown_names(unknown, (*_POT_NAMES, *_EXTRA))}; it "
            f"takes POT's ot.solve arguments and the solver's options {', '.join(_EXTRA)}"
        )
    rng, dtype = options.pop("rng", None), options.pop("dtype", None)
    settings = SolverOptions(
        **({} if max_iter is None else {"max_iter": max_iter}), tol=tol, verbose=verbose,
        **options,
    )  # fmt: skip
    names = {"reg_m": "unbalanced", "warmstart": "potentials_init"}
    # POT's reference measure c (reg_type='KL'), or c = 1 (reg_type='entropy', unbalanced):
    # the KL problem on the costs M + reg log(a b^T / c) (balanced entropy needs none)
    reference = c is not None or (regulariser == "entropy" and unbalanced is not None)
    try:
        with thread_limit(n_threads):
            if several_targets(b) and reference:
                raise NotImplementedError(
                    "several targets (b of shape (m, k)) with "
                    + ("a reference measure c" if c is not None else "reg_type='entropy' "
                       "and unbalanced")
                    + ": the reference costs M + reg log(a b_k^T / c) differ for each target; "
                    "solve each column of b"
                )  # fmt: skip
            if several_targets(b):  # POT's b of shape (m, k): k targets on one kernel
                if penalty != "KL":
                    raise NotImplementedError(
                        f"unbalanced_type={penalty!r} with several targets (b of shape "
                        "(m, k)): the targets' iteration raises the ratios to powers (KL "
                        "penalties); solve each column of b, or pass unbalanced_type='KL'"
                    )
                if backend not in ("auto", EXACT_BACKEND) or kernel_params:
                    raise NotImplementedError(
                        f"several targets (b of shape (m, k)) on a cost matrix run on the "
                        f"exact kernel exp(-M / reg); got backend={backend!r}"
                        + (f" with {', '.join(sorted(kernel_params))}" if kernel_params else "")
                        + ": pass backend='auto' or 'exact', or solve each column of b"
                    )
                targets = sinkhorn_targets_matrix(
                    a, b, M, reg, options=settings, reg_m=_reg_m(unbalanced),
                    warmstart=None if potentials_init is None else tuple(potentials_init),
                    rng=rng, dtype=np.float64 if dtype is None else dtype,
                )  # fmt: skip
                targets.regulariser = regulariser
                return targets
            costs, given = M, None
            if reference:
                given = check_sparse_cost(M) if is_sparse(M) else check_cost_matrix(M)
                costs, constant = _reference_geometry(
                    given, a, b, reg, c, regulariser, _reg_m(unbalanced), penalty
                )
            result = sinkhorn_matrix(
                a, b, costs, reg, options=settings, reg_m=_reg_m(unbalanced),
                unbalanced_type=penalty,
                warmstart=None if potentials_init is None else tuple(potentials_init),
                rng=rng, dtype=np.float64 if dtype is None else dtype, backend=backend,
                policy=policy, **kernel_params,
            )  # fmt: skip
    except RenamableError as error:
        raise error.renamed(caller="solve", **names) from None
    if reference:
        result = _in_terms_of_costs(result, given, constant, c is not None)
    return _as_pot(result, M, regulariser)


@dataclasses.dataclass
class ReferenceMeasureResult(SinkhornResult):
    """A :class:`~sketchot.SinkhornResult` of POT's problem with a reference measure ``c``
    (``reg KL(P | c)``; ``c = 1`` for ``reg_type='entropy'``), solved as the KL problem on
    the costs ``M' = M + reg log(a b^T / c)`` (:func:`~sketchot.cost_matrix.reference_costs`):
    the same plan. ``kernel`` and ``potentials`` are those of ``M'`` (``P = diag(u)
    exp(-M' / reg) diag(v) = diag(u / a) (c * exp(-M / reg)) diag(v / b)``: POT's
    ``(logu, logv)`` are ``log u - log a``, ``log v - log b``); ``value_linear`` is ``<P,
    M>`` on the given ``M``; ``value`` and ``value_dual`` are ``M'``'s less
    :attr:`value_offset`.

    Attributes
    ----------
    value_offset : float
        ``reg (sum(a) sum(b) - sum(c))`` for ``reg KL(P | c)`` (generalised KL);
        ``reg sum(a) sum(b)`` for ``reg_type='entropy'`` (POT's ``reg (sum P log P - sum
        P)``, the generalised ``KL(P | 1)`` without its constant ``n m``).
    """

    value_offset: float = 0.0

    @property
    def value(self) -> float:
        return SinkhornResult.value.fget(self) - self.value_offset

    @property
    def value_dual(self) -> float:
        return SinkhornResult.value_dual.fget(self) - self.value_offset


def _reference_geometry(M, a, b, reg, c, regulariser, reg_m, penalty):
    """``(geometry, value offset)``: the costs ``M + reg log(a b^T / c)`` at ``reg``, kept
    as they are for unbalanced transport (negative costs included: a shift would change the
    problem) and shifted for balanced transport (:class:`ReferenceMeasureResult`)."""
    n, m = M.shape
    # the weights as the problem validates them (uniform for None; b rescaled to a's mass)
    problem = make_problem(a, b, (n, m), reg, reg_m, unbalanced_type=penalty)
    log_c = None if c is None else _check_reference(c, (n, m))
    if is_sparse(M):  # its stored entries only: the missing ones stay forbidden
        costs = sparse_reference_costs(M, problem.a, problem.b, problem.reg, log_c)
    else:
        costs = reference_costs(M, problem.a, problem.b, problem.reg, log_c)
    geometry = cost_geometry(costs, problem.reg, shift=problem.balanced)
    _check_exponents(geometry)  # before sum(c): c at most e^700 a b^T from here
    total = float(problem.a.sum()) * float(problem.b.sum())
    if c is None:  # entropy: c = 1
        offset = problem.reg * total
    else:
        offset = problem.reg * (total - float(np.asarray(c, dtype=np.float64).sum()))
    return geometry, offset


#: Exponents ``-M'_ij / reg`` of a reference measure's costs above this are refused: the
#: kernel's entries ``exp(-M' / reg)`` must be finite floats.
LARGEST_EXPONENT = 700.0


def _check_exponents(geometry: CostMatrixGeometry) -> None:
    exponent = -(geometry.min_cost - geometry.offset) / geometry.reg
    if exponent > LARGEST_EXPONENT:
        raise ValueError(
            f"c is too large against a b^T at this reg: the costs M' = M + reg log(a b^T / "
            f"c) reach {geometry.min_cost:.6g}, and the kernel exp(-M' / reg) = "
            f"e^{exponent:.4g} exceeds e^{LARGEST_EXPONENT:g} (float64 overflows at e^709.8, "
            "and the kernel's sums before it); scale c down or raise reg"
        )


def _check_reference(c: Any, shape: tuple[int, int]) -> np.ndarray:
    """``log c`` of a valid reference measure: a NumPy array of shape ``(n, m)`` of finite
    entries ``>= 0`` (``0``: a pair the plan may not use); errors name ``c``."""
    if hasattr(c, "tocsr") or hasattr(c, "toarray"):
        raise TypeError(
            f"c must be a dense array of shape {shape} (the reference measure); got "
            f"{describe(c)}: pass c.toarray()"
        )
    try:
        array = np.asarray(c)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"c must be an array of shape {shape}; got {describe(c)}") from exc
    if array.dtype.kind not in "biuf":
        raise TypeError(f"c must be an array of real numbers; got dtype {array.dtype}")
    if array.shape != shape:
        raise ValueError(
            f"c must have the shape of M {shape} (one reference mass per pair); got shape "
            f"{array.shape}"
        )
    array = array.astype(np.float64, copy=False)
    bad = int(np.count_nonzero(~np.isfinite(array)))
    if bad:
        raise ValueError(f"c must contain finite numbers; got {bad} entries NaN or inf")
    if array.min() < 0:
        raise ValueError(
            f"c must be non-negative (a reference measure); got minimum {array.min():.6g}"
        )
    with np.errstate(divide="ignore"):
        return np.log(array)


def _in_terms_of_costs(result, M: np.ndarray, offset: float, given_c: bool):
    """A reference-measure result with the given ``M``'s linear cost and POT's value
    (:class:`ReferenceMeasureResult`)."""
    log_u, log_v = result.potentials
    linear = result.kernel.geometry.plan_inner(log_u, log_v, M)
    reference = "c" if given_c else "c = 1 (reg_type='entropy')"
    fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(SinkhornResult)}
    fields.update(
        value_linear=linear,
        notes=[
            *result.notes,
            f"reference measure {reference}: solved on M + reg log(a b^T / c) (the same "
            "plan); value_linear is <P, M>, potentials are those of the transformed costs",
        ],
    )
    return ReferenceMeasureResult(**fields, value_offset=offset)


def _kernel_parameters(backend: Any, options: dict[str, Any]) -> dict[str, Any]:
    """The parameters of ``backend``'s kernel among ``options``, taken out of them
    (``'auto'`` chooses its own; an unknown backend is named by the solve)."""
    if not isinstance(backend, str) or backend == "auto" or backend not in available_backends():
        return {}
    names = set(get_backend(backend).defaults)
    return {name: options.pop(name) for name in list(options) if name in names}


def _numpy_only(**arrays: Any) -> None:
    """Refuse other libraries' arrays by name (this entry solves on NumPy arrays)."""
    context = array_context(**arrays)
    if context is not NUMPY and context.library != "numpy":
        name = next(
            key for key, value in arrays.items()
            if array_context(**{key: value}).library == context.library
        )  # fmt: skip
        raise TypeError(
            f"sketchot.solve takes NumPy arrays; got {name} from {context.library}: convert "
            f"the inputs with .numpy() (for gradients, POT's ot.solve(M, a, b, reg=...) "
            "differentiates through M, and sketchot.solve_sample through point clouds)"
        )


def _check_problem(reg, c, reg_type, unbalanced, unbalanced_type) -> str:
    """The regulariser (``'kl'`` or ``'entropy'``) of a problem the solver solves, or a
    refusal naming the argument."""
    if isinstance(reg, (int, float, np.number)) and not isinstance(reg, bool) and reg == 0:
        raise ValueError(
            "reg must be > 0 for an entropic solve, or None for exact transport (POT reads "
            "reg=0 as None); got reg=0"
        )
    if not isinstance(reg_type, str):
        raise NotImplementedError(
            f"reg_type must be 'KL' or 'entropy'; got {describe(reg_type)}: POT's general "
            "regulariser (f, df), solved by conditional gradient, is not implemented"
        )
    kind = reg_type.lower()
    if kind not in ("kl", "entropy"):
        hint = " (POT's quadratic regulariser)" if kind == "l2" else ""
        raise NotImplementedError(
            f"reg_type must be 'KL' or 'entropy'; got {reg_type!r}{hint}, which the Sinkhorn "
            "solver does not solve"
        )
    if unbalanced is not None:
        if not isinstance(unbalanced_type, str):
            raise NotImplementedError(
                f"unbalanced_type must be one of {list(PENALTY_TYPES)}; got "
                f"{describe(unbalanced_type)}"
            )
        check_unbalanced_type(unbalanced_type)  # an UnknownPenaltyError names the others
    if c is not None and kind == "entropy" and not _all_ones(c):
        raise ValueError(
            f"c must be None (or ones) with reg_type='entropy' (POT's entropy is the reference "
            f"measure c = 1: POT overwrites a given c with ones); got {describe(c)}: pass "
            "reg_type='KL' to regularise by reg KL(P | c)"
        )
    return kind


def _all_ones(c: Any) -> bool:
    """Whether ``c`` is an array of ones (POT's ``reg_type='entropy'`` reference measure)."""
    try:
        array = np.asarray(c)
    except (TypeError, ValueError):
        return False
    return array.dtype.kind in "biuf" and array.size > 0 and bool(np.all(array == 1))


def _check_pot_arguments(method, plan_init, grad, potentials_init) -> None:
    """POT's arguments that choose among its algorithms: the one solver takes their
    defaults."""
    if method is not None:
        raise ValueError(
            f"method must be None with reg (sketchot runs its one solver: log-stable passes, "
            f"an epsilon schedule at small reg, a Newton stage); got method={method!r}"
        )
    if plan_init is not None:
        raise ValueError(
            f"plan_init must be None with reg (POT uses it in its non-Sinkhorn solvers only); "
            f"got {describe(plan_init)}; warm-start with potentials_init=(log_u, log_v)"
        )
    if grad not in _GRAD_MODES:
        raise ValueError(f"grad must be one of {', '.join(map(repr, _GRAD_MODES))}; got {grad!r}")
    if potentials_init is not None and not (
        isinstance(potentials_init, (tuple, list)) and len(potentials_init) == 2
    ):
        raise TypeError(
            "potentials_init must be None or a pair (log_u, log_v) of arrays of shapes (n,) "
            f"and (m,) (a result's potentials); got {describe(potentials_init)}"
        )


def _reg_m(unbalanced: Any) -> Any:
    """POT's ``unbalanced`` as the solver's ``reg_m``: a one-item sequence is one number for
    both sides (POT's "indexable object of length 1")."""
    if isinstance(unbalanced, (list, tuple, np.ndarray)) and np.shape(unbalanced) == (1,):
        return unbalanced[0]
    if isinstance(unbalanced, list):
        return tuple(unbalanced)
    return unbalanced


def _as_pot(result: SinkhornResult, M: Any, regulariser: str) -> Any:
    """``result`` with POT's ``value`` and in ``M``'s floating dtype (float32 stays float32;
    the solve ran in float64). Balanced: both penalties infinite (``unbalanced=None`` or
    ``inf``, POT's balanced)."""
    balanced = not np.any(np.isfinite(result.reg_m))
    dtype = getattr(M, "dtype", None)
    dtype = np.dtype(dtype) if dtype in (np.float32, np.float64) else np.dtype(np.float64)
    values = {}
    if balanced:
        values["value"] = _pot_value(result, regulariser)
    if dtype == np.float64 and not values:
        return result
    context = NumpyInDtype("numpy", np, "cpu", dtype)
    return ResultView(result, context, {k: dtype.type(v) for k, v in values.items()})


def _pot_value(result: SinkhornResult, regulariser: str) -> float:
    """POT's balanced value from the scalings, without an ``n x m`` array: ``sum P log P =
    <P 1, log u> + <P^T 1, log v> - <P, M> / reg``."""
    row, col = result.marginals
    log_u, log_v = result.potentials
    # sum P log P + <P, M> / reg (log P_ij = log u_i + log v_j - M_ij / reg)
    entropy = _masked_dot(row, log_u) + _masked_dot(col, log_v)
    if regulariser == "kl":  # sum P log(P / (a b^T)) = sum P log P - <P 1, log a> - ...
        with np.errstate(divide="ignore"):
            entropy -= _masked_dot(row, np.log(result.a)) + _masked_dot(col, np.log(result.b))
    return float(result.reg * entropy)


def _masked_dot(weights: np.ndarray, logs: np.ndarray) -> float:
    """``sum_i w_i log_i`` over ``w_i != 0`` (``0 log 0 = 0``)."""
    mask = weights != 0
    return float(weights[mask] @ logs[mask])


def _exact_by_pot(M, a, b, *, options, **pot) -> Any:
    """``solve`` without ``reg``: POT's exact solvers, every POT argument passed through."""
    import ot

    if options:
        raise TypeError(
            "solve() without reg solves exact transport with POT's ot.solve, which takes none "
            f"of sketchot's {', '.join(sorted(options))}; pass reg > 0 for an entropic solve "
            "with them"
        )
    result = ot.solve(M, a, b, reg=None, **pot)
    result.notes = ["reg=None: exact transport solved by POT (ot.solve)"]
    return result


# --------------------------------------------------------------------------------------
# POT's Sinkhorn entries on a cost matrix: ot.sinkhorn(a, b, M, reg) and its family.

#: POT's algorithms of ``ot.sinkhorn`` and ``ot.sinkhorn_unbalanced``: each solves the same
#: problem, which the one solver solves (log-stable passes, an epsilon schedule, a Newton
#: stage), so each name gives the same solve here.
_POT_METHODS = (
    "sinkhorn", "sinkhorn_log", "sinkhorn_stabilized", "sinkhorn_epsilon_scaling",
    "greenkhorn", "sinkhorn_translation_invariant", "sinkhorn_reg_scaling",
)  # fmt: skip


def _pot_weights(weights: Any) -> Any:
    """POT's empty list (``a=[]``: uniform) as ``None``."""
    if weights is not None and not hasattr(weights, "shape") and len(weights) == 0:
        return None
    return weights


def _pot_method(method: Any, function: str) -> None:
    if not isinstance(method, str) or method.lower() not in _POT_METHODS:
        raise ValueError(
            f"{function}(): method must be one of POT's {', '.join(map(repr, _POT_METHODS))} "
            f"(each is the same solve here: the one solver); got {describe(method)}"
        )


def _several_targets(result: Any, log: bool) -> Any:
    """POT's answer of a plan-returning function for several targets (``b`` of shape
    ``(m, k)``): the ``k`` linear costs ``<P_k, M>``, no plans (POT's ``sinkhorn_knopp``),
    with the targets' log and ``'result'``; ``None`` for one target."""
    if np.ndim(result.value_linear) == 0:
        return None
    values = result.value_linear
    return (values, {**result.log, "result": result}) if log else values


def _pot_log(result: Any) -> dict[str, Any]:
    """POT's log dictionary of a balanced Sinkhorn solve (``log_u``, ``log_v``, ``u``,
    ``v``, ``niter``, ``err``), plus ``'result'``: the full result with its certificate."""
    if np.ndim(result.value_linear) == 1:  # several targets: their own log
        return {**result.log, "result": result}
    log_u, log_v = result.potentials
    return {
        "u": result.u, "v": result.v, "log_u": log_u, "log_v": log_v,
        "niter": int(result.n_iter), "err": [error for _, error in result.error_history],
        "result": result,
    }  # fmt: skip


def sinkhorn(
    a: Any,
    b: Any,
    M: Any,
    reg: float,
    method: str = "sinkhorn",
    numItermax: int = 1000,
    stopThr: float | None = None,
    verbose: bool = False,
    log: bool = False,
    warn: bool = True,
    warmstart: Any = None,
    **options: Any,
) -> Any:
    """POT's ``ot.sinkhorn(a, b, M, reg)`` on the one solver: the entropic plan of a cost
    matrix, with POT's signature and return values.

    ``sketchot.matrix.sinkhorn(a, b, M, reg)`` is :func:`solve` ``(M, a, b, reg=reg)``'s
    plan; use :func:`solve` for the full result (value, potentials, the true-kernel check).

    Parameters
    ----------
    a, b : array-like, shapes (n,) and (m,), or ``[]``
        Weights of the rows and the columns of ``M`` (``[]`` or ``None``: uniform, as in
        POT), the same total mass.
    M : array-like, shape (n, m)
        Costs, as :func:`solve` takes them: ``+inf`` for a forbidden pair, negative costs
        allowed.
    reg : float
        Entropic regularisation, ``> 0`` (POT's ``reg KL(P | a b^T)``; the plan is the same
        as with Cuturi's entropy).
    method : str, default='sinkhorn'
        Any of POT's methods (``'sinkhorn'``, ``'sinkhorn_log'``, ``'sinkhorn_stabilized'``,
        ...): each solves the same problem, and the one solver solves it (log-stable at
        any ``reg``).
    numItermax : int, default=1000
        ``max_iter``.
    stopThr : float or None, default=None
        POT's stopping rule on the L2 column-marginal error (``tol``); ``None``: stop at
        sketchot's ``accuracy`` (the certified L1 marginal error, default ``1e-3`` of the
        mass). POT's default is ``1e-9``.
    verbose, warn : bool
        Print the progress; warn when the accuracy is missed.
    log : bool, default=False
        Also return POT's log dictionary: ``u``, ``v``, ``log_u``, ``log_v`` (``P =
        diag(u) exp(-M / reg) diag(v)``), ``niter``, ``err`` (the errors measured), and
        ``result``, the :class:`~sketchot.SinkhornResult` (certificate included).
    warmstart : pair of array-like, optional
        ``(log u, log v)`` to start from (POT's convention).
    **options
        :func:`solve`'s other keywords (``accuracy``, ``backend``, ``rng``, ...).

    Returns
    -------
    ndarray, shape (n, m)
        The plan (POT's ``gamma``); with ``log=True``, ``(plan, log)``. With several
        targets (``b`` of shape ``(m, k)``), POT's answer: the ``k`` linear costs
        ``<P_k, M>``, no plan.

    Examples
    --------
    >>> import numpy as np, ot, sketchot.matrix
    >>> rng = np.random.default_rng(0)
    >>> a, b = ot.unif(30), ot.unif(20)
    >>> M = ot.dist(rng.random((30, 2)), rng.random((20, 2)))
    >>> P, log = sketchot.matrix.sinkhorn(a, b, M, 0.1, log=True)
    >>> bool(np.allclose(P.sum(axis=1), a, atol=1e-4)), bool(log["result"].accuracy_met)
    (True, True)
    """
    _pot_method(method, "sinkhorn")
    result = solve(
        M, _pot_weights(a), _pot_weights(b), reg=reg, max_iter=numItermax, tol=stopThr,
        verbose=verbose, potentials_init=warmstart, warn=warn, **options,
    )  # fmt: skip
    several = _several_targets(result, log)
    if several is not None:
        return several
    plan = result.plan
    return (plan, _pot_log(result)) if log else plan


def sinkhorn2(
    a: Any,
    b: Any,
    M: Any,
    reg: float,
    method: str = "sinkhorn",
    numItermax: int = 1000,
    stopThr: float | None = None,
    verbose: bool = False,
    log: bool = False,
    warn: bool = True,
    warmstart: Any = None,
    **options: Any,
) -> Any:
    """POT's ``ot.sinkhorn2(a, b, M, reg)``: ``<P, M>``, the linear cost of
    :func:`sinkhorn`'s plan (without the entropic term, as POT returns it), computed without
    an ``n x m`` plan. Parameters as :func:`sinkhorn`'s.

    Returns
    -------
    float
        ``sum_ij P_ij M_ij`` (forbidden pairs carry no mass and add nothing); with
        ``log=True``, ``(value, log)`` with :func:`sinkhorn`'s log dictionary.

    Examples
    --------
    >>> import numpy as np, ot, sketchot.matrix
    >>> M = ot.dist(np.arange(4.0)[:, None], np.arange(4.0)[:, None] + 1.0)
    >>> round(float(sketchot.matrix.sinkhorn2([], [], M, 0.05)), 4)
    1.0
    """
    _pot_method(method, "sinkhorn2")
    result = solve(
        M, _pot_weights(a), _pot_weights(b), reg=reg, max_iter=numItermax, tol=stopThr,
        verbose=verbose, potentials_init=warmstart, warn=warn, **options,
    )  # fmt: skip
    value = result.value_linear
    return (value, _pot_log(result)) if log else value


def sinkhorn_unbalanced(
    a: Any,
    b: Any,
    M: Any,
    reg: float,
    reg_m: Any,
    method: str = "sinkhorn",
    reg_type: str = "kl",
    c: Any = None,
    warmstart: Any = None,
    numItermax: int = 1000,
    stopThr: float | None = None,
    verbose: bool = False,
    log: bool = False,
    **options: Any,
) -> Any:
    """POT's ``ot.sinkhorn_unbalanced(a, b, M, reg, reg_m)`` on the one solver: the plan of
    ``min <P, M> + reg KL(P | a b^T) + reg_m_a KL(P 1 | a) + reg_m_b KL(P^T 1 | b)``.

    Parameters
    ----------
    a, b, M, reg, method, numItermax, stopThr, verbose
        As :func:`sinkhorn`'s (``M >= 0`` here: unbalanced transport is not invariant to
        a shift of negative costs, see :func:`solve`).
    reg_m : float or pair of float
        The marginal penalties (``float('inf')``: a hard side).
    reg_type : {'kl', 'entropy'}
        POT's ``'kl'``: ``reg KL(P | c)``; ``'entropy'``: the reference measure ``c = 1``
        (POT's ``reg sum P log P`` up to ``- reg sum P``; see :func:`solve`).
    c : None or array-like, shape (n, m)
        The reference measure with ``'kl'`` (``None``: ``a b^T``, POT's default); refused
        with ``'entropy'`` (POT overwrites it with ones there).
    warmstart : pair of array-like, optional
        POT's ``(logu, logv)`` of its unbalanced log (``log u - log a``, ``log v - log
        b``).
    log : bool, default=False
        Also return POT's log dictionary: ``logu``, ``logv`` (POT's unbalanced convention:
        ``P = diag(e^logu) (exp(-M / reg) * a b^T) diag(e^logv)``), ``cost`` (``<P, M>``),
        ``total_cost`` (the objective, generalised KL), ``niter``, ``err`` and ``result``.
    **options
        :func:`solve`'s other keywords.

    Returns
    -------
    ndarray, shape (n, m)
        The plan; with ``log=True``, ``(plan, log)``. With several targets (``b`` of shape
        ``(m, k)``): the ``k`` linear costs, as POT returns them.

    Examples
    --------
    >>> import numpy as np, ot, sketchot.matrix
    >>> rng = np.random.default_rng(0)
    >>> M = ot.dist(rng.random((30, 2)), rng.random((20, 2)))
    >>> P = sketchot.matrix.sinkhorn_unbalanced(ot.unif(30), 2 * ot.unif(20), M, 0.1, 1.0)
    >>> bool(1.0 < P.sum() < 2.0)
    True
    """
    _pot_method(method, "sinkhorn_unbalanced")
    if not isinstance(reg_type, str) or reg_type.lower() not in ("kl", "entropy"):
        raise NotImplementedError(
            f"reg_type must be 'kl' (POT's default) or 'entropy'; got {describe(reg_type)}"
        )
    a, b = _pot_weights(a), _pot_weights(b)
    if warmstart is not None:  # POT's unbalanced scalings are relative to a and b
        n, m = np.shape(M)
        log_a = np.log(np.full(n, 1.0 / n) if a is None else np.asarray(a, dtype=float))
        log_b = np.log(np.full(m, 1.0 / m) if b is None else np.asarray(b, dtype=float))
        warmstart = (np.asarray(warmstart[0]) + log_a, np.asarray(warmstart[1]) + log_b)
    result = solve(
        M, a, b, reg=reg, c=c, reg_type=reg_type, unbalanced=reg_m, max_iter=numItermax,
        tol=stopThr, verbose=verbose, potentials_init=warmstart, **options,
    )  # fmt: skip
    several = _several_targets(result, log)
    if several is not None:
        return several
    plan = result.plan
    if not log:
        return plan
    log_u, log_v = result.potentials
    with np.errstate(divide="ignore"):
        entries = {
            "logu": log_u - np.log(result.a), "logv": log_v - np.log(result.b),
            "cost": result.value_linear, "total_cost": result.value,
            "niter": int(result.n_iter), "err": [error for _, error in result.error_history],
            "result": result,
        }  # fmt: skip
    return plan, entries
