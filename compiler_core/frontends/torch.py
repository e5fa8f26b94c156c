"""PyTorch frontend: live modules, ``.pt2`` programs, pickled modules and transformers folders -> ONNX.

Every source ends as a ``torch.nn.Module`` (or a ``torch.export.ExportedProgram``) that is exported
in memory, first with the dynamo exporter (``torch.export`` based) and, if that fails, with the legacy
TorchScript exporter. The legacy fallback refuses traces that turned a tensor into a Python boolean:
such a trace silently bakes one branch of data-dependent control flow into the graph.

Example inputs come from ``feed_dict``, keyed by the names of ``forward``'s parameters; the model is
called as ``module(**feed_dict)``. Tensors (or numpy arrays) become graph inputs named after their
parameter; Python scalars (``int``, ``float``, ``bool``) are passed through as constants.

Outputs: a tensor is exported as ``output``; a tuple or list as its tensors in order (``output_0``,
...; ``None`` and nested containers flattened); a mapping such as a transformers ``ModelOutput`` as
its ``logits`` (with a detector's ``pred_boxes`` / a segmenter's ``pred_masks``), else its
``last_hidden_state`` (a warning names the tensor entries left out), else all its tensor entries, each named after
its key; a mapping of the user's own (a ``dict``) as all its tensor entries.

Every node's ``mblt.source_name`` metadata is set to the path of the module that produced it
(``features.3.conv.0``), read from the exporter's name scopes.
"""

from __future__ import annotations

import ast
import inspect
import io
import json
import logging
import pickle
import re
import traceback
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from compiler_core.errors import ArgumentError, ModelLoadError

logger = logging.getLogger(__name__)

SOURCE_NAME_KEY = "mblt.source_name"
DYNAMO_OPSET = 21  # the canonical MBLT opset; the dynamo exporter translates to it natively
LEGACY_OPSET = 20  # the highest opset the TorchScript exporter supports (torch 2.13)
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
_WRAPPED = "model"  # attribute under which the export wrapper holds the user's module
_HF_PRIMARY_OUTPUTS = ("logits", "last_hidden_state")
_HF_COMPANION_OUTPUTS = ("pred_boxes", "pred_masks")
"""Exported beside a ModelOutput's ``logits``: a detector's boxes (DETR, YOLOS) and a segmenter's masks are half of its
answer (only the class logits were exported)."""
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


class TraceSpecializationError(RuntimeError):
    """The legacy tracer converted a tensor to a Python boolean (data-dependent control flow)."""


def load_torch(
    model: Any,
    *,
    feed_dict: Mapping[str, Any] | None = None,
    dynamic_axes: Mapping[str, Any] | None = None,
    allow_pickle: bool = False,
    input_shape_dict: Mapping[str, Any] | None = None,
    **_: Any,
) -> ir.Model:
    """Export a PyTorch model to an in-memory ONNX graph.

    Args:
        model: A ``torch.nn.Module`` (a transformers ``PreTrainedModel`` included), a
            ``torch.export.ExportedProgram``, or a path to a ``.pt2`` file (``torch.export.save``),
            a pickled module (``torch.save(module)``, ``.pt``/``.pth``) or a transformers folder
            holding ``config.json`` and weights. A TorchScript archive is handed to the
            TorchScript frontend.
        feed_dict: Example inputs keyed by ``forward`` parameter names (tensors, numpy arrays, or
            Python scalars bound as constants). Required for modules, unless ``input_shape_dict``
            lets inputs be made up (float32 noise; int64 ids and masks for transformers models).
            Optional for ``.pt2`` programs, which carry their own example inputs.
        dynamic_axes: Passed to the exporter (``{"input": {0: "batch"}}``); the MBLT pins every
            shape later, so this only records which dimensions were meant to vary.
        allow_pickle: Allow ``torch.load(weights_only=False)`` for pickled modules. Unpickling runs
            code from the file: only enable it for files you trust.
        input_shape_dict: Shapes to make example inputs from when ``feed_dict`` is not given.

    Returns:
        The exported ONNX graph, each node's ``mblt.source_name`` set to its module path.

    Raises:
        ArgumentError: ``feed_dict`` does not match ``forward``; a pickled file without
            ``allow_pickle``; an object that is not a model.
        ModelLoadError: the file is missing or unreadable, holds only a state dict, names a hub
            model that is not on disk, or neither exporter can convert the model.
    """
    import torch

    source = resolve_source(model, allow_pickle=allow_pickle)
    if isinstance(source, (Path, torch.jit.ScriptModule)):  # a TorchScript archive or module
        from compiler_core.frontends.torchscript import load_torchscript

        logger.info("TorchScript model: using the TorchScript frontend")
        return load_torchscript(source, feed_dict=feed_dict, input_shape_dict=input_shape_dict)
    if isinstance(source, torch.export.ExportedProgram):
        onnx_model = _export_program(source, feed_dict, dynamic_axes)
    else:
        feed = feed_dict if feed_dict is not None else _made_up_feed(source, input_shape_dict)
        onnx_model = export_module(source, feed, dynamic_axes=dynamic_axes)
    record_module_paths(onnx_model)
    return onnx_model


