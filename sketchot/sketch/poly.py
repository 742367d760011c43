"""Poly-TensorSketch of an element-wise function of a low-rank matrix (Han et al. 2020).

.. math::
    f(U V^T) \\approx \\sum_{j=0}^{r} c_j (U V^T)^{\\odot j}
             \\approx \\sum_{j=0}^{r} c_j T_U^{(j)} T_V^{(j)\\top} = F_U F_V^\\top,

with ``F_U = [c_0, c_1 T_U^(1), ..., c_r T_U^(r)]`` and ``F_V = [1, T_V^(1), ..., T_V^(r)]``
(``n x (1 + r m)`` each, the signed coefficients folded into the left factor). A product
``f(U V^T) x ~ F_U (F_V^T x)`` costs ``O((n1 + n2) r m)`` and never forms ``n1 x n2`` values.

Two variants share this class. ``'paper'`` is the algorithm of the paper (one sketch size ``m``
for every degree, the coefficients of eq. optc with the reference code's ridge weights).
``'improved'`` (the default, :mod:`sketchot.sketch.improved`) spends a budget of ``rank``
features on exact monomial features for the low degrees that fit, TensorSketches of
per-degree sizes for the others, and a relative-error coefficient fit.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import KW_ONLY, dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from .._arrays import DeviceArrays
from .._validation import (
    check_choice,
    check_dtype,
    check_float,
    check_int,
    check_matrix,
    check_rng,
    describe,
    user_stacklevel,
)
from .accuracy import (
    ADVICE_MARGIN,
    DEFAULT_FIT_TOLERANCE,
    SketchAccuracyWarning,
    describe_changes,
    first_passing,
    largest_passing_scale,
    measured_entries,
    polynomial_error,
    refit_error,
    relative_error,
    size_candidates,
)
from .coefficients import (
    COEFFICIENT_METHODS,
    REGULARIZERS,
    CoefficientFit,
    chebyshev_coefficients,
    evaluate_finite,
    regression_coefficients,
    ridge_diagonal,
    taylor_coefficients,
)
from .functions import ElementwiseFunction, as_function
from .improved import MAX_AUTO_DEGREE, plan_improved
from .monomials import (
    monomial_count,
    stacked_monomial_features,
    stacked_monomial_features_on_device,
)
from .tensorsketch import TensorSketch, sketches_on_device

VARIANTS = ("improved", "paper")

#: Features built on a device take row blocks of at most this many bytes of temporaries
#: (an eighth of its free memory where it can be asked).
DEVICE_FEATURE_BYTES = 1 << 30

#: The paper's Sinkhorn setting (Section 4.3), the default size: ``r = 3``, ``m = 20``.
DEFAULT_DEGREE = 3
DEFAULT_SKETCH_DIM = 20


@dataclass(eq=False)
class PolySketchParameters:
    """The parameters :class:`PolyTensorSketch` and
    :class:`~sketchot.sketch.GaussianPolySketch` share, declared once (keyword-only; see
    :class:`PolyTensorSketch` for their meaning)."""

    _: KW_ONLY
    degree: int | None = None
    sketch_dim: int | None = None
    coefficients: str = "coreset"
    coreset_size: int = 10
    regularizer: str | None = "shifted"
    nonnegative: bool = False
    taylor_center: float | str = 0.0
    variant: str = "improved"
    rank: int | None = None
    fit_tolerance: float | None = DEFAULT_FIT_TOLERANCE
    rng: Any = None


@dataclass(eq=False)
class PolyTensorSketch(PolySketchParameters):
    """Low-rank sketch ``f(U V^T) ~ F_U F_V^T`` for any element-wise ``f``.

    Parameters
    ----------
    function : {'exp', 'sigmoid'}, ElementwiseFunction or callable, default='exp'
        The element-wise function ``f``.
    degree : int, optional
        ``'paper'``: the polynomial degree ``r >= 0`` (default 3). ``'improved'``: with ``rank``,
        the largest degree searched (default 16); without ``rank``, ``r`` and ``m`` only size
        the budget ``1 + r m`` (so ``degree=3, sketch_dim=20`` is rank 61 in both variants)
        and the degree is searched up to 16.
    sketch_dim : int, optional
        TensorSketch dimension ``m >= 1`` (default 20). ``'improved'`` only uses it to size the
        budget ``rank = 1 + r m`` when ``rank`` is not given.
    coefficients : {'coreset', 'optimal', 'chebyshev', 'taylor'}, default='coreset'
        How the polynomial coefficients are chosen (see :mod:`sketchot.sketch.coefficients`).
        ``'improved'`` supports ``'coreset'`` only (its relative-error coreset fit).
    coreset_size : int, default=10
        Number of k-center clusters ``k`` for ``'coreset'``; ``1 <= k <= min(n1, n2)``.
    regularizer : {'shifted', 'theorem', 'none'}, default='shifted'
        ``'paper'`` only: index convention of the ridge weights ``W`` for ``'coreset'`` and
        ``'optimal'`` (``'shifted'`` is the reference implementation's; ``'none'`` switches
        ``W`` off). ``'improved'`` always uses its calibrated variance model.
    nonnegative : bool, default=False
        Constrain ``c_j >= 0`` (NNLS), e.g. for positive-definite maps ``sqrt(c_j) T^(j)``.
    taylor_center : float or 'mean', default=0.0
        Expansion point for ``'taylor'``; ``'mean'`` is the mean entry of ``U V^T``.
    variant : {'improved', 'paper'}, default='improved'
        ``'paper'``: Han et al.'s algorithm exactly (same draws, same numbers as before this
        option existed). ``'improved'``: see :mod:`sketchot.sketch.improved`.
    rank : int, optional
        Total number of features ``R`` (the constant included), the natural size to compare
        with Nystrom landmarks or random features. Default ``1 + r m`` (61). ``'paper'`` uses
        ``m = (R - 1) // r`` (``rank`` and ``sketch_dim`` are exclusive); ``'improved'`` spends
        exactly ``R`` features unless every degree up to ``degree`` is exact with room to spare.
    fit_tolerance : float or None, default=0.05
        After fitting, the product of the features is measured against ``f`` itself on the
        coreset entries and the polynomial on sampled entries (:attr:`fit_error_`); above
        this relative error the fit warns (:class:`~sketchot.sketch.SketchAccuracyWarning`)
        with the error, the interval
        ``[-a, a]`` and changes tried on the same coreset that meet the tolerance (a larger
        sketch, inputs scaled down). ``None``: measure, never warn.
    rng : None, int, Generator, ...
        Randomness of the hashes, signs and k-center start (``numpy.random.default_rng``).

    Attributes
    ----------
    coef_ : ndarray, shape (r + 1,)
        Monomial coefficients ``c_j``.
    half_width_ : float
        ``a = max_i ||u_i|| max_j ||v_j||``; the polynomial is fitted on ``[-a, a]``.
    degree_ : int
        The degree ``r`` used.
    exact_degree_ : int
        Degrees ``1..e`` have exact monomial features (always 0 for ``'paper'``).
    sketch_sizes_ : ndarray of int, shape (r - e,)
        Sketch size of each sketched degree ``e + 1..r`` (all ``m`` for ``'paper'``).
    tensor_sketch_ : TensorSketch or None
        The ``r`` CountSketches shared by both sides and by every later transform (of size
        ``max(sketch_sizes_)``; smaller degrees fold it, see :func:`fold_buckets`); ``None``
        when every degree is exact.
    fit_info_ : CoefficientFit
        Diagnostics of the coefficient method.
    n_features_out_ : int
        ``1 + r m`` (``'paper'``); ``1 + sum_{j<=e} C(d + j - 1, j) + sum_j m_j``
        (``'improved'``).
    fit_error_ : float
        Relative error ``||F_U F_V^T - f(U V^T)||_F / ||f(U V^T)||_F`` measured on the
        coreset entries (the k-center centres of one side against up to 1024 rows of the
        other, weighted to stand for all entries; a deterministic k-center when the
        coefficients were not fitted on one): polynomial and sketch errors together; or, when
        larger, the error of the polynomial ``p(U V^T)`` (the features' expectation) on up to
        256 x 256 sampled entries, which the coefficients were not fitted on (a coreset of a
        few distinct points is fitted exactly and says nothing of the other entries).

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

    function: Any = "exp"

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
        start = copy.deepcopy(generator)  # the advice refits from the same random state
        if self.variant == "paper":
            self.tensor_sketch_ = TensorSketch(
                U.shape[1], self.degree_, self.sketch_dim_, generator
            )
            self.fit_info_ = self._fit_coefficients(U, V, f, half_width, generator)
            self.exact_degree_ = 0
            self.sketch_sizes_ = np.full(self.degree_, self.sketch_dim_)
        else:
            plan = plan_improved(
                U,
                V,
                f,
                half_width,
                self.rank_,
                self.degree_,
                self.coreset_size,
                generator,
                nonnegative=self.nonnegative,
            )
            self.degree_, self.exact_degree_ = plan.degree, plan.exact_degree
            self.sketch_sizes_ = plan.sketch_sizes
            self.fit_info_ = plan.fit
            self.tensor_sketch_ = (
                TensorSketch(U.shape[1], plan.degree, int(plan.sketch_sizes.max()), generator)
                if plan.degree > plan.exact_degree
                else None
            )
        self.coef_ = self.fit_info_.coef
        if not np.all(np.isfinite(self.coef_)):
            raise ValueError(
                f"the {self.coefficients!r} coefficients are not finite ({self.coef_}); "
                "rescale the inputs or lower the degree"
            )
        self.input_dim_ = U.shape[1]
        exact = sum(monomial_count(U.shape[1], j) for j in range(1, self.exact_degree_ + 1))
        self.n_features_out_ = 1 + exact + int(self.sketch_sizes_.sum())
        self.fit_error_, n_entries = self._measure(U, V)
        if self.fit_tolerance is not None and self.fit_error_ > self.fit_tolerance:
            warnings.warn(
                self._accuracy_message(U, V, start, n_entries),
                SketchAccuracyWarning,
                stacklevel=user_stacklevel(),
            )
        return self

    def _measure(self, U: np.ndarray, V: np.ndarray) -> tuple[float, int]:
        """``(relative error, entries measured)``: the larger of the error of ``F_U F_V^T``
        against ``f(U V^T)`` on the coreset and of the polynomial on sampled entries."""
        entries = measured_entries(U, V, self.fit_info_.details, self.coreset_size)
        left, right = U[entries.left], V[entries.right]
        with np.errstate(over="ignore", invalid="ignore"):
            approx = self.left_features(left) @ self.right_features(right).T
            truth = np.asarray(self.function_(left @ right.T), dtype=np.float64)
        bias, n_sampled = polynomial_error(U, V, self.coef_, self.function_)
        return max(relative_error(approx, truth, entries), bias), entries.size + n_sampled

    def _accuracy_message(
        self, U: np.ndarray, V: np.ndarray, start: np.random.Generator, n_entries: int
    ) -> str:
        """What was measured, and what was found to meet the tolerance on the same coreset."""
        target = ADVICE_MARGIN * self.fit_tolerance
        a = self.half_width_
        head = (
            f"PolyTensorSketch of {self.function_!r}: its features miss f(U V^T) by a relative "
            f"error of {self.fit_error_:.2g} (fit_error_, measured on {n_entries} entries "
            f"of the coreset and sampled rows; fit_tolerance={self.fit_tolerance:g}). Its "
            f"polynomial of degree {self.degree_} ({self.n_features_out_} features) approximates "
            f"f on the interval "
            f"[-{a:.4g}, {a:.4g}] that U V^T spans. Tried with the same coreset and random "
            f"draws, for an error below {target:.2g}: "
        )
        return head + "; ".join(self._advice(U, V, start, target)) + "."

    def _advice(
        self, U: np.ndarray, V: np.ndarray, start: np.random.Generator, target: float
    ) -> list[str]:
        a = self.half_width_
        candidates, largest = size_candidates(self)
        found = first_passing(candidates, lambda c: refit_error(self, start, c, U, V), target)
        if found is not None:
            advice = [f"{describe_changes(self, found[0])} meets it ({found[1]:.2g})"]
        else:
            advice = [f"no larger sketch up to {largest} meets it"]
            if self.nonnegative:
                error = refit_error(self, start, {"nonnegative": False}, U, V)
                advice.append(
                    f"nonnegative=False meets it ({error:.2g}), without symmetric_features"
                    if error <= target
                    else "nor does nonnegative=False"
                )
        scaled = largest_passing_scale(
            lambda t: refit_error(self, start, {}, np.sqrt(t) * U, np.sqrt(t) * V), target
        )
        if scaled is None:
            advice.append("neither does scaling U and V down by up to 64x")
        else:
            t, error = scaled
            advice.append(
                f"scaling U and V by {np.sqrt(t):.3g} meets it ({error:.2g}; U V^T then spans "
                f"[-{t * a:.3g}, {t * a:.3g}], which makes the matrix f({t:.3g} U V^T))"
            )
        return advice

    def _validate_parameters(self, n1: int, n2: int) -> None:
        variant = check_choice(self.variant, "variant", VARIANTS)
        check_choice(self.coefficients, "coefficients", COEFFICIENT_METHODS)
        if self.degree is not None:
            check_int(self.degree, "degree", minimum=0)
        if self.sketch_dim is not None:
            check_int(self.sketch_dim, "sketch_dim", minimum=1)
        if self.rank is not None:
            check_int(self.rank, "rank", minimum=1)
            if self.sketch_dim is not None:
                raise ValueError(
                    f"give rank or sketch_dim, not both; got rank={self.rank!r} and "
                    f"sketch_dim={self.sketch_dim!r}"
                )
        degree = DEFAULT_DEGREE if self.degree is None else int(self.degree)
        sketch_dim = DEFAULT_SKETCH_DIM if self.sketch_dim is None else int(self.sketch_dim)
        if variant == "paper":
            if self.rank is not None:
                sketch_dim = (int(self.rank) - 1) // max(degree, 1)
                if sketch_dim < 1:
                    raise ValueError(
                        f"rank must be >= {1 + max(degree, 1)} for variant='paper' "
                        f"(1 + degree * sketch_dim, sketch_dim >= 1); got {self.rank!r}"
                    )
            self.degree_, self.sketch_dim_ = degree, sketch_dim
        else:
            if self.coefficients != "coreset":
                raise ValueError(
                    "variant='improved' fits its own coefficients on the coreset: coefficients "
                    f"must be 'coreset'; got {self.coefficients!r} (use variant='paper')"
                )
            self.rank_ = 1 + degree * sketch_dim if self.rank is None else int(self.rank)
            # without rank, (degree, sketch_dim) only size the budget, as 1 + r m does for 'paper'
            capped = self.rank is not None and self.degree is not None
            self.degree_ = degree if capped else MAX_AUTO_DEGREE
            self.sketch_dim_ = None
        regularizer = "none" if self.regularizer is None else self.regularizer
        self.regularizer_ = check_choice(regularizer, "regularizer", REGULARIZERS)
        if not isinstance(self.nonnegative, bool | np.bool_):
            raise TypeError(f"nonnegative must be a bool; got {describe(self.nonnegative)}")
        if self.coefficients == "coreset":
            check_int(self.coreset_size, "coreset_size", minimum=1, maximum=min(n1, n2))
        if self.coefficients == "taylor" and self.taylor_center != "mean":
            check_float(self.taylor_center, "taylor_center")
        if self.fit_tolerance is not None:
            check_float(self.fit_tolerance, "fit_tolerance", positive=True)

    def _fit_coefficients(
        self,
        U: np.ndarray,
        V: np.ndarray,
        f: ElementwiseFunction,
        half_width: float,
        generator: np.random.Generator,
    ) -> CoefficientFit:
        r = self.degree_
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
            self.sketch_dim_,
            self.regularizer_,
        )
        coreset = self.coreset_size if self.coefficients == "coreset" else None
        return regression_coefficients(
            U, V, f, r, half_width, ridge, coreset_size=coreset, rng=generator,
            nonnegative=self.nonnegative,
        )  # fmt: skip

    def fit_transform(self, U: Any, V: Any = None, *, dtype: Any = np.float64):
        """Fit, then return ``(left_features(U), right_features(V))``."""
        self.fit(U, V)
        return self.left_features(U, dtype=dtype), self.right_features(
            U if V is None else V, dtype=dtype
        )

    # --------------------------------------------------------------- features
    def left_features(self, U: Any, *, dtype: Any = np.float64) -> np.ndarray:
        """``F_U = [c_0, c_1 phi_1(U), ..., c_r T^(r)(U)]``, shape ``(n, n_features_out_)``."""
        self._check_fitted()
        return self.weighted_features(U, self.coef_, dtype=dtype)

    def right_features(self, V: Any, *, dtype: Any = np.float64) -> np.ndarray:
        """``F_V = [1, phi_1(V), ..., T^(r)(V)]``, shape ``(n, n_features_out_)``."""
        self._check_fitted()
        return self.weighted_features(V, np.ones_like(self.coef_), dtype=dtype, name="V")

    def symmetric_features(self, U: Any, *, dtype: Any = np.float64) -> np.ndarray:
        """``[sqrt(c_0), sqrt(c_1) phi_1(U), ...]``, so that ``f(U U^T) ~ F F^T`` is PSD.

        Needs every ``c_j >= 0``: fit with ``nonnegative=True``.
        """
        self._check_fitted()
        if np.any(self.coef_ < 0):
            raise ValueError(
                "symmetric_features needs non-negative coefficients; got "
                f"{np.array2string(self.coef_, precision=3)}: fit with nonnegative=True"
            )
        return self.weighted_features(U, np.sqrt(self.coef_), dtype=dtype)

    def sketch(self, U: Any) -> np.ndarray:
        """Raw TensorSketches of every degree ``1..r``: shape ``(n, r, max(sketch_sizes_))``.

        Unfolded and unweighted; an all-exact improved sketch has none (``(n, 0, 0)``).
        """
        self._check_fitted()
        if self.tensor_sketch_ is None:
            return np.zeros((check_matrix(U, "U", allow_sparse=True).shape[0], 0, 0))
        return self.tensor_sketch_.transform_all_degrees(U)

    def _check_fitted(self) -> None:
        if not hasattr(self, "coef_"):
            raise RuntimeError("this PolyTensorSketch is not fitted yet: call fit(U, V) first")

    def weighted_features(
        self,
        U: Any,
        weights: np.ndarray,
        *,
        dtype: Any = np.float64,
        row_scale: np.ndarray | None = None,
        name: str = "U",
    ) -> np.ndarray:
        """Rows ``s_i [w_0, w_1 phi_1(u_i), ..., w_r T^(r)(u_i)]`` in row blocks, shape
        ``(n, n_features_out_)``: :meth:`left_features` with ``w = coef_``,
        :meth:`right_features` with ``w = 1``.

        Degrees ``1..e`` are exact monomial features, the others TensorSketches folded to
        their sizes. ``weights`` (``r + 1``) weigh the degrees; ``row_scale`` (``s_i``,
        default 1) lets callers fold a diagonal scaling into the same pass, so an
        ``n x n_features_out_`` array is written once; ``name`` names ``U`` in errors.
        """
        self._check_fitted()
        dtype = check_dtype(dtype)
        U = check_matrix(
            U, name, n_features=self.input_dim_, allow_sparse=True, feature_name="the fitted data"
        )
        weights = np.asarray(weights, dtype=np.float64)
        if weights.shape != self.coef_.shape:
            raise ValueError(
                f"weights must have shape {self.coef_.shape} (one per degree 0..{self.degree_}); "
                f"got shape {weights.shape}"
            )
        n, e = U.shape[0], self.exact_degree_
        if row_scale is not None:
            row_scale = np.asarray(row_scale, dtype=np.float64)
            if row_scale.shape != (n,):
                raise ValueError(
                    f"row_scale must have shape ({n},) (one per row of {name}); "
                    f"got shape {row_scale.shape}"
                )
        out = np.empty((n, self.n_features_out_), dtype=dtype)
        scale = np.ones(n) if row_scale is None else row_scale
        out[:, 0] = weights[0] * scale
        start = 1
        if e > 0:
            dense = U.toarray() if sp.issparse(U) else U  # e > 0 only when d is small
            width = sum(monomial_count(self.input_dim_, j) for j in range(1, e + 1))
            stacked_monomial_features(
                dense,
                e,
                weights=weights[1 : e + 1],
                row_scale=row_scale,
                dtype=dtype,
                out=out[:, start : start + width],
            )
            start += width
        if self.tensor_sketch_ is None:
            return out
        sizes = self.sketch_sizes_
        offsets = start + np.concatenate([[0], np.cumsum(sizes)])

        def write(rows: slice, block: np.ndarray) -> None:  # block: (rows, r, M), weighted
            for position, size in enumerate(sizes):
                folded = fold_buckets(block[:, e + position], int(size))
                out[rows, offsets[position] : offsets[position + 1]] = folded

        self.tensor_sketch_.write_blocks(
            U, write, dtype=dtype, row_scale=row_scale, degree_weights=weights[1:]
        )
        return out

    def weighted_features_on_device(
        self, U: Any, on: DeviceArrays, weights: np.ndarray, row_scale: Any = None
    ) -> Any:
        """:meth:`weighted_features` of ``U`` (``n x d``, float64, on the device of ``on``) computed
        there, in its Array API namespace, in row blocks whose temporaries take at most
        :data:`DEVICE_FEATURE_BYTES`: the constant, the exact degrees
        (:func:`stacked_monomial_features_on_device`) and the folded TensorSketches
        (:func:`sketches_on_device`, with the CountSketches' matrix dense there), float64."""
        xp, n, e = on.xp, U.shape[0], self.exact_degree_
        if row_scale is None:
            row_scale = xp.ones((n,), dtype=U.dtype, device=U.device)
        sketch = self.tensor_sketch_
        stacked = None if sketch is None else on.put(sketch.stacked_matrix().toarray())
        # rows a block: its sketches' spectra (complex, several degrees) within the budget
        spectra = 0 if sketch is None else 4 * sketch.degree * sketch.sketch_dim
        row_bytes = 8 * (self.n_features_out_ + spectra)
        free = on.free_bytes()
        budget = DEVICE_FEATURE_BYTES if free is None else min(DEVICE_FEATURE_BYTES, free // 8)
        step = max(1, int(budget // row_bytes))
        blocks = []
        for start in range(0, n, step):
            rows = slice(start, min(start + step, n))
            scale = row_scale[rows]
            columns = [(scale * float(weights[0]))[:, None]]
            if e > 0:
                columns.append(
                    stacked_monomial_features_on_device(
                        U[rows, :], e, xp, weights[1 : e + 1], scale
                    )
                )
            if sketch is not None:
                sketches = sketches_on_device(sketch, U[rows, :], xp, stacked, scale, weights[1:])
                for position, size in enumerate(self.sketch_sizes_):
                    folded = fold_buckets(sketches[:, e + position, :], int(size), xp)
                    columns.append(folded)
            blocks.append(xp.concat(columns, axis=1))
        return xp.concat(blocks, axis=0)


def fold_buckets(sketch: Any, size: int, xp: Any = np) -> Any:
    """Fold a sketch of ``M`` buckets into ``size``: bucket ``b`` sums the ``i = b mod size``.

    A TensorSketch with hash ``H`` uniform on ``0..M-1`` becomes one with hash ``H mod size``:
    still unbiased (the signs are untouched), and uniform when ``size`` divides ``M``;
    otherwise each bucket has probability ``floor(M / size) / M`` or ``ceil(M / size) / M``,
    so the collision probability ``1 / size`` grows by a factor of at most
    ``1 + (size / M)^2``. This keeps Algorithm 2's recursion (one FFT length for
    every degree) while each degree gets its own sketch size.

    Parameters
    ----------
    sketch : array, shape (n, M)
    size : int
        ``1 <= size <= M``.
    xp : module, default=numpy
        The Array API namespace of ``sketch`` (another library's on its device: the
        features :meth:`PolyTensorSketch.weighted_features_on_device` builds there).

    Returns
    -------
    array, shape (n, size)
        ``O(n M)`` time.
    """
    n, m = sketch.shape
    if size == m:
        return sketch
    groups = -(-m // size)
    padding = xp.zeros((n, groups * size - m), dtype=sketch.dtype, device=sketch.device)
    return xp.sum(xp.reshape(xp.concat([sketch, padding], axis=1), (n, groups, size)), axis=1)
