"""The per-image formulas of the common corruptions (CIFAR-10-C), and their registry by name.

Each corruption maps a float64 image in [0, 1] of shape (H, W, C), a severity index 0..4, a
generator and a spatial scale (the reference's parameters are for 32×32 images) to a float
image, with the formulas and per-severity parameters of ``make_cifar_c.py`` in
``hendrycks/robustness`` (docs/corruptions.md lists them and every difference). Validation,
seeding, uint8 conversion and the cache are :mod:`fseb_ft.data.corruptions`.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable

import cv2
import numpy as np
import PIL.Image
from scipy import ndimage

from fseb_ft.recipe.options import BENCHMARK_CORRUPTIONS

__all__ = ["BENCHMARK", "CORRUPTIONS", "EXTRA"]

# (H, W, C) float64 in [0, 1], severity index 0..4, generator, spatial scale → float image.
_Corruption = Callable[[np.ndarray, int, np.random.Generator, float], np.ndarray]
_LUMA = np.array(
    [0.299, 0.587, 0.114]
)  # ITU-R BT.601, as fseb_ft.data.pixels and OpenCV's RGB2GRAY


def _gaussian_noise(x: np.ndarray, level: int, rng: np.random.Generator, s: float) -> np.ndarray:
    c = (0.04, 0.06, 0.08, 0.09, 0.10)[level]
    return x + c * rng.standard_normal(x.shape)


def _shot_noise(x: np.ndarray, level: int, rng: np.random.Generator, s: float) -> np.ndarray:
    c = (500, 250, 100, 75, 50)[level]
    return rng.poisson(x * c) / c


def _impulse_noise(x: np.ndarray, level: int, rng: np.random.Generator, s: float) -> np.ndarray:
    c = (0.01, 0.02, 0.03, 0.05, 0.07)[level]
    # skimage's random_noise(mode="s&p"): each value flips with probability c, half to 1, half
    # to 0. One uniform draw per value makes the flipped sets grow with the severity.
    flipped = rng.random(x.shape) < c
    salt = rng.random(x.shape) < 0.5
    return np.where(flipped, salt.astype(np.float64), x)


def _speckle_noise(x: np.ndarray, level: int, rng: np.random.Generator, s: float) -> np.ndarray:
    c = (0.06, 0.1, 0.12, 0.16, 0.2)[level]
    return x + x * c * rng.standard_normal(x.shape)


def _gaussian(
    x: np.ndarray, sigma: float, mode: str = "nearest", truncate: float = 4.0
) -> np.ndarray:
    """skimage.filters.gaussian over the two spatial axes (its defaults: nearest, truncate 4)."""
    sigmas = (sigma, sigma) + (0.0,) * (x.ndim - 2)
    return ndimage.gaussian_filter(x, sigmas, mode=mode, truncate=truncate)


def _gaussian_blur(x: np.ndarray, level: int, rng: np.random.Generator, s: float) -> np.ndarray:
    c = (0.4, 0.6, 0.7, 0.8, 1.0)[level]
    return _gaussian(x, c * s)


def _glass_blur(x: np.ndarray, level: int, rng: np.random.Generator, s: float) -> np.ndarray:
    sigma, delta, iterations = ((0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2),
                                (0.4, 1, 2))[level]  # fmt: skip
    sigma, delta = sigma * s, round(delta * s)
    height, width, channels = x.shape
    flat = _gaussian(x, sigma).reshape(height * width, channels)  # (H·W, C), a copy
    rows, cols = range(height - delta, delta, -1), range(width - delta, delta, -1)
    for _ in range(iterations):
        shifts = rng.integers(-delta, delta, size=(len(rows) * len(cols), 2)).tolist()
        k = 0
        for h in rows:
            for w in cols:
                dx, dy = shifts[k]
                k += 1
                flat[h * width + w] = flat[(h + dy) * width + w + dx]  # see note G
    return _gaussian(flat.reshape(x.shape), sigma)


def _disk(radius: float, alias_blur: float, s: float) -> np.ndarray:
    """The reference's anti-aliased disk kernel (17×17 for radii ≤ 8, Gaussian 3×3 at 32 px)."""
    half = max(8, math.ceil(radius))
    grid = np.arange(-half, half + 1)
    xx, yy = np.meshgrid(grid, grid)
    kernel = (xx**2 + yy**2 <= radius**2).astype(np.float32)
    kernel /= kernel.sum()
    ksize = 2 * max(1, round(s)) + 1
    return cv2.GaussianBlur(kernel, (ksize, ksize), sigmaX=alias_blur)


