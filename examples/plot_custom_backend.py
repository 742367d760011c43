"""
A backend of your own
=====================

A backend is a function that builds a :class:`~sketchot.KernelOperator` from the problem's
geometry, registered once with :func:`sketchot.register_backend`. From then on
``backend="landmark_rows"`` works in every entry point (:func:`sketchot.sinkhorn`,
:func:`sketchot.make_kernel`, the colour functions), ``rank=`` maps to its rank parameter,
and the solver checks its answer against the true kernel like any other backend's.

The toy backend below is a Nystrom approximation whose landmarks are simply the first
``n_rows`` source points: ``K ~ K(X, Z) K(Z, Z)^-1 K(Z, Y)``.
"""

# %%
# The builder
# -----------
# It receives the geometry (``geometry.X``, ``geometry.Y``, ``geometry.reg``), ``rng``,
# ``dtype`` and its own parameters, and returns an operator. :class:`~sketchot.LowRankKernel`
# does the products from two factors; ``left_map`` / ``right_map`` make it usable out of
# sample (barycentric maps of new points).
import matplotlib.pyplot as plt
import numpy as np
import ot

import sketchot
from sketchot.kernels import KernelInfo, LowRankKernel


def build_landmark_rows(geometry, *, rng=None, dtype=np.float64, n_rows=32):
    """K ~ K(X, Z) K(Z, Z)^-1 K(Z, Y) with Z the first n_rows source points."""
    Z = geometry.X[:n_rows]
    lam, Q = np.linalg.eigh(np.exp(-ot.dist(Z, Z) / geometry.reg))
    keep = lam > 1e-10 * lam.max()
    whiten = Q[:, keep] / np.sqrt(lam[keep])

    def features(points):
        return np.exp(-ot.dist(points, Z) / geometry.reg) @ whiten

    info = KernelInfo("landmark_rows", {"n_rows": n_rows})
    return LowRankKernel(
        geometry,
        info,
        features(geometry.X),
        features(geometry.Y),
        left_map=features,
        right_map=features,
        dtype=dtype,
    )


sketchot.register_backend(
    "landmark_rows",
    build_landmark_rows,
    rank_parameter="n_rows",
    signed=True,
)
print(sketchot.available_backends())

# %%
# Using it
# --------
# The same call as for a built-in backend. Next to it, the built-in Nystrom backend, whose
# landmarks are chosen by greedy k-center over both clouds, at the same ranks.
rng = np.random.default_rng(0)
X, Y = rng.beta(2, 2, size=(2000, 3)), rng.beta(2, 5, size=(2000, 3))
ranks = (8, 16, 32, 64, 128)
errors = {"landmark_rows": [], "nystrom": []}
for backend in errors:
    for rank in ranks:
        res = sketchot.sinkhorn(
            None, None, X, Y, reg=0.5, backend=backend, rank=rank, rng=0, warn=False
        )
        errors[backend].append(res.true_kernel.bound)
        print(f"{backend:14} rank {rank:4d}: true-kernel error {res.true_kernel.bound:.1e}")

fig, ax = plt.subplots(figsize=(5, 3.4))
for backend, values in errors.items():
    ax.loglog(ranks, values, marker="o", label=backend)
ax.axhline(1e-3, color="tab:red", linestyle="--", label="accuracy = 1e-3")
ax.set_xlabel("rank")
ax.set_ylabel("certified true-kernel error")
ax.legend()
fig.tight_layout()

# %%
# The registry record
# -------------------
# :func:`sketchot.get_backend` returns what was registered; the contract tests of the
# project are parametrised over the registry, so a backend registered in the package is
# tested like the built-in ones. The record holds its kernel's facts; whether
# ``backend="auto"`` tries it is the policy's: ``sketchot.policy.register_auto(
# "landmark_rows", order=1)`` would add it to the low-rank rungs. Unregister it when done.
record = sketchot.get_backend("landmark_rows")
print(record.kind, record.rank_parameter, dict(record.defaults), record.metrics)
sketchot.unregister_backend("landmark_rows")
