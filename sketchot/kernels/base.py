"""The kernel-operator contract shared by every backend.

A :class:`KernelOperator` represents the Gibbs kernel ``K_ij = exp(-||x_i - y_j||^2 / reg)``
between two clouds ``X`` (n x d) and ``Y`` (m x d), exactly or approximately. It knows
products, not Sinkhorn. Its twelve public members are what SciPy's ``LinearOperator`` and
PyLops ask for, plus declared capabilities:

* ``shape``, ``dtype``, ``matvec``, ``rmatvec``, ``matmat``, ``rmatmat`` and a budgeted
  ``to_dense`` (``scipy.sparse.linalg.aslinearoperator(K)`` works on any operator);
* ``geometry``: the clouds and ``reg`` (:class:`~sketchot.gibbs.GibbsGeometry`), from which
  anyone can evaluate the TRUE kernel on a few rows or columns;
* ``info``: backend name, parameters, rank, build time and the declared capabilities
  (:data:`CAPABILITIES`);
* ``apply_new``: out-of-sample products ``K(X_new, Y) V`` or ``K(X, Y_new)^T U``;
* ``fused_pass`` and ``project``: the blocked passes a scaling algorithm needs (below).

**Fused passes.** Every operator is viewed as ``K = L R^T`` (low rank: ``L = A``, ``R = B``;
exact or block-structured: ``L = K``, ``R = I``). ``fused_pass('rows', w, c)`` computes, in
one pass over ``L``, the products ``p = L w``, the ratios ``s = c / p`` and the projection
``L^T s``; entries whose product is not positive, not finite or negligible are reported in
a mask (their ratio is left at 0), never repaired: what to do with them is the solver's
business, and so is the marginal penalty: a pass takes the penalty's ``step``
(:class:`RatioStep`, a power and per-entry bounds built by the problem's penalty) and applies
it to the ratios, never knowing which penalty it came from.
``fused_pass('cols', ...)`` is the same over ``R``. ``project(side, s, index)`` is
``L[index]^T s`` (or ``R[index]^T s``), for the solver to start an iteration or to add the
rows it repaired. An iteration is bound by memory bandwidth, so one pass instead of two pays.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._defaults import DEFAULT_MAX_DENSE_BYTES
from .._parallel import Part, add_in_place, reduce_parts
from .._validation import check_choice, check_matrix, describe
from ..gibbs import GibbsGeometry

#: Log of the floor of an absorbed kernel's entries: one unit above log(tiny) so that exp
#: never rounds into denormals (denormal operands make BLAS products many times slower).
LOG_FLOOR = {
    np.dtype(dtype): math.ceil(math.log(np.finfo(dtype).tiny)) + 1.0
    for dtype in (np.float64, np.float32)
}

#: Capabilities an operator may declare in ``info.capabilities``:
#: ``'exact'`` (its products are the true kernel), ``'factors'`` (it has ``factors = (A, B)``
#: with ``K = A B^T``), ``'out_of_sample'`` (``apply_new`` works), ``'nonnegative'`` (its
#: entries are never negative), ``'log_products'`` (``fused_pass`` and ``project`` also run on
#: logarithms, ``log=True``, for scalings beyond float64's range), ``'absorb'`` (``absorbed(
#: alpha, beta)`` returns the operator of ``diag(e^alpha) K diag(e^beta)`` computed entry by
#: entry, so that scalings of any range can be moved into the kernel: Schmitzer 2019),
#: ``'log_means'`` (``log_means(side, log_w)`` returns ``log(L exp(w))`` and the means of
#: the other cloud's centred points weighted by ``L diag(exp(w))``, rows with an empty sum
#: ``-inf`` and 0, from one product's moments: a log-domain plan's barycentric maps without
#: a log product per coordinate),
#: ``'deferred'`` (its passes are lazy: ``fused_pass`` returns a :class:`DeferredPass`, whose
#: values are computed only when :meth:`DeferredPass.evaluate` is called, e.g. on a cluster),
#: ``'block_diagonal'`` (``info.params['batch']`` independent problems of equal shapes
#: stacked, rows and columns in consecutive slices: the solver measures its residual and
#: mixes its iterates block by block; with ``'absorb'``, ``absorbed(alpha, beta, previous,
#: blocks=mask)`` recomputes only the blocks of ``mask`` and keeps ``previous``'s others).
CAPABILITIES = frozenset(
    {
        "exact",
        "factors",
        "out_of_sample",
        "nonnegative",
        "log_products",
        "log_means",
        "absorb",
        "deferred",
        "block_diagonal",
    }
)

SIDES = ("rows", "cols")

# A ratio's denominator below this fraction of its numerator means the scaling would overflow.
MIN_DENOMINATOR_RATIO = 1e-300


@dataclass(frozen=True)
class RatioStep:
    """A marginal penalty's step on the ratios of a fused pass: ``s = clip(r ** power, lower,
    upper)`` of the ratios ``r = c / p`` (log form: ``clip(power (c - p), lower, upper)``).

    The problem's penalty (:mod:`sketchot.solver.penalties`) builds it in the form of the
    pass: a KL penalty ``reg_m`` is the power ``rho = reg_m / (reg_m + reg)``, a total-
    variation penalty the bounds ``w e^(-+reg_m / reg)`` (shifted by absorbed offsets), a hard
    constraint the identity. Kernels apply it block by block (:meth:`take`) and know nothing
    else of the penalty.

    Attributes
    ----------
    power : float
        Exponent of the ratios (1: none).
    lower, upper : ndarray of shape (n,) or None
        Per-entry bounds of the new scalings, in the pass's form (logarithms for a log pass);
        ``None``: unbounded.
    """

    power: float = 1.0
    lower: np.ndarray | None = None
    upper: np.ndarray | None = None

    @property
    def identity(self) -> bool:
        """Whether the step leaves the ratios as they are (balanced transport)."""
        return self.power == 1.0 and self.lower is None and self.upper is None

    @property
    def bounded(self) -> bool:
        """Whether the step clips the ratios."""
        return self.lower is not None or self.upper is not None

    def take(self, index: Any) -> RatioStep:
        """The step of the entries ``index`` (a block of a pass)."""
        if not self.bounded:
            return self
        return RatioStep(
            self.power,
            None if self.lower is None else self.lower[index],
            None if self.upper is None else self.upper[index],
        )

    def apply(self, ratios: np.ndarray) -> np.ndarray:
        """The multiplicative step on ``ratios``, in place; returns ``ratios``."""
        if self.power != 1.0:
            np.power(ratios, self.power, out=ratios)
        if self.bounded:
            np.clip(ratios, self.lower, self.upper, out=ratios)
        return ratios

    def apply_log(self, log_ratios: np.ndarray) -> np.ndarray:
        """The log-form step on ``log_ratios`` (a new array)."""
        out = log_ratios if self.power == 1.0 else self.power * log_ratios
        if self.bounded:
            out = np.clip(out, self.lower, self.upper)
        return out


#: The step of a hard marginal constraint (balanced transport).
IDENTITY_STEP = RatioStep()


@dataclass
class KernelInfo:
    """What an operator is: set by its builder, read by the solver and by reports.

    Attributes
    ----------
    backend : str
        Registered name of the backend that built it.
    params : dict
        The parameters it was built with.
    rank : int or None
        Number of features (``None`` for a kernel that is not low rank).
    capabilities : frozenset of str
        Declared capabilities, a subset of :data:`CAPABILITIES`.
    build_time : float
        Seconds the build took (set by :func:`~sketchot.make_kernel`).
    seconds_per_pass : float or None
        The builder's estimate of one fused pass, when a pass may be slow (streamed exact).
    product_rtol : float or None
        A bound the builder proves on the relative error of every product with non-negative
        weights against the true kernel's: the storage precision's rounding for exact
        entries (0 in float64; ``8 eps``, about 1e-6, in float32), the expansion's bound for
        the block-local kernel; ``None`` when nothing bounds it (low-rank and random-feature
        kernels: their error is absolute).
    reason : str
        Why this representation was chosen (``backend='auto'``).
    """

    backend: str
    params: dict[str, Any] = field(default_factory=dict)
    rank: int | None = None
    capabilities: frozenset[str] = frozenset()
    build_time: float = 0.0
    seconds_per_pass: float | None = None
    product_rtol: float | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        unknown = set(self.capabilities) - CAPABILITIES
        if unknown:
            raise ValueError(
                f"capabilities must be a subset of {sorted(CAPABILITIES)}; got {sorted(unknown)}"
            )
        self.capabilities = frozenset(self.capabilities)


@dataclass(frozen=True)
class FusedPass:
    """Output of :meth:`KernelOperator.fused_pass` over one side.

    Attributes
    ----------
    products : ndarray, shape (k,)
        ``L w`` (or ``R w``), raw.
    ratios : ndarray, shape (k,)
        ``(numerator / products) ** exponent`` where the numerator is positive and the
        product healthy; 0 elsewhere (zero weights and the ``bad`` entries).
    projection : ndarray, shape (r,)
        ``L^T ratios`` (or ``R^T ratios``).
    bad : ndarray of bool, shape (k,)
        Entries with a positive numerator whose product is not positive, not finite or below
        ``1e-300`` times the numerator.
    """

    products: np.ndarray
    ratios: np.ndarray
    projection: np.ndarray
    bad: np.ndarray

    @property
    def n_bad(self) -> int:
        """Number of bad entries."""
        return int(np.count_nonzero(self.bad))


class DeferredPass(ABC):
    """What :meth:`KernelOperator.fused_pass` returns for an operator with the ``'deferred'``
    capability: :class:`FusedPass`'s members as lazy values of that operator.

    ``ratios`` and ``projection`` are what the operator's next ``fused_pass`` and
    ``project`` take (so passes chain without being computed), ``n_bad`` is a lazy count;
    ``products``, ``ratios`` and ``bad`` become arrays of the operator's own kind when read
    as arrays. A solver computes a chain once per convergence check: :meth:`residual` gives
    its stopping criterion, :meth:`evaluate` the values.
    """

    products: Any
    ratios: Any
    projection: Any
    bad: Any
    n_bad: Any

    @abstractmethod
    def residual(self, scaling: Any, norm: str = "l2") -> Any:
        """Lazy ``||products * (scaling - ratios)||`` (``norm``: ``'l2'`` or ``'l1'``) over
        the entries with a positive numerator (the Sinkhorn residual of a columns pass,
        ``scaling`` the previous ``v``)."""

    @abstractmethod
    def evaluate(self, *values: Any) -> list[Any]:
        """The values of lazy values of this pass's chain (numbers pass through), computed
        together with every pass of the chain not computed yet."""


class KernelOperator(ABC):
    """Gibbs kernel ``exp(-||x - y||^2 / reg)`` between ``X`` and ``Y`` as a linear operator.

    Parameters
    ----------
    geometry : GibbsGeometry
        The clouds and ``reg``.
    info : KernelInfo
        Backend name, parameters, rank and capabilities.
    dtype : numpy dtype
        Storage and product precision (float64 or float32); products are returned as float64.

    """

    def __init__(self, geometry: GibbsGeometry, info: KernelInfo, dtype: Any) -> None:
        self.geometry = geometry
        self.info = info
        self.dtype = np.dtype(dtype)

    @property
    def shape(self) -> tuple[int, int]:
        """``(n, m)``."""
        return self.geometry.shape

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.info.params.items())
        n, m = self.shape
        return (
            f"<{type(self).__name__} '{self.info.backend}' {n}x{m} reg={self.geometry.reg:g} "
            f"dtype={self.dtype}{', ' + params if params else ''}>"
        )

    # ------------------------------------------------------------- products
    @abstractmethod
    def matmat(self, V: Any) -> np.ndarray:
        """``K @ V`` for ``V`` of shape (m,) or (m, k)."""

    @abstractmethod
    def rmatmat(self, U: Any) -> np.ndarray:
        """``K.T @ U`` for ``U`` of shape (n,) or (n, k)."""

    def matvec(self, v: Any) -> np.ndarray:
        """``K v`` for ``v`` of shape (m,) or (m, 1); the result has shape (n,) or (n, 1)."""
        return self.matmat(check_operand(v, self.shape[1], "v", vector=True))

    def rmatvec(self, u: Any) -> np.ndarray:
        """``K^T u`` for ``u`` of shape (n,) or (n, 1); the result has shape (m,) or (m, 1)."""
        return self.rmatmat(check_operand(u, self.shape[0], "u", vector=True))

    def to_dense(self, max_bytes: int = DEFAULT_MAX_DENSE_BYTES, rows: Any = None) -> np.ndarray:
        """The ``n x m`` matrix, or its ``rows``, as float64; refuses above ``max_bytes``."""
        n, m = self.shape
        index = np.arange(n)[slice(None) if rows is None else rows]
        if index.size * m * 8 > max_bytes:
            raise MemoryError(
                f"to_dense would build a {index.size} x {m} float64 array "
                f"({index.size * m * 8 / 2**20:.0f} MiB) above max_bytes={max_bytes}; "
                "use matvec/matmat, or pass rows="
            )
        return self._rows(index)

    @abstractmethod
    def _rows(self, index: np.ndarray) -> np.ndarray:
        """Dense rows ``K[index, :]`` as float64."""

    def apply_new(self, points: Any, values: Any, *, side: str = "source") -> np.ndarray:
        """Out of sample, without refitting: ``K(points, Y) @ values`` for new source points
        (``side='source'``) or ``K(X, points).T @ values`` for new target points
        (``side='target'``). Needs the ``'out_of_sample'`` capability."""
        check_choice(side, "side", ("source", "target"))
        if "out_of_sample" not in self.info.capabilities:
            raise NotImplementedError(
                f"backend {self.info.backend!r} declares no out-of-sample products"
            )
        transpose = side == "target"
        points = check_matrix(
            points,
            "points",
            n_features=self.geometry.X.shape[1],
            feature_name="the fitted points",
        )
        values = check_operand(values, self.shape[0 if transpose else 1], "values", vector=False)
        return self._apply_new(points, values, transpose)

    def _apply_new(self, points: np.ndarray, values: np.ndarray, transpose: bool) -> np.ndarray:
        """The out-of-sample product of an operator that declares ``'out_of_sample'``."""
        raise NotImplementedError(
            f"backend {self.info.backend!r} declares 'out_of_sample' but does not implement it"
        )

    # -------------------------------------------------------- fused passes
    @abstractmethod
    def fused_pass(
        self,
        side: str,
        w: np.ndarray,
        numerator: np.ndarray,
        *,
        log: bool = False,
        step: RatioStep = IDENTITY_STEP,
    ) -> FusedPass:
        """One pass over ``L`` (``side='rows'``) or ``R`` (``'cols'``); see the module notes.

        ``step`` is the marginal penalty's step on the ratios (:class:`RatioStep`). With
        ``log=True`` (``'log_products'`` capability) every input and output is a logarithm:
        products ``log(L exp(w))``, ratios ``step(numerator - products)`` and projection
        ``log(L^T exp(ratios))``; bad entries are non-finite products of finite numerators.
        """

    @abstractmethod
    def project(
        self, side: str, values: np.ndarray, index: Any = None, *, log: bool = False
    ) -> np.ndarray:
        """``L[index]^T values`` (``side='rows'``) or ``R[index]^T values`` (``'cols'``);
        ``index=None`` means every row; ``log=True``: ``log(L[index]^T exp(values))``."""


def refuse_log(operator: KernelOperator, log: bool) -> None:
    """Raise for ``log=True`` on an operator without the ``'log_products'`` capability."""
    if log:
        raise NotImplementedError(
            f"backend {operator.info.backend!r} declares no log-domain products"
        )


def check_operand(value: Any, length: int, name: str, *, vector: bool) -> np.ndarray:
    """A real vector (or matrix) whose first dimension is ``length``, as float64.

    ``vector=True`` accepts shape ``(length,)`` or ``(length, 1)``, as SciPy's
    ``LinearOperator.matvec`` does; the product keeps the operand's number of dimensions.
    """
    array = np.asarray(value)
    if array.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be a real array; got {describe(value)}")
    if vector and not (array.ndim == 1 or (array.ndim == 2 and array.shape[1] == 1)):
        raise ValueError(
            f"{name} must be a vector of shape ({length},) or ({length}, 1); "
            f"got shape {array.shape}"
        )
    if array.ndim not in (1, 2) or array.shape[0] != length:
        raise ValueError(
            f"{name} must have shape ({length},) or ({length}, k); got shape {array.shape}"
        )
    return array.astype(np.float64, copy=False)


def ratios_and_bad(
    numerator: np.ndarray, products: np.ndarray, step: RatioStep = IDENTITY_STEP
) -> tuple[np.ndarray, np.ndarray]:
    """``step(numerator / products)`` where healthy (0 elsewhere) and the mask of bad
    entries (``step`` of the same entries: :meth:`RatioStep.take`)."""
    active = numerator > 0
    with np.errstate(invalid="ignore", over="ignore"):
        healthy = (products >= numerator * MIN_DENOMINATOR_RATIO) & np.isfinite(products)
        healthy &= products > 0
    bad = active & ~healthy
    out = np.zeros_like(products, dtype=np.float64)
    np.divide(numerator, products, out=out, where=active & healthy)
    if not step.identity:
        step.apply(out)
        if step.bounded:  # a clip must not lift the zeros of bad or inactive entries
            out[~(active & healthy)] = 0.0
    return out, bad


def fast_ratios_and_bad(
    numerator: np.ndarray, products: np.ndarray, step: RatioStep = IDENTITY_STEP
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`ratios_and_bad`, with a fast path for the usual case (every numerator positive,
    every product healthy): one division and no masks; the same values either way."""
    smallest = products.min() if products.size else 1.0
    with np.errstate(over="ignore", invalid="ignore"):
        if (
            numerator.min(initial=1.0) > 0
            and smallest >= MIN_DENOMINATOR_RATIO * numerator.max(initial=0.0)
            and smallest > 0
            and np.isfinite(products.max(initial=0.0))
        ):
            ratios = numerator / products
            step.apply(ratios)
            return ratios, np.zeros(products.shape, dtype=bool)
    return ratios_and_bad(numerator, products, step)


