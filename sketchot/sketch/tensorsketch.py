"""TensorSketch (Pham and Pagh 2013) and its recursion over degrees (Han et al. 2020, Alg. 2).

The degree-``k`` TensorSketch of ``u`` with hashes ``h_1..h_k`` and signs ``s_1..s_k`` is

.. math::
    T^{(k)}(u)_j = \\sum_{H(i_1, \\dots, i_k) = j} s_1(i_1) \\cdots s_k(i_k)\\,
                   u_{i_1} \\cdots u_{i_k},
    \\qquad H = h_1(i_1) + \\dots + h_k(i_k) \\bmod m,

the circular convolution of the ``k`` CountSketches ``C_1(u), ..., C_k(u)``. It is computed
with real FFTs of length ``m``: ``T^(k) = irfft(rfft(C_1) * ... * rfft(C_k), n=m)`` (``n=m``
keeps odd ``m`` exact). With the same draws on ``u`` and ``v``,
``E[<T^(k)(u), T^(k)(v)>] = <u, v>^k``.

All degrees ``1..k`` come out of one pass: the running spectral product after factor ``j``
is the spectrum of ``T^(j)``, so the sketch of every degree up to ``r`` needs ``r``
CountSketches, not ``r (r + 1) / 2``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.fft
import scipy.sparse as sp

from .._parallel import for_each
from .._validation import check_int, check_matrix, check_rng
from .countsketch import CountSketch, sketch_rows

# Rows per FFT block: large enough to amortise the per-call overhead of scipy.fft, small
# enough that the complex spectra of a block stay in cache-friendly tens of megabytes.
DEFAULT_BLOCK_ROWS = 16384

# Sketches of more entries than this are computed on several threads.
THREADED_MIN_ENTRIES = 1 << 22


class TensorSketch:
    """Degree-``k`` TensorSketch with ``k`` independent CountSketches.

    Parameters
    ----------
    input_dim, sketch_dim, rng
        As in :class:`CountSketch` (``d``, ``m``, and the source of all ``k`` hash/sign
        draws).
    degree : int
        Degree ``k >= 0``. Degree 0 is the constant sketch ``T^(0)(u) = [1]``.

    Attributes
    ----------
    count_sketches : list of CountSketch
        ``count_sketches[j]`` is the ``(j+1)``-th factor ``(h_{j+1}, s_{j+1})``.

    Notes
    -----
    Cost ``O(n k (d + m log m))`` time for ``n`` rows; memory is bounded by processing rows
    in blocks.
    """

    def __init__(self, input_dim: int, degree: int, sketch_dim: int, rng: Any = None) -> None:
        self.input_dim = check_int(input_dim, "input_dim", minimum=1)
        self.degree = check_int(degree, "degree", minimum=0)
        self.sketch_dim = check_int(sketch_dim, "sketch_dim", minimum=1)
        generator = check_rng(rng)
        self.count_sketches = [
            CountSketch(self.input_dim, self.sketch_dim, generator) for _ in range(self.degree)
        ]
        if self.degree > 0:
            self._stacked = sp.hstack([cs.matrix for cs in self.count_sketches], format="csr")
        else:
            self._stacked = None

    def stacked_matrix(self) -> sp.csr_array:
        """The CountSketches' matrices side by side, ``d x k m`` (sparse):
        ``U @ stacked_matrix()`` holds every CountSketch of ``U``'s rows (degree 0: none)."""
        if self._stacked is None:
            return sp.csr_array((self.input_dim, 0))
        return self._stacked

    def transform(self, U: Any) -> np.ndarray:
        """Degree-``k`` sketch of each row: shape ``(n, m)``, or ``(n, 1)`` of ones if ``k = 0``."""
        U = self._check(U)
        if self.degree == 0:
            return np.ones((U.shape[0], 1))
        return self._all_degrees(U)[:, -1, :]

    def transform_all_degrees(self, U: Any, *, out: np.ndarray | None = None) -> np.ndarray:
        """Sketches of every degree ``1..k`` at once (the recursion of Algorithm 2).

        Parameters
        ----------
        U : array-like or sparse matrix, shape (n, d)
        out : ndarray, shape (n, k, m), optional
            Where to write the result (any float dtype); allocated as float64 if omitted.

        Returns
        -------
        ndarray, shape (n, k, m)
            ``result[:, j - 1, :]`` is ``T^(j)(U)``.
        """
        U = self._check(U)
        return self._all_degrees(U, out=out)

    def _check(self, U: Any) -> np.ndarray | sp.csr_array:
        return check_matrix(
            U,
            "U",
            n_features=self.input_dim,
            allow_sparse=True,
            feature_name="the sketch's input_dim",
        )

    def _all_degrees(
        self,
        U: np.ndarray | sp.csr_array,
        out: np.ndarray | None = None,
        dtype: Any = np.float64,
    ) -> np.ndarray:
        n, k, m = U.shape[0], self.degree, self.sketch_dim
        if out is None:
            out = np.empty((n, k, m), dtype=dtype)
        elif out.shape != (n, k, m):
            raise ValueError(f"out must have shape {(n, k, m)}; got {out.shape}")
        self.write_blocks(U, lambda rows, block: out.__setitem__(rows, block), dtype=dtype)
        return out

    def write_blocks(
        self,
        U: np.ndarray | sp.csr_array,
        write: Callable[[slice, np.ndarray], None],
        dtype: Any = np.float64,
        row_scale: np.ndarray | None = None,
        degree_weights: np.ndarray | None = None,
    ) -> None:
        """Sketches of every degree, handed over block of rows by block of rows.

        Calls ``write(rows, block)`` with ``block[:, j - 1] = s_i w_j T^(j)(u_i)`` for the rows
        ``i`` of ``U[rows]``, shape ``(len(rows), k, m)``, computed in ``dtype`` (float32
        halves the cost of the FFTs when the caller stores float32 features anyway). The
        optional row scales ``s`` and degree weights ``w`` are folded in where they are cheap:
        ``s`` into the first CountSketch (every degree is linear in it), ``w`` into the spectra.
        Large inputs are processed on several threads (blocks are independent; ``write`` must
        only touch its own rows). ``U`` must already be validated.
        """
        n, k, m = U.shape[0], self.degree, self.sketch_dim
        if k == 0:
            return
        starts = range(0, n, DEFAULT_BLOCK_ROWS)
        parallel = n * k * m >= THREADED_MIN_ENTRIES

        def one_block(start: int) -> None:
            rows = slice(start, min(start + DEFAULT_BLOCK_ROWS, n))
            counts = sketch_rows(U[rows], self._stacked, dtype).reshape(-1, k, m)
            if row_scale is not None:
                counts[:, 0] *= row_scale[rows, None].astype(counts.dtype)
            # one FFT thread per block when the blocks themselves run in parallel
            write(rows, convolve_count_sketches(counts, degree_weights, 1 if parallel else -1))

        for_each(one_block, starts, parallel)


