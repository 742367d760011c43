"""The block-local expansion's estimator, :class:`LocalGaussianExpansion`: it checks its
parameters, fits the polynomial (:mod:`.fit`), covers and sorts both clouds
(:mod:`.clusters`), and runs its products (:mod:`.products`) on the host or a device
(:mod:`.device`). The method itself is described in :mod:`sketchot.sketch.local`.
"""

from __future__ import annotations

import time
from dataclasses import KW_ONLY, dataclass
from math import comb
from typing import TYPE_CHECKING, Any

import numpy as np

from ..._memory import available_bytes
from ..._validation import check_float, check_int, check_matrix, check_rng
from .clusters import _cover, _Side
from .fit import (
    _FEATURE_MEMORY_SHARE,
    _MAX_DEGREE,
    _fit_exp_degree,
    _fit_exp_relative,
    _MeansPlan,
    _MonomialPlan,
)
from .products import _apply, _log_of_scaled

if TYPE_CHECKING:
    from ..._arrays import DeviceArrays

EPS = np.finfo(np.float64).eps


def check_log_weights(log_w: Any, n: int, name: str) -> np.ndarray:
    """``log_w`` as a float64 vector of length ``n``: log weights, ``-inf`` for weight 0;
    NaN and ``+inf`` are refused by ``name``."""
    log_w = np.asarray(log_w, dtype=np.float64)
    if log_w.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},); got {log_w.shape}")
    if np.any(np.isnan(log_w)) or np.any(log_w == np.inf):
        raise ValueError(f"{name} must not contain NaN or +inf (-inf means weight 0)")
    return log_w


