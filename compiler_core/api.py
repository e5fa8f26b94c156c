"""Public Python API, named as in the vendor's qb Compiler: ``mblt_compile``, ``read_provenance`` ..."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from compiler_core.errors import (
    ArgumentError,
    InternalError,
    InvalidModelError,
    QBCompilerError,
    UnsupportedOpsError,
)
from compiler_core.fileio import check_output_path, sha256_file
from compiler_core.frontends import detect_backend, load_source
from compiler_core.mblt.canonicalize import CHECKED_PROTO, VERIFY_STAGE, canonicalize, frozen_heap
from compiler_core.mblt.io import load_mblt, make_provenance, write_mblt
from compiler_core.mblt.io import read_provenance as _read_provenance
from compiler_core.progress import CancelToken, ProgressCallback, as_reporter

logger = logging.getLogger(__name__)

__all__ = ["get_body_subgraph", "load_mblt", "mblt_compile", "mblt_compile_with_callback", "mxq_compile", "mxq_compile_from_mblt",
           "mxq_compile_from_source", "mxq_compile_with_callback", "parse_model", "quantize", "read_provenance"]


def parse_model(
    model: Any,
    *,
    backend: str | None = None,
    input_shape_dict: Mapping[str, Sequence[int]] | None = None,
    constant_inputs: Mapping[str, Any] | None = None,
    output_names: Sequence[str] | None = None,
    callback: ProgressCallback | None = None,
    cancel_token: CancelToken | None = None,
    **frontend_options: Any,
) -> tuple[ir.Model, dict[str, Any]]:
    """Parse a source model to a canonical MBLT graph in memory.

    Returns:
        The canonical model and its provenance record.
    """
    return _parse(model, backend=backend, input_shape_dict=input_shape_dict, constant_inputs=constant_inputs,
                  output_names=output_names, reporter=as_reporter(callback, cancel_token), **frontend_options)


def _parse(model: Any, *, backend: str | None, input_shape_dict: Mapping[str, Sequence[int]] | None,
           constant_inputs: Mapping[str, Any] | None, output_names: Sequence[str] | None, reporter,
           keep_checked: bool = False, **frontend_options: Any) -> tuple[ir.Model, dict[str, Any]]:
    """:func:`parse_model`; ``keep_checked`` keeps the checker's protobuf in the graph's ``meta`` (see
    :func:`~compiler_core.mblt.canonicalize.canonicalize`)."""
    is_path = isinstance(model, (str, Path))
    in_dformats = _vendor_parse_options(frontend_options)
    backend = backend or (detect_backend(model) if is_path else "torch")
    constants = {name: np.asarray(value) for name, value in (constant_inputs or {}).items()}
    if backend in ("torch", "torchscript") and constants:  # bound arguments are forward() arguments there
        scalars = {name: value.item() if value.size == 1 else value for name, value in constants.items()}
        frontend_options["feed_dict"] = {**scalars, **(frontend_options.get("feed_dict") or {})}
        constants = {}
    if backend in ("tflite", "tf") and output_names:  # unconvertible post-processing ops are skipped there
        frontend_options["output_names"] = list(output_names)
    with frozen_heap():  # from the load on (see frozen_heap)
        with reporter.stage("load", total=1, message=f"loading {_describe(model)} ({backend})"):
            source = load_source(model, backend, input_shape_dict=input_shape_dict, **frontend_options)
            reporter.advance()
        try:
            graph = canonicalize(source, input_shape_dict=input_shape_dict, constant_inputs=constants,
                                 output_names=output_names, reporter=reporter, keep_checked=keep_checked)
        except InternalError as error:
            raise _blame_source(error, model, backend) from error.__cause__
        except QBCompilerError:
            raise
        except Exception as error:  # a library pass crashed: the source's fault only if it fails the full checker
            crash = InternalError(f"Canonicalization failed: {type(error).__name__}: {error}",
                                  hint="This is probably a compiler bug. Please report it with the model.",
                                  stage=VERIFY_STAGE)
            raise _blame_source(crash, model, backend) from error
    _check_in_dformats(in_dformats, graph)
    provenance = make_provenance(
        source_path=str(Path(model).resolve()) if is_path else None,
        source_sha256=sha256_file(model) if is_path and Path(model).is_file() else None,
        backend=backend,
        parser_options={"input_shape_dict": {k: list(v) for k, v in (input_shape_dict or {}).items()},
                        "constant_inputs": {k: _fingerprint(v) for k, v in constants.items()},
                        **({"output_names": list(output_names)} if output_names else {})},
    )
    return graph, provenance


FRONTEND_OPTIONS = ("feed_dict", "dynamic_axes", "allow_pickle", "submodule")
"""Keyword arguments of the compile functions that go to the frontend (the parse), not to the CompileConfig."""

PARSE_HOSTS = ("cpu", "gpu")
LAYOUT_NAMES = ("NCHW", "NHWC")


def _vendor_parse_options(options: dict[str, Any]) -> dict[str, str]:
    """Take the vendor's parse arguments that are not frontend options out of ``options``; refuse unknown names.

    ``device`` (the compile host) and ``cpu_offload`` are accepted as the vendor's ``mblt_compile`` takes them; the
    parse runs on the CPU and the offload is decided by the compile. Returns ``in_dformats``, checked after the parse.
    """
    device = options.pop("device", None)
    if device is not None and device not in PARSE_HOSTS:
        raise ArgumentError(f"device must be one of {', '.join(PARSE_HOSTS)} (the compile host), got {device!r}.",
                            hint="The NPU is chosen with target_device (aries-rb ...).")
    if options.pop("cpu_offload", None):
        logger.warning("cpu_offload is decided when compiling, not at the parse: pass cpu_offload=True to "
                       "mxq_compile / mxq_compile_from_mblt (or --cpu-offload) with this MBLT.")
    feed_dict = options.get("feed_dict")
    if feed_dict is not None and not isinstance(feed_dict, Mapping):
        raise ArgumentError(f"feed_dict must be a dict keyed by forward's argument names, got a "
                            f"{type(feed_dict).__name__}.", hint="e.g. feed_dict={'x': torch.randn(1, 3, 224, 224)}.")
    in_dformats = options.pop("in_dformats", None) or {}
    if not isinstance(in_dformats, Mapping):
        raise ArgumentError(f"in_dformats must be a dict of input name -> layout, got a {type(in_dformats).__name__}.",
                            hint="e.g. in_dformats={'input': 'NCHW'}.")
    unknown = sorted(set(options) - {*FRONTEND_OPTIONS, "output_names"})
    if unknown:
        raise ArgumentError(f"Unknown parse argument(s): {', '.join(unknown)}.",
                            hint="Valid arguments: backend, target_device, input_shape_dict, constant_inputs, "
                                 f"output_names, device, cpu_offload, in_dformats, {', '.join(FRONTEND_OPTIONS)}.")
    return dict(in_dformats)


def _check_in_dformats(in_dformats: Mapping[str, str], graph: ir.Model) -> None:
    """``in_dformats`` names model inputs and a layout each; the MBLT keeps the model's own layout either way."""
    names = [value.name for value in graph.graph.inputs]
    unknown = sorted(set(in_dformats) - set(names))
    if unknown:
        raise ArgumentError(f"in_dformats names input(s) the model does not have: {', '.join(unknown)}.",
                            hint=f"The model's inputs are: {', '.join(names)}.")
    bad = {name: layout for name, layout in in_dformats.items() if str(layout).upper() not in LAYOUT_NAMES}
    if bad:
        raise ArgumentError(f"in_dformats: {bad} is not a layout; use one of {', '.join(LAYOUT_NAMES)}.")
    if in_dformats:
        logger.info("in_dformats: the MBLT keeps each input's layout as the model declares it; the layout of the "
                    "arrays you run is Model(..., input_layout='NCHW' or 'NHWC').")


