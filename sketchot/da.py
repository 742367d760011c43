"""A POT-style transport estimator (``ot.da`` API) backed by sketchot's kernels.

:class:`SketchSinkhornTransport` is a drop-in for ``ot.da.SinkhornTransport``: the same
methods and argument names (``fit(Xs=..., Xt=...)``, ``transform(Xs=...)``,
``inverse_transform(Xt=...)``, ``fit_transform``, ``transform_labels``,
``inverse_transform_labels``, ``get_params`` / ``set_params``), the same ``reg_e``, ``log``
and ``out_of_sample_map`` (both of POT's maps), plus ``backend`` and its parameters. POT's
``method``, ``norm`` and ``limit_max`` are refused by name (they need the dense cost or name
POT's solvers). POT's colour-transfer example runs unchanged after replacing
``ot.da.SinkhornTransport(reg_e=1e-1)`` by ``sketchot.SketchSinkhornTransport(reg_e=1e-1)``.

It subclasses ``ot.da.BaseTransport`` for ``fit_transform`` and ``get_params`` /
``set_params``, and overrides every method that would touch the dense cost or coupling:
POT's ``fit`` builds the ``n x m`` cost matrix and its ``transform`` the dense coupling, which
is exactly what sketchot avoids. Nothing here forms an ``n x m`` array (except the explicit,
size-checked :attr:`SketchSinkhornTransport.coupling_`); the ``'ferradans'`` map holds
``batch_size x n`` distances at a time.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from ot.da import BaseTransport, distribution_estimation_uniform

from . import policy
from ._validation import (
    RenamableError,
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_matrix,
    check_rng,
    check_weights,
    describe,
    unknown_names,
)
from .kernels import get_backend
from .solver import SinkhornResult, SolverOptions, check_backend_params, sinkhorn

#: POT's out-of-sample maps, both supported (POT's names).
OUT_OF_SAMPLE_MAPS = ("continuous", "ferradans")


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
    log : bool, default=False
        POT's name. ``log_`` is always filled (as POT's default continuous map does);
        ``log=True`` also puts POT's scalings ``u`` and ``v`` in it.
    out_of_sample_map : {'continuous', 'ferradans'}, default='continuous'
        How points other than the fitted samples are transported (POT's names; both agree on
        the fitted samples): ``'continuous'``, the entropic map above; ``'ferradans'``, the
        mapped nearest fitted sample shifted by the point's offset from it (Ferradans et al.,
        2014), found in blocks of ``batch_size`` points, ``O(batch_size n)`` memory.

    Attributes
    ----------
    result_ : SinkhornResult
        The solve (scalings, lazy plan, timings, true-kernel check).
    xs_, xt_ : ndarray
        The fitted samples.
    mu_s, mu_t : ndarray
        Their weights.
    log_ : dict
        POT's keys ``log_u``, ``log_v`` (the log-scalings, potentials over ``reg_e``),
        ``err`` (marginal errors at the checks) and ``niter``; sketchot's ``n_iter`` (=
        ``niter``) and ``converged``; with ``log=True`` also POT's ``u = exp(log_u)`` and
        ``v = exp(log_v)``, which overflow to ``inf`` where a log-scaling passes ~709 (cost /
        ``reg_e`` above ~700: read ``log_u`` and ``log_v`` there, as the maps do).
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
        log: bool = False,
        out_of_sample_map: str = "continuous",
        **extra_backend_params: Any,
    ) -> None:
        if backend_params is not None and not isinstance(backend_params, dict):
            raise TypeError(
                f"backend_params must be a dict or None; got {describe(backend_params)}"
            )
        if solver_options is not None and not isinstance(solver_options, dict):
            raise TypeError(
                f"solver_options must be a dict or None; got {describe(solver_options)}"
            )
        self.reg_e = reg_e
        self.backend = backend
        self.backend_params = {**(backend_params or {}), **extra_backend_params}
        self.max_iter = max_iter
        self.tol = tol
        self.verbose = verbose
        self.safeguard = safeguard
        self.distribution_estimation = distribution_estimation
        self.rng = rng
        self.solver_options = dict(solver_options or {})
        self.log = log
        self.out_of_sample_map = out_of_sample_map
        # every parameter checked here (POT checks out_of_sample_map here) and again at fit,
        # which set_params bypasses
        self._check_params()

    def _check_params(self) -> tuple[float, SolverOptions]:
        """Validate every constructor parameter without data, naming it; return ``reg_e`` as
        a float and the solver options."""
        reg_e = check_float(self.reg_e, "reg_e", positive=True)
        if self.backend != "auto":
            get_backend(self.backend)
        _check_backend_params(self.backend, self.backend_params)
        _check_solver_options(self.solver_options)
        options = SolverOptions(
            max_iter=self.max_iter,
            tol=self.tol,
            verbose=self.verbose,
            safeguard=self.safeguard,
            **self.solver_options,
        )
        if not callable(self.distribution_estimation):
            raise TypeError(
                "distribution_estimation must be a callable X -> weights (such as "
                "ot.da.distribution_estimation_uniform); got "
                f"{describe(self.distribution_estimation)}"
            )
        check_rng(self.rng)
        check_bool(self.log, "log")
        check_choice(self.out_of_sample_map, "out_of_sample_map", OUT_OF_SAMPLE_MAPS)
        return reg_e, options

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
        reg_e, options = self._check_params()  # set_params may have replaced any of them
        self.nx = self._get_backend(Xs, Xt)
        self.mu_s = self._weights(Xs, "Xs")
        self.mu_t = self._weights(Xt, "Xt")
        self.xs_, self.xt_ = Xs, Xt
        self.result_: SinkhornResult = sinkhorn(
            self.mu_s,
            self.mu_t,
            Xs,
            Xt,
            reg=reg_e,
            backend=self.backend,
            options=options,
            rng=self.rng,
            policy=policy,
            **self.backend_params,
        )
        log_u, log_v = self.result_.potentials
        self.log_ = {
            "log_u": log_u,
            "log_v": log_v,
            "err": [error for _, error in self.result_.error_history],
            "niter": self.result_.n_iter,
            "n_iter": self.result_.n_iter,
            "converged": self.result_.converged,
        }
        if self.log:
            self.log_["u"], self.log_["v"] = self.result_.u, self.result_.v
        self.n_fallbacks_ = 0
        return self

    def _weights(self, points: np.ndarray, name: str) -> np.ndarray:
        """``distribution_estimation(points)``, checked as weights and named as its output."""
        try:
            return check_weights(
                self.distribution_estimation(points), "weights", points.shape[0], name
            )
        except RenamableError as error:
            raise error.renamed(weights=f"distribution_estimation({name})") from None

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
        if points is None or self.out_of_sample_map == "continuous":
            mapped, self.n_fallbacks_ = mapper(points, return_fallbacks=True)
            return mapped
        check_choice(self.out_of_sample_map, "out_of_sample_map", OUT_OF_SAMPLE_MAPS)
        # 'ferradans': each point moves as its nearest fitted sample does
        fitted_mapped, self.n_fallbacks_ = mapper(None, return_fallbacks=True)
        fitted_norms = np.einsum("ij,ij->i", fitted, fitted)
        mapped = np.empty_like(points)
        for start in range(0, points.shape[0], batch_size):
            block = points[start : start + batch_size]
            # squared distances up to the block's own norms, which do not change the argmin
            nearest = np.argmin(fitted_norms[None, :] - 2.0 * block @ fitted.T, axis=1)
            mapped[start : start + batch_size] = fitted_mapped[nearest] + block - fitted[nearest]
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


#: ``ot.da.SinkhornTransport``'s arguments that sketchot does not take, and why.
_POT_ONLY = {
    "method": "sketchot chooses its own iteration (log domain where needed); "
    "solver_options={'log_domain': True} asks for the log domain",
    "norm": "normalising the cost needs its largest or median entry, i.e. the n x m cost "
    "matrix, which SketchSinkhornTransport never builds; scale reg_e instead",
    "limit_max": "it is the cost of pairs of different labels in the semi-supervised fit, "
    "which needs the n x m cost matrix (not supported)",
}

#: ``sinkhorn``'s named problem arguments that backend_params may carry (taken by sinkhorn
#: itself, not by the backend).
_PROBLEM_ARGS = ("reg_m", "metric", "p", "warmstart")


def _check_backend_params(backend: Any, params: Any) -> dict[str, Any]:
    """Refuse backend parameters that are ``sinkhorn``'s own arguments or solver options (at
    ``fit`` they would reach ``sinkhorn`` twice), POT arguments that sketchot does not take,
    and names that neither ``sinkhorn`` nor the backend accepts."""
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
        if name in _POT_ONLY:
            raise TypeError(
                f"SketchSinkhornTransport does not take ot.da.SinkhornTransport's {name}="
                f"{params[name]!r}: {_POT_ONLY[name]}"
            )
    if isinstance(backend, str):  # an invalid backend is named by get_backend
        given = {
            name: value
            for name, value in params.items()
            if name not in _PROBLEM_ARGS and not (name in ("rank", "dtype") and value is None)
        }
        check_backend_params("SketchSinkhornTransport", backend, given)
    return params


def _check_solver_options(options: Any) -> dict[str, Any]:
    """Refuse solver options that are constructor arguments of their own (given twice) or
    that are not solver options."""
    if not isinstance(options, dict):
        raise TypeError(f"solver_options must be a dict; got {describe(options)}")
    unknown = sorted(set(options) - set(SolverOptions.names()) - set(_OWN_OPTIONS))
    if unknown:
        raise TypeError(
            f"solver_options got unknown option(s) {unknown_names(unknown, SolverOptions.names())}"
            f"; solver options: {', '.join(SolverOptions.names())}"
        )
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