def _defocus_blur(x: np.ndarray, level: int, rng: np.random.Generator, s: float) -> np.ndarray:
    radius, alias_blur = ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1))[level]
    kernel = _disk(radius * s, alias_blur * s, s).astype(np.float64)
    return cv2.filter2D(x, -1, kernel).reshape(x.shape)  # per channel, reflect-101 border


def _motion_kernel(radius: float, sigma: float, angle: float) -> list[tuple[float, int, int]]:
    """ImageMagick's MotionBlurImage kernel: (weight, dx, dy) along a one-sided line."""
    width = 2 * math.ceil(radius) + 1
    weights = np.exp(-(np.arange(width) ** 2) / (2.0 * sigma**2))
    weights /= weights.sum()
    theta = math.radians(angle)
    return [
        (float(w), math.ceil(i * math.cos(theta) - 0.5), math.ceil(i * math.sin(theta) - 0.5))
        for i, w in enumerate(weights)
    ]


def _motion(x: np.ndarray, radius: float, sigma: float, angle: float) -> np.ndarray:
    """Motion-blur ``x`` (H, W, C): out(y, x) = Σ_i w_i · in(y + dy_i, x + dx_i), edges repeated."""
    kernel = _motion_kernel(radius, sigma, angle)
    pad = max(max(abs(dx), abs(dy)) for _, dx, dy in kernel)
    height, width = x.shape[:2]
    padded = np.pad(x, ((pad, pad), (pad, pad), (0, 0)), mode="edge")
    out = np.zeros_like(x)
    for w, dx, dy in kernel:
        out += w * padded[pad + dy : pad + dy + height, pad + dx : pad + dx + width]
    return out


def _motion_blur(x: np.ndarray, level: int, rng: np.random.Generator, s: float) -> np.ndarray:
    radius, sigma = ((6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5))[level]
    return _motion(x, radius * s, sigma * s, rng.uniform(-45, 45))


def _clipped_zoom(x: np.ndarray, factor: float) -> np.ndarray:
    """Zoom into the centre of ``x`` (H, W, C) by ``factor`` ≥ 1, keeping its size."""
    height, width = x.shape[:2]
    ch, cw = math.ceil(height / factor), math.ceil(width / factor)
    top, left = (height - ch) // 2, (width - cw) // 2
    zoomed = ndimage.zoom(x[top : top + ch, left : left + cw], (factor, factor, 1), order=1)
    trim_h, trim_w = (zoomed.shape[0] - height) // 2, (zoomed.shape[1] - width) // 2
    return zoomed[trim_h : trim_h + height, trim_w : trim_w + width]


def _zoom_blur(x: np.ndarray, level: int, rng: np.random.Generator, s: float) -> np.ndarray:
    top = (1.06, 1.11, 1.16, 1.21, 1.26)[level]
    factors = np.arange(1, top, 0.01)
    out = np.zeros_like(x)
    for factor in factors:
        out += _clipped_zoom(x, float(factor))
    return (x + out) / (len(factors) + 1)


def _snow(x: np.ndarray, level: int, rng: np.random.Generator, s: float) -> np.ndarray:
    loc, scale, zoom, threshold, radius, sigma, keep = (
        (0.1, 0.2, 1, 0.6, 8, 3, 0.95),
        (0.1, 0.2, 1, 0.5, 10, 4, 0.9),
        (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9),
        (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85),
        (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8),
    )[level]
    flakes = loc + scale * rng.standard_normal(x.shape[:2])  # (H, W)
    flakes = _clipped_zoom(flakes[..., None], zoom * s)  # (H, W, 1)
    flakes[flakes < threshold] = 0
    flakes = _motion(np.clip(flakes, 0, 1), radius * s, sigma * s, rng.uniform(-135, -45))
    gray = x if x.shape[2] == 1 else (x @ _LUMA)[..., None]  # (H, W, 1)
    x = keep * x + (1 - keep) * np.maximum(x, gray * 1.5 + 0.5)
    return x + flakes + np.rot90(flakes, k=2)


