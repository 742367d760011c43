"""POT-style transport estimators (``ot.da`` API) backed by sketchot's solver.

:class:`SketchSinkhornTransport` is a drop-in for ``ot.da.SinkhornTransport`` and
:class:`SketchUnbalancedSinkhornTransport` for ``ot.da.UnbalancedSinkhornTransport``: the
same methods and argument names (``fit(Xs=..., ys=..., Xt=..., yt=...)``,
``transform(Xs=...)``, ``inverse_transform(Xt=...)``, ``fit_transform``,
``transform_labels``, ``inverse_transform_labels``, ``get_params`` / ``set_params``), POT's
parameters (``reg_e``, ``reg_m``, ``method``, ``max_iter``, ``tol``, ``verbose``, ``log``,
``metric``, ``norm``, ``distribution_estimation``, ``out_of_sample_map``, ``limit_max``) and
attributes (``coupling_``, ``cost_``, ``log_``, ``mu_s``, ``mu_t``, ``xs_``, ``xt_``), plus
``backend`` and its parameters. POT's colour-transfer example runs unchanged after replacing
``ot.da.SinkhornTransport(reg_e=1e-1)`` by ``sketchot.SketchSinkhornTransport(reg_e=1e-1)``.

They are scikit-learn estimators in the sense of ``sklearn.base.clone``: ``__init__`` stores
its arguments unchanged and checks nothing; every check (naming the argument) runs at
``fit``, so ``set_params`` is checked the same way.

Three ways to solve, chosen by what the fit needs:

- **point clouds** (no labels; ``norm`` ``None`` or ``'max'``): :func:`sketchot.sinkhorn`
  on ``Xs``, ``Xt`` with any backend (``'auto'`` by default): ``O((n + m) r)`` memory, no
  ``n x m`` array. ``norm='max'`` divides the cost by its largest entry, computed exactly
  block by block, which is the kernel of ``reg_e`` times that entry.
- **the label-masked kernel** (the semi-supervised fit with ``limit_max=inf``, POT's
  default for ``SinkhornTransport``, and a named backend): the backend's kernel of the
  clouds restricted to the allowed label pairs (:class:`LabelledKernel`: the rows of one
  label times the columns allowed to it, ``O((n + m) r)`` per product for low-rank
  backends), certified against the true masked kernel (:class:`LabelledGeometry`) like
  any approximation; no ``n x m`` array.
- **the cost matrix** (the semi-supervised fit with ``backend='auto'`` or ``'exact'``, or a
  finite ``limit_max``; ``norm`` ``'median'``, ``'log'`` or ``'loglog'``): the ``n x m``
  cost with POT's label correction, solved with the exact kernel ``exp(-M / reg_e)`` (its
  check is exhaustive). Its memory is estimated before it is built and refused, naming the
  argument, above 1 GiB (where the exact backend with forbidden pairs streams the masked
  kernel instead).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from ot.da import BaseTransport, distribution_estimation_uniform

from .. import policy
from .._defaults import DEFAULT_ACCURACY, DEFAULT_MAX_DENSE_BYTES
from .._validation import (
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
from ..gibbs import GibbsGeometry, block_rows, make_cost, row_slices
from ..kernels import EXACT_BACKEND, build_kernel, get_backend
from ..solver import (
    SinkhornResult,
    SolverOptions,
    check_backend_params,
    check_reg_m,
    make_problem,
    sinkhorn,
    sinkhorn_matrix,
    solve,
)
from .labels import MISSING_LABEL, LabelledGeometry, LabelledKernel

#: POT's out-of-sample maps, both supported by both estimators (POT's names).
OUT_OF_SAMPLE_MAPS = ("continuous", "ferradans")

#: POT's cost normalisations (``ot.utils.cost_normalization``), ``None`` for none.
NORMS = ("median", "max", "log", "loglog")

#: ``ot.sinkhorn``'s methods (``SinkhornTransport(method=...)``): one fixed point, several
#: iterations; sketchot runs its own (log domain where needed) for every one.
SINKHORN_METHODS = (
    "sinkhorn",
    "sinkhorn_log",
    "greenkhorn",
    "sinkhorn_stabilized",
    "sinkhorn_epsilon_scaling",
)

#: ``ot.unbalanced.sinkhorn_unbalanced``'s methods (``UnbalancedSinkhornTransport(method=)``).
UNBALANCED_METHODS = (
    "sinkhorn",
    "sinkhorn_stabilized",
    "sinkhorn_reg_scaling",
    "sinkhorn_translation_invariant",
)

#: A forbidden pair (``limit_max=inf``) is solved with the finite stand-in cost
#: ``3 max(M) + FORBIDDEN_MARGIN reg_e``: its kernel entry is below every allowed entry by a
#: factor ``exp(-1500)`` (< 1e-651, under float64's smallest number), more than any gap of
#: entropic potentials (at most ``max(M) / reg_e``) can bring back, so its plan entry is 0.
FORBIDDEN_MARGIN = 1500.0

#: The cost matrix of the semi-supervised fit and ``norm='median'`` is refused above this;
#: the fit holds about three ``n x m`` float64 arrays at once (cost, kernel, a temporary).
DENSE_COPIES = 3


class NotFittedError(RuntimeError, AttributeError):
    """An estimator used before ``fit`` (an ``AttributeError`` too, so that ``hasattr(est,
    'coupling_')`` is False before fitting, as scikit-learn expects)."""


class _SketchTransport(BaseTransport):
    """What both estimators share: checks, the two solves, the maps, the labels."""

    #: ``method=`` values accepted (POT's names for the estimator's solver).
    _methods: tuple[str, ...] = SINKHORN_METHODS
    #: Whether ``reg_m`` is a parameter (unbalanced transport).
    _unbalanced = False

    # ------------------------------------------------------------------------- checks
    def _check_params(self) -> dict[str, Any]:
        """Validate every constructor parameter without data, naming it (``__init__``
        checks nothing: scikit-learn's convention, and ``set_params`` bypasses it)."""
        checked: dict[str, Any] = {}
        checked["reg_e"] = check_float(self.reg_e, "reg_e", positive=True)
        if self._unbalanced:
            if self.reg_m is None:
                raise ValueError(
                    "reg_m must be a positive number (the KL marginal penalty); got None: "
                    "use SketchSinkhornTransport for balanced transport"
                )
            try:
                checked["reg_m"] = check_reg_m(self.reg_m, checked["reg_e"])
            except RenamableError as error:
                raise error.renamed(reg_m="reg_m") from None
        check_choice(self.method, "method", self._methods)
        checked["cost"] = make_cost(self.metric)
        if self.norm is not None:
            check_choice(self.norm, "norm", NORMS)
        checked["limit_max"] = _check_limit_max(self.limit_max)
        if self.backend != "auto":
            get_backend(self.backend)
        backend_params = {} if self.backend_params is None else self.backend_params
        _check_backend_params(type(self).__name__, self.backend, backend_params)
        checked["backend_params"] = dict(backend_params)
        solver_options = {} if self.solver_options is None else self.solver_options
        _check_solver_options(type(self).__name__, solver_options)
        checked["options"] = SolverOptions(
            max_iter=self.max_iter,
            tol=self.tol,
            verbose=self.verbose,
            safeguard=self.safeguard,
            **solver_options,
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
        return checked

    # ---------------------------------------------------------------------------- fit
    def fit(self, Xs: Any = None, ys: Any = None, Xt: Any = None, yt: Any = None):
        """Solve the entropic transport between ``Xs`` and ``Xt``.

        Parameters
        ----------
        Xs : array-like, shape (n, d)
            Source samples.
        ys : array-like, shape (n,), optional
            Source labels; with ``yt`` too, the semi-supervised fit: pairs of two labelled
            samples of different labels cost ``limit_max`` (POT's rule). ``-1`` marks an
            unlabelled sample, which pairs with every target sample.
        Xt : array-like, shape (m, d)
            Target samples.
        yt : array-like, shape (m,), optional
            Target labels (``-1``: unlabelled).

        Returns
        -------
        self
        """
        if Xs is None or Xt is None:
            missing = " and ".join(name for name, x in (("Xs", Xs), ("Xt", Xt)) if x is None)
            raise ValueError(
                f"fit needs source samples Xs and target samples Xt; {missing} missing"
            )
        checked = self._check_params()
        Xs = check_matrix(Xs, "Xs")
        Xt = check_matrix(Xt, "Xt", n_features=Xs.shape[1], feature_name="Xs")
        labels = None
        if ys is not None and yt is not None:  # POT: one side's labels alone are unused
            labels = (_check_labels(ys, "ys", Xs.shape[0]), _check_labels(yt, "yt", Xt.shape[0]))
        self.nx = self._get_backend(Xs, Xt)
        self.mu_s = self._weights(Xs, "Xs")
        self.mu_t = self._weights(Xt, "Xt")
        self.xs_, self.xt_ = Xs, Xt
        self.labels_ = labels
        if labels is not None and self._labelled_operator(Xs, Xt, checked):
            self._fit_labelled(Xs, Xt, labels, checked)
        elif labels is not None or self.norm in ("median", "log", "loglog"):
            self._fit_matrix(Xs, Xt, labels, checked)
        else:
            self._fit_clouds(Xs, Xt, checked)
        self.log_ = self._make_log(checked)
        self.n_fallbacks_ = 0
        return self

    def _fit_clouds(self, Xs: np.ndarray, Xt: np.ndarray, checked: dict[str, Any]) -> None:
        """The solve on the clouds: any backend, no ``n x m`` array."""
        cost = checked["cost"]
        # POT's 'max' norm divides the cost by its largest entry: the kernel of reg_e times it
        scale = _max_cost(Xs, Xt, cost) if self.norm == "max" else 1.0
        if not scale > 0:
            raise ValueError(
                "norm='max' divides the cost by its largest entry, which is 0 here (Xs and Xt "
                "are one point): use norm=None"
            )
        self.norm_cost_ = scale if self.norm == "max" else None
        self.fit_path_ = "clouds"
        reg_m = None
        if self._unbalanced:
            reg_m = tuple(value * scale for value in checked["reg_m"])
        self.result_: SinkhornResult = sinkhorn(
            self.mu_s,
            self.mu_t,
            Xs,
            Xt,
            reg=checked["reg_e"] * scale,
            backend=self.backend,
            options=checked["options"],
            reg_m=reg_m,
            metric=cost.metric,
            rng=self.rng,
            policy=policy,
            **checked["backend_params"],
        )
        self._scale = scale

    def _labelled_operator(self, Xs, Xt, checked: dict[str, Any]) -> bool:
        """Whether the semi-supervised fit runs on the label-masked operator of the clouds
        (forbidden pairs, a named backend that is approximate, or the exact one above the
        cost matrix's budget) rather than on the cost matrix."""
        if self.norm in ("median", "log", "loglog") or not math.isinf(checked["limit_max"]):
            return False
        if self.backend == EXACT_BACKEND:
            return DENSE_COPIES * Xs.shape[0] * Xt.shape[0] * 8 > DEFAULT_MAX_DENSE_BYTES
        return self.backend != "auto"

    def _fit_labelled(self, Xs, Xt, labels, checked: dict[str, Any]) -> None:
        """The semi-supervised fit with forbidden pairs on any backend: the clouds' kernel
        restricted to the allowed label pairs (:class:`LabelledKernel`), no ``n x m``
        array; certified against the true masked kernel (:class:`LabelledGeometry`)."""
        cost = checked["cost"]
        scale = _max_cost(Xs, Xt, cost) if self.norm == "max" else 1.0
        if not scale > 0:
            raise ValueError(
                "norm='max' divides the cost by its largest entry, which is 0 here (Xs and Xt "
                "are one point): use norm=None"
            )
        self.norm_cost_ = scale if self.norm == "max" else None
        self.fit_path_ = "labelled"
        self._scale = scale
        if Xs.shape == Xt.shape and np.array_equal(Xs, Xt) and not np.array_equal(*labels):
            # the solver's symmetric iteration (same cloud, same weights) needs K' = K'^T
            raise ValueError(
                "Xs and Xt are the same cloud with different labels ys and yt: the "
                "label-masked kernel is not symmetric there; pass backend='auto' (the cost "
                "matrix) or fit on distinct clouds"
            )
        reg = checked["reg_e"] * scale
        options = checked["options"]
        params = {k: v for k, v in checked["backend_params"].items() if v is not None}
        base = build_kernel(
            GibbsGeometry(Xs, Xt, reg, cost.metric),
            self.backend,
            rng=self.rng,
            accuracy=options.accuracy if options.accuracy is not None else DEFAULT_ACCURACY,
            policy=policy,
            **params,
        )
        kernel = LabelledKernel(base, LabelledGeometry(Xs, Xt, reg, cost.metric, *labels))
        reg_m = None
        if self._unbalanced:
            reg_m = tuple(value * scale for value in checked["reg_m"])
        problem = make_problem(self.mu_s, self.mu_t, kernel.shape, reg, reg_m)
        self.result_ = solve(problem, kernel, options, rng=self.rng)

    def _fit_matrix(self, Xs, Xt, labels, checked: dict[str, Any]) -> None:
        """The solve on the ``n x m`` cost (labels, ``norm`` other than ``'max'``) with the
        exact kernel; refused by name where the cost would not fit."""
        n, m = Xs.shape[0], Xt.shape[0]
        need = DENSE_COPIES * n * m * 8
        why = "the semi-supervised fit (ys and yt)" if labels is not None else f"norm={self.norm!r}"
        if need > DEFAULT_MAX_DENSE_BYTES:
            raise MemoryError(
                f"{why} needs the {n} x {m} cost matrix (about {need / 2**20:.0f} MiB with the "
                f"kernel, above {DEFAULT_MAX_DENSE_BYTES / 2**20:.0f} MiB): fit on fewer "
                "samples; or, for labels, limit_max=inf (forbidden pairs) with norm None or "
                "'max' and a backend (any of sketchot.available_backends(): the label-masked "
                "kernel needs no n x m array)"
            )
        if (
            self.backend not in ("auto", EXACT_BACKEND)
            and labels is not None
            and (self.norm not in ("median", "log", "loglog"))
        ):
            raise ValueError(
                f"limit_max={checked['limit_max']:g} (finite) with backend={self.backend!r}: "
                "pairs of different labels then cost limit_max, not their distance, which no "
                "approximation of the clouds' kernel represents; pass limit_max=inf "
                "(forbidden pairs: any backend) or backend='auto' (the cost matrix)"
            )
        if self.backend not in ("auto", EXACT_BACKEND):
            raise ValueError(
                f"{why} is solved on the cost matrix with the exact kernel; backend="
                f"{self.backend!r} cannot represent it: use backend='auto' or "
                f"{EXACT_BACKEND!r}"
            )
        params = dict(checked["backend_params"])
        dtype = params.pop("dtype", None)
        if params:
            raise TypeError(
                f"{why} is solved on the cost matrix with the exact kernel, which takes only "
                f"dtype; got backend parameter(s) {', '.join(map(repr, sorted(params)))}"
            )
        M, forbidden = self._cost_matrix(Xs, Xt, labels, checked)
        reg_e = checked["reg_e"]
        if forbidden is not None and forbidden.any():
            allowed_max = float(M[~forbidden].max()) if not forbidden.all() else 0.0
            M[forbidden] = 3.0 * allowed_max + FORBIDDEN_MARGIN * reg_e
        self.fit_path_ = "matrix"
        self._scale = 1.0
        self.result_ = sinkhorn_matrix(
            self.mu_s,
            self.mu_t,
            M,
            reg_e,
            options=checked["options"],
            reg_m=checked.get("reg_m"),
            rng=self.rng,
            dtype=np.float64 if dtype is None else dtype,
        )

    def _cost_matrix(self, Xs, Xt, labels, checked, *, fitted: bool = False):
        """POT's ``cost_``: the cost, normalised, with the label correction; the mask of the
        forbidden pairs (``limit_max=inf``) or ``None``. ``fitted``: reuse ``norm_cost_``."""
        cost = checked["cost"]
        M = _cost_block(cost, Xs, Xt, _center(cost, Xs, Xt))
        value = self.norm_cost_ if fitted else _norm_value(M, self.norm)
        M = _normalise(M, self.norm, value)
        if not fitted:
            self.norm_cost_ = value
        if labels is None:
            return M, None
        ys, yt = labels
        mismatch = (ys != MISSING_LABEL)[:, None] & (yt != MISSING_LABEL)[None, :]
        mismatch &= ys[:, None] != yt[None, :]
        limit = checked["limit_max"]
        if math.isinf(limit):
            return M, mismatch
        # POT: a finite limit_max is in units of the largest (normalised) cost
        np.maximum(M, limit * float(M.max()), out=M, where=mismatch)
        return M, None

    def _weights(self, points: np.ndarray, name: str) -> np.ndarray:
        """``distribution_estimation(points)``, checked as weights and named as its output."""
        try:
            return check_weights(
                self.distribution_estimation(points), "weights", points.shape[0], name
            )
        except RenamableError as error:
            raise error.renamed(weights=f"distribution_estimation({name})") from None

    def _make_log(self, checked: dict[str, Any]) -> dict[str, Any]:
        log_u, log_v = self.result_.potentials
        out = {
            "log_u": log_u,
            "log_v": log_v,
            "err": [error for _, error in self.result_.error_history],
            "niter": self.result_.n_iter,
            "n_iter": self.result_.n_iter,
            "converged": self.result_.converged,
        }
        if self.log:
            out.update(self._pot_log(checked))
        return out

    def _pot_log(self, checked: dict[str, Any]) -> dict[str, Any]:
        """POT's ``log=True`` keys of ``ot.sinkhorn(method='sinkhorn_log')``: ``u``, ``v``."""
        return {"u": self.result_.u, "v": self.result_.v}

    # ------------------------------------------------------------------------ transport
    def transform(
        self, Xs: Any = None, ys: Any = None, Xt: Any = None, yt: Any = None, batch_size: int = 128
    ) -> np.ndarray:
        """Transport source points onto the target domain.

        On the fitted samples both maps give the plan's barycentric projection
        ``(P Xt) / (P 1)``; elsewhere ``out_of_sample_map`` decides (see the class).

        Parameters
        ----------
        Xs : array-like, shape (N, d)
            Points to transport: the fitted samples or new points.
        ys, Xt, yt
            Unused; accepted for POT compatibility.
        batch_size : int, default=128
            Points per block of the out-of-sample maps (POT's name); the result does not
            depend on it.

        Returns
        -------
        ndarray, shape (N, d)
        """
        return self._map(Xs, "Xs", batch_size, inverse=False)

    def inverse_transform(
        self, Xs: Any = None, ys: Any = None, Xt: Any = None, yt: Any = None, batch_size: int = 128
    ) -> np.ndarray:
        """Transport target points back onto the source domain (the inverse maps, ``P^T``
        in place of ``P``). Same arguments as :meth:`transform`, with the points in ``Xt``."""
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
        self._check_fitted(attribute="coupling_")
        return self.result_.plan

    @property
    def cost_(self) -> np.ndarray:
        """POT's ``cost_``: the ``n x m`` cost, normalised (``norm``), with ``+inf`` (POT:
        the largest float) or ``limit_max`` times the largest cost on pairs of different
        labels; computed when read (the point-cloud solve never builds it) and refused above
        1 GiB."""
        self._check_fitted(attribute="cost_")
        n, m = self.xs_.shape[0], self.xt_.shape[0]
        if n * m * 8 > DEFAULT_MAX_DENSE_BYTES:
            raise MemoryError(
                f"cost_ would build the {n} x {m} cost matrix ({n * m * 8 / 2**20:.0f} MiB > "
                f"{DEFAULT_MAX_DENSE_BYTES / 2**20:.0f} MiB); the fit does not need it: read "
                "result_ (potentials, lazy plan) instead"
            )
        checked = {"cost": make_cost(self.metric), "limit_max": _check_limit_max(self.limit_max)}
        M, forbidden = self._cost_matrix(self.xs_, self.xt_, self.labels_, checked, fitted=True)
        if forbidden is not None:
            M[forbidden] = np.inf
        return M

    # -------------------------------------------------------------------------- helpers
    def _map(self, points: Any, name: str, batch_size: Any, *, inverse: bool) -> np.ndarray:
        self._check_fitted()
        batch_size = check_int(batch_size, "batch_size", minimum=1)
        check_choice(self.out_of_sample_map, "out_of_sample_map", OUT_OF_SAMPLE_MAPS)
        if points is None:
            raise ValueError(f"{name} is missing: pass the points to transport as {name}=...")
        fitted = self.xt_ if inverse else self.xs_
        points = check_matrix(points, name, n_features=fitted.shape[1], feature_name="the fit")
        on_fitted = points.shape == fitted.shape and np.array_equal(points, fitted)
        if on_fitted:
            return self._fitted_map(inverse)
        if self.out_of_sample_map == "continuous":
            return self._continuous_map(points, batch_size, inverse)
        # 'ferradans': each point moves as its nearest fitted sample does
        fitted_mapped = self._fitted_map(inverse)
        fitted_norms = np.einsum("ij,ij->i", fitted, fitted)
        mapped = np.empty_like(points)
        for start in range(0, points.shape[0], batch_size):
            block = points[start : start + batch_size]
            # squared distances up to the block's own norms, which do not change the argmin
            nearest = np.argmin(fitted_norms[None, :] - 2.0 * block @ fitted.T, axis=1)
            mapped[start : start + batch_size] = fitted_mapped[nearest] + block - fitted[nearest]
        return mapped

    def _fitted_map(self, inverse: bool) -> np.ndarray:
        """The barycentric projection of the plan on the fitted samples (0 for a sample the
        plan gives no mass, as POT's ``nan_to_num``)."""
        if self.fit_path_ == "clouds":
            mapper = (
                self.result_.inverse_barycentric_map if inverse else self.result_.barycentric_map
            )
            mapped, self.n_fallbacks_ = mapper(None, return_fallbacks=True)
            return mapped
        self.n_fallbacks_ = 0
        other = self.xs_ if inverse else self.xt_
        stacked = np.column_stack([other, np.ones(other.shape[0])])
        plan = self.result_.lazy_plan
        products = plan.rmatmat(stacked) if inverse else plan.matmat(stacked)
        return _normalise_rows(products[:, :-1], products[:, -1])

    def _continuous_map(self, points: np.ndarray, batch_size: int, inverse: bool) -> np.ndarray:
        """POT's ``'continuous'`` map of new points: ``sum_j K(x, y_j) v_j y_j / sum_j K(x,
        y_j) v_j`` (the kernel of the normalised cost, without labels: new points have
        none)."""
        if self.fit_path_ == "clouds":
            mapper = (
                self.result_.inverse_barycentric_map if inverse else self.result_.barycentric_map
            )
            mapped, self.n_fallbacks_ = mapper(points, return_fallbacks=True)
            return mapped
        self.n_fallbacks_ = 0
        cost = make_cost(self.metric)
        other = self.xs_ if inverse else self.xt_
        log_weights = self.result_.potentials[0 if inverse else 1]
        center = _center(cost, self.xs_, self.xt_)
        reg_e = float(self.reg_e)
        mapped = np.empty_like(points)
        step = min(batch_size, block_rows(other.shape[0]))
        for rows in row_slices(points.shape[0], max(1, step)):
            block = _cost_block(cost, points[rows], other, center, transpose=inverse)
            logits = log_weights[None, :] - _normalise(block, self.norm, self.norm_cost_) / reg_e
            logits -= logits.max(axis=1, keepdims=True)
            weights = np.exp(logits)
            mapped[rows] = (weights @ other) / weights.sum(axis=1, keepdims=True)
        return mapped

    def _check_fitted(self, attribute: str | None = None) -> None:
        if not hasattr(self, "result_"):
            what = f"{attribute} is set by fit" if attribute else "it"
            raise NotFittedError(
                f"this {type(self).__name__} is not fitted yet ({what}); call fit(Xs=..., "
                "Xt=...) first"
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


class SketchSinkhornTransport(_SketchTransport):
    """Entropic OT domain adaptation (POT's ``SinkhornTransport``) with a pluggable kernel.

    Fits ``P = diag(u) K diag(v)`` between source samples ``Xs`` and target samples ``Xt``
    with :func:`sketchot.sinkhorn`, ``K = exp(-c(x, y) / reg_e)`` (POT's squared Euclidean
    cost by default, not normalised), and transports points with the entropic map

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
        POT's name and default.
    tol : float or None, default=None
        ``None``: the solver stops at the accuracy of ``solver_options`` (certified against
        the true kernel, see :class:`~sketchot.SolverOptions`); a float: the L2
        column-marginal error at which it stops (POT's criterion; POT's default is 1e-8,
        which an approximate kernel reaches on its own fixed point, not on the true one).
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
    method : str, default='sinkhorn_log'
        POT's name and values (``'sinkhorn'``, ``'sinkhorn_log'``, ``'greenkhorn'``,
        ``'sinkhorn_stabilized'``, ``'sinkhorn_epsilon_scaling'``): all solve the same
        problem; sketchot runs its own iteration (log domain, epsilon schedule where needed)
        for each, so the value is checked and recorded, not followed.
    metric : str or callable, default='sqeuclidean'
        The ground cost (POT's ``ot.dist`` names: ``'sqeuclidean'``, ``'euclidean'``,
        ``'cityblock'``, ``'minkowski'``, or a callable). Approximate backends need
        ``'sqeuclidean'``; ``'auto'`` chooses accordingly.
    norm : {None, 'median', 'max', 'log', 'loglog'}, default=None
        POT's cost normalisation. ``'max'`` runs on the point clouds (the largest cost is
        computed block by block); the others need the ``n x m`` cost (the exact kernel on
        the cost matrix, refused above 1 GiB).
    limit_max : float, default=inf
        The semi-supervised fit (``ys`` and ``yt`` both given): the cost of two labelled
        samples of different labels. ``inf`` (POT's default) forbids the pair (a kernel entry
        of 0: any backend, the kernel restricted label by label); a finite value is in
        units of the largest cost, as in POT (on the cost matrix only).

    Attributes
    ----------
    result_ : SinkhornResult
        The solve (scalings, lazy plan, timings, true-kernel check).
    xs_, xt_ : ndarray
        The fitted samples.
    mu_s, mu_t : ndarray
        Their weights.
    coupling_ : ndarray, shape (n, m)
        The dense plan (a property: built when read, refused above 1 GiB).
    cost_ : ndarray, shape (n, m)
        POT's cost matrix (a property: built when read, refused above 1 GiB).
    norm_cost_ : float or None
        The normalisation's value (``'median'`` and ``'max'``), as POT's.
    log_ : dict
        POT's keys ``log_u``, ``log_v`` (the log-scalings, potentials over ``reg_e``),
        ``err`` (marginal errors at the checks) and ``niter``; sketchot's ``n_iter`` (=
        ``niter``) and ``converged``; with ``log=True`` also POT's ``u = exp(log_u)`` and
        ``v = exp(log_v)``, which overflow to ``inf`` where a log-scaling passes ~709 (cost /
        ``reg_e`` above ~700: read ``log_u`` and ``log_v`` there, as the maps do).
    n_fallbacks_ : int
        Points of the last ``transform`` / ``inverse_transform`` call whose approximate
        denominator was not positive and which were mapped with the exact kernel instead.
    fit_path_ : {'clouds', 'labelled', 'matrix'}
        How the fit was solved (see the module notes).
    labels_ : tuple of ndarray or None
        ``(ys, yt)`` of a semi-supervised fit, else ``None``.

    Notes
    -----
    ``fit`` costs ``O((n + m) r)`` per iteration for rank-``r`` backends; ``transform`` of
    ``N`` points costs ``O(N r)`` (``O(N m d)`` streamed for the exact backend). Inputs are
    numpy arrays (anything ``numpy.asarray`` accepts); outputs are numpy arrays.

    The semi-supervised fit (``ys`` and ``yt``) solves POT's problem: with ``backend='auto'``
    on the cost matrix with the label correction and the exact kernel; with a named backend
    and ``limit_max=inf`` on that backend's kernel restricted to the allowed label pairs,
    without an ``n x m`` array (see the module notes). A finite ``limit_max`` needs the
    cost matrix.

    Differences from POT, each by design: ``__init__`` checks nothing (``fit`` does, naming
    the argument: scikit-learn's convention), so an unknown ``out_of_sample_map`` fails at
    ``fit``; ``fit`` never changes a parameter (POT's ``fit`` sets ``log=True`` and
    multiplies ``limit_max`` by the largest cost); ``cost_`` holds ``+inf`` on forbidden
    pairs (POT's holds the largest float, 1.8e308); after a semi-supervised fit the fitted
    samples are mapped by the label-aware plan's projection with either map (POT's
    continuous map recomputes them without the labels).

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
        method: str = "sinkhorn_log",
        metric: Any = "sqeuclidean",
        norm: str | None = None,
        limit_max: float = np.inf,
        **extra_backend_params: Any,
    ) -> None:
        self.reg_e = reg_e
        self.backend = backend
        self.backend_params = _merged(type(self).__name__, backend_params, extra_backend_params)
        self.max_iter = max_iter
        self.tol = tol
        self.verbose = verbose
        self.safeguard = safeguard
        self.distribution_estimation = distribution_estimation
        self.rng = rng
        self.solver_options = solver_options
        self.log = log
        self.out_of_sample_map = out_of_sample_map
        self.method = method
        self.metric = metric
        self.norm = norm
        self.limit_max = limit_max


class SketchUnbalancedSinkhornTransport(_SketchTransport):
    """Unbalanced entropic OT domain adaptation (POT's ``UnbalancedSinkhornTransport``).

    Fits the plan of POT's ``ot.unbalanced.sinkhorn_unbalanced`` (``reg_type='kl'``: the
    entropy relative to ``mu_s mu_t^T`` and KL marginal penalties ``reg_m``) with sketchot's
    unbalanced solver, ``P = diag(u) K diag(v)``, ``K = exp(-c(x, y) / reg_e)``, on the point
    clouds (any backend) or, for the semi-supervised fit, on the cost matrix with the exact
    kernel. Transports points as :class:`SketchSinkhornTransport` does: on the fitted
    samples the barycentric projection ``(P Xt) / (P 1)`` (which does not depend on ``u``),
    elsewhere ``out_of_sample_map``.

    Parameters
    ----------
    reg_e : float, default=1.0
        Entropic regularisation (POT's name and default).
    reg_m : float or pair, default=0.1
        KL marginal penalty (POT's name and default; a pair: source and target sides).
    method : str, default='sinkhorn'
        POT's values (``'sinkhorn'``, ``'sinkhorn_stabilized'``, ``'sinkhorn_reg_scaling'``,
        ``'sinkhorn_translation_invariant'``): one problem; sketchot runs its own iteration.
    max_iter : int, default=10
        POT's name and default (the KL penalties make the iteration contract fast: on
        ``test_unbalanced_sinkhorn_transport_class``'s data both POT and sketchot converge
        within 10 or 11 iterations); a solve stopped by it before its accuracy warns.
    tol : float or None, default=None
        As :class:`SketchSinkhornTransport`'s (POT's default 1e-9 is a change of the
        scalings, not a marginal error).
    verbose, log : bool, default=False
        ``log=True`` adds POT's keys ``logu``, ``logv`` (POT's log-scalings of the kernel
        ``mu_s mu_t^T exp(-M / reg_e)``: ``log_u - log mu_s``), ``cost`` (``<P, M>``) and
        ``total_cost`` (POT's objective: ``cost`` plus ``reg_e KL(P | mu_s mu_t^T)`` plus
        ``reg_m`` times the KL of each marginal, with POT's ``kl_div`` without its mass
        terms) to ``log_``.
    metric, norm, distribution_estimation
        As :class:`SketchSinkhornTransport`'s.
    out_of_sample_map : {'ferradans', 'continuous'}, default='ferradans'
        POT's default; POT's unbalanced estimator has only ``'ferradans'``, sketchot also the
        continuous entropic map.
    limit_max : float, default=10
        The semi-supervised fit: pairs of different labels cost ``limit_max`` times the
        largest cost (POT's default, a finite penalty); ``inf`` forbids them.
    backend, backend_params, safeguard, rng, solver_options, **extra_backend_params
        As :class:`SketchSinkhornTransport`'s.

    Attributes
    ----------
    result_, xs_, xt_, mu_s, mu_t, coupling_, cost_, norm_cost_, log_, n_fallbacks_,
    fit_path_, labels_
        As :class:`SketchSinkhornTransport`'s.

    Examples
    --------
    >>> import numpy as np, sketchot
    >>> rng = np.random.default_rng(0)
    >>> Xs, Xt = rng.random((300, 3)), rng.random((200, 3)) * 0.5
    >>> est = sketchot.SketchUnbalancedSinkhornTransport(reg_e=0.1, reg_m=1.0, rng=0)
    >>> est.fit(Xs=Xs, Xt=Xt).transform(Xs=Xs[:5]).shape
    (5, 3)
    """

    _methods = UNBALANCED_METHODS
    _unbalanced = True

    def __init__(
        self,
        reg_e: float = 1.0,
        reg_m: Any = 0.1,
        method: str = "sinkhorn",
        max_iter: int = 10,
        tol: float | None = None,
        verbose: bool = False,
        log: bool = False,
        metric: Any = "sqeuclidean",
        norm: str | None = None,
        distribution_estimation: Any = distribution_estimation_uniform,
        out_of_sample_map: str = "ferradans",
        limit_max: float = 10,
        backend: str = "auto",
        backend_params: dict[str, Any] | None = None,
        safeguard: str = "exact",
        rng: Any = None,
        solver_options: dict[str, Any] | None = None,
        **extra_backend_params: Any,
    ) -> None:
        self.reg_e = reg_e
        self.reg_m = reg_m
        self.method = method
        self.max_iter = max_iter
        self.tol = tol
        self.verbose = verbose
        self.log = log
        self.metric = metric
        self.norm = norm
        self.distribution_estimation = distribution_estimation
        self.out_of_sample_map = out_of_sample_map
        self.limit_max = limit_max
        self.backend = backend
        self.backend_params = _merged(type(self).__name__, backend_params, extra_backend_params)
        self.safeguard = safeguard
        self.rng = rng
        self.solver_options = solver_options

    def _pot_log(self, checked: dict[str, Any]) -> dict[str, Any]:
        """POT's keys of ``sinkhorn_unbalanced(..., log=True)`` (``method='sinkhorn'``), in
        the units of the normalised cost."""
        result = self.result_
        log_u, log_v = result.potentials
        a, b = self.mu_s, self.mu_t
        row, col = result.marginals
        reg_e = checked["reg_e"]
        reg_m_a, reg_m_b = checked["reg_m"]
        with np.errstate(divide="ignore", invalid="ignore"):
            logu = log_u - np.log(a)
            logv = log_v - np.log(b)
            cost = result.value_linear / self._scale
            # POT's kl_div(P, a b^T) (no mass terms) from the marginals: log(P_ij / (a_i
            # b_j)) = logu_i + logv_j - M_ij / reg_e
            entropy = _xlogy_sum(row, logu) + _xlogy_sum(col, logv) - cost / reg_e
        total = cost + reg_e * entropy
        if math.isfinite(reg_m_a):
            total += reg_m_a * _kl(row, a)
        if math.isfinite(reg_m_b):
            total += reg_m_b * _kl(col, b)
        return {"logu": logu, "logv": logv, "cost": cost, "total_cost": float(total)}


# ------------------------------------------------------------------------------ helpers
def _merged(caller: str, backend_params: Any, extra: dict[str, Any]) -> Any:
    """``backend_params`` unchanged (scikit-learn's ``clone`` needs the very object back), or
    merged with the keyword arguments that are backend parameters. An argument that is not
    a keyword of the constructor but names another of the estimator's inputs is refused
    here (a misspelt signature, like Python's own ``unexpected keyword``)."""
    if not extra:
        return backend_params
    for name in extra:
        if name in _RESERVED:
            raise TypeError(
                f"{caller} got {name}={extra[name]!r} as a backend parameter, but it sets "
                f"{name!r} itself: pass {_RESERVED[name]}"
            )
    if not isinstance(backend_params, dict | type(None)):
        return backend_params  # fit refuses it, naming it (__init__ raises for no value)
    return {**(backend_params or {}), **extra}


def _check_limit_max(value: Any) -> float:
    """``limit_max``: a real number ``> 0``, ``inf`` allowed (POT's default)."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.number):
        raise TypeError(f"limit_max must be a real number > 0 or inf; got {describe(value)}")
    value = float(value)
    if not value > 0:
        raise ValueError(f"limit_max must be > 0 (or inf: forbidden pairs); got {value}")
    return value


def _check_labels(labels: Any, name: str, n_points: int) -> np.ndarray:
    """A 1-D array of real labels, one per sample, ``-1`` for unlabelled (POT's rule)."""
    array = np.asarray(labels)
    if array.dtype.kind not in "biuf":
        raise TypeError(
            f"{name} must be an array of numeric labels (-1: unlabelled); got {describe(labels)}"
        )
    if array.ndim != 1 or array.shape[0] != n_points:
        raise ValueError(
            f"{name} must be a 1-D array with one label per sample ({n_points}); got shape "
            f"{array.shape}"
        )
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        raise ValueError(f"{name} must contain finite labels; got NaN or inf")
    return array


def _center(cost: Any, Xs: np.ndarray, Xt: np.ndarray) -> np.ndarray | None:
    """The clouds' common mean for a translation-invariant cost (accurate differences)."""
    if not cost.translation_invariant:
        return None
    return (Xs.sum(axis=0) + Xt.sum(axis=0)) / (Xs.shape[0] + Xt.shape[0])


def _cost_block(cost, A, B, center, *, transpose: bool = False) -> np.ndarray:
    """``c(a_i, b_j)`` (``c(b_j, a_i)`` transposed with ``transpose``), centred points."""
    if center is not None:
        A, B = A - center, B - center
    block = cost.block(B, A).T if transpose else cost.block(A, B)
    return np.maximum(block, 0.0)  # rounding of ||a||^2 + ||b||^2 - 2 a.b below 0


def _max_cost(Xs: np.ndarray, Xt: np.ndarray, cost: Any) -> float:
    """The largest cost, exactly, block by block: ``O(n m d)`` time, ``O(block)`` memory."""
    center = _center(cost, Xs, Xt)
    top = 0.0
    for rows in row_slices(Xs.shape[0], block_rows(Xt.shape[0])):
        top = max(top, float(_cost_block(cost, Xs[rows], Xt, center).max()))
    return top


def _norm_value(M: np.ndarray, norm: str | None) -> float | None:
    """POT's ``norm_cost_``: the median or the largest cost (refusing 0, which POT divides
    by), ``None`` for the other normalisations."""
    if norm not in ("median", "max"):
        return None
    value = float(np.median(M) if norm == "median" else M.max())
    if not value > 0:
        raise ValueError(
            f"norm={norm!r} divides the cost by its {norm} entry, which is 0 here: use norm=None"
        )
    return value


def _normalise(M: np.ndarray, norm: str | None, value: float | None) -> np.ndarray:
    """POT's ``cost_normalization``: ``'log'`` and ``'loglog'`` transform the cost, ``'median'``
    and ``'max'`` divide it by ``value`` (the fit's :func:`_norm_value`)."""
    if norm == "log":
        return np.log1p(M)
    if norm == "loglog":
        return np.log1p(np.log1p(M))
    if norm in ("median", "max"):
        return M / value
    return M


def _xlogy_sum(weights: np.ndarray, logs: np.ndarray) -> float:
    """``sum_i w_i logs_i`` with ``0 * anything = 0``."""
    positive = weights > 0
    return float(np.sum(weights[positive] * logs[positive]))


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    """POT's ``kl_div(p, q)`` (``mass=False``): ``sum p log(p / q)``, ``0 log 0 = 0``."""
    positive = p > 0
    with np.errstate(divide="ignore"):
        logs = np.log(p[positive]) - np.log(q[positive])
    return float(np.sum(p[positive] * logs))


#: ``sinkhorn``'s own arguments, which the estimator sets itself, and what to pass instead.
_RESERVED = {
    "reg": "reg_e=... (POT's name for the entropic regularisation)",
    "a": "distribution_estimation=... (the sample weights)",
    "b": "distribution_estimation=... (the sample weights)",
    "X": "fit(Xs=..., Xt=...)",
    "Y": "fit(Xs=..., Xt=...)",
    "backend": "backend=...",
    "rng": "rng=...",
    "reg_m": "SketchUnbalancedSinkhornTransport(reg_m=...) (unbalanced transport)",
    "metric": "metric=...",
    "p": "metric=... (a callable for other costs)",
    "warmstart": "nothing: the estimator starts cold",
}

#: Solver options that are the estimator's own constructor arguments (POT's names).
_OWN_OPTIONS = ("max_iter", "tol", "verbose", "safeguard")


def _check_backend_params(caller: str, backend: Any, params: Any) -> dict[str, Any]:
    """Refuse backend parameters that are ``sinkhorn``'s own arguments or solver options (at
    ``fit`` they would reach ``sinkhorn`` twice) and names that the backend does not
    accept."""
    if not isinstance(params, dict):
        raise TypeError(f"backend_params must be a dict or None; got {describe(params)}")
    for name in params:
        if name in _RESERVED:
            raise TypeError(
                f"{caller} got {name}={params[name]!r} as a backend parameter, but it sets "
                f"{name!r} itself: pass {_RESERVED[name]}"
            )
        if name in SolverOptions.names():
            where = f"{name}=..." if name in _OWN_OPTIONS else f"solver_options={{{name!r}: ...}}"
            raise TypeError(
                f"{caller} got the solver option {name}={params[name]!r} as a backend "
                f"parameter; pass {where}"
            )
    if isinstance(backend, str):  # an invalid backend is named by get_backend
        given = {
            name: value
            for name, value in params.items()
            if not (name in ("rank", "dtype") and value is None)
        }
        check_backend_params(caller, backend, given)
    return params


def _check_solver_options(caller: str, options: Any) -> dict[str, Any]:
    """Refuse solver options that are constructor arguments of their own (given twice) or
    that are not solver options."""
    if not isinstance(options, dict):
        raise TypeError(f"solver_options must be a dict or None; got {describe(options)}")
    unknown = sorted(set(options) - set(SolverOptions.names()) - set(_OWN_OPTIONS))
    if unknown:
        raise TypeError(
            f"solver_options got unknown option(s) {unknown_names(unknown, SolverOptions.names())}"
            f"; solver options: {', '.join(SolverOptions.names())}"
        )
    for name in options:
        if name in _OWN_OPTIONS:
            raise TypeError(
                f"solver_options holds {name!r}, an argument of {caller} itself: pass "
                f"{name}=... to the constructor"
            )
    return options


def _normalise_rows(values: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """``values / totals[:, None]`` with 0 where the total is not positive (POT's nan_to_num)."""
    out = np.zeros_like(values)
    positive = totals > 0
    out[positive] = values[positive] / totals[positive, None]
    return out
