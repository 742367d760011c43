"""What kernel operators need to run their per-entry work where the caller's points live.

When a call passes PyTorch tensors (or another Array API library's arrays), every geometry
records the :class:`~sketchot._arrays.ArrayContext` of the inputs, and the exact and low-rank
builders return their device operators (:class:`~sketchot.kernels.exact.DeviceExactKernel`,
:class:`~sketchot.kernels.lowrank.DeviceLowRankKernel`), built on this module's moves: the
clouds (or the factors) are copied once to that device,
and every product, the exact kernel's blocks, exponentials and log-sum-exps included, runs
there through the library's Array API namespace (``array-api-compat``). They keep the
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

from ..gibbs import BLOCK_BYTES, GibbsGeometry

#: A block of the streamed kernel on an accelerator takes at most this share of its free
#: memory (several temporaries of the block's size live at once).
DEVICE_MEMORY_SHARE = 0.125
#: ... and at most this many bytes (a cap, so that the stored data keep their room).
MAX_DEVICE_BLOCK_BYTES = 1 << 30


def runs_on_device(geometry: GibbsGeometry) -> bool:
    """Whether a kernel of this geometry should run on the caller's device: arrays of a
    library other than NumPy, and a cost the device blocks compute (squared Euclidean or
    Euclidean)."""
    context = geometry.context
    return not context.is_numpy and geometry.cost.name in ("sqeuclidean", "euclidean")


def device_block_bytes(context: Any) -> int:
    """Bytes of one streamed block on the context's device: the NumPy block size on a CPU, a
    share of the free memory on an accelerator (CUDA through torch)."""
    if context.on_host:
        return BLOCK_BYTES
    try:
        import torch

        free, _ = torch.cuda.mem_get_info(context.device)
        return int(min(MAX_DEVICE_BLOCK_BYTES, DEVICE_MEMORY_SHARE * free))
    except (ImportError, RuntimeError, TypeError, ValueError):
        return 8 * BLOCK_BYTES


class DeviceArrays:
    """Host <-> device moves of one context (float64 on the way in unless told)."""

    def __init__(self, context: Any) -> None:
        self.context = context
        self.xp = context.xp

    def put(self, array: np.ndarray, dtype: Any = np.float64) -> Any:
        array = np.ascontiguousarray(array, dtype=dtype)
        if self.context.library == "torch":
            import torch

            return torch.from_numpy(array).to(self.context.device)
        return self.xp.asarray(array, device=self.context.device)

    def get(self, array: Any) -> np.ndarray:
        return np.asarray(self.context.to_host(array), dtype=np.float64)

    def dtype(self, dtype: np.dtype) -> Any:
        return self.xp.float32 if dtype == np.float32 else self.xp.float64


def logsumexp(xp: Any, logits: Any, axis: int) -> Any:
    """``log sum exp`` along ``axis`` with a maximum shift (``-inf`` for an all ``-inf``
    line), in the Array API namespace ``xp``; ``logits`` is overwritten."""
    top = xp.max(logits, axis=axis, keepdims=True)
    shift = xp.where(xp.isfinite(top), top, 0.0)
    logits -= shift
    total = xp.sum(xp.exp(logits), axis=axis)
    return xp.log(total) + xp.squeeze(shift, axis=axis)
