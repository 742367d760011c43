"""Draw the project's own example photographs: three pairs of scenes in clearly different palettes.

The colour-transfer examples need image pairs that ship with the project and may be redistributed
without conditions, so they are drawn here procedurally (sky gradients, sun or moon, layered hills,
water with reflections, trees, buildings, dunes) with multi-octave value noise for a photographic
texture. The output is deterministic: every random choice comes from one
``numpy.random.default_rng(seed)`` per image.

Pairs written next to this script::

    default_source.png  1200 x 800  warm sunset over hills and a lake
    default_target.png   960 x 640  cool daylight coast: blue sky, sea, green headland
    pair2_source.png     640 x 480  autumn forest (orange, red, brown)
    pair2_target.png     640 x 480  spring meadow (fresh greens, pale sky, flowers)
    pair3_source.png     640 x 480  night city (navy sky, stars, lit windows)
    pair3_target.png     640 x 480  desert at noon (ochre dunes, pale blue sky)

Usage::

    python images/make_images.py            # writes the six PNG files into images/
    python images/make_images.py --out DIR  # writes them into DIR instead
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from PIL import Image

Colour = Sequence[float]

# --------------------------------------------------------------------------------------------
# Building blocks. Images are float arrays (H, W, 3) in [0, 1]; masks are (H, W) in [0, 1].
# --------------------------------------------------------------------------------------------


def hex_rgb(code: str) -> np.ndarray:
    """Colour ``"#rrggbb"`` as a float RGB triple in [0, 1]."""
    code = code.lstrip("#")
    return np.array([int(code[i : i + 2], 16) / 255.0 for i in (0, 2, 4)])


def value_noise(
    shape: tuple[int, int],
    rng: np.random.Generator,
    cell: float,
    octaves: int = 4,
    stretch: float = 1.0,
) -> np.ndarray:
    """Fractal value noise in about [-1, 1]: random grids upsampled bilinearly, summed by octave.

    ``cell`` is the height in pixels of the coarsest grid cell and ``stretch * cell`` its width
    (stretch > 1 gives horizontal streaks, as on water); every octave halves the cell and the
    amplitude, which gives the 1/f look of natural texture at little cost (O(H W octaves)).
    """
    height, width = shape
    total = np.zeros(shape)
    amplitude, norm = 1.0, 0.0
    for _ in range(octaves):
        cell_x = max(cell * stretch, 1.0)
        grid_h = int(np.ceil(height / cell)) + 2
        grid_w = int(np.ceil(width / cell_x)) + 2
        grid = rng.uniform(-1.0, 1.0, size=(grid_h, grid_w))
        yy = np.arange(height) / cell
        xx = np.arange(width) / cell_x
        y0 = np.floor(yy).astype(int)
        x0 = np.floor(xx).astype(int)
        # smoothstep weights hide the grid lines that plain linear interpolation leaves
        ty = yy - y0
        tx = xx - x0
        ty = ty * ty * (3 - 2 * ty)
        tx = tx * tx * (3 - 2 * tx)
        top = grid[y0][:, x0] * (1 - tx) + grid[y0][:, x0 + 1] * tx
        bottom = grid[y0 + 1][:, x0] * (1 - tx) + grid[y0 + 1][:, x0 + 1] * tx
        total += amplitude * (top * (1 - ty)[:, None] + bottom * ty[:, None])
        norm += amplitude
        amplitude *= 0.5
        cell = max(cell / 2.0, 1.0)
    return total / norm


def ridge_line(width: int, rng: np.random.Generator, base: float, amplitude: float) -> np.ndarray:
    """Height profile (in rows) of a hill or dune crest: a sum of random sinusoids, 1/f spectrum."""
    x = np.linspace(0.0, 1.0, width)
    profile = np.zeros(width)
    for octave in range(1, 7):
        phase = rng.uniform(0, 2 * np.pi)
        frequency = octave * rng.uniform(0.8, 1.6)
        profile += np.sin(2 * np.pi * frequency * x + phase) / octave
    return base - amplitude * profile / 2.0


def vertical_gradient(shape: tuple[int, int], stops: Sequence[tuple[float, str]]) -> np.ndarray:
    """Image whose rows interpolate colour ``stops`` = [(position in [0, 1], "#rrggbb"), ...]."""
    height, width = shape
    positions = np.array([p for p, _ in stops])
    colours = np.array([hex_rgb(c) for _, c in stops])
    t = np.linspace(0.0, 1.0, height)
    rows = np.stack([np.interp(t, positions, colours[:, k]) for k in range(3)], axis=1)
    return np.broadcast_to(rows[:, None, :], (height, width, 3)).copy()


def blend(image: np.ndarray, colour: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Paint ``colour`` (a triple or an image) over ``image`` with opacity ``mask``."""
    mask = np.clip(mask, 0.0, 1.0)[..., None]
    return image * (1 - mask) + colour * mask


