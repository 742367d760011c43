"""Block-local polynomial expansion of the Gibbs kernel, accurate to a relative ``~1e-9`` per entry.

Both clouds are covered by balls of radius ``rho = sqrt(tau reg / 2)``. For ``x = c_A + p`` in
cluster ``A`` and ``y = c_B + q`` in cluster ``B``,

.. math::
    \\|x - y\\|^2 = \\|c_A - c_B\\|^2 + 2 (c_A - c_B) \\cdot (p - q) + \\|p\\|^2 + \\|q\\|^2
                 - 2 p \\cdot q,

so the block ``K_AB = diag(alpha^B) exp(2 P_A Q_B^T / reg) diag(beta^A)`` with positive
per-point, per-pair factors, and the only coupling argument ``t = 2 p.q / reg`` lies in
``[-tau, tau]`` *whatever the distance between the clusters*. ``exp(t)`` on ``[-tau, tau]`` is
replaced by a polynomial ``sum_j c_j t^j`` fitted for relative error (all ``c_j > 0``), and
``(u.w)^j`` is expanded exactly with the symmetric monomial features of the scaled local
coordinates ``u = p sqrt(2 / reg)``, ``w = q sqrt(2 / reg)``:

.. math::
    \\exp(u \\cdot w) \\approx \\sum_{|a| \\le r} \\phi_a(u) \\phi_a(w), \\qquad
    \\phi_a(u) = \\sqrt{c_{|a|} \\binom{|a|}{a}} \\, u^a,

``R = C(r + d, d)`` features. Every entry is therefore the true one times ``(1 + delta)``
with ``|delta|`` at most the polynomial's relative error on ``[-tau, tau]`` plus rounding: the
error is relative, so it is not amplified by Sinkhorn scalings that span hundreds of orders of
magnitude (unlike a global low-rank or random-feature kernel, whose error is absolute).

Products never form a kernel block. For each source cluster ``A`` and every target cluster
``B`` the rank-``R`` moment ``G_AB = Psi_B^T (beta^A w_B)`` is one matrix product per target
cluster for a whole group of source clusters, and the output rows of ``A`` are
``Phi_A G_A``. Each pair ``(A, B)`` carries a stabilising log shift (the maximum of its
log weights), so log-domain products are finite for any spread of the scalings (Schmitzer
2019, log-domain stabilisation).

Cost of one product: ``O((n k_Y + m k_X) R)`` flops plus ``O(n k_Y + m k_X)`` exponentials,
with ``k_X, k_Y`` the cluster counts (which grow like ``rho^-(2..3)``); memory
``O((n + m) R)`` for the stored features (or recomputed per block above a budget) plus
chunked temporaries. Clusters of fewer than ``exact_below`` points (isolated colours) use
exact entries instead, ``O(n m_small + n_small m)``, cheaper than ``R`` features each. When
nearly every cluster is that small (data filling 3-D at small ``reg``) the method degrades
to the exact kernel: it is a method for low-dimensional, clustered data.

References
----------
Schmitzer, B. (2019). Stabilized sparse scaling algorithms for entropy regularized transport
problems. SIAM J. Sci. Comput. 41(3), A1443-A1481.

Han, I., Avron, H. and Shin, J. (2020). Polynomial Tensor Sketch for element-wise function of
low-rank matrix. ICML 2020 (polynomial expansion of element-wise functions such as
``exp(U V^T)``).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import KW_ONLY, dataclass, field, replace
from math import comb, factorial
from typing import Any

import numpy as np
from numpy.polynomial import chebyshev as C
from scipy.spatial import cKDTree
from scipy.special import logsumexp

from .._arrays import DeviceArrays
from .._memory import available_bytes
from .._parallel import get_num_threads, run_parts
from .._validation import check_float, check_int, check_matrix, check_rng
from ..gibbs import BLOCK_BYTES, SQEUCLIDEAN, block_rows, neg_cost_on_device, row_slices, sq_norms
from .coefficients import chebyshev_to_monomial

EPS = np.finfo(np.float64).eps

# Bytes for the per-group rank-R moments G (source clusters x R x target clusters): large
# enough for BLAS efficiency, small enough to keep the memory flat at n = 1e6.
_MOMENT_BYTES = 1 << 26
# On a device: the moments take this share of its free memory (at least _MOMENT_BYTES, at
# most _DEVICE_MOMENT_BYTES): larger groups, fewer and larger batched products.
_DEVICE_MOMENT_SHARE = 1 / 16
_DEVICE_MOMENT_BYTES = 1 << 30
# Rows of an output cluster handled at once (its rows x target clusters temporaries).
_ROW_BLOCK = 4096
# Points per sample of the radius-stopped farthest-point pass (the rest is assigned by a tree).
_SAMPLE = 20000
# Largest degree tried when the degree is chosen from the tolerance.
_MAX_DEGREE = 30
# Input clusters per batch of a truncated product: a batch is kept or skipped whole, so few
# neighbours (more clusters per batch only save Python overhead).
_IN_BATCH = 16
# Output clusters per group of a truncated product (at least, memory allowing).
_TRUNCATED_GROUP = 32
# Points per block of the feature computation (R x block doubles stay in cache).
_FEATURE_BLOCK = 2048
# Share of the memory available at fit that stored features and their padded copies may take.
_FEATURE_MEMORY_SHARE = 0.25


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
        log_w = np.asarray(log_w, dtype=np.float64)
        if log_w.shape != (n,):
            raise ValueError(f"{name} must have shape ({n},); got {log_w.shape}")
        if np.any(np.isnan(log_w)) or np.any(log_w == np.inf):
            raise ValueError(f"{name} must not contain NaN or +inf (-inf means weight 0)")
        return log_w

    def _check_fitted(self) -> None:
        if not hasattr(self, "_x"):
            raise RuntimeError(
                "this LocalGaussianExpansion is not fitted yet: call fit(X, Y) first"
            )


# ---------------------------------------------------------------------- polynomial fit
def _fit_exp_relative(tau: float, degree: int) -> tuple[np.ndarray, float]:
    """Monomial coefficients of a near-minimax *relative* fit of ``exp`` on ``[-tau, tau]``.

    Least squares of ``p(t) e^(-t) - 1`` at 8 (r + 1) Chebyshev points, solved in the
    Chebyshev basis for conditioning (a discrete weighted L2 fit is within a small factor
    of the minimax error). Returns ``(coef, max relative error on a dense grid)``.
    """
    nodes = tau * np.cos(np.pi * (np.arange(8 * (degree + 1)) + 0.5) / (8 * (degree + 1)))
    design = C.chebvander(nodes / tau, degree) * np.exp(-nodes)[:, None]
    cheb = np.linalg.lstsq(design, np.ones_like(nodes), rcond=None)[0]
    coef = chebyshev_to_monomial(degree, tau) @ cheb
    grid = np.linspace(-tau, tau, 20001)
    error = float(np.max(np.abs(np.polynomial.polynomial.polyval(grid, coef) * np.exp(-grid) - 1)))
    if not np.all(coef > 0):
        # Real features need c_j > 0 (square roots); exp's fits have them up to high degree.
        raise ValueError(
            f"degree {degree} gives a non-positive coefficient for tau = {tau}; use a lower "
            "degree or degree=None"
        )
    return coef, error


def _fit_exp_degree(tau: float, rtol: float) -> tuple[int, np.ndarray, float]:
    """Smallest degree whose relative fit error on ``[-tau, tau]`` is at most ``rtol``."""
    for degree in range(1, _MAX_DEGREE + 1):
        try:
            coef, error = _fit_exp_relative(tau, degree)
        except ValueError:
            break
        if error <= rtol:
            return degree, coef, error
    raise ValueError(
        f"no polynomial of degree <= {_MAX_DEGREE} reaches rtol = {rtol:g} on [-{tau}, {tau}]: "
        "increase rtol (>= 1e-13) or decrease tau"
    )


# ---------------------------------------------------------------------- monomial features
class _MonomialPlan:
    """Index plan of the ``C(r + d, d)`` monomials ``u^a``, ``|a| <= r``, degree by degree.

    Each monomial of degree ``j`` is a monomial of degree ``j - 1`` (its *parent*) times one
    coordinate not below the parent's last coordinate, so every multi-index appears once.
    ``scale`` holds ``sqrt(c_|a| |a|! / a!)``.
    """

    def __init__(self, d: int, degree: int, coef: np.ndarray) -> None:
        self.d = d
        self.degree = degree
        parents: list[np.ndarray] = []
        coords: list[np.ndarray] = []
        last = np.arange(d)  # last coordinate of each degree-1 monomial
        exponents = [np.zeros((1, d), dtype=np.int64), np.eye(d, dtype=np.int64)]
        for _ in range(2, degree + 1):
            parent_ids, coord_ids = [], []
            for parent, low in enumerate(last):
                for coord in range(low, d):
                    parent_ids.append(parent)
                    coord_ids.append(coord)
            parent_ids, coord_ids = np.array(parent_ids), np.array(coord_ids)
            parents.append(parent_ids)
            coords.append(coord_ids)
            step = exponents[-1][parent_ids].copy()
            step[np.arange(len(coord_ids)), coord_ids] += 1
            exponents.append(step)
            last = coord_ids
        self.parents = parents
        self.coords = coords
        alpha = np.concatenate(exponents)
        total = alpha.sum(axis=1)
        multinomial = np.array(
            [
                factorial(int(t)) / np.prod([factorial(int(a)) for a in row])
                for t, row in zip(total, alpha, strict=True)
            ]
        )
        self.scale = np.sqrt(coef[total] * multinomial)
        self.n_features = alpha.shape[0]
        self.exponents, self.total, self.multinomial = alpha, total, multinomial


@dataclass(frozen=True)
class _MeansPlan:
    """What a product with first moments (:meth:`LocalGaussianExpansion.log_means`) reads of
    the plain moments: ``w_k exp(u.w)`` by a polynomial of degree ``r - 1`` in ``u.w``
    (coefficients ``c'``, fitted for relative error on ``[-tau, tau]``), whose moments are
    the plain ones of degree ``<= r`` rescaled, since ``w_k w^a = w^(a + e_k)``.

    ``index[k, a]`` is the position of ``a + e_k`` among the ``R`` monomials for the
    ``R' = C(r - 1 + d, d)`` monomials ``a`` of degree ``<= r - 1`` (a prefix: monomials are
    ordered by degree), and ``factor[k, a] = c'_|a| (|a|! / a!) / (s_a s_(a + e_k))`` with
    ``s`` the plain features' scales, so that ``F[:, :R'] (factor * G[index])`` evaluates the
    degree ``r - 1`` polynomial of the output features ``F`` against the ``w_k``-weighted
    inputs; ``poly_error`` is that polynomial's relative error on ``[-tau, tau]``.
    """

    index: np.ndarray
    factor: np.ndarray
    n_features: int
    poly_error: float

    @classmethod
    def build(cls, plan: _MonomialPlan, tau: float) -> _MeansPlan | None:
        """``None`` when degree ``r - 1`` is below 2 or has no fit (first moments then
        take a log product per coordinate)."""
        if plan.degree < 3:
            return None
        try:
            coef, error = _fit_exp_relative(tau, plan.degree - 1)
        except ValueError:  # a non-positive coefficient: the fit is not trusted
            return None
        small = np.flatnonzero(plan.total <= plan.degree - 1)
        position = {tuple(row): i for i, row in enumerate(plan.exponents)}
        index = np.empty((plan.d, small.size), dtype=np.int64)
        for k in range(plan.d):
            step = np.eye(plan.d, dtype=np.int64)[k]
            index[k] = [position[tuple(plan.exponents[a] + step)] for a in small]
        weight = coef[plan.total[small]] * plan.multinomial[small]
        factor = weight[None, :] / (plan.scale[small][None, :] * plan.scale[index])
        return cls(index, factor, int(small.size), error)


def _local_monomials(U: np.ndarray, plan: _MonomialPlan, parallel: bool = True) -> np.ndarray:
    """Scaled monomial features ``phi(u)`` of each row, shape ``(n, R)``.

    ``phi(u) . phi(w) = sum_j c_j (u . w)^j`` exactly (up to rounding). One gather-multiply
    per degree, ``O(n R)`` time, computed feature-major (each monomial a contiguous row of
    the ``(R, n)`` result) in column blocks that stay in cache; the returned array is the
    Fortran-ordered transpose, which BLAS reads without a copy.
    """
    n = U.shape[0]
    out = np.empty((plan.n_features, n))
    blocks = [slice(start, min(start + _FEATURE_BLOCK, n)) for start in range(0, n, _FEATURE_BLOCK)]

    def fill(part) -> None:
        for cols in part:
            _monomials_into(U[cols].T, plan, out[:, cols])

    # Never parallel inside a product: its blocks already run on the pool (no nested waits).
    run_parts(fill, blocks, parallel and n >= 4 * _FEATURE_BLOCK)
    return out.T


def _monomials_into(UT: np.ndarray, plan: _MonomialPlan, out: np.ndarray) -> None:
    """Fill ``out`` (``R x b``) with the scaled monomials of the columns of ``UT`` (``d x b``)."""
    out[0] = 1.0
    out[1 : 1 + plan.d] = UT
    start, width = 1, plan.d
    for parents, coords in zip(plan.parents, plan.coords, strict=True):
        stop = start + width
        nxt = stop + len(parents)
        np.multiply(out[start:stop][parents], UT[coords], out=out[stop:nxt])
        start, width = stop, len(parents)
    out *= plan.scale[:, None]


# ---------------------------------------------------------------------- clustering
def _farthest_points(points: np.ndarray, radius: float) -> np.ndarray:
    """Greedy farthest-point centres (row indices) until every row is within ``radius``.

    ``O(s k)`` for ``s`` rows and ``k`` centres (Gonzalez 1985 with a radius stop).
    """
    sq = np.einsum("ij,ij->i", points, points)
    centers = [0]
    dist = np.maximum(sq - 2.0 * points @ points[0] + sq[0], 0.0)
    limit = radius * radius
    while True:
        far = int(np.argmax(dist))
        if dist[far] <= limit:
            return np.array(centers)
        centers.append(far)
        np.minimum(dist, np.maximum(sq - 2.0 * points @ points[far] + sq[far], 0.0), out=dist)


def _cover(
    points: np.ndarray,
    radius: float,
    generator: np.random.Generator,
    centers: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Labels and centres with every point within ``radius`` of its (nearest) centre.

    Rounds: assign the uncovered points to their nearest centre with a k-d tree; run the
    radius-stopped farthest-point pass on a sample of the still uncovered ones and add its
    centres. The first round covers the sample, so the leftovers are rare outliers and two or
    three rounds suffice. Empty clusters are dropped. ``O(n log k + s k)``.
    """
    n, d = points.shape
    labels = np.full(n, -1, dtype=np.int64)
    centers = np.empty((0, d)) if centers is None else np.asarray(centers, dtype=np.float64)
    todo = np.arange(n)
    # 0.999: the tree's distances and the features' norms round differently; keep a margin.
    limit = radius * 0.999
    while True:
        if centers.shape[0]:
            dist, nearest = cKDTree(centers).query(points[todo], workers=get_num_threads())
            covered = dist <= limit
            labels[todo[covered]] = nearest[covered]
            todo = todo[~covered]
        if todo.size == 0:
            break
        sample = todo if todo.size <= _SAMPLE else generator.choice(todo, _SAMPLE, replace=False)
        new = points[sample][_farthest_points(points[sample], limit)]
        centers = np.concatenate([centers, new])
    used, labels = np.unique(labels, return_inverse=True)
    return labels, centers[used]


