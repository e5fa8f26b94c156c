"""Inputs for ``qbcompiler run``: .npy files, images (with the MXQ's own preprocessing), lists, manifests."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from compiler_core.calibration import InputSpec, open_calibration_data
from compiler_core.calibration.sources import Sample
from compiler_core.config import CompileConfig
from compiler_core.errors import CalibrationError
from compiler_core.mblt.io import layout_hint
from compiler_core.progress import ProgressCallback, Reporter, as_reporter
from compiler_core.runtime.artifact import CompiledArtifact


def input_specs_of(artifact: CompiledArtifact) -> list[InputSpec]:
    """The model inputs as calibration-reader specs (model layout, batch included; a quantized source input's
    integer codes are read as its values, as in calibration)."""
    codes = artifact.meta.get("input_codes") or {}
    return [InputSpec(spec.name, tuple(spec.shape), np.dtype(spec.dtype), layout_hint(list(spec.shape)),
                      tuple(codes[spec.name]) if spec.name in codes else None)
            for spec in artifact.input_specs]


def unreadable_inputs(paths: Sequence[str]) -> dict[str, str]:
    """The given image and ``.npy`` files that cannot be read, each with the reason (the calibration reader's checks:
    a truncated or mislabelled image, a damaged ``.npy`` header); lists, manifests and folders are left to the reader.
    Running the others lets one bad file among many inputs cost only its own result."""
    from PIL import Image

    from compiler_core.calibration.audio import wav_info
    from compiler_core.calibration.readers import FILE_KINDS
    from compiler_core.calibration.validate import npy_header, probe_image

    checks = {"npy": npy_header, "image": probe_image, "audio": wav_info}
    failed = {}
    for name in paths:
        path = Path(name)
        kind = FILE_KINDS.get(path.suffix.lower())
        if not path.is_file() or kind is None:
            continue
        try:
            checks[kind](path)
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
            failed[str(name)] = str(error).rstrip(".") or type(error).__name__
    return failed


def readable_inputs(paths: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """(the paths to run, the unreadable ones with their reasons: :func:`unreadable_inputs`).

    Raises:
        CalibrationError: not one of the files can be read.
    """
    from compiler_core.calibration.preprocess import IMAGE_FORMAT_NAMES

    failed = unreadable_inputs(paths)
    if failed and len(failed) == len(paths):
        listed = "; ".join(f"{Path(name).name}: {reason}" for name, reason in list(failed.items())[:5])
        raise CalibrationError(f"None of the {len(paths)} input file(s) can be read: {listed}"
                               f"{'; ...' if len(failed) > 5 else ''}.",
                               hint=f"Give {IMAGE_FORMAT_NAMES} images, .wav recordings, .npy arrays, a list or a manifest.",
                               files=list(failed))
    return [name for name in paths if str(name) not in failed], failed


def load_run_inputs(artifact: CompiledArtifact, paths: Sequence[str]) -> Iterator[tuple[Sample, dict[str, np.ndarray]]]:
    """``(sample, feeds)`` per sample (its files: ``sample.describe()``), preprocessed exactly as the MXQ's calibration
    data was."""
    config = CompileConfig.model_validate(artifact.meta.get("config") or {})
    dataset = open_calibration_data(list(paths), input_specs_of(artifact), preprocessing=config.preprocessing,
                                    image_channels=config.image_channels, for_calibration=False)
    for index in range(len(dataset)):
        yield dataset.samples[index], dataset.sample(index)


def fitting_run_inputs(artifact: CompiledArtifact, paths: Sequence[str]
                       ) -> tuple[list[tuple[Sample, dict[str, np.ndarray]]], dict[str, str]]:
    """(:func:`load_run_inputs` of ``paths``, {file: why it does not fit the model}).

    Opened together first; when they do not fit the model together and each path is one image or ``.npy`` file, each
    is opened on its own, so that a wrong-shape ``.npy`` or an image of another size among good inputs costs only its
    own result (it refused them all).

    Raises:
        CalibrationError: the inputs do not fit and none of them fits on its own (or a list, manifest or folder is
            among them: its own error).
    """
    from compiler_core.calibration.preprocess import IMAGE_SUFFIXES

    try:
        return list(load_run_inputs(artifact, paths)), {}
    except CalibrationError:
        one_each = all(Path(name).is_file() and Path(name).suffix.lower() in (*IMAGE_SUFFIXES, ".npy")
                       for name in paths)
        if len(paths) < 2 or not one_each:
            raise
    samples, misfits = [], {}
    for name in paths:
        try:
            samples += load_run_inputs(artifact, [name])
        except CalibrationError as error:
            misfits[str(name)] = str(error)
    if not samples:
        raise CalibrationError(f"None of the {len(paths)} input file(s) fits the model; the first: "
                               f"{next(iter(misfits.values()))}", files=list(misfits))
    return samples, misfits


def class_scores(artifact: CompiledArtifact) -> dict[str, bool]:
    """Which of the MXQ's outputs hold class scores, by the analysis's rule
    (:func:`compiler_core.analysis.compare.class_score_outputs`): only those get a top-k."""
    from compiler_core.analysis.compare import class_score_outputs

    return class_score_outputs(artifact.program, artifact.output_specs, artifact.cpu_models.get("tail"))


def top_k(value: np.ndarray, k: int, labels: Sequence[str] | None = None) -> dict[str, Any]:
    """``{"top_k": [{"index", "score", "label"?}, ...]}`` for class scores (``[1, C]``, or ``[1, C, 1, 1]`` /
    ``[1, 1, 1, C]`` from a 1x1-convolution head), else ``{}``."""
    flat = np.asarray(value).reshape(-1)
    if value.ndim < 2 or value.shape[0] != 1 or sum(size != 1 for size in value.shape[1:]) != 1 or k <= 0:
        return {}
    order = np.argsort(-flat)[:k]
    return {"top_k": [{"index": int(i), "score": float(flat[i]),
                       **({"label": labels[i]} if labels and i < len(labels) else {})} for i in order]}


def compare_with_fp32(mxq_path: str | Path, mblt_path: str | Path, paths: Sequence[str], *, k: int = 5,
                      reporter: Reporter | ProgressCallback | None = None) -> list[dict[str, Any]]:
    """Run inputs through an MXQ (the bit-exact simulator) and its FP32 MBLT (onnxruntime), side by side.

    Args:
        mxq_path: The compiled model.
        mblt_path: The MBLT it was compiled from (the FP32 reference).
        paths: Images (preprocessed as the MXQ's calibration data was), ``.npy`` files, lists or manifests.
        k: How many classes to list for class-score outputs.
        reporter: Progress and cancellation.

    Returns:
        Per input ``{"input" (its files), "label" (a short name), "outputs": [{"name", "shape", "cosine", "sqnr_db", "max_abs_error", "fp32_top_k",
        "mxq_top_k"}]}`` (the top-k lists only for class scores; ``cosine`` None for a one-element output); a file that cannot be read (:func:`unreadable_inputs`)
        or does not fit the model (:func:`fitting_run_inputs`) is ``{"input", "label", "error" (why), "outputs": []}``,
        after the others.

    Raises:
        CalibrationError: no input can be read, or none of the readable ones fits the model.
    """
    import onnxruntime as ort

    from compiler_core.analysis.metrics import cosine, sqnr_db
    from compiler_core.runtime.model import Accelerator, Model

    paths, failed = readable_inputs(paths)
    model = Model(mxq_path, input_layout="NCHW")  # the model's own layout, as the samples are (NHWC models: as is)
    model.launch(Accelerator(model.artifact.device))
    session = ort.InferenceSession(str(mblt_path), providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    classes = class_scores(model.artifact)
    reporter = as_reporter(reporter)
    samples, misfits = fitting_run_inputs(model.artifact, paths)
    results = []
    try:
        with reporter.stage("run", total=len(samples)):
            for source, feeds in samples:
                quantized = model.infer(feeds)
                reference = dict(zip(names, session.run(None, feeds)))
                outputs = []
                for spec, value in zip(model.artifact.output_specs, quantized):
                    fp32 = np.asarray(reference.get(spec.name), np.float64)
                    ours = np.asarray(value, np.float64).reshape(fp32.shape)
                    noise = float(np.sum((fp32 - ours) ** 2))
                    outputs.append({"name": spec.name, "shape": list(fp32.shape), "cosine": cosine(fp32.ravel(), ours.ravel()) if fp32.size > 1 else None,
                                    "sqnr_db": sqnr_db(float(np.sum(fp32 ** 2)), noise),
                                    "max_abs_error": float(np.max(np.abs(fp32 - ours))) if fp32.size else 0.0,
                                    "fp32_top_k": top_k(fp32, k).get("top_k", []) if classes.get(spec.name) else [],
                                    "mxq_top_k": top_k(ours, k).get("top_k", []) if classes.get(spec.name) else []})
                results.append({"input": source.describe(), "label": source.label(), "outputs": outputs})
                reporter.advance()
    finally:
        model.dispose()
    reasons = {name: f"cannot be read: {reason}" for name, reason in failed.items()} | misfits
    return results + [{"input": name, "label": Path(name).name, "error": reason, "outputs": []}
                      for name, reason in reasons.items()]