# -- sources -------------------------------------------------------------------------------------


def resolve_source(model: Any, *, allow_pickle: bool = False) -> Any:
    """Turn ``model`` into a module in eval mode or an ``ExportedProgram``.

    A TorchScript module is returned as is, a TorchScript archive as its Path (both belong to the
    TorchScript frontend).
    """
    import torch

    if isinstance(model, (torch.export.ExportedProgram, torch.jit.ScriptModule)):
        return model
    if isinstance(model, torch.nn.Module):
        if model.training:
            logger.info("%s is in training mode: switching it to eval mode for export", type(model).__name__)
        return model.eval()
    if not isinstance(model, (str, Path)):
        raise ArgumentError(
            f"The torch backend cannot use a {type(model).__name__}.",
            hint="Pass a torch.nn.Module, a torch.export.ExportedProgram, or a path to a .pt2 file, "
                 "a pickled module (.pt/.pth) or a transformers folder.")
    path = Path(model)
    if not path.exists():
        raise _missing_path_error(str(model), path)
    if path.is_dir():
        return load_transformers_folder(path)
    if path.suffix.lower() == ".pt2":
        return _load_exported_program(path)
    if is_torchscript_archive(path):
        return path
    return load_pickled_module(path, allow_pickle=allow_pickle)


def _missing_path_error(text: str, path: Path) -> ModelLoadError:
    if path.suffix.lower() not in (*PICKLE_SUFFIXES, ".pt2", ".jit") and _HUB_ID.match(text):
        return ModelLoadError(
            f"'{text}' is not a local file or folder; it looks like a model hub id, and hub downloads "
            "are not available (the compiler works offline).",
            hint="Download the model elsewhere (e.g. `huggingface-cli download`), copy the folder with "
                 "config.json and the weights here, and pass that folder.", file=text)
    return ModelLoadError(f"Model file '{path}' does not exist.", hint="Check the path.", file=str(path))


def is_torchscript_archive(path: Path) -> bool:
    """True for a ``torch.jit.save`` zip (it holds compiled ``code/`` and ``constants.pkl``)."""
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return any(name.endswith("/constants.pkl") or "/code/" in name for name in archive.namelist())


def _load_exported_program(path: Path):
    import torch

    try:
        return torch.export.load(str(path))
    except Exception as error:  # torch raises assorted errors for bad or foreign archives
        raise ModelLoadError(f"'{path.name}' cannot be read as a torch.export program: {exporter_reason(error)}",
                             hint="Save it with torch.export.save(torch.export.export(model, args), path).",
                             file=str(path)) from error


def load_pickled_module(path: Path, *, allow_pickle: bool = False):
    """Load a ``torch.save``'d module; the weights-only loader is tried first, unpickling only if allowed.

    Raises:
        ArgumentError: the file needs unpickling and ``allow_pickle`` is false.
        ModelLoadError: the file is unreadable or holds a state dict or another non-module object.
    """
    import torch

    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:  # holds Python objects beyond tensors: a pickled module
        if not allow_pickle:
            raise ArgumentError(
                f"'{path.name}' is a pickled Python object (a whole module), and loading it executes "
                "code stored in the file.",
                hint="If you trust the file, pass allow_pickle=True (command line: --allow-pickle); safer: "
                     "save the model with torch.export.save(...) as .pt2.", file=str(path),
                needs_allow_pickle=True) from error
        loaded = _unpickle(path)
    except Exception as error:  # truncated zip, not a torch file ...
        raise ModelLoadError(f"'{path.name}' cannot be read by torch.load: {exporter_reason(error)}",
                             hint="Check that the file is complete and was written by torch.save.",
                             file=str(path)) from error
    return _module_in(loaded, path)


def _unpickle(path: Path):
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:  # the pickle may reference classes that cannot be imported here
        raise ModelLoadError(f"Unpickling '{path.name}' failed: {exporter_reason(error)}",
                             hint="The classes the module was built from must be importable "
                                  "(same package and module names as when it was saved).",
                             file=str(path)) from error


