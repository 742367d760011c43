"""Images as colour point clouds: loading, sampling and saving.

Colour transfer treats an image as a cloud of points in the RGB cube ``[0, 1]^3`` (one point per
pixel). This module turns anything Pillow reads (or an array) into such a cloud, samples it with
an explicit random generator, and writes results back to image files without ever leaving a
partially written file behind.

Conventions: images are float64 arrays of shape ``(H, W, 3)`` with values in ``[0, 1]``, or
``(H, W, 4)`` when the image has an alpha channel (RGBA, kept as the fourth channel); 8-bit
data are divided by 255 and 16-bit data by 65535 (so that white is exactly 1). Colour transfer
acts on colours: fully transparent pixels (alpha 0) are left out of the palette
(:func:`sample_pixels`), and the alpha channel passes through a mapping unchanged. For images too
large for float64 copies, ``load_image(..., dtype=None)`` keeps the stored integers (uint8, or
uint16 for 16-bit files: 3 or 6 bytes per pixel instead of 24) and :class:`ColorIndex` finds
the distinct colours on packed integer codes, a block of pixels at a time.

Files are read upright (the EXIF orientation tag is applied), 16-bit RGB(A) PNGs at their full
16 bits, and an image is refused with a clear message, before decoding, when it has more pixels
than ``max_pixels`` (by default Pillow's decompression-bomb threshold
``PIL.Image.MAX_IMAGE_PIXELS``, where Pillow itself only warns) or when decoding it would need
more memory than is available.
"""

from __future__ import annotations

import io
import os
import struct
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from .. import api
from .._validation import check_int, check_rng, describe, refuse_masked, user_stacklevel
from .outputs import atomic_write_with

#: Pillow modes that hold 16-bit (or wider) integers, which ``Image.convert("RGB")`` would clip
#: to 255; they are scaled by hand instead.
_WIDE_INTEGER_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I")

#: Integer quantisations recognised by :func:`distinct_colors` (levels per channel): 8-bit
#: images scaled by 255 (this module), by 256 (POT's colour example), and 16-bit images.
_QUANTISATION_LEVELS = (255, 256, 65535)

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

#: EXIF tag number of the orientation (1 = upright, 2-8 = flips and quarter turns).
_EXIF_ORIENTATION = 0x0112

#: Pixels per block in the passes over a whole image (codes of 4 Mpx: 16-32 MB).
PIXEL_CHUNK = 1 << 22

#: Fraction of the available memory a single image operation may plan to use.
MEMORY_FRACTION = 0.8

PathLike = str | os.PathLike

#: Pillow modes with an alpha channel (``P`` and others may have one as ``transparency``).
_ALPHA_MODES = ("RGBA", "RGBa", "LA", "La", "PA")

#: ``max_pixels`` default: Pillow's ``Image.MAX_IMAGE_PIXELS``, read at each call.
PILLOW_LIMIT = "pillow"

# Serialises the moments this module switches Pillow's own bomb check off (see _open).
_PILLOW_CHECK_LOCK = threading.Lock()