def _plasma_fractal(size: int, decay: float, rng: np.random.Generator) -> np.ndarray:
    """The reference's diamond-square height map, (size, size) in [0, 1]; size a power of 2."""
    grid = np.zeros((size, size))
    step = size
    wibble = 100.0

    def wibbled_mean(total: np.ndarray) -> np.ndarray:
        return total / 4 + wibble * wibble * rng.uniform(-1, 1, total.shape)

    while step >= 2:
        half = step // 2
        corners = grid[0:size:step, 0:size:step]
        squares = corners + np.roll(corners, shift=-1, axis=0)
        squares += np.roll(squares, shift=-1, axis=1)
        grid[half:size:step, half:size:step] = wibbled_mean(squares)
        centres = grid[half:size:step, half:size:step]
        corners = grid[0:size:step, 0:size:step]
        total = centres + np.roll(centres, 1, axis=0) + corners + np.roll(corners, -1, axis=1)
        grid[0:size:step, half:size:step] = wibbled_mean(total)
        total = centres + np.roll(centres, 1, axis=1) + corners + np.roll(corners, -1, axis=0)
        grid[half:size:step, 0:size:step] = wibbled_mean(total)
        step //= 2
        wibble /= decay
    grid -= grid.min()
    return grid / grid.max()


def _fog(x: np.ndarray, level: int, rng: np.random.Generator, s: float) -> np.ndarray:
    amount, decay = ((0.2, 3), (0.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75))[level]
    height, width = x.shape[:2]
    size = 2 ** math.ceil(math.log2(max(height, width, 2)))
    peak = x.max()
    fogged = x + amount * _plasma_fractal(size, decay, rng)[:height, :width, None]
    return fogged * peak / (peak + amount)


def _brightness(x: np.ndarray, level: int, rng: np.random.Generator, s: float) -> np.ndarray:
    c = (0.05, 0.1, 0.15, 0.2, 0.3)[level]
    # HSV value + c with hue and saturation kept: every channel scales by V'/V (black → grey).
    value = x.max(axis=-1, keepdims=True)  # (H, W, 1)
    brighter = np.clip(value + c, 0, 1)
    ratio = np.divide(brighter, value, out=np.zeros_like(value), where=value > 0)
    return np.where(value > 0, x * ratio, brighter)


def _contrast(x: np.ndarray, level: int, rng: np.random.Generator, s: float) -> np.ndarray:
    c = (0.75, 0.5, 0.4, 0.3, 0.15)[level]
    means = x.mean(axis=(0, 1), keepdims=True)  # (1, 1, C)
    return (x - means) * c + means


def _saturate(x: np.ndarray, level: int, rng: np.random.Generator, s: float) -> np.ndarray:
    scale, shift = ((0.3, 0), (0.1, 0), (1.5, 0), (2, 0.1), (2.5, 0.2))[level]
    rgb = np.repeat(x, 3, axis=2) if x.shape[2] == 1 else x
    # HSV saturation S → clip(S·scale + shift) with hue and value kept. A channel is
    # V·(1 − S·g) with g ∈ [0, 1] fixed by the hue; grey pixels have hue 0 (red), as skimage.
    value = rgb.max(axis=-1, keepdims=True)
    spread = value - rgb.min(axis=-1, keepdims=True)
    sat = np.divide(spread, value, out=np.zeros_like(value), where=value > 0)
    new_sat = np.clip(sat * scale + shift, 0, 1)
    grey_g = np.broadcast_to(np.array([0.0, 1.0, 1.0]), rgb.shape)
    g = np.divide(value - rgb, spread, out=grey_g.copy(), where=spread > 0)
    out = value * (1 - new_sat * g)
    return out if x.shape[2] == 3 else (out @ _LUMA)[..., None]


