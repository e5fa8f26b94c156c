"""TorchScript frontend: ``torch.jit`` archives (scripted or traced, ``.pt``/``.jit``) -> ONNX.

A ``ScriptModule`` is exported with the legacy TorchScript exporter, which converts its script
(control flow included, as ``If``/``Loop``) rather than re-tracing it. Example inputs are taken from
``feed_dict`` or made up from ``input_shape_dict``: float32 noise, or int64 zeros for inputs that the
(inlined) graph uses as indices (embeddings, gathers). Python scalar arguments (``sr: int``) are
exported as inputs, then bound to the given value as constants, so canonicalization can fold the
branches they select.

A ``forward`` that keeps Python-side state between calls (Silero VAD's top-level model carries its
context and LSTM state in attributes) cannot become a stateless graph; export its stateless core with
``submodule`` (Silero: ``submodule="_model"``, inputs ``x`` [B, 576] and ``state`` [2, B, 128]).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from compiler_core.errors import ArgumentError, ModelLoadError, QBCompilerError
from compiler_core.frontends.torch import export_legacy, exporter_reason, record_module_paths

logger = logging.getLogger(__name__)

# (op, argument position) pairs whose argument is an index tensor: such inputs are made up as int64.
_INDEX_USES = frozenset({("aten::embedding", 1), ("aten::embedding_bag", 1), ("aten::index_select", 2),
                         ("aten::gather", 2), ("aten::one_hot", 0), ("aten::take", 1)})
_SCALAR_TYPES = {"int": np.int64, "float": np.float32, "bool": np.bool_}


def load_torchscript(
    model: Any,
    *,
    feed_dict: Mapping[str, Any] | None = None,
    input_shape_dict: Mapping[str, Any] | None = None,
    submodule: str | None = None,
    **_: Any,
) -> ir.Model:
    """Export a TorchScript module to an in-memory ONNX graph.

    Args:
        model: Path to a ``torch.jit.save`` archive, or a loaded ``torch.jit.ScriptModule``.
        feed_dict: Example inputs by ``forward`` parameter name: tensors or arrays, and Python
            scalars for ``int``/``float``/``bool`` parameters (bound as constants).
        input_shape_dict: Shapes of tensor inputs missing from ``feed_dict`` (made-up values).
        submodule: Dotted attribute path of a child module to export instead of the whole module.

    Returns:
        The ONNX graph; each node's ``mblt.source_name`` is its module path.

    Raises:
        ArgumentError: unknown or missing inputs, or an unknown ``submodule``.
        ModelLoadError: the archive cannot be loaded, or the exporter cannot convert the module.
    """
    script = load_script_module(model)
    target = find_submodule(script, submodule) if submodule else script
    parameters = script_parameters(target)
    args, names, constants = example_arguments(target, parameters, feed_dict or {}, input_shape_dict or {})
    try:
        onnx_model = export_legacy(target, args, names, None, None)
    except Exception as error:  # TorchScript-to-ONNX conversion raises many unrelated types
        raise ModelLoadError(f"The TorchScript exporter cannot convert {_title(target, submodule)}: "
                             f"{exporter_reason(error)}", hint=_failure_hint(script, submodule),
                             submodules=None if submodule else _children(script) or None) from error
    _bind_constants(onnx_model, constants)
    _name_outputs(onnx_model)
    record_module_paths(onnx_model, root=submodule or "")
    return onnx_model


def _name_outputs(model: ir.Model) -> None:
    """Call outputs the exporter named by the script's value numbers (``206``) ``output`` / ``output_<i>``: those
    names reach the user in the workbench, the analysis and ``qbcompiler run``."""
    outputs = model.graph.outputs
    taken = {value.name for value in model.graph.inputs} | set(model.graph.initializers)
    taken |= {value.name for node in model.graph for value in node.outputs}
    for index, value in enumerate(outputs):
        name = "output" if len(outputs) == 1 else f"output_{index}"
        if value.name and value.name.isdigit() and name not in taken:
            value.name = name


def load_script_module(model: Any):
    """A ``ScriptModule`` in eval mode from a path or a loaded module.

    Raises:
        ArgumentError: ``model`` is neither a path nor a ScriptModule.
        ModelLoadError: the file is missing or not a TorchScript archive.
    """
    import torch

    if isinstance(model, torch.jit.ScriptModule):
        return model.eval()
    if not isinstance(model, (str, Path)):
        raise ArgumentError(f"The torchscript backend cannot use a {type(model).__name__}.",
                            hint="Pass a torch.jit.save archive (.pt/.jit) or a torch.jit.ScriptModule; "
                                 "for a plain torch.nn.Module use backend 'torch'.")
    path = Path(model)
    if not path.is_file():
        raise ModelLoadError(f"Model file '{path}' does not exist.", hint="Check the path.", file=str(path))
    try:
        return torch.jit.load(str(path), map_location="cpu").eval()
    except Exception as error:  # RuntimeError for non-TorchScript zips, pickles, truncated files
        raise ModelLoadError(f"'{path.name}' is not a TorchScript archive: {exporter_reason(error)}",
                             hint="Save with torch.jit.save(torch.jit.script(model) or torch.jit.trace(...)); "
                                  "for torch.save'd modules or .pt2 programs use backend 'torch'.",
                             file=str(path)) from error


def find_submodule(script: Any, dotted: str):
    """The child module at ``dotted`` (``"_model"``, ``"encoder.0"``).

    Raises:
        ArgumentError: no such child.
    """
    module = script
    for part in dotted.split("."):
        children = dict(module.named_children())
        if part not in children:
            raise ArgumentError(f"The module has no submodule '{dotted}'.",
                                hint=f"Children of the top-level module: {', '.join(_children(script)) or 'none'}.")
        module = children[part]
    return module


def script_parameters(module: Any) -> list[dict[str, Any]]:
    """``forward``'s parameters (``self`` excluded): ``{"name", "type", "has_default", "default"}``."""
    return [{"name": arg.name, "type": str(arg.type), "has_default": arg.has_default_value(),
             "default": arg.default_value if arg.has_default_value() else None}
            for arg in module.forward.schema.arguments[1:]]


