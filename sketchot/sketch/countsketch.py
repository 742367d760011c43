"""CountSketch (Charikar, Chen and Farach-Colton 2002; Weinberger et al. 2009).

A CountSketch with hash ``h : [d] -> [m]`` and sign ``s : [d] -> {-1, +1}`` maps a row
``u`` of length ``d`` to ``C(u)`` of length ``m`` with

.. math::  C(u)_j = \\sum_{i : h(i) = j} s(i) \\, u_i ,

and ``E[<C(u), C(v)>] = <u, v>`` when ``u`` and ``v`` share ``h`` and ``s``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from .._validation import check_int, check_matrix, check_rng


class CountSketch:
    """One CountSketch: a hash and a sign for each input coordinate.

    Parameters
    ----------
    input_dim : int
        Number of input coordinates ``d``.
    sketch_dim : int
        Number of buckets ``m``.
    rng : None, int, Generator, ...
        Anything ``numpy.random.default_rng`` accepts. The hash is uniform on
        ``0 .. m-1`` and the sign uniform on ``{-1, +1}``, independently per coordinate.

    Attributes
    ----------
    hashes : ndarray of int64, shape (d,)
    signs : ndarray of float64, shape (d,)
    matrix : scipy.sparse.csr_array, shape (d, m)
        The sketch as a sparse matrix with one signed entry per row, so that
        ``C(U) = U @ matrix`` costs ``O(nnz(U))``.

    Notes
    -----
    The sketch of an ``n x d`` matrix costs ``O(nnz)``: it is one sparse product, with no
    loop over rows.
    """

    def __init__(self, input_dim: int, sketch_dim: int, rng: Any = None) -> None:
        self.input_dim = check_int(input_dim, "input_dim", minimum=1)
        self.sketch_dim = check_int(sketch_dim, "sketch_dim", minimum=1)
        generator = check_rng(rng)
        self.hashes = generator.integers(0, self.sketch_dim, size=self.input_dim)
        self.signs = 2.0 * generator.integers(0, 2, size=self.input_dim) - 1.0
        self.matrix = signed_hash_matrix(self.hashes, self.signs, self.sketch_dim)

    def transform(self, U: Any) -> np.ndarray:
        """CountSketch of every row of ``U``.

        Parameters
        ----------
        U : array-like or sparse matrix, shape (n, d)

        Returns
        -------
        ndarray, shape (n, m)
        """
        U = check_matrix(
            U,
            "U",
            n_features=self.input_dim,
            allow_sparse=True,
            feature_name="the CountSketch input_dim",
        )
        return sketch_rows(U, self.matrix)


def signed_hash_matrix(hashes: np.ndarray, signs: np.ndarray, sketch_dim: int) -> sp.csr_array:
    """Sparse ``d x m`` matrix with ``signs[i]`` at ``(i, hashes[i])``."""
    d = hashes.shape[0]
    return sp.csr_array((signs, (np.arange(d), hashes)), shape=(d, sketch_dim))


def sketch_rows(
    U: np.ndarray | sp.csr_array, matrix: sp.csr_array, dtype: Any = np.float64
) -> np.ndarray:
    """``U @ matrix`` as a dense array in ``dtype`` (``U`` dense or sparse)."""
    dtype = np.dtype(dtype)
    if dtype != np.float64:
        U, matrix = U.astype(dtype), matrix.astype(dtype)
    product = U @ matrix
    if sp.issparse(product):
        product = product.toarray()
    return np.asarray(product, dtype=dtype)
