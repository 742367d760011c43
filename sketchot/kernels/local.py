"""The block-local polynomial Gibbs kernel: every entry to a small relative error, at any reg.

An operator over :class:`~sketchot.sketch.LocalGaussianExpansion` (the sketch core's
block-local expansion of ``exp(2 x.y / reg)`` around cluster centres). Its error is relative
per entry, so Sinkhorn scalings spanning hundreds of orders of magnitude do not amplify it,
unlike a global low-rank kernel. It declares the ``'log_products'`` capability: its fused
passes and projections also run on logarithms (``log=True``), which the solver uses at small
``reg``. As ``K = L R^T`` it has ``L = K`` and ``R = I``.

Where the caller's arrays live on a device (CUDA tensors, say), the expansion's per-point
work runs there (:meth:`~sketchot.sketch.LocalGaussianExpansion.to_device`); ``tau='auto'``
chooses by counted work (the same choice as on the host), ``tau='timed'`` times its sampled
iterations there.

Dimension limit: the expansion needs ``C(degree + d, d)`` features per point; at the default
degree (9) that is ``d <= 4``. Above it the builder raises a ``ValueError`` naming ``d`` and
the limit: it never returns an inaccurate kernel.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from .._arrays import DeviceArrays
from .._defaults import DEFAULT_ACCURACY
from .._validation import check_choice, check_float
from ..gibbs import GibbsGeometry
from ..sketch import LocalGaussianExpansion
from . import cost
from .base import (
    IDENTITY_STEP,
    SIDES,
    FusedPass,
    KernelInfo,
    KernelOperator,
    ProjectedOnRead,
    RatioStep,
    check_operand,
    identity_pass,
    log_ratios_and_bad,
    ratios_and_bad,
)
from .registry import register_backend

#: The block-local kernel's backend name.
LOCAL_BACKEND = "polyts_local"
#: Largest dimension at the default degree (9): ``C(9 + d, d) <= 1000`` features per point.
MAX_DIMENSION = 4
#: ``rtol`` sized from ``accuracy`` lies in this range (degrees 5 to 12 at ``tau = 1``).
RTOL_RANGE = (1e-12, 1e-4)
#: ... as this fraction of ``accuracy``: with the truncation at ``rtol`` too, a product is
#: off by at most twice it, 4% of the accuracy, within the solver's first-stop margin
#: (:data:`~sketchot.solver.options.KERNEL_SHARE`, 5%). Measured on 10^5 uniform points at
#: reg 0.01 (tau = 4): 1e-5 instead of 1e-6 (degree 12 instead of 13, fewer pairs kept)
#: makes an iteration 1.99 s instead of 2.92 s.
RTOL_FRACTION = 2e-2


def rtol_for(accuracy: float) -> float:
    """The entries' relative error for a solve to ``accuracy``: :data:`RTOL_FRACTION` of
    it, within :data:`RTOL_RANGE`. A product of such entries is off by at most that fraction
    (twice it with the truncation), so the kernel adds at most about ``accuracy / 25`` to the
    marginal error the true-kernel check certifies."""
    accuracy = check_float(accuracy, "accuracy", positive=True)
    return float(np.clip(accuracy * RTOL_FRACTION, *RTOL_RANGE))


def _device_of(geometry: GibbsGeometry) -> DeviceArrays | None:
    """Where the expansion's products run: the caller's device when the geometry computes
    there (:meth:`~sketchot.gibbs.GibbsGeometry.computes_on_device`: CUDA tensors, say),
    else the host."""
    return DeviceArrays(geometry.context) if geometry.computes_on_device() else None


def _signed_log_product(log_product, log_w: np.ndarray, V: np.ndarray) -> np.ndarray:
    """``K diag(exp(log_w)) V`` for ``V`` of any sign, from a log-domain product: the
    positive and negative parts of each column go through the log product separately."""
    columns = V.reshape(V.shape[0], -1)
    out = []
    with np.errstate(divide="ignore"):
        for column in columns.T:
            part = np.zeros(0)
            for sign in (1.0, -1.0):
                piece = np.exp(log_product(log_w + np.log(np.maximum(sign * column, 0.0))))
                part = sign * piece if part.size == 0 else part + sign * piece
            out.append(part)
    result = np.column_stack(out)
    return result[:, 0] if V.ndim == 1 else result


class LocalPolyKernel(KernelOperator):
    """Gibbs kernel by a block-local polynomial expansion (see the module notes).

    Parameters
    ----------
    geometry : GibbsGeometry
    expansion : LocalGaussianExpansion
        Fitted on the centred clouds (with a ``placement``: the
        :class:`~sketchot.sketch.local.blocks.BlockExpansion` its blocks share).
    info : KernelInfo
    dtype : numpy dtype
    placement : object, optional
        Where the clouds live when not in this process's memory: the passes, projections
        and ``log_means`` run there (:class:`sketchot.distributed.DaskBlockLocal`: clouds
        on a Dask cluster in blocks of whole clusters), with its ``capabilities``.
    """

    def __init__(
        self,
        geometry: GibbsGeometry,
        expansion: LocalGaussianExpansion,
        info: KernelInfo,
        dtype: Any = np.float64,
        placement: Any = None,
    ) -> None:
        if placement is not None:
            info.capabilities = info.capabilities | placement.capabilities
        else:
            info.capabilities = info.capabilities | {
                "out_of_sample", "nonnegative", "log_products"
            }  # fmt: skip
            if expansion.means_match_products:  # else a log product per coordinate
                info.capabilities = info.capabilities | {"log_means"}
        super().__init__(geometry, info, dtype)
        self.expansion = expansion
        self.placement = placement
        self._transposed: LocalGaussianExpansion | None = None
        #: predicted seconds (one core) of an iteration (:func:`local_iteration_cost`), once
        #: counted; ``tau='timed'``: the builder's timed sample
        self.predicted_seconds: float | None = None

    def _in_memory(self, what: str) -> None:
        if self.placement is not None:
            raise NotImplementedError(
                f"{what} of the block-local kernel are not available on "
                f"{type(self.placement).__name__} (log-domain passes, projections, "
                "log_means and products of non-negative values only)"
            )

    def matmat(self, V: Any) -> np.ndarray:
        if self.placement is not None:
            return self.placement.matmat(self, V)
        return self.expansion.matmat(check_operand(V, self.shape[1], "V", vector=False))

    def rmatmat(self, U: Any) -> np.ndarray:
        if self.placement is not None:
            return self.placement.rmatmat(self, U)
        return self.expansion.rmatmat(check_operand(U, self.shape[0], "U", vector=False))

    def log_means(self, side: str, log_w: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(log(K exp(w)), means)`` (``side='rows'``: the means of ``Yc`` under
        ``K diag(exp(w))``; ``'cols'``: of ``Xc`` under ``K^T``), in the geometry's centred
        coordinates (the expansion is fitted on them); see
        :meth:`~sketchot.sketch.local.LocalGaussianExpansion.log_means`."""
        check_choice(side, "side", SIDES)
        if self.placement is not None:
            return self.placement.log_means(self, side, log_w)
        length = self.shape[1 if side == "rows" else 0]
        log_w = check_operand(log_w, length, "log_w", vector=True).ravel()
        return self.expansion.log_means(log_w, transpose=side == "cols")

    def _rows(self, index: np.ndarray) -> np.ndarray:
        self._in_memory("rows")
        selector = np.zeros((self.shape[0], index.size))
        selector[index, np.arange(index.size)] = 1.0
        return self.expansion.rmatmat(selector).T

    def _apply_new(self, points: np.ndarray, values: np.ndarray, transpose: bool) -> np.ndarray:
        self._in_memory("products of new points")
        g = self.geometry
        if transpose and self._transposed is None:
            # New target points need the expansion with the roles of the clouds swapped.
            e = self.expansion
            self._transposed = LocalGaussianExpansion(
                g.reg,
                tau=e.tau,
                rtol=e.rtol,
                max_features=e.max_features,
                truncate=e.truncate,
                rng=e.rng,
            ).fit(g.Yc, g.Xc)
            self._transposed.to_device(_device_of(g))
        expansion = self._transposed if transpose else self.expansion
        centred = points - g.center
        return _signed_log_product(
            lambda log_w: expansion.log_matvec_new(centred, log_w),
            np.zeros(values.shape[0]),
            values,
        )

    def fused_pass(
        self,
        side: str,
        w: np.ndarray,
        numerator: np.ndarray,
        *,
        log: bool = False,
        step: RatioStep = IDENTITY_STEP,
    ) -> FusedPass:
        if self.placement is not None:
            return self.placement.fused_pass(self, side, w, numerator, log=log, step=step)
        if side == "cols":
            return identity_pass(w, numerator, log=log, step=step)
        if log:
            products = self.expansion.log_matvec(w)
            ratios, bad = log_ratios_and_bad(numerator, products, step)
        else:
            products = self.expansion.matmat(w)
            ratios, bad = ratios_and_bad(numerator, products, step)
        project = self.expansion.log_rmatvec if log else self.expansion.rmatmat
        return ProjectedOnRead(products, ratios, bad, project)

    def project(
        self, side: str, values: np.ndarray, index: Any = None, *, log: bool = False
    ) -> np.ndarray:
        if self.placement is not None:
            return self.placement.project(self, side, values, index, log=log)
        fill = -np.inf if log else 0.0
        length = self.shape[0 if side == "rows" else 1]
        full = values
        if index is not None:
            full = np.full(length, fill)
            full[index] = values
        if side == "cols":
            return np.array(full, dtype=np.float64)
        return self.expansion.log_rmatvec(full) if log else self.expansion.rmatmat(full)


