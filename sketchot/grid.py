"""Histograms on tensor-product grids: the squared-Euclidean Gibbs kernel factorises along
the axes, ``K = K_1 (x) K_2 (x) ... (x) K_d`` with ``K_k[i, j] = exp(-(t_i - s_j)^2 / reg)``
between the coordinates of axis ``k``, so a product with ``K`` costs
``O(N (n_1 + ... + n_d))`` and never forms an ``N x N`` array.

:class:`RegularGrid` holds the axes of a grid (1-D, 2-D, 3-D or more; uniform or with
explicit, possibly uneven, 1-D coordinates per axis). :func:`log_convolve` applies the
kernel in the log domain, axis by axis::

    log_convolve(log_w, source, target, reg)[i]
        = log sum_j exp(-|x_i - y_j|^2 / reg + log_w[j])

with ``x_i`` the target grid's points and ``y_j`` the source grid's. ``-inf`` entries of
``log_w`` are zero mass. :class:`GridConvolution` holds the per-axis kernels of one
``(source, target, reg)`` for repeated products (the solver's iterations).

How one axis pass is computed (the same arithmetic at every ``reg``)
--------------------------------------------------------------------
Both axes of a 1-D kernel are cut into ``J`` contiguous blocks, ``J`` the smallest power of
two for which every block pair ``(b, c)`` has an exponent range ``max - min`` of
``(t_i - s_j)^2 / reg`` at most :data:`BLOCK_RANGE` (600). The stored matrix is the
shifted kernel ``exp(-(t_i - s_j)^2 / reg - kappa[b, c])``, ``kappa[b, c]`` the pair's
largest exponent, so each entry lies in ``[e^-600, 1]`` and none underflows. A row ``m``
of the input (the other axes flattened) is shifted by its maximum ``mu[m, b]`` on each
input block, exponentiated (``E``, entries in ``[0, 1]``, one of them 1 per block), and for
each output block ``c`` the blocks are weighted by ``exp(mu[m, b] + kappa[b, c] -
sigma[m, c])``, ``sigma`` their largest shift, before one BLAS product with the stored
kernel columns of ``c``. The output is ``log(S) + sigma``.

Why this is exact up to rounding: in the product for ``(m, c)`` the block pair that attains
``sigma`` has weight 1 and contains the term ``1 * exp(-range) >= e^-600``, so ``S >=
e^-600``, while every term that underflows is below ``2^-1074``; the absolute error of
``n`` such terms, relative to ``S``, is below ``n * 1e-63``. All terms are non-negative, so
the BLAS sum has the usual relative rounding error. No entry is dropped, whatever the
weights' dynamic range.

Which regime does what:

* ``reg`` large enough that the whole axis's exponent range is at most 600 (every
  ``reg >= extent_k^2 / 600``; for a unit square at ``reg = 1e-3 x`` the squared diameter,
  the range is 500): ``J = 1``, one ``(M x n_in) @ (n_in x n_out)`` BLAS product per axis
  plus one ``exp`` per input and one ``log`` per output entry;
* smaller ``reg``: ``J`` blocks (32 for a 512-point axis at ``1e-4 x`` the squared
  diameter of a square), still one BLAS call per output block with the full input axis,
  plus ``J`` scalings of the input, no more transcendental functions;
* uniform axes whose kernel would exceed :data:`MAX_AXIS_KERNEL_ENTRIES` (a 1-D histogram
  of ``10^6`` bins), and the axis of a 1-D grid once it needs blocks: the banded pass
  (:class:`_BandedAxis`): blocks of about ``sqrt(reg) / 2`` of length, the exponent of each
  block pair split exactly into input and output tilts and one Gaussian block shared by all
  pairs (one BLAS product per pass), a pair skipped only when a bound shows its whole
  contribution below ``1e-20`` of a lower bound of its outputs (exact to rounding;
  ``O(N x band)``);
* other axes beyond :data:`MAX_AXIS_KERNEL_ENTRIES` (uneven coordinates): the shifted
  kernel blocks are computed when used, with the same skipping rule against the
  ``e^-600`` floor (``O(N^2)`` exponentials).

``method='logsumexp'`` computes the same quantity by an exact log-sum-exp over each axis
(``n_in`` exponentials per output entry: the reference the tests compare against).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._validation import check_choice, check_float, describe

#: Largest exponent range of the shifted 1-D kernel on one block pair: ``e^-600 = 2.6e-261``
#: keeps every stored entry, and every output's leading term, far above the underflow
#: threshold ``2.2e-308`` (see the module docstring for the error bound).
BLOCK_RANGE = 600.0

#: Largest number of entries of a stored 1-D shifted kernel (128 MiB in float64); larger
#: axes compute their kernel blocks when used.
MAX_AXIS_KERNEL_ENTRIES = 1 << 24

#: Block width of the streamed path (axes beyond :data:`MAX_AXIS_KERNEL_ENTRIES`).
STREAM_BLOCK = 2048

#: A streamed block pair is skipped when its contribution is provably below this fraction
#: of the output entry (below float64 rounding).
SKIP_FRACTION = 1e-20


def _axis(value: Any, name: str) -> np.ndarray:
    """A strictly increasing, finite, 1-D float64 axis (read-only copy)."""
    try:
        array = np.array(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a 1-D array of real coordinates; got "
                        f"{describe(value)}") from exc  # fmt: skip
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array of coordinates; got shape "
                         f"{array.shape}")  # fmt: skip
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must contain finite coordinates; got NaN or inf")
    if array.size > 1 and not np.all(np.diff(array) > 0):
        raise ValueError(f"{name} must be strictly increasing; got {array[:5]}...")
    array.setflags(write=False)
    return array


class RegularGrid:
    """The support of a histogram on a tensor-product grid: one 1-D coordinate array per
    axis, the points listed in C order.

    Point ``(i_0, ..., i_{d-1})`` is ``(axes[0][i_0], ..., axes[d-1][i_{d-1}])``.

    The axes may be uniform (:meth:`from_shape`) or any strictly increasing coordinates
    (a rectilinear grid): the squared-Euclidean kernel factorises either way.

    Parameters
    ----------
    axes : sequence of 1-D arrays
        Strictly increasing, finite coordinates of each axis.

    Examples
    --------
    >>> grid = RegularGrid.from_shape((3, 4), extent=1.0)   # POT's linspace(0, 1, n)
    >>> grid.shape, grid.size
    ((3, 4), 12)
    >>> grid.points()[:2]
    array([[0.        , 0.        ],
           [0.        , 0.33333333]])
    """

    def __init__(self, axes: Sequence[Any]):
        if isinstance(axes, np.ndarray) and axes.ndim == 1:
            axes = [axes]
        try:
            axes = list(axes)
        except TypeError as exc:
            raise TypeError(f"axes must be a sequence of 1-D coordinate arrays; got "
                            f"{describe(axes)}") from exc  # fmt: skip
        if not axes:
            raise ValueError("axes must hold at least one 1-D coordinate array; got none")
        self.axes = tuple(_axis(a, f"axes[{k}]") for k, a in enumerate(axes))

    @classmethod
    def from_shape(
        cls,
        shape: int | Sequence[int],
        spacing: float | Sequence[float] | None = None,
        *,
        extent: float | Sequence[float] | None = None,
        origin: float | Sequence[float] = 0.0,
    ) -> RegularGrid:
        """A uniform grid of ``shape`` points.

        Parameters
        ----------
        shape : int or sequence of int
            Points per axis.
        spacing : float or sequence of float, optional
            Distance between neighbours on each axis (default 1: pixel units).
        extent : float or sequence of float, optional
            Instead of ``spacing``: the length each axis spans, first to last point
            (``extent=1`` gives POT's ``np.linspace(0, 1, n)`` axes).
        origin : float or sequence of float
            The first point's coordinates.
        """
        shape = (shape,) if isinstance(shape, int | np.integer) else tuple(shape)
        if not shape or any(isinstance(n, bool) or not isinstance(n, int | np.integer)
                            or n < 1 for n in shape):  # fmt: skip
            raise ValueError(f"shape must be positive integers; got {shape!r}")
        d = len(shape)

        def per_axis(value: Any, name: str) -> list[float]:
            values = np.broadcast_to(np.asarray(value, dtype=np.float64), (d,))
            return [check_float(float(v), name) for v in values]

        if spacing is not None and extent is not None:
            raise ValueError("pass spacing or extent, not both")
        origin = per_axis(origin, "origin")
        if extent is not None:
            ext = per_axis(extent, "extent")
            if any(e <= 0 for e in ext):
                raise ValueError(f"extent must be > 0 on every axis; got {ext}")
            steps = [e / (n - 1) if n > 1 else 1.0 for e, n in zip(ext, shape, strict=True)]
        else:
            steps = per_axis(1.0 if spacing is None else spacing, "spacing")
            if any(s <= 0 for s in steps):
                raise ValueError(f"spacing must be > 0 on every axis; got {steps}")
        return cls([o + s * np.arange(n) for o, s, n in zip(origin, steps, shape, strict=True)])

    @classmethod
    def from_points(cls, X: Any, name: str = "X") -> tuple[RegularGrid, np.ndarray]:
        """The grid whose points are the rows of ``X`` in some order.

        Returns ``(grid, order)`` with ``X[order] == grid.points()`` exactly. Raises
        ``ValueError`` naming ``name`` when the rows are not a full tensor-product grid
        (each point exactly once).
        """
        X = np.asarray(X, dtype=np.float64)
        if X.ndim == 1:
            X = X[:, None]
        if X.ndim != 2 or X.shape[0] == 0:
            raise ValueError(f"{name} must be an (n, d) array of points; got shape {X.shape}")
        ordered = _c_order_grid(X)
        if ordered is not None:  # the common case (a grid's own points()): no sort
            return ordered, np.arange(X.shape[0])
        axes = [np.unique(X[:, k]) for k in range(X.shape[1])]
        size = math.prod(len(a) for a in axes)
        if size != X.shape[0]:
            raise ValueError(
                f"{name} is not a tensor-product grid: its {X.shape[0]} points have "
                f"{'x'.join(str(len(a)) for a in axes)} = {size} distinct axis "
                "coordinate combinations"
            )
        order = np.lexsort(X.T[::-1])
        index = [np.searchsorted(a, X[order, k]) for k, a in enumerate(axes)]
        flat = np.ravel_multi_index(index, tuple(len(a) for a in axes))
        if not np.array_equal(flat, np.arange(size)):
            raise ValueError(f"{name} is not a tensor-product grid: some grid points are "
                             "missing and others repeated")  # fmt: skip
        return cls(axes), order

    @property
    def shape(self) -> tuple[int, ...]:
        """Points per axis."""
        return tuple(len(a) for a in self.axes)

    @property
    def ndim(self) -> int:
        """Number of axes."""
        return len(self.axes)

    @property
    def size(self) -> int:
        """Number of points ``N``, the product of the axes' lengths."""
        return math.prod(self.shape)

    @property
    def squared_diameter(self) -> float:
        """Largest squared distance between two points: the sum of squared axis extents."""
        return float(sum((a[-1] - a[0]) ** 2 for a in self.axes))

    def points(self) -> np.ndarray:
        """The ``(N, d)`` coordinates in C order (the order of a histogram's ``ravel()``)."""
        mesh = np.meshgrid(*self.axes, indexing="ij")
        return np.stack([m.ravel() for m in mesh], axis=1)

    def same_as(self, other: RegularGrid) -> bool:
        """Whether ``other`` has the same axes, value for value."""
        return self is other or (
            isinstance(other, RegularGrid)
            and self.shape == other.shape
            and all(np.array_equal(a, b) for a, b in zip(self.axes, other.axes, strict=True))
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RegularGrid) and self.same_as(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RegularGrid(shape={self.shape})"


def _c_order_grid(X: np.ndarray) -> RegularGrid | None:
    """The grid whose points in C order are exactly the rows of ``X``, or ``None``:
    ``O(N d)`` (the shape read from where the leading coordinates first change, then every
    point compared)."""
    N, d = X.shape
    shape: list[int] = []
    stride = 1
    for k in range(d - 1, -1, -1):
        if k == 0:
            n = N // stride
        else:
            # the points one stride apart keep their leading coordinates for n_k steps
            lead = X[::stride, :k]
            changed = np.flatnonzero((lead[1:] != lead[0]).any(axis=1))
            n = int(changed[0]) + 1 if changed.size else lead.shape[0]
        shape.insert(0, n)
        stride *= n
    if stride != N:
        return None
    axes = []
    stride = 1
    for k in range(d - 1, -1, -1):
        axis = X[::stride, k][: shape[k]]
        if not (np.all(np.isfinite(axis)) and np.all(np.diff(axis) > 0)):
            return None
        axes.insert(0, axis)
        stride *= shape[k]
    grid = RegularGrid(axes)
    return grid if np.array_equal(grid.points(), X) else None


def check_grid(value: Any, name: str) -> RegularGrid:
    """``value`` if it is a :class:`RegularGrid`, else a ``TypeError`` naming ``name``."""
    if not isinstance(value, RegularGrid):
        raise TypeError(f"{name} must be a sketchot.RegularGrid; got {describe(value)}")
    return value


def _blocks(n: int, count: int) -> np.ndarray:
    """Start indices of ``count`` contiguous, near-equal blocks of ``range(n)``, plus ``n``."""
    return np.linspace(0, n, min(count, n) + 1).round().astype(np.intp)


def _pair_ranges(s: np.ndarray, t: np.ndarray, sb: np.ndarray, tb: np.ndarray, reg: float):
    """``(kappa, spread)`` of ``-(t - s)^2 / reg`` on each block pair (input ``b``, output
    ``c``): its largest value and its range."""
    s_lo, s_hi = s[sb[:-1]], s[sb[1:] - 1]
    t_lo, t_hi = t[tb[:-1]], t[tb[1:] - 1]
    lo = t_lo[None, :] - s_hi[:, None]  # smallest t - s on the pair
    hi = t_hi[None, :] - s_lo[:, None]
    far = np.maximum(lo * lo, hi * hi)
    near = np.where((lo <= 0) & (hi >= 0), 0.0, np.minimum(lo * lo, hi * hi))
    return -near / reg, (far - near) / reg


@dataclass
class _AxisKernel:
    """The shifted 1-D kernel of one axis, source coordinates ``s`` to target ``t``."""

    s: np.ndarray
    t: np.ndarray
    reg: float
    s_blocks: np.ndarray  # block starts on the source axis, plus n_in
    t_blocks: np.ndarray
    kappa: np.ndarray  # (J_in, J_out) largest exponent of each block pair
    matrix: np.ndarray | None  # (n_in, n_out) shifted kernel, or None when streamed
    banded: _BandedAxis | None = None  # uniform axes too long to store

    @classmethod
    def build(cls, s: np.ndarray, t: np.ndarray, reg: float, alone: bool = False) -> _AxisKernel:
        """The axis kernel; ``alone``: the grid's only axis (its passes have a row or a few,
        where the banded pass beats the stored one's block loop once the axis needs blocks)."""
        storable = s.size * t.size <= MAX_AXIS_KERNEL_ENTRIES
        stored = storable
        if alone and stored:
            lo, hi = min(s[0], t[0]), max(s[-1], t[-1])
            stored = (hi - lo) ** 2 / reg <= BLOCK_RANGE  # one block: a single BLAS product
        if not stored:
            banded = _BandedAxis.build(s, t, reg)
            stored = storable  # not uniform: stored (blocks) or streamed as it fits
            if banded is not None:
                one = np.array([0, 1])
                return cls(s, t, reg, one, one, np.zeros((1, 1)), None, banded)
        count = 1
        while True:
            sb, tb = _blocks(s.size, count), _blocks(t.size, count)
            if not stored:  # streamed: blocks no wider than STREAM_BLOCK too
                width = max(-(-s.size // STREAM_BLOCK), -(-t.size // STREAM_BLOCK), count)
                sb, tb = _blocks(s.size, width), _blocks(t.size, width)
            kappa, spread = _pair_ranges(s, t, sb, tb, reg)
            single = (np.diff(sb) <= 1).all() and (np.diff(tb) <= 1).all()
            if spread.max() <= BLOCK_RANGE or single:
                break
            count *= 2
        matrix = None
        if stored:
            matrix = cls._block(s, t, reg, sb, tb, kappa, slice(None), slice(None))
        return cls(s, t, reg, sb, tb, kappa, matrix)

    @staticmethod
    def _block(s, t, reg, sb, tb, kappa, rows: slice, cols: slice) -> np.ndarray:
        """``exp(-(t_i - s_j)^2 / reg - kappa[b(j), c(i)])`` for ``j`` in ``rows``, ``i`` in
        ``cols`` (shape ``(len(rows), len(cols))``)."""
        j = np.arange(s.size)[rows]
        i = np.arange(t.size)[cols]
        b = np.searchsorted(sb, j, side="right") - 1
        c = np.searchsorted(tb, i, side="right") - 1
        diff = t[i][None, :] - s[j][:, None]
        return np.exp(-(diff * diff) / reg - kappa[b][:, c])

    def transpose(self) -> _AxisKernel:
        """The kernel from ``t`` to ``s`` (the same matrix, transposed: no copy)."""
        return _AxisKernel(
            self.t, self.s, self.reg, self.t_blocks, self.s_blocks, self.kappa.T,
            None if self.matrix is None else self.matrix.T,
            None if self.banded is None else self.banded.transpose(),
        )  # fmt: skip

    def apply(self, X: np.ndarray) -> np.ndarray:
        """``out[p, i, q] = log sum_j exp(X[p, j, q] - (t_i - s_j)^2 / reg)`` for ``X`` of
        shape ``(P, n_in, Q)`` (finite or ``-inf``): the axis pass along the middle axis of a
        C-contiguous grid array, with no transposed copy (``Q == 1``: ``E @ K``; else
        ``K^T @ E``, one BLAS call per leading index)."""
        if self.banded is not None:
            return self.banded.apply(X)
        sb, tb = self.s_blocks, self.t_blocks
        sizes = np.diff(sb)
        single_in = len(sizes) == 1
        mu = np.maximum.reduceat(X, sb[:-1], axis=1) if not single_in else X.max(1, keepdims=True)
        finite_mu = np.isfinite(mu)  # (P, J_in, Q)
        mu0 = np.where(finite_mu, mu, 0.0)
        # one block: a broadcast shift, no repeated copy
        E = X - (mu0 if single_in else np.repeat(mu0, sizes, axis=1))
        np.exp(E, out=E)  # -inf entries give 0
        n_out = len(tb) - 1
        out = None if n_out == 1 else np.empty((X.shape[0], self.t.size, X.shape[2]))
        for c in range(n_out):
            cols = slice(tb[c], tb[c + 1])
            shift = np.where(finite_mu, mu0 + self.kappa[None, :, c, None], -np.inf)
            sigma = shift.max(axis=1, keepdims=True)  # (P, 1, Q)
            live = np.isfinite(sigma)
            sigma0 = np.where(live, sigma, 0.0)
            weight = np.exp(shift - sigma0)  # in [0, 1], 1 at the leading pair
            if self.matrix is not None:
                if single_in:  # the weight is 1 on live rows (the others are set below)
                    S = _contract(E, self.matrix[:, cols])
                else:
                    # pairs whose weight underflows to 0 everywhere add exactly nothing
                    used = np.flatnonzero(weight.any(axis=(0, 2)))
                    lo, hi = (used[0], used[-1] + 1) if used.size else (0, 1)
                    rows = slice(sb[lo], sb[hi])
                    scaled = E[:, rows] * np.repeat(weight[:, lo:hi], sizes[lo:hi], axis=1)
                    S = _contract(scaled, self.matrix[rows, cols])
            else:
                S = self._streamed(E, weight, c, cols)
            with np.errstate(divide="ignore"):
                res = np.log(S, out=S)
            res += sigma0
            if not live.all():
                res[np.broadcast_to(~live, res.shape)] = -np.inf
            if out is None:
                return res
            out[:, cols] = res
        return out

    def _streamed(self, E: np.ndarray, weight: np.ndarray, c: int, cols: slice) -> np.ndarray:
        """The product for output block ``c`` with kernel blocks computed here, skipping the
        pairs whose whole contribution is below :data:`SKIP_FRACTION` of the leading pair's
        lower bound ``e^-BLOCK_RANGE``."""
        sb = self.s_blocks
        sizes = np.diff(sb)
        # a pair contributes at most size_b * weight; the output is at least e^-BLOCK_RANGE
        bound = weight * sizes[None, :, None]
        floor = SKIP_FRACTION * math.exp(-BLOCK_RANGE)
        keep = np.flatnonzero((bound >= floor).any(axis=(0, 2)))
        S = np.zeros((E.shape[0], cols.stop - cols.start, E.shape[2]))
        for b in keep:
            rows = slice(sb[b], sb[b + 1])
            block = self._block(self.s, self.t, self.reg, sb, self.t_blocks, self.kappa,
                                rows, cols)  # fmt: skip
            S += _contract(E[:, rows] * weight[:, b : b + 1], block)
        return S


class _BandedAxis:
    """The 1-D kernel between two uniform axes of the same spacing ``h`` too long to store
    (a histogram of ``10^6`` bins), applied block pair by block pair, only the pairs that can
    matter.

    Both axes are cut into blocks of ``w`` points (about ``sqrt(reg) / (2 h)``; the last
    padded with zero mass). On the pair of input block ``b`` and output block ``c`` (offset
    ``o = c - b``, block starts ``D_o = t_0 - s_0 + o w h`` apart) the exponent splits
    exactly::

        -(t_i - s_j)^2 / reg = -D_o^2 / reg - beta_o u + beta_o v - (u - v)^2 h^2 / reg,

    ``beta_o = 2 D_o h / reg``, ``u`` and ``v`` the positions in the blocks: the input is
    tilted by ``beta_o v`` and shifted by its maximum (entries in ``[0, 1]``), multiplied by
    the one ``w x w`` Gaussian block ``G = exp(-(u - v)^2 h^2 / reg)`` (entries in
    ``[e^-(w h)^2 / reg, 1]``: every pair's leading term far above underflow, whatever its
    distance), and the tilt ``-beta_o u`` and the shifts go back in the log domain. All pairs
    share ``G``: one BLAS product per pass; the pairs of an output block are summed by a
    log-sum-exp.

    Which pairs: with ``mu_b`` the block maxima and ``kappa_o`` the pair's largest exponent,
    ``sigma_c = max_b mu_b + kappa_o``; the leading pair holds an entry ``e^(sigma_c -
    spread)`` (``spread`` the pair's exponent range), a lower bound of every output of ``c``;
    a pair whose whole contribution, at most ``w e^(mu_b + kappa_o)``, is below
    :data:`SKIP_FRACTION` of it is skipped, so what is dropped is below float64 rounding of
    every output: the pass is exact to rounding and costs ``O(N x band)``, the band the pairs
    that can matter (found by bisection, :meth:`_pairs`).
    """

    def __init__(self, s0: float, t0: float, steps: tuple[float, float], sizes: tuple[int, int],
                 reg: float, widths: tuple[int, int]) -> None:  # fmt: skip
        self.s0, self.t0, self.reg = s0, t0, reg
        (self.h_in, self.h_out), (self.n_in, self.n_out) = steps, sizes
        (self.w_in, self.w_out) = widths
        # both blocks span the same length: the pair (b, c) depends on c - b only
        self.length = self.w_in * self.h_in
        self.j_in, self.j_out = -(-self.n_in // self.w_in), -(-self.n_out // self.w_out)
        # offsets o = c - b from -(j_in - 1) to j_out - 1: the range of t - s on each pair
        o = np.arange(-(self.j_in - 1), self.j_out)
        self.start = (t0 - s0) + o * self.length  # D_o
        lo = self.start - (self.w_in - 1) * self.h_in
        hi = self.start + (self.w_out - 1) * self.h_out
        near = np.where((lo <= 0) & (hi >= 0), 0.0, np.minimum(lo * lo, hi * hi))
        self.kappa = -near / reg
        self.spread = (np.maximum(lo * lo, hi * hi) - near) / reg
        v, u = np.arange(self.w_in) * self.h_in, np.arange(self.w_out) * self.h_out
        self.gauss = np.exp(-((u[None, :] - v[:, None]) ** 2) / reg)  # (w_in, w_out)

    @classmethod
    def build(cls, s: np.ndarray, t: np.ndarray, reg: float) -> _BandedAxis | None:
        """The banded kernel when ``s`` and ``t`` are uniform with one spacing (to rounding
        of their coordinates), else ``None``."""
        if s.size < 2 or t.size < 2:
            return None
        steps = [(a[-1] - a[0]) / (a.size - 1) for a in (s, t)]
        scale = 16 * np.finfo(float).eps * max(np.abs(s).max(), np.abs(t).max(), *steps)
        for axis, h in zip((s, t), steps, strict=True):
            if np.abs(axis - (axis[0] + h * np.arange(axis.size))).max() > scale:
                return None
        # spacings in an integer ratio r (a grid and its halving: 2): blocks of w and r w
        # points, the same length (pair (b, c) depends on c - b only)
        ratio = max(steps) / min(steps)
        r = round(ratio)
        if abs(ratio - r) > 64 * np.finfo(float).eps * ratio:
            return None
        width = int(np.clip(math.sqrt(reg) / (2 * max(steps)), 1, STREAM_BLOCK))
        if steps[0] >= steps[1]:
            widths, h_in, h_out = (width, width * r), steps[0], steps[0] / r
        else:
            widths, h_in, h_out = (width * r, width), steps[1] / r, steps[1]
        return cls(float(s[0]), float(t[0]), (h_in, h_out), (s.size, t.size), reg, widths)

    def transpose(self) -> _BandedAxis:
        """The kernel from ``t`` to ``s``."""
        return _BandedAxis(self.t0, self.s0, (self.h_out, self.h_in), (self.n_out, self.n_in),
                           self.reg, (self.w_out, self.w_in))  # fmt: skip

    def apply(self, X: np.ndarray) -> np.ndarray:
        """The pass for ``X`` of shape ``(P, n_in, Q)``, one row ``X[p, :, q]`` at a time."""
        P, _, Q = X.shape
        out = np.empty((P, self.n_out, Q))
        for p in range(P):
            for q in range(Q):
                out[p, :, q] = self._row(X[p, :, q])
        return out

    def _row(self, x: np.ndarray) -> np.ndarray:
        w, j_in, j_out = self.w_in, self.j_in, self.j_out
        padded = np.full(j_in * w, -np.inf)
        padded[: self.n_in] = x
        blocks = padded.reshape(j_in, w)
        mu = blocks.max(axis=1)
        live = np.isfinite(mu)
        if not live.any():
            return np.full(self.n_out, -np.inf)
        cs, bs, shift = self._pairs(mu, live)
        index = cs - bs + j_in - 1
        # sigma_c (the leading pair, which the search keeps); the final test on its range
        sigma = np.full(j_out, -np.inf)
        np.maximum.at(sigma, cs, shift)
        lead_spread = np.zeros(j_out)
        lead = shift == sigma[cs]
        np.maximum.at(lead_spread, cs[lead], self.spread[index[lead]])
        keep = shift - sigma[cs] + lead_spread[cs] >= math.log(SKIP_FRACTION) - math.log(w)
        order = np.argsort(cs[keep], kind="stable")
        cs, bs, index = cs[keep][order], bs[keep][order], index[keep][order]
        # the tilted, shifted inputs of every pair, one product with the Gaussian block
        k = np.arange(w)
        beta = 2.0 * self.start[index] / self.reg
        tilted = blocks[bs] + (beta * self.h_in)[:, None] * k[None, :]
        top = tilted.max(axis=1)
        np.exp(tilted - top[:, None], out=tilted)  # -inf entries give 0
        logs = tilted @ self.gauss
        with np.errstate(divide="ignore"):
            np.log(logs, out=logs)
        u = np.arange(self.w_out) * self.h_out
        logs += (top - self.start[index] ** 2 / self.reg)[:, None] - beta[:, None] * u[None, :]
        # log-sum-exp over the pairs of each output block
        starts = np.flatnonzero(np.r_[True, np.diff(cs) > 0])
        peak = np.maximum.reduceat(logs, starts, axis=0)
        np.exp(logs - np.repeat(peak, np.diff(np.r_[starts, cs.size]), axis=0), out=logs)
        sums = np.add.reduceat(logs, starts, axis=0)
        out = np.full((j_out, self.w_out), -np.inf)
        with np.errstate(divide="ignore"):
            out[cs[starts]] = np.log(sums) + peak
        return out.ravel()[: self.n_out]

    def _pairs(self, mu: np.ndarray, live: np.ndarray):
        """``(c, b, mu_b + kappa_(c-b))`` of every pair within the skip floor of a lower
        bound of its output block, found by bisecting ``b``'s range with range-maximum
        bounds (a sparse table of ``mu``): ``O(pairs x log J)``, not ``J_in x J_out``."""
        w, j_in, j_out = self.w_in, self.j_in, self.j_out
        kappa, spread = self.kappa, self.spread
        peak = int(np.argmax(kappa)) - (j_in - 1)  # the offset of the nearest pairs
        c = np.arange(j_out)
        # lower bound of every output of c: a pair near the peak or the nearest live blocks
        live_at = np.flatnonzero(live)
        at = np.searchsorted(live_at, np.clip(c - peak, 0, j_in - 1))
        candidates = [c - peak + k for k in (-2, -1, 0, 1, 2)]
        candidates += [live_at[np.clip(at, 0, live_at.size - 1)],
                       live_at[np.clip(at - 1, 0, live_at.size - 1)]]  # fmt: skip
        candidates.append(self._leaders(mu, live))
        low = np.full(j_out, -np.inf)
        for b in candidates:
            ok = (b >= 0) & (b < j_in)
            bb = np.where(ok, b, 0)
            o = c - bb + j_in - 1
            value = np.where(ok & live[bb], mu[bb] + kappa[o] - spread[o], -np.inf)
            low = np.maximum(low, value)
        threshold = low + math.log(SKIP_FRACTION) - math.log(w)
        # sparse table: table[k][i] = max(mu[i : i + 2^k])
        table = [np.where(live, mu, -np.inf)]
        while (1 << len(table)) <= j_in:
            prev, half = table[-1], 1 << (len(table) - 1)
            table.append(np.maximum(prev[:-half], prev[half:]))
        C, lo, hi = c, np.zeros(j_out, dtype=np.intp), np.full(j_out, j_in - 1, dtype=np.intp)
        found_c, found_b = [], []
        while C.size:
            length = hi - lo + 1
            k = np.floor(np.log2(length)).astype(np.intp)
            top = np.empty(C.size)
            for level in np.unique(k):
                sel = k == level
                t = table[level]
                top[sel] = np.maximum(t[lo[sel]], t[hi[sel] - (1 << level) + 1])
            # the largest kappa over offsets c - hi .. c - lo: at the one nearest the peak
            o = np.clip(peak, C - hi, C - lo)
            bound = top + kappa[o + j_in - 1]
            keep = bound >= threshold[C]
            C, lo, hi, length = C[keep], lo[keep], hi[keep], length[keep]
            single = length == 1
            found_c.append(C[single])
            found_b.append(lo[single])
            C, lo, hi = C[~single], lo[~single], hi[~single]
            mid = (lo + hi) // 2
            C, lo, hi = (
                np.concatenate([C, C]),
                np.concatenate([lo, mid + 1]),
                np.concatenate([mid, hi]),
            )
        cs, bs = np.concatenate(found_c), np.concatenate(found_b)
        return cs, bs, mu[bs] + kappa[cs - bs + j_in - 1]

    def _leaders(self, mu: np.ndarray, live: np.ndarray) -> np.ndarray:
        """For every output block ``c``, the input block ``b`` maximising ``mu_b - (t_c -
        s_b)^2 / reg`` between block starts (the lower envelope of parabolas of
        Felzenszwalb and Huttenlocher, ``O(J)``): a near-leading pair, whose entries bound
        the output below."""
        alpha = self.length**2 / self.reg
        # maximise mu_b - alpha (p - b)^2 at p = c + (t_0 - s_0) / (w h): minimise f_b + (p - b)^2
        bs = np.flatnonzero(live)
        f = -mu[bs] / alpha
        v = np.empty(bs.size, dtype=np.intp)  # envelope's parabolas (indices into bs)
        z = np.empty(bs.size + 1)  # their boundaries
        k = 0
        v[0], z[0], z[1] = 0, -np.inf, np.inf
        for q in range(1, bs.size):
            while True:
                r = v[k]
                cross = ((f[q] + bs[q] ** 2) - (f[r] + bs[r] ** 2)) / (2.0 * (bs[q] - bs[r]))
                if cross <= z[k] and k > 0:
                    k -= 1
                    continue
                break
            if cross <= z[k]:  # k == 0: q replaces the first parabola
                v[0] = q
                z[1] = np.inf
                continue
            k += 1
            v[k], z[k], z[k + 1] = q, cross, np.inf
        points = np.arange(self.j_out) + (self.t0 - self.s0) / self.length
        which = np.searchsorted(z[1 : k + 1], points, side="left")
        return bs[v[which]]


def _contract(E: np.ndarray, K: np.ndarray) -> np.ndarray:
    """``out[p, i, q] = sum_j E[p, j, q] K[j, i]`` as BLAS products without copying ``E``."""
    P, n, Q = E.shape
    if Q == 1:
        return (E.reshape(P, n) @ K).reshape(P, K.shape[1], 1)
    return np.matmul(K.T, E)


def _axis_logsumexp(X: np.ndarray, s: np.ndarray, t: np.ndarray, reg: float) -> np.ndarray:
    """Reference: the exact log-sum-exp over one axis (``X`` of shape ``(M, n_in)``)."""
    from scipy.special import logsumexp

    L = -((t[:, None] - s[None, :]) ** 2) / reg  # (n_out, n_in)
    out = np.empty((X.shape[0], t.size))
    step = max(1, (1 << 22) // max(1, t.size * s.size))
    for m0 in range(0, X.shape[0], step):
        chunk = X[m0 : m0 + step, None, :] + L[None, :, :]
        out[m0 : m0 + step] = logsumexp(chunk, axis=2)
    return out


class GridConvolution:
    """The Gibbs kernel ``exp(-|x - y|^2 / reg)`` from a source grid to a target grid, held
    as its shifted 1-D kernels (built once, reused by every product).

    Parameters
    ----------
    source, target : RegularGrid
        Grids of the same dimension.
    reg : float
        Entropic regularisation (> 0), in squared coordinate units.
    """

    def __init__(self, source: RegularGrid, target: RegularGrid, reg: float):
        self.source = check_grid(source, "source_grid")
        self.target = check_grid(target, "target_grid")
        self.reg = check_float(reg, "reg", positive=True)
        if source.ndim != target.ndim:
            raise ValueError(f"source_grid and target_grid must have the same number of axes;"
                             f" got {source.ndim} and {target.ndim}")  # fmt: skip
        alone = source.ndim == 1
        self._axes = [_AxisKernel.build(s, t, self.reg, alone)
                      for s, t in zip(source.axes, target.axes, strict=True)]  # fmt: skip
        self._transposed: list[_AxisKernel] | None = None

    def log_apply(self, log_w: Any, *, method: str = "blas") -> np.ndarray:
        """``log sum_j exp(-|x_i - y_j|^2 / reg + log_w[j])`` on the target grid; ``log_w``
        of shape ``(..., *source.shape)`` (leading axes: several histograms)."""
        return self._run(log_w, self.source, self.target, self._axes, method, False)

    def log_apply_transpose(self, log_v: Any, *, method: str = "blas") -> np.ndarray:
        """The transposed product: from the target grid back to the source grid."""
        if self._transposed is None:
            self._transposed = [a.transpose() for a in self._axes]
        return self._run(log_v, self.target, self.source, self._transposed, method, True)

    def _run(self, log_w, src, dst, kernels, method, transposed, check=True) -> np.ndarray:
        method = check_choice(method, "method", ("blas", "logsumexp"))
        name = "log_v" if transposed else "log_w"
        array = _check_log_weights(log_w, name, src.shape) if check else log_w
        lead = array.shape[: array.ndim - src.ndim]
        current = np.ascontiguousarray(array).reshape((-1, *src.shape))
        for k in range(src.ndim):
            # (histograms x axes before k, axis k, axes after k): C-contiguous, no copy
            shape = current.shape
            pre, post = math.prod(shape[: k + 1]), math.prod(shape[k + 2 :])
            X = current.reshape(pre, shape[k + 1], post)
            if method == "blas":
                done = kernels[k].apply(X)
            else:
                moved = np.moveaxis(X, 1, -1).reshape(-1, shape[k + 1])
                flat = _axis_logsumexp(moved, src.axes[k], dst.axes[k], self.reg)
                done = np.moveaxis(flat.reshape(pre, post, -1), -1, 1)
            current = np.ascontiguousarray(done).reshape(*shape[: k + 1], dst.shape[k],
                                                         *shape[k + 2 :])  # fmt: skip
        return current.reshape(*lead, *dst.shape)


def _check_log_weights(value: Any, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """Float64 log-weights of trailing shape ``shape``: finite or ``-inf``."""
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a real array; got {describe(value)}") from exc
    if array.shape[array.ndim - len(shape) :] != shape or array.ndim < len(shape):
        raise ValueError(f"{name} must have trailing shape {shape} (the source grid's); got "
                         f"shape {array.shape}")  # fmt: skip
    if not (array < np.inf).all():  # one pass: NaN and +inf compare False
        raise ValueError(f"{name} must be finite or -inf (zero mass); got NaN or +inf")
    return array


_CACHE: OrderedDict[tuple, GridConvolution] = OrderedDict()
_CACHE_SIZE = 8


def grid_convolution(source: RegularGrid, target: RegularGrid, reg: float) -> GridConvolution:
    """A :class:`GridConvolution`, reused from a small cache of recent ``(source, target,
    reg)`` (keyed by the grids' identity, which the cache keeps alive)."""
    key = (id(source), id(target), float(reg))
    hit = _CACHE.get(key)
    if hit is not None and hit.source is source and hit.target is target:
        _CACHE.move_to_end(key)
        return hit
    conv = GridConvolution(source, target, reg)
    _CACHE[key] = conv
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return conv


def log_convolve(
    log_w: Any,
    source_grid: RegularGrid,
    target_grid: RegularGrid | None = None,
    reg: float | None = None,
    *,
    method: str = "blas",
) -> np.ndarray:
    """``log sum_j exp(-|x_i - y_j|^2 / reg + log_w[j])`` for every target point ``x_i``.

    Parameters
    ----------
    log_w : array of shape ``(..., *source_grid.shape)``
        Log-weights on the source grid; ``-inf`` is zero mass. Leading axes are independent
        histograms.
    source_grid : RegularGrid
        Grid of ``log_w``.
    target_grid : RegularGrid, optional
        Grid of the result (default: ``source_grid``).
    reg : float
        Entropic regularisation (> 0).
    method : {'blas', 'logsumexp'}
        ``'blas'`` (default): block-shifted BLAS products, exact up to rounding at every
        ``reg`` (see the module docstring); ``'logsumexp'``: an exact log-sum-exp per axis
        (slow; the reference).

    Returns
    -------
    numpy.ndarray of shape ``(..., *target_grid.shape)``, float64.
    """
    if reg is None:
        raise TypeError("log_convolve() needs reg (> 0)")
    target_grid = source_grid if target_grid is None else target_grid
    check_grid(source_grid, "source_grid")
    check_grid(target_grid, "target_grid")
    return grid_convolution(source_grid, target_grid, reg).log_apply(log_w, method=method)


def grid_clouds(X: Any, Y: Any) -> bool:
    """Whether ``X`` and ``Y`` are both full tensor-product grids (rows in any order) of the
    same dimension: ``O(N log N)``, no timing (what ``'auto'`` reads)."""
    if not isinstance(X, np.ndarray) or not isinstance(Y, np.ndarray):
        return False
    if X.ndim != 2 or Y.ndim != 2 or X.shape[1] != Y.shape[1] or min(len(X), len(Y)) < 2:
        return False
    for points in (X, Y):
        if _c_order_grid(np.asarray(points, dtype=np.float64)) is not None:
            continue  # a grid in C order: O(N d)
        # the cheap refusal first: a grid has as many points as axis-value combinations
        if math.prod(np.unique(points[:, k]).size for k in range(points.shape[1])) != len(points):
            return False
        try:
            RegularGrid.from_points(points)
        except ValueError:
            return False
    return True
