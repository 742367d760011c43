"""``'auto'``: the one strategy that chooses a kernel and its parameters, reading the
policy table (:mod:`.table`) and the backends' records, and measuring the rest.

Every ``'auto'`` of sketchot runs :func:`choose`: ``make_kernel(..., backend='auto')``,
``sinkhorn(..., backend='auto')`` (:mod:`.solve` passes a judge that solves), and both on
Dask (:mod:`sketchot.distributed.builders`, limited to the backends that run there);
:func:`adaptive_rank` (``rank='auto'``) is its low-rank rung for one backend. The ladder,
cheapest first, over the backends with a rule in the table (the dimension within the
rule's bounds), is :func:`sketchot.policy.describe.ladder` (the docs print it from there):

0. a backend of the ``'grids'`` support (the exact kernel applied axis by axis) when both
   clouds are tensor-product grids, in ``d >= 2`` or beyond the direct dense size;
1. the ``'exact'`` kind stored, when ``n x m`` is small (:data:`DIRECT_DENSE_ENTRIES`) and
   fits the dense budget;
2. the ``'low_rank'`` kinds at doubling ranks (:func:`low_rank_ladder`), the one with the
   smallest sampled kernel error judged at each rank, while doubling can reach the target
   (:func:`worth_doubling`);
3. the ``'local'`` kinds, when one of their iterations (the rule's ``iteration_cost``) is
   predicted cheaper than one of the exact kernel (:func:`exact_iteration_seconds`);
4. the ``'exact'`` kind, stored when ``n x m`` fits the dense budget, streamed (the rule's
   ``streamed_params``) otherwise.

A candidate is judged by the caller: the sampled kernel error for a kernel
(:func:`kernel_judge`), the true-kernel check of the solve for a solve. The outcome carries
what was chosen, why (``reason``), every rung tried (``attempts``) and the backend and
parameters that build the chosen kernel again (``replay``).

Reproducible: every comparison of costs reads the cost model (:mod:`sketchot.kernels.cost`:
counted work times committed constants) and declared facts (the problem's sizes, the machine's total
memory, whether the fused device passes are installed), never a clock, the load or the
number of threads, and every draw comes from ``rng``; each candidate is built and judged with
the caller's ``rng`` as given (a seed: each candidate draws afresh from it, as an explicit
``backend=`` call would), so ``replay`` rebuilds the chosen kernel bit for bit.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .._defaults import DEFAULT_ACCURACY
from .._memory import dense_budget_bytes
from .._validation import check_rng
from ..cost_matrix import block_dim
from ..gibbs import GibbsGeometry
from ..grid import grid_clouds
from ..kernels import KernelOperator
from ..kernels.cost import exact_iteration_cost
from ..kernels.device import device_exact_iteration_cost, runs_on_device
from ..kernels.judge import (
    Attempt,
    Choice,
    Judge,
    Verdict,
    candidate_rng,
    kernel_error,
    kernel_judge,
    replay_parameters,
)
from ..kernels.registry import (
    EXACT_KIND,
    GRIDS_SUPPORT,
    LOCAL_KIND,
    LOW_RANK_KIND,
    Backend,
    build_backend,
)
from .table import auto_backends

#: The first rank of the low-rank rungs (doubled at each rung).
FIRST_RANK = 64


#: A low-rank rung whose error falls by less than this factor when the rank doubles is
#: considered stalled: the kernel is beyond low rank at this reg (the error of a global
#: approximation is absolute, and Sinkhorn's scalings amplify it on the small entries).
STALL_FACTOR = 2.0

#: Above this many points on a side, a low-rank rung is first built on a sample of
#: :data:`SAMPLE_POINTS` points of each cloud, and at full size only when the sample's error
#: is not hopeless: the sampled error is a maximum over sampled rows, about the same on a
#: sample of the same clouds, and a rung rejected at full size costs the full build (ranks 64
#: and 128 of Nystrom: 3.9 and 7.5 s at 10^6 uniform points per side, reg 0.01).
SAMPLE_ABOVE = 100_000
SAMPLE_POINTS = 20_000

#: Up to this many kernel entries (5000 x 5000) the exact kernel is stored and used directly:
#: its build and iterations then cost about what POT's dense solver costs.
DIRECT_DENSE_ENTRIES = 25_000_000

#: On the caller's device (e.g. CUDA tensors), the exact kernel is used directly when this
#: many of its iterations are predicted to take at most ``DIRECT_EXACT_SECONDS`` there
#: (:func:`~.device.device_exact_iteration_cost`: the declared rates of the device's passes):
#: on a GPU its fused passes take milliseconds where fitting a low-rank kernel on the host
#: takes seconds.
DIRECT_EXACT_ITERATIONS = 100
DIRECT_EXACT_SECONDS = 2.0

#: A low-rank kernel whose sampled error exceeds the target by more than this factor is not
#: judged (not solved): its scalings could not meet the target.
HOPELESS_FACTOR = 10.0


def max_useful_rank(n: int, m: int) -> int:
    """Largest rank whose iteration (``~4 (n + m) r`` flops) is cheaper than an exact one
    (``~2 n m`` for a stored kernel, several times more streamed): ``n m / (n + m)``."""
    return max(1, (n * m) // (n + m))


def low_rank_ladder(n: int, m: int) -> list[int]:
    """Ranks tried by ``'auto'``: 64, 128, ... up to :func:`max_useful_rank`."""
    cap = min(max_useful_rank(n, m), n + m)
    ranks = []
    rank = min(FIRST_RANK, cap)
    while rank <= cap:
        ranks.append(rank)
        rank *= 2
    return ranks


def worth_doubling(previous: float, error: float, target: float, rank: int, cap: int) -> bool:
    """Whether doubling the rank can reach ``target`` before ``cap``, at the rate of the last
    doubling (``previous`` -> ``error``)."""
    gain = previous / error
    if not gain >= STALL_FACTOR:
        return False
    if not np.isfinite(previous):
        return True
    doublings = np.log(error / target) / np.log(gain)
    return rank * 2.0 ** np.ceil(doublings) <= cap


def exact_iteration_seconds(geometry: GibbsGeometry, *, stored: bool) -> float:
    """Predicted seconds of one exact iteration (the cost model, :mod:`.cost`): on the
    caller's device from its declared rates (:func:`~.device.device_exact_iteration_cost`),
    on the host from the counted entries (:func:`~.cost.exact_iteration_cost`). A function of
    the sizes only: no block is timed."""
    n, m = geometry.shape
    if runs_on_device(geometry):
        return device_exact_iteration_cost(geometry)
    return exact_iteration_cost(n, m, block_dim(geometry), stored=stored)


def adaptive_rank(
    geometry: GibbsGeometry,
    backend: str,
    *,
    accuracy: float = DEFAULT_ACCURACY,
    rng: Any = None,
    dtype: Any = np.float64,
    build: Callable[..., KernelOperator] = build_backend,
    measure: Callable[[KernelOperator, Any], float] = kernel_error,
    **params: Any,
) -> KernelOperator:
    """A low-rank backend at the smallest doubling rank (64, 128, ...) whose sampled kernel
    error (:func:`kernel_error`) meets ``accuracy``: the low-rank rung of :func:`choose` for
    one backend. It stops at :func:`max_useful_rank` or when doubling cannot reach the target
    (:func:`worth_doubling`), and returns the last kernel built, with ``info.reason`` saying
    which case it was. The reference is adaptive Nystrom with a doubling trick (Altschuler,
    Bach, Rudi, Niles-Weed 2019), whose rank comes from an effective-dimension bound; here
    it is measured.

    ``build(geometry, backend, rng=, dtype=, rank=, **params)`` and ``measure(kernel, rng)``
    default to the in-memory builder and check (a chunked geometry passes its own).
    """
    generator = check_rng(rng)
    kernel, verdict, _ = _low_rank(
        geometry, [(backend, params)], kernel_judge(accuracy, generator, measure), accuracy,
        generator, dtype, build, measure, hopeless=np.inf, say=None,
        seed=candidate_rng(rng, generator),
    )  # fmt: skip
    if kernel is None:  # not even the first rank fits
        raise MemoryError(f"backend {backend!r}: {verdict.note}")
    if verdict.accepted:
        kernel.info.reason = (
            f"rank {kernel.info.rank}: sampled kernel error {verdict.error:.2g} <= {accuracy:g}"
        )
    else:
        kernel.info.reason = (
            f"rank {kernel.info.rank}: sampled kernel error {verdict.error:.2g} > {accuracy:g}, "
            "and a larger rank would not pay (stalled, or costlier than the exact kernel)"
        )
    return kernel


def _low_rank(
    geometry, candidates, judge, target, generator, dtype, build, measure, *, hopeless, say,
    attempts=None, seed=None,
):  # fmt: skip
    """The low-rank rungs: ``(kernel, verdict, rank)`` of the accepted rung, or of the last
    one built (``verdict.accepted`` False). Each full-size rung is built with ``seed``
    (:func:`candidate_rng`); the samples and the kernel checks draw from ``generator``. A
    rank whose build the memory check refuses (``MemoryError``) ends the ladder as a rung
    that does not pay: ``auto`` goes on to the next kind of kernel; ``kernel`` is ``None``
    when not even the first rank fits."""
    n, m = geometry.shape
    ladder = low_rank_ladder(n, m)
    previous = np.inf
    kernel, verdict = None, Verdict(np.inf, False, "")
    sample = None
    if np.isfinite(hopeless) and max(n, m) > SAMPLE_ABOVE and type(geometry) is GibbsGeometry:
        sample = geometry.sample(SAMPLE_POINTS, generator)
    for rank in ladder:
        start = time.perf_counter()
        if sample is not None and 8 * rank <= SAMPLE_POINTS:
            name, error = _sample_error(sample, candidates, rank, target, generator, dtype,
                                        build, measure)  # fmt: skip
            if name is not None and error > hopeless * target:
                note = f"on {SAMPLE_POINTS} points of each cloud: sampled kernel error too large"
                if kernel is None:
                    verdict = Verdict(error, False, note)
                if attempts is not None:
                    seconds = time.perf_counter() - start
                    attempts.append(Attempt(name, {"rank": rank}, error, seconds, False, note))
                    say(str(attempts[-1]))
                if not worth_doubling(previous, error, hopeless * target, rank, ladder[-1]):
                    break
                previous = error
                continue
        built_best, error, refused = None, np.inf, None
        for name, params in candidates:
            try:
                built = build(
                    geometry, name, rng=generator if seed is None else seed, dtype=dtype,
                    rank=rank, accuracy=target, **params,
                )  # fmt: skip
            except MemoryError as exc:  # the memory left does not hold this rank
                refused = (name, exc)
                continue
            built_error = measure(built, generator)
            if built_best is None or built_error < error:
                built_best, error = built, built_error
        if built_best is None:  # no candidate fits at this rank: nor will a larger one
            name, exc = refused
            note = f"rank {rank} does not fit in memory ({exc})"
            if kernel is None:
                verdict = Verdict(np.inf, False, note)
            if attempts is not None:
                seconds = time.perf_counter() - start
                attempts.append(Attempt(name, {"rank": rank}, np.inf, seconds, False, note))
                say(str(attempts[-1]))
            break
        kernel = built_best
        if error > hopeless * target:
            verdict = Verdict(error, False, "sampled kernel error too large to solve")
            progress, goal = error, hopeless * target
        else:
            verdict = judge(kernel, LOW_RANK_KIND, error)
            progress = max(verdict.error, error) if np.isfinite(verdict.error) else error
            goal = target
        if attempts is not None:
            attempts.append(
                Attempt(kernel.info.backend, {"rank": rank}, verdict.error,
                        time.perf_counter() - start, verdict.accepted, verdict.note)
            )  # fmt: skip
            say(str(attempts[-1]))
        if verdict.accepted:
            return kernel, verdict, rank
        if _float32_rounding_failed(kernel, verdict, error, hopeless * target):
            break
        if not worth_doubling(previous, progress, goal, rank, ladder[-1]):
            break
        previous = progress
    return kernel, verdict, None


def _float32_rounding_failed(
    kernel: KernelOperator, verdict: Verdict, sampled_error: float, reachable: float
) -> bool:
    """Whether a float32 rung ends its backend's climb: its sampled error was within reach
    but its solve went non-positive (infinite error), which in float32 is taken as rounding:
    a signed kernel's float32 products round to ``eps32`` times the factors' sums, and a
    larger rank does not shrink that (at 2 x 10^4 uniform points every Nystrom rank from
    512 to 4096 failed so, 26 s of builds, where float64 accepted rank 512)."""
    return (
        kernel.dtype == np.float32
        and not verdict.accepted
        and np.isinf(verdict.error)
        and sampled_error <= reachable
    )


def _sample_error(sample, candidates, rank, target, generator, dtype, build, measure):
    """``(backend, error)``: the smallest sampled kernel error of the candidates at ``rank``
    built on the ``sample`` geometry (``(None, inf)`` when none fits in memory)."""
    best = (None, np.inf)
    for name, params in candidates:
        try:
            built = build(sample, name, rng=generator, dtype=dtype, rank=rank, accuracy=target,
                          **params)  # fmt: skip
        except MemoryError:
            continue
        error = measure(built, generator)
        if best[0] is None or error < best[1]:
            best = (name, error)
    return best


def choose(
    geometry: GibbsGeometry,
    judge: Judge,
    *,
    accuracy: float = DEFAULT_ACCURACY,
    rng: Any = None,
    dtype: Any = np.float64,
    build: Callable[..., KernelOperator] = build_backend,
    measure: Callable[[KernelOperator, Any], float] = kernel_error,
    store: bool = True,
    among: Any = None,
    verbose: bool = False,
) -> Choice:
    """Run the ladder (module notes) over the records ``'auto'`` may try.

    Parameters
    ----------
    geometry : GibbsGeometry
    judge : callable
        ``judge(kernel, kind, sampled_error) -> Verdict`` (:data:`Judge`;
        :func:`kernel_judge` for a kernel alone).
    accuracy : float
        The target of the judge (sets when a low-rank rung is hopeless).
    build, measure
        The builder and the sampled kernel check (a chunked geometry passes its own).
    store : bool
        Whether the exact kernel may be stored (``False`` on a cluster).
    among : collection of str, optional
        Only these backends (e.g. those that run on Dask).
    verbose : bool
        Print each rung as it is tried.
    """
    n, m = geometry.shape
    d = block_dim(geometry)  # 0 for a cost matrix (no points)
    itemsize = np.dtype(dtype).itemsize
    generator = check_rng(rng)
    seed = candidate_rng(rng, generator)
    attempts: list[Attempt] = []

    def say(text: str) -> None:
        if verbose:
            print(f"sketchot auto: {text}")

    def final(record: Backend, kernel: KernelOperator, reason: str) -> Choice:
        kernel.info.reason = reason  # the solve knows auto chose it
        say(f"chose {record.name}: {reason}")
        outcome = judge(kernel, None, np.nan).outcome
        return Choice(outcome, kernel, reason, tuple(attempts), replay_parameters(kernel))

    exacts = auto_backends(EXACT_KIND, d, among, geometry.cost)
    exact, exact_rule = next(pair for pair in exacts if pair[0].support != GRIDS_SUPPORT)
    size = f"n x m = {n} x {m} ({n * m * itemsize / 2**20:.0f} MiB)"
    on_grids = [pair for pair in exacts if pair[0].support == GRIDS_SUPPORT]
    # a 1-D cloud of distinct points is a grid, and its kernel is no cheaper axis by axis:
    # grids in d >= 2, or 1-D beyond the direct dense size
    if (
        on_grids
        and (d >= 2 or n * m > DIRECT_DENSE_ENTRIES)
        and grid_clouds(getattr(geometry, "X", None), getattr(geometry, "Y", None))
    ):
        record, rule = on_grids[0]
        kernel = build(geometry, record.name, dtype=dtype, accuracy=accuracy, **rule.params)
        return final(record, kernel, f"both clouds are tensor-product grids ({size}): "
                     f"{record.name}, {record.summary}")  # fmt: skip
    dense_fits = store and n * m * itemsize <= dense_budget_bytes()
    if dense_fits and n * m <= DIRECT_DENSE_ENTRIES:
        kernel = build(geometry, exact.name, dtype=dtype, accuracy=accuracy)
        return final(exact, kernel, f"{size} is small: the exact kernel, stored")

    exact_seconds = None
    if runs_on_device(geometry):
        exact_seconds = exact_iteration_seconds(geometry, stored=dense_fits)
        if exact_seconds * DIRECT_EXACT_ITERATIONS <= DIRECT_EXACT_SECONDS:
            streamed = {} if dense_fits else exact_rule.streamed_params
            kernel = build(geometry, exact.name, dtype=dtype, accuracy=accuracy, **streamed)
            reason = (
                f"{DIRECT_EXACT_ITERATIONS} exact iterations are predicted to take "
                f"{exact_seconds * DIRECT_EXACT_ITERATIONS:.2g} s on the caller's device "
                f"(cost model): the exact kernel, {'stored' if dense_fits else 'streamed'}"
            )
            return final(exact, kernel, reason)

    candidates = [
        (record.name, dict(rule.params))
        for record, rule in auto_backends(LOW_RANK_KIND, d, among, geometry.cost)
    ]
    if candidates:
        kernel, verdict, rank = _low_rank(
            geometry, candidates, judge, accuracy, generator, dtype, build, measure,
            hopeless=HOPELESS_FACTOR, say=say, attempts=attempts, seed=seed,
        )  # fmt: skip
        if verdict.accepted:
            reason = (
                f"{size} is above the direct exact size; {kernel.info.backend} at rank {rank} "
                f"meets accuracy={accuracy:g} ({verdict.note} {verdict.error:.2g})"
            )
            say(f"chose {kernel.info.backend}: {reason}")
            return Choice(verdict.outcome, kernel, reason, tuple(attempts),
                          replay_parameters(kernel))  # fmt: skip

    local = auto_backends(LOCAL_KIND, d, among, geometry.cost)
    if exact_seconds is None:
        exact_seconds = exact_iteration_seconds(geometry, stored=dense_fits) if local else np.inf
    for record, rule in local:
        start = time.perf_counter()
        # the target reaches builders that size themselves by it (the block-local kernel's
        # entries: a fiftieth of it)
        kernel = build(
            geometry, record.name, rng=seed, dtype=dtype, accuracy=accuracy,
            **rule.params,
        )  # fmt: skip
        seconds = rule.iteration_cost(kernel) if rule.iteration_cost is not None else 0.0
        if seconds < exact_seconds:
            say(f"{record.name}: an iteration predicted at {seconds:.2g} s (one core)")
            verdict = judge(kernel, record.kind, np.nan)
        else:
            verdict = Verdict(
                np.nan, False,
                f"not solved: an iteration is predicted at {seconds:.2g} s against "
                f"{exact_seconds:.2g} s for the exact kernel (cost model, one core)",
            )  # fmt: skip
        attempts.append(
            Attempt(record.name, dict(rule.params), verdict.error,
                    time.perf_counter() - start, verdict.accepted, verdict.note)
        )  # fmt: skip
        say(str(attempts[-1]))
        if verdict.accepted:
            reason = (
                f"no global low rank meets the accuracy at this reg; {record.name} "
                f"({record.summary}; an iteration predicted at {seconds:.2g} s against "
                f"{exact_seconds:.2g} s exact) does ({verdict.note} {verdict.error:.2g})"
            )
            say(f"chose {record.name}: {reason}")
            return Choice(verdict.outcome, kernel, reason, tuple(attempts),
                          replay_parameters(kernel))  # fmt: skip

    if dense_fits:
        kernel = build(geometry, exact.name, dtype=dtype, accuracy=accuracy)
        reason = (
            f"no cheaper kernel meets the accuracy; {size} fits the dense budget: the exact "
            "kernel, stored"
        )
        return final(exact, kernel, reason)
    streamed = exact_rule.streamed_params
    kernel = build(geometry, exact.name, dtype=dtype, accuracy=accuracy, **streamed)
    # one estimate everywhere: a pass each way (as the solve's own announcement says)
    if kernel.info.seconds_per_pass is not None:
        say(f"the exact kernel streamed: about {2 * kernel.info.seconds_per_pass:.2g} s per "
            "iteration")  # fmt: skip
    reason = (
        f"{size} too large to store and no low rank met the target while cheaper than the "
        "exact kernel: the exact kernel, streamed"
    )
    return final(exact, kernel, reason)