def signature_text(parameters: list[dict[str, Any]]) -> str:
    """``forward(x: Tensor, sr: int)``, as shown in error messages."""
    return "forward(" + ", ".join(f"{p['name']}: {p['type']}" + ("=..." if p["has_default"] else "")
                                  for p in parameters) + ")"


# -- example inputs ------------------------------------------------------------------------------


def example_arguments(module: Any, parameters: list[dict[str, Any]], feed_dict: Mapping[str, Any],
                      input_shape_dict: Mapping[str, Any]) -> tuple[tuple, list[str], dict[str, Any]]:
    """Positional example arguments, their input names, and the scalar arguments to bind as constants.

    Arguments after the last given one are left to their defaults.

    Raises:
        ArgumentError: a name matches no parameter, or a parameter without default has no value.
    """
    names = [p["name"] for p in parameters]
    _check_names(names, feed_dict, input_shape_dict, parameters)
    given = [i for i, name in enumerate(names) if name in feed_dict or name in input_shape_dict]
    used = parameters[:given[-1] + 1] if given else []
    missing = [p for p in parameters if _value_missing(p, feed_dict, input_shape_dict)]
    if missing:
        raise ArgumentError(
            f"forward needs a value for {', '.join(p['name'] for p in missing)}.",
            hint=f"{signature_text(parameters)}: give each tensor's shape and each scalar's value "
                 f"(command line: {_command_line_example(missing)}; Python: input_shape_dict, constant_inputs).",
            inputs_needed=[{"name": p["name"], "type": p["type"], "optional": p["has_default"]}
                           for p in parameters if p in missing or (p["has_default"] and "Tensor" in p["type"])])
    dtypes = _index_inputs(module)
    args = tuple(_argument(p, feed_dict, input_shape_dict, dtypes) for p in used)
    constants = {p["name"]: feed_dict[p["name"]] for p in used
                 if p["name"] in feed_dict and isinstance(feed_dict[p["name"]], (bool, int, float))}
    return args, [p["name"] for p in used], constants


def _command_line_example(parameters: list[dict[str, Any]]) -> str:
    """``--input-shape x=DIMS --bind-input sr=VALUE`` for these parameters (tensors get a shape, others a value)."""
    options = [f"--input-shape {p['name']}=DIMS" if "Tensor" in p["type"] else f"--bind-input {p['name']}=VALUE"
               for p in parameters]
    shapes = " with DIMS such as 1,3,224,224" if any("Tensor" in p["type"] for p in parameters) else ""
    return " ".join(options) + shapes


def _check_names(names: list[str], feed_dict: Mapping[str, Any], input_shape_dict: Mapping[str, Any],
                 parameters: list[dict[str, Any]]) -> None:
    unknown = [name for name in [*feed_dict, *input_shape_dict] if name not in names]
    if unknown:
        raise ArgumentError(f"Unknown input name(s) {', '.join(dict.fromkeys(unknown))}.",
                            hint=f"The module takes {signature_text(parameters)}.")


def _value_missing(parameter: dict[str, Any], feed_dict: Mapping[str, Any], input_shape_dict: Mapping[str, Any]
                   ) -> bool:
    name = parameter["name"]
    return not parameter["has_default"] and name not in feed_dict and name not in input_shape_dict