#: The block-local kernel's iterations are predicted from every ``COUNT_STRIDE``-th group of
#: output clusters, planned and counted (:meth:`~sketchot.sketch.LocalGaussianExpansion.
#: iteration_work`), scaled to all: at 2 10^4 uniform points, reg 0.01, the count of a
#: sixteenth is within 3% of the whole one's, for a tenth of its planning.
COUNT_STRIDE = 16


def local_iteration_cost(kernel: LocalPolyKernel) -> float:
    """Predicted seconds (one core) of one log-domain iteration (the solver's path at small
    ``reg``): the counted work of its products' plan times the committed constants
    (:func:`~sketchot.kernels.cost.local_iteration_cost`). Never timed: the same points and
    parameters predict the same seconds on a busy machine."""
    if kernel.predicted_seconds is None:
        work = kernel.expansion.iteration_work(stride=COUNT_STRIDE)
        kernel.predicted_seconds = cost.local_iteration_cost(work)
    return kernel.predicted_seconds


#: ``tau='timed'``: a timed iteration longer than this is not timed twice
#: (:func:`local_iteration_seconds`) ...
SLOW_PASS_SECONDS = 1.0
#: ... and one estimated longer than this from every ``TIMING_STRIDE``-th group of output
#: clusters is not timed whole (the sample's rows time the rest to within their spread).
#: Measured on 10^5 uniform points at reg 0.01 (36 groups at tau = 1): 16 estimated 7.9 s
#: of a 9.6 s iteration in 0.64 s, 8 estimated 11.2 s in 1.56 s.
TIMING_STRIDE = 16


