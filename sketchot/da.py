"""A POT-style transport estimator (``ot.da`` API) backed by sketchot's kernels.

:class:`SketchSinkhornTransport` is a drop-in for ``ot.da.SinkhornTransport`` with the
continuous out-of-sample map: the same methods and argument names (``fit(Xs=..., Xt=...)``,
``transform(Xs=...)``, ``inverse_transform(Xt=...)``, ``fit_transform``,
``transform_labels``, ``inverse_transform_labels``, ``get_params`` / ``set_params``), the same
``reg_e``, plus ``backend`` and its parameters. POT's colour-transfer example runs unchanged
after replacing ``ot.da.SinkhornTransport(reg_e=1e-1)`` by
``sketchot.SketchSinkhornTransport(reg_e=1e-1)``.

It subclasses ``ot.da.BaseTransport`` for ``fit_transform`` and ``get_params`` /
``set_params``, and overrides every method that would touch the dense cost or coupling:
POT's ``fit`` builds the ``n x m`` cost matrix and its ``transform`` the dense coupling, which
is exactly what sketchot avoids. Nothing here forms an ``n x m`` array (except the explicit,
size-checked :attr:`SketchSinkhornTransport.coupling_`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from ot.da import BaseTransport, distribution_estimation_uniform

from ._validation import check_float, check_int, check_matrix, describe
from .kernels import get_backend
from .solver import SinkhornResult, SolverOptions, sinkhorn


class SketchSinkhornTransport(BaseTransport):
    """Entropic OT domain adaptation (POT's ``SinkhornTransport``) with a pluggable kernel.

    Fits ``P = diag(u) K diag(v)`` between source samples ``Xs`` and target samples ``Xt``
    with :func:`sketchot.sinkhorn`, ``K = exp(-||x - y||^2 / reg_e)`` (POT's squared Euclidean
    cost, not normalised), and transports points with the entropic map

    .. math:: T(x) = \\frac{\\sum_j K(x, y_j) v_j y_j}{\\sum_j K(x, y_j) v_j},

    which is the barycentric projection ``(P Xt) / (P 1)`` on the fitted samples and its
    continuous extension elsewhere (POT's ``out_of_sample_map='continuous'``).

    Parameters
    ----------
    reg_e : float, default=1.0
        Entropic regularisation (POT's name and default).
    backend : str, default='auto'
        Kernel representation: ``'auto'`` (the cheapest that meets the solver's accuracy) or
        a registered backend (:func:`sketchot.available_backends`).
    backend_params : dict, optional
        Backend parameters (``n_landmarks``, ``landmarks``, ``n_features``, ``sketch_dim``,
        ``degree``, ``coreset_size``, ``dtype``, ...). Keyword arguments not listed here are
        merged into it, so ``SketchSinkhornTransport(backend="rff", n_features=500)`` works.
    max_iter : int, default=1000
    tol : float or None, default=None
        ``None``: the solver stops at the accuracy of ``solver_options`` (see
        :class:`~sketchot.SolverOptions`); a float: the L2 column-marginal error at which it
        stops (POT's criterion; POT's default is 1e-8).
    verbose : bool, default=False
        Print the solver's progress and the true-kernel check.
    safeguard : {'exact', 'clip', 'raise'}, default='exact'
        Policy for non-positive approximate denominators (:func:`sketchot.sinkhorn`).
    distribution_estimation : callable, default=ot.da.distribution_estimation_uniform
        ``f(X) -> weights`` for the samples, as in POT.
    rng : None, int or Generator
        Randomness of the approximate backends.
    solver_options : dict, optional
        Further solver options (:class:`~sketchot.SolverOptions`: ``accuracy``, ``errors``,
        ...).

    Attributes
    ----------
    result_ : SinkhornResult
        The solve (scalings, lazy plan, timings, true-kernel check).
    xs_, xt_ : ndarray
        The fitted samples.
    mu_s, mu_t : ndarray
        Their weights.
    log_ : dict
        ``log_u``, ``log_v`` (POT's names for the potentials over ``reg_e``), ``n_iter``,
        ``err`` (marginal errors at the checks) and ``converged``.
    n_fallbacks_ : int
        Points of the last ``transform`` / ``inverse_transform`` call whose approximate
        denominator was not positive and which were mapped with the exact kernel instead.

    Notes
    -----
    ``fit`` costs ``O((n + m) r)`` per iteration for rank-``r`` backends; ``transform`` of
    ``N`` points costs ``O(N r)`` (``O(N m d)`` streamed for the exact backend). When ``Xs``
    are colours (3 columns) quantised to 8 or 16 bits, each distinct colour is mapped once.
    Inputs are numpy arrays (anything ``numpy.asarray`` accepts); outputs are numpy arrays.

    Semi-supervised fitting (``ys`` and ``yt`` both given, which POT turns into an infinite
    cost between different labels) needs the dense cost matrix and is not supported.

    Examples
    --------
    >>> import numpy as np, sketchot
    >>> rng = np.random.default_rng(0)
    >>> Xs, Xt = rng.random((300, 3)), rng.random((200, 3)) * 0.5
    >>> mapping = sketchot.SketchSinkhornTransport(reg_e=0.1, rng=0).fit(Xs=Xs, Xt=Xt)
    >>> mapping.transform(Xs=Xs[:5]).shape
    (5, 3)
    """

    def __init__(
        self,
        reg_e: float = 1.0,
        backend: str = "auto",
        backend_params: dict[str, Any] | None = None,
        max_iter: int = 1000,
        tol: float | None = None,
        verbose: bool = False,
        safeguard: str = "exact",
        distribution_estimation: Any = distribution_estimation_uniform,
        rng: Any = None,
        solver_options: dict[str, Any] | None = None,
        **extra_backend_params: Any,
    ) -> None:
        if backend_params is not None and not isinstance(backend_params, dict):
            raise TypeError(
                f"backend_params must be a dict or None; got {describe(backend_params)}"
            )
        self.reg_e = reg_e
        self.backend = backend
        self.backend_params = _check_backend_params(
            {**(backend_params or {}), **extra_backend_params}
        )
        self.max_iter = max_iter
        self.tol = tol
        self.verbose = verbose
        self.safeguard = safeguard
        self.distribution_estimation = distribution_estimation
        self.rng = rng
        if solver_options is not None and not isinstance(solver_options, dict):
            raise TypeError(
                f"solver_options must be a dict or None; got {describe(solver_options)}"
            )
        self.solver_options = _check_solver_options(dict(solver_options or {}))

    # ------------------------------------------------------------------------------ fit
    def fit(self, Xs: Any = None, ys: Any = None, Xt: Any = None, yt: Any = None):
        """Solve the entropic transport between ``Xs`` and ``Xt``.

        Parameters
        ----------
        Xs : array-like, shape (n, d)
            Source samples.
        ys : array-like, shape (n,), optional
            Source labels; only used for semi-supervised fitting, which is not supported
            together with ``yt`` (see Notes of the class).
        Xt : array-like, shape (m, d)
            Target samples.
        yt : array-like, shape (m,), optional

        Returns
        -------
        self
        """
        if Xs is None or Xt is None:
            missing = " and ".join(name for name, x in (("Xs", Xs), ("Xt", Xt)) if x is None)
            raise ValueError(
                f"fit needs source samples Xs and target samples Xt; {missing} missing"
            )
        if ys is not None and yt is not None:
            raise ValueError(
                "ys and yt were both given: label-aware (semi-supervised) costs need the dense "
                "n x m cost matrix, which SketchSinkhornTransport never builds; fit without "
                "labels, or use ot.da.SinkhornTransport"
            )
        Xs = check_matrix(Xs, "Xs")
        Xt = check_matrix(Xt, "Xt", n_features=Xs.shape[1], feature_name="Xs")
        reg_e = check_float(self.reg_e, "reg_e", positive=True)
        if self.backend != "auto":
            get_backend(self.backend)
        _check_backend_params(self.backend_params)  # set_params may have replaced them
        _check_solver_options(self.solver_options)
        self.nx = self._get_backend(Xs, Xt)
        self.mu_s = np.asarray(self.distribution_estimation(Xs), dtype=np.float64)
        self.mu_t = np.asarray(self.distribution_estimation(Xt), dtype=np.float64)
        self.xs_, self.xt_ = Xs, Xt
        options = SolverOptions(
            max_iter=self.max_iter,
            tol=self.tol,
            verbose=self.verbose,
            safeguard=self.safeguard,
            **self.solver_options,
        )
        self.result_: SinkhornResult = sinkhorn(
            self.mu_s,
            self.mu_t,
            Xs,
            Xt,
            reg=reg_e,
            backend=self.backend,
            options=options,
            rng=self.rng,
            **self.backend_params,
        )
        log_u, log_v = self.result_.potentials
        self.log_ = {
            "log_u": log_u,
            "log_v": log_v,
            "n_iter": self.result_.n_iter,
            "err": [error for _, error in self.result_.error_history],
            "converged": self.result_.converged,
        }
        self.n_fallbacks_ = 0
        return self

    # ------------------------------------------------------------------------ transport
    def transform(
        self, Xs: Any = None, ys: Any = None, Xt: Any = None, yt: Any = None, batch_size: int = 128
    ) -> np.ndarray:
        """Transport source points onto the target domain with the entropic map.

        Parameters
        ----------
        Xs : array-like, shape (N, d)
            Points to transport: the fitted samples or new points.
        ys, Xt, yt
            Unused; accepted for POT compatibility.
        batch_size : int, default=128
            Accepted for POT compatibility and validated; sketchot evaluates the map in its
            own memory-bounded blocks, so the value does not change the result.

        Returns
        -------
        ndarray, shape (N, d)
        """
        return self._map(Xs, "Xs", batch_size, inverse=False)

    def inverse_transform(
        self, Xs: Any = None, ys: Any = None, Xt: Any = None, yt: Any = None, batch_size: int = 128
    ) -> np.ndarray:
        """Transport target points back onto the source domain with the inverse entropic map
        ``sum_i K(x_i, y) u_i x_i / sum_i K(x_i, y) u_i``. Same arguments as :meth:`transform`,
        with the points in ``Xt``."""
        return self._map(Xt, "Xt", batch_size, inverse=True)

    def transform_labels(self, ys: Any = None) -> np.ndarray:
        """Soft target labels ``(P^T masks(ys)) / (P^T 1)`` (POT's label propagation), computed
        with the lazy plan: shape ``(m, n_classes)``."""
        self._check_fitted()
        masks = self._label_masks(ys, "ys", self.xs_.shape[0])
        stacked = np.column_stack([masks, np.ones(masks.shape[0])])
        products = self.result_.lazy_plan.rmatmat(stacked)
        return _normalise_rows(products[:, :-1], products[:, -1])

    def inverse_transform_labels(self, yt: Any = None) -> np.ndarray:
        """Soft source labels ``(P masks(yt)) / (P 1)``: shape ``(n, n_classes)``."""
        self._check_fitted()
        masks = self._label_masks(yt, "yt", self.xt_.shape[0])
        stacked = np.column_stack([masks, np.ones(masks.shape[0])])
        products = self.result_.lazy_plan.matmat(stacked)
        return _normalise_rows(products[:, :-1], products[:, -1])

    @property
    def coupling_(self) -> np.ndarray:
        """The dense plan, for POT code that reads it; refuses above 1 GiB (use
        ``result_.lazy_plan`` for products and rows instead)."""
        self._check_fitted()
        return self.result_.plan

    # -------------------------------------------------------------------------- helpers
    def _map(self, points: Any, name: str, batch_size: Any, *, inverse: bool) -> np.ndarray:
        self._check_fitted()
        check_int(batch_size, "batch_size", minimum=1)
        if points is None:
            raise ValueError(f"{name} is missing: pass the points to transport as {name}=...")
        fitted = self.xt_ if inverse else self.xs_
        points = check_matrix(points, name, n_features=fitted.shape[1], feature_name="the fit")
        mapper = self.result_.inverse_barycentric_map if inverse else self.result_.barycentric_map
        if points.shape == fitted.shape and np.array_equal(points, fitted):
            points = None
        mapped, self.n_fallbacks_ = mapper(points, return_fallbacks=True)
        return mapped

    def _check_fitted(self) -> None:
        if not hasattr(self, "result_"):
            raise RuntimeError(
                f"this {type(self).__name__} is not fitted yet; call fit(Xs=..., Xt=...) first"
            )

    @staticmethod
    def _label_masks(labels: Any, name: str, n_points: int) -> np.ndarray:
        if labels is None:
            raise ValueError(f"{name} is missing: pass one label per fitted sample")
        labels = np.asarray(labels)
        if labels.ndim != 1 or labels.shape[0] != n_points:
            raise ValueError(
                f"{name} must be a 1-D array with one label per fitted sample ({n_points}); "
                f"got shape {labels.shape}"
            )
        _, index = np.unique(labels, return_inverse=True)
        index = index.reshape(-1)
        return np.eye(int(index.max()) + 1)[index]


#: ``sinkhorn``'s own arguments, which the estimator sets itself, and what to pass instead.
_RESERVED = {
    "reg": "reg_e=... (POT's name for the entropic regularisation)",
    "a": "distribution_estimation=... (the sample weights)",
    "b": "distribution_estimation=... (the sample weights)",
    "X": "fit(Xs=..., Xt=...)",
    "Y": "fit(Xs=..., Xt=...)",
    "backend": "backend=...",
    "rng": "rng=...",
}

#: Solver options that are the estimator's own constructor arguments (POT's names).
_OWN_OPTIONS = ("max_iter", "tol", "verbose", "safeguard")


def _check_backend_params(params: Any) -> dict[str, Any]:
    """Refuse backend parameters that are ``sinkhorn``'s own arguments or solver options: at
    ``fit`` they would reach ``sinkhorn`` twice."""
    if not isinstance(params, dict):
        raise TypeError(f"backend_params must be a dict; got {describe(params)}")
    for name in params:
        if name in _RESERVED:
            raise TypeError(
                f"SketchSinkhornTransport got {name}={params[name]!r} as a backend parameter, "
                f"but it sets {name!r} itself: pass {_RESERVED[name]}"
            )
        if name in SolverOptions.names():
            where = f"{name}=..." if name in _OWN_OPTIONS else f"solver_options={{{name!r}: ...}}"
            raise TypeError(
                f"SketchSinkhornTransport got the solver option {name}={params[name]!r} as a "
                f"backend parameter; pass {where}"
            )
    return params


def _check_solver_options(options: dict[str, Any]) -> dict[str, Any]:
    """Refuse solver options that are constructor arguments of their own (given twice)."""
    for name in options:
        if name in _OWN_OPTIONS:
            raise TypeError(
                f"solver_options holds {name!r}, an argument of SketchSinkhornTransport itself: "
                f"pass {name}=... to the constructor"
            )
    return options


def _normalise_rows(values: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """``values / totals[:, None]`` with 0 where the total is not positive (POT's nan_to_num)."""
    out = np.zeros_like(values)
    positive = totals > 0
    out[positive] = values[positive] / totals[positive, None]
    return out