def soft_step(distance: np.ndarray, softness: float) -> np.ndarray:
    """1 inside (distance < 0), 0 outside, a ``softness``-pixel linear ramp (anti-aliasing)."""
    return np.clip(0.5 - distance / softness, 0.0, 1.0)


def below_ridge(shape: tuple[int, int], ridge: np.ndarray, softness: float = 1.5) -> np.ndarray:
    """Mask of the pixels under a ridge profile (rows grow downwards)."""
    rows = np.arange(shape[0])[:, None]
    return soft_step(ridge[None, :] - rows, softness)


def disc(shape: tuple[int, int], centre: tuple[float, float], radius: float) -> np.ndarray:
    """Anti-aliased disc mask; ``centre`` = (row, column)."""
    rows, cols = np.ogrid[: shape[0], : shape[1]]
    distance = np.hypot(rows - centre[0], cols - centre[1]) - radius
    return soft_step(distance, 1.5)


def glow(shape: tuple[int, int], centre: tuple[float, float], scale: float) -> np.ndarray:
    """Gaussian halo around ``centre`` with width ``scale`` pixels."""
    rows, cols = np.ogrid[: shape[0], : shape[1]]
    return np.exp(-((rows - centre[0]) ** 2 + (cols - centre[1]) ** 2) / (2 * scale**2))


def shade(image: np.ndarray, noise: np.ndarray, strength: float) -> np.ndarray:
    """Multiplicative brightness texture: ``image * (1 + strength * noise)``."""
    return image * (1 + strength * noise)[..., None]


def terrain_layer(
    image: np.ndarray,
    rng: np.random.Generator,
    ridge: np.ndarray,
    top: str,
    bottom: str,
    texture: float,
    cell: float,
) -> np.ndarray:
    """Paint a textured band of land under ``ridge``, shaded from ``top`` to ``bottom`` colour."""
    shape = image.shape[:2]
    mask = below_ridge(shape, ridge)
    # the gradient runs from the highest crest of the layer down to the bottom of the frame
    crest = np.clip(ridge.min(), 0, shape[0] - 1)
    rows = np.arange(shape[0])[:, None]
    t = np.clip((rows - crest) / max(shape[0] - crest, 1.0), 0.0, 1.0)
    colours = hex_rgb(top) * (1 - t[..., None]) + hex_rgb(bottom) * t[..., None]
    colours = shade(colours, value_noise(shape, rng, cell), texture)
    return blend(image, colours, mask)


