"""
Unbalanced matching with outliers
=================================

Balanced optimal transport must move every bit of mass, outliers included: a few far points
drag part of the target towards them. Unbalanced transport replaces the hard marginal
constraints by KL penalties of strength ``reg_m`` (POT's convention, in units of the cost),
so mass that is too expensive to move is simply not transported.

Here the source is a 2-D Gaussian cloud plus 10% outliers far away; the target is a shifted
cloud. The same call solves the balanced problem (``reg_m=None``), the unbalanced one
(``reg_m=1``) and the semi-relaxed one (``reg_m=(1, inf)``: every target point must receive
its mass, the source marginal is free).
"""

# %%
# Data
# ----
import matplotlib.pyplot as plt
import numpy as np

import sketchot

rng = np.random.default_rng(0)
n, n_out, m = 400, 40, 400
X = np.vstack([rng.normal(0.0, 0.3, (n, 2)), rng.uniform([3.0, -3.0], [4.0, 3.0], (n_out, 2))])
Y = rng.normal([0.6, 0.3], 0.3, (m, 2))
a = np.full(len(X), 1 / len(X))
b = np.full(m, 1 / m)
is_outlier = np.arange(len(X)) >= n

# %%
# Three solves
# ------------
# ``res.marginals`` are the plan's row and column sums; ``res.mass`` is the transported mass
# and ``res.value`` the objective (``<P, M> + reg KL(P | a b^T)`` plus the marginal
# penalties); ``res.true_kernel`` checks the fixed point against the exact kernel.
solves = {
    "balanced": sketchot.sinkhorn(a, b, X, Y, reg=0.1, rng=0),
    "unbalanced, reg_m = 1": sketchot.sinkhorn(a, b, X, Y, reg=0.1, reg_m=1.0, rng=0),
    "semi-relaxed, reg_m = (1, inf)": sketchot.sinkhorn(
        a, b, X, Y, reg=0.1, reg_m=(1.0, float("inf")), rng=0
    ),
}
for name, res in solves.items():
    sent = res.marginals[0]
    print(
        f"{name:31} mass {res.mass:.3f}, sent by the outliers {sent[is_outlier].sum():.3f} "
        f"(they hold {a[is_outlier].sum():.3f}), true-kernel check {res.true_kernel.bound:.1e}"
    )

# %%
# Where each source point's mass goes
# -----------------------------------
# Each source point is drawn with its transported mass (area) and moved to its barycentric
# image (grey segment). Balanced transport pulls part of the target towards the outliers;
# unbalanced transport leaves them out.
fig, axes = plt.subplots(1, 3, figsize=(13, 4), sharex=True, sharey=True)
for ax, (name, res) in zip(axes, solves.items(), strict=True):
    sent = res.marginals[0]
    mapped = res.barycentric_map()
    heavy = sent > 0.05 / len(X)
    for i in np.flatnonzero(heavy)[::4]:
        ax.plot([X[i, 0], mapped[i, 0]], [X[i, 1], mapped[i, 1]], color="0.75", lw=0.5)
    ax.scatter(*Y.T, s=6, color="tab:orange", label="target")
    ax.scatter(*X.T, s=4e3 * sent, color="tab:blue", label="source (area: mass sent)")
    ax.set_title(f"{name}\nmass {res.mass:.2f}")
    ax.set_aspect("equal")
axes[0].legend(loc="lower left", fontsize=8)
fig.tight_layout()
