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
  pairs (low rank for long blocks), a pair skipped only when bounds from the input's own
  tilted maxima show its contribution below ``1e-20`` of every output's lower bound (exact
  to rounding; ``O(N x band)``, every row of a pass at once);
* other axes beyond :data:`MAX_AXIS_KERNEL_ENTRIES` (uneven coordinates): the shifted
  kernel blocks are computed when used, with the same skipping rule against the
  ``e^-600`` floor (``O(N^2)`` exponentials).

``method='logsumexp'`` computes the same quantity by an exact log-sum-exp over each axis
(``n_in`` exponentials per output entry: the reference the tests compare against).
"""

from __future__ import annotations

import itertools
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

#: Fewest points per block of the banded pass when the kernel is only a few points wide (its
#: per-pair bookkeeping then outweighs the products: see :class:`_BandedAxis`).
MIN_BAND_BLOCK = 16

#: Entries of work arrays per chunk of the banded pass's block pairs (32 MiB in float64).
BANDED_CHUNK = 1 << 22

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
    """The 1-D kernel between two uniform axes (spacings in an integer ratio) too long to
    store (a histogram of ``10^6`` bins), applied block pair by block pair, only the pairs
    that can matter, every row of a pass at once.

    Both axes are cut into blocks of one length ``L`` (``w`` points: about ``sqrt(reg) /
    (2 h)``, at least :data:`MIN_BAND_BLOCK` while ``L^2 / reg <= 100``; the last padded with
    zero mass). On the pair of input block ``b`` and output block ``c`` (offset ``o = c - b``,
    block starts ``D_o = t_0 - s_0 + o L`` apart) the exponent splits exactly::

        -(t_i - s_j)^2 / reg = -D_o^2 / reg - beta_o u + beta_o v - (u - v)^2 / reg,

    ``beta_o = 2 D_o / reg``, ``u`` and ``v`` the positions in the blocks: the input is
    tilted by ``beta_o v`` and shifted by its maximum ``top`` (entries in ``[0, 1]``, one of
    them 1), multiplied by the one Gaussian block ``G = exp(-(u - v)^2 / reg)`` (entries in
    ``[e^-gauss_floor, 1]``, ``gauss_floor <= 100``: every pair's leading term far above
    underflow, whatever its distance; for long blocks the low-rank form of
    :func:`_gauss_factors`), and the tilt and the shifts go back in the log domain
    (:meth:`_sum_pairs`: one matrix product per chunk of output blocks).

    Which pairs (bounds from the potentials themselves, every one certified):

    1. :meth:`_candidates`: with ``mu_b`` the block maxima and ``kappa_o`` the pair's largest
       exponent, a pair adds at most ``w e^(mu_b + kappa_o)`` to any output; it is kept when
       that reaches ``SKIP_FRACTION / j_in`` of a lower bound of its block's outputs
       (:meth:`_lows`), found by descending a tree of range maxima of ``mu``;
    2. :meth:`_tight`: each candidate's exact tilted maximum ``top`` bounds its contribution
       to output ``u`` by ``w e^(at0 - beta u)`` (``at0 = top - D^2 / reg``), a line in
       ``u``, and the leading pair of the block bounds the output below by ``e^(at0_q -
       beta_q u - gauss_floor)``; the ratio of the two is checked at both ends of the block
       (its largest values), against the leading pair at either end.

    So the pairs left out add less than ``SKIP_FRACTION / j_in`` of each output each, less
    than :data:`SKIP_FRACTION` (1e-20) together: below float64 rounding, and the kernel keeps
    ``product_rtol = 0``. Mass moving far tilts the inputs by up to ``|beta| L`` across a
    block; the tilted bound follows it, where the block maximum alone (step 1) kept 2.5 times
    the pairs (73 against 29 per block on ``benchmarks/grids.py``'s 10^6 bins at reg 1e-7).
    Cost ``O(N x band)``.
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
        # every entry of G is at least e^-gauss_floor (the lower bounds of _tight)
        self.gauss_floor = max(u[-1], v[-1]) ** 2 / reg
        self.factors = _gauss_factors(v, u, reg)

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
        # blocks of sqrt(reg) / 2, at least MIN_BAND_BLOCK points while the Gaussian block's
        # smallest entry stays above e^-100 (few long blocks: less work per point)
        h, root = max(steps), math.sqrt(reg)
        width = max(root / (2 * h), min(MIN_BAND_BLOCK, 10.0 * root / h))
        width = int(np.clip(width, 1, STREAM_BLOCK))
        if ((width * r - 1) * min(steps)) ** 2 / reg > 100.0:
            return None  # a longer block's Gaussian would underflow (spacings >> sqrt(reg))
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
        """The pass for ``X`` of shape ``(P, n_in, Q)``: every row ``X[p, :, q]`` at once (the
        pairs of all rows in one list, processed in chunks of :data:`BANDED_CHUNK` entries)."""
        P, _, Q = X.shape
        rows = np.moveaxis(X, 1, 2).reshape(P * Q, self.n_in)
        out = self._rows(rows)
        return np.moveaxis(out.reshape(P, Q, self.n_out), 2, 1)

    def _rows(self, x: np.ndarray) -> np.ndarray:
        """``log sum_j exp(x[r, j] - (t_i - s_j)^2 / reg)`` for every row ``r`` of ``x``."""
        R = x.shape[0]
        blocks, pairs = self._kept_pairs(x)
        out = np.full((R * self.j_out, self.w_out), -np.inf)
        self._sum_pairs(blocks, *pairs, out)
        return out.reshape(R, self.j_out * self.w_out)[:, : self.n_out]

    def _kept_pairs(self, x: np.ndarray):
        """``(blocks, (src, beta, top, at0, group))``: the padded input cut in blocks (block
        ``b`` of row ``r`` is ``blocks[r j_in + b]``) and the block pairs that can matter,
        sorted by output block ``group = r j_out + c``: their input block ``src``, tilt
        ``beta``, tilted maximum ``top`` and exponent ``at0`` at the first output (the class
        notes). Every pair left out adds less than ``SKIP_FRACTION / j_in`` of every output
        of its block (:meth:`_candidates`, :meth:`_tight`)."""
        R = x.shape[0]
        w, j_in, j_out = self.w_in, self.j_in, self.j_out
        padded = np.full((R, j_in * w), -np.inf)
        padded[:, : self.n_in] = x
        blocks = padded.reshape(R * j_in, w)
        mu = blocks.max(axis=1).reshape(R, j_in)
        rs, cs, bs = self._candidates(mu, np.isfinite(mu))
        index = cs - bs + j_in - 1
        src = rs * j_in + bs
        beta = 2.0 * self.start[index] / self.reg
        top = self._tops(blocks, src, beta)
        # each pair's exponent at its first output, exactly split: line(u) = at0 - beta u
        at0 = top - self.start[index] ** 2 / self.reg
        group = rs * j_out + cs
        keep = self._tight(group, at0, beta) if group.size else np.zeros(0, dtype=bool)
        return blocks, (src[keep], beta[keep], top[keep], at0[keep], group[keep])

    def _candidates(self, mu: np.ndarray, live: np.ndarray):
        """``(row, c, b)`` of the pairs the block-maximum bound cannot rule out, sorted by
        ``(row, c, b)``: pair ``(b, c)`` is kept while ``w e^(mu_b + kappa_(c-b))``, a bound of
        its whole contribution, reaches ``SKIP_FRACTION / j_in`` of a lower bound of every
        output of ``c`` (:meth:`_lows`). Found by descending a tree of range maxima of ``mu``
        (node ``i`` of depth ``d`` covers blocks ``[i 2^(K-d), (i + 1) 2^(K-d))``; a node is
        opened when ``max mu`` over it plus the largest ``kappa`` of its offsets reaches the
        threshold), all rows and output blocks at once: ``O(pairs x log J)``."""
        j_in, j_out = self.j_in, self.j_out
        kappa = self.kappa
        peak = int(np.argmax(kappa)) - (j_in - 1)  # the offset of the nearest pairs
        threshold = self._lows(mu, live)
        threshold += math.log(SKIP_FRACTION) - math.log(self.w_in) - math.log(j_in)
        depth = max(0, (j_in - 1).bit_length())
        level = np.full((mu.shape[0], 1 << depth), -np.inf)
        level[:, :j_in] = np.where(live, mu, -np.inf)
        tree = [level]
        while tree[-1].shape[1] > 1:
            tree.append(np.maximum(tree[-1][:, 0::2], tree[-1][:, 1::2]))
        tree.reverse()
        rows = np.flatnonzero(live.any(axis=1))
        r = np.repeat(rows, j_out)
        c = np.tile(np.arange(j_out), rows.size)
        node = np.zeros(r.size, dtype=np.intp)
        for d in range(depth + 1):
            length = 1 << (depth - d)
            lo = node * length
            hi = np.minimum(lo + length, j_in) - 1
            offset = np.clip(peak, c - hi, c - lo)
            bound = tree[d][r, node] + kappa[offset + j_in - 1]
            keep = (lo < j_in) & (bound >= threshold[r, c]) & np.isfinite(bound)
            r, c, node = r[keep], c[keep], node[keep]
            if d < depth:  # both children, in order
                r, c = np.repeat(r, 2), np.repeat(c, 2)
                node = (2 * node[:, None] + np.arange(2)[None, :]).ravel()
        return r, c, node

    def _lows(self, mu: np.ndarray, live: np.ndarray) -> np.ndarray:
        """``(rows, j_out)`` lower bounds of every output of each block: the smallest entry
        ``mu_b + kappa_(c-b) - spread_(c-b)`` of a few pairs (near the kernel's peak, the
        nearest live blocks, the leader of :meth:`_leaders`); ``-inf`` for a dead row. All
        rows at once, in whole-array steps."""
        j_in, j_out = self.j_in, self.j_out
        kappa, spread = self.kappa, self.spread
        peak = int(np.argmax(kappa)) - (j_in - 1)
        low = np.full((mu.shape[0], j_out), -np.inf)
        rows = np.flatnonzero(live.any(axis=1))
        if not rows.size:
            return low
        m, ok_r = mu[rows], live[rows]
        c = np.arange(j_out)
        # the nearest live blocks at or after, and before, the block under the peak
        target = np.clip(c - peak, 0, j_in - 1)
        index = np.arange(j_in)
        after = np.minimum.accumulate(np.where(ok_r, index, j_in)[:, ::-1], axis=1)[:, ::-1]
        before = np.maximum.accumulate(np.where(ok_r, index, -1), axis=1)
        before = np.concatenate([np.full((rows.size, 1), -1), before[:, :-1]], axis=1)
        candidates = [np.broadcast_to(c - peak + k, (rows.size, j_out)) for k in range(-2, 3)]
        candidates += [after[:, target], before[:, target], self._leaders(m, ok_r)]
        masked = np.where(ok_r, m, -np.inf)
        out = low[rows]
        for b in candidates:
            ok = (b >= 0) & (b < j_in)
            bb = np.where(ok, b, 0)
            o = c - bb + j_in - 1
            value = np.take_along_axis(masked, bb, axis=1)
            value += kappa[o]
            value -= spread[o]
            value[~ok] = -np.inf
            np.maximum(out, value, out=out)
        low[rows] = out
        return low

    def _tops(self, blocks: np.ndarray, src: np.ndarray, beta: np.ndarray) -> np.ndarray:
        """``max_v x_b(v) + beta v h_in`` of every pair: the tilted input's maximum."""
        k = np.arange(self.w_in) * self.h_in
        top = np.empty(src.size)
        step = max(1, BANDED_CHUNK // self.w_in)
        for lo in range(0, src.size, step):
            sl = slice(lo, lo + step)
            tilted = blocks[src[sl]]
            tilted += beta[sl, None] * k[None, :]
            top[sl] = tilted.max(axis=1)
        return top

    def _tight(self, group: np.ndarray, at0: np.ndarray, beta: np.ndarray) -> np.ndarray:
        """Which candidate pairs can matter, by the tilted bounds (the class notes): pair
        ``p`` adds at most ``w_in e^(at0_p - beta_p u)`` to output ``u`` of its block, and
        the output is at least ``e^(at0_q - beta_q u - g)`` for every pair ``q`` of the block
        (``g`` :attr:`gauss_floor`); ``p`` is dropped when, against the leading pair ``q`` at
        either end of the block, the ratio is below ``SKIP_FRACTION / j_in`` at both ends
        (a ratio of exponentials linear in ``u``: its largest value is at an end)."""
        span = (self.w_out - 1) * self.h_out
        at1 = at0 - beta * span
        starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
        owner = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, group.size]))
        floor = math.log(SKIP_FRACTION) - math.log(self.j_in) - math.log(self.w_in)
        keep = np.ones(group.size, dtype=bool)
        for values in (at0, at1):
            peak = np.maximum.reduceat(values, starts)
            # the leading pair of each block at this end (the first of equal ones)
            first = np.flatnonzero(values == peak[owner])
            lead = first[np.r_[True, owner[first][1:] != owner[first][:-1]]]
            low0 = at0[lead][owner] - self.gauss_floor
            low1 = at1[lead][owner] - self.gauss_floor
            # each leading line bounds the output below: either one may rule p out
            keep &= np.maximum(at0 - low0, at1 - low1) >= floor
        return keep

    def _sum_pairs(self, blocks, src, beta, top, at0, group, out) -> None:
        """``out[g] = log sum_p e^(at0_p - beta_p u) S_p(u)`` over the pairs ``p`` of each
        output block ``g``, ``S_p = z_p G`` the tilted, shifted input ``z_p`` (entries in
        ``[0, 1]``, one of them 1) times the Gaussian block.

        The pairs of a block are weighted against its leading pair ``q`` (largest ``at0``):
        ``e^(at0_p - at0_q) e^(-(o_p - o_q) 2 L u / reg)`` (``beta`` is linear in the
        offset ``o``), a factor of the offset difference only, folded into one stacked copy
        of ``G`` per difference; the coefficients of each block (``z_p``, or its moments
        ``z_p left`` under the low-rank form :attr:`factors`) are placed by offset difference
        and the block's outputs are one row of a single matrix product. The leading pair
        alone gives at least ``e^-gauss_floor``: nothing underflows; every term is a
        product of non-negative factors (the low-rank form's signs cancel by at most
        ``e^(1/4)``): exact to a few ulps."""
        if not group.size:
            return
        k = np.arange(self.w_in) * self.h_in
        u = np.arange(self.w_out) * self.h_out
        starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
        sizes = np.diff(np.r_[starts, group.size])
        owner = np.repeat(np.arange(starts.size), sizes)
        # the leading pair of each output block (the first of equal ones)
        peak = np.maximum.reduceat(at0, starts)
        first = np.flatnonzero(at0 == peak[owner])
        lead = first[np.r_[True, owner[first][1:] != owner[first][:-1]]]
        step = 2.0 * self.length / self.reg  # beta_(o + 1) - beta_o
        delta = np.rint((beta - beta[lead][owner]) / step).astype(np.intp)
        rank = self.w_in if self.factors is None else self.factors[0].shape[1]
        right = self.gauss if self.factors is None else self.factors[1]  # (rank, w_out)
        weight = np.exp(at0 - peak[owner])
        # chunks of whole output blocks, about BANDED_CHUNK entries each
        bounds = np.r_[starts, group.size]
        per = max(self.w_in, self.w_out)
        cuts = np.searchsorted(bounds * per, np.arange(0, group.size * per, BANDED_CHUNK))
        cuts = np.unique(np.r_[cuts, bounds.size - 1])
        for c0, c1 in itertools.pairwise(cuts):
            lo, hi = bounds[c0], bounds[c1]
            sl = slice(lo, hi)
            z = blocks[src[sl]]
            z += beta[sl, None] * k[None, :]
            z -= top[sl, None]
            np.exp(z, out=z)  # -inf (no mass) gives 0
            reach = int(np.abs(delta[sl]).max())
            width = 2 * reach + 1
            # the stacked form while its tilts stay within e^600 and its zeros are few
            if reach * step * u[-1] <= 600.0 and (c1 - c0) * width <= 4 * (hi - lo):
                tilt = np.exp(-np.arange(-reach, reach + 1)[:, None] * step * u[None, :])
                stack = (tilt[:, None, :] * right[None, :, :]).reshape(width * rank, -1)
                coef = z if self.factors is None else z @ self.factors[0]
                coef *= weight[sl, None]
                local = owner[sl] - c0
                placed = np.zeros((c1 - c0, width, rank))
                placed[local, delta[sl] + reach] = coef
                sums = placed.reshape(c1 - c0, width * rank) @ stack
                shift = 0.0
            else:
                # pair by pair: each output's terms shifted by their largest log-weight
                S = (z if self.factors is None else z @ self.factors[0]) @ right
                logw = (at0[sl] - peak[owner[sl]])[:, None] - (delta[sl, None] * step) * u
                local = starts[c0:c1] - lo
                shift = np.maximum.reduceat(logw, local, axis=0)
                logw -= np.repeat(shift, sizes[c0:c1], axis=0)
                S *= np.exp(logw)
                sums = np.add.reduceat(S, local, axis=0)
            with np.errstate(divide="ignore"):
                np.log(sums, out=sums)
            q = lead[c0:c1]
            sums += (at0[q, None] - beta[q, None] * u[None, :]) + shift
            out[group[starts[c0:c1]]] = sums

    def _leaders(self, mu: np.ndarray, live: np.ndarray) -> np.ndarray:
        """``(rows, j_out)``: for every row and output block ``c``, the input block ``b``
        maximising ``mu_b - (t_c - s_b)^2 / reg`` between block starts over the row's live
        blocks: a near-leading pair, whose entries bound the output below.

        ``mu_b - alpha (p - b)^2`` has a cross term ``2 alpha p b`` increasing in both ``p``
        and ``b``, so the first maximiser never decreases with ``p`` (Topkis): each level of
        a divide and conquer solves the middle output of every open range of outputs over
        the inputs its solved neighbours leave possible, all rows and ranges in one
        whole-array step: ``O(rows x (j_in + j_out) log j_out)``."""
        R, j_in = mu.shape
        alpha = self.length**2 / self.reg
        points = np.arange(self.j_out) + (self.t0 - self.s0) / self.length
        leader = np.zeros((R, self.j_out), dtype=np.intp)
        flat = np.where(live, mu, -np.inf).ravel()
        # open ranges: row, outputs [c_lo, c_hi), inputs [b_lo, b_hi]
        row = np.arange(R)
        c_lo, c_hi = np.zeros(R, dtype=np.intp), np.full(R, self.j_out)
        b_lo, b_hi = np.zeros(R, dtype=np.intp), np.full(R, j_in - 1)
        while row.size:
            mid = (c_lo + c_hi) // 2
            counts = b_hi - b_lo + 1
            starts = np.zeros(row.size, dtype=np.intp)
            np.cumsum(counts[:-1], out=starts[1:])
            owner = np.repeat(np.arange(row.size), counts)
            shift = b_lo - starts
            b = np.arange(counts.sum()) + shift[owner]
            gap = (points[mid] + starts - b_lo)[owner] - np.arange(b.size)
            value = flat[(row * j_in + shift)[owner] + np.arange(b.size)] - alpha * gap * gap
            best = np.maximum.reduceat(value, starts)
            first = np.flatnonzero(value == best[owner])
            first = first[np.r_[True, owner[first][1:] != owner[first][:-1]]]
            chosen = b_lo.copy()  # kept by a range without live blocks (not a leader)
            chosen[owner[first]] = b[first]
            leader[row, mid] = chosen
            left, right = mid > c_lo, mid + 1 < c_hi
            row = np.r_[row[left], row[right]]
            c_lo, c_hi = np.r_[c_lo[left], mid[right] + 1], np.r_[mid[left], c_hi[right]]
            b_lo, b_hi = np.r_[b_lo[left], chosen[right]], np.r_[chosen[left], b_hi[right]]
        return leader