def mblt_compile(
    model: Any,
    mblt_save_path: str | Path,
    backend: str | None = None,
    target_device: str | None = None,
    *,
    input_shape_dict: Mapping[str, Sequence[int]] | None = None,
    constant_inputs: Mapping[str, Any] | None = None,
    output_names: Sequence[str] | None = None,
    callback: ProgressCallback | None = None,
    cancel_token: CancelToken | None = None,
    **frontend_options: Any,
) -> Path:
    """Parse ``model`` and write the canonical MBLT to ``mblt_save_path`` (atomically).

    Args:
        model: Path to the source model (or, for ``backend="torch"``, a live module).
        mblt_save_path: Output ``.mblt`` path.
        backend: ``onnx``, ``torch``, ``torchscript``, ``tf`` or ``tflite``; detected from the path if omitted.
        target_device: If given, the device string is validated and a support summary is logged.
        input_shape_dict: Static shapes for inputs with dynamic dimensions.
        constant_inputs: Inputs to bind to constants (e.g. ``{"sr": 16000}``).
        output_names: Tensors to end the graph at (e.g. the boxes and scores before a NonMaxSuppression);
            ``None`` keeps the model's own outputs.
        callback: Receives :class:`~compiler_core.progress.ProgressEvent` objects.
        cancel_token: Cancels the job between steps; nothing is written then.

    Returns:
        The path written.
    """
    reporter = as_reporter(callback, cancel_token)
    if not mblt_save_path:
        raise ArgumentError("No output path given for the MBLT.", hint="Pass mblt_save_path / --output.")
    check_output_path(mblt_save_path, "MBLT")
    device = _device(target_device)
    with frozen_heap():  # the load, the passes and the write (see frozen_heap)
        graph, provenance = _parse(model, backend=backend, input_shape_dict=input_shape_dict,
                                   constant_inputs=constant_inputs, output_names=output_names, reporter=reporter,
                                   keep_checked=True, **frontend_options)
        checked = graph.meta.pop(CHECKED_PROTO, None)  # the graph is only read until it is written
        if device is not None:
            _log_support(graph, device)
        with reporter.stage("write", total=1, message=f"writing {mblt_save_path}"):
            reporter.check()
            path = write_mblt(graph, mblt_save_path, provenance, checked=checked)
            reporter.advance()
    return path


