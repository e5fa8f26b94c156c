"""Settings that depend on the model: re-derived when the model changes, and checked before a compile.

A project's image channels, preprocessing sizes and calibration data were chosen for one model.
When another model replaces it, :func:`fit_to_model` puts back what no longer fits and says what it
changed, so nothing chosen for the old model silently breaks (or skews) the new one.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from compiler_core.calibration import InputSpec
    from qbstudio.state.project import CalibrationSource
    from qbstudio.state.settings import CompileSettings

logger = logging.getLogger(__name__)

MIN_CALIBRATION_SAMPLES = 4
"""``compiler_core.quantization.run.MIN_CALIBRATION_SAMPLES`` (that module pulls in onnxruntime, too slow to
import on the GUI thread); ``tests/test_state.py`` checks that the two agree."""


def _signature(specs: Sequence[InputSpec]) -> list[tuple[str, tuple[int, ...], str]]:
    return [(spec.name, tuple(spec.shape), spec.dtype.name) for spec in specs]


def same_inputs(first: Sequence[InputSpec], second: Sequence[InputSpec]) -> bool:
    """Whether two models take the same inputs (names, shapes and types)."""
    return _signature(first) == _signature(second)


CALIBRATION_NOTE = "Calibration data "
"""How the notes about the calibration source begin (stale once the user picks another source)."""


def fit_to_model(settings: CompileSettings, calibration: CalibrationSource, specs: Sequence[InputSpec],
                 previous: Sequence[InputSpec] | None, source: str | None = None) -> list[str]:
    """Re-derive the model-dependent settings for a model with inputs ``specs``.

    Args:
        settings: The project's settings (edited in place).
        calibration: The project's calibration source (edited in place).
        specs: The new model's inputs.
        previous: The replaced model's inputs (None: no model before).
        source: The model just imported (None for a project reopened as it was): a transformers folder's own
            image processor becomes the preprocessing when none is set.

    Returns:
        One sentence per change, for the user; empty when everything still fits.
    """
    notes = _fit_image_channels(settings, specs)
    if previous is not None and not same_inputs(previous, specs):
        notes += _fit_preprocessing(settings, specs, previous)
        if calibration.path and _raw_images_fit(calibration.path, specs, previous):
            notes.append(f"{CALIBRATION_NOTE}kept: '{calibration.path}' holds raw images, which the preprocessing "
                         f"pipeline fits to this model's input (check it in the Calibration tab).")
        elif calibration.path:
            notes.append(f"{CALIBRATION_NOTE}cleared: '{calibration.path}' was chosen for the previous model's "
                         f"inputs.")
            calibration.path = None
    if source is not None:
        notes += _fit_folder_processor(settings, specs, source)
    if source is not None and previous is not None:
        notes += _fit_layer_choices(settings)
    for note in notes:
        logger.info("model changed: %s", note)
    return notes


LAYER_LISTS = {"cpuLayers.head": "CPU head", "cpuLayers.tail": "CPU tail",
               "bit.layerOverrides.activation16Bits": "int16 activations", "bit.layerOverrides.weight16Bits":
               "int16 weights", "bit.layerOverrides.weight8Bits": "int8 weights",
               "bit.layerOverrides.weight4Bits": "int4 weights"}
"""The settings that name layers: the node menu, mixed precision and the sensitivity table add exact names."""


def _named_layer(entry: str) -> bool:
    """An exact layer name (``Conv_12``), as against a pattern (``*Softmax*``: a preset's, fitting any model)."""
    return not any(char in entry for char in "*?")


def _fit_layer_choices(settings: CompileSettings) -> list[str]:
    """Layers chosen by name for the replaced model (CPU layers, int16 layers, per-layer calibration): the new
    model's nodes have other names, or the same generic ones (``Conv_3``) for other layers, so they are dropped;
    patterns stay."""
    notes = []
    for path, label in LAYER_LISTS.items():
        entries = list(settings.get(path) or [])
        dropped = [entry for entry in entries if _named_layer(entry)]
        if dropped:
            settings.set(path, [entry for entry in entries if entry not in dropped])
            notes.append(f"{label} cleared: {', '.join(dropped)} named the previous model's layers.")
    overrides = dict(settings.get("calibration.layerOverrides") or {})
    dropped = [name for name in overrides if _named_layer(name)]
    if dropped:
        settings.set("calibration.layerOverrides", {name: value for name, value in overrides.items()
                                                    if name not in dropped})
        notes.append(f"Per-layer calibration cleared: {', '.join(dropped)} named the previous model's layers.")
    return notes


def _raw_images_fit(path: str, specs: Sequence[InputSpec], previous: Sequence[InputSpec]) -> bool:
    """Whether ``path`` is a folder of raw images (no ``.npy`` arrays) and both models take one image input with the
    same channel count: such a folder feeds the new model through the preprocessing pipeline (unlike arrays made for
    one input shape); gray images chosen for a gray model are not the data of a colour one."""
    from compiler_core.calibration.readers import read_listing
    from compiler_core.errors import QBCompilerError

    folder = Path(path)
    if len(specs) != 1 or len(previous) != 1 or not (specs[0].is_image and previous[0].is_image) \
            or specs[0].channels != previous[0].channels or not folder.is_dir():
        return False
    try:  # the calibration reader's own listing: class subfolders count, a folder mixing kinds does not
        return read_listing(folder, list(specs)).kind == "images"
    except (QBCompilerError, OSError):
        return False


def _fit_folder_processor(settings: CompileSettings, specs: Sequence[InputSpec], source: str) -> list[str]:
    """A transformers folder's image processor as the preprocessing of its one image input, when none is set (see
    ``compiler_core.calibration.hf_processor.model_folder_pipeline``)."""
    from compiler_core.calibration.hf_processor import PROCESSOR_FILE, model_folder_pipeline

    if settings.preprocessing.get("apply"):
        return []
    preprocessing, notes = model_folder_pipeline(source, specs)
    if preprocessing is None:
        return [f"{note} Choose a pipeline in the Calibration tab." for note in notes]
    settings.set("preprocessing", preprocessing)
    return [f"Preprocessing from the folder's {PROCESSOR_FILE} (the model's own image processor)."
            + "".join(f" {note}" for note in notes)]


def _fit_image_channels(settings: CompileSettings, specs: Sequence[InputSpec]) -> list[str]:
    wanted = settings.config.image_channels
    channels = {spec.channels for spec in specs if spec.is_image}
    if wanted == 0 or channels == {wanted}:
        return []
    settings.set("imageChannels", 0)
    have = "/".join(str(c) for c in sorted(channels)) or "no image"
    return [f"Image channels {wanted} -> keep the model's ({have}): the model takes {have}-channel input."]


def _image_channels(specs: Sequence[InputSpec]) -> set[int]:
    return {spec.channels for spec in specs if spec.is_image}


def _fit_preprocessing(settings: CompileSettings, specs: Sequence[InputSpec],
                       previous: Sequence[InputSpec]) -> list[str]:
    from qbstudio.state.calibration import PreprocessForm  # imports the calibration readers (onnx)

    form = PreprocessForm.from_preprocessing(settings.preprocessing)
    image = next((spec for spec in specs if spec.is_image), None)
    if not form.apply or image is None:
        return []
    height, width = image.spatial_size
    sizes = [(form.crop_height, form.crop_width)] if form.crop else []
    sizes += [(form.letterbox_height, form.letterbox_width)] if form.letterbox else []
    if form.resize and not form.keep_aspect and not (form.crop or form.letterbox):
        sizes.append((form.resize_height, form.resize_width))
    means = {len(form.mean), len(form.std)} if form.normalize else set()
    # One mean/std value fits any channel count, but values chosen for a 1-channel model's data do
    # not describe a 3-channel model's (the sample's Fashion-MNIST statistics on a photo model).
    same_channels = not form.normalize or _image_channels(previous) == _image_channels(specs)
    if all(size == (height, width) for size in sizes) and means <= {1, image.channels} and same_channels:
        return []
    settings.set("preprocessing", PreprocessForm().to_preprocessing())
    uint8 = settings.config.uint8_input.apply  # raw pixels in, the old pipeline's normalization fused: reset with it
    if uint8:
        settings.set("uint8Input.apply", False)
    return [f"Preprocessing reset{' (and uint8 model input off)' if uint8 else ''}: its sizes or normalization were "
            f"for the previous model, not {height}x{width} with {image.channels} channel(s). Choose a pipeline in the "
            f"Calibration tab."]


def holdout_split(total: int, holdout: int, num_samples: int) -> tuple[int, int]:
    """How a compile splits ``total`` samples: ``(calibration, held out)``.

    Mirrors ``compiler_core.quantization.run._split``: the held-out share is capped so that at least
    ``MIN_CALIBRATION_SAMPLES`` remain and at most a quarter is held out; calibration is capped at
    ``num_samples``.
    """
    held = min(holdout, max(0, total - MIN_CALIBRATION_SAMPLES), total // 4)
    return min(total - held, num_samples), held


def holdout_note(total: int | None, holdout: int, num_samples: int) -> tuple[str, bool]:
    """A sentence on how the samples will be split, and whether it differs from what was asked."""
    if total is None:
        return "Choose calibration data to see how the samples are split.", False
    calibration, held = holdout_split(total, holdout, num_samples)
    text = f"{total} sample(s): {calibration} for calibration, {held} held out for the accuracy analysis."
    if held < holdout:
        text += (f" Asked for {holdout} held out, but at most a quarter of the data (and leaving "
                 f"{MIN_CALIBRATION_SAMPLES} for calibration) is held out.")
        return text, True
    return text, False


@dataclass(frozen=True)
class Readiness:
    """Whether Compile can start for the loaded model, and if not, why.

    Attributes:
        ok: Compile may start.
        reason: Why not (empty when ``ok``).
        offload_helps: Turning on CPU offload of the head/tail would make the model compilable.
    """

    ok: bool
    reason: str = ""
    offload_helps: bool = False


def compile_readiness(model: Any, report: Any, cpu_offload: bool) -> Readiness:
    """Readiness of ``model`` given its ``check_support`` report and the CPU offload setting."""
    if report is None or report.compilable:
        return Readiness(True)
    from compiler_core.targets import plan_cpu_offload

    plan = plan_cpu_offload(model, report)
    blocking = report.blocking()
    if plan.npu_ready:
        if cpu_offload:
            return Readiness(True)
        where = ", ".join(sorted({entry.op_type for entry in blocking}))
        return Readiness(False, f"{len(blocking)} node(s) ({where}) cannot run on {report.device}; they are all "
                                f"at the start or end of the graph, so running them on the host CPU makes the "
                                f"model compilable.", offload_helps=True)
    ops = Counter(report.entries[name].op_type for name in plan.inner_unsupported)
    listed = ", ".join(f"{op} x{count}" for op, count in ops.most_common())
    return Readiness(False, f"Not compilable on {report.device}: {len(plan.inner_unsupported)} node(s) inside the "
                            f"graph cannot run on it ({listed}). CPU offload moves only the start and end of the "
                            f"graph; choose another device or change the model.")