def log_ratios_and_bad(
    numerator: np.ndarray, products: np.ndarray, step: RatioStep = IDENTITY_STEP
) -> tuple[np.ndarray, np.ndarray]:
    """The log-domain form of :func:`ratios_and_bad`: ``step(numerator - products)``
    where the numerator is finite and the product finite (``-inf`` elsewhere), and the mask
    of finite numerators with a non-finite product."""
    active = np.isfinite(numerator)
    bad = active & ~np.isfinite(products)
    with np.errstate(invalid="ignore"):
        ratios = np.where(active & ~bad, step.apply_log(numerator - products), -np.inf)
    return ratios, bad


# Passes over fewer entries than this run in the calling thread: the thread hand-off costs
# more than it saves on small problems.
THREADED_PASS_MIN_ENTRIES = 1 << 22

# Entries per block of a threaded pass: the block stays in cache between its two products
# and each product stays below the size where OpenBLAS starts threads of its own.
PASS_BLOCK_ENTRIES = 1 << 18

# Entries per block of a pass in the calling thread: larger, so BLAS may thread mid-sized
# products itself.
SERIAL_PASS_ENTRIES = 1 << 20


def pass_slices(n_rows: int, n_cols: int, entries: int | None = None) -> list[slice]:
    """Row blocks of a pass over an ``n_rows x n_cols`` matrix."""
    if entries is None:
        threaded = n_rows * n_cols >= THREADED_PASS_MIN_ENTRIES
        entries = PASS_BLOCK_ENTRIES if threaded else SERIAL_PASS_ENTRIES
    step = max(1, entries // max(1, n_cols))
    return [slice(start, min(start + step, n_rows)) for start in range(0, n_rows, step)]


def matrix_fused_pass(
    F: np.ndarray, w: np.ndarray, numerator: np.ndarray, dtype, step: RatioStep = IDENTITY_STEP
) -> FusedPass:
    """:func:`blocked_fused_pass` over a stored matrix ``F`` (a factor), in the default row
    blocks of :func:`pass_slices`; :func:`dense_fused_pass` below the threaded size."""
    n_rows, n_cols = F.shape
    if n_rows * n_cols < THREADED_PASS_MIN_ENTRIES and F.dtype == dtype:
        # a pass in the calling thread: two whole products cost the least Python
        return dense_fused_pass(F, w, numerator, step)
    return blocked_fused_pass(
        pass_slices(n_rows, n_cols), F.__getitem__, n_rows, n_cols, w, numerator, dtype, step
    )


class IdentityPass(FusedPass):
    """The columns pass of an operator with ``R = I``: its products are ``K^T u``."""


def identity_pass(
    w: np.ndarray, numerator: np.ndarray, *, log: bool = False, step: RatioStep = IDENTITY_STEP
) -> IdentityPass:
    """The columns pass of an operator with ``R = I`` (``K = L``: exact, block-local,
    stacked): the products are ``w`` itself (``K^T u`` from the previous rows pass) and the
    projection is the ratios."""
    products = np.array(w, dtype=np.float64)
    ratios_of = log_ratios_and_bad if log else fast_ratios_and_bad
    ratios, bad = ratios_of(numerator, products, step)
    return IdentityPass(products, ratios, ratios, bad)


class ProjectedOnRead(FusedPass):
    """A rows pass whose projection (a second product as costly as the first) is computed
    when first read: plan evaluations and warm starts read only the products."""

    def __init__(self, products, ratios, bad, project) -> None:
        for name, value in (("products", products), ("ratios", ratios), ("bad", bad)):
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_project", project)
        object.__setattr__(self, "_projection", None)

    @property
    def projection(self) -> np.ndarray:
        if self._projection is None:
            object.__setattr__(self, "_projection", self._project(self.ratios))
        return self._projection


def log_fused_pass(
    log_product: Any, log_rproduct: Any, w: np.ndarray, numerator: np.ndarray, step: RatioStep
) -> FusedPass:
    """The log-domain rows pass from an operator's two log products: ``log_product(w)``
    (``log(K exp(w))``), its ratios, and ``log_rproduct(ratios)`` (``log(K^T exp(r))``),
    the last when first read."""
    products = log_product(w)
    ratios, bad = log_ratios_and_bad(numerator, products, step)
    return ProjectedOnRead(products, ratios, bad, log_rproduct)


def dense_fused_pass(
    K: np.ndarray, w: np.ndarray, numerator: np.ndarray, step: RatioStep = IDENTITY_STEP
) -> FusedPass:
    """:meth:`KernelOperator.fused_pass` over a stored matrix ``K`` as two whole products,
    ``p = K w`` and ``K^T s``: BLAS threads them itself, which on a stored kernel beats the
    blocked pass's Python threads (measured by ``benchmarks/sinkhorn_speed.py``: the two
    compete for the same cores); products in ``K``'s dtype, ratios and sums in float64."""
    with np.errstate(over="ignore", invalid="ignore"):
        products = np.asarray(K @ w.astype(K.dtype, copy=False), dtype=np.float64)
        ratios, bad = fast_ratios_and_bad(numerator, products, step)
        projection = np.asarray(ratios.astype(K.dtype, copy=False) @ K, dtype=np.float64)
    return FusedPass(products, ratios, projection, bad)


def blocked_fused_pass(
    slices: Sequence[slice],
    block_of: Callable[[slice], np.ndarray],
    n_rows: int,
    out_dim: int,
    w: np.ndarray,
    numerator: np.ndarray,
    dtype: np.dtype,
    step: RatioStep = IDENTITY_STEP,
) -> FusedPass:
    """:meth:`KernelOperator.fused_pass` over a row-partitioned matrix ``F``.

    For each block ``F_b = block_of(rows)``: ``p_b = F_b w``, ``s_b = step(c_b / p_b)``
    (healthy entries), ``proj += F_b^T s_b``. Products run in ``dtype`` (float32 factors are never
    copied to float64); ratios and sums are float64. Large passes are split over the pool's
    threads (numpy releases the GIL) in groups of consecutive blocks that do not depend on the
    number of threads; each group sums its own projection and the groups' projections are
    added in group order, so the result is the same, bit for bit, with any number of threads.
    Ctrl-C stops the pass between two blocks (see :func:`sketchot._parallel.run_parts`).
    """
    w_cast = w.astype(dtype, copy=False)
    products = np.empty(n_rows)
    ratios = np.empty(n_rows)
    bad = np.zeros(n_rows, dtype=bool)
    all_active = numerator.min() > 0
    floor = MIN_DENOMINATOR_RATIO * numerator.max()

    def run(part: Part[slice]) -> np.ndarray:
        proj = np.zeros(out_dim)
        # A diverging approximation can overflow; such entries come back in the mask.
        with np.errstate(over="ignore", invalid="ignore"):
            for index in part:
                F = block_of(index)
                p = products[index]
                p[...] = F @ w_cast
                smallest = p.min()
                # Fast path, taken by almost every block: one division and no masks.
                if all_active and smallest >= floor and smallest > 0 and np.isfinite(p.max()):
                    s = np.divide(numerator[index], p, out=ratios[index])
                    step.take(index).apply(s)
                else:
                    s = ratios[index]
                    s[...], bad[index] = ratios_and_bad(numerator[index], p, step.take(index))
                proj += s.astype(dtype, copy=False) @ F
        return proj

    threaded = n_rows * out_dim >= THREADED_PASS_MIN_ENTRIES
    projection = reduce_parts(run, slices, threaded, add_in_place)
    return FusedPass(products, ratios, projection, bad)