def mblt_compile_with_callback(model: Any, mblt_save_path: str | Path, callback: ProgressCallback,
                               **kwargs: Any) -> Path:
    """:func:`mblt_compile` with a progress callback as a positional argument (vendor spelling)."""
    return mblt_compile(model, mblt_save_path, callback=callback, **kwargs)


def read_provenance(mblt_path: str | Path) -> dict[str, Any]:
    """The provenance record of an MBLT: source path and sha256, backend, compiler version, options."""
    return _read_provenance(mblt_path)


def get_body_subgraph(mblt_path: str | Path, output_path: str | Path, target_device: str = "aries-rb") -> Path:
    """Write an MBLT holding only the NPU body of ``mblt_path`` (vendor ``get_body_subgraph``).

    The body is what ``cpu_offload`` leaves on the NPU of ``target_device``: the graph without its leading and
    trailing groups of layers the device cannot run (the largest subgraph the NPU runs in one piece). Its inputs and
    outputs are the tensors at the cut; node names are the MBLT's. An MBLT the device runs whole is written unchanged.

    Raises:
        UnsupportedOpsError: a layer the device cannot run sits between NPU layers, or nothing is left for the NPU.
    """
    from compiler_core.backend.partition import partition
    from compiler_core.targets import body_computes, check_support, get_device, plan_cpu_offload

    device = get_device(target_device)
    check_output_path(output_path, "MBLT")
    graph = load_mblt(mblt_path)
    report = check_support(graph, device.name)
    plan = plan_cpu_offload(graph, report)
    if plan.inner_unsupported or not body_computes(graph, plan):
        error = report.unsupported_error()
        where = "sit between NPU layers" if plan.inner_unsupported else "leave no layer for the NPU"
        raise UnsupportedOpsError(f"No NPU body to extract for {device.name}: unsupported layers {where}. "
                                  f"{error.message if error else ''}".strip(),
                                  hint=plan.inner_hint(report.mfu_alternatives()) if plan.inner_unsupported else
                                  "Check the model with `qbcompiler check` for the reasons.",
                                  nodes=(plan.inner_unsupported or plan.cpu_head + plan.cpu_tail)[:10])
    body = partition(graph, plan).body if plan.has_cpu_parts else graph
    logger.info("NPU body on %s: %d node(s); %d head and %d tail node(s) left out", device.name, len(plan.npu_body),
                len(plan.cpu_head), len(plan.cpu_tail))
    provenance = {**_read_provenance(mblt_path),
                  "body_of": {"mblt_sha256": sha256_file(mblt_path), "target_device": device.name,
                              "cpu_head": plan.cpu_head, "cpu_tail": plan.cpu_tail}}
    return write_mblt(body, output_path, provenance)


def _device(target_device: str | None):
    if target_device is None:
        return None
    from compiler_core.targets import get_device

    return get_device(target_device)


def _log_support(graph: ir.Model, device) -> None:
    from compiler_core.targets import check_support

    report = check_support(graph, device.name)
    logger.info("Support on %s: %s", device.name, report.counts())