def _module_in(loaded: Any, path: Path):
    import torch

    if isinstance(loaded, torch.nn.Module):
        return loaded.eval()
    if isinstance(loaded, Mapping):
        for key in ("model", "ema", "module"):  # training checkpoints that embed the whole module
            if isinstance(loaded.get(key), torch.nn.Module):
                logger.info("%s: using the module stored under '%s'", path.name, key)
                return loaded[key].eval()
        tensors = [key for key, value in loaded.items() if isinstance(value, torch.Tensor)]
        nested = [key for key in ("state_dict", "model_state_dict") if key in loaded]
        if tensors or nested:
            example = ", ".join(map(str, tensors[:3])) or nested[0]
            raise ModelLoadError(
                f"'{path.name}' holds a state dict (weights only, e.g. {example}): it has no architecture "
                "to compile.",
                hint="Build the model in Python, call load_state_dict(), and pass the module with "
                     "feed_dict; or save it with torch.export.save(...) as .pt2.", file=str(path))
    raise ModelLoadError(f"'{path.name}' holds a {type(loaded).__name__}, not a torch module.",
                         hint="Save the module itself (torch.save(module)) or export it to .pt2.", file=str(path))


def load_transformers_folder(path: Path):
    """``AutoModel.from_pretrained(path, local_files_only=True)`` in eval mode."""
    try:
        import transformers
    except ImportError as error:
        raise ModelLoadError(f"'{path}' is a folder, which needs the transformers package.",
                             hint="pip install transformers", file=str(path)) from error
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"Folder '{path}' has no config.json, so it is not a transformers model.",
                             hint="Pass the folder holding config.json and the weights, or a model file.",
                             file=str(path))
    try:
        return _architecture_class(transformers, path).from_pretrained(str(path), local_files_only=True).eval()
    except Exception as error:  # missing weights, unknown architecture, ...
        raise ModelLoadError(f"transformers cannot load '{path}': {exporter_reason(error)}",
                             hint="The folder needs config.json and the weights (model.safetensors or "
                                  "pytorch_model.bin) of a supported architecture.", file=str(path)) from error