def _argument(parameter: dict[str, Any], feed_dict: Mapping[str, Any], input_shape_dict: Mapping[str, Any],
              index_inputs: set[str]):
    import torch

    name, kind = parameter["name"], parameter["type"]
    if name in feed_dict:
        value = feed_dict[name]
        if kind in _SCALAR_TYPES or isinstance(value, torch.Tensor):
            return value
        return torch.from_numpy(np.ascontiguousarray(value))
    if name in input_shape_dict:
        shape = [int(dim) for dim in input_shape_dict[name]]
        if name in index_inputs:
            return torch.zeros(shape, dtype=torch.int64)
        return torch.randn(shape, generator=torch.Generator().manual_seed(0))
    return parameter["default"]


def _index_inputs(module: Any) -> set[str]:
    """Names of inputs the inlined graph uses as indices (or typed as integer tensors)."""
    import torch

    graph = module.forward.graph.copy()
    torch._C._jit_pass_inline(graph)
    found = set()
    for value in list(graph.inputs())[1:]:
        if not isinstance(value.type(), torch._C.TensorType):
            continue
        typed = value.type().scalarType()
        if typed in ("Long", "Int") or any((use.user.kind(), use.offset) in _INDEX_USES for use in value.uses()):
            found.add(value.debugName().split(".")[0])
    return found


def _bind_constants(model: ir.Model, constants: Mapping[str, Any]) -> None:
    inputs = {value.name: value for value in model.graph.inputs}
    for name, scalar in constants.items():
        value = inputs.get(name)
        if value is None:  # the exporter dropped an unused argument
            continue
        model.graph.inputs.remove(value)
        dtype = value.dtype.numpy() if value.dtype is not None else _SCALAR_TYPES[type(scalar).__name__]
        value.const_value = ir.tensor(np.array(scalar, dtype=dtype), name=name)
        model.graph.register_initializer(value)
        logger.info("Bound scalar argument %s=%r as a constant", name, scalar)


# -- messages ------------------------------------------------------------------------------------


def _children(script: Any) -> list[str]:
    return [name for name, _ in script.named_children()]


def _title(target: Any, submodule: str | None) -> str:
    name = getattr(target, "original_name", type(target).__name__)
    return f"submodule '{submodule}' ({name})" if submodule else name


def _failure_hint(script: Any, submodule: str | None) -> str:
    children = _children(script)
    if submodule or not children:
        return "Simplify forward (no Python-side state or checks), or export the model to ONNX yourself."
    return ("A forward that keeps state in attributes or validates its inputs in Python may not convert; "
            f"export a stateless submodule instead (children: {', '.join(children)}; command line: "
            f"--submodule {children[0]}; Python: submodule=\"{children[0]}\").")


# -- GUI -----------------------------------------------------------------------------------------


def describe_requirements(path: str | Path, submodule: str | None = None) -> dict[str, Any]:
    """What the torchscript backend needs to parse ``path``, for the GUI.

    Returns:
        ``{"backend", "kind", "needs_feed_dict", "needs_input_shapes", "inputs", "submodules", "note"}``;
        ``inputs`` lists ``{"name", "type", "dtype", "required"}`` per ``forward`` parameter (dtype
        ``int64`` for index inputs, ``float32`` for other tensors, the Python type for scalars).
    """
    info: dict[str, Any] = {"backend": "torchscript", "kind": "torchscript", "needs_feed_dict": False,
                            "needs_input_shapes": False, "inputs": [], "submodules": [], "note": ""}
    try:
        script = load_script_module(path)
        target = find_submodule(script, submodule) if submodule else script
        index_inputs = _index_inputs(target)
        for parameter in script_parameters(target):
            info["inputs"].append(_describe_parameter(parameter, index_inputs))
    except QBCompilerError as error:  # not a readable archive, or no such submodule: the GUI shows why
        info.update(kind="unreadable", note=error.message)
        return info
    required = [entry for entry in info["inputs"] if entry["required"]]
    info["needs_feed_dict"] = any(entry["type"] != "Tensor" for entry in required)
    info["needs_input_shapes"] = any(entry["type"] == "Tensor" for entry in required)
    info["submodules"] = _children(script)
    return info


def _describe_parameter(parameter: dict[str, Any], index_inputs: set[str]) -> dict[str, Any]:
    kind = parameter["type"]
    dtype = ("int64" if parameter["name"] in index_inputs else "float32") if kind == "Tensor" else kind
    return {"name": parameter["name"], "type": kind, "dtype": dtype, "required": not parameter["has_default"]}