def water_with_reflection(
    image: np.ndarray, rng: np.random.Generator, horizon: int, tint: str, ripple: float
) -> np.ndarray:
    """Replace everything under ``horizon`` by the mirrored scene, rippled and tinted."""
    height, width = image.shape[:2]
    depth = height - horizon
    source_rows = np.clip(2 * horizon - np.arange(horizon, height), 0, horizon - 1)
    # horizontal ripples: each water row samples a slightly shifted, slightly jittered sky row
    wobble = value_noise((depth, width), rng, cell=24.0, octaves=3)
    offsets = (ripple * wobble * np.linspace(0.3, 1.0, depth)[:, None]).astype(int)
    rows = np.clip(source_rows[:, None] + offsets, 0, horizon - 1)
    cols = np.clip(np.arange(width)[None, :] + offsets // 2, 0, width - 1)
    reflected = image[rows, cols]
    darken = np.linspace(0.85, 0.6, depth)[:, None, None]
    water = 0.7 * reflected * darken + 0.3 * hex_rgb(tint)
    streaks = value_noise((depth, width), rng, cell=3.0, octaves=2, stretch=12.0)
    water = shade(water, streaks, 0.12)
    result = image.copy()
    result[horizon:] = water
    return result


def conifer(image: np.ndarray, base: tuple[float, float], height: float, colour: np.ndarray):
    """Paint a fir tree (a stacked triangle silhouette) with its foot at ``base`` = (row, col)."""
    rows, cols = np.ogrid[: image.shape[0], : image.shape[1]]
    top = base[0] - height
    t = (rows - top) / height  # 0 at the tip, 1 at the foot
    # jagged half-width: three tiers, each widening downwards
    tier = (t * 3.0) % 1.0
    half_width = height * 0.22 * (0.35 + 0.65 * t) * (0.55 + 0.45 * tier)
    inside = (t >= 0) & (t <= 1)
    distance = np.abs(cols - base[1]) - half_width
    mask = np.where(inside, soft_step(distance, 1.5), 0.0)
    trunk = (t > 0.92) & (t <= 1.05) & (np.abs(cols - base[1]) < height * 0.03)
    image[:] = blend(image, colour, mask)
    image[:] = blend(image, colour * 0.5, trunk.astype(float))


def round_tree(
    image: np.ndarray,
    rng: np.random.Generator,
    base: tuple[float, float],
    size: float,
    palette: Sequence[str],
):
    """Paint a deciduous tree: a trunk and a canopy of overlapping discs from ``palette``."""
    rows, cols = np.ogrid[: image.shape[0], : image.shape[1]]
    trunk = (
        (rows > base[0] - size * 1.1) & (rows <= base[0]) & (np.abs(cols - base[1]) < size * 0.08)
    )
    image[:] = blend(image, hex_rgb("#3b2a1e"), trunk.astype(float))
    centre = (base[0] - size * 1.35, base[1])
    for _ in range(14):
        offset = rng.normal(0.0, size * 0.35, size=2)
        radius = size * rng.uniform(0.3, 0.55)
        colour = hex_rgb(palette[rng.integers(len(palette))]) * rng.uniform(0.8, 1.1)
        mask = disc(image.shape[:2], (centre[0] + offset[0], centre[1] + offset[1]), radius)
        image[:] = blend(image, colour, mask)


def add_grain(image: np.ndarray, rng: np.random.Generator, strength: float) -> np.ndarray:
    """Fine film grain, kept weak so that the PNG files stay small."""
    grain = value_noise(image.shape[:2], rng, cell=2.0, octaves=1)
    return shade(image, grain, strength)


# --------------------------------------------------------------------------------------------
# The six scenes
# --------------------------------------------------------------------------------------------


def sunset_lake(width: int, height: int, seed: int) -> np.ndarray:
    """Warm sunset: orange-magenta sky, low sun, purple hills, a lake reflecting the sky."""
    rng = np.random.default_rng(seed)
    shape = (height, width)
    horizon = int(height * 0.62)
    image = vertical_gradient(
        shape,
        [
            (0.0, "#2b1b4a"),
            (0.25, "#7a2f6b"),
            (0.45, "#e0654a"),
            (0.58, "#ffb35c"),
            (0.62, "#ffd98a"),
        ],
    )
    sun_centre = (horizon - height * 0.07, width * 0.62)
    image = blend(image, hex_rgb("#ffe9a8"), 0.8 * glow(shape, sun_centre, height * 0.12))
    image = blend(image, hex_rgb("#fff4d0"), disc(shape, sun_centre, height * 0.05))
    clouds = np.clip(value_noise(shape, rng, cell=160.0, octaves=5) * 2.2 - 0.35, 0.0, 1.0)
    band = np.exp(-(((np.arange(height) - height * 0.3) / (height * 0.12)) ** 2))[:, None]
    image = blend(image, hex_rgb("#c24a5a"), 0.7 * clouds * band)
    far = ridge_line(width, rng, base=horizon - height * 0.10, amplitude=height * 0.06)
    image = terrain_layer(image, rng, far, "#8a4a78", "#6b3a66", 0.08, 90.0)
    near = ridge_line(width, rng, base=horizon - height * 0.03, amplitude=height * 0.05)
    image = terrain_layer(image, rng, near, "#4a2446", "#3a1c3a", 0.12, 60.0)
    image = water_with_reflection(image, rng, horizon, "#3b2a55", ripple=10.0)
    shore = ridge_line(width, rng, base=height * 0.9, amplitude=height * 0.04)
    image = terrain_layer(image, rng, shore, "#3a2418", "#1e120c", 0.25, 30.0)
    for _ in range(9):
        col = rng.uniform(0, width)
        base_row = np.interp(col, np.arange(width), shore) + height * 0.02
        conifer(image, (base_row, col), rng.uniform(0.12, 0.22) * height, hex_rgb("#1a0e14"))
    return add_grain(image, rng, 0.015)


def daylight_coast(width: int, height: int, seed: int) -> np.ndarray:
    """Cool daylight: deep-to-pale blue sky, white clouds, turquoise sea, green headland."""
    rng = np.random.default_rng(seed)
    shape = (height, width)
    horizon = int(height * 0.5)
    image = vertical_gradient(shape, [(0.0, "#1f5fae"), (0.35, "#5d9ad8"), (0.5, "#bcdcf2")])
    clouds = np.clip(value_noise(shape, rng, cell=140.0, octaves=5) * 2.5 - 0.4, 0.0, 1.0)
    band = np.exp(-(((np.arange(height) - height * 0.22) / (height * 0.14)) ** 2))[:, None]
    image = blend(image, hex_rgb("#f4f8fc"), 0.9 * clouds * band)
    sea = vertical_gradient(shape, [(0.0, "#1a6f8f"), (0.5, "#1a6f8f"), (1.0, "#3fb3b5")])
    sea = shade(sea, value_noise(shape, rng, cell=12.0, octaves=3), 0.12)
    rows = np.arange(height)[:, None]
    image = blend(image, sea, soft_step(horizon - rows, 1.5) * np.ones((1, width)))
    # foam lines near the beach
    foam = np.clip(value_noise(shape, rng, cell=30.0, octaves=3) * 3.0 - 1.4, 0.0, 1.0)
    near_beach = np.clip((rows - height * 0.72) / (height * 0.1), 0.0, 1.0)
    image = blend(image, hex_rgb("#e8f6f4"), foam * near_beach)
    beach = ridge_line(width, rng, base=height * 0.86, amplitude=height * 0.03)
    image = terrain_layer(image, rng, beach, "#e6dcc0", "#cbbd98", 0.06, 40.0)
    # a headland on the left whose slope runs down into the sea and out of the frame
    s = np.linspace(0.0, 1.0, width) / 0.42
    headland = np.where(
        s < 1.0,
        horizon - height * 0.2 * (1.0 - s**2),
        horizon + (s - 1.0) * height * 1.5,
    )
    headland = headland + ridge_line(width, rng, base=0.0, amplitude=height * 0.02)
    image = terrain_layer(image, rng, headland, "#4f8a3a", "#2f5d2a", 0.2, 50.0)
    for _ in range(6):
        col = rng.uniform(0, width * 0.3)
        base_row = np.interp(col, np.arange(width), headland) + height * 0.03
        conifer(image, (base_row, col), rng.uniform(0.08, 0.14) * height, hex_rgb("#24502a"))
    return add_grain(image, rng, 0.015)


def autumn_forest(width: int, height: int, seed: int) -> np.ndarray:
    """Autumn forest: hazy warm sky, orange and red canopies, brown leaf-covered ground."""
    rng = np.random.default_rng(seed)
    shape = (height, width)
    image = vertical_gradient(shape, [(0.0, "#c9b79a"), (0.5, "#e8c99a"), (1.0, "#d9a066")])
    hills = ridge_line(width, rng, base=height * 0.5, amplitude=height * 0.08)
    image = terrain_layer(image, rng, hills, "#b5683a", "#8c4a2a", 0.18, 25.0)
    ground = ridge_line(width, rng, base=height * 0.72, amplitude=height * 0.03)
    image = terrain_layer(image, rng, ground, "#7a4a26", "#4a2c18", 0.3, 8.0)
    palette = ["#d2531f", "#e88a2a", "#b8321e", "#f2b33d", "#8f2a1a"]
    for _ in range(16):
        col = rng.uniform(0, width)
        base_row = rng.uniform(0.72, 0.98) * height
        round_tree(image, rng, (base_row, col), rng.uniform(0.1, 0.17) * height, palette)
    return add_grain(image, rng, 0.02)


def spring_meadow(width: int, height: int, seed: int) -> np.ndarray:
    """Spring meadow: pale blue sky, light green fields, fresh trees, scattered flowers."""
    rng = np.random.default_rng(seed)
    shape = (height, width)
    image = vertical_gradient(shape, [(0.0, "#7fb6e6"), (0.45, "#d6ecfa")])
    clouds = np.clip(value_noise(shape, rng, cell=120.0, octaves=4) * 2.4 - 0.5, 0.0, 1.0)
    image = blend(
        image, hex_rgb("#ffffff"), 0.8 * clouds * (np.arange(height) < height * 0.45)[:, None]
    )
    far = ridge_line(width, rng, base=height * 0.5, amplitude=height * 0.06)
    image = terrain_layer(image, rng, far, "#8cc06a", "#6aa84f", 0.1, 60.0)
    near = ridge_line(width, rng, base=height * 0.66, amplitude=height * 0.04)
    image = terrain_layer(image, rng, near, "#a6d66b", "#5f9e3a", 0.2, 10.0)
    for _ in range(500):
        row = rng.uniform(0.68, 1.0) * height
        col = rng.uniform(0, width)
        colour = hex_rgb(["#ffffff", "#f7e14a", "#f3a6c8", "#c9a0f0"][rng.integers(4)])
        radius = 1.0 + 2.5 * (row / height - 0.6)
        image = blend(image, colour, disc((height, width), (row, col), radius))
    palette = ["#6cbf3e", "#8fd14f", "#4f9e2c", "#b6e27a"]
    for _ in range(5):
        col = rng.uniform(0, width)
        base_row = rng.uniform(0.6, 0.75) * height
        round_tree(image, rng, (base_row, col), rng.uniform(0.08, 0.13) * height, palette)
    return add_grain(image, rng, 0.015)


def night_city(width: int, height: int, seed: int) -> np.ndarray:
    """Night city: navy sky with stars and a moon, dark towers with lit windows, a harbour."""
    rng = np.random.default_rng(seed)
    shape = (height, width)
    image = vertical_gradient(shape, [(0.0, "#05081c"), (0.55, "#13204a"), (0.7, "#2b3566")])
    stars = rng.random(shape) > 0.9985
    image = blend(image, hex_rgb("#e8ecff"), stars.astype(float) * rng.uniform(0.4, 1.0, shape))
    moon = (height * 0.15, width * 0.8)
    image = blend(image, hex_rgb("#9fb0e0"), 0.35 * glow(shape, moon, height * 0.07))
    image = blend(image, hex_rgb("#f1efe0"), disc(shape, moon, height * 0.035))
    horizon = int(height * 0.72)
    col = 0.0
    while col < width:
        building_w = rng.uniform(0.04, 0.09) * width
        top = horizon - rng.uniform(0.12, 0.5) * height
        tone = hex_rgb("#0c0f1e") * rng.uniform(0.8, 1.6)
        left, right = int(col), int(min(col + building_w, width))
        image[int(top) : horizon, left:right] = tone
        # windows: a grid, each lit with some probability, warm or cold light
        for wy in range(int(top) + 6, horizon - 6, 9):
            for wx in range(left + 4, right - 4, 8):
                if rng.random() < 0.45:
                    light = hex_rgb("#ffcf6b" if rng.random() < 0.7 else "#a8d8ff")
                    image[wy : wy + 4, wx : wx + 3] = light * rng.uniform(0.6, 1.0)
        col += building_w + rng.uniform(0.0, 0.01) * width
    image = water_with_reflection(image, rng, horizon, "#0a1030", ripple=14.0)
    return add_grain(image, rng, 0.03)


def desert_noon(width: int, height: int, seed: int) -> np.ndarray:
    """Desert at noon: pale washed-out sky, ochre and sienna dunes with hard shadows, a cactus."""
    rng = np.random.default_rng(seed)
    shape = (height, width)
    image = vertical_gradient(shape, [(0.0, "#6fa3d6"), (0.5, "#e7eef2")])
    image = blend(image, hex_rgb("#fffdf2"), 0.6 * glow(shape, (height * 0.08, width * 0.25), 60))
    layers = [
        (0.5, 0.05, "#e2b77a", "#d09a5a"),
        (0.62, 0.07, "#d89a52", "#b8743a"),
        (0.78, 0.08, "#e8b46a", "#c27a3a"),
    ]
    for base, amplitude, top, bottom in layers:
        ridge = ridge_line(width, rng, base=height * base, amplitude=height * amplitude)
        image = terrain_layer(image, rng, ridge, top, bottom, 0.06, 30.0)
        # the lee side of each crest lies in shadow: the steeper the ridge descends to the right,
        # the darker, fading with depth below the crest
        lee = np.clip(np.gradient(ridge) * 4.0, 0.0, 1.0)
        depth = np.arange(height)[:, None] - ridge[None, :]
        fade = np.where(depth > 0, np.exp(-np.maximum(depth, 0.0) / (height * 0.05)), 0.0)
        image = blend(image, hex_rgb("#7a4a2a"), 0.45 * lee[None, :] * fade)
    # ripples in the foreground sand
    rows, cols = np.mgrid[:height, :width]
    ripples = np.sin(cols * 0.05 + rows * 0.25 + 3 * value_noise(shape, rng, 80.0, 3))
    foreground = np.clip((rows - height * 0.8) / (height * 0.2), 0.0, 1.0)
    image = shade(image, ripples * foreground, 0.06)
    base = (height * 0.93, width * 0.75)
    stem = (np.abs(cols - base[1]) < 9) & (rows > base[0] - height * 0.3) & (rows < base[0])
    arm = (
        (np.abs(cols - base[1] - 24) < 7)
        & (rows > base[0] - height * 0.24)
        & (rows < base[0] - height * 0.12)
    )
    bar = (cols > base[1]) & (cols < base[1] + 30) & (np.abs(rows - base[0] + height * 0.12) < 6)
    image = blend(image, hex_rgb("#3f6b3a"), (stem | arm | bar).astype(float))
    return add_grain(image, rng, 0.015)


SCENES: dict[str, tuple[Callable[[int, int, int], np.ndarray], int, int, int]] = {
    # name: (drawing function, width, height, seed)
    "default_source": (sunset_lake, 1200, 800, 1),
    "default_target": (daylight_coast, 960, 640, 2),
    "pair2_source": (autumn_forest, 640, 480, 3),
    "pair2_target": (spring_meadow, 640, 480, 4),
    "pair3_source": (night_city, 640, 480, 5),
    "pair3_target": (desert_noon, 640, 480, 6),
}


def save_png(image: np.ndarray, path: Path) -> None:
    """Write a float image as an 8-bit PNG, atomically (temporary file, then rename)."""
    pixels = np.round(np.clip(image, 0.0, 1.0) * 255.0).astype(np.uint8)
    temporary = path.with_name(f".{path.name}.tmp")
    Image.fromarray(pixels, mode="RGB").save(temporary, format="PNG", optimize=True)
    os.replace(temporary, path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent, help="output folder"
    )
    args = parser.parse_args(argv)
    if not args.out.is_dir():
        parser.error(f"--out: folder {str(args.out)!r} does not exist")
    for name, (draw, width, height, seed) in SCENES.items():
        path = args.out / f"{name}.png"
        save_png(draw(width, height, seed), path)
        print(f"{path}  {width} x {height}  {path.stat().st_size / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