def load_image(
    image: Any,
    *,
    name: str = "image",
    dtype: Any = np.float64,
    max_pixels: int | str | None = PILLOW_LIMIT,
) -> np.ndarray:
    """Read an image as float RGB(A) in ``[0, 1]`` (or as its stored integers, ``dtype=None``).

    Parameters
    ----------
    image : str, os.PathLike or array-like
        A file Pillow can read (any mode: RGB, RGBA, greyscale ``L`` and ``1``, palette ``P``,
        16-bit greyscale ``I;16``, 32-bit integer ``I``, float ``F``, CMYK, YCbCr, 16-bit RGB
        and RGBA PNG, ...), or an array of shape ``(H, W)``, ``(H, W, 1)``, ``(H, W, 3)`` or
        ``(H, W, 4)`` with dtype uint8 (divided by 255), uint16 (divided by 65535), or float
        with values in ``[0, 1]``. Files are turned upright by their EXIF orientation tag.
    name : str, default="image"
        How the argument is called in error messages (``"source"``, ``"target"``, ...).
    dtype : numpy.float64 or None, default=numpy.float64
        ``float64``: values in ``[0, 1]`` (24 bytes per pixel). ``None``: the values as stored,
        uint8 for 8-bit data, uint16 for 16-bit data (3 or 6 bytes per pixel), float64 in
        ``[0, 1]`` for float data; what full-resolution processing in bounded memory uses.
    max_pixels : int, None or 'pillow', default='pillow'
        Files with more pixels (width x height) are refused before decoding. ``'pillow'``:
        Pillow's decompression-bomb threshold ``PIL.Image.MAX_IMAGE_PIXELS`` (89,478,485
        unless changed), above which Pillow only warns and keeps going up to twice that;
        ``None`` or ``0``: no limit. Arrays are not limited (they are decoded already).

    Returns
    -------
    ndarray, shape (H, W, 3) or (H, W, 4)
        Greyscale is replicated on the three colour channels. An alpha channel (RGBA, LA,
        palette or greyscale with transparency, ``(H, W, 4)`` arrays) is kept as the fourth
        channel, in the same scale as the colours.

    Raises
    ------
    FileNotFoundError
        The path does not exist.
    ValueError
        The file is not an image Pillow can read, it has more pixels than ``max_pixels``,
        the image has zero pixels, or float values lie outside ``[0, 1]``.
    MemoryError
        Decoding the file would need more memory than is available (estimated before
        decoding, see :func:`available_memory`).
    TypeError
        The argument is neither a path nor a numeric array.

    Warns
    -----
    UserWarning
        A 16-bit file that Pillow can only give at 8 bits (other than RGB/RGBA PNG).
    """
    if dtype is not None and np.dtype(dtype) != np.float64:
        raise ValueError(f"dtype must be numpy.float64 or None; got {describe(dtype)}")
    limit = _pixel_limit(max_pixels)
    if isinstance(image, (str, os.PathLike)):
        stored = _load_file(Path(image), name, float_output=dtype is not None, limit=limit)
    elif isinstance(image, Image.Image):
        stored = _from_pillow(image, name, f"{name} (a PIL image)")
    else:
        stored = _from_array(image, name)
    return stored if dtype is None else as_float(stored)


def as_float(image: np.ndarray) -> np.ndarray:
    """Stored values (uint8, uint16 or float in ``[0, 1]``) as float64 in ``[0, 1]``."""
    image = np.asarray(image)
    if image.dtype.kind == "f":
        return image.astype(np.float64, copy=False)
    scaled = image.astype(np.float64)
    scaled /= _levels(image.dtype)
    return scaled


def available_memory() -> int | None:
    """Bytes of memory this process can still allocate, or ``None`` when unknown.

    ``MemAvailable`` of ``/proc/meminfo`` (Linux), lowered to the room left under a cgroup v2
    memory limit when there is one (containers); elsewhere free physical pages from
    ``os.sysconf``; ``None`` when neither can be read.
    """
    found: list[int] = []
    try:
        with open("/proc/meminfo") as stream:
            for line in stream:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            found.append(max(int(limit) - used, 0))
    except (OSError, ValueError):
        pass
    if not found:
        try:
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (AttributeError, ValueError, OSError):
            return None
    return min(found)


def check_memory(needed: int, what: str) -> None:
    """Raise ``MemoryError`` when ``needed`` bytes exceed what may be used of the available memory.

    Parameters
    ----------
    needed : int
        Estimated bytes of the allocations about to be made.
    what : str
        What needs them, for the message (``"source 'photo.png' (9000 x 9000 pixels)"``).
    """
    available = available_memory()
    if available is not None and needed > MEMORY_FRACTION * available:
        raise MemoryError(
            f"{what} needs about {_gigabytes(needed)} of memory and only "
            f"{_gigabytes(available)} is available; use a smaller image or free memory"
        )