def sketches_on_device(
    sketch: TensorSketch,
    U: Any,
    xp: Any,
    stacked: Any,
    row_scale: Any = None,
    degree_weights: np.ndarray | None = None,
) -> Any:
    """:meth:`TensorSketch.write_blocks`' sketches of every degree for all rows at once, in
    the Array API namespace ``xp`` on the device ``U`` is on (its ``fft`` extension): shape
    ``(n, k, m)``, ``[:, j - 1] = s_i w_j T^(j)(u_i)``, float64.

    ``stacked`` is the CountSketches' stacked matrix (``d x k m``) as a dense array on that
    device. The same recursion as :func:`convolve_count_sketches` (the running product of
    the spectra, each degree's weight on its spectrum), ``O(n k m log m)``.
    """
    n, k, m = U.shape[0], sketch.degree, sketch.sketch_dim
    counts = xp.reshape(U @ stacked, (n, k, m))
    first = counts[:, 0, :]
    if row_scale is not None:
        first = first * row_scale[:, None]
    weight = (lambda j: 1.0) if degree_weights is None else (lambda j: float(degree_weights[j]))
    degrees = [first * weight(0)]  # degree 1 is the CountSketch itself: no FFT round trip
    if k > 1:
        spectra = xp.fft.rfft(counts[:, 1:, :], axis=-1)
        running = xp.fft.rfft(first, axis=-1)
        for degree in range(1, k):
            running = running * spectra[:, degree - 1, :]
            degrees.append(xp.fft.irfft(running * weight(degree), n=m, axis=-1))
    return xp.stack(degrees, axis=1)


def convolve_count_sketches(
    counts: np.ndarray, weights: np.ndarray | None = None, workers: int = -1
) -> np.ndarray:
    """Running circular convolutions of CountSketches along axis 1, in place.

    Parameters
    ----------
    counts : ndarray, shape (n, k, m)
        ``counts[:, j]`` is the CountSketch ``C_{j+1}`` of each row. Overwritten.
    weights : ndarray, shape (k,), optional
        Multiply degree ``j + 1`` by ``weights[j]`` (applied to the spectra, which are
        smaller than the outputs).
    workers : int, default=-1
        Threads of ``scipy.fft`` (-1: all cores).

    Returns
    -------
    ndarray, shape (n, k, m)
        ``counts`` itself, with ``counts[:, j] = w_j C_1 * C_2 * ... * C_{j+1}`` (circular
        convolution), the TensorSketch of degree ``j + 1``.
    """
    m, k = counts.shape[-1], counts.shape[1]
    if k > 1:
        spectra = scipy.fft.rfft(counts, axis=-1, workers=workers)
        for degree in range(1, k):  # running product = Algorithm 2's recursion
            spectra[:, degree] *= spectra[:, degree - 1]
            if weights is not None:
                spectra[:, degree - 1] *= weights[degree - 1]
        if weights is not None:
            spectra[:, k - 1] *= weights[k - 1]
        counts[:, 1:] = scipy.fft.irfft(spectra[:, 1:], n=m, axis=-1, workers=workers)
    if weights is not None:
        counts[:, 0] *= weights[0]  # degree 1 is the CountSketch itself: no FFT round trip
    return counts