# ---------------------------------------------------------------------- one side
@dataclass
class _Batch:
    """Clusters ``ids`` of one side (ascending, so of similar sizes), padded to a common size
    for batched products.

    ``first:stop`` are the clusters' positions in the list the batch was cut from. ``index``
    (clusters x padded size) holds sorted row indices, padding repeating each cluster's first
    row, ``valid`` marks the real rows and ``padding`` adds ``-inf`` to the others' exponents
    (0 to the real ones); all three are ``None`` for a single cluster, read as its contiguous
    ``rows``.
    """

    ids: np.ndarray
    first: int
    stop: int
    rows: slice | None
    index: np.ndarray | None
    valid: np.ndarray | None
    padding: np.ndarray | None

    @classmethod
    def make(cls, ids: np.ndarray, first: int, offsets: np.ndarray, sizes: np.ndarray) -> _Batch:
        stop = first + ids.size
        if ids.size == 1:
            cluster = int(ids[0])
            rows = slice(int(offsets[cluster]), int(offsets[cluster + 1]))
            return cls(ids, first, stop, rows, None, None, None)
        steps = np.arange(int(sizes[ids].max()))
        valid = steps[None, :] < sizes[ids, None]
        index = np.where(valid, offsets[ids, None] + steps[None, :], offsets[ids, None])
        return cls(ids, first, stop, None, index, valid, np.where(valid, 0.0, -np.inf))

    def gather(self, values: np.ndarray) -> np.ndarray:
        """``values`` of the batch's rows, shape ``(clusters, padded size, ...)``."""
        if self.index is None:
            return values[self.rows][None]
        return values[self.index]


