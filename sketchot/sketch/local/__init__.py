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
exact entries instead, ``O(n m_small + n_small m)``, cheaper than ``R`` features each; a
truncated product bounds their pairs with the others and computes the kept ones only
(skipping them within rounding only: a product of exactly handled clusters stays exact). When
nearly every cluster is that small (data filling 3-D at small ``reg``) the method degrades
to the exact kernel: it is a method for low-dimensional, clustered data.

The package is split by what it does: :mod:`~sketchot.sketch.local.fit` (the polynomial
and the monomial features), :mod:`~sketchot.sketch.local.clusters` (the cover of each
cloud and each cloud sorted by cluster), :mod:`~sketchot.sketch.local.truncation` (the
bounds that let log-domain products skip cluster pairs),
:mod:`~sketchot.sketch.local.products` (the products, planned on the host) and
:mod:`~sketchot.sketch.local.device` (where their per-point work runs: NumPy or an Array
API library's device); :mod:`~sketchot.sketch.local.expansion` holds the estimator.

References
----------
Schmitzer, B. (2019). Stabilized sparse scaling algorithms for entropy regularized transport
problems. SIAM J. Sci. Comput. 41(3), A1443-A1481.

Han, I., Avron, H. and Shin, J. (2020). Polynomial Tensor Sketch for element-wise function of
low-rank matrix. ICML 2020 (polynomial expansion of element-wise functions such as
``exp(U V^T)``).
"""

# Internals that tests and benchmarks read, importable from here as before the split. The
# tunables (_ROW_BLOCK, _TRUNCATED_GROUP, ...) and the helpers a benchmark wraps (run_parts,
# available_bytes) are not: a patch must reach the module that reads them.
from .clusters import _Batch as _Batch
from .clusters import _cover as _cover
from .clusters import _farthest_points as _farthest_points
from .clusters import _Side as _Side
from .device import _DEVICE_MOMENT_BYTES as _DEVICE_MOMENT_BYTES
from .device import _MOMENT_BYTES as _MOMENT_BYTES
from .device import _DeviceArrays as _DeviceArrays
from .device import _HostArrays as _HostArrays
from .expansion import EPS as EPS
from .expansion import LocalGaussianExpansion
from .fit import _fit_exp_degree as _fit_exp_degree
from .fit import _fit_exp_relative as _fit_exp_relative
from .fit import _local_monomials as _local_monomials
from .fit import _MeansPlan as _MeansPlan
from .fit import _MonomialPlan as _MonomialPlan
from .products import _apply as _apply
from .products import _combine as _combine
from .products import _exact_scaled as _exact_scaled
from .products import _log_of_scaled as _log_of_scaled
from .truncation import _input_bounds as _input_bounds
from .truncation import _InputBounds as _InputBounds
from .truncation import _kept_pairs as _kept_pairs
from .truncation import _row_sum_lower_bound as _row_sum_lower_bound

__all__ = ["LocalGaussianExpansion"]