def image_pixels(image: np.ndarray) -> np.ndarray:
    """The ``(H * W, 3)`` colours of an ``(H, W, 3)`` or ``(H, W, 4)`` image, every pixel (a
    view of an RGB image, a copy of the colour channels of an RGBA one).

    Parameters
    ----------
    image : array-like, shape (H, W, 3) or (H, W, 4)
        Any dtype; the values are not changed.

    Returns
    -------
    ndarray, shape (H * W, 3)
        The RGB rows in row-major pixel order (alpha dropped).

    Examples
    --------
    >>> import numpy as np
    >>> from sketchot.color import image_pixels
    >>> image_pixels(np.zeros((2, 3, 4))).shape
    (6, 3)
    """
    return np.asarray(image)[..., :3].reshape(-1, 3)


def image_alpha(image: np.ndarray) -> np.ndarray | None:
    """The ``(H * W,)`` alpha values of an ``(H, W, 4)`` image, ``None`` without alpha.

    Parameters
    ----------
    image : array-like, shape (H, W, 3) or (H, W, 4)

    Returns
    -------
    ndarray, shape (H * W,), or None
        The alpha channel in the pixel order of :func:`image_pixels`; ``None`` for an RGB
        image.
    """
    image = np.asarray(image)
    return image[..., 3].reshape(-1) if image.shape[-1] == 4 else None


def visible_pixels(image: np.ndarray) -> np.ndarray:
    """The ``(k, 3)`` colours of the pixels that are not fully transparent (alpha > 0): all
    of them, as :func:`image_pixels`, for an image without alpha.

    Parameters
    ----------
    image : array-like, shape (H, W, 3) or (H, W, 4)

    Returns
    -------
    ndarray, shape (k, 3)
        The colours that colour transfer samples from (``k = H * W`` without alpha).
    """
    alpha = image_alpha(image)
    pixels = image_pixels(image)
    return pixels if alpha is None else pixels[alpha > 0]


def load_image_pair(
    directory: PathLike, name: str, *, dtype: Any = np.float64
) -> tuple[np.ndarray, np.ndarray]:
    """Read the pair ``{name}_source.png``, ``{name}_target.png`` of ``directory``.

    The layout of the repository's ``images/`` folder (pairs ``default``, ``pair2``, ``pair3``,
    drawn by ``images/make_images.py``).

    Parameters
    ----------
    directory : str or os.PathLike
        Folder holding the two files.
    name : str
        Name of the pair: the part of the file names before ``_source`` and ``_target``.
    dtype : numpy.float64 or None, default=numpy.float64
        As in :func:`load_image`.

    Returns
    -------
    (source, target) : tuple of ndarray, shape (H, W, 3)

    Raises
    ------
    FileNotFoundError
        One or both files are missing; the message names every missing file.
    """
    paths = [Path(directory) / f"{name}_{side}.png" for side in ("source", "target")]
    missing = [str(path) for path in paths if not path.exists()]
    if missing:
        raise FileNotFoundError(f"missing image(s) {', '.join(missing)}")
    source, target = (load_image(path, name=path.stem, dtype=dtype) for path in paths)
    return source, target