class _SampledTiming:
    """``tau='timed'``: an iteration's seconds from every :data:`TIMING_STRIDE`-th group of
    output clusters of one fitted expansion, sampled twice: the first sample also gathers
    the padded features that every product reuses, a one-time cost that the sample's scaling
    to the whole iteration multiplies; the second sample reads them as stored. The estimate
    is the faster of the two."""

    def __init__(self, expansion: LocalGaussianExpansion) -> None:
        self.expansion = expansion
        self.samples = [expansion.iteration_seconds(stride=TIMING_STRIDE) for _ in range(2)]

    @property
    def seconds(self) -> float:
        return min(self.samples)


class _CountedCost:
    """``tau='auto'``: an iteration's predicted seconds (one core) from the counted work of
    every :data:`COUNT_STRIDE`-th group of output clusters of one fitted expansion."""

    def __init__(self, expansion: LocalGaussianExpansion) -> None:
        self.expansion = expansion
        self.seconds = cost.local_iteration_cost(expansion.iteration_work(stride=COUNT_STRIDE))


def local_iteration_seconds(kernel: LocalPolyKernel) -> float:
    """Seconds of one log-domain iteration, TIMED (only where a caller asks for timing:
    ``tau='timed'``; ``'auto'`` reads :func:`local_iteration_cost`).

    First from a sample: every :data:`TIMING_STRIDE`-th group of output clusters
    (:class:`_SampledTiming`), which is the estimate when it exceeds
    :data:`SLOW_PASS_SECONDS`; below, whole iterations are cheap: the faster of two timed
    passes (the first one also pays one-time costs), or the first alone when it takes more
    than :data:`SLOW_PASS_SECONDS`."""
    sampled = _SampledTiming(kernel.expansion).seconds
    if sampled > SLOW_PASS_SECONDS:
        return sampled
    n, m = kernel.shape
    times = []
    for _ in range(2):
        start = time.perf_counter()
        # the projection is computed when read: an iteration needs it
        _ = kernel.fused_pass("rows", np.zeros(m), np.zeros(n), log=True).projection
        times.append(time.perf_counter() - start)
        if times[0] > SLOW_PASS_SECONDS:
            break  # one-time costs are small against such a pass: a second one is waste
    return min(times)


