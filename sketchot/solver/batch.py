"""Many small balanced problems solved together: the one engine on a stacked kernel.

``B`` pairs of clouds ``(X_k, Y_k)`` of ``n`` and ``m`` points: their exact kernels are
stacked into one block-diagonal operator
(:class:`~sketchot.kernels.stacked.StackedExactKernel`, a ``(B, n, m)`` array), on which the
engine (:func:`~sketchot.solver.engine.iterate`) runs its absorption-stabilised iteration:
block-diagonal Sinkhorn IS the ``B`` independent iterations, each half-step one batched pass
over every pair. There is no second Sinkhorn loop.

Per-pair convergence. The stacked kernel declares ``'block_diagonal'``: the engine's test
is the largest pair's residual, each relative to its own mass, so a run ends when every pair
of the stack has converged; Anderson mixing (on by default: ``anderson='auto'`` is
:data:`~sketchot.solver.options.DEFAULT_ANDERSON_MEMORY` per pair) gives each pair its own
coefficients and restarts (:class:`~sketchot.solver.acceleration.BlockAndersonMixer`), so
each pair runs the iterates it would run alone, whatever the other pairs. The engine runs in
rounds of at most ``round_iter`` iterations; after each, every pair's own residual
``||v_k * K_k^T u_k - b_k|| / M_k`` is measured (one linear pass on the last absorbed
kernel), converged pairs leave the stack and the rest continue, warm started from their
potentials.

Coarse stages (an epsilon schedule over the stacked pairs). At small ``reg`` a cold start
drifts far (each pair's potentials span its largest cost over ``reg``): many iterations,
and many absorptions (one per ``e^tau`` of drift). A pair whose largest cost over ``reg``
(its spread) is at least ``COARSE_STEP x COARSE_MIN_SPREAD`` first runs coarse stages at
``reg x COARSE_STEP^k``, ``k = K, ..., 1`` (:func:`coarse_factors`, from its own spread),
each :data:`COARSE_ITER` iterations of the engine on the stack of the pairs at that stage
(each pair's kernel at its own factor), its potentials carried in cost units from stage to
stage and into the rounds at ``reg``. The stages are a start, never an answer: every pair is
then solved and checked at ``reg`` as below. The count is fixed (no tolerance), so a pair's
coarse iterates do not depend on the other pairs of its stack, and the stages fit half of
``max_iter``. On benchmarks/batch.py's 2-D pairs at ``reg = 0.01 x`` the mean squared
distance they cut the mean iterations from 54.1 to 44.2 (the default and "without coarse
stages" rows of benchmarks/results/batch_quick.md, in the same run).

Chunks. The pairs are solved in chunks of at most :data:`CACHE_ENTRIES` kernel entries, in
the order of their spreads (:func:`by_spread`): a chunk's stacks stay in the cache across its
iterations, where a pass costs a fraction of one streamed from memory; a chunk's stacks
(``-C / reg``, the absorbed kernel and one temporary: 24 bytes per entry) also fit
``max_bytes``. Chunks are independent problems: :func:`sketchot.get_num_threads` worker
threads solve them at once (as many as ``max_bytes`` holds; BLAS releases the interpreter
lock in the passes, and one thread's passes overlap the other's bookkeeping); the chunking
does not depend on the number of threads, so neither do the results. Within a chunk, the
engine re-absorbs only the pairs whose scalings left its range
(:meth:`~sketchot.kernels.stacked.StackedExactKernel.absorbed` with ``blocks``).

Precision. At ``tol >= FLOAT32_MIN_TOL`` (the default accuracy's 1e-4 included) the absorbed
kernels are stored in float32 (:class:`~sketchot.kernels.stacked.StackedExactKernel`'s
``dtype``): a pass reads half the bytes. The float32 residual only nominates the pairs that
may leave: each of them is checked in float64 on its exact kernel (``P = exp(log u + log v -
C / reg)``, summed in float64) and leaves only if that check meets ``tol``; a pair that misses
it stays for the next round. Every pair's reported marginals, errors and values are those
float64 sums. The choice depends on ``tol`` alone (never on time, load or threads).

The start is POT's, except for the pairs where it would underflow
(:func:`_start`); each pair's marginals and values are summed from the last absorbed kernel
(float64) or from its exact kernel (float32) when it leaves (:class:`_PlanSums`).
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._arrays import in_user_arrays
from .._defaults import DEFAULT_MAX_DENSE_BYTES
from .._memory import USABLE_FRACTION, available_bytes
from .._parallel import Part, get_num_threads, run_parts
from .._validation import check_float, check_int, describe, refuse_masked, unknown_names
from ..kernels.stacked import GROUP_ENTRIES, StackedExactKernel, stacked_log_kernel
from .engine import ABSORB_THRESHOLD, choose_strategy, iterate
from .matrix import sinkhorn_matrix
from .options import SolverOptions
from .problem import MASS_RTOL, make_problem

#: Bytes per kernel entry of a chunk: ``-C / reg``, its absorbed form and one temporary.
BYTES_PER_ENTRY = 24

#: Kernel entries of a chunk at most: its stacks stay in the cache across iterations, where a
#: pass costs a fraction of one streamed from memory (a float32 chunk is not made larger: on
#: a shared cache, half the bytes measured faster than twice the pairs).
CACHE_ENTRIES = 1 << 20

#: The passes run on float32 absorbed kernels when ``tol`` is at least this (module notes):
#: ten times the float32 passes' own error in the residual (about ``sqrt(n)`` float32
#: roundings of each column sum, relative), so that the float64 check of a pair that the
#: float32 residual lets go meets ``tol`` (tests/solver/test_batch.py measures both).
FLOAT32_MIN_TOL = 1e-5

#: Iterations between two checks of the engine: a check costs a fraction of a pass over a
#: stack of kernels, and checking every iteration stops each run as soon as it has converged.
CHECK_EVERY = 1

#: Iterations of the engine between two per-pair checks (converged pairs then leave): a round
#: runs every pair of its stack until the slowest has converged, a new round costs an
#: absorption and the Anderson history (the round_iter=100 rows of
#: benchmarks/results/batch_quick.md).
ROUND_ITER = 40

#: The coarse stages of a pair (:func:`coarse_factors`): each ``COARSE_STEP`` times the next
#: one's ``reg``, down to ``reg``, while a stage's largest cost over its ``reg`` is at least
#: ``COARSE_MIN_SPREAD``; each runs ``COARSE_ITER`` iterations (a start, not an answer: a
#: fixed count, so that a pair's iterates do not depend on the other pairs of its stack).
COARSE_STEP = 4.0
COARSE_MIN_SPREAD = 100.0
COARSE_ITER = 10

#: A pair solved alone (:func:`_solve_alone`) is given this fraction of the batch's target:
#: the single-problem solver stops on its residual before its last rows update, and the plan
#: it returns, whose column error the batch measures, can be above it (1.6x measured on 5 x 10
#: points at reg 3e-3).
ALONE_MARGIN = 0.1


@dataclass
class BatchResult:
    """Output of :func:`sinkhorn_batch`: one entry per pair, in arrays.

    Attributes
    ----------
    potentials : tuple of ndarray
        ``(log u, log v)`` of shapes ``(B, n)`` and ``(B, m)`` (``P_k = diag(u_k) K_k
        diag(v_k)``; ``-inf`` at zero weights), as :class:`~sketchot.SinkhornResult`'s.
    marginals : tuple of ndarray
        Row and column sums of each plan, ``(B, n)`` and ``(B, m)``.
    value_linear : ndarray, shape (B,)
        ``<P_k, M_k>``.
    value : ndarray, shape (B,)
        ``<P_k, M_k> + reg KL(P_k | a_k b_k^T)`` (:class:`~sketchot.SinkhornResult`'s
        ``value``).
    n_iter : ndarray of int, shape (B,)
        Iterations each pair received.
    errors : ndarray, shape (B,)
        Each pair's last residual in the stopping norm, relative to its mass.
    converged : ndarray of bool, shape (B,)
        ``errors <= tol``.
    a, b : ndarray
        The weights used, ``(B, n)`` and ``(B, m)``.
    reg, tol : float
    norm : str
        ``'l1'`` or ``'l2'`` (:meth:`~sketchot.SolverOptions.stopping`).
    accuracy : float or None
        The accuracy target the checks are judged against.
    timings : dict
        ``build`` (the stacked kernels, seconds summed over the chunks) and ``total`` (wall
        seconds of the call).
    notes : list of str
    sizes : ndarray of int, shape (B, 2), or None
        Clouds of different sizes (ragged batches): each pair's ``(n_k, m_k)``; every array
        above is padded to the largest sizes, with zero weights, zero marginals and ``-inf``
        log-scalings past them (``potentials[0][k, :n_k]`` is pair ``k``'s). ``None`` when
        every cloud has the same size.
    """

    potentials: tuple[np.ndarray, np.ndarray]
    marginals: tuple[np.ndarray, np.ndarray]
    value_linear: np.ndarray
    value: np.ndarray
    n_iter: np.ndarray
    errors: np.ndarray
    converged: np.ndarray
    a: np.ndarray
    b: np.ndarray
    reg: float
    tol: float
    norm: str
    accuracy: float | None
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    sizes: np.ndarray | None = None

    def __len__(self) -> int:
        return self.value.shape[0]

    @property
    def marginal_errors(self) -> np.ndarray:
        """L1 errors ``(||P_k 1 - a_k||_1, ||P_k^T 1 - b_k||_1)`` per pair, shape (B, 2)."""
        return np.stack(
            [
                np.abs(self.marginals[0] - self.a).sum(axis=1),
                np.abs(self.marginals[1] - self.b).sum(axis=1),
            ],
            axis=1,
        )

    @property
    def true_kernel_error(self) -> np.ndarray:
        """The accuracy contract's measure, per pair: the larger L1 marginal error relative
        to the pair's mass. The kernels are exact, so the plans' own marginals are the
        true-kernel check (exhaustive, no sampling)."""
        return self.marginal_errors.max(axis=1) / self.a.sum(axis=1)

    @property
    def accuracy_met(self) -> np.ndarray | None:
        """``true_kernel_error <= accuracy`` per pair (``None`` when ``accuracy=None``)."""
        return None if self.accuracy is None else self.true_kernel_error <= self.accuracy

    @property
    def status(self) -> list[str]:
        """``'converged'`` or ``'max_iter reached'`` per pair."""
        return ["converged" if c else "max_iter reached" for c in self.converged]

    def __repr__(self) -> str:
        return (
            f"BatchResult(pairs={len(self)}, shape={self.a.shape[1]}x{self.b.shape[1]}, "
            f"reg={self.reg:g}, converged={int(self.converged.sum())}/{len(self)}, "
            f"max error={self.errors.max():.2e}, iterations {int(self.n_iter.min())}-"
            f"{int(self.n_iter.max())})"
        )


@in_user_arrays("X", "Y", "a", "b", refuse_gradients=True)
def sinkhorn_batch(
    X: Any,
    Y: Any,
    a: Any = None,
    b: Any = None,
    reg: float = 1.0,
    *,
    max_bytes: int = DEFAULT_MAX_DENSE_BYTES,
    round_iter: int = ROUND_ITER,
    **kwargs: Any,
) -> BatchResult:
    """Balanced entropic transport between ``B`` pairs of small clouds, solved together
    (module notes).

    Each pair solves :func:`sketchot.sinkhorn`'s problem ``min_P <P, M_k> + reg KL(P | a_k
    b_k^T)`` with ``M_k = ||x_ki - y_kj||^2`` and its exact kernel.

    Parameters
    ----------
    X : array-like, shape (B, n, d), or sequence of B arrays of shapes (n_k, d)
        Source clouds; a sequence of clouds of different sizes (a ragged batch) is padded
        to the largest with points of zero weight (``BatchResult.sizes``).
    Y : array-like, shape (B, m, d), or sequence of B arrays of shapes (m_k, d)
        Target clouds (ragged as ``X``).
    a : array-like of shape (B, n), optional
        Source weights per pair (default uniform ``1 / n``, ``1 / n_k`` in a ragged batch,
        where ``a`` may also be a sequence of ``B`` arrays of lengths ``n_k``).
    b : array-like of shape (B, m), optional
        Target weights per pair, each of the same mass as its ``a_k``.
    reg : float, default=1.0
        Entropic regularisation, shared by every pair.
    max_bytes : int, default=1 GiB
        Memory of one chunk of stacked kernels (24 bytes per entry; also at most half the
        available memory).
    round_iter : int, default=40
        Engine iterations between per-pair checks (module notes).
    **kwargs
        Solver options (:class:`~sketchot.SolverOptions`): ``max_iter`` (per pair), ``tol``,
        ``accuracy``, ``check_every`` (default :data:`CHECK_EVERY` here), ``log_domain``,
        ``anderson`` (per pair: module notes; ``0`` runs the plain iteration), ``verbose``.

    Returns
    -------
    BatchResult

    Notes
    -----
    ``O(B n m)`` time per iteration and ``24 B' n m`` bytes for a chunk of ``B'`` pairs
    (ragged batches: ``n`` and ``m`` the largest sizes, so sizes that differ much are best
    batched by size).

    Examples
    --------
    >>> import numpy as np, sketchot
    >>> rng = np.random.default_rng(0)
    >>> X, Y = rng.random((50, 30, 2)), rng.random((50, 40, 2)) + 0.5
    >>> res = sketchot.sinkhorn_batch(X, Y, reg=0.1)
    >>> res.value.shape, bool(res.converged.all()), bool(res.accuracy_met.all())
    ((50,), True, True)
    """
    return solve_batch(
        X, Y, a, b, reg, caller="sinkhorn_batch", names=("X", "Y", "a", "b"),
        max_bytes=max_bytes, round_iter=round_iter, **kwargs,
    )  # fmt: skip


def solve_batch(
    X: Any,
    Y: Any,
    a: Any,
    b: Any,
    reg: Any,
    *,
    caller: str,
    names: tuple[str, str, str, str],
    max_bytes: int = DEFAULT_MAX_DENSE_BYTES,
    round_iter: int = ROUND_ITER,
    **kwargs: Any,
) -> BatchResult:
    """:func:`sinkhorn_batch` on host arrays, its errors in the terms of the public function
    ``caller`` whose arguments ``names`` (``X``, ``Y``, ``a``, ``b`` in that order) the
    clouds and weights were."""
    start = time.perf_counter()
    check_batch_keywords(caller, kwargs)
    options, _ = SolverOptions.split({"check_every": CHECK_EVERY, **kwargs})
    max_bytes = check_int(max_bytes, "max_bytes", minimum=1)
    round_iter = check_int(round_iter, "round_iter", minimum=1)
    X, Y, a, b, reg, notes, sizes = check_batch(X, Y, a, b, reg, names)
    tol, norm = options.stopping()
    B, n, m = X.shape[0], X.shape[1], Y.shape[1]
    dtype = pass_dtype(tol, options.log_domain)
    chunk = chunk_size(B, n, m, max_bytes)
    out = _Outputs(B, n, m)
    order = by_spread(X, Y, chunk)
    firsts = list(range(0, B, chunk))
    # a chunk's memory, one per worker, reused from chunk to chunk
    memories: queue.SimpleQueue = queue.SimpleQueue()
    lock, tally = threading.Lock(), [0, 0]  # pairs solved and converged, for the progress

    def solve(part: Part) -> float:
        build = 0.0
        for first in part:
            pairs = order[first : first + chunk]
            try:
                memory = memories.get_nowait()
            except queue.Empty:
                memory = _ChunkMemory(chunk * n * m, dtype)
            begin = time.perf_counter()
            log_kernel = stacked_log_kernel(
                X[pairs], Y[pairs], reg, out=memory.stack("log_kernel", (pairs.size, n, m))
            )
            build += time.perf_counter() - begin
            _solve_chunk(log_kernel, a[pairs], b[pairs], reg, options, tol, norm, round_iter,
                         out, pairs, memory, part, dtype)  # fmt: skip
            memories.put(memory)
            if options.verbose:
                with lock:
                    tally[0] += pairs.size
                    tally[1] += int(out.converged[pairs].sum())
                    elapsed = time.perf_counter() - start
                    left = elapsed * (B - tally[0]) / tally[0]
                    print(f"sketchot.sinkhorn_batch: pairs {tally[0]}/{B}, {tally[1]} converged, "
                          f"{elapsed:.1f} s, about {left:.1f} s left")  # fmt: skip
        return build

    # chunks in flight at once: each holds its stacks (the grouping does not depend on it)
    fits = int(min(max_bytes, USABLE_FRACTION * available_bytes()) // (
        BYTES_PER_ENTRY * chunk * n * m))  # fmt: skip
    threads = max(1, min(get_num_threads(), fits))
    build = sum(run_parts(solve, firsts, parallel=len(firsts) > 1, group=1, threads=threads))
    _solve_alone(X, Y, a, b, reg, options, tol, norm, out)
    total = time.perf_counter() - start
    return BatchResult(
        potentials=(out.log_u, out.log_v), marginals=(out.row, out.col),
        value_linear=out.value_linear, value=out.value, n_iter=out.n_iter, errors=out.errors,
        converged=out.errors <= tol, a=a, b=b, reg=reg, tol=tol, norm=norm,
        accuracy=options.accuracy, timings={"build": build, "total": total},
        notes=notes, sizes=sizes,
    )  # fmt: skip


class _ChunkMemory:
    """A worker's memory for a chunk (:data:`BYTES_PER_ENTRY` per entry), reused from chunk to
    chunk: the chunk's ``-C / reg`` (``'log_kernel'``), one float64 stack derived from it
    (``'derived'``: a coarse stage's, or the pairs still running), and the absorbed kernels
    (``absorbed``, in the passes' ``dtype``). Fresh arrays of a chunk's size cost more in
    page faults than the passes that fill them."""

    def __init__(self, entries: int, dtype: np.dtype) -> None:
        self._float64 = {"log_kernel": np.empty(entries), "derived": np.empty(entries)}
        self.absorbed = np.empty(entries, dtype=dtype)

    def stack(self, name: str, shape: tuple[int, int, int]) -> np.ndarray:
        """The float64 memory ``name`` as an array of ``shape`` (at most the chunk's entries)."""
        return self._float64[name][: shape[0] * shape[1] * shape[2]].reshape(shape)


def _derived(
    log_kernel: np.ndarray, index: np.ndarray, memory: Any, divisor: np.ndarray | None = None
) -> np.ndarray:
    """``log_kernel[index] / divisor[:, None, None]`` (``divisor``: one per picked pair,
    default none) in ``memory``'s derived stack (a new array without one)."""
    if memory is None:
        picked = log_kernel[index]
        return picked if divisor is None else np.divide(picked, divisor[:, None, None], out=picked)
    out = memory.stack("derived", (index.size, *log_kernel.shape[1:]))
    every = index.size == log_kernel.shape[0] and (index == np.arange(index.size)).all()
    if divisor is not None and every:  # every pair in order: one pass, no gather
        return np.divide(log_kernel, divisor[:, None, None], out=out)
    np.take(log_kernel, index, axis=0, out=out)
    return out if divisor is None else np.divide(out, divisor[:, None, None], out=out)


class _Outputs:
    """Per-pair arrays filled chunk by chunk."""

    def __init__(self, B: int, n: int, m: int) -> None:
        self.log_u, self.log_v = np.zeros((B, n)), np.zeros((B, m))
        self.row, self.col = np.zeros((B, n)), np.zeros((B, m))
        self.value_linear, self.value = np.zeros(B), np.zeros(B)
        self.errors = np.full(B, np.inf)
        self.n_iter = np.zeros(B, dtype=int)
        self.converged = np.zeros(B, dtype=bool)
        # pairs that left their stack on a breakdown or a stall, above tol: solved alone
        self.alone = np.zeros(B, dtype=bool)


def pass_dtype(tol: float, log_domain: Any) -> np.dtype:
    """The precision of the passes: float32 at ``tol >= FLOAT32_MIN_TOL`` with absorption
    (``log_domain`` not ``False``), float64 otherwise (module notes). Depends on nothing
    else."""
    if tol >= FLOAT32_MIN_TOL and log_domain is not False:
        return np.dtype(np.float32)
    return np.dtype(np.float64)


def chunk_size(B: int, n: int, m: int, max_bytes: int) -> int:
    """Pairs per chunk: their stacks fit ``max_bytes`` and half the available memory."""
    per_pair = BYTES_PER_ENTRY * n * m
    budget = min(max_bytes, USABLE_FRACTION * available_bytes())
    if per_pair > budget:
        raise MemoryError(
            f"one pair's stacked kernels need {per_pair / 2**20:.1f} MiB ({n} x {m} entries, "
            f"{BYTES_PER_ENTRY} bytes each), above the budget of {budget / 2**20:.1f} MiB "
            "(max_bytes, and half the available memory): raise max_bytes, or solve such "
            "pairs one by one with sketchot.sinkhorn (low-rank backends)"
        )
    return int(max(1, min(B, budget // per_pair, CACHE_ENTRIES // (n * m))))


def by_spread(X: np.ndarray, Y: np.ndarray, chunk: int) -> np.ndarray:
    """The order in which the pairs are chunked: by the squared diagonal of the bounding box
    of ``X_k`` and ``Y_k`` (``O(B (n + m) d)``), when there is more than one chunk. A round
    runs every pair of its stack until the slowest converges, and Sinkhorn's iterations grow
    with the largest cost over ``reg``: pairs of similar spreads in one chunk waste fewer
    iterations. Each pair's result does not depend on its neighbours (per-pair stopping and
    mixing), only its iteration count does."""
    if chunk >= X.shape[0]:
        return np.arange(X.shape[0])
    high = np.maximum(X.max(axis=1), Y.max(axis=1))
    low = np.minimum(X.min(axis=1), Y.min(axis=1))
    return np.argsort(((high - low) ** 2).sum(axis=1), kind="stable")


def _solve_chunk(
    log_kernel, a, b, reg, options, tol, norm, round_iter, out, pairs, memory=None, part=None,
    dtype=np.float64,
) -> None:  # fmt: skip
    """The coarse stages (:func:`coarse_factors`, :func:`_coarse_start`), then rounds of the
    engine on the stack of the pairs not converged yet (module notes); each pair's results
    are summarised when it leaves. ``memory``: a :class:`_ChunkMemory` reused from chunk to
    chunk (``None``: fresh arrays). ``part``: the worker's :class:`~sketchot._parallel.Part`,
    whose cancel flag is checked at every check of the engine and between rounds (a chunk
    runs for up to ``max_iter`` iterations: Ctrl-C must not wait for it). ``dtype``: the
    absorbed kernels' (:func:`pass_dtype`)."""
    watch = None if part is None else _CancelCheck(part)
    buffer = None if memory is None else memory.absorbed
    count = log_kernel.shape[0]
    spreads = -log_kernel.min(axis=(1, 2))  # each pair's largest cost over reg
    n_iter, errors = np.zeros(count, dtype=int), np.full(count, np.inf)
    masses = a.sum(axis=1)
    every = CHECK_EVERY if options.check_every == "auto" else options.check_every
    anderson = options.anderson_memory(True)
    log_u, log_v = _start(log_kernel, a, b, spreads)
    if options.log_domain is not False:
        _coarse_start(log_kernel, a, b, spreads, log_u, log_v, n_iter, norm,
                      options.max_iter, anderson, watch, memory, dtype)  # fmt: skip
    active = np.arange(count)
    while active.size and n_iter[active].max() < options.max_iter:
        if part is not None:
            part.check()
        whole = active.size == count
        stack = log_kernel if whole else _derived(log_kernel, active, memory)
        kernel = StackedExactKernel(
            stack, reg, max_cost=reg * float(spreads[active].max()), buffer=buffer, dtype=dtype
        )
        starts = {"log_u0": log_u[active].ravel(), "log_v0": log_v[active].ravel()}
        problem = make_problem(a[active].ravel(), b[active].ravel(), kernel.shape, reg, **starts)
        state = iterate(
            kernel, problem, tol=tol, norm=norm, check_every=every,
            max_iter=min(round_iter, options.max_iter - int(n_iter[active].max())),
            strategy=choose_strategy(kernel, options.log_domain), anderson=anderson,
            progress=watch,
        )  # fmt: skip
        _keep_finite(log_u, log_v, active, state, a, b)
        n_iter[active] += state.n_iter
        sums = _PlanSums(kernel, log_u[active], log_v[active], reg)
        errors[active] = _errors(sums.col, b[active], norm) / masses[active]
        # a breakdown (Anderson's extrapolations leave the passes' range on a few points at
        # small reg) or a stall ends the round for every pair of the stack; those above tol
        # are then solved alone (_solve_alone) instead of being left unconverged
        early = state.status in ("stalled", "breakdown")
        last = early or n_iter[active].max() >= options.max_iter
        leaving = np.ones(active.size, dtype=bool) if last else errors[active] <= tol
        if sums.exact is not None:  # float32 passes: the float64 check decides
            checked = sums.exact(leaving, stack)
            errors[active[leaving]] = _errors(checked, b[active][leaving], norm) / masses[
                active[leaving]]  # fmt: skip
            if not last:
                leaving &= errors[active] <= tol
        sums.store(leaving, stack, a[active], b[active], out, pairs[active])
        if early:
            stuck = leaving & ~(errors[active] <= tol) & (n_iter[active] < options.max_iter)
            out.alone[pairs[active[stuck]]] = True
        active = active[~leaving]
    out.n_iter[pairs], out.errors[pairs] = n_iter, errors
    out.converged[pairs] = errors <= tol


def _solve_alone(X, Y, a, b, reg, options, tol, norm, out) -> None:
    """Solve the pairs ``out.alone`` (they left their stack on a breakdown or a stall above
    ``tol``) one by one with the single-problem solver (its epsilon schedule and resets),
    from a cold start, with the iterations they have left; a pair takes the lone solve's
    potentials when their marginal error (measured as the batch measures it, in float64)
    is smaller than its own. In the calling thread, after the workers: a lone solve may use
    the thread pool itself."""
    for k in np.flatnonzero(out.alone):
        left = options.max_iter - int(out.n_iter[k])
        if left < 1:
            continue
        log_kernel = stacked_log_kernel(X[k : k + 1], Y[k : k + 1], reg)
        single_options = dataclasses.replace(options, max_iter=left, check_every="auto",
                                             **_tighter(options))  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the batch says whether the pair converged
            single = sinkhorn_matrix(a[k], b[k], -reg * log_kernel[0], reg, options=single_options)
        out.n_iter[k] += single.n_iter
        log_u, log_v = (np.asarray(side, dtype=np.float64)[None] for side in single.potentials)
        if (
            not (np.isfinite(log_u) | (a[k] <= 0)).all()
            or not (np.isfinite(log_v) | (b[k] <= 0)).all()
        ):
            continue
        sums = _PlanSums(StackedExactKernel(log_kernel, reg), log_u, log_v, reg)
        error = float(_errors(sums.col, b[k : k + 1], norm)[0] / a[k].sum())
        if error < out.errors[k]:
            sums.store(np.ones(1, dtype=bool), log_kernel, a[k : k + 1], b[k : k + 1], out,
                       np.array([k]))  # fmt: skip
            out.errors[k], out.converged[k] = error, error <= tol


def _tighter(options: SolverOptions) -> dict[str, float]:
    """The stopping target of a lone solve (:func:`_solve_alone`): :data:`ALONE_MARGIN` times
    the batch's, in the same rule (``accuracy``'s L1 rule or POT's ``tol``)."""
    if options.tol is None and options.accuracy is not None:
        return {"accuracy": ALONE_MARGIN * options.accuracy}
    return {"tol": ALONE_MARGIN * options.stopping()[0]}


def _keep_finite(log_u, log_v, active, state, a, b) -> None:
    """Store a round's potentials of the pairs ``active`` in ``log_u``, ``log_v`` (in place),
    except where a pair's came back non-finite on a positive weight (a breakdown's last
    iterate): that pair keeps the potentials it started the round from."""
    new_u = state.log_u.reshape(active.size, -1)
    new_v = state.log_v.reshape(active.size, -1)
    finite = (np.isfinite(new_u) | (a[active] <= 0)).all(axis=1) & (
        np.isfinite(new_v) | (b[active] <= 0)
    ).all(axis=1)
    log_u[active[finite]] = new_u[finite]
    log_v[active[finite]] = new_v[finite]


def coarse_factors(spread: float) -> list[float]:
    """The coarse stages of a pair whose largest cost over ``reg`` is ``spread`` (module
    notes): the factors ``COARSE_STEP^k``, ``k = K, ..., 1`` (largest first) of every stage
    whose own spread ``spread / COARSE_STEP^k`` is at least :data:`COARSE_MIN_SPREAD`; none
    below (there the cold start converges as fast as a coarse one). Depends on ``spread``
    alone."""
    factors: list[float] = []
    factor = COARSE_STEP
    while spread / factor >= COARSE_MIN_SPREAD:
        factors.insert(0, factor)
        factor *= COARSE_STEP
    return factors


def _coarse_start(
    log_kernel, a, b, spreads, log_u, log_v, n_iter, norm, max_iter, anderson, watch,
    memory, dtype,
) -> None:  # fmt: skip
    """Replace the starts ``log_u``, ``log_v`` (:func:`_start`) of the pairs that have coarse
    stages (:func:`coarse_factors` of their own spreads) by the potentials their stages
    reach, and add the stages' iterations to ``n_iter`` (in place). The stages end together:
    stage ``j`` of ``S`` runs the pairs with at least ``S - j`` factors, each at its own
    factor (kernels ``log_kernel_k / factor_k``: the balanced iteration reads ``reg`` through
    its kernel alone), :data:`COARSE_ITER` iterations from the pair's previous stage in cost
    units (``f = reg log u``), or from :func:`_start` at its first. The stages fit half of
    ``max_iter``; each pair's factors depend on its spread alone, and the fixed count (with
    per-pair mixing) keeps a pair's iterates its own whatever the other pairs. A stage is
    checked only at its second and last iterations: at ``tol = 0`` a check never stops it,
    and the engine tests every iterate for a breakdown anyway."""
    plans = [coarse_factors(float(spread)) for spread in spreads]
    stages = min(max(len(plan) for plan in plans), max_iter // (2 * COARSE_ITER))
    current = np.ones(log_kernel.shape[0])  # each pair's factor so far (1: not started)
    for j in range(stages):
        # pair k's factor at stage j: the (stages - j)-th smallest of its own, if any
        factor = np.array([plan[j - stages] if len(plan) >= stages - j else 0.0
                           for plan in plans])  # fmt: skip
        index = np.flatnonzero(factor > 0)
        factor = factor[index]
        stack = _derived(log_kernel, index, memory, divisor=factor)
        carried = current[index] / factor
        log_u[index] *= carried[:, None]
        log_v[index] *= carried[:, None]
        fresh = current[index] == 1.0
        if fresh.any():
            new = index[fresh]
            log_u[new], log_v[new] = _start(
                stack if fresh.all() else stack[fresh], a[new], b[new], spreads[new] / factor[fresh]
            )
        kernel = StackedExactKernel(
            stack, 1.0, max_cost=float((spreads[index] / factor).max()),
            buffer=None if memory is None else memory.absorbed, dtype=dtype,
        )  # fmt: skip
        starts = {"log_u0": log_u[index].ravel(), "log_v0": log_v[index].ravel()}
        problem = make_problem(a[index].ravel(), b[index].ravel(), kernel.shape, 1.0, **starts)
        state = iterate(
            kernel, problem, tol=0.0, norm=norm, check_every=COARSE_ITER, max_iter=COARSE_ITER,
            strategy="absorb", anderson=anderson, progress=watch,
        )  # fmt: skip
        log_u[index] = state.log_u.reshape(index.size, -1)
        log_v[index] = state.log_v.reshape(index.size, -1)
        n_iter[index] += state.n_iter
        current[index] = factor
    log_u *= current[:, None]
    log_v *= current[:, None]


def _errors(col: np.ndarray, b: np.ndarray, norm: str) -> np.ndarray:
    """Each pair's column residual ``||col_k - b_k||`` in the stopping norm (zero-weight
    columns ignored)."""
    diff = np.where(b > 0, col, 0.0) - b
    return np.linalg.norm(diff, ord=1 if norm == "l1" else 2, axis=1)


class _CancelCheck:
    """The engine's ``progress``, used to check a worker's cancel flag at every check (every
    iteration by default, :data:`CHECK_EVERY`; at most ``round_iter`` iterations apart)."""

    def __init__(self, part: Part) -> None:
        self.part = part

    def update(self, iteration: int, error: float | None = None, target: float | None = None):
        self.part.check()

    def log(self, text: str) -> None:
        """Nothing to show (the batch prints its own progress lines)."""


def _start(log_kernel, a, b, spreads) -> tuple[np.ndarray, np.ndarray]:
    """Starting ``(log u, log v)``: POT's ``(1 / n, 1 / m)``, except for the pairs where
    it would underflow the absorbed kernel (the engine's test, pair by pair), which start
    from the c-transforms ``log u_i = log a_i - max_j (-C_ij / reg)``, ``log v_j = log b_j -
    max_i (log u_i - C_ij / reg)`` (the ``reg -> 0`` limit of one log-domain iteration, with
    no exponential): every row and column of their absorbed kernels then has an entry of
    the order of its weight. The test is float64's whatever the passes' precision: a
    float32 absorbed kernel floors the entries that POT's start underflows (the engine
    re-absorbs their rows), which took fewer iterations than the c-transforms (53 against
    56 on the benchmark's 3-D pairs at reg 0.01 x the mean squared distance)."""
    n, m = log_kernel.shape[1:]
    log_u = np.where(a > 0, -np.log(n), -np.inf)
    log_v = np.where(b > 0, -np.log(m), -np.inf)
    tiny = -np.log(np.finfo(np.float64).tiny)
    tau = ABSORB_THRESHOLD[np.dtype(np.float64)]
    low = np.flatnonzero(spreads + tau + np.log(max(n, m)) >= tiny - 1.0)
    step = max(1, GROUP_ENTRIES // (n * m))  # a group's copy stays in the cache
    with np.errstate(divide="ignore"):
        for g in range(0, low.size, step):
            pick = low[g : g + step]
            terms = log_kernel[pick]
            log_u[pick] = np.log(a[pick]) - terms.max(axis=2)
            terms += log_u[pick][:, :, None]
            log_v[pick] = np.log(b[pick]) - terms.max(axis=1)
    return log_u, log_v


class _PlanSums:
    """The column sums of the plans of a round's stack, then (:meth:`store`) the rows sums,
    ``<P, M>`` and the value of the pairs that leave it. From the last absorbed kernel (the
    true kernel scaled entry by entry: ``P = diag(u~) K~ diag(v~)``, linear passes and no
    exponential) when the engine absorbed in float64, in the log domain when it did not.
    A float32 absorbed kernel's column sums only nominate the pairs that may leave:
    :attr:`exact` (``None`` otherwise) sums their plans in float64 from their exact kernels
    (:func:`_exact_sums`), and :meth:`store` stores those sums."""

    def __init__(self, kernel: StackedExactKernel, log_u, log_v, reg: float) -> None:
        self.op, self.reg = kernel.latest, reg
        self.log_u, self.log_v = log_u, log_v
        self.exact = None
        if self.op is None:
            self.col = np.exp(log_v + kernel.project("rows", log_u.ravel(), log=True).reshape(
                log_v.shape))  # fmt: skip
            return
        with np.errstate(invalid="ignore", over="ignore"):
            self.u = np.nan_to_num(np.exp(log_u - kernel.stack(self.op.alpha, "rows")))
            self.v = np.nan_to_num(np.exp(log_v - kernel.stack(self.op.beta, "cols")))
        K = self.op.linear()
        if K.dtype == np.float64:
            self.col = self.v * np.matmul(self.u[:, None, :], K)[:, 0, :]
            return
        # float32: the absorbed scalings are within e^tau, the products in range
        sums = np.matmul(self.u.astype(K.dtype)[:, None, :], K)[:, 0, :]
        self.col = self.v * sums.astype(np.float64)
        self.exact = self._exact
        self.checked = np.zeros(log_u.shape[0], dtype=bool)
        self.row = np.zeros_like(log_u)
        self.linear = np.zeros(log_u.shape[0])

    def _exact(self, pairs: np.ndarray, log_kernel: np.ndarray) -> np.ndarray:
        """The float64 column sums of the plans of ``pairs`` (a mask over the stack), which
        replace the float32 ones; their row sums and ``<P, M>`` are kept for :meth:`store`."""
        index = np.flatnonzero(pairs)
        row, col, linear = _exact_sums(
            log_kernel, index, self.log_u[index], self.log_v[index], self.reg
        )
        self.col[index], self.row[index], self.linear[index] = col, row, linear
        self.checked[index] = True
        return col

    def store(self, leaving, log_kernel, a, b, out, index) -> None:
        """Fill ``out`` at ``index[leaving]`` for the pairs ``leaving`` (a mask)."""
        if not leaving.any():
            return
        every = leaving.all()
        pick = slice(None) if every else leaving
        log_u, log_v, col = self.log_u[pick], self.log_v[pick], self.col[pick]
        if self.exact is not None:
            if not self.checked[leaving].all():
                raise RuntimeError("a pair left a float32 stack without its float64 check")
            row, linear = self.row[pick], self.linear[pick]
        elif self.op is None:
            L = log_kernel if every else log_kernel[leaving]
            P = np.exp(L + log_u[:, :, None] + log_v[:, None, :])
            row = P.sum(axis=2)
            P *= L
            linear = -self.reg * P.sum(axis=(1, 2))
        else:
            L = log_kernel if every else log_kernel[leaving]
            K = self.op.linear() if every else self.op.linear()[leaving]
            u, v = self.u[pick], self.v[pick]
            row = u * np.matmul(K, v[:, :, None])[:, :, 0]
            # P * (-C / reg) = u~ (K~ * L) v~; in place when K~ is not used again
            weighted = np.multiply(K, L, out=K if every else None)
            linear = -self.reg * np.einsum(
                "bn,bn->b", u, np.matmul(weighted, v[:, :, None])[:, :, 0]
            )
        a, b = a[pick], b[pick]
        with np.errstate(divide="ignore", invalid="ignore"):
            entropic = np.where(a > 0, row * (log_u - np.log(a)), 0.0).sum(axis=1)
            entropic += np.where(b > 0, col * (log_v - np.log(b)), 0.0).sum(axis=1)
        value = self.reg * (entropic - row.sum(axis=1) + a.sum(axis=1) * b.sum(axis=1))
        k = index[leaving]
        out.row[k], out.col[k], out.value_linear[k], out.value[k] = row, col, linear, value
        out.log_u[k], out.log_v[k] = log_u, log_v


def _exact_sums(log_kernel, index, log_u, log_v, reg):
    """``(row sums, column sums, <P, M>)`` of the plans ``P_k = exp(log u_k + log v_k +
    log_kernel_k)`` of the pairs ``index`` of the stack, in float64, in groups of pairs (one
    temporary per group, :data:`~sketchot.kernels.stacked.GROUP_ENTRIES` entries)."""
    n, m = log_kernel.shape[1:]
    row, col, linear = np.empty((index.size, n)), np.empty((index.size, m)), np.empty(index.size)
    step = max(1, GROUP_ENTRIES // (n * m))
    with np.errstate(over="ignore", invalid="ignore"):
        for g in range(0, index.size, step):
            part = slice(g, g + step)
            L = log_kernel[index[part]]
            P = L + log_u[part][:, :, None]
            P += log_v[part][:, None, :]
            np.exp(P, out=P)
            row[part], col[part] = P.sum(axis=2), P.sum(axis=1)
            linear[part] = -reg * np.einsum("bij,bij->b", P, L)
    return row, col, linear


#: Arguments of sketchot's other solves that the batches do not take, and why.
NOT_IN_BATCHES = {
    "metric": "the batches solve the squared Euclidean cost only; solve other costs pair by "
    "pair with sketchot.sinkhorn",
    "p": "the batches solve the squared Euclidean cost only",
    "reg_m": "the batches solve balanced transport only; solve unbalanced pairs one by one "
    "with sketchot.sinkhorn_unbalanced",
    "unbalanced": "the batches solve balanced transport only",
    "backend": "the batches solve on exact kernels (the pairs are small)",
    "rank": "the batches solve on exact kernels (no rank)",
    "dtype": "the batches choose their passes' precision from tol (float32 from 1e-5, "
    "every result checked in float64)",
    "rng": "the batches draw nothing (exact kernels, deterministic)",
    "warmstart": "the batches start cold",
    "potentials_init": "the batches start cold",
}

#: The batches' own keywords besides the solver options.
BATCH_KEYWORDS = ("max_bytes", "round_iter")


def check_batch_keywords(caller: str, kwargs: dict[str, Any]) -> None:
    """Refuse keywords that are neither solver options nor :data:`BATCH_KEYWORDS`, in the
    terms of the public function ``caller`` that received them: an argument of the other
    solves with the reason the batches do not take it, any other with a did-you-mean.
    ``metric='sqeuclidean'``, the batches' own cost, is accepted (removed from ``kwargs``)."""
    accepted = (*SolverOptions.names(), *BATCH_KEYWORDS)
    if kwargs.get("metric") == "sqeuclidean":  # the batches' own cost, named (POT's way)
        del kwargs["metric"]
    unknown = sorted(set(kwargs) - set(accepted))
    if not unknown:
        return
    elsewhere = [name for name in unknown if name in NOT_IN_BATCHES]
    if elsewhere:
        name = elsewhere[0]
        raise TypeError(
            f"{caller}() does not take {name} (got {name}={describe(kwargs[name])}): "
            f"{NOT_IN_BATCHES[name]}"
        )
    raise TypeError(
        f"{caller}() got unexpected keyword argument(s) {unknown_names(unknown, accepted)}; "
        f"it takes the solver options {', '.join(SolverOptions.names())}, max_bytes and "
        "round_iter"
    )


def check_batch(
    X: Any,
    Y: Any,
    a: Any,
    b: Any,
    reg: Any,
    names: tuple[str, str, str, str] = ("X", "Y", "a", "b"),
):
    """``(X, Y, a, b, reg, notes, sizes)`` validated: float64 stacks of one batch size and
    dimension, weights per pair of equal masses (``b_k`` rescaled to ``a_k``'s within
    :data:`~sketchot.solver.problem.MASS_RTOL`). Sequences of clouds of different sizes are
    padded (:func:`stack_clouds`); ``sizes`` is then the ``(B, 2)`` array of each pair's
    ``(n_k, m_k)``, else ``None``. Errors call them ``names``."""
    nx, ny, na, nb = names
    X, sizes_x = stack_clouds(X, nx, na)
    Y, sizes_y = stack_clouds(Y, ny, nb)
    if Y.shape[0] != X.shape[0] or Y.shape[2] != X.shape[2]:
        raise ValueError(
            f"{nx} and {ny} must hold the same number of pairs B and dimension d, (B, n, d) "
            f"and (B, m, d); got {nx} of shape {_stack_shape(X, sizes_x)} and {ny} of shape "
            f"{_stack_shape(Y, sizes_y)}"
        )
    reg = check_float(reg, "reg", positive=True)
    a = stack_weights(a, na, X.shape[:2], nx, sizes_x)
    b = stack_weights(b, nb, Y.shape[:2], ny, sizes_y)
    sizes = None
    if sizes_x is not None or sizes_y is not None:
        sizes = np.stack(
            [
                np.full(X.shape[0], X.shape[1]) if sizes_x is None else sizes_x,
                np.full(Y.shape[0], Y.shape[1]) if sizes_y is None else sizes_y,
            ],
            axis=1,
        )
    notes = []
    mass_a, mass_b = a.sum(axis=1), b.sum(axis=1)
    off = ~np.isclose(mass_a, mass_b, rtol=MASS_RTOL, atol=0.0)
    if off.any():
        k = int(np.flatnonzero(off)[0])
        raise ValueError(
            f"{na} and {nb} must have the same mass pair by pair (balanced transport); pair "
            f"{k} has sum({na}[{k}]) = {mass_a[k]:.8g} and sum({nb}[{k}]) = {mass_b[k]:.8g} "
            f"({int(off.sum())} such pairs)"
        )
    if np.any(mass_a != mass_b):
        b = b * (mass_a / mass_b)[:, None]
        notes.append(f"{nb} was rescaled pair by pair to the mass of {na}")
    if sizes is not None:
        notes.append(
            f"clouds of different sizes padded to {X.shape[1]} x {Y.shape[1]} points of zero "
            "weight (BatchResult.sizes)"
        )
    return X, Y, a, b, reg, notes, sizes


def check_clouds(value: Any, name: str, weights: str = "a") -> np.ndarray:
    """``value`` as a float64 ``(B, n, d)`` stack of finite clouds (errors name ``name``;
    ``weights`` is the argument that weighs its points, for the remedies)."""
    refuse_masked(
        value,
        name,
        f"give the masked points zero weight in {weights} and fill them ({name}.filled(0))",
    )
    try:
        array = np.asarray(value)
    except ValueError:  # NumPy's "inhomogeneous shape": clouds of different sizes
        array = None
    if array is None or (array.dtype == object and _ragged(value)):
        raise ValueError(
            f"{name} must be a stack of clouds of one shape (B, n, d); got {_shapes(value)}. "
            "Pad the smaller clouds to the largest size with points of zero weight "
            f"({weights}), or solve pairs of different sizes one by one with sketchot.sinkhorn"
        )
    if array.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be a real array of shape (B, n, d); got {describe(value)}")
    if array.ndim != 3 or 0 in array.shape:
        raise ValueError(
            f"{name} must be a non-empty stack of clouds of shape (B, n, d) (at least one "
            f"cloud of at least one point); got shape {array.shape}"
        )
    array = np.ascontiguousarray(array, dtype=np.float64)
    if not np.all(np.isfinite(array)):
        bad = int(array.size - np.count_nonzero(np.isfinite(array)))
        raise ValueError(f"{name} must contain only finite values; got {bad} NaN or inf entries")
    return array


def stack_clouds(value: Any, name: str, weights: str = "a") -> tuple[np.ndarray, Any]:
    """``(stack, sizes)``: a ``(B, n, d)`` stack as :func:`check_clouds` validates it with
    ``sizes = None``, or a sequence of ``B`` clouds of different sizes ``n_k`` (each a finite
    real ``(n_k, d)`` array, one ``d``) padded to ``n = max n_k`` points with copies of
    each cloud's first point (a bounded cost; they get zero weight, so they carry no mass)
    and their sizes, shape ``(B,)``. ``O(B n d)`` memory."""
    if not (isinstance(value, (list, tuple)) and _ragged(value)):
        return check_clouds(value, name, weights), None
    clouds = []
    for k, item in enumerate(value):
        try:
            cloud = np.asarray(item)
        except ValueError:
            cloud = np.asarray(None)
        if cloud.dtype.kind not in "biuf" or cloud.ndim != 2 or 0 in cloud.shape:
            raise ValueError(
                f"{name}[{k}] must be a non-empty real cloud of shape (n_k, d) (the clouds of "
                f"{name} have different sizes); got {describe(item)}"
            )
        cloud = cloud.astype(np.float64)
        if not np.all(np.isfinite(cloud)):
            raise ValueError(f"{name}[{k}] must contain only finite values; got NaN or inf")
        if clouds and cloud.shape[1] != clouds[0].shape[1]:
            raise ValueError(
                f"{name}[{k}] must have {clouds[0].shape[1]} columns (the dimension of "
                f"{name}[0]); got shape {cloud.shape}"
            )
        clouds.append(cloud)
    sizes = np.array([len(cloud) for cloud in clouds])
    stack = np.empty((len(clouds), int(sizes.max()), clouds[0].shape[1]))
    for k, cloud in enumerate(clouds):
        stack[k, : len(cloud)] = cloud
        stack[k, len(cloud) :] = cloud[0]
    return stack, sizes


def stack_weights(
    value: Any, name: str, shape: tuple[int, int], points: str, sizes: Any = None
) -> np.ndarray:
    """Weights of the stack of shape ``shape`` (:func:`check_stacked_weights`); with the
    ``sizes`` of padded clouds (:func:`stack_clouds`): ``None`` gives ``1 / n_k`` on each
    cloud's points, a sequence of ``B`` arrays of lengths ``n_k`` is padded with zeros, a
    ``(B, n)`` array must be zero on the padding."""
    if sizes is None:
        return check_stacked_weights(value, name, shape, points)
    inside = np.arange(shape[1])[None, :] < sizes[:, None]
    if value is None:
        return np.where(inside, 1.0 / sizes[:, None], 0.0)
    if isinstance(value, (list, tuple)) and len(value) == shape[0]:
        lengths = [np.shape(item) for item in value]
        if any(len(length) != 1 for length in lengths):
            raise ValueError(
                f"{name} must be a sequence of 1-D weights, one per cloud of {points}; got "
                f"shapes {lengths[:6]}"
            )
        wrong = [k for k, length in enumerate(lengths) if length[0] != sizes[k]]
        if wrong:
            k = wrong[0]
            raise ValueError(
                f"{name}[{k}] must have one weight per point of {points}[{k}] ({sizes[k]}); got "
                f"{lengths[k][0]}"
            )
        padded = np.zeros(shape)
        for k, item in enumerate(value):
            padded[k, : sizes[k]] = np.asarray(item, dtype=np.float64)
        value = padded
    array = check_stacked_weights(value, name, shape, points)
    if np.any(array[~inside] != 0):
        k = int(np.flatnonzero((array * ~inside).any(axis=1))[0])
        raise ValueError(
            f"{name} must be zero past each cloud's size (the padding of {points}); row {k} "
            f"has weight past {points}[{k}]'s {sizes[k]} points"
        )
    return array


def _stack_shape(stack: np.ndarray, sizes: Any) -> str:
    """A stack's shape for an error message (the sizes of padded clouds)."""
    if sizes is None:
        return str(stack.shape)
    return f"{len(sizes)} clouds of {sizes.min()}-{sizes.max()} points in {stack.shape[2]}-D"


def _ragged(value: Any) -> bool:
    """Whether ``value`` is a sequence of arrays of different shapes."""
    try:
        return len({np.shape(item) for item in value}) > 1
    except (TypeError, ValueError):
        return False


def _shapes(value: Any) -> str:
    """The shapes of the clouds of a ragged stack, for an error message."""
    try:
        shapes = [np.shape(item) for item in value]
    except (TypeError, ValueError):
        return describe(value)
    listed = ", ".join(str(shape) for shape in shapes[:6]) + (", ..." if len(shapes) > 6 else "")
    return f"{len(shapes)} clouds of shapes {listed}"


def check_stacked_weights(value: Any, name: str, shape: tuple[int, int], points: str) -> np.ndarray:
    """Weights of shape ``(B, n)`` (default uniform), finite, non-negative, each row of
    positive mass (errors name ``name`` and the clouds ``points``)."""
    if value is None:
        return np.full(shape, 1.0 / shape[1])
    refuse_masked(value, name, f"pass zero weights where it is masked ({name}.filled(0))")
    try:
        array = np.asarray(value)
    except ValueError:
        array = np.asarray(None)
    if array.dtype.kind not in "biuf":
        raise TypeError(
            f"{name} must be real weights of shape {shape} (one row per cloud of {points}); "
            f"got {describe(value)}"
        )
    if array.shape != shape:
        raise ValueError(
            f"{name} must be weights of shape {shape} (one row per cloud of {points}); got "
            f"shape {array.shape}"
        )
    array = array.astype(np.float64)
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must contain only finite weights; got NaN or inf")
    if np.any(array < 0):
        raise ValueError(f"{name} must be non-negative; got minimum {array.min():.3g}")
    if np.any(array.sum(axis=1) <= 0):
        k = int(np.flatnonzero(array.sum(axis=1) <= 0)[0])
        raise ValueError(f"{name} must have a positive mass in every row; row {k} has none")
    return array
