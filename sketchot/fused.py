"""Fused Gibbs products on a CUDA device: the exact kernel's streamed passes in one Triton
kernel, no block of the kernel ever written to memory.

For points ``x_i`` (rows) and ``y_j`` (columns), log weights ``w_j`` and at most
:data:`MAX_COLUMNS` value columns ``V_j``, one launch computes, row by row,

.. math::

    \\ell_i = \\log \\sum_j \\exp(w_j - c(x_i, y_j) / \\varepsilon), \\qquad
    s_i = \\sum_j \\exp(w_j - c(x_i, y_j) / \\varepsilon - t_i)\\, V_j,

with ``t_i`` the row's largest logit (a running maximum, as in FlashAttention's softmax; the
log-sum-exp passes keep one per tile entry and reduce them at the end), so
``s_i / exp(l_i - t_i)`` is the softmax average of ``V`` (a barycentric map) and
``exp(t_i) s_i`` the linear product ``K V`` (``w = 0``). The cost is squared Euclidean or
Euclidean; in ``d <=`` :data:`DIFFERENCE_MAX_DIM` dimensions it is summed from coordinate
differences (no cancellation), above from the norms, ``|x|^2 + |y|^2 - 2 x.y`` clamped at 0
(as :func:`sketchot.gibbs.neg_cost_on_device`). Each program holds ``BLOCK_M`` rows and
streams the columns in tiles of ``BLOCK_N``: ``O(n m d)`` arithmetic, ``O((n + m) d)``
memory traffic, against the unfused blocks' ``~20`` reads and writes of every entry (on one
H100 at ``n = m = 10^5`` in 3-D, 21 ms a pass in float32 and 40 ms in float64 against 0.54 s:
``benchmarks/gpu.py --passes``).

Precision is the points' dtype on the device (float64 or float32); the program is compiled
once per dtype, tile and flags (sizes are not specialised). It runs on CUDA tensors when Triton is
installed (PyTorch's CUDA builds ship it), and on CPU tensors under Triton's interpreter
(``TRITON_INTERPRET=1`` and :data:`CPU_INTERPRETER`: how the tests check it without a GPU);
:func:`fused_available` says which. Nothing here imports torch or Triton until a caller
with such tensors asks.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any

#: Up to this dimension the cost is summed from coordinate differences (exact), above from
#: the squared norms and the dot products (one multiply-add per coordinate instead of two).
DIFFERENCE_MAX_DIM = 8
#: The program's offsets into the clouds are 32-bit: ``max(n, m)`` times ``d`` rounded up to a
#: multiple of 32 (the ``tl.dot`` chunks) stays below this.
MAX_OFFSET = 2**31 - 1
#: Most value columns one launch carries (its accumulator lives in registers).
MAX_COLUMNS = 8
#: ``(BLOCK_M, BLOCK_N, num_warps, dot)`` of the log-sum-exp passes, timed on the device the
#: first time a dtype and cost are used (:func:`fused_pass_seconds`), the first until then;
#: ``dot``: in ``d >`` :data:`DIFFERENCE_MAX_DIM`, ``x.y`` by ``tl.dot`` (float32 inputs as
#: three tf32 products: float32's accuracy on the tensor cores) instead of a loop.
TILE_CANDIDATES = ((64, 64, 8, False), (64, 64, 4, False), (128, 64, 8, False),
                   (32, 128, 4, False), (64, 64, 4, True), (128, 64, 8, True))  # fmt: skip
#: ... and of the passes that carry value columns (a third axis of registers).
VALUES_TILE = (32, 32, 4, False)
#: The timed choice of each (dtype, difference form, Euclidean) in this process.
_best_tiles: dict[tuple[str, bool, bool], tuple] = {}
#: Entries of the timed pass of :func:`fused_pass_seconds` (a share of a large pass, so
#: that the timing costs little; all of a small one).
TIMED_ENTRIES = 1 << 30
#: ... and at least this many rows (enough programs to fill a large GPU).
TIMED_MIN_ROWS = 1 << 16


#: Set to ``False`` to run the exact kernel's unfused device blocks instead (the baseline of
#: ``benchmarks/gpu.py --passes``).
ENABLED = True
#: Whether CPU tensors take the fused passes under Triton's interpreter (``TRITON_INTERPRET=1``
#: set before Triton is imported): the tests' switch, far slower than the unfused passes.
CPU_INTERPRETER = False


def _interpreting() -> bool:
    return CPU_INTERPRETER and os.environ.get("TRITON_INTERPRET") == "1"


@functools.lru_cache(maxsize=1)
def _program() -> Any:
    """The compiled Triton program (``None`` when Triton cannot be imported)."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    # n, m, d unspecialised: one compilation per dtype and flags, whatever the sizes
    @triton.jit(do_not_specialize=["n", "m", "d"])
    def gibbs_rows(
        X, YT, XSQ, YSQ, LOGW, V, OUT_LSE, OUT_TOP, OUT_V,
        n, m, d, NEG_INV_REG,
        HAS_W: tl.constexpr, NV: tl.constexpr, NV_PAD: tl.constexpr,
        SMALL_D: tl.constexpr, SQRT: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        USE_DOT: tl.constexpr, PRECISION: tl.constexpr, DOT_CHUNK: tl.constexpr,
    ):  # fmt: skip
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < n
        dtype = OUT_LSE.dtype.element_ty
        if NV == 0:
            # one running maximum and sum per entry of the tile: no reduction until the end
            top = tl.full([BLOCK_M, BLOCK_N], float("-inf"), dtype)
            total = tl.zeros([BLOCK_M, BLOCK_N], dtype)
        else:
            top = tl.full([BLOCK_M], float("-inf"), dtype)
            total = tl.zeros([BLOCK_M], dtype)
            acc = tl.zeros([BLOCK_M, NV_PAD], dtype)
        x_sq = tl.load(XSQ + rows, mask=row_ok, other=0.0)
        neg_inv_reg = tl.load(NEG_INV_REG)  # a tensor: a Python float would pass as float32
        for start in range(0, m, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            col_ok = cols < m
            dist = tl.zeros([BLOCK_M, BLOCK_N], dtype)
            if SMALL_D:
                for k in range(0, d):
                    xk = tl.load(X + rows * d + k, mask=row_ok, other=0.0)
                    yk = tl.load(YT + k * m + cols, mask=col_ok, other=0.0)
                    diff = xk[:, None] - yk[None, :]
                    dist += diff * diff
            elif USE_DOT:  # x.y by the matrix units, DOT_CHUNK coordinates at a time
                for k0 in range(0, d, DOT_CHUNK):
                    ks = k0 + tl.arange(0, DOT_CHUNK)
                    xs = tl.load(
                        X + rows[:, None] * d + ks[None, :],
                        mask=row_ok[:, None] & (ks[None, :] < d),
                        other=0.0,
                    )
                    ys = tl.load(
                        YT + ks[:, None] * m + cols[None, :],
                        mask=(ks[:, None] < d) & col_ok[None, :],
                        other=0.0,
                    )
                    dist = tl.dot(xs, ys, acc=dist, input_precision=PRECISION, out_dtype=dtype)
            else:
                for k in range(0, d):
                    xk = tl.load(X + rows * d + k, mask=row_ok, other=0.0)
                    yk = tl.load(YT + k * m + cols, mask=col_ok, other=0.0)
                    dist += xk[:, None] * yk[None, :]
            if not SMALL_D:
                y_sq = tl.load(YSQ + cols, mask=col_ok, other=0.0)
                dist = tl.maximum(x_sq[:, None] + y_sq[None, :] - 2.0 * dist, 0.0)
            if SQRT:
                dist = tl.sqrt(dist)
            logits = dist * neg_inv_reg
            if HAS_W:
                w = tl.load(LOGW + cols, mask=col_ok, other=float("-inf"))
                logits += w[None, :]
            logits = tl.where(col_ok[None, :], logits, float("-inf"))
            if NV == 0:
                # one exponential an entry: exp(-|logit - top|) rescales whichever is smaller
                e = tl.exp(-tl.abs(logits - top))
                rise = logits > top
                kept = tl.where(logits == float("-inf"), total, total + e)
                total = tl.where(rise, total * e + 1.0, kept)
                top = tl.maximum(top, logits)
            else:
                new_top = tl.maximum(top, tl.max(logits, axis=1))
                shift = tl.where(new_top == float("-inf"), 0.0, new_top)
                rescale = tl.exp(top - shift)
                p = tl.exp(logits - shift[:, None])
                total = total * rescale + tl.sum(p, axis=1)
                picks = tl.arange(0, NV_PAD)
                values = tl.load(
                    V + cols[:, None] * NV + picks[None, :],
                    mask=col_ok[:, None] & (picks[None, :] < NV),
                    other=0.0,
                )
                acc = acc * rescale[:, None] + tl.sum(p[:, :, None] * values[None, :, :], axis=1)
                top = new_top
        if NV == 0:
            row_top = tl.max(top, axis=1)
            shift = tl.where(row_top == float("-inf"), 0.0, row_top)
            row_total = tl.sum(total * tl.exp(top - shift[:, None]), axis=1)
            tl.store(OUT_LSE + rows, tl.log(row_total) + row_top, mask=row_ok)
            tl.store(OUT_TOP + rows, row_top, mask=row_ok)
        else:
            tl.store(OUT_LSE + rows, tl.log(total) + top, mask=row_ok)
            tl.store(OUT_TOP + rows, top, mask=row_ok)
            picks = tl.arange(0, NV_PAD)
            tl.store(
                OUT_V + rows[:, None] * NV + picks[None, :],
                acc,
                mask=row_ok[:, None] & (picks[None, :] < NV),
            )

    return gibbs_rows


def fused_available(context: Any, cost: Any, shape: tuple[int, int, int] | None = None) -> bool:
    """Whether the fused passes can run for the caller's arrays (``context``, an
    :class:`~sketchot._arrays.ArrayContext`) and ``cost``: PyTorch tensors on a CUDA device
    (or on the CPU under Triton's interpreter), a squared Euclidean or Euclidean cost, Triton
    importable, :data:`ENABLED`, and clouds of ``shape = (n, m, d)`` whose offsets fit the
    program's 32-bit integers (:data:`MAX_OFFSET`)."""
    if not ENABLED or context.library != "torch":
        return False
    if cost.name not in ("sqeuclidean", "euclidean"):
        return False
    if shape is not None and max(shape[0], shape[1]) * -(-shape[2] // 32) * 32 >= MAX_OFFSET:
        return False
    on_cuda = str(context.device).startswith("cuda")
    if not (on_cuda or (_interpreting() and "cpu" in str(context.device))):
        return False
    return _program() is not None


class FusedPoints:
    """One cloud on the device in the layout the fused program reads: the points ``(n, d)``
    row-major, their transpose ``(d, n)`` (coalesced column tiles) and squared norms, in one
    dtype.

    Parameters
    ----------
    points : torch.Tensor
        ``(n, d)`` centred points on the device.
    dtype : torch.dtype
        ``torch.float64`` or ``torch.float32``: the precision of every pass.
    """

    def __init__(self, points: Any, dtype: Any) -> None:
        self.points = points.to(dtype).contiguous()
        self.transposed = self.points.T.contiguous()
        self.sq_norms = (self.points * self.points).sum(dim=1).contiguous()

    def __len__(self) -> int:
        return self.points.shape[0]

    def take(self, index: Any) -> FusedPoints:
        """The points at ``index`` (a device index tensor)."""
        return FusedPoints(self.points.index_select(0, index), self.points.dtype)


def chosen_tiles() -> dict[tuple[str, bool, bool], tuple]:
    """The tiles :func:`fused_pass_seconds` timed fastest in this process, by (dtype,
    difference form, Euclidean)."""
    return dict(_best_tiles)


def _tile_key(rows: FusedPoints, sqrt: bool) -> tuple[str, bool, bool]:
    return str(rows.points.dtype), rows.points.shape[1] <= DIFFERENCE_MAX_DIM, sqrt


def fused_rows(
    rows: FusedPoints,
    cols: FusedPoints,
    reg: float,
    *,
    sqrt: bool = False,
    log_w: Any = None,
    values: Any = None,
    tile: tuple | None = None,
) -> tuple[Any, Any, Any]:
    """One fused pass over the rows: ``(l, t, s)`` of the module's formula, on the device in
    the points' dtype.

    Parameters
    ----------
    rows, cols : FusedPoints
        The output side (``n`` points) and the summed side (``m`` points), same dtype.
    reg : float
        ``epsilon``.
    sqrt : bool
        Euclidean cost (the square root of the squared distance).
    log_w : torch.Tensor, optional
        ``(m,)`` log weights; zeros when omitted.
    values : torch.Tensor, optional
        ``(m, k)`` value columns, ``k <=`` :data:`MAX_COLUMNS`; ``s`` is ``None`` without.
    tile : tuple, optional
        ``(BLOCK_M, BLOCK_N, num_warps, dot)``; by default the fastest of :data:`TILE_CANDIDATES`
        timed by :func:`fused_pass_seconds` for this dtype and cost, else the first.

    Returns
    -------
    lse, top : torch.Tensor
        ``(n,)``: ``l_i`` (``-inf`` for a row whose weights are all zero) and ``t_i``.
    sums : torch.Tensor or None
        ``(n, k)``: ``s_i``.
    """
    import numpy as np
    import torch
    import triton

    program = _program()
    dtype = rows.points.dtype
    n, d = rows.points.shape
    m = len(cols)
    k = 0 if values is None else values.shape[1]
    if k > MAX_COLUMNS:
        raise ValueError(f"values must have at most {MAX_COLUMNS} columns; got {k}")
    if tile is None:
        tile = VALUES_TILE if k else _best_tiles.get(_tile_key(rows, sqrt), TILE_CANDIDATES[0])
    device = rows.points.device
    lse = torch.empty(n, dtype=dtype, device=device)
    top = torch.empty(n, dtype=dtype, device=device)
    sums = torch.empty((n, max(k, 1)), dtype=dtype, device=device)
    w = lse if log_w is None else log_w.to(device=device, dtype=dtype).contiguous()
    v = lse if values is None else values.to(device=device, dtype=dtype).contiguous()
    if n == 0:
        return lse, top, (sums[:, :k] if k else None)
    grid = (triton.cdiv(n, tile[0]),)
    # the interpreter computes in NumPy: its IEEE specials (log 0, -inf - -inf in a discarded
    # branch) are not errors, as on a GPU
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        program[grid](
            rows.points, cols.transposed, rows.sq_norms, cols.sq_norms, w, v, lse, top, sums,
            n, m, d, torch.full((1,), -1.0 / reg, dtype=dtype, device=device),
            HAS_W=log_w is not None, NV=k, NV_PAD=max(2, triton.next_power_of_2(max(k, 1))),
            SMALL_D=d <= DIFFERENCE_MAX_DIM, SQRT=sqrt, BLOCK_M=tile[0], BLOCK_N=tile[1],
            num_warps=tile[2], USE_DOT=len(tile) > 3 and tile[3] and d > DIFFERENCE_MAX_DIM,
            PRECISION="tf32x3" if dtype == torch.float32 else "ieee", DOT_CHUNK=32,
        )  # fmt: skip
    return lse, top, (sums if k else None)


def fused_pass_seconds(rows: FusedPoints, cols: FusedPoints, reg: float, sqrt: bool) -> float:
    """Seconds of one fused log-domain pass over all ``rows``, extrapolated from a timed pass
    over a share of them (:data:`TIMED_ENTRIES` entries, at least :data:`TIMED_MIN_ROWS`
    rows) after an untimed one that compiles the program. The first time for a dtype and
    cost, each of :data:`TILE_CANDIDATES` is timed and the fastest kept for every later
    pass (the device's own measure, not a table)."""
    import torch

    n, m = len(rows), len(cols)
    count = min(n, max(TIMED_MIN_ROWS, TIMED_ENTRIES // max(1, m)))
    part = rows if count == n else rows.take(torch.arange(count, device=rows.points.device))
    log_w = torch.zeros(m, dtype=rows.points.dtype, device=rows.points.device)
    key = _tile_key(rows, sqrt)
    candidates = [_best_tiles[key]] if key in _best_tiles else list(TILE_CANDIDATES)
    if key[1]:  # the difference form has no tl.dot: those tiles would repeat the loop's
        candidates = [tile for tile in candidates if not tile[3]]
    timed = []
    for tile in candidates:
        try:
            fused_rows(part, cols, reg, sqrt=sqrt, log_w=log_w, tile=tile)  # compiles
        except Exception:  # a tile or tl.dot that this device's compiler refuses
            if tile is candidates[0]:
                raise
            continue
        start = time.perf_counter()
        lse = fused_rows(part, cols, reg, sqrt=sqrt, log_w=log_w, tile=tile)[0]
        float(lse[0])  # a host read waits for the device
        timed.append((time.perf_counter() - start, tile))
    seconds, _best_tiles[key] = min(timed)
    return seconds * n / count
