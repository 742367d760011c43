"""The cost model ``'auto'`` compares kernels by: counted work times measured constants.

Every choice of the default call (which kernel, the block-local kernel's ``tau``) compares
predicted seconds, each a count of the work an iteration does (kernel entries computed from
the points, exponentials, multiply-adds of batched products, entries read from a stored
kernel) times one constant per unit of work. The counts are functions of the inputs and the
options (:meth:`~sketchot.sketch.LocalGaussianExpansion.iteration_work` counts the
block-local kernel's plan without running it), and the constants are the ones below, so the
choice never reads a clock or the machine's load: the same inputs and ``rng`` choose the
same kernel, quiet or under load, with any number of threads.

The constants are measured by ``benchmarks/cost_model.py`` (one core, BLAS on one thread:
the kernels compared all share their work among the same threads, so the ratios hold at any
count), which prints them as a table and writes ``benchmarks/results/cost_model.json``; they
are committed here, in this one place. Timing is still available where a user asks for it
(``polyts_local``'s ``tau='timed'``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CostConstants:
    """Seconds per unit of counted work, on one core.

    Attributes
    ----------
    pair : float
        One (row, cluster) pair of the block-local kernel's batched products: its exponent
        (``d`` multiply-adds), exponential and shift.
    fma : float
        One multiply-add of those batched products (moments and output rows, ``R`` per
        pair and column).
    exact : float
        One entry the block-local kernel computes from the points (its small clusters).
    call : float
        The fixed cost of one batched product (gathers, temporaries, the interpreter).
    entry : float
        One entry of a streamed exact pass (computed from the points, then used), beyond
        its coordinates ...
    entry_per_dim : float
        ... plus this per coordinate (the distance's multiply-adds).
    read : float
        One entry of a stored exact kernel read by one product.
    """

    pair: float
    fma: float
    exact: float
    call: float
    entry: float
    entry_per_dim: float
    read: float

    def entry_seconds(self, dim: int) -> float:
        """Seconds of one streamed exact entry of ``dim``-dimensional points."""
        return self.entry + dim * self.entry_per_dim


#: Measured by ``python benchmarks/cost_model.py --json benchmarks/results/cost_model.json``
#: (run 2026-11-28, stamped 06:21 UTC, on the 2-core development machine shared with other
#: jobs: the "Measured now" line of ``benchmarks/results/cost_model.md``, whose table also
#: checks the model against 48 timed block-local iterations: measured / predicted median
#: 0.98, range 0.76 to 3.45, the worst at large reg and tau = 4, where few clusters remain).
COSTS = CostConstants(
    pair=2.2e-9,
    fma=7.4e-11,
    exact=3.1e-9,
    call=4.7e-4,
    entry=2.9e-9,
    entry_per_dim=0.0,
    read=4.4e-10,
)

#: Iterations over which the build of a stored exact kernel is counted in its cost.
BUILD_AMORTISED = 100

#: Kernel entries a streamed exact iteration (its two passes) computes per second on an
#: accelerator, with the fused passes (:mod:`sketchot.fused`) and without them (blocks):
#: from ``benchmarks/results/gpu_h100.md`` (one H100, run 2026-11-27, float64, colours at
#: n = 10^5: a fused iteration 0.080 s, a blocked one 1.09 s for 10^10 entries).
DEVICE_FUSED_ENTRIES_PER_SECOND = 1.25e11
DEVICE_BLOCK_ENTRIES_PER_SECOND = 9.2e9


def exact_iteration_cost(n: int, m: int, dim: int, *, stored: bool) -> float:
    """Predicted seconds of one iteration of the exact kernel on the host: stored, its two
    products read the ``n m`` entries, and its build (every entry computed once) is spread
    over :data:`BUILD_AMORTISED` iterations; streamed, each of the two passes computes every
    entry and uses it."""
    entries = float(n) * float(m)
    computed = entries * COSTS.entry_seconds(dim)
    if stored:
        return 2.0 * entries * COSTS.read + computed / BUILD_AMORTISED
    return 2.0 * computed


def device_exact_iteration_cost(n: int, m: int, *, fused: bool) -> float:
    """Predicted seconds of one exact iteration on an accelerator (the declared rates
    above)."""
    rate = DEVICE_FUSED_ENTRIES_PER_SECOND if fused else DEVICE_BLOCK_ENTRIES_PER_SECOND
    return float(n) * float(m) / rate


def local_iteration_cost(work: dict[str, float]) -> float:
    """Predicted seconds of one block-local iteration from its counted ``work``
    (:meth:`~sketchot.sketch.LocalGaussianExpansion.iteration_work`)."""
    return (
        work["exp"] * COSTS.pair
        + work["fma"] * COSTS.fma
        + work["exact"] * COSTS.exact
        + work["calls"] * COSTS.call
    )
