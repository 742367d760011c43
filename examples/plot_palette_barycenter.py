"""
Palette average: the colour barycenter of three photographs
===========================================================

The colours of three photographs (a sunset, an autumn forest and a daylight coast, drawn by
``images/make_images.py``) are three clouds in RGB space. Their Wasserstein barycenter,
:func:`sketchot.barycenter`, is the palette "in between": each colour of the average is the
fixed point ``z = sum_k lambda_k T_k(z)`` of the entropic barycentric maps ``T_k`` to the three
palettes (POT's free-support rule). Sending every pixel of each photograph to that palette
by entropic optimal transport (:func:`sketchot.sinkhorn` and :func:`sketchot.map_image`)
gives the three scenes one shared colour grading.

Every transport runs on sketchot's one solver (``backend='auto'``), warm-started between the
outer steps, and each result carries its check against the true kernel. Nothing is
downloaded or written.
"""

# %%
# The three palettes
# ------------------
# ``n`` colours drawn from each photograph with an explicit generator (uniform weights: an
# empirical measure of the picture's colours).
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

import sketchot

ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "images").is_dir())
files = {"sunset": "default_source", "autumn forest": "pair2_source", "coast": "default_target"}
names = list(files)
photos = [sketchot.load_image(ROOT / "images" / f"{files[name]}.png") for name in names]
rng = np.random.default_rng(0)
n = 2000
palettes = [sketchot.sample_pixels(photo, n, rng=rng).colors for photo in photos]

# %%
# Their average
# -------------
# ``reg = 0.005`` (absolute, colours in ``[0, 1]^3``): small next to the palettes' spread, so
# the average keeps distinct colours. The support has ``n`` colours drawn from the pooled
# palettes. ``tol`` bounds the SUM over the ``n`` colours of their squared moves in one
# step: ``n * 1e-3^2 = 2e-3`` is a root-mean-square move of ``1e-3``, a quarter of one 8-bit
# level (the fixed point creeps: a tighter ``tol`` costs many steps and changes nothing
# visible).
reg = 0.005
average = sketchot.barycenter(palettes, reg=reg, n_support=n, max_iter=30, tol=n * 1e-6, rng=1)
print(average)
print("backends:", sorted(set(average.backends)), "accuracy met:", average.accuracy_met)
inside = (average.X >= 0).all() and (average.X <= 1).all()
print("every average colour is a colour (inside [0, 1]^3):", bool(inside))

# %%
# Each photograph graded to the average palette
# ---------------------------------------------
# One solve per photograph, from its sample to the average palette; the entropic map sends
# every pixel (the sample only fits the transport).
graded = []
for photo, palette in zip(photos, palettes, strict=True):
    solve = sketchot.sinkhorn(None, None, palette, average.X, reg=reg, rng=2)
    print(f"{solve.backend}: true-kernel error {solve.true_kernel.bound:.1e}")
    graded.append(sketchot.map_image(solve, photo).image)


# %%
# Plot
# ----
# Top: the photographs and, under each, its palette sorted by brightness; bottom: the same
# scenes in the average palette, and the average palette itself.
def strip(colours, width=400):
    order = np.argsort(colours.sum(axis=1))
    picks = colours[order][np.linspace(0, len(colours) - 1, width).astype(int)]
    return np.repeat(picks[None, :, :], 40, axis=0)


fig, axes = plt.subplots(4, 4, figsize=(12, 7), gridspec_kw={"height_ratios": [4, 1, 4, 1]})
for k, (photo, palette, image) in enumerate(zip(photos, palettes, graded, strict=True)):
    axes[0, k].imshow(photo)
    axes[0, k].set_title(names[k])
    axes[1, k].imshow(strip(palette))
    axes[2, k].imshow(image)
    axes[2, k].set_title("in the average palette")
    axes[3, k].imshow(strip(average.X))
axes[0, 3].scatter(*average.X[:, :2].T, s=2, c=np.clip(average.X, 0, 1))
axes[0, 3].set_title("average palette (red, green)")
axes[0, 3].set_aspect("equal")
axes[1, 3].imshow(strip(average.X))
axes[2, 3].axis("off")
axes[3, 3].axis("off")
for ax in axes.flat:
    ax.set_xticks([])
    ax.set_yticks([])
fig.tight_layout()
if plt.get_backend().lower() != "agg":
    plt.show()