def _blame_source(error: InternalError, model: Any, backend: str) -> QBCompilerError:
    """The canonical graph failed ONNX's checker: blame the source only if it fails the full checker too."""
    if error.fields.get("stage") != VERIFY_STAGE or backend != "onnx" or not isinstance(model, (str, Path)):
        return error
    from compiler_core.frontends.onnx import source_checker_failure

    failure = source_checker_failure(model)
    if failure is None:
        return error
    return InvalidModelError(f"The source model fails onnx.checker (full check): {failure}",
                             hint="Fix or re-export the source model; check it with "
                                  "onnx.checker.check_model(path, full_check=True).",
                             file=str(model), stage=VERIFY_STAGE, parsed_graph_error=error.message)


def _fingerprint(array: np.ndarray) -> str:
    digest = hashlib.sha256(array.tobytes() + json.dumps([array.dtype.str, array.shape]).encode())
    return digest.hexdigest()[:16]


def _describe(model: Any) -> str:
    return Path(model).name if isinstance(model, (str, Path)) else type(model).__name__


def quantize(
    mblt_path: str | Path,
    calib_data_path: str | Path | Sequence[str | Path] | None = None,
    *,
    compile_config: Any = None,
    config_preset: str | None = None,
    use_random_calib: bool | None = None,
    analysis: bool = True,
    callback: ProgressCallback | None = None,
    cancel_token: CancelToken | None = None,
    **config_args: Any,
):
    """Quantize an MBLT: calibrate, decide, lower to the integer program, and analyse the accuracy.

    Args:
        mblt_path: The parsed model.
        calib_data_path: Images folder, ``.npy`` folder, ``.txt`` list or JSON manifest (or several).
        compile_config: CompileConfig, dict, or path to a JSON/YAML file.
        config_preset: Preset name (``classification``, ``transformer_encoder`` ...).
        use_random_calib: Random calibration data (smoke tests only).
        analysis: Compare FP32 and quantized outputs on held-out samples.
        callback: Progress events.
        cancel_token: Cancels between samples and stages.
        **config_args: Explicit CompileConfig arguments (``calibration_config=...``, ``analysis_holdout=...``).

    Returns:
        A :class:`~compiler_core.quantization.run.QuantizeResult` (``.model``, ``.analysis``, ...).
    """
    from compiler_core.config import resolve_config
    from compiler_core.quantization.run import quantize_mblt

    reporter = as_reporter(callback, cancel_token)
    config = resolve_config(compile_config=compile_config, config_preset=config_preset,
                            use_random_calib=use_random_calib, **config_args)
    return quantize_mblt(mblt_path, config, calib_data_path=calib_data_path, reporter=reporter, analysis=analysis)


def sensitivity(
    mblt_path: str | Path,
    calib_data_path: str | Path | Sequence[str | Path] | None = None,
    *,
    compile_config: Any = None,
    config_preset: str | None = None,
    use_random_calib: bool | None = None,
    samples: int = 2,
    split: bool = False,
    callback: ProgressCallback | None = None,
    cancel_token: CancelToken | None = None,
    **config_args: Any,
):
    """Per-layer sensitivity of an MBLT: each layer quantized alone, and kept in int16 with the rest quantized.

    Runs on the statistics cache (calibrating once when the data is new) and a fake-quantization
    proxy in onnxruntime; see :mod:`compiler_core.analysis.sensitivity`.

    Args:
        mblt_path: The parsed model.
        calib_data_path: Calibration data (as for :func:`quantize`).
        compile_config: CompileConfig, dict, or path to a JSON/YAML file.
        config_preset: Preset name.
        use_random_calib: Random calibration data (smoke tests only).
        samples: Held-out samples every variant runs on (more: steadier ranking, longer run).
        split: Also measure a linear layer's activation and weights apart.
        callback: Progress events (stage ``sensitivity``: one unit per proxy run).
        cancel_token: Cancels between proxy runs.
        **config_args: Explicit CompileConfig arguments.

    Returns:
        A :class:`~compiler_core.analysis.sensitivity.SensitivityReport` (``.layers`` most sensitive first).
    """
    from compiler_core.analysis.sensitivity import mblt_sensitivity
    from compiler_core.config import resolve_config

    reporter = as_reporter(callback, cancel_token)
    config = resolve_config(compile_config=compile_config, config_preset=config_preset,
                            use_random_calib=use_random_calib, **config_args)
    return mblt_sensitivity(mblt_path, config, calib_data_path=calib_data_path, reporter=reporter, samples=samples,
                            split=split)