def color_spread(source: Any, target: Any) -> dict[str, float]:
    """Scale of two colour clouds, the numbers to compare with ``reg``.

    Parameters
    ----------
    source, target : array-like, shape (H, W, 3), (H, W, 4) or (N, 3)
        Images or point clouds (every pixel that is not fully transparent is used).

    Returns
    -------
    dict
        ``mean_sq_distance``: ``E ||x - y||^2`` over independent source and target pixels;
        ``half_width``: ``max ||x - c|| max ||y - c||`` with ``c`` the mean of both clouds,
        which over ``reg`` is the half-width of the interval on which the ``polyts`` sketch
        fits ``exp(2 t)``.
    """
    source, target = (visible_pixels(image) for image in (source, target))
    mean_x, mean_y = source.mean(axis=0), target.mean(axis=0)
    center = (source.sum(axis=0) + target.sum(axis=0)) / (len(source) + len(target))
    return {
        "mean_sq_distance": float(
            source.var(axis=0).sum() + target.var(axis=0).sum() + np.sum((mean_x - mean_y) ** 2)
        ),
        "half_width": float(
            np.sqrt(np.max(np.sum((source - center) ** 2, axis=1)))
            * np.sqrt(np.max(np.sum((target - center) ** 2, axis=1)))
        ),
    }


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
        Number of pixels the sample was drawn from: those of the image that are not fully
        transparent.
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
    image : array-like, shape (H, W, 3) or (H, W, 4), or anything :func:`load_image` accepts
        Fully transparent pixels (alpha 0) are left out: their colour is not part of the
        picture. Partly transparent pixels count as much as opaque ones. A Dask array is
        sampled on the workers (the same draw as the same image in memory; only the
        sample, or for ``weighted=True`` the image's distinct colours and their counts,
        come to the client; ``weighted=True`` for uint8 and uint16 images).
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
    n_samples = check_int(n_samples, "n_samples", minimum=1)
    if not isinstance(replace, (bool, np.bool_)):
        raise TypeError(f"replace must be True or False; got {describe(replace)}")
    if not isinstance(weighted, (bool, np.bool_)):
        raise TypeError(f"weighted must be True or False; got {describe(weighted)}")
    generator = check_rng(rng)
    on_dask = api.on_dask(image)
    if on_dask:  # counted on the workers; the drawn rows gathered (the in-memory draw)
        if weighted and np.dtype(image.dtype).kind != "u":
            raise NotImplementedError(
                f"weighted=True is not available for a Dask {name} of {image.dtype} values: "
                "its distinct colours are counted on the workers for 8- and 16-bit images "
                "only (floats would need a sort of every pixel); sample pixels uniformly "
                "(weighted=False), or store the image as uint8 or uint16"
            )
        pixels = api.visible_pixels_dask(image, name=name)
    else:
        image = load_image(image, name=name, dtype=None)  # stored values: the sample is float
        pixels = visible_pixels(image)
    n_pixels = pixels.shape[0]
    if n_pixels == 0:
        raise ValueError(
            f"every pixel of {name} is fully transparent (alpha 0): it has no colours to sample"
        )
    which = "non-transparent pixels" if image.shape[-1] == 4 else "pixels"

    if weighted:
        if replace:
            raise ValueError(
                "replace=True cannot be combined with weighted=True: distinct colours are "
                "weighted by their pixel counts, so drawing one twice would count it twice"
            )
        if on_dask:  # each chunk's colours counted on its worker, the counts merged
            table = ColorIndex(*pixels.distinct_counts(pack_colors), pixels.dtype)
            colors, counts = table.colors(), table.counts.astype(np.float64)
        elif pixels.dtype.kind == "u":
            table = ColorIndex.build(pixels, counts=True)
            colors, counts = table.colors(), table.counts.astype(np.float64)
        else:
            colors, inverse = distinct_colors(pixels, exhaustive=True)
            counts = np.bincount(inverse, minlength=colors.shape[0]).astype(np.float64)
        if colors.shape[0] > n_samples:
            chosen = np.sort(generator.choice(colors.shape[0], size=n_samples, replace=False))
            colors, counts = colors[chosen], counts[chosen]
        return PixelSample(colors, counts / counts.sum(), n_pixels)

    if not replace and n_samples > n_pixels:
        raise ValueError(
            f"n_samples ({n_samples}) is larger than the number of {which} of {name} "
            f"({n_pixels}) and sampling is without replacement; lower n_samples or sample "
            "with replacement (replace=True, --replace)"
        )
    index = generator.choice(n_pixels, size=n_samples, replace=bool(replace))
    stored = pixels[index]
    if on_dask:  # the sample's values checked as an image's are (dtype, range)
        stored = load_image(stored[None], name=name, dtype=None)[0]
    colors = as_float(stored)
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


