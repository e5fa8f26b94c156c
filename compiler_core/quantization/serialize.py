"""QuantizedModel <-> (program document, named constant arrays): what the MXQ ``program`` and ``const`` hold.

The program document is JSON: the operation list (encoding ``qbops-1``) with constants referenced
by name, the frozen tensor parameters and the model interface. A later, tile-level encoding is
added beside it under another ``encoding`` key; readers pick the encodings they know.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from compiler_core.errors import MxqFormatError
from compiler_core.quantization.params import QuantParams, QuantState, TensorQuant
from compiler_core.quantization.program import IntOp, QuantizedModel, ValueSpec

OPS_ENCODING = "qbops-1"


def to_document(model: QuantizedModel) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The JSON program document and the constant arrays it references."""
    consts: dict[str, np.ndarray] = {}
    ops = []
    for index, op in enumerate(model.ops):
        refs = {}
        for key, array in op.consts.items():
            name = f"op{index}.{key}"
            consts[name] = np.asarray(array, order="C")  # ascontiguousarray would make 0-d arrays 1-d
            refs[key] = name
        ops.append({"name": op.name, "kind": op.kind, "op_type": op.op_type, "inputs": op.inputs,
                    "outputs": op.outputs, "attrs": _jsonable(op.attrs), "consts": refs, "nodes": op.nodes,
                    "precision": op.precision})
    document = {
        "encoding": OPS_ENCODING,
        "ops": ops,
        "tensors": {name: record.to_dict() for name, record in model.tensors.items()},
        "exact": model.exact,
        "inputs": [vars(spec) for spec in model.inputs],
        "outputs": [vars(spec) for spec in model.outputs],
        "shapes": model.shapes,
    }
    return document, consts


def from_document(document: dict[str, Any], consts: dict[str, np.ndarray], *, mblt_sha256: str = "",
                  config: dict[str, Any] | None = None) -> QuantizedModel:
    """Rebuild the QuantizedModel; inconsistent documents raise :class:`MxqFormatError`."""
    if document.get("encoding") != OPS_ENCODING:
        raise MxqFormatError(f"Unknown program encoding {document.get('encoding')!r} (expected {OPS_ENCODING}).",
                             hint="The file was written by a newer compiler; update qb Studio.")
    try:
        ops = [_op(entry, consts) for entry in document["ops"]]
        tensors = {name: _tensor(record) for name, record in document["tensors"].items()}
        model = QuantizedModel(ops=ops, tensors=tensors, exact=dict(document["exact"]),
                               inputs=[ValueSpec(**spec) for spec in document["inputs"]],
                               outputs=[ValueSpec(**spec) for spec in document["outputs"]],
                               shapes={k: list(v) for k, v in document["shapes"].items()},
                               mblt_sha256=mblt_sha256, config=config or {})
    except (KeyError, TypeError, ValueError) as error:
        raise MxqFormatError(f"The program section is inconsistent: {type(error).__name__}: {error}.",
                             hint="The file is corrupt or was written by an incompatible compiler; compile again.") from error
    _check_references(model)
    return model


def _op(entry: dict[str, Any], consts: dict[str, np.ndarray]) -> IntOp:
    missing = [name for name in entry["consts"].values() if name not in consts]
    if missing:
        raise KeyError(f"operation {entry['name']} references missing constants {missing[:3]}")
    return IntOp(name=entry["name"], kind=entry["kind"], op_type=entry["op_type"], inputs=list(entry["inputs"]),
                 outputs=list(entry["outputs"]), attrs=dict(entry["attrs"]),
                 consts={key: consts[name] for key, name in entry["consts"].items()}, nodes=list(entry["nodes"]),
                 precision=entry.get("precision", ""))


def _tensor(record: dict[str, Any]) -> TensorQuant:
    params = QuantParams.from_dict(record["params"]) if record.get("params") else None
    tensor = TensorQuant(record["name"], QuantState(record["state"]), int(record["bits"]),
                         tuple(record["observed_range"]) if record.get("observed_range") else None, params,
                         record.get("source", ""))
    if tensor.state != QuantState.FROZEN or params is None:
        raise ValueError(f"tensor {tensor.name} is not frozen")
    return tensor


def _check_references(model: QuantizedModel) -> None:
    from compiler_core.quantization import kernels

    kernels.load_all()
    known = {spec.name for spec in model.inputs}
    for op in model.ops:
        unknown = [name for name in op.inputs if name and name not in known]
        if unknown or op.kind not in kernels.KERNELS:
            problem = f"unknown kernel {op.kind!r}" if op.kind not in kernels.KERNELS else f"reads {unknown[0]!r} first"
            raise MxqFormatError(f"The program is inconsistent: operation {op.name} {problem}.",
                                 hint="The file is corrupt or was written by an incompatible compiler; compile again.")
        known.update(op.outputs)
    missing = [spec.name for spec in model.outputs if spec.name not in known]
    if missing:
        raise MxqFormatError(f"The program never computes output {missing[0]!r}.", hint="Compile the model again.")


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value
