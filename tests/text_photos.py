"""Photos with text for text detectors: rendered sentences composited onto real photographs.

PP-OCR det is deployed on photos of text (signs, labels, screens), not only on clean pages. The corpus feeds it
rendered pages and scans; these samples put real English sentences (:func:`corpus.sentences`, disjoint
calibration / held-out docstring modules, the split's own DejaVu fonts) onto real photographs, the way a camera
sees text: on a sign plate or straight on the scene, tilted, at several sizes, sometimes in grey or from a
low-resolution capture upscaled to the model's input, then JPEG-compressed.

Each split reads its own photographs, so a held-out sample never shows a scene the calibration or the search
saw (:data:`PHOTO_SPLITS`: scikit-image / scikit-learn / matplotlib samples and photographs of the Debian
wallpaper packages ``mate-backgrounds`` and ``lomiri-wallpapers-16.04``, :data:`realdata.WALLPAPER_SOURCES`).
Every sample is a pure function of ``(split, index, size)``.
"""

from __future__ import annotations

import io
import logging
from functools import cache

import numpy as np
import realdata
from corpus import _font, _rgb, sentences

logger = logging.getLogger(__name__)

PHOTO_SPLITS: dict[str, tuple[str, ...]] = {
    "calib": ("astronaut", "motorcycle_left", "china", "camera", "lomiri_Bridge", "lomiri_Wine", "mate_Garden",
              "mate_Wood"),
    "search": ("rocket", "lomiri_friends", "mate_Blinds", "lomiri_greentock"),
    "eval": ("chelsea", "flower", "lomiri_sunset", "mate_RainDrops", "lomiri_picosdeeuropa", "grace_hopper"),
}
"""The photographs of each split (names of :data:`realdata.CALIB_SOURCES`, :data:`realdata.EVAL_SOURCES` and
:data:`realdata.WALLPAPER_SOURCES`); no photograph is in two splits. ``search`` is the calibration-split part
that automatic mixed precision judges its target on."""

FONT_SPLIT = {"calib": "calib", "search": "calib", "eval": "eval"}
"""Which fonts and sentences a split renders (the search split is part of the calibration split)."""


def _sources() -> dict:
    return {**realdata.CALIB_SOURCES, **realdata.EVAL_SOURCES, **realdata.WALLPAPER_SOURCES}


@cache
def _photo(name: str) -> np.ndarray:
    return _rgb(_sources()[name]())


def distinct_photos(split: str) -> int:
    """How many distinct photographs the split's samples come from."""
    return len(PHOTO_SPLITS[split])


def text_photo(split: str, index: int, width: int, height: int) -> np.ndarray:
    """Sample ``index`` of ``split`` (``calib``, ``search``, ``eval``): an RGB uint8 ``height x width`` photo
    with text (photograph ``index mod n`` of the split, a different window, layout and capture per index)."""
    from PIL import Image

    names = PHOTO_SPLITS[split]
    rng = np.random.default_rng([hash_split(split), index])
    photo = _photo(names[index % len(names)])
    scale = (1.0, 0.75, 0.55)[index // len(names) % 3]
    corner = ("centre", "top_left", "bottom_right", "top_right", "bottom_left")[(index // len(names)) % 5]
    window = realdata.crop_view(photo, scale, corner, False)
    scene = Image.fromarray(window).resize((width, height), Image.Resampling.BILINEAR)
    scene = _draw_text(scene, split, index, rng)
    return _capture(scene, index, rng)


def hash_split(split: str) -> int:
    """A stable seed per split name."""
    return sum(ord(char) * 31 ** position for position, char in enumerate(split)) % (2 ** 31)


def _draw_text(scene, split: str, index: int, rng: np.random.Generator):
    """Two to four blocks of sentence fragments: on a sign plate (even blocks) or straight on the scene with a
    thin outline (odd ones), each at its own size and tilt."""
    from PIL import Image, ImageDraw

    width, height = scene.size
    pool = sentences(FONT_SPLIT[split], 32)
    scene = scene.convert("RGBA")
    for block in range(int(rng.integers(2, 5))):
        size = int(rng.integers(max(12, height // 40), max(14, height // 9)))
        font = _font(FONT_SPLIT[split], index + block, size)
        words = pool[(index * 4 + block) % len(pool)].split()
        lines = [" ".join(words[i:i + 4]) for i in range(0, min(len(words), 4 * int(rng.integers(1, 4))), 4)]
        boxes = [font.getbbox(line) for line in lines]
        text_w = max(box[2] - box[0] for box in boxes) + 2 * size // 2
        text_h = int(len(lines) * size * 1.35) + size // 2
        layer = Image.new("RGBA", (text_w, text_h), (0, 0, 0, 0))
        draw = ImageDraw.Draw(layer)
        dark_ink = bool(rng.integers(0, 2))
        ink = tuple(int(v) for v in (rng.integers(0, 70, 3) if dark_ink else rng.integers(190, 256, 3)))
        on_plate = block % 2 == 0
        if on_plate:
            plate = tuple(int(v) for v in (rng.integers(185, 256, 3) if dark_ink else rng.integers(0, 80, 3)))
            draw.rounded_rectangle((0, 0, text_w - 1, text_h - 1), radius=size // 4,
                                   fill=(*plate, int(rng.integers(200, 256))))
        outline = (255, 255, 255) if dark_ink else (0, 0, 0)
        for row, line in enumerate(lines):
            position = (size // 2 - boxes[row][0], size // 4 + int(row * size * 1.35) - boxes[row][1])
            draw.text(position, line, font=font, fill=(*ink, 255),
                      stroke_width=0 if on_plate else max(1, size // 14), stroke_fill=(*outline, 255))
        layer = layer.rotate(float(rng.uniform(-12, 12)), resample=Image.Resampling.BICUBIC, expand=True)
        if layer.width >= width or layer.height >= height:
            layer.thumbnail((width * 9 // 10, height * 9 // 10))
        left = int(rng.integers(0, width - layer.width + 1))
        top = int(rng.integers(0, height - layer.height + 1))
        scene.alpha_composite(layer, (left, top))
    return scene.convert("RGB")


def _capture(scene, index: int, rng: np.random.Generator) -> np.ndarray:
    """How a camera delivers the scene: every third sample grey, every other one captured at a lower resolution
    and upscaled, a little blur and sensor noise, JPEG at quality 60-90."""
    from PIL import Image, ImageFilter

    width, height = scene.size
    if index % 3 == 1:
        scene = scene.convert("L").convert("RGB")
    if index % 2 == 1:
        factor = float(rng.uniform(0.3, 0.6))
        small = scene.resize((max(1, round(width * factor)), max(1, round(height * factor))),
                             Image.Resampling.BILINEAR)
        scene = small.resize((width, height), Image.Resampling.BICUBIC)
    scene = scene.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.0, 1.2))))
    pixels = np.asarray(scene, np.float32) + rng.normal(0.0, float(rng.uniform(1.0, 5.0)), (height, width, 1))
    buffer = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buffer, "JPEG", quality=int(rng.integers(60, 91)))
    with Image.open(buffer) as decoded:
        return np.asarray(decoded.convert("RGB"))
