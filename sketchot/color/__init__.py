"""Colour transfer between images with entropic optimal transport (any kernel backend).

* :func:`color_transfer` recolours a source image with the palette of a target image;
  :func:`transfer_colors` does the same and returns the plan, timings and checks.
* :func:`map_image` applies a fitted transport to every pixel of an image (forward or inverse).
* Image helpers: :func:`load_image`, :func:`load_image_pair`, :func:`sample_pixels`,
  :func:`save_image`, :func:`distinct_colors`, :class:`ColorIndex`, :func:`available_memory`,
  :func:`color_spread`.
* Output files: :class:`OutputSet` (checked up front, written all together or not at all),
  :func:`check_output_paths`; :mod:`sketchot.color.cli` holds the command-line helpers.
"""

from .images import (
    ColorIndex,
    PixelSample,
    atomic_write_with,
    available_memory,
    color_spread,
    distinct_colors,
    image_alpha,
    image_pixels,
    load_image,
    load_image_pair,
    sample_pixels,
    save_image,
    visible_pixels,
)
from .outputs import OutputPathError, OutputSet, check_output_paths
from .transfer import (
    DEFAULT_BACKEND,
    DEFAULT_COLOR_RANK,
    DEFAULT_N_SAMPLES,
    DEFAULT_REG,
    ColorTransferResult,
    MappedImage,
    color_transfer,
    map_image,
    resolve_backend_params,
    transfer_colors,
)

__all__ = [
    "DEFAULT_BACKEND",
    "DEFAULT_COLOR_RANK",
    "DEFAULT_N_SAMPLES",
    "DEFAULT_REG",
    "ColorIndex",
    "ColorTransferResult",
    "MappedImage",
    "OutputPathError",
    "OutputSet",
    "PixelSample",
    "atomic_write_with",
    "available_memory",
    "check_output_paths",
    "color_spread",
    "color_transfer",
    "distinct_colors",
    "image_alpha",
    "image_pixels",
    "load_image",
    "load_image_pair",
    "map_image",
    "resolve_backend_params",
    "sample_pixels",
    "save_image",
    "transfer_colors",
    "visible_pixels",
]