class ColorIndex:
    """The distinct colours of an integer image, found in bounded memory.

    Each pixel's colour is packed into one integer code (24 bits for uint8 data, 48 bits for
    uint16), a block of :data:`PIXEL_CHUNK` pixels at a time, so that no float copy and no
    per-pixel index of the whole image is ever formed. 8-bit images use a table over all
    ``2^24`` codes (16 MB of flags and 64 MB of indices, or 128 MB of counts): ``O(N)``;
    16-bit images sort the codes of each block and merge them: ``O(N log N)``.

    Attributes
    ----------
    codes : ndarray of uint32 or uint64, shape (C,)
        Sorted distinct codes (the same order as sorting the colours by red, green, blue).
    counts : ndarray of int64, shape (C,), or None
        Pixels of each colour (``counts=True`` only).
    dtype : numpy.dtype
        uint8 or uint16, the image's.
    """

    def __init__(self, codes: np.ndarray, counts: np.ndarray | None, dtype: np.dtype) -> None:
        self.codes = codes
        self.counts = counts
        self.dtype = np.dtype(dtype)
        self._lookup: np.ndarray | None = None
        if self.dtype == np.uint8:
            # every pixel's index is one table look-up (int32: at most 2^24 colours)
            self._lookup = np.zeros(1 << 24, dtype=np.int32)
            self._lookup[codes] = np.arange(codes.shape[0], dtype=np.int32)

    @classmethod
    def build(
        cls, pixels: np.ndarray, *, counts: bool = False, chunk: int = PIXEL_CHUNK
    ) -> ColorIndex:
        """Index the colours of ``pixels`` (shape ``(N, 3)``, uint8 or uint16).

        Parameters
        ----------
        pixels : ndarray, shape (N, 3), uint8 or uint16
        counts : bool, default=False
            Also count the pixels of each colour.
        chunk : int
            Pixels per block.
        """
        if pixels.ndim != 2 or pixels.shape[1] != 3 or pixels.dtype not in (np.uint8, np.uint16):
            raise ValueError(
                f"pixels must be a uint8 or uint16 array of shape (N, 3); got {describe(pixels)}"
            )
        chunk = check_int(chunk, "chunk", minimum=1)
        if pixels.dtype == np.uint8:
            if counts:
                table = np.zeros(1 << 24, dtype=np.int64)
                for block in _blocks(pixels.shape[0], chunk):
                    table += np.bincount(pack_colors(pixels[block]), minlength=1 << 24)
                codes = np.flatnonzero(table).astype(np.uint32)
                return cls(codes, table[codes], pixels.dtype)
            present = np.zeros(1 << 24, dtype=bool)
            for block in _blocks(pixels.shape[0], chunk):
                present[pack_colors(pixels[block])] = True
            return cls(np.flatnonzero(present).astype(np.uint32), None, pixels.dtype)
        parts = [
            np.unique(pack_colors(pixels[block]), return_counts=counts)
            for block in _blocks(pixels.shape[0], chunk)
        ]
        if not counts:
            return cls(np.unique(np.concatenate(parts)), None, pixels.dtype)
        codes, inverse = np.unique(np.concatenate([c for c, _ in parts]), return_inverse=True)
        totals = np.bincount(inverse.reshape(-1), weights=np.concatenate([n for _, n in parts]))
        return cls(codes, totals.astype(np.int64), pixels.dtype)

    def __len__(self) -> int:
        return self.codes.shape[0]

    def colors(self, rows: slice = slice(None)) -> np.ndarray:
        """Distinct colours ``rows`` as float64 in ``[0, 1]``, shape ``(k, 3)``."""
        return as_float(unpack_colors(self.codes[rows], self.dtype))

    def index(self, pixels: np.ndarray) -> np.ndarray:
        """Position in :attr:`codes` of each pixel's colour (pixels of the indexed image)."""
        codes = pack_colors(pixels)
        if self._lookup is not None:
            return self._lookup[codes]
        return np.searchsorted(self.codes, codes)


