"""The preprocessing a HuggingFace image model was trained with, read from its folder's ``preprocessor_config.json``.

A transformers model folder (ViT, DeiT, ConvNeXt, Swin, BEiT, ...) ships its image processor's settings beside the
weights: resize, center crop, rescale and normalize. :func:`folder_pipeline` turns them into the ``preprocessing``
section of a compile config (the same ops a user writes by hand), so raw photos calibrate such a model as its own
processor would prepare them.

What is translated (the fields shared by the transformers image processors): ``do_resize`` with ``size`` as
``{"height", "width"}``, ``{"shortest_edge"}`` (short side, aspect kept) or one number (square); ``crop_pct`` with a
``shortest_edge`` below 384 (ConvNeXt: resize the short side to ``shortest_edge / crop_pct``, then crop
``shortest_edge``); ``do_center_crop`` with ``crop_size``; ``do_rescale`` / ``rescale_factor``; ``do_normalize`` with
``image_mean`` / ``image_std``. ``resample`` 0 is nearest, anything else bilinear (bicubic and Lanczos are read as
bilinear, and said so). Other settings (padding, ``size_divisor``, ``longest_edge``) are not translated: the folder's
processor is then not used, with the reason.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from compiler_core.calibration.specs import InputSpec

logger = logging.getLogger(__name__)

PROCESSOR_FILE = "preprocessor_config.json"
_NEAREST = 0
_BILINEAR = 2
_SMALL_CROP_EDGE = 384  # transformers' ConvNeXt: crop_pct applies below this shortest edge


def folder_pipeline(folder: str | Path) -> tuple[dict[str, Any], list[str]] | None:
    """The ``preprocessing`` section (camelCase, ``apply`` on) made from ``folder``'s image processor, and notes.

    Returns:
        ``(preprocessing, notes)``, or None when the folder has no image processor file or one this cannot
        translate (the reason is logged).
    """
    path = Path(folder) / PROCESSOR_FILE
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        logger.info("%s is unreadable (%s): its preprocessing is not used", path, error)
        return None
    if not isinstance(config, dict):
        return None
    try:
        return processor_pipeline(config)
    except ValueError as error:
        logger.info("%s: %s; its preprocessing is not used", path, error)
        return None


def model_folder_pipeline(folder: str | Path, specs: Sequence[InputSpec]) -> tuple[dict[str, Any] | None, list[str]]:
    """:func:`folder_pipeline` for a model with inputs ``specs``: used only for one image input, and only when the
    pipeline's output is that input's size (whatever the photo's size).

    Returns:
        ``(preprocessing or None, notes)``: a note says why a processor that exists is not used.
    """
    from compiler_core.calibration.preprocess import pipeline_output_size
    from compiler_core.config import CompileConfig

    if len(specs) != 1 or not specs[0].is_image or not Path(folder).is_dir():
        return None, []
    found = folder_pipeline(folder)
    if found is None:
        return None, []
    preprocessing, notes = found
    pipeline = CompileConfig.from_dict({"preprocessing": preprocessing}).preprocessing.pipeline
    height, width = specs[0].spatial_size
    if pipeline_output_size(pipeline, (height * 7 + 1, width * 5 + 3)) != (height, width):  # an odd photo size
        return None, [f"The folder's {PROCESSOR_FILE} prepares images at another size than the model input "
                      f"({height}x{width}): not used."]
    return preprocessing, notes


def processor_pipeline(config: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The ``preprocessing`` section for an image processor's settings (``preprocessor_config.json``), and notes.

    Raises:
        ValueError: a setting this cannot translate, or no image processor settings at all.
    """
    if not any(key in config for key in ("do_resize", "do_normalize", "image_mean", "size")):
        raise ValueError("no image processor settings")
    for unsupported in ("do_pad", "size_divisor", "size_divisibility"):
        if config.get(unsupported):
            raise ValueError(f"'{unsupported}' is not translated")
    notes: list[str] = []
    pipeline: list[dict[str, Any]] = [{"op": "colorConvert", "order": "RGB"}]
    if config.get("do_resize", True) and config.get("size") is not None:
        pipeline.extend(_resize_steps(config, notes))
    if config.get("do_center_crop") and config.get("crop_size") is not None:
        height, width = _box(config["crop_size"], "crop_size")
        pipeline.append({"op": "centerCrop", "height": height, "width": width})
    scale = float(config.get("rescale_factor", 1 / 255)) if config.get("do_rescale", True) else 1.0
    if config.get("do_normalize", True) and config.get("image_mean") is not None:
        mean, std = _channels(config["image_mean"]), _channels(config.get("image_std", [1.0]))
    else:
        mean, std = [0.0], [1.0]
    pipeline.append({"op": "normalize", "mean": mean, "std": std, "scale": scale})
    return {"apply": True, "pipeline": pipeline}, notes


def _resize_steps(config: dict[str, Any], notes: list[str]) -> list[dict[str, Any]]:
    size, resample = config["size"], config.get("resample", _BILINEAR)
    mode = "nearest" if resample == _NEAREST else "bilinear"
    if resample not in (_NEAREST, _BILINEAR):
        notes.append(f"The processor resizes with resample={resample} (bicubic or Lanczos); bilinear is used.")
    if isinstance(size, dict) and "shortest_edge" in size:
        if "longest_edge" in size:
            raise ValueError("'size.longest_edge' is not translated")
        edge = int(size["shortest_edge"])
        crop_pct = config.get("crop_pct")
        if crop_pct and edge < _SMALL_CROP_EDGE:  # transformers' ConvNeXt: resize up, then crop the edge
            return [{"op": "resize", "size": int(edge / float(crop_pct)), "keepAspect": True, "mode": mode},
                    {"op": "centerCrop", "height": edge, "width": edge}]
        return [{"op": "resize", "size": edge, "keepAspect": True, "mode": mode}]
    height, width = _box(size, "size")
    return [{"op": "resize", "height": height, "width": width, "mode": mode}]


def _box(value: Any, name: str) -> tuple[int, int]:
    """(height, width) of a ``{"height", "width"}`` dict or one number."""
    if isinstance(value, dict):
        if "height" in value and "width" in value:
            return int(value["height"]), int(value["width"])
        raise ValueError(f"'{name}' as {sorted(value)} is not translated")
    if isinstance(value, (int, float)):
        return int(value), int(value)
    raise ValueError(f"'{name}' as {value!r} is not translated")


def _channels(value: Any) -> list[float]:
    return [float(v) for v in value] if isinstance(value, (list, tuple)) else [float(value)]