@dataclass
class _Side:
    """One cloud sorted by cluster, with what every product needs.

    ``local`` are the local coordinates ``p = x - c_A`` (sorted); ``base`` is
    ``-(||p||^2 + 2 c_A . p) / reg``; ``features`` the scaled monomials of ``p sqrt(2/reg)``
    (``None`` when recomputed per block); ``cluster_radius`` the largest ``||p||`` of each
    cluster (the truncation bounds' reach).
    """

    order: np.ndarray
    offsets: np.ndarray
    centers: np.ndarray
    local: np.ndarray
    base: np.ndarray
    features: np.ndarray | None
    radius: float
    plan: _MonomialPlan
    reg: float
    points: np.ndarray
    n_small: int
    cluster_radius: np.ndarray
    # per cluster: the mean of p (the centroid's offset from the centre) and the mean of
    # ||p - mean p||^2 (the truncation's Jensen lower bound)
    centroid_offset: np.ndarray
    spread: np.ndarray
    # padded features of the batches products read again and again, within padded_budget;
    # the products' pool threads fill it: the lock guards the dict and its byte count
    padded: dict = field(default_factory=dict)
    padded_budget: int = 0
    padded_bytes: int = 0
    padded_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # copies of the per-point arrays on the device products run on (:class:`_DeviceArrays`)
    device: Any = field(default=None, repr=False)

    @classmethod
    def build(cls, centred, labels, centers, plan, reg, store, exact_below) -> _Side:
        # Clusters numbered by size class (sizes within a factor 5/4; the exactly handled small
        # ones first), neighbours together within a class: a range of clusters has similar
        # sizes, so it pads into one batched product, and lies close together, so a truncated
        # product keeps or skips it whole.
        counts = np.bincount(labels, minlength=centers.shape[0])
        size_class = np.where(
            counts < exact_below, -1.0, np.floor(np.log(np.maximum(counts, 1)) / np.log(1.25))
        )
        spatial = np.empty(counts.size, dtype=np.int64)
        spatial[cKDTree(centers).indices] = np.arange(counts.size)
        by_size = np.lexsort((spatial, size_class))
        rank = np.empty_like(by_size)
        rank[by_size] = np.arange(by_size.size)
        labels, centers, counts = rank[labels], centers[by_size], counts[by_size]
        order = np.argsort(labels, kind="stable")
        offsets = np.concatenate([[0], np.cumsum(counts)])
        local = centred[order] - centers[labels[order]]
        base = (
            -(
                np.einsum("ij,ij->i", local, local)
                + 2.0 * np.einsum("ij,ij->i", local, centers[labels[order]])
            )
            / reg
        )
        sq_local = np.einsum("ij,ij->i", local, local)
        cluster_radius = np.sqrt(np.maximum.reduceat(sq_local, offsets[:-1]))
        radius = float(cluster_radius.max())
        sizes = np.maximum(counts, 1)[:, None]
        centroid_offset = np.add.reduceat(local, offsets[:-1], axis=0) / sizes
        deviation = local - centroid_offset[labels[order]]
        spread = np.add.reduceat(np.einsum("ij,ij->i", deviation, deviation), offsets[:-1])
        spread = spread / sizes[:, 0]
        # The clusters handled exactly are a prefix.
        n_small = int(np.count_nonzero(counts < exact_below))
        side = cls(
            order,
            offsets,
            centers,
            local,
            base,
            None,
            radius,
            plan,
            reg,
            centred[order],
            n_small,
            cluster_radius,
            centroid_offset,
            spread,
        )
        if store:
            side.features = _local_monomials(local * np.sqrt(2.0 / reg), plan)
        return side

    def arrays(self, on: DeviceArrays | None) -> _HostArrays:
        """The per-point arrays products read: the side's own (``on=None``), or copies on
        ``on``'s device, made once."""
        if on is None:
            return _HostArrays(self)
        if self.device is None or self.device.on is not on:
            self.device = _DeviceArrays(self, on)
        return self.device

    @functools.cached_property
    def inverse_order(self) -> np.ndarray:
        """The sorted position of each point in the caller's order."""
        return np.argsort(self.order)

    @property
    def n_points(self) -> int:
        return self.local.shape[0]

    @property
    def small_rows(self) -> int:
        """Rows ``0:small_rows`` (sorted order) belong to the exactly handled clusters."""
        return int(self.offsets[self.n_small])

    @property
    def n_clusters(self) -> int:
        return self.centers.shape[0]

    def rows(self, cluster: int) -> slice:
        return slice(int(self.offsets[cluster]), int(self.offsets[cluster + 1]))

    def batches(self, ids: np.ndarray, max_clusters: int) -> list[_Batch]:
        """Clusters ``ids`` (ascending: size classes in order) in batches, each padded.

        A batch has at most ``max_clusters`` clusters and about ``_ROW_BLOCK`` padded rows;
        sizes within a batch differ by at most a factor 5/4 (plus 4 rows), so padding wastes
        little. A cluster above ``_ROW_BLOCK`` rows is a batch of its own (unpadded).
        """
        sizes = np.diff(self.offsets)
        out: list[_Batch] = []
        c0 = 0
        while c0 < ids.size:
            c1, width = c0 + 1, sizes[ids[c0]]
            while (
                c1 < ids.size
                and c1 - c0 < max_clusters
                and sizes[ids[c1]] <= 1.25 * sizes[ids[c0]] + 4
                and (c1 - c0 + 1) * max(width, sizes[ids[c1]]) <= _ROW_BLOCK
            ):
                width = max(width, sizes[ids[c1]])
                c1 += 1
            out.append(_Batch.make(ids[c0:c1], c0, self.offsets, sizes))
            c0 = c1
        return out

    def expanded_groups(self, size: int, spatial: bool) -> list[np.ndarray]:
        """The expanded clusters in groups of at most ``size``, each ascending (size classes).

        ``spatial``: neighbouring clusters together (consecutive leaves of a k-d tree on the
        centres), so that the input clusters a truncated product keeps for a group are few;
        otherwise consecutive sizes (the fewest padded batches).
        """
        ids = np.arange(self.n_small, self.n_clusters)
        if spatial and ids.size > size:
            ids = ids[cKDTree(self.centers[self.n_small :], leafsize=size).indices]
        return [np.sort(ids[start : start + size]) for start in range(0, ids.size, size)]

    def batch_features(self, batch: _Batch) -> np.ndarray:
        """Features of a batch, shape ``(clusters, padded size, R)`` (a view when unpadded)."""
        if batch.index is None:
            return self.block_features(batch.rows)[None]
        if self.features is not None:
            key = batch.ids.tobytes()
            cached = self.padded.get(key)
            if cached is None:
                cached = self.features[batch.index]
                with self.padded_lock:
                    fits = self.padded_bytes + cached.nbytes <= self.padded_budget
                    if fits and key not in self.padded:
                        self.padded[key] = cached
                        self.padded_bytes += cached.nbytes
            return cached
        flat = self.block_features_of(batch.index.ravel())
        return flat.reshape(*batch.index.shape, -1)

    def block_features_of(self, index: np.ndarray) -> np.ndarray:
        return _local_monomials(self.local[index] * np.sqrt(2.0 / self.reg), self.plan, False)

    def block_features(self, rows: slice) -> np.ndarray:
        if self.features is not None:
            return self.features[rows]
        return _local_monomials(self.local[rows] * np.sqrt(2.0 / self.reg), self.plan, False)

    def points_centred(self) -> np.ndarray:
        """The centred points in the caller's (unsorted) order."""
        sizes = np.diff(self.offsets)
        out = np.empty_like(self.local)
        out[self.order] = self.local + np.repeat(self.centers, sizes, axis=0)
        return out