def _gauss_factors(v: np.ndarray, u: np.ndarray, reg: float):
    """``(left, right)`` with ``left @ right`` the Gaussian block ``exp(-(u_i - v_j)^2 / reg)``
    (rows ``v``, columns ``u``) to a relative error below ``2^-56`` per entry, or ``None`` when
    the blocks are too short for a low-rank form to save work.

    With ``p, q`` the positions from the blocks' common centre over ``sqrt(reg)``,
    ``e^-(p - q)^2 = e^-p^2 e^-q^2 sum_k (2 p q)^k / k!``; the series is cut after ``r``
    terms, its tail below ``rho^r / r! / (1 - rho)`` for ``rho = 2 max|p| max|q| <= 1/8``
    (blocks of ``sqrt(reg) / 2``), relative to ``e^-p^2 e^-q^2``, i.e. to ``e^(2 max|p q|)``
    times the entry. The terms' signs cancel by at most the same factor, so the product's
    rounding error stays a few ulps."""
    centre = 0.5 * max(u[-1], v[-1])
    p, q = (u - centre) / math.sqrt(reg), (v - centre) / math.sqrt(reg)
    rho = 2.0 * np.abs(p).max() * np.abs(q).max()
    if rho >= 0.5:
        return None
    r, term = 1, rho
    while term / (1.0 - rho) * math.exp(rho) > 2.0**-56:
        r += 1
        term *= rho / r
    if 2 * r >= min(u.size, v.size):
        return None
    k = np.arange(r)
    scale = np.sqrt(2.0**k / np.array([math.factorial(int(i)) for i in k]))
    left = np.exp(-(q**2))[:, None] * q[:, None] ** k[None, :] * scale[None, :]
    right = (np.exp(-(p**2))[:, None] * p[:, None] ** k[None, :] * scale[None, :]).T
    return np.ascontiguousarray(left), np.ascontiguousarray(right)


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