@register_backend(
    LOCAL_BACKEND,
    kind="local",
    advice="lower rtol for more accurate entries; in dimension > 4 raise max_features",
    summary="the block-local polynomial expansion around cluster centres: every entry to a "
    "relative rtol at any reg (d <= 4)",
)
def build_local(
    geometry: GibbsGeometry,
    *,
    rng: Any = None,
    dtype: Any = np.float64,
    tau: float | str = "auto",
    rtol: float | None = None,
    max_features: int = 1000,
    truncate: float | None = None,
    accuracy: float = DEFAULT_ACCURACY,
) -> LocalPolyKernel:
    """The block-local kernel on a geometry (``O((n + m) R)`` build; see the module notes).

    Parameters
    ----------
    tau : float, 'auto' or 'timed', default='auto'
        Clusters are balls of radius ``sqrt(tau reg / 2)``: ``tau`` is the half width of the
        interval ``[-tau, tau]`` of the coupling argument ``2 p.q / reg``. Larger ``tau``:
        fewer, larger clusters and a higher degree. ``'auto'``: ``1``, unless its iteration
        is predicted (counted work, :func:`local_iteration_cost`) at more than
        :data:`TAU_SEARCH_SECONDS`; then the candidates :data:`TAU_CANDIDATES` in turn,
        while each is predicted at most :data:`TAU_GAIN` times the best so far (and its
        features and rounding stay within ``max_features`` and ``rtol``): on points that
        fill space, clusters of ``tau = 1`` hold fewer points than they have features, and
        larger ones pay. A function of the points, ``reg``, ``rtol`` and ``rng``: the same
        call chooses the same ``tau``. ``'timed'``: the same search by timed sampled
        iterations (this machine's speed now; not reproducible under load). The chosen
        value is ``info.params['tau']``.
    rtol : float or None, default=None
        Relative error of every entry the degree is chosen for; ``None``: sized from
        ``accuracy`` by :func:`rtol_for` (``2e-5`` at the default accuracy, ``2e-8`` at
        ``accuracy = 1e-6``).
    max_features : int, default=1000
        Most features ``C(degree + d, d)`` per point (this bounds the dimension).
    truncate : float or None, default=None
        Log-domain products skip the cluster pairs whose bounded share of every row is below
        ``truncate`` in total (the solver's iterations, plan summaries and maps run on them
        at small ``reg``); ``None``: ``rtol``, so a product keeps the entries' relative
        accuracy; ``0`` computes every pair.
    accuracy : float, default=1e-3
        The solve's target (the solver passes its own); sizes ``rtol`` when it is ``None``.
    """
    if rtol is None:
        rtol = rtol_for(accuracy)

    def fit(tau: float) -> LocalGaussianExpansion:
        expansion = LocalGaussianExpansion(
            geometry.reg,
            tau=tau,
            rtol=rtol,
            max_features=max_features,
            truncate=rtol if truncate is None else truncate,
            rng=rng,
        ).fit(geometry.Xc, geometry.Yc)
        # on the caller's device before tau='auto' times it: the timing is the device's
        return expansion.to_device(_device_of(geometry))

    predicted = None
    if isinstance(tau, str) and tau in ("auto", "timed"):
        measure = _CountedCost if tau == "auto" else _SampledTiming
        expansion, seconds = _fastest_expansion(fit, rtol, measure)
        predicted = seconds if tau == "auto" else None
    elif isinstance(tau, str):
        raise ValueError(f"tau must be a positive number, 'auto' or 'timed'; got {tau!r}")
    else:
        expansion = fit(tau)
    info = KernelInfo(
        LOCAL_BACKEND,
        {
            "tau": expansion.tau,
            "rtol": rtol,
            "truncate": expansion.truncate,
            "degree": expansion.degree_,
            "clusters": expansion.n_clusters_,
            "entry_error_bound": expansion.entry_error_bound_,
        },
        # every entry to (1 +- entry bound), and a product skips at most `truncate` of a row
        product_rtol=expansion.entry_error_bound_ + expansion.truncate,
    )
    kernel = LocalPolyKernel(geometry, expansion, info, dtype)
    kernel.predicted_seconds = predicted
    return kernel


