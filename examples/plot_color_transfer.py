"""
Colour transfer on the embedded images
======================================

Recolour a sunset (``images/default_source.png``) with the palette of a daylight coast
(``images/default_target.png``): sample colours from both images, solve entropic optimal
transport between the two samples, and send EVERY pixel of the source through the entropic
(barycentric) map. Both images are drawn by ``images/make_images.py`` and committed, so
nothing is downloaded; nothing is written either (the figure is only shown).

The command-line program ``python examples/color_transfer.py`` does the same on any pair of
photographs and writes the result into ``outputs/``.
"""

# %%
# The transfer
# ------------
# :func:`sketchot.transfer_colors` returns the recoloured image with everything computed on
# the way: what ``backend="auto"`` chose and why, the timings, and the check of the scalings
# against the TRUE kernel ``exp(-||x - y||^2 / reg)``.
from pathlib import Path

import matplotlib.pyplot as plt

import sketchot

# the repository's images/ folder (the gallery runs each script from examples/)
ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "images").is_dir())
source = sketchot.load_image(ROOT / "images" / "default_source.png")
target = sketchot.load_image(ROOT / "images" / "default_target.png")

result = sketchot.transfer_colors(source, target, reg=0.1, n_samples=6000, rng=0)
solve = result.result
print(f"backend: {solve.backend} ({solve.reason})")
print(f"iterations: {solve.n_iter}, converged: {solve.converged}")
print(f"true-kernel check: {solve.true_kernel.bound:.1e}, accuracy met: {solve.accuracy_met}")
print("timings (s):", {k: round(v, 3) for k, v in result.timings.items()})

# %%
# Source, target and the recoloured source
# ----------------------------------------
fig, axes = plt.subplots(1, 3, figsize=(12, 3.2))
for ax, image, title in zip(
    axes, (source, target, result.image), ("source", "target", "source, recoloured"), strict=True
):
    ax.imshow(image)
    ax.set_title(title)
    ax.axis("off")
fig.tight_layout()

# %%
# The same in one call
# --------------------
# :func:`sketchot.color_transfer` returns only the image; paths or arrays go in, float RGB
# in ``[0, 1]`` comes out (an alpha channel is kept unchanged).
image = sketchot.color_transfer(source, target, reg=0.1, n_samples=6000, rng=1)
print(image.shape, image.dtype, float(image.min()), float(image.max()))