def _is_mblt(model: Any) -> bool:
    if not isinstance(model, (str, Path)) or not Path(model).is_file():
        return False
    if Path(model).suffix.lower() == ".mblt":
        return True
    try:
        _read_provenance(model)
    except QBCompilerError:  # not an MBLT: treat it as a source model
        return False
    return True


def mxq_compile(model: Any, target_device: str | None = None, calib_data_path: Any = None,
                save_path: str | Path = "./tmp.mxq", **kwargs: Any):
    """Compile a source model **or** an MBLT to an MXQ (vendor name and argument order).

    Args:
        model: Source model path (ONNX ...), a ``.mblt`` file, or (torch backend) a live module.
        target_device: ``aries-rb``, ``regulus-ra``, ``regulus-rb`` or ``regulus-rb-usb``.
        calib_data_path: Calibration data (folder, ``.txt`` list or JSON manifest; or a list of them).
        save_path: Output ``.mxq`` (default ``./tmp.mxq``); the analysis JSON is written beside it.
        **kwargs: ``backend``, ``input_shape_dict``, ``constant_inputs``, ``output_names``, frontend options (``feed_dict``,
            ``submodule``, ``allow_pickle``, ``dynamic_axes``), ``inference_scheme``,
            ``cpu_offload``, ``cpu_layers`` (``{"head": [...], "tail": [...]}``), ``use_random_calib``,
            ``layer_bias_correction``, ``image_channels``,
            ``config_preset``, ``compile_config``, ``config_save_path``, sub-configs
            (``calibration_config`` ...), ``callback``, ``cancel_token``.

    Returns:
        A :class:`~compiler_core.compile.CompileResult`.
    """
    compile_from = mxq_compile_from_mblt if _is_mblt(model) else mxq_compile_from_source
    return compile_from(model, target_device=target_device, calib_data_path=calib_data_path, save_path=save_path,
                        **kwargs)


def mxq_compile_from_source(model: Any, target_device: str | None = None, calib_data_path: Any = None,
                            save_path: str | Path = "./tmp.mxq", *, backend: str | None = None,
                            input_shape_dict: Mapping[str, Sequence[int]] | None = None,
                            constant_inputs: Mapping[str, Any] | None = None,
                            output_names: Sequence[str] | None = None, callback: ProgressCallback | None = None,
                            cancel_token: CancelToken | None = None, **kwargs: Any):
    """Parse the source model (to a temporary MBLT), then :func:`mxq_compile_from_mblt`."""
    import tempfile

    reporter = as_reporter(callback, cancel_token)
    frontend_options = {key: kwargs.pop(key) for key in (*FRONTEND_OPTIONS, "in_dformats") if key in kwargs}
    backend, input_shape_dict = _parse_options_from_config(kwargs, backend, input_shape_dict)
    _compile_config(target_device=target_device, calib_data_path=calib_data_path, save_path=save_path,
                    **{key: value for key, value in kwargs.items() if key != "config_save_path"})
    check_output_path(save_path, "MXQ")  # before the parse, not after the whole compile
    with tempfile.TemporaryDirectory(prefix="qbcompiler-parse-") as scratch:
        mblt = mblt_compile(model, Path(scratch) / "model.mblt", backend=backend, input_shape_dict=input_shape_dict,
                            constant_inputs=constant_inputs, output_names=output_names, callback=reporter,
                            **frontend_options)
        kwargs.setdefault("model_path", [str(model)] if isinstance(model, (str, Path)) else None)
        if isinstance(model, (str, Path)) and "preprocessing_config" not in kwargs:
            processor = _folder_preprocessing(Path(model), mblt, kwargs)
            if processor is not None:
                kwargs["preprocessing_config"] = processor
        return mxq_compile_from_mblt(mblt, target_device=target_device, calib_data_path=calib_data_path,
                                     save_path=save_path, callback=reporter, **kwargs)


