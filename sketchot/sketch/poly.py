"""Poly-TensorSketch of an element-wise function of a low-rank matrix (Han et al. 2020).

.. math::
    f(U V^T) \\approx \\sum_{j=0}^{r} c_j (U V^T)^{\\odot j}
             \\approx \\sum_{j=0}^{r} c_j T_U^{(j)} T_V^{(j)\\top} = F_U F_V^\\top,

with ``F_U = [c_0, c_1 T_U^(1), ..., c_r T_U^(r)]`` and ``F_V = [1, T_V^(1), ..., T_V^(r)]``
(``n x (1 + r m)`` each, the signed coefficients folded into the left factor). A product
``f(U V^T) x ~ F_U (F_V^T x)`` costs ``O((n1 + n2) r m)`` and never forms ``n1 x n2`` values.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._validation import (
    check_choice,
    check_dtype,
    check_float,
    check_int,
    check_matrix,
    check_rng,
    describe,
)
from .coefficients import (
    COEFFICIENT_METHODS,
    REGULARIZERS,
    CoefficientFit,
    chebyshev_coefficients,
    coreset_coefficients,
    evaluate_finite,
    optimal_coefficients,
    ridge_diagonal,
    taylor_coefficients,
)
from .functions import ElementwiseFunction, as_function
from .tensorsketch import TensorSketch


class PolyTensorSketch:
    """Low-rank sketch ``f(U V^T) ~ F_U F_V^T`` for any element-wise ``f``.

    Parameters
    ----------
    function : {'exp', 'sigmoid'}, ElementwiseFunction or callable, default='exp'
        The element-wise function ``f``.
    degree : int, default=3
        Polynomial degree ``r >= 0``.
    sketch_dim : int, default=20
        TensorSketch dimension ``m >= 1``.
    coefficients : {'coreset', 'optimal', 'chebyshev', 'taylor'}, default='coreset'
        How the polynomial coefficients are chosen (see :mod:`sketchot.sketch.coefficients`).
    coreset_size : int, default=10
        Number of k-center clusters ``k`` for ``'coreset'``; ``1 <= k <= min(n1, n2)``.
    regularizer : {'shifted', 'theorem', 'none'}, default='shifted'
        Index convention of the ridge weights ``W`` for ``'coreset'`` and ``'optimal'``
        (``'shifted'`` is the reference implementation's; ``'none'`` switches ``W`` off).
    nonnegative : bool, default=False
        Constrain ``c_j >= 0`` (NNLS), e.g. for positive-definite maps ``sqrt(c_j) T^(j)``.
    taylor_center : float or 'mean', default=0.0
        Expansion point for ``'taylor'``; ``'mean'`` is the mean entry of ``U V^T``.
    rng : None, int, Generator, ...
        Randomness of the hashes, signs and k-center start (``numpy.random.default_rng``).

    Attributes
    ----------
    coef_ : ndarray, shape (r + 1,)
        Monomial coefficients ``c_j``.
    half_width_ : float
        ``a = max_i ||u_i|| max_j ||v_j||``; the polynomial is fitted on ``[-a, a]``.
    tensor_sketch_ : TensorSketch
        The ``r`` CountSketches shared by both sides and by every later transform.
    fit_info_ : CoefficientFit
        Diagnostics of the coefficient method.
    n_features_out_ : int
        ``1 + r m``.

    Notes
    -----
    Fitting costs ``O((n1 + n2) k (d + r^2))`` for ``'coreset'`` (``O(n1 n2 (d + r^2))`` for
    ``'optimal'``); features cost ``O(n r (d + m log m))``. Rows transformed after fitting
    (out-of-sample) reuse the same hashes, signs and coefficients, so their features are
    consistent with the fitted ones; rows whose norm exceeds the fitted ones fall outside
    ``[-a, a]`` where the polynomial is an extrapolation.

    References
    ----------
    I. Han, H. Avron, J. Shin. Polynomial Tensor Sketch for Element-wise Function of Low-Rank
    Matrix. ICML 2020.
    """

    def __init__(
        self,
        function: Any = "exp",
        *,
        degree: int = 3,
        sketch_dim: int = 20,
        coefficients: str = "coreset",
        coreset_size: int = 10,
        regularizer: str | None = "shifted",
        nonnegative: bool = False,
        taylor_center: float | str = 0.0,
        rng: Any = None,
    ) -> None:
        self.function = function
        self.degree = degree
        self.sketch_dim = sketch_dim
        self.coefficients = coefficients
        self.coreset_size = coreset_size
        self.regularizer = regularizer
        self.nonnegative = nonnegative
        self.taylor_center = taylor_center
        self.rng = rng

    # ------------------------------------------------------------------ fitting
    def fit(self, U: Any, V: Any = None) -> PolyTensorSketch:
        """Draw the sketch and fit the coefficients for ``f(U V^T)`` (``V = U`` if omitted)."""
        U = check_matrix(U, "U")
        V = U if V is None else check_matrix(V, "V", n_features=U.shape[1], feature_name="U")
        self._validate_parameters(U.shape[0], V.shape[0])
        f = as_function(self.function)
        self.function_ = f

        half_width = float(
            np.sqrt(np.einsum("ij,ij->i", U, U).max() * np.einsum("ij,ij->i", V, V).max())
        )
        if half_width == 0.0:
            half_width = 1.0  # U V^T = 0: any interval containing 0 works
        self.half_width_ = half_width
        # Fail early, with the interval in the message, if f overflows on [-a, a].
        evaluate_finite(f, half_width * np.cos(np.linspace(0.0, np.pi, 65)))

        generator = check_rng(self.rng)
        self.tensor_sketch_ = TensorSketch(U.shape[1], self.degree, self.sketch_dim, generator)
        self.fit_info_ = self._fit_coefficients(U, V, f, half_width, generator)
        self.coef_ = self.fit_info_.coef
        if not np.all(np.isfinite(self.coef_)):
            raise ValueError(
                f"the {self.coefficients!r} coefficients are not finite ({self.coef_}); "
                "rescale the inputs or lower the degree"
            )
        self.n_features_out_ = 1 + self.degree * self.sketch_dim
        return self

    def _validate_parameters(self, n1: int, n2: int) -> None:
        check_int(self.degree, "degree", minimum=0)
        check_int(self.sketch_dim, "sketch_dim", minimum=1)
        check_choice(self.coefficients, "coefficients", COEFFICIENT_METHODS)
        regularizer = "none" if self.regularizer is None else self.regularizer
        self.regularizer_ = check_choice(regularizer, "regularizer", REGULARIZERS)
        if not isinstance(self.nonnegative, bool | np.bool_):
            raise TypeError(f"nonnegative must be a bool; got {describe(self.nonnegative)}")
        if self.coefficients == "coreset":
            check_int(self.coreset_size, "coreset_size", minimum=1, maximum=min(n1, n2))
        if self.coefficients == "taylor" and self.taylor_center != "mean":
            check_float(self.taylor_center, "taylor_center")

    def _fit_coefficients(
        self,
        U: np.ndarray,
        V: np.ndarray,
        f: ElementwiseFunction,
        half_width: float,
        generator: np.random.Generator,
    ) -> CoefficientFit:
        r = self.degree
        if self.coefficients == "taylor":
            center = self.taylor_center
            if center == "mean":
                center = float(U.sum(axis=0) @ V.sum(axis=0)) / (U.shape[0] * V.shape[0])
            return taylor_coefficients(f, r, float(center))
        if self.coefficients == "chebyshev":
            return chebyshev_coefficients(f, r, half_width)
        ridge = ridge_diagonal(
            np.einsum("ij,ij->i", U, U),
            np.einsum("ij,ij->i", V, V),
            r,
            self.sketch_dim,
            self.regularizer_,
        )
        if self.coefficients == "optimal":
            return optimal_coefficients(U, V, f, r, half_width, ridge, nonnegative=self.nonnegative)
        return coreset_coefficients(
            U,
            V,
            f,
            r,
            half_width,
            ridge,
            self.coreset_size,
            generator,
            nonnegative=self.nonnegative,
        )

    def fit_transform(self, U: Any, V: Any = None, *, dtype: Any = np.float64):
        """Fit, then return ``(left_features(U), right_features(V))``."""
        self.fit(U, V)
        return self.left_features(U, dtype=dtype), self.right_features(
            U if V is None else V, dtype=dtype
        )

    # --------------------------------------------------------------- features
    def left_features(self, U: Any, *, dtype: Any = np.float64) -> np.ndarray:
        """``F_U = [c_0, c_1 T^(1)(U), ..., c_r T^(r)(U)]``, shape ``(n, 1 + r m)``."""
        self._check_fitted()
        return self._features(U, "U", self.coef_, dtype)

    def right_features(self, V: Any, *, dtype: Any = np.float64) -> np.ndarray:
        """``F_V = [1, T^(1)(V), ..., T^(r)(V)]``, shape ``(n, 1 + r m)``."""
        self._check_fitted()
        return self._features(V, "V", np.ones(self.degree + 1), dtype)

    def symmetric_features(self, U: Any, *, dtype: Any = np.float64) -> np.ndarray:
        """``[sqrt(c_0), sqrt(c_1) T^(1)(U), ...]``, so that ``f(U U^T) ~ F F^T`` is PSD.

        Needs every ``c_j >= 0``: fit with ``nonnegative=True``.
        """
        self._check_fitted()
        if np.any(self.coef_ < 0):
            raise ValueError(
                "symmetric_features needs non-negative coefficients; got "
                f"{np.array2string(self.coef_, precision=3)}: fit with nonnegative=True"
            )
        return self._features(U, "U", np.sqrt(self.coef_), dtype)

    def sketch(self, U: Any) -> np.ndarray:
        """Raw TensorSketches of every degree ``1..r``: shape ``(n, r, m)``."""
        self._check_fitted()
        return self.tensor_sketch_.transform_all_degrees(U)

    def _check_fitted(self) -> None:
        if not hasattr(self, "coef_"):
            raise RuntimeError("this PolyTensorSketch is not fitted yet: call fit(U, V) first")

    def _features(
        self,
        U: Any,
        name: str,
        weights: np.ndarray,
        dtype: Any,
        row_scale: np.ndarray | None = None,
    ) -> np.ndarray:
        """Rows ``s_i [w_0, w_1 T^(1)(u_i), ..., w_r T^(r)(u_i)]`` in row blocks.

        ``row_scale`` (``s_i``, default 1) lets callers fold a diagonal scaling into the same
        pass, so an ``n x (1 + r m)`` array is written once.
        """
        self._check_fitted()
        dtype = check_dtype(dtype)
        sketch = self.tensor_sketch_
        U = check_matrix(
            U, name, n_features=sketch.input_dim, allow_sparse=True, feature_name="the fitted data"
        )
        n, r, m = U.shape[0], self.degree, self.sketch_dim
        out = np.empty((n, 1 + r * m), dtype=dtype)
        scale = np.ones(n) if row_scale is None else row_scale
        out[:, 0] = weights[0] * scale

        def write(rows: slice, block: np.ndarray) -> None:  # block: (rows, r, m), weighted
            out[rows, 1:] = block.reshape(block.shape[0], r * m)

        sketch.write_blocks(U, write, dtype=dtype, row_scale=row_scale, degree_weights=weights[1:])
        return out