def pack_colors(pixels: np.ndarray) -> np.ndarray:
    """One integer per uint8 (uint32 code) or uint16 (uint64 code) RGB row, ordered as the rows."""
    wide = np.uint32 if pixels.dtype == np.uint8 else np.uint64
    shift = wide(8 * pixels.dtype.itemsize)
    codes = pixels[:, 0].astype(wide)
    for channel in (1, 2):
        codes <<= shift
        codes |= pixels[:, channel]
    return codes


def unpack_colors(codes: np.ndarray, dtype: Any) -> np.ndarray:
    """Inverse of :func:`pack_colors`: ``(k, 3)`` rows of ``dtype`` (uint8 or uint16)."""
    dtype = np.dtype(dtype)
    bits = 8 * dtype.itemsize
    mask = codes.dtype.type((1 << bits) - 1)
    shifts = [codes.dtype.type(2 * bits), codes.dtype.type(bits), codes.dtype.type(0)]
    return np.stack([(codes >> shift) & mask for shift in shifts], axis=1).astype(dtype)


def save_image(image: Any, path: PathLike, *, name: str = "image") -> Path:
    """Write an RGB or RGBA image to a file, atomically.

    The format follows the file extension (any format Pillow writes RGB in: ``.png``, ``.jpg``,
    ``.tif``, ``.bmp``, ``.webp``, ...; an RGBA image needs one that holds an alpha channel,
    such as ``.png``, ``.tif`` or ``.webp``, and is refused otherwise). Values are rounded to
    8 bits. The data go to a
    temporary file in the destination folder first, which then replaces ``path`` in one
    ``os.replace``: an interrupted or failed write never leaves a partial file.

    Parameters
    ----------
    image : array-like, shape (H, W, 3) or (H, W, 4)
        Float values in ``[0, 1]``, uint8 (written as is) or uint16; a fourth channel is
        written as the alpha channel.
    path : str or os.PathLike
        Destination; its folder must exist.
    name : str
        Argument name for error messages.

    Returns
    -------
    pathlib.Path
        The written path.
    """
    path = Path(path)
    writer = image_writer(image, path, name=name)
    return atomic_write_with(path, writer)


def image_writer(image: Any, path: PathLike, *, name: str = "image"):
    """Check an image and its destination now; return ``writer(stream)`` that encodes it.

    For :meth:`~sketchot.color.outputs.OutputSet.write`: every error about the image or the
    format is raised here, before any file is touched.
    """
    pixels = as_uint8(load_image(image, name=name, dtype=None))
    image_format = _format_for(Path(path))
    mode = "RGBA" if pixels.shape[2] == 4 else "RGB"
    if mode == "RGBA":
        _check_alpha_format(image_format, Path(path), name)
    picture = Image.fromarray(pixels, mode=mode)
    return lambda stream: picture.save(stream, format=image_format)


# ------------------------------------------------------------------------------------ helpers
def _format_for(path: Path) -> str:
    extension = path.suffix.lower()
    formats = Image.registered_extensions()
    if extension not in formats:
        raise ValueError(
            f"cannot tell the image format of {str(path)!r} from its extension "
            f"{extension or '(none)'!r}; use .png, .jpg, .tif, .bmp or .webp"
        )
    return formats[extension]


def _check_alpha_format(image_format: str, path: Path, name: str) -> None:
    """Refuse now, before any file is touched, a format Pillow cannot write RGBA in."""
    probe = Image.new("RGBA", (1, 1))
    try:
        probe.save(io.BytesIO(), format=image_format)
    except (OSError, KeyError, ValueError):
        raise ValueError(
            f"{name} has an alpha channel, which Pillow cannot write as {image_format} "
            f"({str(path)!r}); write a .png, .tif or .webp file, or drop the alpha channel "
            "(image[..., :3])"
        ) from None


