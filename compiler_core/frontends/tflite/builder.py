"""The state converters write into: ONNX nodes, initializers, folded constants and value names.

Every TFLite tensor keeps its TFLite layout (NHWC) and its name as an ONNX value. Constants are
materialised as initializers only when an op reads them as they are; a converter that wants a
constant in another form (a transposed filter, say) reads :meth:`GraphBuilder.constant` instead.
Quantized tensors are carried as float32 real values (``scale * (q - zero_point)``).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from compiler_core.frontends.tflite.reader import Operator, TFLiteGraph

logger = logging.getLogger(__name__)

SOURCE_NAME_KEY = "mblt.source_name"


class NotConvertible(Exception):  # noqa: N818 - a signal between converter and importer, not an error to users
    """Raised by a converter when this op instance has options or inputs it cannot express."""


class UpstreamUnavailable(Exception):  # noqa: N818
    """An input comes from an op that failed to convert; the op is skipped, not reported twice."""


class GraphBuilder:
    """Collects the ONNX graph while converters run, one TFLite operator at a time.

    Args:
        graph: The decoded TFLite subgraph.
    """

    def __init__(self, graph: TFLiteGraph) -> None:
        self.graph = graph
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: dict[str, np.ndarray] = {}
        self.constants: dict[int, np.ndarray] = {}
        self.unavailable: set[int] = set()
        self._materialised: set[int] = set()
        self._used_names: set[str] = set()
        self._value_names = [self._unique(t.name) for t in graph.tensors]
        for tensor in graph.tensors:
            if tensor.data is not None and tensor.sparsity is None:
                self.constants[tensor.index] = self._real_value(tensor.index, tensor.data)

    # -- names -----------------------------------------------------------------------------------

    def value_name(self, tensor_index: int) -> str:
        """The ONNX value name of a TFLite tensor (its TFLite name, made unique)."""
        return self._value_names[tensor_index]

    def fresh_name(self, base: str) -> str:
        """A new value name derived from ``base``."""
        return self._unique(base)

    def _unique(self, base: str) -> str:
        name, suffix = base, 1
        while name in self._used_names:
            name, suffix = f"{base}_{suffix}", suffix + 1
        self._used_names.add(name)
        return name

    # -- reading inputs --------------------------------------------------------------------------

    def shape(self, tensor_index: int) -> tuple[int, ...]:
        """The static TFLite shape of a tensor."""
        return self.graph.tensors[tensor_index].shape

    def constant(self, tensor_index: int) -> np.ndarray | None:
        """The real value of a tensor known at conversion time (weights, folded results), else None."""
        if tensor_index in self.unavailable:
            raise UpstreamUnavailable(tensor_index)
        return self.constants.get(tensor_index)

    def require_constant(self, op: Operator, position: int, what: str) -> np.ndarray:
        """The constant at input ``position`` of ``op``; NotConvertible if it is computed at run time."""
        value = self.constant(op.inputs[position]) if position < len(op.inputs) and op.inputs[position] >= 0 else None
        if value is None:
            raise NotConvertible(f"the {what} (input {position}) must be a constant")
        return value

    def input(self, op: Operator, position: int) -> str:
        """The ONNX value name feeding input ``position`` of ``op`` ("" if the input is omitted)."""
        if position >= len(op.inputs) or op.inputs[position] < 0:
            return ""
        return self.tensor_value(op.inputs[position])

    def tensor_value(self, tensor_index: int) -> str:
        """The ONNX value of a tensor, turning a known constant into an initializer on first use."""
        if tensor_index in self.unavailable:
            raise UpstreamUnavailable(tensor_index)
        name = self._value_names[tensor_index]
        if tensor_index in self.constants and tensor_index not in self._materialised:
            self.initializers[name] = self.constants[tensor_index]
            self._materialised.add(tensor_index)
        return name

    def _real_value(self, tensor_index: int, data: np.ndarray) -> np.ndarray:
        quantization = self.graph.tensors[tensor_index].quantization
        if quantization is not None and data.dtype.kind in "iu":
            return quantization.dequantize(data)
        return data

    # -- writing ---------------------------------------------------------------------------------

    def set_constant(self, tensor_index: int, value: np.ndarray) -> None:
        """Fold: the tensor's value is known now; no node is emitted for it."""
        self.constants[tensor_index] = value

    def add_initializer(self, base: str, value: np.ndarray) -> str:
        """A new initializer named after ``base``; returns its value name."""
        name = self._unique(base)
        self.initializers[name] = np.asarray(value)
        return name

    def add_node(self, op_type: str, inputs: list[str], outputs: list[str] | int = 1, *, source: str,
                 **attributes: Any) -> list[str]:
        """Emit one ONNX node (default domain) and return its output names.

        Args:
            op_type: ONNX operator type.
            inputs: Input value names ("" for an omitted optional input).
            outputs: Output value names, or how many fresh ones to create.
            source: The TFLite tensor or op name this node implements (``mblt.source_name``).
            **attributes: ONNX attributes; ``None`` values are left out.
        """
        if isinstance(outputs, int):
            outputs = [self._unique(f"{source}/{op_type}") for _ in range(outputs)]
        node = helper.make_node(op_type, inputs, outputs, name=self._unique(f"{source}/{op_type}"),
                                **{k: v for k, v in attributes.items() if v is not None})
        node.metadata_props.add(key=SOURCE_NAME_KEY, value=source)
        self.nodes.append(node)
        return outputs

    def bind(self, value: str, tensor_index: int) -> None:
        """Make ``value`` the ONNX value of TFLite tensor ``tensor_index``.

        The last node's fresh output is renamed in place; anything else gets an Identity.
        """
        target = self.value_name(tensor_index)
        last = self.nodes[-1] if self.nodes else None
        if last is not None and value in last.output and value != target:
            last.output[list(last.output).index(value)] = target
        elif value != target:
            self.add_node("Identity", [value], [target], source=self.graph.tensors[tensor_index].name)

    def int64_initializer(self, base: str, values: list[int] | tuple[int, ...]) -> str:
        """A 1-D int64 initializer (shapes, axes, pads)."""
        return self.add_initializer(base, np.asarray(values, dtype=np.int64))

    def initializer_protos(self) -> list[onnx.TensorProto]:
        """Every initializer as a TensorProto (float16/64 constants kept exact, quantized ones float32)."""
        return [numpy_helper.from_array(np.ascontiguousarray(value), name)
                for name, value in self.initializers.items()]