def _architecture_class(transformers: Any, path: Path) -> Any:
    """The class ``config.json`` names (``ViTForImageClassification`` keeps its head), else ``AutoModel``."""
    try:
        architectures = json.loads((path / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        architectures = []
    for name in architectures:
        cls = getattr(transformers, str(name), None)
        if cls is not None:
            return cls
    return transformers.AutoModel


def _is_transformers_model(module: Any) -> bool:
    return any(cls.__module__.startswith("transformers.") and cls.__name__ == "PreTrainedModel"
               for cls in type(module).__mro__)


# -- example inputs ------------------------------------------------------------------------------


def forward_signature(module: Any) -> inspect.Signature:
    """The signature of ``module.forward`` (``self`` excluded)."""
    return inspect.signature(module.forward)


def signature_text(signature: inspect.Signature) -> str:
    """``forward(image, scale=2.0, **kwargs)``: names and defaults, as shown in error messages."""
    def text(parameter: inspect.Parameter) -> str:
        prefix = {parameter.VAR_POSITIONAL: "*", parameter.VAR_KEYWORD: "**"}.get(parameter.kind, "")
        default = "" if parameter.default is parameter.empty else f"={parameter.default!r}"
        return f"{prefix}{parameter.name}{default}"
    return f"forward({', '.join(text(p) for p in signature.parameters.values())})"


def validated_feed(module: Any, feed_dict: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Check ``feed_dict`` against ``forward`` and split it into tensors and constants, in parameter order.

    Raises:
        ArgumentError: unknown or missing names, or values that are neither tensors nor scalars.
    """
    signature = forward_signature(module)
    named = [p for p in signature.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    takes_extra = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    takes_extra = takes_extra and not _is_transformers_model(module)  # its **kwargs are options, not inputs
    problems = _feed_problems(named, feed_dict, takes_extra)
    if problems:
        raise ArgumentError(f"feed_dict does not match {type(module).__name__}.forward: {'; '.join(problems)}.",
                            hint=f"{signature_text(signature)} — key feed_dict by these parameter names.")
    order = [p.name for p in named] + [name for name in feed_dict if name not in signature.parameters]
    tensors, constants = {}, {}
    for name in (name for name in order if name in feed_dict):
        value = feed_dict[name]
        if isinstance(value, (bool, int, float)):
            constants[name] = value
        else:
            tensors[name] = _as_tensor(value)
    return tensors, constants


def _feed_problems(named: list[inspect.Parameter], feed_dict: Mapping[str, Any], takes_extra: bool) -> list[str]:
    names = {p.name for p in named}
    unknown = [name for name in feed_dict if name not in names and not takes_extra]
    missing = [p.name for p in named if p.default is p.empty and p.name not in feed_dict]
    wrong = [f"{name} ({type(value).__name__})" for name, value in feed_dict.items()
             if not _is_feedable(value)]
    problems = []
    if unknown:
        problems.append(f"unknown argument(s) {', '.join(unknown)}")
    if missing:
        problems.append(f"missing required argument(s) {', '.join(missing)}")
    if wrong:
        problems.append(f"not a tensor, array or scalar: {', '.join(wrong)}")
    return problems


def _is_feedable(value: Any) -> bool:
    import torch

    return isinstance(value, (torch.Tensor, np.ndarray, np.generic, bool, int, float))


def _as_tensor(value: Any):
    import torch

    return value if isinstance(value, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(value))


def _default_shapes(module: Any) -> dict[str, list[int]]:
    """Shapes a transformers vision config fixes (``pixel_values`` from image_size, num_channels), else {}."""
    config = getattr(module, "config", None) if _is_transformers_model(module) else None
    size, channels = getattr(config, "image_size", None), getattr(config, "num_channels", None)
    if "pixel_values" not in forward_signature(module).parameters or not isinstance(channels, int):
        return {}
    if isinstance(size, int):
        size = (size, size)
    if not (isinstance(size, (list, tuple)) and len(size) == 2 and all(isinstance(d, int) for d in size)):
        return {}
    return {"pixel_values": [1, channels, *size]}


_MODEL_INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids", "pixel_values", "input_values",
                      "input_features", "x", "input", "image", "images")
"""Parameters asked for first when every parameter of ``forward`` has a default (transformers models)."""


def _inputs_to_ask(module: Any) -> list[dict[str, Any]]:
    """``{"name", "type", "optional"}`` of the forward parameters a user gives shapes or values for.

    The required ones; when every one has a default (``input_ids=None`` ...), the usual model inputs among
    them, the first required and the others optional, else the first two.
    """
    parameters = [p for p in forward_signature(module).parameters.values()
                  if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    required = [p for p in parameters if p.default is p.empty]
    if required:
        return [{"name": p.name, "type": _annotation_text(p), "optional": False} for p in required]
    chosen = [p for p in parameters if p.name in _MODEL_INPUT_NAMES] or parameters[:2]
    return [{"name": p.name, "type": _annotation_text(p), "optional": index > 0} for index, p in enumerate(chosen)]


def _annotation_text(parameter: inspect.Parameter) -> str:
    """``Tensor``, ``int`` ... for a forward parameter (``Tensor`` when it has no annotation)."""
    annotation = parameter.annotation
    if annotation is parameter.empty:
        return "Tensor"
    if isinstance(annotation, str):  # postponed annotations (from __future__ import annotations)
        return annotation.replace("torch.", "")
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "").replace("torch.", "")


def _made_up_feed(module: Any, input_shape_dict: Mapping[str, Any] | None) -> dict[str, Any]:
    """Example inputs from shapes: int64 ids/masks for transformers models, seeded float32 noise otherwise."""
    input_shape_dict = input_shape_dict or _default_shapes(module)
    if not input_shape_dict:
        names = [p.name for p in forward_signature(module).parameters.values()
                 if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)][:2]
        example = " ".join(f"--input-shape {name}=1,128" for name in names)
        raise ArgumentError(
            f"Exporting {type(module).__name__} needs example inputs: their shapes, or the inputs themselves.",
            hint=f"Give the shapes of forward's inputs ({signature_text(forward_signature(module))}): on the "
                 f"command line e.g. {example}; in Python input_shape_dict={{...}} or feed_dict={{...}}.",
            inputs_needed=_inputs_to_ask(module))
    import torch

    generator = torch.Generator().manual_seed(0)
    is_text = _is_transformers_model(module)
    vocabulary = int(getattr(getattr(module, "config", None), "vocab_size", 0) or 2000)
    high = min(2000, vocabulary)
    feed = {}
    for name, shape in input_shape_dict.items():
        shape = [int(dim) for dim in shape]
        if is_text and name.endswith("mask"):
            feed[name] = torch.ones(shape, dtype=torch.int64)
        elif is_text and name.endswith("ids"):
            feed[name] = torch.zeros(shape, dtype=torch.int64) if "type" in name else \
                torch.randint(high // 2, high, shape, generator=generator)  # ordinary tokens, within the vocabulary
        else:
            feed[name] = torch.randn(shape, generator=generator)
    return feed


# -- export --------------------------------------------------------------------------------------


def _output_tensors(outputs: Any) -> tuple[list[str], tuple]:
    """The tensors to export from what ``forward`` returned, with their names (see module docstring)."""
    import torch

    if isinstance(outputs, torch.Tensor):
        return ["output"], (outputs,)
    if isinstance(outputs, Mapping):
        tensors = [key for key, value in outputs.items() if isinstance(value, torch.Tensor)]
        primary = next((key for key in _HF_PRIMARY_OUTPUTS if key in tensors), None) if _is_model_output(outputs) else None
        companions = [key for key in _HF_COMPANION_OUTPUTS if key in tensors] if primary == "logits" else []
        keys = [primary, *companions] if primary else tensors
        return [str(key) for key in keys], tuple(outputs[key] for key in keys)
    flat = tuple(_flatten_tensors(outputs))
    if len(flat) == 1:
        return ["output"], flat
    return [f"output_{index}" for index in range(len(flat))], flat


def _is_model_output(outputs: Any) -> bool:
    """A transformers ``ModelOutput`` (exported as its primary entry), not a mapping of the user's own."""
    return type(outputs).__module__.split(".")[0] == "transformers"


def _dropped_outputs(outputs: Any) -> list[str]:
    """The tensor entries of a ``ModelOutput`` that :func:`_output_tensors` leaves out."""
    import torch

    if not isinstance(outputs, Mapping):
        return []
    kept = set(_output_tensors(outputs)[0])
    return [str(key) for key, value in outputs.items() if isinstance(value, torch.Tensor) and str(key) not in kept]


def _flatten_tensors(value: Any):
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _flatten_tensors(item)
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _flatten_tensors(item)


def _make_wrapper(module: Any, names: list[str], constants: dict[str, Any]):
    """A module whose positional inputs are ``module``'s keyword inputs and whose outputs are tensors."""
    import torch

    class KeywordInputs(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            setattr(self, _WRAPPED, module)

        def forward(self, *tensors):
            outputs = getattr(self, _WRAPPED)(**dict(zip(names, tensors)), **constants)
            return _output_tensors(outputs)[1]

    return KeywordInputs().eval()


def export_module(module: Any, feed_dict: Mapping[str, Any], *, dynamic_axes: Mapping[str, Any] | None = None
                  ) -> ir.Model:
    """Export ``module(**feed_dict)``: dynamo first, the legacy exporter as fallback.

    Raises:
        ArgumentError: ``feed_dict`` does not match ``forward``.
        ModelLoadError: ``forward`` fails on the inputs, or neither exporter can convert the model.
    """
    import torch

    tensors, constants = validated_feed(module, feed_dict)
    try:
        with torch.no_grad():
            outputs = module(**tensors, **constants)
        output_names, _ = _output_tensors(outputs)
    except Exception as error:  # whatever the user's forward raises
        raise ModelLoadError(f"{type(module).__name__}.forward failed on the example inputs: "
                             f"{exporter_reason(error)}",
                             hint="Check the shapes and dtypes in feed_dict.") from error
    if dropped := _dropped_outputs(outputs):
        logger.warning("%s returns a %s: exporting its %s only, not %s; wrap the model to return the outputs you need.",
                       type(module).__name__, type(outputs).__name__, " and ".join(output_names), ", ".join(dropped))
    wrapper = _make_wrapper(module, list(tensors), constants)
    args, name = tuple(tensors.values()), type(module).__name__
    previous = _use_eager_attention(module)
    try:
        return _export_with_fallback(wrapper, args, list(tensors), output_names, dynamic_axes, name=name)
    finally:
        if previous is not None:
            _restore_attention(module, previous)


def _restore_attention(module: Any, previous: str) -> None:
    """Give the caller's module back the attention it had; a model that cannot switch back keeps eager attention.

    A composite model (DETR with a ResNet backbone) reports ``sdpa`` but refuses to be set to it again, because
    a submodule has no SDPA path: the export has succeeded by then, so this is no reason to fail it.
    """
    try:
        module.set_attn_implementation(previous)
    except Exception as error:  # transformers raises ValueError/ImportError for an unsupported implementation
        logger.info("%s keeps eager attention (switching back to %s failed: %s)", type(module).__name__, previous,
                    exporter_reason(error, max_lines=1))


def _use_eager_attention(module: Any) -> str | None:
    """Switch a transformers model to its plain MatMul/Softmax attention; the one it had, None when no switch.

    The export traces the eager attention: some architectures (e.g. Swin) export only with it (their SDPA
    path hands the exporter a transposed tensor that it cannot ``view``), and a failed export leaves the
    model in a state where switching afterwards no longer helps.
    """
    if not _is_transformers_model(module):
        return None
    previous = getattr(getattr(module, "config", None), "_attn_implementation", None) or "eager"
    if previous == "eager":
        return None
    try:
        module.set_attn_implementation("eager")
    except Exception as error:  # an architecture without an eager path, or an old transformers
        logger.info("%s cannot switch to eager attention: %s", type(module).__name__, exporter_reason(error))
        return None
    return str(previous)


def export_graph(module: Any, args: tuple, input_names: list[str], output_names: list[str], *, name: str
                 ) -> ir.Model:
    """Export ``module(*args)`` with fixed shapes and the given input/output names (dynamo, legacy fallback).

    For modules whose ``forward`` takes positional tensors (the LLM graphs); nodes get their module paths.

    Raises:
        ModelLoadError: neither exporter can convert the module.
    """
    model = _export_with_fallback(module, args, input_names, output_names, None, name=name)
    record_module_paths(model)
    return model


def _export_program(program: Any, feed_dict: Mapping[str, Any] | None, dynamic_axes: Any) -> ir.Model:
    """Export an ``ExportedProgram``; the legacy fallback traces ``program.module()`` on its example inputs."""
    try:
        return _export_dynamo(program, (), None, None, None)
    except Exception as error:  # the exporter raises many unrelated types
        reason = exporter_reason(error)
        if feed_dict is None and program.example_inputs is None:
            raise ModelLoadError(f"The dynamo exporter cannot convert the program: {reason}",
                                 hint=_EXPORT_HINT) from error
        logger.warning("The dynamo exporter failed (%s); retrying with the legacy TorchScript exporter.", reason)
    args = tuple(_as_tensor(v) for v in feed_dict.values()) if feed_dict else program.example_inputs[0]
    return _export_legacy_or_raise(program.module(), args, None, None, dynamic_axes, reason, "the program")


_EXPORT_HINT = ("Make forward traceable: no Python branches on tensor values (use torch.where / torch.cond), "
                "no .item()/.numpy(); or export it yourself to .onnx and use --backend onnx.")


def _export_with_fallback(wrapper, args, input_names, output_names, dynamic_axes, *, name: str) -> ir.Model:
    try:
        model = _export_dynamo(wrapper, args, input_names, output_names, dynamic_axes)
        logger.info("%s: exported with the dynamo exporter (opset %d)", name, DYNAMO_OPSET)
        return _keep_input_names(model, input_names)
    except Exception as error:  # the exporter raises many unrelated types
        reason = exporter_reason(error)
    logger.warning("The dynamo exporter failed on %s (%s); retrying with the legacy TorchScript exporter.",
                   name, reason)
    model = _export_legacy_or_raise(wrapper, args, input_names, output_names, dynamic_axes, reason, name)
    return _keep_input_names(model, input_names)


def _keep_input_names(model: ir.Model, input_names: list[str] | None) -> ir.Model:
    """Give back the inputs ``forward`` returns as they are their parameter names.

    An input that is also an output is one value, and the exporter names it after the output
    (``output_1``): the user would have to feed ``output_1``. The output becomes an ``Identity`` of the input.
    """
    graph = model.graph
    for value, name in zip(list(graph.inputs), input_names or []):
        if value.name == name:
            continue
        copy = ir.node("Identity", [value], name=f"{name}_returned")
        copy.outputs[0].name, value.name = value.name, name
        copy.outputs[0].shape, copy.outputs[0].type = value.shape, value.type
        graph.insert_before(graph[0], copy) if len(graph) else graph.append(copy)
        for index, output in enumerate(graph.outputs):
            if output is value:
                graph.outputs[index] = copy.outputs[0]
    return model


def _export_legacy_or_raise(module, args, input_names, output_names, dynamic_axes, dynamo_reason, name):
    try:
        model = export_legacy(module, args, input_names, output_names, dynamic_axes)
    except Exception as error:  # TorchScript tracing/symbolic errors, or our specialization check
        raise ModelLoadError(
            f"Neither PyTorch ONNX exporter can convert {name}. Dynamo exporter: {_sentence(dynamo_reason)} "
            f"Legacy exporter: {_sentence(exporter_reason(error))}", hint=_EXPORT_HINT) from error
    logger.info("%s: exported with the legacy TorchScript exporter (opset %d)", name, LEGACY_OPSET)
    return model


def _export_dynamo(model, args, input_names, output_names, dynamic_axes) -> ir.Model:
    import torch

    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registration.level
    registration.setLevel(logging.ERROR)  # "torchvision is not installed. Skipping torchvision::roi_align" x3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch-internal pytree deprecations
        try:
            program = torch.onnx.export(
                model, args, None, dynamo=True, opset_version=DYNAMO_OPSET, input_names=input_names,
                output_names=output_names, dynamic_shapes=_dynamic_shapes(input_names, dynamic_axes),
                optimize=False, verbose=False)
        finally:
            registration.setLevel(level)
    return program.model


def _dynamic_shapes(input_names: list[str] | None, dynamic_axes: Mapping[str, Any] | None):
    """``dynamic_axes`` as ``torch.export`` dynamic shapes for the wrapper's ``forward(*tensors)``.

    ``Dim.AUTO`` keeps a dimension dynamic where the trace allows it and static otherwise (a batch of
    1 in the example specializes): the MBLT pins every shape anyway.
    """
    if not dynamic_axes or not input_names:
        return None
    import torch

    def spec(name: str):
        axes = dynamic_axes.get(name)
        return {int(axis): torch.export.Dim.AUTO for axis in axes} if axes else None
    return (tuple(spec(name) for name in input_names),)


def export_legacy(module, args, input_names, output_names, dynamic_axes, *, opset_version: int = LEGACY_OPSET
                  ) -> ir.Model:
    """Export with the TorchScript exporter (tracing, or the script of a ``ScriptModule``) to onnx-ir.

    Raises:
        TraceSpecializationError: tracing turned a tensor into a Python boolean.
    """
    import torch

    buffer = io.BytesIO()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("ignore", DeprecationWarning)  # "legacy exporter": we chose it on purpose
        warnings.simplefilter("always", torch.jit.TracerWarning)
        torch.onnx.export(module, args, buffer, dynamo=False, opset_version=opset_version,
                          input_names=input_names, output_names=output_names, dynamic_axes=dynamic_axes)
    _check_tracer_warnings([w for w in caught if issubclass(w.category, torch.jit.TracerWarning)])
    return ir.serde.deserialize_model(onnx.load_from_string(buffer.getvalue()))


def _check_tracer_warnings(caught: list[warnings.WarningMessage]) -> None:
    branches = [f"{Path(w.filename).name}:{w.lineno}" for w in caught if "Python boolean" in str(w.message)]
    if branches:
        raise TraceSpecializationError(
            f"tracing branched on tensor values at {', '.join(dict.fromkeys(branches))}; the trace would keep "
            "only the branch taken for the example inputs")
    for warning in caught:
        logger.warning("Legacy exporter: %s (%s:%d)", _first_line(str(warning.message)),
                       Path(warning.filename).name, warning.lineno)


def exporter_reason(error: BaseException, max_lines: int = 3) -> str:
    """The innermost cause of an exporter error, its first lines, and the user code line it came from."""
    root = error
    while root.__cause__ is not None and root.__cause__ is not root:
        root = root.__cause__
    text = _CAUSED_BY.sub("", _ANSI.sub("", str(root)))
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    text = f"{type(root).__name__}: {' '.join(lines[:max_lines]) or '(no message)'}"
    where = _user_frame(root)
    return f"{text} (at {where})" if where else text


_CAUSED_BY = re.compile(r"\s*\[Caused by the value .*?\.\]", re.DOTALL)
"""The TorchScript exporter's dump of the graph value behind a ``SymbolicValueError`` (its internal numbering)."""


def _user_frame(error: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(error.__traceback__) if not _is_library_file(f.filename)]
    if not frames:
        return ""
    frame = frames[-1]
    return f"{Path(frame.filename).name}:{frame.lineno}: {(frame.line or '').strip()}".rstrip(": ")


def _is_library_file(filename: str) -> bool:
    return any(part in filename for part in ("/torch/", "/transformers/", "/onnxscript/", "/compiler_core/",
                                              "<frozen", "/contextlib.py", "/functools.py"))


# -- provenance ----------------------------------------------------------------------------------


def record_module_paths(model: ir.Model, *, root: str = "") -> None:
    """Set each node's ``mblt.source_name`` to the module path the exporter recorded for it.

    The dynamo exporter writes ``pkg.torch.onnx.name_scopes`` (``['', 'features', 'features.0', ...,
    'conv2d']``: module paths, then the FX node); the legacy exporter encodes scopes in node names
    (``/features/features.0/features.0.0/Conv``). The export wrapper's scope is stripped. ``root`` is
    the path of the exported module inside a larger one (a TorchScript submodule): it prefixes every
    path, and names the nodes of the module's own forward.
    """
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        path = _dynamo_module_path(node) or _legacy_module_path(node.name or "")
        if path or root:
            node.metadata_props[SOURCE_NAME_KEY] = ".".join(part for part in (root, path) if part)


def _dynamo_module_path(node: ir.Node) -> str:
    text = node.metadata_props.get("pkg.torch.onnx.name_scopes")
    if not text:
        return ""
    try:
        scopes = [s for s in ast.literal_eval(text) if isinstance(s, str)]
    except (ValueError, SyntaxError):
        return ""
    modules = [_unwrapped(s) for s in scopes[:-1]]
    modules = [s for s in modules if s]
    return modules[-1] if modules else (scopes[-1] if scopes else "")


def _legacy_module_path(name: str) -> str:
    parts = [part for part in name.split("/") if part][:-1]  # the last part is the op
    path = ""
    for part in parts:  # traced scopes are full paths ('features.0'); scripted ones are attribute names
        path = part if not path or part.startswith(path + ".") else f"{path}.{part}"
    return _unwrapped(path)


def _unwrapped(path: str) -> str:
    if path == _WRAPPED:
        return ""
    return path[len(_WRAPPED) + 1:] if path.startswith(_WRAPPED + ".") else path


def _sentence(text: str) -> str:
    return text if text.endswith(".") else f"{text}."


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0] if lines else ""


# -- GUI -----------------------------------------------------------------------------------------


def describe_requirements(path: str | Path) -> dict[str, Any]:
    """What the torch backend needs to parse ``path``, for the GUI; never unpickles anything.

    Returns:
        ``{"backend", "kind", "needs_feed_dict", "needs_allow_pickle", "inputs", "note"}`` where
        ``kind`` is ``exported_program``, ``transformers``, ``pickled_module``, ``state_dict``,
        ``hub_id``, ``missing`` or ``unreadable`` (a TorchScript archive gets the torchscript
        backend's description), and ``inputs`` lists
        ``{"name", "dtype", "shape"}`` when they can be read without running the model.
    """
    path = Path(path)
    info = {"backend": "torch", "kind": "unreadable", "needs_feed_dict": True, "needs_allow_pickle": False,
            "inputs": [], "note": ""}
    try:
        if not path.exists():
            error = _missing_path_error(str(path), path)
            info.update(kind="hub_id" if "hub" in error.message else "missing", note=str(error))
        elif path.is_dir():
            info.update(kind="transformers", inputs=_transformers_inputs(path),
                        note="Give feed_dict (tokenized text) or input_shape_dict.")
        elif path.suffix.lower() == ".pt2":
            info.update(kind="exported_program", needs_feed_dict=False, inputs=_program_inputs(path))
        elif is_torchscript_archive(path):
            from compiler_core.frontends.torchscript import describe_requirements as describe_script

            return describe_script(path)
        else:
            info.update(_describe_pickle(path))
    except Exception as error:  # the GUI shows the reason instead of failing
        info["note"] = exporter_reason(error)
    return info


def _describe_pickle(path: Path) -> dict[str, Any]:
    import torch

    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        return {"kind": "pickled_module", "needs_allow_pickle": True,
                "note": "Loading executes code from the file; allow it only for trusted files. Give feed_dict."}
    if isinstance(loaded, Mapping):
        return {"kind": "state_dict", "note": "Weights only: no architecture to compile."}
    return {"note": f"Holds a {type(loaded).__name__}, not a module."}


def _program_inputs(path: Path) -> list[dict[str, Any]]:
    import torch

    program = torch.export.load(str(path))
    inputs = []
    for spec in program.graph_signature.input_specs:
        if spec.kind == torch.export.graph_signature.InputKind.USER_INPUT:
            value = next(n for n in program.graph.nodes if n.name == spec.arg.name).meta.get("val")
            inputs.append({"name": spec.arg.name, "dtype": str(getattr(value, "dtype", "")).replace("torch.", ""),
                           "shape": [int(d) if str(d).isdigit() else str(d) for d in getattr(value, "shape", [])]})
    return inputs


def _transformers_inputs(path: Path) -> list[dict[str, Any]]:
    import json

    tokenizer_config = path / "tokenizer_config.json"
    names = json.loads(tokenizer_config.read_text()).get("model_input_names") if tokenizer_config.is_file() else None
    if not names:
        config = json.loads((path / "config.json").read_text())
        names = ["input_ids", "attention_mask"] + (["token_type_ids"] if config.get("type_vocab_size") else [])
    return [{"name": name, "dtype": "int64", "shape": ["batch", "sequence"]} for name in names]