def _pixel_limit(max_pixels: Any) -> int | None:
    """``max_pixels`` as a number of pixels, or ``None`` for no limit."""
    if isinstance(max_pixels, str) and max_pixels == PILLOW_LIMIT:
        return Image.MAX_IMAGE_PIXELS or None  # what Pillow warns above, None if switched off
    if max_pixels is None:
        return None
    if isinstance(max_pixels, str):
        raise ValueError(f"max_pixels must be an integer, None or 'pillow'; got {max_pixels!r}")
    return check_int(max_pixels, "max_pixels", minimum=0) or None


def _open(path: Path) -> Image.Image:
    """``Image.open`` without Pillow's decompression-bomb warning and error: the caller applies
    its own limit, so that one threshold (``max_pixels``) governs, whatever Pillow's setting.

    Pillow reads the threshold from a module attribute; it is switched off only for the
    header read of ``Image.open`` (no pixel is decoded there), under a lock so concurrent
    loads in this module restore it in order.
    """
    with _PILLOW_CHECK_LOCK:
        saved = Image.MAX_IMAGE_PIXELS
        Image.MAX_IMAGE_PIXELS = None
        try:
            return Image.open(path)
        finally:
            Image.MAX_IMAGE_PIXELS = saved


def _load_file(path: Path, name: str, *, float_output: bool, limit: int | None) -> np.ndarray:
    if not path.exists():
        raise FileNotFoundError(f"{name}: file {str(path)!r} does not exist")
    if path.is_dir():
        raise ValueError(f"{name}: {str(path)!r} is a folder, not an image file")
    label = f"{name} {str(path)!r}"
    try:
        with _open(path) as picture:
            width, height = picture.size
            if limit is not None and width * height > limit:
                raise ValueError(
                    f"{name}: {str(path)!r} has {width} x {height} = {width * height} pixels, "
                    f"over the limit of {limit} pixels (max_pixels; by default Pillow's "
                    "decompression-bomb threshold PIL.Image.MAX_IMAGE_PIXELS); refusing to "
                    "decode it. To read it anyway pass max_pixels=None (--max-pixels 0 on the "
                    "command line)"
                )
            wide = _wide_rawmode(picture)
            _check_decode_memory(picture, label, wide is not None, float_output)
            high = _from_pillow(_upright(picture), name, label)
            if wide is None:
                return high
            # Pillow gives 16-bit RGB(A) PNGs as 8-bit RGB(A) (the high bytes); decoding the
            # same data again with the opposite byte order gives the low bytes
            with _open(path) as again:
                again.tile = [_with_rawmode(tile, wide) for tile in again.tile]
                low = _from_pillow(_upright(again), name, label)
            full = high.astype(np.uint16)
            full <<= 8
            full |= low
            return full
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


def _wide_rawmode(picture: Image.Image) -> str | None:
    """For a 16-bit RGB(A) PNG, the raw mode that decodes the low bytes; warn for others."""
    rawmodes = [tile[3] for tile in picture.tile if len(tile) > 3]
    rawmode = rawmodes[0] if rawmodes and isinstance(rawmodes[0], str) else ""
    if picture.format == "PNG" and rawmode in ("RGB;16B", "RGBA;16B"):
        return rawmode[:-1] + "L"
    if ";16" in rawmode and picture.mode not in _WIDE_INTEGER_MODES:
        warnings.warn(
            f"{picture.filename!r} holds 16-bit {picture.mode} data that Pillow reads at 8 bits "
            "per channel: precision was reduced to 8 bits",
            UserWarning,
            stacklevel=user_stacklevel(),
        )
    return None


def _with_rawmode(tile: Any, rawmode: str) -> Any:
    if hasattr(tile, "_replace"):
        return tile._replace(args=rawmode)
    return (tile[0], tile[1], tile[2], rawmode)


