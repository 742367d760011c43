"""Images as colour point clouds: loading, sampling and saving.

Colour transfer treats an image as a cloud of points in the RGB cube ``[0, 1]^3`` (one point per
pixel). This module turns anything Pillow reads (or an array) into such a cloud, samples it with
an explicit random generator, and writes results back to image files without ever leaving a
partially written file behind.

Conventions: images are float64 arrays of shape ``(H, W, 3)`` with values in ``[0, 1]``; 8-bit
data are divided by 255 and 16-bit data by 65535 (so that white is exactly 1).
"""

from __future__ import annotations

import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from .._validation import check_int, check_rng, describe

#: Pillow modes that hold 16-bit (or wider) integers, which ``Image.convert("RGB")`` would clip
#: to 255; they are scaled by hand instead.
_WIDE_INTEGER_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I")

#: Integer quantisations recognised by :func:`distinct_colors` (levels per channel): 8-bit
#: images scaled by 255 (this module), by 256 (POT's colour example), and 16-bit images.
_QUANTISATION_LEVELS = (255, 256, 65535)

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

PathLike = str | os.PathLike


def load_image(image: Any, *, name: str = "image") -> np.ndarray:
    """Read an image as float RGB in ``[0, 1]``.

    Parameters
    ----------
    image : str, os.PathLike or array-like
        A file Pillow can read (any mode: RGB, RGBA, greyscale ``L`` and ``1``, palette ``P``,
        16-bit greyscale ``I;16``, 32-bit integer ``I``, float ``F``, CMYK, YCbCr, ...), or an
        array of shape ``(H, W)``, ``(H, W, 1)``, ``(H, W, 3)`` or ``(H, W, 4)`` with dtype uint8
        (divided by 255), uint16 (divided by 65535), or float with values in ``[0, 1]``.
    name : str, default="image"
        How the argument is called in error messages (``"source"``, ``"target"``, ...).

    Returns
    -------
    ndarray, shape (H, W, 3), float64
        Greyscale is replicated on the three channels; an alpha channel is dropped (colour
        transfer acts on colours, not on opacity).

    Raises
    ------
    FileNotFoundError
        The path does not exist.
    ValueError
        The file is not an image Pillow can read, the image has zero pixels, or float values
        lie outside ``[0, 1]``.
    TypeError
        The argument is neither a path nor a numeric array.
    """
    if isinstance(image, (str, os.PathLike)):
        return _load_file(Path(image), name)
    if isinstance(image, Image.Image):
        return _from_pillow(image, name, f"{name} (a PIL image)")
    return _from_array(image, name)


def image_pixels(image: np.ndarray) -> np.ndarray:
    """The ``(H * W, 3)`` point cloud of an ``(H, W, 3)`` image (a view when possible)."""
    return np.asarray(image).reshape(-1, 3)


@dataclass(frozen=True)
class PixelSample:
    """Colours drawn from an image and their weights.

    Attributes
    ----------
    colors : ndarray, shape (n, 3)
        Sampled RGB values in ``[0, 1]``.
    weights : ndarray, shape (n,)
        Non-negative weights summing to 1 (the histogram ``a`` or ``b`` of the transport).
    n_pixels : int
        Number of pixels of the image the sample was drawn from.
    """

    colors: np.ndarray
    weights: np.ndarray
    n_pixels: int

    def __len__(self) -> int:
        return self.colors.shape[0]


def sample_pixels(
    image: Any,
    n_samples: int,
    *,
    rng: Any = None,
    replace: bool = False,
    weighted: bool = False,
    name: str = "image",
) -> PixelSample:
    """Draw ``n_samples`` colours from an image.

    Parameters
    ----------
    image : array-like, shape (H, W, 3), or anything :func:`load_image` accepts
    n_samples : int
        Number of colours to draw (>= 1).
    rng : None, int, Generator, ...
        Passed to ``numpy.random.default_rng``: the only source of randomness.
    replace : bool, default=False
        Draw pixels with replacement (POT's colour example does), which allows ``n_samples``
        above the number of pixels. Not available with ``weighted=True``.
    weighted : bool, default=False
        ``False``: draw pixels uniformly, each with weight ``1 / n`` (an empirical measure of
        the image's colours). ``True``: draw distinct colours uniformly and weight each by its
        pixel count, normalised over the sample (a self-normalised importance sample of the
        same colour distribution that gives rare colours, such as a small bright sun, a point
        of their own). When the image has at most ``n_samples`` distinct colours they are all
        used, and the weights are the exact colour histogram.
    name : str
        Argument name for error messages.

    Returns
    -------
    PixelSample

    Notes
    -----
    ``O(H W)`` time for the uniform draw without replacement (a partial permutation), plus
    ``O(H W log(H W))`` for ``weighted=True`` (distinct colours by sorting).
    """
    image = load_image(image, name=name)
    n_samples = check_int(n_samples, "n_samples", minimum=1)
    if not isinstance(replace, (bool, np.bool_)):
        raise TypeError(f"replace must be True or False; got {describe(replace)}")
    if not isinstance(weighted, (bool, np.bool_)):
        raise TypeError(f"weighted must be True or False; got {describe(weighted)}")
    generator = check_rng(rng)
    pixels = image_pixels(image)
    n_pixels = pixels.shape[0]

    if weighted:
        if replace:
            raise ValueError(
                "replace=True cannot be combined with weighted=True: distinct colours are "
                "weighted by their pixel counts, so drawing one twice would count it twice"
            )
        colors, inverse = distinct_colors(pixels, exhaustive=True)
        counts = np.bincount(inverse, minlength=colors.shape[0]).astype(np.float64)
        if colors.shape[0] > n_samples:
            chosen = np.sort(generator.choice(colors.shape[0], size=n_samples, replace=False))
            colors, counts = colors[chosen], counts[chosen]
        return PixelSample(colors, counts / counts.sum(), n_pixels)

    if not replace and n_samples > n_pixels:
        raise ValueError(
            f"n_samples ({n_samples}) is larger than the number of pixels of {name} "
            f"({n_pixels}) and sampling is without replacement; lower n_samples or sample "
            "with replacement (replace=True, --replace)"
        )
    index = generator.choice(n_pixels, size=n_samples, replace=bool(replace))
    colors = pixels[index]
    return PixelSample(colors, np.full(n_samples, 1.0 / n_samples), n_pixels)