# ---------------------------------------------------------------------- where products run
class _HostArrays:
    """The per-point arrays of one side that products read, in NumPy on the host (the side's
    own, and its padded batches' features within the side's budget).

    :class:`_DeviceArrays` keeps copies on the caller's device behind the same small
    interface, so that :func:`_apply` is written once against the Array API (``xp``).
    """

    xp = np
    on_host = True

    def __init__(self, side: _Side) -> None:
        self.side = side
        self.local, self.base, self.points = side.local, side.base, side.points

    def put(self, array: np.ndarray) -> np.ndarray:
        return array

    def get(self, array: np.ndarray) -> np.ndarray:
        return array

    def put_index(self, index: np.ndarray) -> np.ndarray:
        return index

    def moment_bytes(self) -> int:
        """Bytes a group's moments may take (they size the groups)."""
        return _MOMENT_BYTES

    def empty(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.empty(shape)

    def full(self, shape: tuple[int, ...], value: float) -> np.ndarray:
        return np.full(shape, value)

    def gather(self, batch: _Batch, values: np.ndarray) -> np.ndarray:
        return batch.gather(values)

    def padding(self, batch: _Batch) -> np.ndarray:
        return batch.padding

    def take_valid(self, batch: _Batch, values: np.ndarray) -> np.ndarray:
        """The real rows of padded ``values`` (clusters, size, ...), cluster by cluster."""
        return values[batch.valid]

    def batch_features(self, batch: _Batch) -> np.ndarray:
        return self.side.batch_features(batch)

    def block_features(self, rows: slice) -> np.ndarray:
        return self.side.block_features(rows)


class _DeviceArrays(_HostArrays):
    """Copies of one side's per-point arrays on the caller's device
    (:class:`~sketchot._arrays.DeviceArrays`, float64), with each batch's padded row index
    and mask kept there. Where the side stores its features they are computed there from
    the local coordinates (``O(n R)`` on the device instead of moving ``n R`` numbers) when
    they fit ``_FEATURE_MEMORY_SHARE`` of the device's free memory, and recomputed there
    block by block otherwise, as when the side does not store them; padded batches'
    features are kept within the side's budget and what that share leaves.

    Memory on the device: ``O(n d)``, plus ``O(n R)`` within the share.
    """

    on_host = False

    def __init__(self, side: _Side, on: DeviceArrays) -> None:
        self.side, self.on, self.xp = side, on, on.xp
        self.local, self.base = on.put(side.local), on.put(side.base)
        self.points = on.put(side.points)
        plan = side.plan
        self._parents = [on.put(p, np.int64) for p in plan.parents]
        self._coords = [on.put(c, np.int64) for c in plan.coords]
        self._scale = on.put(plan.scale)
        free = on.free_bytes()
        share = side.padded_budget if free is None else int(_FEATURE_MEMORY_SHARE * free)
        stored = 0 if side.features is None else side.features.nbytes
        self.features = None
        if side.features is not None and (free is None or stored <= share):
            self.features = self._monomials(self.local)
            share -= stored if free is not None else 0
        self._padded_budget = min(side.padded_budget, max(share, 0))
        # fixed here, so that every product groups the clusters alike
        self._moment_bytes = _MOMENT_BYTES
        if free is not None:
            moments = max(_MOMENT_BYTES, _DEVICE_MOMENT_SHARE * free)
            self._moment_bytes = int(min(_DEVICE_MOMENT_BYTES, moments))
        self._index: dict[bytes, tuple[Any, Any]] = {}
        self._padded: dict[bytes, Any] = {}
        self._padded_bytes = 0

    def put(self, array: np.ndarray) -> Any:
        return self.on.put(array)

    def get(self, array: Any) -> np.ndarray:
        return self.on.get(array)

    def put_index(self, index: np.ndarray) -> Any:
        return self.on.put(index, np.int64)

    def moment_bytes(self) -> int:
        return self._moment_bytes

    def empty(self, shape: tuple[int, ...]) -> Any:
        return self.xp.empty(shape, dtype=self.xp.float64, device=self.local.device)

    def full(self, shape: tuple[int, ...], value: float) -> Any:
        return self.xp.full(shape, value, dtype=self.xp.float64, device=self.local.device)

    def _padded_rows(self, batch: _Batch) -> tuple[Any, Any, Any]:
        """The batch's padded row index, padding offsets and real positions, kept on the
        device (gathers by integer index: no boolean mask, whose shape a GPU must wait for)."""
        key = batch.ids.tobytes()
        if key not in self._index:
            self._index[key] = (
                self.put_index(batch.index.ravel()),
                self.put(batch.padding),
                self.put_index(np.flatnonzero(batch.valid.ravel())),
            )
        return self._index[key]

    def gather(self, batch: _Batch, values: Any) -> Any:
        if batch.index is None:
            return values[batch.rows, ...][None, ...]
        flat = self.xp.take(values, self._padded_rows(batch)[0], axis=0)
        return self.xp.reshape(flat, (*batch.index.shape, *values.shape[1:]))

    def padding(self, batch: _Batch) -> Any:
        return self._padded_rows(batch)[1]

    def take_valid(self, batch: _Batch, values: Any) -> Any:
        flat = self.xp.reshape(values, (-1, *values.shape[2:]))
        return self.xp.take(flat, self._padded_rows(batch)[2], axis=0)

    def batch_features(self, batch: _Batch) -> Any:
        if batch.index is None:
            return self.block_features(batch.rows)[None, ...]
        key = batch.ids.tobytes()
        cached = self._padded.get(key)
        if cached is None:
            if self.features is not None:
                cached = self.gather(batch, self.features)
            else:
                cached = self._monomials(self.gather(batch, self.local))
            nbytes = cached.shape[0] * cached.shape[1] * cached.shape[2] * 8
            if self._padded_bytes + nbytes <= self._padded_budget:
                self._padded[key] = cached
                self._padded_bytes += nbytes
        return cached

    def block_features(self, rows: slice) -> Any:
        if self.features is not None:
            return self.features[rows, ...]
        return self._monomials(self.local[rows, ...])

    def _monomials(self, local: Any) -> Any:
        """:func:`_local_monomials` of ``local`` (any leading shape) on the device: one
        gather-multiply per degree along the last axis, ``O(n R)``."""
        xp = self.xp
        U = local * float(np.sqrt(2.0 / self.side.reg))
        columns, previous = [xp.ones_like(U[..., :1]), U], U
        for parents, coords in zip(self._parents, self._coords, strict=True):
            previous = xp.take(previous, parents, axis=-1) * xp.take(U, coords, axis=-1)
            columns.append(previous)
        return xp.concat(columns, axis=-1) * self._scale


# ---------------------------------------------------------------------- products
_BLAS_CONTROLLER: Any = None


@contextmanager
def _pool_without_blas_threads() -> Iterator[bool]:
    """Yield whether the products may run on the library pool.

    Each pool thread calls BLAS on small blocks; a multi-threaded BLAS under it oversubscribes
    the cores (measured 25x slower at n = 2e4 on 2 cores). With ``threadpoolctl`` BLAS is held
    to one thread for the duration (process-wide), also when sketchot runs one thread (a
    multi-threaded BLAS rounds its products differently: the same call with 1 and 2 threads
    gave products 2e-15 apart), and the pool shares the clusters; without it the clusters run
    in the calling thread and BLAS keeps its own threads, whatever the thread count.
    """
    global _BLAS_CONTROLLER
    if _BLAS_CONTROLLER is None:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:
            _BLAS_CONTROLLER = False
        else:
            _BLAS_CONTROLLER = ThreadpoolController()
    if _BLAS_CONTROLLER is False:
        yield False
        return
    with _BLAS_CONTROLLER.limit(limits=1, user_api="blas"):
        yield get_num_threads() > 1


def _apply(
    out: _Side,
    inn: _Side,
    log_w: np.ndarray,
    values: np.ndarray | None,
    plan: _MonomialPlan,
    reg: float,
    truncate: float = 0.0,
    stride: int = 1,
    means: _MeansPlan | None = None,
    on: DeviceArrays | None = None,
    work: dict[str, float] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``sum_j exp(log_w_j) K_ij values_j`` as ``exp(scale_i) Z_i``, in the caller's order.

    For each group of expanded output clusters ``A`` (sized so that the moments fit
    ``_MOMENT_BYTES``; on a device a share of its free memory) and the expanded input clusters
    ``B`` it keeps:

    1. per batch of input clusters ``B`` of similar sizes (threads): exponents
       ``E_jA = base_j + log_w_j + 2 c_A . q_j / reg`` (``|B| x |group|``), shift
       ``s_AB = max_j E_jA``, weights ``exp(E - s) <= 1`` and moments
       ``G_AB = Psi_B^T (weights * values)`` (``R x k`` per pair), one batched matrix product
       per batch;
    2. per batch of output clusters (threads): ``T_iB = base_i + 2 c_B . p_i / reg
       - ||c_A - c_B||^2 / reg + s_AB``, ``M = Phi_A G_A`` and
       ``Z_i = sum_B exp(T_iB - max_B T_iB) M_iB``, ``scale_i = max_B T_iB``.

    ``truncate > 0`` (log-domain products, ``values=None``): a group keeps the input clusters
    that some pair of it needs by :func:`_kept_pairs`; every row then misses at most a
    fraction ``truncate`` of its sum. Groups are then spatial, so that they keep few.

    Clusters below ``exact_below`` points use exact entries (:func:`_exact_scaled`), merged
    with :func:`_combine`. ``values=None`` means a single column of ones (log-domain
    products), for which ``Z_i >= e^-tau`` whenever a weight is non-zero, so ``log Z`` is safe.

    ``means`` (with ``values=None``): ``Z`` has the columns ``1`` and the input points'
    coordinates (``1 + d``) from the single column's input moments: in step 2 the centres
    ``c_B`` weight ``M_iB`` and the offsets' share is ``sqrt(reg / 2) Phi'_A H^k_A`` with
    ``H^k`` read from ``G`` (:class:`_MeansPlan`).

    ``stride > 1`` computes only every ``stride``-th group of output clusters and every
    ``stride``-th exactly handled row (the others are left at ``Z = 0``): a spatially even
    sample of the work, for timing (:meth:`LocalGaussianExpansion.iteration_seconds`).

    ``work`` (a dict): nothing is computed; the same plan (groups, kept pairs, batches) is
    made and the work it would do is added to ``work`` (:func:`_count_group`,
    :func:`_count_exact_and_groups`), for :meth:`LocalGaussianExpansion.iteration_work`;
    returns ``(None, None)``.

    ``on``: the per-point work (exponents, moments, output rows, exact entries) runs on that
    device, in its Array API namespace, on copies of the sides' arrays kept there
    (:class:`_DeviceArrays`); the cluster-level planning (groups, kept pairs, batches) stays
    on the host, and ``log_w``, ``values`` and the result are NumPy arrays on the host.
    """
    A_out, A_in = out.arrays(on), inn.arrays(on)
    xp = A_in.xp
    n_values = 1 if values is None else values.shape[1]
    truncated = truncate > 0.0 and values is None
    w_sorted = log_w[inn.order]
    w_on = A_in.put(w_sorted)
    base_and_w = A_in.base + w_on  # the input rows' exponents before the pair's coupling
    v_on = None if values is None else A_in.put(values[inn.order])
    d = inn.local.shape[1]
    n_out = n_values + (d if means is not None else 0)
    # the exactly handled clusters take the coordinates as plain columns
    exact_values = v_on
    if means is not None:
        exact_values = xp.concat([xp.ones_like(A_in.points[:, :1]), A_in.points], axis=1)
        means_index = A_in.put_index(means.index.ravel())
        means_factor = A_in.put(means.factor)
    half_width = float(np.sqrt(reg / 2.0))  # q = w sqrt(reg / 2) for the features' w
    # Only the expanded (large) input clusters kb: take part in the pairs.
    kb = inn.n_small
    k_in = inn.n_clusters - kb
    in_sq = np.einsum("ij,ij->i", inn.centers[kb:], inn.centers[kb:])
    in_coupling = (2.0 / reg) * inn.centers[kb:].T  # (d, k_in)
    # pieces of the result: (sorted output rows, scale, Z), in any order (threads append)
    pieces: list[tuple[np.ndarray, Any, Any]] = []
    per_cluster = plan.n_features * max(k_in, 1) * n_values * 8
    group = max(1, A_in.moment_bytes() // per_cluster)
    if truncated:
        # Neighbours in a group keep few inputs between them, but each group reads the kept
        # inputs' features once: no smaller than the memory allows, and never below
        # _TRUNCATED_GROUP where four times the moments' budget allows that.
        group = max(group, min(_TRUNCATED_GROUP, 4 * group))
    group = min(group, out.n_clusters)
    all_inputs = np.arange(k_in)
    in_batches = inn.batches(kb + all_inputs, _IN_BATCH if truncated else inn.n_clusters)
    if truncated and k_in:
        in_bounds = _input_bounds(inn, w_sorted)

    def one_group(ids: np.ndarray, parallel: bool) -> None:
        """Steps 1 and 2 for the output clusters ``ids``."""
        R = plan.n_features
        n_group = ids.size
        pair_sq = np.einsum("ij,ij->i", out.centers[ids], out.centers[ids])[:, None] + in_sq
        pair_sq -= 2.0 * out.centers[ids] @ inn.centers[kb:].T
        np.maximum(pair_sq, 0.0, out=pair_sq)
        kept, batches = all_inputs, in_batches
        if truncated:
            keep = _kept_pairs(
                pair_sq, out.centers[ids], out.cluster_radius[ids], in_bounds, reg, truncate
            )
            chosen = keep.any(axis=0)
            if not chosen.any():  # every input weight is zero: the rows stay empty
                return
            # whole batches (neighbours): their padded features are read as stored
            batches, position = [], 0
            for batch in in_batches:
                if chosen[batch.ids - kb].any():
                    size = batch.stop - batch.first
                    batches.append(replace(batch, first=position, stop=position + size))
                    position += size
            kept = np.concatenate([batch.ids for batch in batches]) - kb
        if work is not None:  # the plan's work, counted instead of done
            _count_group(work, batches, out.batches(ids, n_group), kept.size, n_group, R, d,
                         n_values)  # fmt: skip
            return
        out_coupling = A_in.put((2.0 / reg) * out.centers[ids].T)  # (d, n_group)
        kept_coupling = A_out.put(in_coupling[:, kept] if truncated else in_coupling)
        kept_centers = A_out.put(inn.centers[kb:][kept])
        # -inf marks a pair whose input block has only zero weights: it stays out of row maxima.
        shifts = A_in.full((kept.size, n_group), -np.inf)
        # input-major, so that a batch's moments are one contiguous write
        moments = A_in.empty((kept.size, n_group * n_values, R))

        def exponents(batch: _Batch, rows: slice | None = None) -> Any:
            if rows is not None:  # a slice of one large cluster
                E = A_in.local[rows, ...] @ out_coupling
                E += base_and_w[rows][:, None]
                return E[None, ...]
            E = A_in.gather(batch, A_in.local) @ out_coupling  # (clusters, size, n_group)
            E += A_in.gather(batch, base_and_w)[:, :, None]
            if batch.padding is not None:
                E += A_in.padding(batch)[:, :, None]
            return E

        def weighted_moments(E: Any, batch: _Batch, rows, top) -> Any:
            E -= xp.where(xp.isfinite(top), top, xp.zeros_like(top))[:, None, :]
            E = xp.exp(E)
            if v_on is not None:
                V = v_on[rows, ...][None, ...] if rows is not None else A_in.gather(batch, v_on)
                E = xp.reshape(E[..., None] * V[:, :, None, :], (*E.shape[:2], -1))
            F = A_in.batch_features(batch) if rows is None else A_in.block_features(rows)[None, ...]
            return E.mT @ F  # (clusters, n_group * k, R)

        def input_batches(batches) -> None:
            for batch in batches:
                if batch.index is None and batch.rows.stop - batch.rows.start > _ROW_BLOCK:
                    # One large cluster: its maximum first, then the moments block by block.
                    pieces_of = [
                        slice(start, min(start + _ROW_BLOCK, batch.rows.stop))
                        for start in range(batch.rows.start, batch.rows.stop, _ROW_BLOCK)
                    ]
                    tops = [xp.max(exponents(batch, rows)[0, ...], axis=0) for rows in pieces_of]
                    top = xp.max(xp.stack(tops), axis=0)[None, ...]
                    block = sum(
                        weighted_moments(exponents(batch, rows), batch, rows, top)
                        for rows in pieces_of
                    )
                else:
                    E = exponents(batch)
                    top = xp.max(E, axis=1)  # (clusters, n_group)
                    block = weighted_moments(E, batch, None, top)
                shifts[batch.first : batch.stop, :] = top
                moments[batch.first : batch.stop, ...] = block

        def output_rows(G, H, totals_rows, local, base, F):
            """``(scale, Z)`` of padded rows ``(clusters, size)`` against the kept clusters."""
            T = local @ kept_coupling  # (clusters, size, kept)
            T += base[:, :, None]
            T += totals_rows[:, None, :]
            top = xp.max(T, axis=2)
            safe = xp.where(xp.isfinite(top), top, xp.zeros_like(top))
            T -= safe[:, :, None]
            T = xp.exp(T)
            M = xp.reshape(F @ G, (*T.shape, n_values))
            z = (T[:, :, None, :] @ M)[:, :, 0, :]  # sum_B T_iB M_iB, batched
            if H is None:
                return safe, z
            # means: y = c_B + q, the centres weighting the plain terms, the offsets from H
            centres = (T * M[..., 0]) @ kept_centers
            offsets = xp.reshape(F[..., : means.n_features] @ H, (*T.shape[:2], d, -1))
            centres += half_width * (offsets @ T[..., None])[..., 0]
            return safe, xp.concat([z, centres], axis=2)

        def offset_moments(G):
            """``H`` of :class:`_MeansPlan` for plain moments ``G`` (clusters, R, kept):
            shape (clusters, R', d * kept)."""
            if means is None:
                return None
            H = xp.take(G, means_index, axis=1)
            H = xp.reshape(H, (G.shape[0], d, means.n_features, -1))
            H = H * means_factor[None, :, :, None]
            H = xp.permute_dims(H, (0, 2, 1, 3))
            return xp.reshape(H, (G.shape[0], means.n_features, -1))

        def output_batches(batches) -> None:
            for batch in batches:
                # (clusters, R, kept * k): a strided view for one column (BLAS reads it as is)
                G = xp.reshape(moments, (kept.size, n_group, n_values, R))
                G = xp.permute_dims(G[:, batch.first : batch.stop, ...], (1, 3, 0, 2))
                G = xp.reshape(G, (batch.stop - batch.first, R, -1))
                H = offset_moments(G)
                tot = totals[batch.first : batch.stop, :]
                if batch.index is None:
                    for start in range(batch.rows.start, batch.rows.stop, _ROW_BLOCK):
                        rows = slice(start, min(start + _ROW_BLOCK, batch.rows.stop))
                        safe, z = output_rows(
                            G,
                            H,
                            tot,
                            A_out.local[rows, ...][None, ...],
                            A_out.base[rows][None, ...],
                            A_out.block_features(rows)[None, ...],
                        )
                        pieces.append((np.arange(rows.start, rows.stop), safe[0, ...], z[0, ...]))
                    continue
                safe, z = output_rows(
                    G,
                    H,
                    tot,
                    A_out.gather(batch, A_out.local),
                    A_out.gather(batch, A_out.base),
                    A_out.batch_features(batch),
                )
                pieces.append(
                    (
                        batch.index[batch.valid],
                        A_out.take_valid(batch, safe),
                        A_out.take_valid(batch, z),
                    )
                )

        with np.errstate(under="ignore", invalid="ignore"):
            run_parts(input_batches, batches, parallel)
            totals = shifts.T - A_in.put(pair_sq[:, kept]) / reg
            run_parts(output_batches, out.batches(ids, n_group), parallel)

    def rows_of(kept: list) -> tuple[np.ndarray, Any, Any]:
        """The pieces as one ``(rows, scale, Z)`` (empty when none)."""
        if not kept:
            return np.zeros(0, dtype=np.int64), A_out.full((0,), 0.0), A_out.full((0, n_out), 0.0)
        return (
            np.concatenate([piece[0] for piece in kept]),
            xp.concat([piece[1] for piece in kept]),
            xp.concat([piece[2] for piece in kept]),
        )

    def empty_rows(rows: np.ndarray) -> tuple[np.ndarray, Any, Any]:
        return rows, A_out.full((rows.size,), -np.inf), A_out.full((rows.size, n_out), 0.0)

    if work is not None:
        _count_exact_and_groups(work, out, inn, group, truncated, k_in, stride, one_group)
        return None, None
    # host-only pool (a device runs its own parallel work)
    with _pool_without_blas_threads() as parallel:
        parallel = parallel and A_in.on_host
        if k_in:
            for ids in out.expanded_groups(group, spatial=truncated)[::stride]:
                one_group(ids, parallel)
        expanded = rows_of(pieces)
        small_out, small_in = out.small_rows, inn.small_rows
        all_rows = np.arange(small_out, out.n_points, stride)
        if (stride == 1 or not k_in) and expanded[0].size < all_rows.size:
            # every row the sample covers, the empty ones (zero weights) included
            unseen = np.setdiff1d(all_rows, expanded[0], assume_unique=True)
            expanded = rows_of([expanded, empty_rows(unseen)])
        if small_in and expanded[0].size:
            # the expanded output rows against the small input clusters, exactly
            rows, scale, Z = expanded
            exact = _exact_scaled(
                A_out,
                xp.take(A_out.points, A_out.put_index(rows), axis=0),
                A_in.points[:small_in, ...],
                w_on[:small_in],
                None if exact_values is None else exact_values[:small_in, ...],
                reg,
                parallel,
            )
            expanded = (rows, *_combine(xp, scale, Z, *exact))
        parts = [expanded]
        if small_out:
            # small output clusters against every input point, exactly
            sampled = np.arange(0, small_out, stride)
            points = A_out.points[0:small_out:stride, ...]
            exact = _exact_scaled(A_out, points, A_in.points, w_on, exact_values, reg, parallel)
            parts.append((sampled, *exact))
        rows = rows_of(parts)
        if stride > 1:  # the rows the sample left out
            missing = np.setdiff1d(np.arange(out.n_points), rows[0], assume_unique=True)
            rows = rows_of([rows, empty_rows(missing)])
    # one gather from the pieces' order to the caller's
    position = np.empty(out.n_points, dtype=np.int64)
    position[rows[0]] = np.arange(out.n_points)
    caller = A_out.put_index(position[out.inverse_order])
    return (
        A_out.get(xp.take(rows[1], caller, axis=0)),
        A_out.get(xp.take(rows[2], caller, axis=0)),
    )


def _padded_rows(batch: _Batch) -> int:
    """Rows a batched product computes for ``batch``, padding included."""
    return int(batch.index.size if batch.index is not None else batch.rows.stop - batch.rows.start)


def _count_group(work, in_batches, out_batches, kept, n_group, R, d, n_values) -> None:
    """Add one group's work (:func:`_apply`'s steps 1 and 2) to ``work``: per input row and
    output cluster an exponent (``d`` multiply-adds and an exponential) and its moments
    (``R k``); per output row and kept input cluster the same exponent, ``F G`` (``R k``) and
    the sum (``k``). ``'entries'``: the (row, cluster) pairs; ``'fma'``: multiply-adds in the
    batched products; ``'exp'``: exponentials; ``'calls'``: batched products (each one's
    fixed cost: gathers, temporaries, the interpreter)."""
    inputs = sum(_padded_rows(batch) for batch in in_batches) * n_group
    outputs = sum(_padded_rows(batch) for batch in out_batches) * kept
    work["entries"] += inputs + outputs
    work["exp"] += inputs + outputs
    work["calls"] += len(in_batches) + len(out_batches)
    work["fma"] += inputs * (d + n_values * R) + outputs * (d + n_values * (R + 1))


def _count_exact_and_groups(work, out, inn, group, truncated, k_in, stride, one_group) -> None:
    """The counting branch of :func:`_apply`: the expanded groups (every ``stride``-th,
    scaled by the share of the expanded rows they hold) and the exactly handled rows
    (``'exact'``: entries computed from the points, each ``d`` multiply-adds and an
    exponential)."""
    expanded_rows = out.n_points - out.small_rows
    if k_in:
        before = dict(work)
        sampled = out.expanded_groups(group, spatial=truncated)[::stride]
        for ids in sampled:
            one_group(ids, False)
        rows = sum(int(np.sum(out.offsets[ids + 1] - out.offsets[ids])) for ids in sampled)
        share = expanded_rows / rows if rows else 0.0
        for key in ("entries", "exp", "fma", "calls"):
            work[key] = before[key] + (work[key] - before[key]) * share
    small_in = expanded_rows * inn.small_rows
    work["exact"] += out.small_rows * inn.n_points + small_in
    work["entries"] += out.small_rows * inn.n_points + small_in


@dataclass(frozen=True)
class _InputBounds:
    """What the truncation bounds read of the expanded input clusters, for given log weights
    ``w`` (sorted order): per cluster ``B``, ``log |B|``, the largest, smallest and mean ``w``,
    the radius ``r_B``, the centroid ``ybar_B`` (centred coordinates) and the spread
    ``mean_j ||y_j - ybar_B||^2``."""

    log_size: np.ndarray
    top: np.ndarray
    low: np.ndarray
    mean: np.ndarray
    radius: np.ndarray
    centroid: np.ndarray
    spread: np.ndarray


def _input_bounds(side: _Side, w_sorted: np.ndarray) -> _InputBounds:
    """:class:`_InputBounds` of ``side``'s expanded clusters for the log weights ``w_sorted``."""
    kb = side.n_small
    starts = side.offsets[kb:-1]  # expanded clusters are a suffix: reduceat's last is right
    sizes = np.diff(side.offsets)[kb:]
    return _InputBounds(
        np.log(sizes),
        np.maximum.reduceat(w_sorted, starts),
        np.minimum.reduceat(w_sorted, starts),
        # a zero weight (-inf; +inf is refused) makes the mean -inf: the Jensen term drops out
        np.add.reduceat(w_sorted, starts) / sizes,
        side.cluster_radius[kb:],
        side.centers[kb:] + side.centroid_offset[kb:],
        side.spread[kb:],
    )


def _kept_pairs(
    pair_sq: np.ndarray,
    out_centers: np.ndarray,
    out_radius: np.ndarray,
    inputs: _InputBounds,
    reg: float,
    truncate: float,
) -> np.ndarray:
    """Which cluster pairs ``(A, B)`` a product truncated at ``truncate`` must compute.

    For ``x_i`` in ``A`` and ``y_j`` in ``B`` the distance is at least
    ``near = max(0, ||c_A - c_B|| - r_A - r_B)`` (``r`` the clusters' largest radii), so with
    ``w_B^max`` the largest log weight of ``B``:

    .. math::
        S_{iB} = \\sum_{j \\in B} e^{w_j - \\|x_i - y_j\\|^2 / reg}
              \\le \\exp(\\log|B| + w_B^{max} - near_{AB}^2 / reg) =: e^{U_{AB}}.

    Every row of ``A`` sums to at least ``e^{L_A}``, the largest of three lower bounds:
    ``LSE_B(log|B| + w_B^min - far_AB^2/reg)`` and ``max_B(w_B^max - far_AB^2/reg)`` with
    ``far = ||c_A - c_B|| + r_A + r_B``, and Jensen's inequality over each ``B``
    (``mean_j ||x - y_j||^2 = ||x - ybar_B||^2 + s_B`` for the centroid ``ybar_B`` and spread
    ``s_B``, and ``||x_i - ybar_B|| <= ||c_A - ybar_B|| + r_A``):

    .. math::
        S_{iB} \\ge |B| \\exp\\big(\\bar w_B - ((\\|c_A - \\bar y_B\\| + r_A)^2 + s_B)
              / reg\\big),

    summed over ``B`` by a log-sum-exp (it loses only ``B``'s spread, not its radius, and
    ``A``'s radius once). The pairs of ``A`` with the smallest ``U_AB`` are skipped as long as
    their bounds sum to at most ``truncate e^{L_A}``: the skipped pairs of a row hold at most
    ``truncate`` of its sum (the polynomial's own relative error comes on top).
    ``O(|group| k log k)``.

    Returns
    -------
    ndarray of bool, shape (|group|, k)
    """
    distance = np.sqrt(pair_sq)
    near = np.maximum(distance - out_radius[:, None] - inputs.radius[None, :], 0.0)
    upper = inputs.log_size + inputs.top - near * near / reg
    lower = _row_sum_lower_bound(distance, out_centers, out_radius, inputs, reg)
    with np.errstate(invalid="ignore"):
        # skip the smallest bounds while their sum stays within truncate e^L
        order = np.argsort(upper, axis=1)
        ascending = np.take_along_axis(upper, order, axis=1)
        running = np.logaddexp.accumulate(ascending, axis=1)
        skipped = running <= (lower + np.log(truncate))[:, None]
    keep = np.ones_like(upper, dtype=bool)
    np.put_along_axis(keep, order, ~skipped, axis=1)
    return keep


def _row_sum_lower_bound(
    distance: np.ndarray,
    out_centers: np.ndarray,
    out_radius: np.ndarray,
    inputs: _InputBounds,
    reg: float,
) -> np.ndarray:
    """``L_A``, shape ``(|group|,)``: every row of output cluster ``A`` sums to at least
    ``e^{L_A}`` over the expanded input clusters (the three bounds of :func:`_kept_pairs`);
    ``distance`` is ``||c_A - c_B||``, shape ``(|group|, k)``."""
    far = distance + out_radius[:, None] + inputs.radius[None, :]
    far_sq = far * far / reg
    to_centroid = np.sqrt(
        np.maximum(
            sq_norms(out_centers)[:, None]
            + sq_norms(inputs.centroid)[None, :]
            - 2.0 * out_centers @ inputs.centroid.T,
            0.0,
        )
    )
    jensen_sq = (to_centroid + out_radius[:, None]) ** 2 + inputs.spread[None, :]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.maximum.reduce(
            [
                logsumexp(inputs.log_size + inputs.low - far_sq, axis=1),
                np.max(inputs.top - far_sq, axis=1),
                logsumexp(inputs.log_size + inputs.mean - jensen_sq / reg, axis=1),
            ]
        )


def _exact_scaled(
    arrays: _HostArrays,
    points: Any,
    others: Any,
    log_w: Any,
    values: Any,
    reg: float,
    parallel: bool,
) -> tuple[Any, Any]:
    """Exact ``sum_j exp(log_w_j) K_ij values_j`` as ``(scale, Z)``, for arrays where
    ``arrays``' products run; row blocks on the pool (host) or of ``BLOCK_BYTES`` (device)."""
    xp = arrays.xp
    scale = arrays.empty((points.shape[0],))
    Z = arrays.empty((points.shape[0], 1 if values is None else values.shape[1]))
    others_sq = xp.sum(others * others, axis=1)

    def blocks(part) -> None:
        for rows in part:
            X = points[rows, :]
            x_sq = xp.sum(X * X, axis=1)
            logits = neg_cost_on_device(xp, X, x_sq, others, others_sq, reg, SQEUCLIDEAN)
            logits += log_w[None, :]
            top = xp.max(logits, axis=1)
            safe = xp.where(xp.isfinite(top), top, xp.zeros_like(top))
            logits -= safe[:, None]
            logits = xp.exp(logits)
            Z[rows, :] = (
                xp.sum(logits, axis=1, keepdims=True) if values is None else logits @ values
            )
            scale[rows] = safe

    target = None if arrays.on_host else BLOCK_BYTES  # a device wants large blocks
    rows_per_block = block_rows(others.shape[0], target_bytes=target, dim=points.shape[1])
    run_parts(blocks, list(row_slices(points.shape[0], rows_per_block)), parallel)
    return scale, Z


def _combine(xp: Any, s1: Any, Z1: Any, s2: Any, Z2: Any) -> tuple[Any, Any]:
    """``exp(s) Z = exp(s1) Z1 + exp(s2) Z2`` with ``s = max(s1, s2)`` (``-inf`` allowed), in
    the Array API namespace ``xp``."""
    top = xp.maximum(s1, s2)
    safe = xp.where(xp.isfinite(top), top, xp.zeros_like(top))
    return safe, Z1 * xp.exp(s1 - safe)[:, None] + Z2 * xp.exp(s2 - safe)[:, None]


def _log_of_scaled(scale: np.ndarray, Z: np.ndarray) -> np.ndarray:
    """``scale + log(Z)`` with ``Z = 0`` (all weights zero) giving ``-inf``."""
    with np.errstate(divide="ignore"):
        return scale + np.log(Z)
