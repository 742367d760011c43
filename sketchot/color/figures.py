"""Matplotlib figures for colour transfer: images side by side with their colour distributions.

Figures are built on an explicit ``Figure`` (no pyplot state), so they work with the
non-interactive "Agg" backend in scripts and tests; :func:`save_figure` writes them
atomically. Images may be float in ``[0, 1]`` or uint8/uint16 as stored, of any size: each is
drawn from every k-th pixel (:func:`display_image`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from .._validation import check_int, check_rng
from .images import as_float, visible_pixels
from .outputs import atomic_write_with

#: Pixels drawn per colour-distribution scatter plot (enough to show the shape, fast to draw).
SCATTER_POINTS = 3000

#: Longest side, in pixels, of an image as drawn in a figure: a panel a few inches wide at
#: 100 dpi shows a few hundred pixels, and matplotlib's resampling of a full 81-megapixel
#: photograph takes gigabytes of float copies.
DISPLAY_SIDE = 1200


def display_image(image: np.ndarray, max_side: int = DISPLAY_SIDE) -> np.ndarray:
    """An image as drawn: every k-th pixel so that no side exceeds ``max_side``, float in [0, 1].

    Accepts float images in ``[0, 1]`` and uint8 or uint16 ones (as stored).
    """
    image = np.asarray(image)
    step = max(1, -(-max(image.shape[:2]) // max_side))
    return np.clip(as_float(image[::step, ::step]), 0.0, 1.0)


def color_scatter(axes: Any, image: np.ndarray, rng: np.random.Generator, n_points: int) -> None:
    """Scatter of random pixels in the (red, blue) plane, each drawn in its own colour.

    Red against blue separates warm from cool palettes, as in POT's colour example. Fully
    transparent pixels (alpha 0) are not drawn.
    """
    pixels = visible_pixels(image)
    chosen = rng.choice(pixels.shape[0], size=min(n_points, pixels.shape[0]), replace=False)
    colors = as_float(pixels[chosen])
    axes.scatter(colors[:, 0], colors[:, 2], c=np.clip(colors, 0, 1), s=3, linewidths=0)
    axes.set_xlim(0, 1)
    axes.set_ylim(0, 1)
    axes.set_aspect("equal")
    axes.set_xlabel("red")
    axes.set_ylabel("blue")
    axes.tick_params(labelsize=7)


def color_transfer_figure(
    panels: Sequence[tuple[str, np.ndarray]],
    *,
    title: str | None = None,
    rng: Any = None,
    n_points: int = SCATTER_POINTS,
    panel_width: float = 3.2,
) -> Figure:
    """Images in a row, each above the scatter plot of its colours.

    Parameters
    ----------
    panels : sequence of (label, image)
        E.g. ``[("source", src), ("target", tgt), ("source recoloured", out)]``; images of
        shape ``(H, W, 3)`` or ``(H, W, 4)`` (drawn with their transparency).
    title : str, optional
        Figure title (timings, settings).
    rng : None, int or Generator
        Draws the pixels of the scatter plots.
    n_points : int
        Pixels per scatter plot.
    panel_width : float
        Inches per column.
    """
    n_points = check_int(n_points, "n_points", minimum=1)
    generator = check_rng(rng)
    figure = Figure(figsize=(panel_width * len(panels), panel_width * 1.75), layout="constrained")
    grid = figure.subplots(2, len(panels), squeeze=False, height_ratios=[1.0, 1.0])
    for column, (label, image) in enumerate(panels):
        top, bottom = grid[0, column], grid[1, column]
        top.imshow(display_image(image), interpolation="antialiased")
        top.set_title(label, fontsize=9)
        top.set_axis_off()
        color_scatter(bottom, image, generator, n_points)
    if title:
        figure.suptitle(title, fontsize=10)
    return figure


def comparison_figure(
    header: Sequence[tuple[str, np.ndarray]],
    rows: Sequence[tuple[str, Sequence[tuple[str, np.ndarray]]]],
    *,
    title: str | None = None,
    panel_width: float = 2.8,
) -> Figure:
    """A grid of recoloured images: one row per setting, one column per backend.

    Parameters
    ----------
    header : sequence of (label, image)
        Shown in the first row (source and target).
    rows : sequence of (row label, [(panel label, image), ...])
        Each row's panels, e.g. the exact result followed by each backend's with its timing
        and difference to the exact one in the label.
    """
    n_columns = max(len(header), *(len(panels) for _, panels in rows))
    height = panel_width * 0.72
    figure = Figure(
        figsize=(panel_width * n_columns, height * (1 + len(rows)) + 0.6), layout="constrained"
    )
    grid = figure.subplots(1 + len(rows), n_columns, squeeze=False)
    for axes in grid.ravel():
        axes.set_axis_off()
    for column, (label, image) in enumerate(header):
        grid[0, column].imshow(display_image(image), interpolation="antialiased")
        grid[0, column].set_title(label, fontsize=8)
    for row, (row_label, panels) in enumerate(rows, start=1):
        for column, (label, image) in enumerate(panels):
            axes = grid[row, column]
            axes.imshow(display_image(image), interpolation="antialiased")
            axes.set_title(label, fontsize=7)
        grid[row, 0].text(
            -0.06, 0.5, row_label, transform=grid[row, 0].transAxes, rotation=90,
            ha="right", va="center", fontsize=8,
        )  # fmt: skip
    if title:
        figure.suptitle(title, fontsize=10)
    return figure


def save_figure(figure: Figure, path: str | Path, *, dpi: int = 100) -> Path:
    """Write a figure to ``path`` (format from the extension), atomically."""
    return atomic_write_with(path, figure_writer(figure, path, dpi=dpi))


def figure_writer(figure: Figure, path: str | Path, *, dpi: int = 100):
    """``writer(stream)`` that saves ``figure`` in the format of ``path``'s extension.

    For :meth:`~sketchot.color.outputs.OutputSet.write`.
    """
    image_format = Path(path).suffix.lstrip(".").lower() or "png"
    return lambda stream: figure.savefig(stream, format=image_format, dpi=dpi)