def _check_decode_memory(picture: Image.Image, label: str, wide: bool, float_output: bool) -> None:
    """Refuse before decoding an image whose decoding would not fit in the available memory."""
    width, height = picture.size
    # Pillow holds 4 bytes per pixel (twice for 16-bit RGB, decoded twice); a mode conversion
    # or an EXIF turn adds a second copy; numpy holds 3 (6) bytes, float64 24 more
    per_pixel = (16 if wide else 8) + (6 if wide else 3) + (24 if float_output else 0)
    check_memory(
        width * height * per_pixel,
        f"{label} ({width} x {height} pixels, {width * height / 1e6:.1f} Mpx)",
    )


def _upright(picture: Image.Image) -> Image.Image:
    """The decoded image turned as its EXIF orientation tag says (values 2-8)."""
    picture.load()
    if picture.getexif().get(_EXIF_ORIENTATION, 1) in range(2, 9):
        return ImageOps.exif_transpose(picture)
    return picture


def _png_size(path: Path) -> tuple[int, int] | None:
    """Width and height from a PNG header, which Pillow refuses to open when one is zero."""
    with path.open("rb") as stream:
        header = stream.read(24)
    if len(header) < 24 or not header.startswith(_PNG_SIGNATURE) or header[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", header[16:24])


def _from_pillow(picture: Image.Image, name: str, label: str) -> np.ndarray:
    """The stored values of a Pillow image: uint8 or uint16 RGB(A), or float64 in [0, 1]."""
    width, height = picture.size
    if width == 0 or height == 0:
        raise ValueError(f"{label} has zero pixels (width x height = {width} x {height})")
    if picture.mode in _WIDE_INTEGER_MODES:
        values = np.asarray(picture)
        low, high = int(values.min()), int(values.max())
        if low < 0 or high > 65535:
            raise ValueError(
                f"{label}: 32-bit integer image with values in [{low}, {high}]; only 0..65535 "
                "(16-bit) is supported"
            )
        return np.repeat(values.astype(np.uint16)[:, :, None], 3, axis=2)
    if picture.mode == "F":
        return _from_array(np.asarray(picture, dtype=np.float64), name)
    if picture.mode in _ALPHA_MODES or "transparency" in picture.info:
        return np.asarray(picture if picture.mode == "RGBA" else picture.convert("RGBA"))
    if picture.mode != "RGB":
        picture = picture.convert("RGB")
    return np.asarray(picture)


def _from_array(value: Any, name: str) -> np.ndarray:
    refuse_masked(
        value,
        name,
        "make the masked pixels fully transparent instead (a fourth, alpha channel that is 0 "
        "there: they are left out of the palette), or crop them out",
    )
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
    if array.shape[2] == 1:
        array = np.repeat(array, 3, axis=2)
    if array.dtype == np.bool_:
        return array.astype(np.uint8) * np.uint8(255)
    if array.dtype in (np.uint8, np.uint16):
        return array
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


def as_uint8(image: np.ndarray) -> np.ndarray:
    """Stored values (uint8, uint16 or float in ``[0, 1]``) rounded to uint8."""
    if image.dtype == np.uint8:
        return image
    if image.dtype == np.uint16:
        # round(v / 65535 * 255) for every v, without a float copy of the image
        return ((image.astype(np.uint32) * 255 + 32767) // 65535).astype(np.uint8)
    return np.round(np.clip(image, 0.0, 1.0) * 255.0).astype(np.uint8)


def _levels(dtype: np.dtype) -> float:
    """The value of white for integer data (255, 65535, or 1 for booleans)."""
    return {np.dtype(np.uint8): 255.0, np.dtype(np.uint16): 65535.0}.get(np.dtype(dtype), 1.0)


def _blocks(size: int, chunk: int) -> Iterator[slice]:
    for begin in range(0, size, chunk):
        yield slice(begin, min(begin + chunk, size))


def _gigabytes(n_bytes: float) -> str:
    return f"{n_bytes / 1e9:.1f} GB" if n_bytes >= 1e8 else f"{n_bytes / 1e6:.0f} MB"