#: ``tau='auto'``: the half widths tried, in order ...
TAU_CANDIDATES = (1.0, 2.0, 4.0)
#: ... when the first one's iteration is predicted (``'timed'``: timed) at more than this
#: (below, the other fits would cost more than they could save; the prediction is of one
#: core, the timing of the pool on the 2-core machine where 1 s was measured) ...
TAU_SEARCH_SECONDS = {"auto": 2.0, "timed": 1.0}
#: ... each kept while its iteration takes at most this fraction of the best so far.
TAU_GAIN = 0.9


def _fastest_expansion(fit, rtol: float, measure) -> tuple[LocalGaussianExpansion, float]:
    """``tau='auto'`` and ``'timed'`` (see :func:`build_local`): the fitted expansion with
    the cheapest iteration among the candidates, and that iteration's seconds, by
    ``measure`` (:class:`_CountedCost`: predicted from counted work; :class:`_SampledTiming`:
    timed)."""
    threshold = TAU_SEARCH_SECONDS["auto" if measure is _CountedCost else "timed"]
    best = measure(fit(TAU_CANDIDATES[0]))
    if best.seconds <= threshold:
        return best.expansion, best.seconds
    for tau in TAU_CANDIDATES[1:]:
        try:
            expansion = fit(tau)
        except ValueError:  # its degree needs more than max_features features
            break
        if expansion.entry_error_bound_ > rtol:  # its rounding alone would miss rtol
            break
        candidate = measure(expansion)
        if candidate.seconds > TAU_GAIN * best.seconds:
            break
        best = candidate
    return best.expansion, best.seconds
