"""Fast exact-kernel Sinkhorn paths: a dense multiplicative loop, an absorption-stabilised
iteration (dense or streamed) and epsilon-scaling, on plain arrays.

These routines are self-contained building blocks for the solver: they take centred point
clouds (or a stored kernel), weights and tolerances, and return log-scalings. For weights
``a`` (n,), ``b`` (m,) of equal mass and the Gibbs kernel ``K_ij = exp(-C_ij / reg)``,
``C_ij = ||x_i - y_j||^2``, every path runs POT's Sinkhorn-Knopp iteration

.. math:: v^{(k)} = b \\oslash K^\\top u^{(k-1)}, \\qquad u^{(k)} = a \\oslash K v^{(k)},

from ``u^{(0)} = 1/n`` (``v^{(0)} = 1/m``), and stops at the first checked iterate whose L2
column-marginal error ``||v * K^T u - b||_2`` is below ``tol`` (checked after iterations
``1, 1 + check_every, 1 + 2 check_every, ...``, as ``ot.sinkhorn`` does). They return the same
iterates as ``ot.sinkhorn`` up to rounding, with ``n_iter = POT's log['niter'] + 1`` (POT reports
the 0-based index of the last iteration).

Paths
-----
:func:`dense_sinkhorn`
    Plain products with a stored ``K`` (float64 or float32), preallocated buffers, no
    allocation per iteration, the column-marginal check for free from the next ``K^T u``.
:func:`stabilized_sinkhorn`
    Schmitzer's absorption (2019, Sec. 3): multiplicative iterations on
    ``K~_ij = exp(alpha_i + beta_j - C_ij / reg)``; whenever a scaling leaves
    ``[e^-tau, e^tau]`` it is absorbed into ``(alpha, beta)`` and ``K~`` is rebuilt. Finite
    for any ``reg``; costs one exponential per entry per absorption (dense) instead of per
    iteration (log-sum-exp). Streamed in row blocks when ``n m`` exceeds a memory budget.
:func:`anneal`, :func:`epsilon_schedule`
    Epsilon-scaling over any stage solver; :func:`exact_sinkhorn` ties everything together.

References
----------
M. Cuturi, "Sinkhorn distances", NeurIPS 2013.
B. Schmitzer, "Stabilized sparse scaling algorithms for entropy regularized transport
problems", SIAM J. Sci. Comput. 41(3), 2019, Sec. 3 (absorption, epsilon-scaling).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from .._parallel import run_parts
from .._validation import check_float, check_int, describe
from ..gibbs import (
    BLOCK_BYTES,
    block_rows,
    gibbs_log_matvec,
    neg_cost_over_reg,
    row_slices,
    sq_norms,
)
from .acceleration import AndersonMixer

# Absorption thresholds on |log u~|, |log v~| (see stabilized_sinkhorn, Notes). An entry of K~
# below the smallest normal number is clamped to it (never denormal: denormal operands make
# BLAS products many times slower). Its contribution to a row sum, at most m tiny e^tau, stays
# below m tiny e^(2 tau) / a_i relative to the row sum (>= a_i e^-tau): e^-507 m / a_i with
# tau = 100 in float64, e^-46 m / a_i (1e-12 at m = 10^4, a_i = 1e-4) with tau = 20 in float32.
ABSORB_THRESHOLD = {np.dtype(np.float64): 100.0, np.dtype(np.float32): 20.0}

# Log of the clamp floor: one unit above log(tiny) so that exp never rounds into denormals.
LOG_FLOOR = {dtype: math.ceil(math.log(np.finfo(dtype).tiny)) + 1.0 for dtype in ABSORB_THRESHOLD}

#: Default memory budget of a stored (absorbed) kernel: 1 GiB.
DEFAULT_MAX_DENSE_BYTES = 1 << 30

# Target bytes of one streamed block of K~ (computed in float64): BLAS-efficient, cache-sized.
STREAM_BLOCK_BYTES = BLOCK_BYTES

# Breakdowns (an underflowed or overflowed product) repaired by an exact log-sum-exp reset
# before the stabilised path gives up. Each reset costs two log-domain passes.
MAX_RESETS = 20

History = list[tuple[int, float]]


class SinkhornPath(NamedTuple):
    """What every exact path returns.

    Attributes
    ----------
    log_u, log_v : ndarray, shape (n,), (m,), float64
        Log-scalings of the plan ``P = diag(u) K diag(v)``; the dual potentials are
        ``f = reg log_u`` and ``g = reg log_v`` (units of the cost, ``||x - y||^2``). Zero
        weights give ``-inf``.
    n_iter : int
        Sinkhorn iterations performed (one ``v`` and one ``u`` update each).
    converged : bool
        Whether the error of the returned iterate is below ``tol``.
    history : list of (int, float)
        ``(iteration, ||v * K^T u - b||_2)`` at every check, the returned iterate last.
    info : dict
        Path-specific counters (``absorptions``, ``resets``, ``breakdown``, ``stages``, ...).
    """

    log_u: np.ndarray
    log_v: np.ndarray
    n_iter: int
    converged: bool
    history: History
    info: dict[str, Any]


# ----------------------------------------------------------------------------- validation
def _check_common(a, b, reg, tol, max_iter, check_every):
    a = _check_histogram(a, "a")
    b = _check_histogram(b, "b")
    if not math.isclose(a.sum(), b.sum(), rel_tol=1e-6):
        raise ValueError(
            f"a and b must have the same total mass; got sum(a) = {a.sum():.8g} and "
            f"sum(b) = {b.sum():.8g}"
        )
    reg = None if reg is None else check_float(reg, "reg", positive=True)
    tol = check_float(tol, "tol", positive=True)
    max_iter = check_int(max_iter, "max_iter", minimum=1)
    check_every = check_int(check_every, "check_every", minimum=1)
    return a, b, reg, tol, max_iter, check_every


def _check_histogram(value: Any, name: str) -> np.ndarray:
    array = np.asarray(value, dtype=np.float64) if _is_real(value) else None
    if array is None or array.ndim != 1:
        raise ValueError(
            f"{name} must be a 1-D array of non-negative weights; got {describe(value)}"
        )
    if not np.all(np.isfinite(array)) or array.min(initial=0.0) < 0 or not array.sum() > 0:
        raise ValueError(f"{name} must be finite, non-negative and have positive total mass")
    return np.ascontiguousarray(array)


def _is_real(value: Any) -> bool:
    return np.asarray(value).dtype.kind in "biuf"


def _check_dtype(dtype: Any) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype not in ABSORB_THRESHOLD:
        raise ValueError(f"dtype must be numpy.float64 or numpy.float32; got {dtype}")
    return dtype


def _check_points(Xc: Any, Yc: Any) -> tuple[np.ndarray, np.ndarray]:
    Xc = np.ascontiguousarray(Xc, dtype=np.float64)
    Yc = np.ascontiguousarray(Yc, dtype=np.float64)
    if Xc.ndim != 2 or Yc.ndim != 2 or Xc.shape[1] != Yc.shape[1]:
        raise ValueError(
            f"Xc and Yc must be 2-D arrays with the same number of columns; got shapes "
            f"{Xc.shape} and {Yc.shape}"
        )
    return Xc, Yc


# ------------------------------------------------------------------ dense multiplicative
def dense_sinkhorn(
    K: np.ndarray,
    a: Any,
    b: Any,
    *,
    tol: float = 1e-9,
    max_iter: int = 1000,
    check_every: int = 10,
) -> SinkhornPath:
    """Sinkhorn-Knopp on a stored kernel, POT's iterates at lower cost per iteration.

    Parameters
    ----------
    K : ndarray, shape (n, m), float64 or float32
        The Gibbs kernel ``exp(-C / reg)`` (any non-negative matrix). Used as given, never
        copied (a C-contiguous array avoids a copy inside BLAS).
    a : array-like, shape (n,)
        Source weights, non-negative (zeros allowed: ``log_u = -inf`` there).
    b : array-like, shape (m,)
        Target weights, same total mass.
    tol : float, default=1e-9
        Stop when ``||v * K^T u - b||_2 < tol`` (POT's ``stopThr``).
    max_iter : int, default=1000
    check_every : int, default=10
        Iterations between checks (iterations ``1 + k check_every`` are checked, as in POT).

    Returns
    -------
    SinkhornPath
        ``info['breakdown']`` is the iteration at which a product underflowed or overflowed
        (then, as POT does, the previous iterate is returned), or ``None``.

    Notes
    -----
    Per iteration: two ``O(n m)`` BLAS matrix-vector products (``K^T u`` and ``K v``) and
    ``O(n + m)`` vector work into preallocated buffers. The convergence check needs no
    extra pass: the column marginal ``v^{(k)} * K^T u^{(k)}`` uses the ``K^T u^{(k)}`` that
    iteration ``k + 1`` computes anyway (POT spends a third ``O(n m)`` pass on it). With a
    float32 ``K`` the products run in float32 (half the memory traffic) and the scalings stay
    float64; float32 resolves marginal errors down to about ``1e-7 ||b||_2`` only.
    Underflow: entries of ``K`` below ``1e-308`` are zero, so at small ``reg`` a whole row
    can vanish; use :func:`stabilized_sinkhorn` there.
    """
    a, b, _, tol, max_iter, check_every = _check_common(a, b, None, tol, max_iter, check_every)
    if not isinstance(K, np.ndarray) or K.ndim != 2 or K.shape != (a.size, b.size):
        raise ValueError(
            f"K must be an array of shape (len(a), len(b)) = ({a.size}, {b.size}); got "
            f"{describe(K)}"
        )
    _check_dtype(K.dtype)
    n, m = K.shape
    u = np.where(a > 0, 1.0 / n, 0.0)
    v = np.where(b > 0, 1.0 / m, 0.0)
    loop = _Loop(_StoredOps(K, a), a, b, tol, check_every)
    history: History = []
    status, n_iter, u, v = loop.run(u, v, 1, max_iter, history, bound=None)
    with np.errstate(divide="ignore"):
        log_u, log_v = np.log(u), np.log(v)
    info = {"breakdown": n_iter + 1 if status == "breakdown" else None}
    return SinkhornPath(log_u, log_v, n_iter, status == "converged", history, info)


class _StoredOps:
    """Products with a stored matrix ``K`` (float64 or float32) into preallocated buffers."""

    def __init__(self, K: np.ndarray, a: np.ndarray) -> None:
        self.K = K
        self.a = a
        self.product_dtype = K.dtype
        n, m = K.shape
        low = K.dtype != np.float64
        self.Kv = np.empty(n, K.dtype)
        # float32 products need float32 operands: scalings are cast into these (O(n + m)).
        self.u_low = np.empty(n, K.dtype) if low else None
        self.v_low = np.empty(m, K.dtype) if low else None
        self.all_rows = bool(a.min() > 0)
        self.active = a > 0

    def col(self, u: np.ndarray, out: np.ndarray) -> None:
        """``out = K^T u``."""
        if self.u_low is not None:
            np.copyto(self.u_low, u, casting="same_kind")
            u = self.u_low
        np.dot(self.K.T, u, out=out)

    def sweep(self, v: np.ndarray, u_out: np.ndarray, Ktu_out: np.ndarray) -> None:
        """``u_out = a / (K v)`` (0 where ``a = 0``), then ``Ktu_out = K^T u_out``."""
        if self.v_low is not None:
            np.copyto(self.v_low, v, casting="same_kind")
            v = self.v_low
        np.dot(self.K, v, out=self.Kv)
        if self.all_rows:
            np.divide(self.a, self.Kv, out=u_out)
        else:
            np.divide(self.a, self.Kv, out=u_out, where=self.active)
        self.col(u_out, Ktu_out)


class _Loop:
    """The iteration shared by every path: ``v = b / K^T u``, then one sweep for ``u`` and the
    next ``K^T u``; the operator (stored or streamed) does the products.

    ``run`` continues from an iterate ``(u, v)`` (zero where the weight is zero) and stops on
    convergence, at ``max_iter``, on a breakdown, or (``bound`` given) as soon as a scaling
    leaves ``[1 / bound, bound]``, for the stabilised path to absorb it.
    """

    def __init__(self, ops: Any, a: np.ndarray, b: np.ndarray, tol: float, every: int) -> None:
        self.ops, self.a, self.b, self.tol, self.every = ops, a, b, tol, every
        m = b.size
        self.Ktu = np.empty(m, ops.product_dtype)
        self.Ktu_next = np.empty(m, ops.product_dtype)
        self.scratch = np.empty(m)
        self.all_cols = bool(b.min() > 0)
        self.active_b = b > 0
        self.rows_index = None if a.min() > 0 else np.flatnonzero(a > 0)
        self.cols_index = None if self.all_cols else np.flatnonzero(self.active_b)

    def error(self, v: np.ndarray) -> float:
        """``||v * K^T u - b||_2`` with ``self.Ktu`` holding ``K^T u``."""
        np.multiply(v, self.Ktu, out=self.scratch)
        self.scratch -= self.b
        return math.sqrt(float(self.scratch @ self.scratch))

    def run(
        self,
        u: np.ndarray,
        v: np.ndarray,
        start: int,
        max_iter: int,
        history: History,
        bound: float | None,
        mixer: AndersonMixer | None = None,
        log_offset: np.ndarray | float = 0.0,
    ) -> tuple[str, int, np.ndarray, np.ndarray]:
        """Iterations ``start .. max_iter`` from the iterate of iteration ``start - 1``.

        ``mixer`` (optional) Anderson-mixes the column log-scalings ``log_offset + log v``
        (``log_offset``: the absorbed ``beta``, so that the history survives absorptions).
        Returns ``(status, n_iter, u, v)``: ``status`` is ``'converged'``, ``'max_iter'``,
        ``'breakdown'`` (the last finite iterate is returned) or ``'bound'``.
        """
        u_next, v_next = np.zeros_like(u), np.zeros_like(v)
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            self.ops.col(u, self.Ktu)
            for iteration in range(start, max_iter + 2):
                # K^T u of iterate (iteration - 1) is known: its column marginal costs O(m).
                last = iteration == max_iter + 1
                if iteration > 1 and ((iteration - 2) % self.every == 0 or last):
                    error = self.error(v)
                    if not math.isfinite(error):
                        return "breakdown", iteration - 1, u, v
                    history.append((iteration - 1, error))
                    if error < self.tol:
                        return "converged", iteration - 1, u, v
                if last:
                    return "max_iter", max_iter, u, v
                if self.all_cols:
                    np.divide(self.b, self.Ktu, out=v_next)
                else:
                    np.divide(self.b, self.Ktu, out=v_next, where=self.active_b)
                if mixer is not None:
                    mixed = mixer.step(log_offset + np.log(v), log_offset + np.log(v_next))
                    np.exp(mixed - log_offset, out=v_next, where=self.active_b)
                self.ops.sweep(v_next, u_next, self.Ktu_next)
                # A vanished or overflowed product makes a sum non-finite: O(n + m), no copy.
                if not (math.isfinite(u_next.sum()) and math.isfinite(v_next.sum())):
                    return "breakdown", iteration - 1, u, v
                u, u_next = u_next, u
                v, v_next = v_next, v
                self.Ktu, self.Ktu_next = self.Ktu_next, self.Ktu
                if bound is not None and self._out_of_bounds(u, v, bound):
                    return "bound", iteration, u, v
        raise AssertionError("unreachable")  # pragma: no cover

    def _out_of_bounds(self, u: np.ndarray, v: np.ndarray, bound: float) -> bool:
        if u.max() > bound or v.max() > bound:
            return True
        u_min = u.min() if self.rows_index is None else u[self.rows_index].min()
        v_min = v.min() if self.cols_index is None else v[self.cols_index].min()
        return bool(u_min * bound < 1.0 or v_min * bound < 1.0)


# ------------------------------------------------------------------- absorbed kernel
class _AbsorbedKernel:
    """``K~_ij = exp(alpha_i + beta_j - C_ij / reg)`` from centred points, block by block.

    Exponents are clamped below at ``LOG_FLOOR[dtype]`` (entries never denormal; see
    ``ABSORB_THRESHOLD`` for why the clamp is harmless) and rows or columns with zero weight
    (``alpha_i`` or ``beta_j = -inf``) get the floor too: their scaling is 0.
    """

    def __init__(self, Xc, Yc, reg, dtype, rows_per_block):
        self.Xc, self.Yc, self.reg, self.dtype = Xc, Yc, reg, dtype
        self.x_sq, self.y_sq = sq_norms(Xc), sq_norms(Yc)
        self.floor = LOG_FLOOR[dtype]
        self.slices = list(row_slices(Xc.shape[0], rows_per_block))
        self.alpha = np.zeros(Xc.shape[0])
        self.beta = np.zeros(Yc.shape[0])

    def block(self, rows: slice) -> np.ndarray:
        """Rows ``K~[rows]`` in ``dtype`` (a fresh array)."""
        T = neg_cost_over_reg(self.Xc[rows], self.Yc, self.reg, self.x_sq[rows], self.y_sq)
        T += self.alpha[rows, None]
        T += self.beta[None, :]
        np.maximum(T, self.floor, out=T)  # also maps -inf (zero weights) to the floor
        np.exp(T, out=T)
        return T if self.dtype == np.float64 else T.astype(self.dtype)


class _StreamedOps:
    """Products with ``K~`` recomputed block by block; ``u = a / K~ v`` and ``K~^T u`` fused in
    one pass (each block's exponentials computed once per iteration), split over threads."""

    def __init__(self, kernel: _AbsorbedKernel, a: np.ndarray, parallel: bool) -> None:
        self.kernel, self.a, self.parallel = kernel, a, parallel
        self.product_dtype = np.dtype(np.float64)  # partial sums accumulate in float64
        self.active = a > 0

    def col(self, u: np.ndarray, out: np.ndarray) -> None:
        def part(slices):
            total = np.zeros(out.size)
            for rows in slices:
                block = self.kernel.block(rows)
                total += u[rows].astype(block.dtype, copy=False) @ block
            return total

        self._reduce(part, out)

    def sweep(self, v: np.ndarray, u_out: np.ndarray, Ktu_out: np.ndarray) -> None:
        def part(slices):
            total = np.zeros(Ktu_out.size)
            for rows in slices:
                block = self.kernel.block(rows)
                Kv = block @ v.astype(block.dtype, copy=False)
                u_rows = u_out[rows]
                np.divide(self.a[rows], Kv, out=u_rows, where=self.active[rows])
                total += u_rows.astype(block.dtype, copy=False) @ block
            return total

        self._reduce(part, Ktu_out)

    def _reduce(self, part, out):
        # Partial sums are added in part order: the result does not depend on scheduling.
        partial = run_parts(part, self.kernel.slices, self.parallel)
        out[...] = partial[0]
        for more in partial[1:]:
            out += more


# --------------------------------------------------------------------- stabilised path
def stabilized_sinkhorn(
    Xc: Any,
    Yc: Any,
    a: Any,
    b: Any,
    reg: float,
    *,
    tol: float = 1e-9,
    max_iter: int = 1000,
    check_every: int = 10,
    dtype: Any = np.float64,
    max_dense_bytes: int = DEFAULT_MAX_DENSE_BYTES,
    threshold: float | None = None,
    log_u0: np.ndarray | None = None,
    log_v0: np.ndarray | None = None,
    parallel: bool = True,
    anderson: int = 0,
) -> SinkhornPath:
    """Exact Sinkhorn for any ``reg``: multiplicative iterations on an absorbed kernel.

    The iterate is kept as ``u = e^alpha u~``, ``v = e^beta v~`` with the absorbed kernel
    ``K~ = diag(e^alpha) K diag(e^beta)``, ``K~_ij = exp(alpha_i + beta_j - C_ij / reg)``.
    Then ``v~ = b / K~^T u~`` and ``u~ = a / K~ v~`` are exactly POT's updates, rescaled. When
    a scaling leaves ``[e^-tau, e^tau]`` after an iteration, it is absorbed:
    ``alpha += log u~``, ``beta += log v~``, ``u~ = v~ = 1``, and ``K~`` is rebuilt.

    Parameters
    ----------
    Xc : array-like, shape (n, d)
        Source points, centred (``||x||^2 + ||y||^2 - 2 x.y`` then loses no precision).
    Yc : array-like, shape (m, d)
        Target points, same centre.
    a, b : array-like, shape (n,), (m,)
        Non-negative weights of equal total mass; zeros allowed (``log_u = -inf`` there).
    reg : float
        Entropic regularisation, ``K = exp(-C / reg)``; any value > 0.
    tol : float, default=1e-9
        Stop when ``||v * K^T u - b||_2 < tol`` (POT's criterion; with ``dtype=float32`` not
        below about ``1e-7 ||b||_2``).
    max_iter : int, default=1000
    check_every : int, default=10
        Iterations between checks (``1 + k check_every`` are checked, as in POT).
    dtype : {numpy.float64, numpy.float32}, default=numpy.float64
        Storage and product precision of ``K~``; scalings and potentials are always float64.
    max_dense_bytes : int, default=1 GiB
        ``K~`` is stored when ``n m itemsize`` fits; otherwise every iteration recomputes it
        in row blocks of about 16 MB, one pass per iteration (``u`` and ``K~^T u`` fused).
    threshold : float, optional
        ``tau`` (natural-log units): 100 for float64, 20 for float32 (see Notes).
    log_u0, log_v0 : ndarray, optional
        Warm start (``f / reg``, ``g / reg`` of a nearby problem). With both, ``K~`` starts
        from ``(alpha, beta) = (log_u0, log_v0)``; with ``log_u0`` only, or neither
        (``log_u0 = -log n``, POT's start), the first iteration is done exactly in the log
        domain (two log-sum-exp passes) and absorbed.
    parallel : bool, default=True
        Split streamed passes over the shared thread pool (deterministic partial sums).
    anderson : int, default=0
        Anderson memory on ``log v`` (:class:`~sketchot.solver.acceleration.AndersonMixer`);
        ``0``: POT's iterates exactly.

    Returns
    -------
    SinkhornPath
        ``info``: ``absorptions`` (``K~`` rebuilds), ``resets`` (exact log-domain
        iterations after a breakdown), ``stored`` (whether ``K~`` was stored), ``threshold``.

    Notes
    -----
    Cost: a stored ``K~`` takes ``n m`` entries and each iteration two BLAS matrix-vector
    products, ``O(n m)``, like :func:`dense_sinkhorn`; each absorption ``O(n m d)`` plus one
    ``exp`` per entry. Streamed: ``O(n m d)`` and one ``exp`` per entry per iteration, in
    ``O(16 MB)`` memory. A log-sum-exp iteration pays two ``exp`` per entry every iteration.

    Threshold: right after an absorption the rows of ``K~`` sum to ``a`` (it is the current
    plan), so ``K~ <= 1`` and nothing overflows while ``u~, v~ <= e^tau``. Entries of ``K~``
    clamped at the floor ``t`` (``~1e-308``, float32 ``~1e-38``) add at most ``m t e^tau`` to
    a row sum of at least ``a_i e^-tau``: relative ``m t e^(2 tau) / a_i``, about ``e^-507 m / a_i``
    (float64, ``tau = 100``) and ``e^-46 m / a_i`` (float32, ``tau = 20``). Larger ``tau`` means
    fewer rebuilds; these keep the clamp far below rounding. An absorption (distances and
    one ``exp`` per entry) costs several products; rebuilding at every iteration would cost
    as much as a log-domain solve.

    References
    ----------
    B. Schmitzer, SIAM J. Sci. Comput. 41(3), 2019, Sec. 3 (stabilisation by absorption).
    """
    Xc, Yc = _check_points(Xc, Yc)
    a, b, reg, tol, max_iter, check_every = _check_common(a, b, reg, tol, max_iter, check_every)
    n, m = Xc.shape[0], Yc.shape[0]
    if a.size != n or b.size != m:
        raise ValueError(
            f"a must have len(Xc) = {n} entries and b len(Yc) = {m}; got {a.size} and {b.size}"
        )
    dtype = _check_dtype(dtype)
    max_dense_bytes = check_int(max_dense_bytes, "max_dense_bytes", minimum=0)
    tau = (
        ABSORB_THRESHOLD[dtype]
        if threshold is None
        else check_float(threshold, "threshold", positive=True)
    )
    active_a, active_b = a > 0, b > 0
    with np.errstate(divide="ignore"):
        log_a, log_b = np.log(a), np.log(b)

    stored = n * m * dtype.itemsize <= max_dense_bytes
    kernel = _AbsorbedKernel(Xc, Yc, reg, dtype, block_rows(m, 8, STREAM_BLOCK_BYTES))
    history: History = []
    start = 1
    # Largest cost over reg, bounded from the norms in O(n + m).
    spread = (math.sqrt(sq_norms(Xc).max()) + math.sqrt(sq_norms(Yc).max())) ** 2 / reg
    if log_u0 is not None and log_v0 is not None:
        kernel.alpha = _check_log_start(log_u0, active_a, "log_u0")
        kernel.beta = _check_log_start(log_v0, active_b, "log_v0")
    elif log_u0 is None and spread + tau + math.log(max(n, m)) < -LOG_FLOOR[dtype]:
        # POT's start needs no exact first iteration when no kernel entry can underflow:
        # K~ = diag(1/n) K, so the first plain iteration is POT's (saves 2 n m exponentials).
        kernel.alpha = np.where(active_a, -math.log(n), -np.inf)
        kernel.beta = np.where(active_b, 0.0, -np.inf)
    else:
        log_u = (
            np.where(active_a, -math.log(n), -np.inf)
            if log_u0 is None
            else _check_log_start(log_u0, active_a, "log_u0")
        )
        kernel.alpha, kernel.beta = _exact_iteration(kernel, log_u, log_a, log_b)
        start = 2  # iteration 1 was the exact one
    u = active_a.astype(np.float64)
    v = active_b.astype(np.float64)

    if stored:
        matrix = np.empty((n, m), dtype)
        ops: Any = _StoredOps(matrix, a)
    else:
        matrix = None
        ops = _StreamedOps(kernel, a, parallel)

    def rebuild() -> None:
        if matrix is not None:
            for rows in kernel.slices:
                matrix[rows] = kernel.block(rows)

    rebuild()
    loop = _Loop(ops, a, b, tol, check_every)
    mixer = AndersonMixer(anderson, active_b) if anderson else None
    bound = math.exp(tau)
    absorptions = resets = 0
    n_iter = start - 1
    while True:
        status, n_iter, u, v = loop.run(u, v, start, max_iter, history, bound, mixer, kernel.beta)
        if status == "bound":
            with np.errstate(divide="ignore"):
                kernel.alpha = kernel.alpha + np.log(u)
                kernel.beta = kernel.beta + np.log(v)
            absorptions += 1
        elif status == "breakdown" and resets < MAX_RESETS and n_iter < max_iter:
            # A product vanished or overflowed (far from the absorbed state): one exact
            # log-domain iteration from the last finite iterate puts the scalings back at 1.
            with np.errstate(divide="ignore"):
                log_u = kernel.alpha + np.log(u)
            kernel.alpha, kernel.beta = _exact_iteration(kernel, log_u, log_a, log_b)
            n_iter += 1
            resets += 1
            if mixer is not None:
                mixer.reset()
        else:
            break
        u = active_a.astype(np.float64)
        v = active_b.astype(np.float64)
        rebuild()
        start = n_iter + 1

    with np.errstate(divide="ignore"):
        log_u = np.where(active_a, kernel.alpha + np.log(u), -np.inf)
        log_v = np.where(active_b, kernel.beta + np.log(v), -np.inf)
    info = {
        "absorptions": absorptions,
        "resets": resets,
        "breakdown": status == "breakdown",
        "stored": stored,
        "threshold": tau,
        "dtype": dtype.name,
        "anderson_restarts": 0 if mixer is None else mixer.restarts,
    }
    return SinkhornPath(log_u, log_v, n_iter, status == "converged", history, info)


def _check_log_start(values: Any, active: np.ndarray, name: str) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64)
    if values.shape != active.shape:
        raise ValueError(f"{name} must have shape {active.shape}; got {values.shape}")
    if not np.all(np.isfinite(values[active])):
        raise ValueError(f"{name} must be finite where the weight is positive")
    return np.where(active, values, -np.inf)


def _exact_iteration(kernel: _AbsorbedKernel, log_u, log_a, log_b):
    """One Sinkhorn iteration in the log domain (log-sum-exp, finite for any ``reg``):
    ``log v = log b - LSE_i(log u_i - C_ij / reg)``, ``log u = log a - LSE_j(...)``."""
    with np.errstate(invalid="ignore"):
        log_v = np.where(
            np.isfinite(log_b),
            log_b - gibbs_log_matvec(kernel.Yc, kernel.Xc, kernel.reg, log_u),
            -np.inf,
        )
        log_u = np.where(
            np.isfinite(log_a),
            log_a - gibbs_log_matvec(kernel.Xc, kernel.Yc, kernel.reg, log_v),
            -np.inf,
        )
    return log_u, log_v


# ------------------------------------------------------------------- epsilon-scaling
#: ``stage_solve(reg, f, g, tol, max_iter) -> (f, g, n_iter, converged, history)``: one
#: Sinkhorn solve at ``reg`` warm-started from potentials ``f``, ``g`` (``None``: cold start),
#: potentials in cost units (``f = reg log u``), history as in :class:`SinkhornPath`.
StageSolver = Callable[
    [float, "np.ndarray | None", "np.ndarray | None", float, int],
    tuple[np.ndarray, np.ndarray, int, bool, History],
]


class AnnealResult(NamedTuple):
    """Result of :func:`anneal`.

    Attributes
    ----------
    f, g : ndarray
        Potentials at the target ``reg`` (cost units: ``f = reg log u``).
    n_iter : int
        Iterations over all stages.
    converged : bool
        Whether the last stage (at the target ``reg`` and ``tol``) converged.
    history : list of (int, float)
        Every stage's checks, iterations counted from the first stage.
    stages : list of dict
        ``reg``, ``tol``, ``n_iter``, ``converged`` and ``error`` (last check) per stage.
    """

    f: np.ndarray
    g: np.ndarray
    n_iter: int
    converged: bool
    history: History
    stages: list[dict[str, Any]]


def epsilon_schedule(reg: float, spread: float, factor: float = 0.5) -> list[float]:
    """Geometric regularisations from ``spread`` down to ``reg``.

    ``reg_k = spread q^k``, ``k = 0 .. K``, with ``K = ceil(log(spread / reg) / log(1 /
    factor))`` and ``q = (reg / spread)^(1/K) >= factor``, so the steps are no larger than
    ``factor`` and the last value is exactly ``reg``. ``[reg]`` when ``spread <= reg``.

    Parameters
    ----------
    reg : float
        Target regularisation (> 0).
    spread : float
        Starting regularisation, typically the squared diameter ``max C_ij`` of the data
        (at ``reg ~ max C`` a Sinkhorn solve needs a few iterations).
    factor : float, default=0.5
        Largest ratio between consecutive values, in (0, 1).
    """
    reg = check_float(reg, "reg", positive=True)
    spread = check_float(spread, "spread", positive=True)
    factor = check_float(factor, "factor", positive=True)
    if factor >= 1:
        raise ValueError(f"factor must be in (0, 1); got {factor}")
    if spread <= reg:
        return [reg]
    count = math.ceil(math.log(spread / reg) / math.log(1.0 / factor) - 1e-12)
    return [reg * (spread / reg) ** ((count - k) / count) for k in range(count)] + [reg]


def anneal(
    stage_solve: StageSolver,
    reg: float,
    reg_start: float,
    factor: float = 0.5,
    *,
    tol: float = 1e-9,
    max_iter: int = 1000,
    stage_tol: float | None = None,
    f0: np.ndarray | None = None,
    g0: np.ndarray | None = None,
) -> AnnealResult:
    """Epsilon-scaling: solve at ``reg_start``, ..., ``reg`` (:func:`epsilon_schedule`),
    each stage warm-started from the previous potentials.

    Potentials ``f = reg log u`` (cost units) change little when ``reg`` shrinks, while the
    scalings ``u = exp(f / reg)`` do not: carrying ``f, g`` lets each stage start close to
    its solution, and the many iterations Sinkhorn needs at small ``reg`` (about
    ``O(max C / reg)`` per decade of error) are only spent on the last stages.

    Parameters
    ----------
    stage_solve : callable
        ``stage_solve(reg, f, g, tol, max_iter) -> (f, g, n_iter, converged, history)``
        (:data:`StageSolver`); any kernel can provide one.
    reg : float
        Target regularisation.
    reg_start : float
        First stage's regularisation (e.g. the squared diameter of the data).
    factor : float, default=0.5
        Largest ratio between consecutive stages.
    tol : float, default=1e-9
        Tolerance of the last stage.
    max_iter : int, default=1000
        Iterations over all stages together; each stage gets what is left.
    stage_tol : float, optional
        Tolerance of the intermediate stages (default ``tol``); a looser one (e.g.
        ``1e-4 ||b||_2``) saves iterations that the next stage would undo anyway.
    f0, g0 : ndarray, optional
        Potentials to start the first stage from.

    Returns
    -------
    AnnealResult
    """
    if not callable(stage_solve):
        raise TypeError(f"stage_solve must be callable; got {describe(stage_solve)}")
    tol = check_float(tol, "tol", positive=True)
    stage_tol = tol if stage_tol is None else max(tol, check_float(stage_tol, "stage_tol"))
    max_iter = check_int(max_iter, "max_iter", minimum=1)
    schedule = epsilon_schedule(reg, reg_start, factor)
    f, g = f0, g0
    total = 0
    history: History = []
    stages: list[dict[str, Any]] = []
    converged = False
    for k, current in enumerate(schedule):
        last = k == len(schedule) - 1
        if total >= max_iter:
            break
        target = tol if last else stage_tol
        f, g, n_iter, converged, stage_history = stage_solve(
            current, f, g, target, max_iter - total
        )
        history.extend((total + it, err) for it, err in stage_history)
        total += n_iter
        stages.append(
            {
                "reg": current,
                "tol": target,
                "n_iter": n_iter,
                "converged": bool(converged),
                "error": stage_history[-1][1] if stage_history else None,
            }
        )
        if not last:
            converged = False
    if f is None or g is None:
        raise RuntimeError("anneal ran no stage: max_iter was exhausted before the first")
    return AnnealResult(f, g, total, bool(converged), history, stages)


# ------------------------------------------------------------------------- entry point
def exact_sinkhorn(
    Xc: Any,
    Yc: Any,
    a: Any,
    b: Any,
    reg: float,
    *,
    epsilon_scaling: bool = False,
    factor: float = 0.5,
    reg_start: float | None = None,
    stage_tol: float | None = None,
    **options: Any,
) -> SinkhornPath:
    """The exact kernel's solve: :func:`stabilized_sinkhorn`, optionally inside :func:`anneal`.

    Parameters
    ----------
    Xc, Yc, a, b, reg, **options
        As in :func:`stabilized_sinkhorn` (``tol``, ``max_iter``, ``check_every``, ``dtype``,
        ``max_dense_bytes``, ``threshold``, ``anderson``; ``log_u0``/``log_v0`` only
        without epsilon-scaling).
    epsilon_scaling : bool, default=False
        Solve a sequence of problems with ``reg`` decreasing geometrically from
        ``reg_start`` (default: the squared diameter ``max C_ij``, bounded by
        ``(max ||x|| + max ||y||)^2`` in ``O(n + m)``) to ``reg``.
    factor : float, default=0.5
        Largest ratio between consecutive stages.
    stage_tol : float, optional
        Intermediate stages' tolerance; default ``max(tol, 1e-2 ||b||_2)``.

    Returns
    -------
    SinkhornPath
        Without epsilon-scaling, as :func:`stabilized_sinkhorn`. With it, ``n_iter`` counts
        every stage, ``history`` runs over all stages, and ``info['stages']`` lists them.
    """
    if not epsilon_scaling:
        return stabilized_sinkhorn(Xc, Yc, a, b, reg, **options)
    Xc, Yc = _check_points(Xc, Yc)
    a, b, reg, tol, max_iter, check_every = _check_common(
        a, b, reg, options.pop("tol", 1e-9), options.pop("max_iter", 1000),
        options.pop("check_every", 10),
    )  # fmt: skip
    if reg_start is None:
        reg_start = float((np.sqrt(sq_norms(Xc).max()) + np.sqrt(sq_norms(Yc).max())) ** 2)
    if stage_tol is None:
        stage_tol = max(tol, STAGE_RTOL * float(np.linalg.norm(b)))
    info_total = {"absorptions": 0, "resets": 0}

    def stage(current, f, g, stage_target, budget):
        # Potentials carry over in cost units; the stage's scalings are exp(f / current).
        log_u0 = None if f is None else f / current
        log_v0 = None if g is None else g / current
        # The check is free (it reuses K^T u), so intermediate stages check every iteration
        # instead of overshooting their loose tolerance by up to check_every - 1 iterations.
        every = check_every if current == reg else 1
        result = stabilized_sinkhorn(
            Xc, Yc, a, b, current, tol=stage_target, max_iter=budget, log_u0=log_u0,
            log_v0=log_v0, check_every=every, **options,
        )  # fmt: skip
        for key in info_total:
            info_total[key] += result.info[key]
        info_total["stored"] = result.info["stored"]
        f, g = current * result.log_u, current * result.log_v
        return f, g, result.n_iter, result.converged, result.history

    result = anneal(stage, reg, reg_start, factor, tol=tol, max_iter=max_iter, stage_tol=stage_tol)
    info = {**info_total, "stages": result.stages, "reg_start": reg_start}
    return SinkhornPath(
        result.f / reg, result.g / reg, result.n_iter, result.converged, result.history, info
    )


# Default intermediate-stage tolerance of exact_sinkhorn, relative to ||b||_2. Measured on
# n = 1000 colours at reg 0.003 (factor 0.5): 1063 iterations in all with 1e-2, 1081 with 1e-3,
# 1125 with 1e-1, 1251 without epsilon-scaling; the last stage dominates whatever the choice.
STAGE_RTOL = 1e-2
