"""The quantized program: integer operations with their constants, and per-tensor parameters.

This is what the golden executor runs, what the QDQ exporter mirrors and what the MXQ ``program``
and ``const`` sections encode (the quantized op graph, not a tile-level NPU instruction stream).
Arithmetic kernels hold integer constants only and are defined in docs/numerics.md; the
data-movement and exact ops (kinds ``move`` and ``exact``) run the ONNX op itself through
``onnx.reference``, on codes or, for max-pooling and exact ops with quantized inputs, on float
(dequantized) values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler_core.quantization.params import QuantParams, TensorQuant


@dataclass
class IntOp:
    """One integer operation (possibly several fused MBLT nodes).

    Attributes:
        name: MBLT name of the main node.
        kind: kernel name in the executor's registry (``linear``, ``lut``, ``softmax`` ...).
        op_type: ONNX op type of the main node.
        inputs: tensor names read, in kernel order (``""`` for an absent optional input).
        outputs: tensor names written.
        attrs: JSON-serialisable integer/string attributes (zero points, clamps, strides ...).
        consts: integer arrays (weights, biases, multipliers, shifts, tables).
        nodes: every MBLT node this operation covers, main node first.
        precision: human-readable precision, e.g. ``"a8w8"`` or ``"a16"``.
    """

    name: str
    kind: str
    op_type: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    nodes: list[str] = field(default_factory=list)
    precision: str = ""

    def describe(self) -> dict[str, Any]:
        """Summary without the constant arrays (for reports and the GUI)."""
        return {"name": self.name, "kind": self.kind, "op_type": self.op_type, "inputs": self.inputs,
                "outputs": self.outputs, "nodes": self.nodes, "precision": self.precision,
                "const_bytes": int(sum(array.nbytes for array in self.consts.values()))}


@dataclass
class ValueSpec:
    """Shape and element type of a graph input/output."""

    name: str
    shape: list[int]
    dtype: str  # numpy dtype name of the float/exact value ("float32", "int64", "bool")


@dataclass
class QuantizedModel:
    """A fully quantized graph ready to execute or to encode.

    Attributes:
        ops: integer operations in execution order.
        tensors: quantization record of every quantized (float) tensor, all frozen.
        exact: non-float tensors (int64 ids, bool masks) carried exactly, name -> dtype name.
        inputs / outputs: the model interface.
        shapes: static shape of every tensor.
        mblt_sha256: identity of the source MBLT.
        config: the resolved CompileConfig (camelCase dict) that produced it.
    """

    ops: list[IntOp]
    tensors: dict[str, TensorQuant]
    exact: dict[str, str]
    inputs: list[ValueSpec]
    outputs: list[ValueSpec]
    shapes: dict[str, list[int]]
    mblt_sha256: str = ""
    config: dict[str, Any] = field(default_factory=dict)

    def params(self, tensor: str) -> QuantParams:
        """Frozen parameters of a quantized tensor."""
        record = self.tensors[tensor]
        assert record.params is not None, f"tensor {tensor} is not frozen"
        return record.params

    def last_uses(self) -> dict[str, int]:
        """Index of the last operation that reads each tensor (tensors nothing reads are absent).

        Executors free an intermediate tensor after its last reader ran.
        """
        last = {}
        for index, op in enumerate(self.ops):
            for name in op.inputs:
                if name:
                    last[name] = index
        return last

    def layer_table(self) -> list[dict[str, Any]]:
        """One row per operation: name, op, precision, output scale and bits."""
        rows = []
        for op in self.ops:
            out = self.tensors.get(op.outputs[0]) if op.outputs else None
            rows.append({**op.describe(), "output_bits": out.bits if out else None,
                         "output_scale": float(np.max(out.params.scale)) if out and out.params else None})
        return rows

    def int16_layers(self) -> int:
        """Layers that compute in 16 bits: an int16 input, output or weights (a layer reading a widened tensor
        counts); what mixed precision's ``maxInt16Fraction`` and every "int16 layers" figure count."""
        return sum(1 for op in self.ops if "16" in op.precision or
                   any(self.tensors[name].bits == 16 for name in op.outputs if name in self.tensors))

    def summary(self) -> dict[str, Any]:
        """Counts and sizes for reports."""
        kinds: dict[str, int] = {}
        for op in self.ops:
            kinds[op.kind] = kinds.get(op.kind, 0) + 1
        bits = [record.bits for record in self.tensors.values()]
        return {"operations": len(self.ops), "kinds": kinds, "tensors": len(self.tensors),
                "int16_tensors": sum(1 for b in bits if b == 16), "int16_layers": self.int16_layers(),
                "const_bytes": int(sum(a.nbytes for op in self.ops for a in op.consts.values()))}
