"""What kernel operators need to run their per-entry work where the caller's points live.

When a call passes arrays on an accelerator (CUDA tensors, CuPy; arrays in host memory only
with :data:`sketchot._arrays.HOST_ARRAYS_ON_DEVICE`: CPU tensors run NumPy's operators on
views of them), every geometry records the :class:`~sketchot._arrays.ArrayContext` of the
inputs, an :class:`~sketchot.kernels.exact.ExactKernel` holds the clouds and computes its
blocks there, a :class:`~sketchot.kernels.lowrank.LowRankKernel` holds its factors there, and the
block-local builder puts its expansion's products there
(:meth:`~sketchot.sketch.LocalGaussianExpansion.to_device`):
the clouds are copied once to that device (:class:`~sketchot._arrays.DeviceArrays`; the
low-rank factors are built there, :attr:`~sketchot.kernels.lowrank.FactorMaps.device_left_factor`),
and every product, the exact kernel's blocks,
exponentials and log-sum-exps included (:mod:`sketchot.gibbs`'s device functions), runs
there through the library's Array API namespace
(``array-api-compat``). This module says when (:func:`runs_on_device`), with which block
sizes, and what ``auto`` predicts an exact iteration costs there
(:func:`device_exact_iteration_cost`: declared rates, never a timing). They keep the
operator contract of :mod:`sketchot.kernels.base` unchanged: vectors in and out are NumPy
float64 on the host, so the one iteration (:mod:`sketchot.solver.engine`) drives them as it
drives the NumPy operators, and each half-step moves ``O(n + m)`` numbers between host and
device, never a block of the kernel. The ratios and the bad-entry mask of a pass are computed
on the host by the same functions as the NumPy operators' (one definition of the rules).

Costs per pass as for the NumPy operators: ``O(n m d)`` streamed exact, ``O(n m)`` stored,
``O((n + m) r)`` low rank. Memory on the device: the stored kernel or one block of
:func:`device_block_bytes`, plus the clouds or factors.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._arrays import DeviceArrays
from ..fused import fused_available
from ..gibbs import BLOCK_BYTES, GibbsGeometry
from .cost import device_exact_iteration_cost as exact_iteration_cost_on_device

#: A block of the streamed kernel on an accelerator takes at most this share of its free
#: memory (several temporaries of the block's size live at once).
DEVICE_MEMORY_SHARE = 0.125
#: ... and at most this many bytes (a cap, so that the stored data keep their room).
MAX_DEVICE_BLOCK_BYTES = 1 << 30


#: ``dtype=None`` on an accelerator takes float32 when ``accuracy`` is at least this many times
#: float32's rounding of a pass's exponents, ``eps * max(1, max_cost / reg)`` (a weight and a
#: cost of that size each rounded: that relative error in every product).
FLOAT32_MARGIN = 10.0


def on_accelerator(geometry: GibbsGeometry) -> bool:
    """Whether the geometry's kernels run on a device apart from host memory (a GPU)."""
    return runs_on_device(geometry) and not geometry.context.on_host


def default_dtype(geometry: GibbsGeometry, accuracy: float | None) -> np.dtype:
    """The exact kernel's precision for ``dtype=None`` (the approximations keep float64:
    :func:`~sketchot.kernels.registry.build_backend`): float64, except on an accelerator,
    where float32 passes run about twice as fast (one H100, ``benchmarks/gpu.py --passes``;
    far more on GPUs with little float64 arithmetic) and are taken when the ``accuracy``
    asked for is at least :data:`FLOAT32_MARGIN` times float32's rounding of their exponents,
    ``eps32 * max(1, max_cost / reg)``. The true-kernel check stays in float64, so a float32
    run that misses the accuracy says so. No accuracy (no check): float64."""
    if accuracy is None or not on_accelerator(geometry):
        return np.dtype(np.float64)
    spread = max(1.0, geometry.max_cost() / geometry.reg)
    rounding = float(np.finfo(np.float32).eps) * spread
    return np.dtype(np.float32 if accuracy >= FLOAT32_MARGIN * rounding else np.float64)


def runs_on_device(geometry: GibbsGeometry) -> bool:
    """Whether a kernel of this geometry should run on the caller's device (the geometry's
    own rule: :meth:`~sketchot.gibbs.GibbsGeometry.computes_on_device`)."""
    return geometry.computes_on_device()


def device_block_bytes(context: Any) -> int:
    """Bytes of one streamed block on the context's device: a share of the free memory of a
    CUDA device (asked through torch), :data:`~sketchot.gibbs.BLOCK_BYTES` elsewhere."""
    free = None if context.on_host else DeviceArrays(context).free_bytes()
    if free is None:  # host memory, or a device whose free memory cannot be asked for
        return BLOCK_BYTES
    return int(min(MAX_DEVICE_BLOCK_BYTES, DEVICE_MEMORY_SHARE * free))


def device_exact_iteration_cost(geometry: GibbsGeometry) -> float:
    """Predicted seconds of one exact iteration on the caller's device, from the declared
    rates of :mod:`~sketchot.kernels.cost` (the fused passes where :mod:`sketchot.fused`
    runs for these arrays, the blocks otherwise): what ``auto`` compares
    (:func:`sketchot.policy.ladder.exact_iteration_seconds`). A function of the sizes and of
    what is installed, never a timing: the same arrays choose the same kernel on a busy
    device."""
    n, m = geometry.shape
    shape = (n, m, geometry.Xc.shape[1])
    fused = fused_available(geometry.context, geometry.cost, shape)
    return exact_iteration_cost_on_device(n, m, fused=fused)
