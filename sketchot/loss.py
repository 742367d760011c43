"""OT as a loss: the debiased Sinkhorn divergence, its value and its gradients from three solves.

.. math::

    S_\\varepsilon(a, b) = \\mathrm{OT}_\\varepsilon(a, b)
        - \\tfrac12 \\mathrm{OT}_\\varepsilon(a, a) - \\tfrac12 \\mathrm{OT}_\\varepsilon(b, b)
        + \\tfrac{\\varepsilon}{2} (m(a) - m(b))^2

with ``OT_eps(a, b) = min_P <P, C> + eps KL(P | a b^T) [+ rho KL(P 1 | a) + rho KL(P^T 1 | b)]``
(the entropic term included, POT's ``ot.solve_sample`` convention: ``value`` of
:func:`sketchot.sinkhorn`), ``C_ij = ||x_i - y_j||^2``, ``eps = reg``, ``rho = reg_m``, the
generalised ``KL(p | q) = sum p log(p / q) - p + q`` and ``m(a) = sum(a)``. Balanced
transport (``reg_m=None``) is Feydy et al. (2019); the unbalanced divergence, with its mass
term, is Sejourne et al. (2019), Def. 6 (the term is 0 for balanced transport, where the
masses are equal). It is GeomLoss's ``SamplesLoss('sinkhorn', p=2, blur=sqrt(reg / 2),
reach=sqrt(reg_m / 2), debias=True)`` times 2 (GeomLoss's cost is ``||x - y||^2 / 2``:
:class:`sketchot.nn.SamplesLoss` takes GeomLoss's parameters and returns its number).

Gradients come from the potentials (the envelope theorem, as GeomLoss does; no unrolled
iterations): with ``P = diag(u) K diag(v)`` the solved plan of each problem, ``r = P 1`` and
``c = P^T 1`` its marginals,

* positions: ``grad_X = 2 (r_ab * X - P_ab Y) - ((r_aa + c_aa) * X - P_aa X - P_aa^T X)``
  (the first term is ``2 a_i (x_i - T(x_i))`` with ``T`` the barycentric map), and alike
  for ``Y``: plan products through the kernel operator, ``O((n + m) r d)`` for a rank-``r``
  backend, never an ``n x m`` array;
* weights, with the dual potentials ``f = reg (log u - log a)``, ``g = reg (log v - log b)``
  and the symmetric potential ``f_aa = (f + g) / 2`` of the problem ``(a, a)``:
  ``grad_a = (rho + eps) (exp(-f_aa / rho) - exp(-f_ab / rho))`` for ``reg_m = rho``, whose
  balanced limit is ``grad_a = f_ab - f_aa``. Balanced potentials are defined up to
  ``(f + k, g - k)``; the gradients returned use the shift with ``<a, grad_a> = <b, grad_b>``
  (each ``S / 2`` at convergence): exact along every change of ``(a, b)`` that keeps
  ``sum(a) = sum(b)``, the only changes balanced transport allows. Zero weights get the
  continuous extension of their potential (a log-sum-exp over the true kernel, ``O(k m d)``
  for ``k`` zero weights).

Another cost (``metric=``, :func:`sketchot.sinkhorn`'s): the value and the weight gradients
hold as they are; the position gradients of a named metric are the envelope theorem's
``grad_X_i = sum_j P_ab,ij grad_x c(x_i, y_j) - 1/2 sum_j (P_aa,ij + P_aa,ji) grad_x c(x_i,
x_j)``, summed over row blocks of each plan's entries (``O(n m d)`` time, no ``n x m``
array), and a callable metric has none (reading ``grad_X`` raises, naming ``metric``).

Every call works on private read-only copies of ``X``, ``Y``, ``a`` and ``b``
(``O((n + m) d)``): the solves, the lazily read gradients and a loss object's test that
nothing moved never see the caller's memory, which an optimiser moves in place.

The symmetric problems ``(a, a)`` and ``(b, b)`` are solved by the engine's symmetric
iteration (the averaged update of Feydy et al., one kernel product per iteration and a
contraction of at least 1/2 per iteration at any ``reg``:
:mod:`sketchot.solver.engine`), and their kernels are built from the same random draws as
the cross problem's (one seed drawn from ``rng``).
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._validation import (
    RenamableError,
    check_bool,
    check_float,
    check_matrix,
    check_rng,
    check_weights,
    user_stacklevel,
)
from .api import make_kernel, on_dask, sinkhorn, sinkhorn_divergence_dask
from .gibbs import Cost, make_cost
from .kernels import rebuild_parameters
from .solver import (
    AccuracyWarning,
    InvalidResultError,
    LazyPlan,
    LinearRangeError,
    NonPositiveKernelError,
    SinkhornResult,
    SolverOptions,
    check_reg_m,
    make_problem,
    solve,
    value_error_estimate,
)

#: Pairs of the divergence: the cross problem and the two symmetric ones, with their sign.
TERMS = (("ab", 1.0), ("aa", -0.5), ("bb", -0.5))


@dataclass
class DivergenceResult:
    """Value and gradients of :func:`sinkhorn_divergence`.

    Attributes
    ----------
    value : float
        The divergence ``S`` (see :mod:`sketchot.loss`), tiny negatives within
        ``value_error`` clipped to 0 (``clipped``).
    grad_X, grad_Y : ndarray, shape (n, d), (m, d)
        ``dS / dX`` and ``dS / dY``, each computed when first read (properties): a flow that
        moves one cloud never pays for the other's plan moments (``d`` log products per
        plan for a block-local kernel; nothing more for a stored exact one).
    grad_a, grad_b : ndarray, shape (n,), (m,)
        ``dS / da`` and ``dS / db`` (balanced: the shift convention of :mod:`sketchot.loss`).
    value_error : float
        Estimated error of ``value`` from the true-kernel checks of the three solves:
        ``sum_k |w_k| (e_a,k max|f_k - s_k| + e_b,k max|g_k + s_k|)`` with ``e`` the L1
        marginal errors against the exact kernel (their upper bounds), ``w = 1, -1/2, -1/2``
        and ``s_k`` the midpoint of ``f_k`` (balanced; 0 unbalanced): the first-order gap
        between the primal and dual values of each solve's plan on the true kernel. An
        estimate, not a bound (0 for the exact kernel at convergence up to ``tol``).
    accuracy : float
        The largest true-kernel relative marginal error bound of the three solves (what
        ``accuracy=`` is checked against); ``0.0`` for identical inputs.
    results : dict
        ``{'ab': ..., 'aa': ..., 'bb': ...}``: the three :class:`SinkhornResult` (empty for
        identical inputs, whose divergence is exactly 0 without a solve).
    warm : dict
        For each problem, whether its warm start was used (``False``: solved cold; ``True``
        also when the problem had not changed and its previous solve was kept).
    clipped : bool
        Whether a negative value within ``value_error`` was set to 0.
    drift : dict
        For each problem solved warm (from ``warm_start``'s solve of it, on moved clouds),
        the change of its potentials ``(f - f_prev, g - g_prev)`` (cost units, one per
        point): a result warm-started from this one starts from ``f + drift`` (a linear
        prediction along a flow whose points keep their order; measured at n = 1e4,
        reg 0.01, it halves the iterations of a gradient flow's warm steps).
    timings : dict
        Seconds of the three solves (``'solve'``), of the weight gradients
        (``'gradient'``) and of each position gradient when first read (``'grad_X'``,
        ``'grad_Y'``).
    notes : list of str
        What happened on the way (warm starts refused, clipping, ...).
    """

    value: float
    grad_a: np.ndarray
    grad_b: np.ndarray
    value_error: float = 0.0
    accuracy: float = 0.0
    results: dict[str, SinkhornResult] = field(default_factory=dict)
    warm: dict[str, bool] = field(default_factory=dict)
    clipped: bool = False
    timings: dict[str, float] = field(default_factory=dict)
    drift: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: what the position gradients are computed from (``'clouds'``: ``(X, Y, debias)``, with
    #: ``results``) and the gradients once computed (``'X'``, ``'Y'``; zeros for identical
    #: inputs): private, read through ``grad_X`` and ``grad_Y``
    _positions: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def grad_X(self) -> np.ndarray:  # noqa: N802 (the cloud's name)
        """``dS / dX``, shape (n, d), computed on first read."""
        return self._position_gradient("X")

    @property
    def grad_Y(self) -> np.ndarray:  # noqa: N802
        """``dS / dY``, shape (m, d), computed on first read."""
        return self._position_gradient("Y")

    def _position_gradient(self, side: str) -> np.ndarray:
        cost = self._positions.get("cost")
        if cost is not None and not cost.translation_invariant:
            raise ValueError(
                f"grad_{side} needs the gradient of the cost, and metric=<callable> gives none: "
                "pass a named metric ('sqeuclidean', 'euclidean', 'cityblock' or 'minkowski') "
                "for position gradients; grad_a and grad_b (from the potentials) hold for any "
                "cost"
            )
        if side not in self._positions:
            start = time.perf_counter()
            X, Y, debias = self._positions["clouds"]
            self._positions[side] = _position_gradient(
                self.results, X, Y, debias, side, cost, self._positions
            )
            self.timings[f"grad_{side}"] = time.perf_counter() - start
        return self._positions[side]

    @property
    def converged(self) -> bool:
        """Whether every solve stopped on its tolerance (``True`` for identical inputs)."""
        return all(result.converged for result in self.results.values())

    @property
    def backend(self) -> str:
        """The cross problem's backend (``'none'`` for identical inputs)."""
        result = self.results.get("ab")
        return result.backend if result is not None else "none"

    def __repr__(self) -> str:
        return (
            f"DivergenceResult(value={self.value:.6g}, value_error={self.value_error:.2e}, "
            f"accuracy={self.accuracy:.2e}, backend={self.backend!r})"
        )


def sinkhorn_divergence(
    X: Any,
    Y: Any,
    a: Any = None,
    b: Any = None,
    reg: float = 1.0,
    reg_m: Any = None,
    backend: str = "auto",
    *,
    debias: bool = True,
    rng: Any = None,
    warm_start: DivergenceResult | None = None,
    **kwargs: Any,
) -> DivergenceResult:
    """The debiased Sinkhorn divergence between two point clouds, with its gradients.

    ``S = OT(a, b) - OT(a, a) / 2 - OT(b, b) / 2 + reg (m(a) - m(b))^2 / 2`` with ``OT``
    :func:`sketchot.sinkhorn`'s ``value`` (entropic term included) for the squared Euclidean
    cost; the formulas, the gradients and their conventions are in :mod:`sketchot.loss`.

    Parameters
    ----------
    X : array-like, shape (n, d)
        Source points.
    Y : array-like, shape (m, d)
        Target points.
    a, b : array-like of shape (n,), (m,) or None
        Non-negative weights (``None``: uniform, mass 1). Balanced transport needs equal masses.
    reg : float, default=1.0
        Entropic regularisation ``eps`` (> 0), in units of the cost ``||x - y||^2``.
    reg_m : None or float, default=None
        KL penalty ``rho`` of the marginals (the same on both sides, as Sejourne et al.'s
        divergence needs); ``None`` for balanced transport.
    backend : str, default='auto'
        As in :func:`sketchot.sinkhorn`; each of the three problems meets ``accuracy``.
    debias : bool, default=True
        ``False`` returns ``OT(a, b)`` alone (one solve) and its gradients.
    rng : None, int, Generator, ...
        Randomness of the approximate kernels: one seed is drawn from it and the three
        kernels are built from the same draws.
    warm_start : DivergenceResult, optional
        A previous result on clouds of the same sizes (a loop on slowly moving clouds): each
        problem is solved first on the previous one's backend and parameters, from its
        potentials plus their last change (``warm_start.drift``, when that result was
        itself warm-started: a linear prediction); if that solve misses ``accuracy`` (or
        does not converge) it is solved again cold. :class:`SinkhornDivergence` does this
        for you.
    **kwargs
        Solver options and backend parameters of :func:`sketchot.sinkhorn` (``accuracy``,
        ``tol``, ``max_iter``, ``rank``, ``dtype``, ``metric``, ...), by keyword. With a
        ``metric`` other than ``'sqeuclidean'`` each position gradient costs a pass over the
        plans' entries (``O(n m d)``, see :mod:`sketchot.loss`); a callable metric has
        ``grad_a`` and ``grad_b`` but no position gradients (reading them raises). ``certify_first``
        defaults to ``False`` here: the gradients come from the potentials, whose error
        follows the iteration's residual (measured at n = 1e4, reg 0.01: gradient error
        1.1e-3 against 3.4e-3 with the first stop at half the accuracy).

    Returns
    -------
    DivergenceResult
        ``value``, ``grad_X``, ``grad_Y``, ``grad_a``, ``grad_b``, ``value_error``,
        ``accuracy`` and the three solves. For ``X == Y`` and ``a == b`` (same values) the
        value and gradients are exactly 0, without a solve. A negative value within
        ``value_error`` is clipped to 0; a larger negative one is kept, with an
        :class:`~sketchot.AccuracyWarning`. PyTorch tensors given to
        ``sketchot.sinkhorn_divergence`` go to :func:`sketchot.nn.sinkhorn_divergence`,
        which returns a differentiable 0-d tensor instead (its solve's result is the
        ``last`` of a ``loss=`` object passed along).

    Notes
    -----
    Cost: three solves (one with ``debias=False``) and, for the gradients, four plan
    products with ``d + 1`` columns: ``O((n + m) r d)`` per product for a rank-``r``
    backend, ``O(n m d)`` for the exact one. Memory ``O((n + m) (r + d))`` for low-rank
    backends.

    References
    ----------
    Feydy, Sejourne, Vialard, Amari, Trouve, Peyre, "Interpolating between Optimal Transport
    and MMD using Sinkhorn Divergences", AISTATS 2019. Sejourne, Feydy, Vialard, Trouve,
    Peyre, "Sinkhorn Divergences for Unbalanced Optimal Transport", arXiv:1910.12958, 2019.

    Examples
    --------
    >>> import numpy as np, sketchot
    >>> rng = np.random.default_rng(0)
    >>> X, Y = rng.random((300, 2)), rng.random((200, 2)) + 0.5
    >>> res = sketchot.sinkhorn_divergence(X, Y, reg=0.1, backend="exact")
    >>> round(res.value, 4), res.grad_X.shape, res.grad_b.shape
    (0.4595, (300, 2), (200,))
    >>> sketchot.sinkhorn_divergence(X, X, reg=0.1).value
    0.0
    """
    debias = check_bool(debias, "debias")
    if on_dask(X, Y, a, b):  # the clouds stay on the cluster: value, Dask gradients
        return sinkhorn_divergence_dask(
            X, Y, a, b, reg, reg_m, backend, debias=debias, rng=rng, warm_start=warm_start,
            **kwargs,
        )  # fmt: skip
    _refuse_tensors(X=X, Y=Y, a=a, b=b)
    X = check_matrix(X, "X")
    Y = check_matrix(Y, "Y", n_features=X.shape[1], feature_name="X")
    reg = check_float(reg, "reg", positive=True)
    a = check_weights(a, "a", X.shape[0], "X")
    b = check_weights(b, "b", Y.shape[0], "Y")
    # the solves, their kernels, the lazily read gradients and a loss object's "nothing
    # moved" test keep these: never a view of the caller's memory, which an optimiser moves
    X, Y, a, b = (_private(value) for value in (X, Y, a, b))
    cost = make_cost(kwargs.get("metric", "sqeuclidean"), kwargs.get("p", 2.0))
    rho = _check_reg_m(reg_m, reg)
    if warm_start is not None and not isinstance(warm_start, DivergenceResult):
        raise TypeError(
            f"warm_start must be a DivergenceResult (a previous sinkhorn_divergence result) or "
            f"None; got {type(warm_start).__name__}"
        )
    if debias and _identical(X, Y, a, b):
        zeros = np.zeros
        return DivergenceResult(
            0.0, zeros(a.shape), zeros(b.shape),
            notes=["identical inputs: S = 0 exactly, no solve"],
            _positions={"X": zeros(X.shape), "Y": zeros(Y.shape), "cost": cost},
        )  # fmt: skip
    seed = int(check_rng(rng).integers(2**63))
    # the gradients come from the potentials: the full stopping fraction unless asked
    kwargs = {"certify_first": False, **kwargs}
    clouds = {"ab": (X, Y, a, b), "aa": (X, X, a, a), "bb": (Y, Y, b, b)}
    terms = TERMS if debias else TERMS[:1]
    results, warm, drift, notes = {}, {}, {}, []
    start = time.perf_counter()
    for name, _ in terms:
        previous = warm_start.results.get(name) if warm_start is not None else None
        trend = warm_start.drift.get(name) if warm_start is not None else None
        try:
            results[name], warm[name], note = _solve(
                *clouds[name], reg, reg_m, backend, seed, previous, trend, cost, kwargs
            )
        except RenamableError as error:  # sinkhorn's checks, in this entry's terms
            raise error.renamed(caller="sinkhorn_divergence") from None
        if note:
            notes.append(f"{name}: {note}")
        if warm[name] and results[name] is not previous:
            drift[name] = _drift(results[name], previous)
    solved = time.perf_counter()
    value = sum(weight * results[name].value for name, weight in terms)
    if debias and rho is not None:
        value += 0.5 * reg * (a.sum() - b.sum()) ** 2
    value_error = sum(abs(weight) * _value_error(results[name]) for name, weight in terms)
    grad_a, grad_b = _weight_gradients(results, clouds, reg, rho, debias, cost)
    out = DivergenceResult(
        float(value), grad_a, grad_b, value_error=float(value_error),
        accuracy=max(_accuracy(results[name]) for name, _ in terms), results=results,
        warm=warm, timings={"solve": solved - start, "gradient": time.perf_counter() - solved},
        drift=drift, notes=notes, _positions={"clouds": (X, Y, debias), "cost": cost},
    )  # fmt: skip
    if out.value < 0:
        if -out.value <= out.value_error:
            out.notes.append(f"S = {out.value:.3e} < 0 within its error: clipped to 0")
            out.value, out.clipped = 0.0, True
        else:
            why = (
                "no error estimate (accuracy=None: no true-kernel check)"
                if math.isnan(out.value_error)
                else f"beyond its estimated error {out.value_error:.2e}: the solves are not "
                f"accurate enough (true-kernel marginal error {out.accuracy:.2e})"
            )
            warnings.warn(
                f"sinkhorn_divergence: S = {out.value:.3e} < 0 with {why}; lower accuracy= or tol=",
                AccuracyWarning,
                stacklevel=user_stacklevel(),
            )
    return out


class SinkhornDivergence:
    """A loss object for loops on slowly moving clouds: :func:`sinkhorn_divergence` warm-
    started from its previous call.

    Each call solves the three problems on the previous call's backend and kernel parameters
    from the previous potentials (in cost units, so the weights may change too), moved on by
    their last change from the third call on (``DivergenceResult.drift``), and keeps the
    result when it still meets ``accuracy`` and converges; otherwise it solves cold (with
    ``backend``, ``'auto'`` by default, choosing again). A problem whose clouds and weights did
    not change (``(b, b)`` for a fixed target) keeps its previous solve; a change of the
    clouds' sizes starts cold.

    Parameters
    ----------
    reg, reg_m, backend, debias, rng, **kwargs
        As in :func:`sinkhorn_divergence`, fixed for every call.

    Attributes
    ----------
    last : DivergenceResult or None
        The previous call's result.

    Examples
    --------
    >>> import numpy as np, sketchot
    >>> rng = np.random.default_rng(0)
    >>> X, Y = rng.random((300, 2)), rng.random((200, 2)) + 0.5
    >>> loss = sketchot.SinkhornDivergence(reg=0.1, backend="exact")
    >>> first = loss(X, Y)
    >>> second = loss(X - 0.01 * first.grad_X / first.grad_X.std(), Y)
    >>> second.warm["ab"], bool(second.value < first.value)
    (True, True)
    """

    def __init__(
        self,
        reg: float = 1.0,
        reg_m: Any = None,
        backend: str = "auto",
        *,
        debias: bool = True,
        rng: Any = None,
        **kwargs: Any,
    ) -> None:
        self.reg = check_float(reg, "reg", positive=True)
        _check_reg_m(reg_m, self.reg)
        self.reg_m, self.backend = reg_m, backend
        self.debias = check_bool(debias, "debias")
        self.rng, self.kwargs = rng, kwargs
        self.last: DivergenceResult | None = None

    def __call__(
        self, X: Any, Y: Any, a: Any = None, b: Any = None, *, _arrays: Any = None
    ) -> DivergenceResult:
        """:func:`sinkhorn_divergence` of ``(X, Y, a, b)``, warm-started from the last call
        (``_arrays``: the placement of the caller's tensors, passed by :mod:`sketchot.nn`, so
        that the kernels run on their device)."""
        warm = self.last
        if warm is not None and warm.results:
            shapes = (np.shape(X)[0], np.shape(Y)[0])
            if warm.results["ab"].kernel.shape != shapes:
                warm = None
        result = sinkhorn_divergence(
            X, Y, a, b, self.reg, self.reg_m, self.backend, debias=self.debias, rng=self.rng,
            warm_start=warm, **self.kwargs, **({} if _arrays is None else {"_arrays": _arrays}),
        )  # fmt: skip
        self.last = result
        return result

    def reset(self) -> None:
        """Forget the previous call (the next one solves cold)."""
        self.last = None

    def __repr__(self) -> str:
        return (
            f"SinkhornDivergence(reg={self.reg:g}, reg_m={self.reg_m!r}, "
            f"backend={self.backend!r}, debias={self.debias})"
        )


# --------------------------------------------------------------------------- solves
def _check_reg_m(reg_m: Any, reg: float) -> float | None:
    """``None`` (balanced) or one finite penalty for both sides."""
    if reg_m is None:
        return None
    pair = check_reg_m(reg_m, reg)
    if pair[0] != pair[1]:
        raise ValueError(
            f"reg_m must be None or one penalty for both sides (the unbalanced divergence of "
            f"Sejourne et al. is symmetric); got reg_m = {reg_m!r}"
        )
    return None if math.isinf(pair[0]) else pair[0]


def _refuse_tensors(**values: Any) -> None:
    """PyTorch tensors go through :mod:`sketchot.nn` (autograd), named in the error."""
    for name, value in values.items():
        if type(value).__module__.split(".")[0] == "torch":
            raise TypeError(
                f"{name} is a torch tensor: use sketchot.sinkhorn_divergence or "
                "sketchot.nn.sinkhorn_divergence(X, Y, a, b, reg=...) (same parameters, a "
                "differentiable 0-d tensor out) or sketchot.SamplesLoss; "
                "sketchot.loss.sinkhorn_divergence takes NumPy arrays"
            )


def _private(values: np.ndarray) -> np.ndarray:
    """A read-only float64 copy: ``O(size)``, negligible next to a solve."""
    out = np.array(values, dtype=np.float64, order="C")
    out.flags.writeable = False
    return out


def _identical(X: np.ndarray, Y: np.ndarray, a: np.ndarray, b: np.ndarray) -> bool:
    return X.shape == Y.shape and np.array_equal(X, Y) and np.array_equal(a, b)


def _solve(P, Q, wp, wq, reg, reg_m, backend, seed, previous, trend, cost, kwargs):
    """One problem: warm from ``previous`` (its backend, parameters, potentials moved on by
    ``trend``) when that meets the accuracy, else cold. Returns ``(result, warm_used,
    note)``."""
    note = ""
    if previous is not None and previous.kernel.geometry.cost != cost:
        previous = None  # potentials of another cost: no start for this one
    if previous is not None and _same_problem(previous, P, Q, wp, wq, reg, reg_m, kwargs):
        return previous, True, ""  # nothing moved (a fixed target's 'bb'): the same solve
    if previous is not None and previous.kernel.shape == (P.shape[0], Q.shape[0]):
        try:
            result = _solve_warm(P, Q, wp, wq, reg, reg_m, seed, previous, trend, cost, kwargs)
        except (InvalidResultError, NonPositiveKernelError, LinearRangeError) as error:
            note = (
                f"warm start on {previous.backend!r} failed ({type(error).__name__}): solved cold"
            )
        else:
            if result.converged and result.accuracy_met is not False and _possible(result):
                return result, True, ""
            note = (
                f"warm start on {previous.backend!r} {result.status}, true-kernel error "
                f"{_accuracy(result):.2e}: solved cold"
            )
    result = sinkhorn(wp, wq, P, Q, reg, backend, reg_m=reg_m, rng=seed, **kwargs)
    return result, False, note


def _same_problem(previous, P, Q, wp, wq, reg, reg_m, kwargs) -> bool:
    """Whether ``previous`` solved this very problem (clouds, weights, ``reg``, ``reg_m``) to
    the accuracy asked now. Both sides are private copies (:func:`_private`): a caller who
    moves its arrays in place cannot make an old solve look current."""
    g = previous.kernel.geometry
    target = _options(kwargs).accuracy
    held = previous.options.get("accuracy")
    return (
        previous.converged
        and previous.accuracy_met is not False
        and (target is None or (held is not None and held <= target))
        and previous.reg == reg
        and previous.reg_m == check_reg_m(reg_m, reg)
        and g.X.shape == P.shape
        and g.Y.shape == Q.shape
        and np.array_equal(g.X, P)
        and np.array_equal(g.Y, Q)
        and np.array_equal(previous.a, wp)
        and np.array_equal(previous.b, wq)
    )


def _possible(result: SinkhornResult) -> bool:
    """Finite potentials, cost and mass (a warm start far from the solution can break down)."""
    return bool(
        np.isfinite(result.value_linear)
        and np.isfinite(result.mass)
        and result.mass > 0
        and np.all(np.isfinite(result.potentials[0][result.a > 0]))
        and np.all(np.isfinite(result.potentials[1][result.b > 0]))
    )


def _options(kwargs: dict[str, Any]) -> SolverOptions:
    """The solver options among ``kwargs`` (the rest are backend parameters)."""
    names = set(SolverOptions.names())
    return SolverOptions(**{k: v for k, v in kwargs.items() if k in names})


def _drift(result: SinkhornResult, previous: SinkhornResult) -> tuple[np.ndarray, np.ndarray]:
    """``(f - f_prev, g - g_prev)`` in cost units, 0 where a weight is 0 on either side."""
    out = []
    for now, before in zip(_potentials(result), _potentials(previous), strict=True):
        with np.errstate(invalid="ignore"):
            change = now - before
        out.append(np.where(np.isfinite(change), change, 0.0))
    return out[0], out[1]


def _solve_warm(P, Q, wp, wq, reg, reg_m, seed, previous, trend, cost, kwargs):
    # checks cost nothing (the residual comes from the pass) and a warm start is often
    # converged after a few iterations: check every one unless told otherwise
    options = _options({"check_every": 1, **kwargs})
    params = rebuild_parameters(previous.backend, previous.kernel.info.params)
    if "dtype" in kwargs:
        params["dtype"] = kwargs["dtype"]
    params.update(metric=cost.metric, p=cost.p)  # the cold solve's cost, not the default
    kernel = make_kernel(P, Q, reg, previous.backend, rng=seed, _arrays=kwargs.get("_arrays"),
                         **params)  # fmt: skip
    # potentials in cost units carry over to new weights: log u = log a + f / reg
    if trend is None:  # no drift (a cold or kept previous solve): the plain warm start
        trend = (0.0, 0.0)
    starts = []
    for weights, log_scaling, old, change in zip(
        (wp, wq), previous.potentials, (previous.a, previous.b), trend, strict=True
    ):
        with np.errstate(divide="ignore", invalid="ignore"):
            shift = np.where(np.isfinite(log_scaling), log_scaling - np.log(old), 0.0)
            starts.append(np.where(weights > 0, np.log(weights) + shift + change / reg, 0.0))
    problem = make_problem(wp, wq, kernel.shape, reg, reg_m, log_u0=starts[0], log_v0=starts[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # judged below: a miss is solved again cold
        return solve(problem, kernel, options, rng=np.random.default_rng(seed))


# --------------------------------------------------------------------- accuracy
def _accuracy(result: SinkhornResult) -> float:
    check = result.true_kernel
    return float(check.bound) if check is not None else float("nan")


def _value_error(result: SinkhornResult) -> float:
    """First-order primal-dual gap of the solve's plan on the true kernel (see
    :class:`DivergenceResult`)."""
    check = result.true_kernel
    if check is None:
        return float("nan")
    mass = float(result.a.sum())
    gap = value_error_estimate(
        *_potentials(result), mass * check.bound_a, mass * check.bound_b,
        balanced=result.problem.balanced,
    )  # fmt: skip
    return float(gap[0])


# -------------------------------------------------------------------- gradients
def _potentials(result: SinkhornResult) -> tuple[np.ndarray, np.ndarray]:
    """Dual potentials ``f = reg (log u - log a)``, ``g = reg (log v - log b)`` (NaN at zero
    weights)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        f = result.reg * (result.potentials[0] - np.log(result.a))
        g = result.reg * (result.potentials[1] - np.log(result.b))
    return np.where(result.a > 0, f, np.nan), np.where(result.b > 0, g, np.nan)


def _fill_zero_weights(f, points, others, log_other, reg, rho, cost):
    """The potential at zero weights: its continuous extension ``-reg rho' log sum_j
    exp(log v_j - c(x, y_j) / reg)`` with ``rho' = rho / (rho + reg)`` (1 balanced), on the
    true kernel of ``cost`` (``c(x, y)`` with ``x`` from ``points``)."""
    missing = np.flatnonzero(np.isnan(f))
    if not missing.size:
        return f
    keep = np.isfinite(log_other)
    exponent = 1.0 if rho is None else rho / (rho + reg)
    f = f.copy()
    for start in range(0, missing.size, 256):
        rows = missing[start : start + 256]
        if cost.sqeuclidean:
            block = ((points[rows, None, :] - others[None, keep, :]) ** 2).sum(-1)
        else:
            block = cost.block(points[rows], others[keep])
        z = log_other[keep][None, :] - block / reg
        top = z.max(axis=1)
        f[rows] = -reg * exponent * (top + np.log(np.exp(z - top[:, None]).sum(axis=1)))
    return f


def _full_potentials(result, P, Q, rho, cost):
    f, g = _potentials(result)
    log_u, log_v = result.potentials
    f = _fill_zero_weights(f, P, Q, log_v, result.reg, rho, cost)
    g = _fill_zero_weights(g, Q, P, log_u, result.reg, rho, cost.transposed())
    return f, g


def _weight_gradients(results, clouds, reg, rho, debias, cost):
    X, Y, a, b = clouds["ab"]
    f_ab, g_ab = _full_potentials(results["ab"], X, Y, rho, cost)
    if not debias:
        grad_a, grad_b = f_ab, g_ab
        if rho is not None:
            # dOT/da = rho (1 - e^{-f/rho}) - reg (e^{-f/rho} - m(b)) at the optimum
            grad_a = rho * (1 - np.exp(-f_ab / rho)) - reg * (np.exp(-f_ab / rho) - b.sum())
            grad_b = rho * (1 - np.exp(-g_ab / rho)) - reg * (np.exp(-g_ab / rho) - a.sum())
            return grad_a, grad_b
        return _balance_shift(grad_a, grad_b, a, b)
    sym = {}
    for name, (P, _, _, _) in (("aa", clouds["aa"]), ("bb", clouds["bb"])):
        f, g = _full_potentials(results[name], P, P, rho, cost)
        sym[name] = 0.5 * (f + g)
    if rho is None:
        return _balance_shift(f_ab - sym["aa"], g_ab - sym["bb"], a, b)
    scale = rho + reg
    grad_a = scale * (np.exp(-sym["aa"] / rho) - np.exp(-f_ab / rho))
    grad_b = scale * (np.exp(-sym["bb"] / rho) - np.exp(-g_ab / rho))
    return grad_a, grad_b


def _balance_shift(grad_a, grad_b, a, b):
    """``(grad_a + k, grad_b - k)`` with ``<a, grad_a + k> = <b, grad_b - k>``."""
    k = (b @ grad_b - a @ grad_a) / (a.sum() + b.sum())
    return grad_a + k, grad_b - k


def _plan_product(result: SinkhornResult, center: np.ndarray, side: int):
    """``(P 1, P (Y - c))`` (``side`` 0) or ``(P^T 1, P^T (X - c))`` (1) from the solve's
    marginals and first moments (:meth:`SinkhornResult.moment`, in its geometry's
    centring: moved to ``c`` here)."""
    marginal = result.marginals[side]
    shift = result.kernel.geometry.center - center
    return marginal, result.moment(side) + marginal[:, None] * shift


def _position_gradient(results, X, Y, debias, side, cost=None, cache=None):
    """``dS / dX`` (``side`` 'X') or ``dS / dY`` ('Y'): the cross plan's rows (columns) and
    the symmetric problem of that cloud. ``cost`` None or squared Euclidean: from the plan's
    moments; another named metric: :func:`_metric_gradient` (``cache`` keeps the cross
    plan's pass for the other side)."""
    if cost is not None and not cost.sqeuclidean:
        return _metric_gradient(results, X, Y, debias, side, cost, {} if cache is None else cache)
    center = 0.5 * (X.mean(axis=0) + Y.mean(axis=0))
    index, points, symmetric = (0, X, "aa") if side == "X" else (1, Y, "bb")
    shifted = points - center
    marginal, moment = _plan_product(results["ab"], center, index)
    grad = 2.0 * (marginal[:, None] * shifted - moment)
    if debias:
        r, Pp = _plan_product(results[symmetric], center, 0)
        c, Ptp = _plan_product(results[symmetric], center, 1)
        # d/dx_i of OT(a, a) / 2: (r_i + c_i) x_i - (P x)_i - (P^T x)_i
        grad -= (r + c)[:, None] * shifted - Pp - Ptp
    return grad


#: Entries of ``grad_x c`` held at once by :func:`_plan_cost_gradients` (32 MiB of float64).
GRADIENT_BLOCK_ENTRIES = 2**22


def _cost_derivative(cost: Cost, z: np.ndarray) -> np.ndarray:
    """``grad_x c(x, y)`` at ``z = x - y`` (last axis) for a named metric other than the
    squared Euclidean one; 0 at ``z = 0`` (a subgradient: ``c(x, x) = 0`` for every ``x``)."""
    if cost.metric == "cityblock" or (cost.metric == "minkowski" and cost.p == 1.0):
        return np.sign(z)
    order = 2.0 if cost.metric == "euclidean" else cost.p
    norm = np.linalg.norm(z, ord=order, axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        # sign(z) (|z| / ||z||_p)^(p - 1): the ratio is at most 1, no overflow for large p
        out = np.sign(z) * (np.abs(z) / norm) ** (order - 1.0)
    return np.where(norm > 0, out, 0.0)


def _plan_cost_gradients(result: SinkhornResult, P: np.ndarray, Q: np.ndarray, cost: Cost):
    """``(sum_j P_ij grad_x c(p_i, q_j), sum_i P_ij grad_y c(p_i, q_j))`` of the solved plan,
    over its row blocks (:meth:`LazyPlan.rows`: the operator's own entries, in log form for
    the exact kernel): ``O(n m d)`` time, ``O(block m d)`` memory, no ``n x m`` array."""
    plan = LazyPlan(result.kernel, *result.potentials)
    (n, d), m = P.shape, Q.shape[0]
    rows_term, cols_term = np.zeros((n, d)), np.zeros((m, d))
    step = max(1, GRADIENT_BLOCK_ENTRIES // (m * d))
    for start in range(0, n, step):
        index = np.arange(start, min(n, start + step))
        weights = plan.rows(index)
        slope = _cost_derivative(cost, P[index, None, :] - Q[None, :, :])
        rows_term[index] = np.einsum("km,kmd->kd", weights, slope)
        # a named metric is a function of x - y alone: grad_y c = -grad_x c
        cols_term -= np.einsum("km,kmd->md", weights, slope)
    return rows_term, cols_term


def _metric_gradient(results, X, Y, debias, side, cost, cache):
    """``dS / dX`` or ``dS / dY`` for a named metric other than the squared Euclidean one,
    by the envelope theorem on each solved plan: ``d OT(a, b) / dx_i = sum_j P_ij grad_x
    c(x_i, y_j)`` and ``d OT(a, a) / dx_i = sum_j (P_ij + P_ji) grad_x c(x_i, x_j)``."""
    if "ab_terms" not in cache:  # one pass gives both sides of the cross problem
        cache["ab_terms"] = _plan_cost_gradients(results["ab"], X, Y, cost)
    index, points, symmetric = (0, X, "aa") if side == "X" else (1, Y, "bb")
    grad = cache["ab_terms"][index].copy()
    if debias:
        rows_term, cols_term = _plan_cost_gradients(results[symmetric], points, points, cost)
        grad -= 0.5 * (rows_term + cols_term)
    return grad