def _to_pil(x: np.ndarray) -> PIL.Image.Image:
    pixels = np.rint(np.clip(x, 0, 1) * 255).astype(np.uint8)
    return PIL.Image.fromarray(pixels[..., 0] if pixels.shape[2] == 1 else pixels)


def _from_pil(image: PIL.Image.Image, shape: tuple[int, ...]) -> np.ndarray:
    return np.asarray(image, dtype=np.float64).reshape(shape) / 255.0


def _pixelate(x: np.ndarray, level: int, rng: np.random.Generator, s: float) -> np.ndarray:
    c = (0.95, 0.9, 0.85, 0.75, 0.65)[level]
    height, width = x.shape[:2]
    small = (max(1, int(width * c)), max(1, int(height * c)))
    image = (
        _to_pil(x)
        .resize(small, PIL.Image.Resampling.BOX)
        .resize((width, height), PIL.Image.Resampling.BOX)
    )
    return _from_pil(image, x.shape)


def _jpeg_compression(x: np.ndarray, level: int, rng: np.random.Generator, s: float) -> np.ndarray:
    quality = (80, 65, 58, 50, 40)[level]
    buffer = io.BytesIO()
    _to_pil(x).save(buffer, "JPEG", quality=quality)
    with PIL.Image.open(buffer) as image:
        return _from_pil(image, x.shape)


def _elastic_transform(x: np.ndarray, level: int, rng: np.random.Generator, s: float) -> np.ndarray:
    height, width, channels = x.shape
    size = min(height, width)  # the reference's IMSIZE (32)
    alpha, sigma, jitter = (
        (0, 0, 0.08), (0.05, 0.2, 0.07), (0.08, 0.06, 0.06), (0.1, 0.04, 0.05), (0.1, 0.03, 0.03),
    )[level]  # fmt: skip
    alpha, sigma, jitter = alpha * size, sigma * size, jitter * size
    # Random affine: three points around the centre, each moved by up to `jitter` pixels.
    centre = np.array((height, width), np.float32) // 2
    third = size // 3
    src = np.array(
        [centre + third, [centre[0] + third, centre[1] - third], centre - third], np.float32
    )
    dst = src + rng.uniform(-jitter, jitter, size=src.shape).astype(np.float32)
    matrix = cv2.getAffineTransform(src, dst)
    warped = cv2.warpAffine(
        x.astype(np.float32), matrix, (width, height), borderMode=cv2.BORDER_REFLECT_101
    ).reshape(x.shape)
    # Smoothed random displacement field, then bilinear resampling.
    dx = _gaussian(rng.uniform(-1, 1, (height, width)), sigma, "reflect", 3) * alpha
    dy = _gaussian(rng.uniform(-1, 1, (height, width)), sigma, "reflect", 3) * alpha
    yy, xx = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
    coords = np.stack([yy + dy, xx + dx])  # (2, H, W)
    return np.stack(
        [
            ndimage.map_coordinates(warped[..., k], coords, order=1, mode="reflect")
            for k in range(channels)
        ],
        axis=-1,
    )


CORRUPTIONS: dict[str, _Corruption] = {
    "gaussian_noise": _gaussian_noise,
    "shot_noise": _shot_noise,
    "impulse_noise": _impulse_noise,
    "defocus_blur": _defocus_blur,
    "glass_blur": _glass_blur,
    "motion_blur": _motion_blur,
    "zoom_blur": _zoom_blur,
    "snow": _snow,
    "fog": _fog,
    "brightness": _brightness,
    "contrast": _contrast,
    "elastic_transform": _elastic_transform,
    "pixelate": _pixelate,
    "jpeg_compression": _jpeg_compression,
    "speckle_noise": _speckle_noise,
    "gaussian_blur": _gaussian_blur,
    "saturate": _saturate,
}
"""Every corruption by name, in the benchmark's order, then the extras."""

BENCHMARK = BENCHMARK_CORRUPTIONS
"""The corruptions ``all`` stands for: CIFAR-10-C's 15 less ``frost``."""
EXTRA = tuple(CORRUPTIONS)[14:]
"""The reference's extra corruptions implemented here (not part of ``all``)."""