@dataclass(eq=False)
class LocalGaussianExpansion:
    """Gibbs kernel ``K_ij = exp(-||x_i - y_j||^2 / reg)`` to a small *relative* error per entry.

    Parameters
    ----------
    reg : float, default=1.0
        Entropic regularisation (kernel width), ``> 0``.
    tau : float, default=1.0
        Half width of the interval ``[-tau, tau]`` of the coupling argument ``2 p.q / reg``;
        sets the cluster radius ``rho = sqrt(tau reg / 2)``. Larger ``tau`` gives fewer
        clusters but a higher degree, and rounding grows like ``e^(2 tau)``: ``0 < tau <= 4``.
    degree : int or None, default=None
        Polynomial degree ``r``. ``None``: the smallest degree whose relative error on
        ``[-tau, tau]`` is at most ``rtol`` (9 for ``tau = 1``, ``rtol = 1e-9``; 12 for
        ``tau = 2``).
    rtol : float, default=1e-9
        Target relative error of ``exp`` on ``[-tau, tau]`` when ``degree`` is ``None``.
    max_features : int, default=1000
        Largest number of monomial features ``R = C(r + d, d)`` accepted (the dimension
        limit: with the default ``tau`` and ``rtol``, ``d <= 4``). Above it :meth:`fit`
        raises a ``ValueError`` naming ``d``: the method never returns a cheaper, inaccurate
        kernel.
    max_feature_bytes : int, default=2**31
        The features of both clouds are stored when they fit in this many bytes, and in a
        quarter of the memory available at :meth:`fit` (what is left keeps padded copies of
        the batches the products read), and recomputed block by block in every product
        otherwise (memory ``O((n + m) d)``).
    exact_below : int, default=8
        Clusters with fewer points use exact kernel entries instead of the ``R`` features
        (an isolated colour would otherwise cost a full rank-``R`` term against every point
        of the other side). ``0`` expands every cluster.
    truncate : float, default=0.0
        Log-domain products (:meth:`log_matvec`, :meth:`log_rmatvec`,
        :meth:`log_matvec_new`) skip the cluster pairs whose bounded contribution to every
        row of the output cluster is below ``truncate / k`` of the row's lower bound (``k``
        input clusters), so each row misses at most a fraction ``truncate`` of its sum; the
        bounds come from the clusters' radii and the weights' extremes in each cluster
        (:func:`_kept_pairs`), so the skipped pairs follow the weights: at small ``reg``
        with converged potentials most far pairs go. ``0`` computes every pair. Linear
        products (:meth:`matmat`, weights of any sign) are never truncated.
    rng : None, int, Generator, ...
        Draws the sample on which the farthest-point clustering runs.

    Attributes
    ----------
    rho_ : float
        Cluster radius bound ``sqrt(tau reg / 2)``.
    degree_ : int
        Degree ``r`` of the fitted polynomial (``degree``, or the smallest meeting ``rtol``).
    coef_ : ndarray, shape (``degree_`` + 1,)
        Monomial coefficients ``c_j > 0`` of the fit ``exp(t) ~ sum_j c_j t^j``.
    poly_error_ : float
        Maximum of ``|p(t) e^(-t) - 1|`` over ``[-tau, tau]`` (dense grid).
    entry_error_bound_ : float
        Bound on ``|K~_ij / K_ij - 1|`` for every entry: ``poly_error_`` plus rounding of the
        feature sum (``~ (R + 2 r) e^(2 tau) eps``) and of the exponent
        (``~ 8 eps max ||x - y||^2 / reg``).
    means_error_bound_ : float
        Bound (to first order) on the error of :meth:`log_means`' means, per coordinate:
        ``2 (entry_error_bound_ + truncate) reach + poly_error' rho_`` with ``reach`` the
        largest centred coordinate of either cloud and ``poly_error'`` the relative error of
        the degree ``r - 1`` fit; ``inf`` when :meth:`log_means` is not available.
    n_clusters_ : tuple of int
        ``(k_X, k_Y)``.
    n_features_ : int
        ``R = C(degree_ + d, d)``.
    n_exact_points_ : tuple of int
        Points of each side in clusters below ``exact_below`` (handled with exact entries).
    cluster_radius_ : tuple of float
        Largest distance from a point to its cluster centre on each side (``<= rho_``).
    center_ : ndarray, shape (d,)
        Common translation of both clouds (the kernel is translation invariant; centring
        keeps the exponents' rounding small).

    Notes
    -----
    Dimension limit: ``R = C(r + d, d)`` grows fast (220 for ``d = 3``, 715 for ``d = 4``,
    2002 for ``d = 5`` at degree 9), so this is a method for colours and other low-dimensional
    data; ``max_features`` makes the limit explicit.

    Threads: products share clusters among the library pool (:mod:`sketchot._parallel`) with
    BLAS held to one thread for the duration through ``threadpoolctl`` when it is installed
    (process-wide); without it they run in the calling thread on a multi-threaded BLAS.

    Devices: after :meth:`to_device` the products' per-point work runs in another Array API
    library on its device (CUDA tensors, say), one batch at a time, with the same
    arithmetic; the methods still take and return NumPy arrays.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> X, Y = rng.random((500, 3)), rng.random((400, 3))
    >>> kernel = LocalGaussianExpansion(0.01, rng=0).fit(X, Y)
    >>> log_Kv = kernel.log_matvec(np.zeros(400))  # log(K 1), entries to ~5e-10 relative
    """

    reg: float = 1.0
    _: KW_ONLY
    tau: float = 1.0
    degree: int | None = None
    rtol: float = 1e-9
    max_features: int = 1000
    max_feature_bytes: int = 1 << 31
    exact_below: int = 8
    truncate: float = 0.0
    rng: Any = None

    # ------------------------------------------------------------------ fitting
    def fit(self, X: Any, Y: Any = None) -> LocalGaussianExpansion:
        """Cluster both clouds, fit the polynomial and (within budget) store the features.

        Parameters
        ----------
        X : array-like, shape (n, d)
        Y : array-like, shape (m, d), default=X

        Returns
        -------
        self

        Notes
        -----
        Clustering is ``O((n + m) log k)`` after a farthest-point pass on a sample of at most
        20000 points (``O(20000 k)``); the features cost ``O((n + m) R)``.
        """
        reg = check_float(self.reg, "reg", positive=True)
        tau = check_float(self.tau, "tau", positive=True)
        if tau > 4.0:
            raise ValueError(
                f"tau must be <= 4 (rounding of the expansion grows like e^(2 tau)); got {tau}"
            )
        max_features = check_int(self.max_features, "max_features", minimum=1)
        check_int(self.max_feature_bytes, "max_feature_bytes", minimum=0)
        self._exact_below = check_int(self.exact_below, "exact_below", minimum=0)
        self._truncate = check_float(self.truncate, "truncate", minimum=0.0)
        if self._truncate >= 1.0:
            raise ValueError(
                f"truncate must be < 1 (the fraction of a row's sum a product may miss); "
                f"got {self._truncate}"
            )
        X = check_matrix(X, "X")
        Y = X if Y is None else check_matrix(Y, "Y", n_features=X.shape[1], feature_name="X")
        d = X.shape[1]
        generator = check_rng(self.rng)

        if self.degree is None:
            rtol = check_float(self.rtol, "rtol", positive=True)
            degree, coef, error = _fit_exp_degree(tau, rtol)
        else:
            degree = check_int(self.degree, "degree", minimum=1, maximum=_MAX_DEGREE)
            coef, error = _fit_exp_relative(tau, degree)
        n_features = comb(degree + d, d)
        if n_features > max_features:
            largest = max(
                (k for k in range(1, d + 1) if comb(degree + k, k) <= max_features), default=0
            )
            raise ValueError(
                f"X has d = {d} columns: the local expansion of degree {degree} needs "
                f"C({degree} + {d}, {d}) = {n_features} monomial features, above "
                f"max_features = {max_features} (the limit is d <= {largest} at this degree); "
                "use a lower-dimensional embedding, a larger rtol or max_features, or the "
                "exact kernel"
            )

        self.rho_ = float(np.sqrt(tau * reg / 2.0))
        self.degree_ = degree
        self.coef_ = coef
        self.poly_error_ = error
        self.n_features_ = n_features
        self.center_ = (X.sum(axis=0) + Y.sum(axis=0)) / (X.shape[0] + Y.shape[0])
        self._monomials = _MonomialPlan(d, degree, coef)
        self._means = _MeansPlan.build(self._monomials, tau)
        feature_bytes = (X.shape[0] + Y.shape[0]) * n_features * 8
        # other kernels may hold the rest (a loss keeps its previous step's three)
        budget = min(self.max_feature_bytes, int(_FEATURE_MEMORY_SHARE * available_bytes()))
        store = feature_bytes <= budget
        self._x = self._side(X, generator, store)
        self._y = self._side(Y, generator, store)
        self._on = None  # products on the host until to_device
        # what the budget leaves keeps padded copies of the batches products read
        spare = (budget - feature_bytes) // 2 if store else 0
        self._x.padded_budget = self._y.padded_budget = spare
        self.n_clusters_ = (self._x.n_clusters, self._y.n_clusters)
        self.cluster_radius_ = (self._x.radius, self._y.radius)
        self.n_exact_points_ = (self._x.small_rows, self._y.small_rows)

        # Rounding: the feature sum has sum |terms| <= e^tau while its value is >= e^-tau, and
        # each monomial carries ~r roundings; exponents of size E carry ~8 eps E.
        low = np.minimum(X.min(axis=0), Y.min(axis=0))
        high = np.maximum(X.max(axis=0), Y.max(axis=0))
        max_exponent = float(np.sum((high - low) ** 2)) / reg
        self.entry_error_bound_ = float(
            error + (n_features + 2 * degree + 8) * np.exp(2 * tau) * EPS + 8 * EPS * max_exponent
        )
        # log_means: the centres' share is as accurate as a product, the offsets' as the
        # degree r - 1 fit over the cluster radius (its docstring)
        self._reach = float(
            max(np.abs(low - self.center_).max(), np.abs(high - self.center_).max())
        )
        self.means_error_bound_ = (
            2.0 * (self.entry_error_bound_ + self._truncate) * self._reach
            + self._means.poly_error * self.rho_
            if self._means is not None
            else float("inf")
        )
        return self

    # ------------------------------------------------------------------ products
    def matmat(self, V: Any) -> np.ndarray:
        """``K V``: shape ``(n,)`` for ``V`` of shape ``(m,)``, ``(n, k)`` for ``(m, k)``.

        Entries that underflow in the true kernel underflow here too (the per-pair shift is
        applied in the exponent, never to a kernel entry).
        """
        self._check_fitted()
        return self._linear(self._x, self._y, V, "V")

    def rmatmat(self, U: Any) -> np.ndarray:
        """``K^T U``: shape ``(m,)`` for ``U`` of shape ``(n,)``, ``(m, k)`` for ``(n, k)``."""
        self._check_fitted()
        return self._linear(self._y, self._x, U, "U")

    def log_matvec(self, log_v: Any) -> np.ndarray:
        """``log(K exp(log_v))``, shape ``(n,)``; finite whenever some ``log_v_j`` is finite.

        ``log_v`` of shape ``(m,)`` may span any range and hold ``-inf`` (zero weights).
        """
        self._check_fitted()
        log_v = self._check_log(log_v, self._y.n_points, "log_v")
        scale, Z = self._apply(self._x, self._y, log_v, None, self._truncate)
        return _log_of_scaled(scale, Z[:, 0])

    def log_rmatvec(self, log_u: Any) -> np.ndarray:
        """``log(K^T exp(log_u))``, shape ``(m,)``."""
        self._check_fitted()
        log_u = self._check_log(log_u, self._x.n_points, "log_u")
        scale, Z = self._apply(self._y, self._x, log_u, None, self._truncate)
        return _log_of_scaled(scale, Z[:, 0])

    def log_means(self, log_w: Any, *, transpose: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """``(log(K e^w), means)`` of one product: ``means_i = sum_j K_ij e^(w_j) y_j /
        sum_j K_ij e^(w_j)``, shape ``(n, d)``, in the fitted coordinates (``transpose``:
        ``K^T`` and the ``x_i``). Rows with an empty sum get ``-inf`` and means 0.

        The moments of ``y_j = c_B + q_j`` split into the cluster centres' share, read from
        the plain product's terms, and the local offsets' share, whose weighted moments are
        the plain moments of one degree more (:class:`_MeansPlan`): the input side is the
        plain product's and the output side reads ``d`` more matrices of ``C(r - 1 + d, d)``
        features: measured at 10^5 uniform points in 3-D (tau = 4, degree 11), 0.7 times the
        work of the ``d`` products it replaces. Each mean is off by at most
        :attr:`means_error_bound_` (to first order: the sum's and the numerator's relative
        errors, each at most the entries' plus ``truncate``, times the coordinates, and the
        offsets' fit error times their radius). The barycentric maps of a log-domain plan:
        ``P Y = diag(P 1) means`` for ``w = log v``.
        """
        self._check_fitted()
        out, inn = (self._y, self._x) if transpose else (self._x, self._y)
        log_w = self._check_log(log_w, inn.n_points, "log_w")
        plan = self._means
        if plan is None:
            raise NotImplementedError(
                f"log_means needs degree >= 3 (a degree-{self.degree_ - 1} fit for the "
                f"offsets); this expansion has degree {self.degree_}"
            )
        scale, Z = self._apply(out, inn, log_w, None, self._truncate, means=plan)
        with np.errstate(invalid="ignore", divide="ignore"):
            means = np.where(Z[:, :1] > 0, Z[:, 1:] / Z[:, :1] + self.center_, 0.0)
        return _log_of_scaled(scale, Z[:, 0]), means

    @property
    def supports_means(self) -> bool:
        """Whether :meth:`log_means` is available (degree at least 3)."""
        self._check_fitted()
        return self._means is not None

    @property
    def means_match_products(self) -> bool:
        """Whether :meth:`log_means`' offsets add at most what the centres' share carries
        (``poly_error' rho_ <= (entry_error_bound_ + truncate) reach``), so that its means
        are about as accurate as those of a log product per coordinate: clusters small
        against the clouds and a degree ``r - 1`` fit close to the degree ``r`` one (at
        10^5 uniform points, reg 0.01, tau = 4: 1.2e-5 against 1.7e-5 at the default
        accuracy; one cluster over the whole cloud at large reg fails it)."""
        if not self.supports_means:
            return False
        return (
            self._means.poly_error * self.rho_
            <= (self.entry_error_bound_ + self._truncate) * self._reach
        )

    def iteration_seconds(self, stride: int = 1) -> float:
        """Seconds of one log-domain iteration, ``log_matvec`` then ``log_rmatvec`` (uniform
        weights), estimated from every ``stride``-th group of output clusters: each
        product's time over the fraction of rows it computed (groups are spatial and of
        similar sizes, so a strided sample sees the cloud's whole range of densities).
        """
        self._check_fitted()
        stride = check_int(stride, "stride", minimum=1)
        seconds = 0.0
        for out, inn in ((self._x, self._y), (self._y, self._x)):
            log_w = np.zeros(inn.n_points)
            start = time.perf_counter()
            _, Z = self._apply(out, inn, log_w, None, self._truncate, stride=stride)
            # uniform weights: every computed row has a positive sum, the skipped ones 0
            computed = max(np.count_nonzero(Z[:, 0] > 0), 1) / out.n_points
            seconds += (time.perf_counter() - start) / computed
        return seconds

    def iteration_work(self, stride: int = 1) -> dict[str, float]:
        """The work of one log-domain iteration, ``log_matvec`` then ``log_rmatvec`` (uniform
        weights), counted from the products' plan without computing them: ``'entries'``
        (row-cluster pairs and exact entries), ``'exp'`` (exponentials of the batched
        products), ``'fma'`` (their multiply-adds), ``'calls'`` (batched products) and
        ``'exact'`` (entries computed from the points, each ``d`` multiply-adds and an
        exponential). A function of the fitted clusters, ``truncate`` and ``stride`` only:
        every ``stride``-th group of output clusters is planned and scaled to all (the plan's
        truncation reads the weights, so the count is that of uniform weights), always with
        the host's groups (a device's are sized by its free memory, which is load). Costs
        the plan of the sampled groups, not its products.
        """
        self._check_fitted()
        stride = check_int(stride, "stride", minimum=1)
        work = {"entries": 0.0, "exp": 0.0, "fma": 0.0, "exact": 0.0, "calls": 0.0}
        for out, inn in ((self._x, self._y), (self._y, self._x)):
            log_w = np.zeros(inn.n_points)
            _apply(out, inn, log_w, None, self._monomials, self.reg, self._truncate,
                   stride=stride, work=work)  # fmt: skip
        return work

    def log_matvec_new(self, X_new: Any, log_v: Any) -> np.ndarray:
        """``log sum_j exp(log_v_j - ||x_new_i - y_j||^2 / reg)`` for new source points.

        New points join the nearest fitted ``X`` cluster when within ``rho_`` of its centre,
        and clusters of their own otherwise, so :attr:`entry_error_bound_` holds for them too
        (as long as they lie in the fitted bounding box; far outside it the exponent rounding
        term grows). Cost: one product.
        """
        side = self._new_side(X_new)
        log_v = self._check_log(log_v, self._y.n_points, "log_v")
        scale, Z = self._apply(side, self._y, log_v, None, self._truncate)
        return _log_of_scaled(scale, Z[:, 0])

    def barycentric_map(self, X_new: Any, log_v: Any) -> np.ndarray:
        """``sum_j p_ij y_j`` with ``p_ij ~ exp(log_v_j - ||x_new_i - y_j||^2 / reg)``.

        The barycentric projection of a plan ``diag(u) K diag(v)`` (``u`` cancels), for new
        source points (pixels, say); shape ``(n_new, d)``. Computed as one product with
        ``d + 1`` right-hand sides ``[1, y - center]`` in the stabilised scaled form.
        """
        side = self._new_side(X_new)
        log_v = self._check_log(log_v, self._y.n_points, "log_v")
        values = np.empty((self._y.n_points, self._y.local.shape[1] + 1))
        values[:, 0] = 1.0
        values[:, 1:] = self._y.points_centred()
        _, Z = self._apply(side, self._y, log_v, values)
        with np.errstate(invalid="ignore", divide="ignore"):
            return Z[:, 1:] / Z[:, :1] + self.center_

    def to_device(self, on: DeviceArrays | None) -> LocalGaussianExpansion:
        """Run the products' per-point work (exponents, moments, output rows, exact
        entries) on the device of ``on`` (:class:`~sketchot._arrays.DeviceArrays`), in its
        Array API namespace, on copies of both clouds' sorted arrays and features made there
        (memory ``O((n + m) (d + R))`` on the device); ``None``: on the host (NumPy). The
        clustering and each product's cluster-level plan stay on the host, and every method
        still takes and returns NumPy arrays (``O(n + m)`` numbers move per product).

        Returns
        -------
        self
        """
        self._check_fitted()
        self._on = on
        if on is not None:  # the copies now, not in the first (timed) product
            self._x.arrays(on), self._y.arrays(on)
        return self

    # ------------------------------------------------------------------ helpers
    def _apply(self, out: _Side, inn: _Side, log_w, values, truncate=0.0, **options):
        """:func:`_apply` with the fitted plan, where :meth:`to_device` put the products."""
        plan, on = self._monomials, self._on
        return _apply(out, inn, log_w, values, plan, self.reg, truncate, on=on, **options)

    def _side(self, points: np.ndarray, generator: np.random.Generator, store: bool) -> _Side:
        centred = points - self.center_
        labels, centers = _cover(centred, self.rho_, generator)
        return _Side.build(
            centred, labels, centers, self._monomials, self.reg, store, self._exact_below
        )

    def _new_side(self, X_new: Any) -> _Side:
        self._check_fitted()
        X_new = check_matrix(
            X_new, "X_new", n_features=self.center_.shape[0], feature_name="the fitted X"
        )
        centred = X_new - self.center_
        labels, centers = _cover(centred, self.rho_, check_rng(0), self._x.centers)
        store = self._x.features is not None
        return _Side.build(
            centred, labels, centers, self._monomials, self.reg, store, self._exact_below
        )

    def _linear(self, out: _Side, inn: _Side, V: Any, name: str) -> np.ndarray:
        V = np.asarray(V, dtype=np.float64)
        if V.ndim not in (1, 2) or V.shape[0] != inn.n_points:
            raise ValueError(
                f"{name} must have shape ({inn.n_points},) or ({inn.n_points}, k); got {V.shape}"
            )
        if not np.all(np.isfinite(V)):
            raise ValueError(f"{name} must contain only finite values")
        values = V.reshape(inn.n_points, -1)
        scale, Z = self._apply(out, inn, np.zeros(inn.n_points), values)
        with np.errstate(under="ignore"):
            result = np.exp(scale)[:, None] * Z
        return result.reshape(out.n_points, *V.shape[1:])

    @staticmethod
    def _check_log(log_w: Any, n: int, name: str) -> np.ndarray:
        return check_log_weights(log_w, n, name)

    def _check_fitted(self) -> None:
        if not hasattr(self, "_x"):
            raise RuntimeError(
                "this LocalGaussianExpansion is not fitted yet: call fit(X, Y) first"
            )