def _folder_preprocessing(source: Path, mblt: Path, kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The image processor of a transformers model folder as the preprocessing, when the config sets none."""
    from compiler_core.calibration import input_specs
    from compiler_core.calibration.hf_processor import PROCESSOR_FILE, model_folder_pipeline
    from compiler_core.config import resolve_config
    from compiler_core.mblt.io import load_mblt

    if not (source / PROCESSOR_FILE).is_file():
        return None
    config = resolve_config(compile_config=kwargs.get("compile_config"), config_preset=kwargs.get("config_preset"))
    if config.preprocessing.apply:
        return None
    preprocessing, notes = model_folder_pipeline(source, input_specs(load_mblt(mblt)))
    for note in notes:
        logger.info("%s", note)
    if preprocessing is not None:
        logger.info("Preprocessing from %s (the model's own image processor); set preprocessing to override it.",
                    source / PROCESSOR_FILE)
    return preprocessing


def _parse_options_from_config(kwargs: Mapping[str, Any], backend: str | None,
                               input_shape_dict: Mapping[str, Sequence[int]] | None):
    """``backend`` and ``input_shape_dict`` for the parse: explicit arguments win, then the compile config.

    The config file (or dict, or preset) is the same one the compile resolves, so a shape given
    there is honoured by the parse that precedes the compile, as ``qbcompiler parse`` honours it.
    """
    if (backend is not None and input_shape_dict is not None) or (
            kwargs.get("compile_config") is None and kwargs.get("config_preset") is None):
        return backend, input_shape_dict
    from compiler_core.config import resolve_config

    config = resolve_config(compile_config=kwargs.get("compile_config"), config_preset=kwargs.get("config_preset"))
    return backend or config.backend, input_shape_dict or (dict(config.input_shape_dict) or None)


def mxq_compile_from_mblt(mblt: str | Path, target_device: str | None = None, calib_data_path: Any = None,
                          save_path: str | Path = "./tmp.mxq", *, compile_config: Any = None,
                          config_preset: str | None = None, config_save_path: str | Path | None = None,
                          callback: ProgressCallback | None = None, cancel_token: CancelToken | None = None,
                          **config_args: Any):
    """Quantize and compile an MBLT for ``target_device`` into an MXQ."""
    from compiler_core.compile import compile_mblt

    reporter = as_reporter(callback, cancel_token)
    config_args.setdefault("model_path", [str(mblt)])
    config = _compile_config(target_device=target_device, calib_data_path=calib_data_path, save_path=save_path,
                             compile_config=compile_config, config_preset=config_preset, **config_args)
    return compile_mblt(Path(mblt), Path(save_path), config, reporter=reporter, calib_data_path=calib_data_path,
                        config_save_path=Path(config_save_path) if config_save_path else None)


def _compile_config(*, target_device: str | None, calib_data_path: Any, save_path: str | Path, compile_config: Any = None,
                    config_preset: str | None = None, **config_args: Any):
    """The resolved compile config, with a target device that exists.

    :func:`mxq_compile_from_source` calls it before the parse too, so a missing or unknown device, an unknown preset
    or a bad config file is said at once, not after a parse that may take minutes.
    """
    from compiler_core.config import resolve_config
    from compiler_core.targets import get_device

    paths = [calib_data_path] if isinstance(calib_data_path, (str, Path)) else calib_data_path
    if paths is not None and not (isinstance(paths, Sequence) and all(isinstance(p, (str, os.PathLike)) for p in paths)):
        raise ArgumentError(f"calib_data_path must be a path or a list of paths, got {calib_data_path!r}.",
                            hint="A folder of images or .npy files, a .txt list or a JSON manifest.")
    config = resolve_config(compile_config=compile_config, config_preset=config_preset, target_device=target_device,
                            save_path=[str(save_path)], calib_data_path=[str(p) for p in paths] if paths else None,
                            **config_args)
    if not config.target_device:
        raise ArgumentError("No target device given.", hint="Pass target_device / --target-device (e.g. aries-rb).")
    get_device(config.target_device)
    if config.device == "gpu":
        logger.warning("device='gpu': this version calibrates with onnxruntime on the CPU; the setting is kept in the "
                       "config only.")
    return config


def mxq_compile_with_callback(model: Any, callback: ProgressCallback, **kwargs: Any):
    """:func:`mxq_compile` with the progress callback first (vendor spelling)."""
    return mxq_compile(model, callback=callback, **kwargs)


def profile(mxq_path: str | Path, core_mode: str | None = None) -> dict[str, Any]:
    """Per-layer performance report of a compiled MXQ (``qbcompiler profile``), per core mode.

    Args:
        mxq_path: The compiled model.
        core_mode: Only this mode (default: every mode the MXQ was compiled for).

    Returns:
        ``{"device", "arena_bytes", "sram_bytes_per_core", "modes": {mode: {latency_ms, throughput_fps,
        macs, cycles, dram_bytes, sram_peak_bytes, layers: [...]}}}``.
    """
    from compiler_core.runtime.profile import profile_mxq

    return profile_mxq(mxq_path, [core_mode] if core_mode else None)