def distinct_colors(
    pixels: np.ndarray, *, exhaustive: bool = False
) -> tuple[np.ndarray, np.ndarray] | None:
    """Distinct rows of a colour cloud and, for each pixel, the index of its colour.

    A colour map depends on the colour only, so mapping the distinct colours and gathering is
    exact and saves most of the work on photographs (a 1-megapixel photograph typically has
    5-20 times fewer distinct colours than pixels).

    Parameters
    ----------
    pixels : ndarray, shape (N, 3)
    exhaustive : bool, default=False
        ``False``: only detect duplicates when the values are an integer quantisation (8-bit
        data divided by 255 or 256, 16-bit data divided by 65535): the rows are then packed
        into one integer each and sorted, ``O(N log N)`` on integers (0.25 s for 10^6 pixels).
        Returns ``None`` otherwise, since a byte-wise sort of float rows costs seconds and
        rarely finds duplicates in continuous data. ``True``: fall back to that byte-wise
        sort for any data.

    Returns
    -------
    (colors, inverse) or None
        ``colors[inverse]`` reproduces ``pixels`` exactly.
    """
    pixels = np.ascontiguousarray(pixels, dtype=np.float64)
    for levels in _QUANTISATION_LEVELS:
        scaled = pixels * levels
        quantised = np.rint(scaled)
        if (
            quantised.min(initial=0.0) >= 0
            and quantised.max(initial=0.0) <= levels
            and np.array_equal(quantised / levels, pixels)
        ):
            base = levels + 1
            codes = quantised.astype(np.int64) @ np.array([base * base, base, 1], dtype=np.int64)
            unique_codes, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
            del unique_codes
            return pixels[first], inverse.reshape(-1)
    if not exhaustive:
        return None
    rows = pixels.view(np.dtype((np.void, pixels.dtype.itemsize * pixels.shape[1]))).ravel()
    _, first, inverse = np.unique(rows, return_index=True, return_inverse=True)
    return pixels[first], inverse.reshape(-1)


