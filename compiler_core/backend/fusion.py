"""Backend pass 1, NPU op fusion: integer operations -> NPU layers.

The quantizer already folds bias, clamp-style activations and the requantization into one
``linear`` operation. This pass groups what the NPU runs as one layer: a ``linear`` (or ``matmul``)
followed by a point-wise operation (a LUT activation such as SiLU or sigmoid, a clamp) that is the
only reader of its output becomes one layer whose epilogue runs on the tile still in SRAM, so the
intermediate tensor never goes to DRAM. Each layer names the unit that runs it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from compiler_core.quantization.program import IntOp, QuantizedModel

logger = logging.getLogger(__name__)

MAC, MFU, VECTOR, DMA = "mac", "mfu", "vector", "dma"
EPILOGUE_KINDS = frozenset({"lut", "clamp"})
"""Point-wise kinds that fuse behind a MAC layer."""
POINTWISE_KINDS = frozenset({"add", "mul", "scale", "lut", "clamp", "quantize", "extremum", "sum", "divide",
                             "select", "prelu"})
"""Kinds whose every output element depends only on the input elements at the same position (with broadcasting)."""
_UNITS = {"linear": MAC, "matmul": MAC, "lut": MFU, "softmax": MFU, "layernorm": MFU, "groupnorm": MFU,
          "reduce_l2": MFU, "move": DMA}


@dataclass
class Layer:
    """One NPU layer: a main operation and the point-wise epilogue fused behind it.

    Attributes:
        index: position in execution order.
        ops: indices into ``QuantizedModel.ops``, main operation first.
        unit: ``mac`` (MAC array), ``mfu`` (LUT/normalisation unit), ``vector`` or ``dma``.
        inputs: tensors read from the activation arena (the main operation's non-empty inputs).
        outputs: tensors written to the arena (the last operation's outputs).
    """

    index: int
    ops: list[int]
    unit: str
    inputs: list[str]
    outputs: list[str]
    fused: list[str] = field(default_factory=list)

    def main(self, model: QuantizedModel) -> IntOp:
        """The main operation."""
        return model.ops[self.ops[0]]


def unit_of(op: IntOp) -> str:
    """The unit an operation runs on."""
    return _UNITS.get(op.kind, VECTOR)


def fuse(model: QuantizedModel) -> list[Layer]:
    """Group the operations into NPU layers, in execution order."""
    readers: dict[str, int] = {}
    for op in model.ops:
        for name in op.inputs:
            if name:
                readers[name] = readers.get(name, 0) + 1
    outputs = {spec.name for spec in model.outputs}
    layers: list[Layer] = []
    index = 0
    while index < len(model.ops):
        op = model.ops[index]
        members = [index]
        while _fusable(model, index, members[-1], readers, outputs):
            members.append(members[-1] + 1)
        last = model.ops[members[-1]]
        layers.append(Layer(len(layers), members, unit_of(op), [name for name in op.inputs if name],
                            list(last.outputs), [model.ops[i].name for i in members[1:]]))
        index = members[-1] + 1
    logger.debug("fusion: %d operations -> %d layers", len(model.ops), len(layers))
    return layers


def _fusable(model: QuantizedModel, main: int, last: int, readers: dict[str, int], outputs: set[str]) -> bool:
    """Whether operation ``last + 1`` is a point-wise epilogue of the MAC layer ``main .. last``."""
    if last + 1 >= len(model.ops) or unit_of(model.ops[main]) != MAC:
        return False
    op, nxt = model.ops[last], model.ops[last + 1]
    if nxt.kind not in EPILOGUE_KINDS or len(op.outputs) != 1 or len(nxt.outputs) != 1:
        return False
    produced = op.outputs[0]
    return ([name for name in nxt.inputs if name] == [produced] and readers.get(produced) == 1
            and produced not in outputs)