def save_image(image: Any, path: PathLike, *, name: str = "image") -> Path:
    """Write a float RGB image in ``[0, 1]`` to a file, atomically.

    The format follows the file extension (any format Pillow writes RGB in: ``.png``, ``.jpg``,
    ``.tif``, ``.bmp``, ``.webp``, ...). Values are rounded to 8 bits. The data go to a
    temporary file in the destination folder first, which then replaces ``path`` in one
    ``os.replace``: an interrupted or failed write never leaves a partial file.

    Parameters
    ----------
    image : array-like, shape (H, W, 3)
        Float values in ``[0, 1]`` (or uint8).
    path : str or os.PathLike
        Destination; its folder must exist.
    name : str
        Argument name for error messages.

    Returns
    -------
    pathlib.Path
        The written path.
    """
    pixels = _as_uint8(load_image(image, name=name))
    path = Path(path)
    image_format = _format_for(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise FileNotFoundError(f"output folder {str(folder)!r} of {str(path)!r} does not exist")
    picture = Image.fromarray(pixels, mode="RGB")
    _atomic_write(path, lambda handle: picture.save(handle, format=image_format))
    return path


def atomic_write_with(path: PathLike, writer: Any) -> Path:
    """Run ``writer(file_object)`` into a temporary file next to ``path``, then rename it.

    Used for every output file (images and figures) so that none is ever left half written.
    """
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise FileNotFoundError(f"output folder {str(folder)!r} of {str(path)!r} does not exist")
    _atomic_write(path, writer)
    return path


# ------------------------------------------------------------------------------------ helpers
def _atomic_write(path: Path, writer: Any) -> None:
    folder = path.parent if str(path.parent) else Path(".")
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(handle, "wb") as stream:
            writer(stream)
        # mkstemp creates the file private (0600); give it the permissions a plain open()
        # would have given (0666 minus the umask)
        os.chmod(temporary, 0o666 & ~_umask())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process umask (reading it requires setting it; restored at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _format_for(path: Path) -> str:
    extension = path.suffix.lower()
    formats = Image.registered_extensions()
    if extension not in formats:
        raise ValueError(
            f"cannot tell the image format of {str(path)!r} from its extension "
            f"{extension or '(none)'!r}; use .png, .jpg, .tif, .bmp or .webp"
        )
    return formats[extension]


def _load_file(path: Path, name: str) -> np.ndarray:
    if not path.exists():
        raise FileNotFoundError(f"{name}: file {str(path)!r} does not exist")
    if path.is_dir():
        raise ValueError(f"{name}: {str(path)!r} is a folder, not an image file")
    try:
        with Image.open(path) as picture:
            picture.load()
            return _from_pillow(picture, name, f"{name} {str(path)!r}")
    except UnidentifiedImageError:
        size = _png_size(path)
        if size is not None and 0 in size:
            raise ValueError(
                f"{name}: {str(path)!r} has zero pixels (width x height = {size[0]} x {size[1]})"
            ) from None
        if path.stat().st_size == 0:
            raise ValueError(f"{name}: {str(path)!r} is an empty file (0 bytes)") from None
        raise ValueError(f"{name}: {str(path)!r} is not an image file Pillow can read") from None
    except OSError as exc:  # truncated or corrupt data, unreadable file
        raise ValueError(f"{name}: cannot read image {str(path)!r}: {exc}") from None


def _png_size(path: Path) -> tuple[int, int] | None:
    """Width and height from a PNG header, which Pillow refuses to open when one is zero."""
    with path.open("rb") as stream:
        header = stream.read(24)
    if len(header) < 24 or not header.startswith(_PNG_SIGNATURE) or header[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", header[16:24])


def _from_pillow(picture: Image.Image, name: str, label: str) -> np.ndarray:
    width, height = picture.size
    if width == 0 or height == 0:
        raise ValueError(f"{label} has zero pixels (width x height = {width} x {height})")
    if picture.mode in _WIDE_INTEGER_MODES:
        values = np.asarray(picture).astype(np.float64)
        if values.min() < 0 or values.max() > 65535:
            raise ValueError(
                f"{label}: 32-bit integer image with values in [{values.min():g}, "
                f"{values.max():g}]; only 0..65535 (16-bit) is supported"
            )
        grey = values / 65535.0
        return np.repeat(grey[:, :, None], 3, axis=2)
    if picture.mode == "F":
        return _from_array(np.asarray(picture, dtype=np.float64), name)
    if picture.mode != "RGB":
        picture = picture.convert("RGB")
    return np.asarray(picture, dtype=np.float64) / 255.0


def _from_array(value: Any, name: str) -> np.ndarray:
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"{name} must be an image file path or an array of shape (H, W, 3); "
            f"got {describe(value)}"
        ) from exc
    if array.dtype.kind not in "buif":
        raise TypeError(
            f"{name} must be an image file path or a numeric array of shape (H, W, 3); "
            f"got {describe(value)}"
        )
    if array.ndim == 2:
        array = array[:, :, None]
    if array.ndim != 3 or array.shape[2] not in (1, 3, 4):
        raise ValueError(
            f"{name} must have shape (H, W), (H, W, 1), (H, W, 3) or (H, W, 4); "
            f"got shape {array.shape}"
        )
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise ValueError(f"{name} has zero pixels (shape {array.shape})")
    if array.shape[2] == 4:
        array = array[:, :, :3]  # drop alpha
    if array.shape[2] == 1:
        array = np.repeat(array, 3, axis=2)
    if array.dtype == np.uint8 or array.dtype == np.bool_:
        return array.astype(np.float64) / (255.0 if array.dtype == np.uint8 else 1.0)
    if array.dtype == np.uint16:
        return array.astype(np.float64) / 65535.0
    if array.dtype.kind in "iu":
        raise TypeError(
            f"{name} must be uint8, uint16 or float; got integer dtype {array.dtype} (scale "
            "it to [0, 1] floats or cast it to uint8 or uint16 first)"
        )
    result = array.astype(np.float64)
    if not np.all(np.isfinite(result)):
        raise ValueError(f"{name} must contain only finite values; got NaN or inf")
    low, high = float(result.min()), float(result.max())
    if low < 0.0 or high > 1.0:
        raise ValueError(
            f"{name} is a float array with values in [{low:.4g}, {high:.4g}]; float images must "
            "lie in [0, 1] (divide 8-bit data by 255)"
        )
    return result


def _as_uint8(image: np.ndarray) -> np.ndarray:
    return np.round(np.clip(image, 0.0, 1.0) * 255.0).astype(np.uint8)
