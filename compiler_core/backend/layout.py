"""Backend pass 2, layout: every activation gets its storage layout and element type in the arena.

Rank-4 activations are stored channels-last (NHWC), so a band of output rows is one contiguous
block and a range of channels is a strided run per pixel. Other ranks keep the ONNX order. Layers
that the NPU runs natively on NHWC data (convolutions and transposed ones, point-wise work, channel concatenation,
pooling, reductions over H and W, nearest Resize by scales, spatial Pad) read and write the stored layout directly; every other layer reading or writing a rank-4
tensor needs a transposing DMA, recorded per layer as ``transposes``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from compiler_core.backend.fusion import POINTWISE_KINDS, Layer
from compiler_core.quantization.program import IntOp, QuantizedModel

NHWC, PLAIN = "NHWC", "ND"


@dataclass(frozen=True)
class TensorLayout:
    """How one arena tensor is stored.

    Attributes:
        name: tensor name.
        shape: logical (ONNX, NCHW) shape.
        dtype: numpy dtype name of the stored elements (``int8``, ``uint8``, ``int16``, ``int64``, ``bool`` ...).
        layout: ``NHWC`` or ``ND``.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    layout: str

    @cached_property
    def itemsize(self) -> int:
        """Bytes per element."""
        return np.dtype(self.dtype).itemsize

    @cached_property
    def nbytes(self) -> int:
        """Bytes of the whole tensor."""
        return math.prod(self.shape) * self.itemsize

    @property
    def stored_shape(self) -> tuple[int, ...]:
        """Shape in storage order."""
        if self.layout == NHWC:
            n, c, h, w = self.shape
            return (n, h, w, c)
        return self.shape

    @property
    def row_axis(self) -> int:
        """Logical axis tiles are cut along: H of NHWC tensors, axis 1 otherwise (contiguous in both)."""
        return 2 if self.layout == NHWC else 1

    @property
    def rows(self) -> int:
        """Size of the row axis (1 for tensors of rank < 2)."""
        return self.shape[self.row_axis] if len(self.shape) > self.row_axis else 1

    def row_bytes(self) -> int:
        """Bytes of one row: ``W * C`` elements of an NHWC tensor, ``prod(shape[2:])`` otherwise (batch 1)."""
        return self.nbytes // max(self.rows, 1)

    def tile_shape(self, count: int) -> tuple[int, ...]:
        """Stored shape of a band of ``count`` rows."""
        stored = list(self.stored_shape)
        stored[1] = count
        return tuple(stored)

    def to_dict(self) -> dict:
        """JSON form."""
        return {"shape": list(self.shape), "dtype": self.dtype, "layout": self.layout}


def storage_dtype(model: QuantizedModel, name: str) -> str:
    """Element type a tensor is stored with: its code type, or the exact type of non-quantized values."""
    if name in model.tensors:
        return model.params(name).dtype.name
    return np.dtype(model.exact.get(name, "int64")).name


def assign_layouts(model: QuantizedModel, layers: list[Layer]) -> dict[str, TensorLayout]:
    """Storage of every tensor that lives in the arena (model inputs and layer outputs)."""
    names = [spec.name for spec in model.inputs] + [name for layer in layers for name in layer.outputs]
    result = {}
    for name in dict.fromkeys(names):
        shape = tuple(int(d) for d in model.shapes[name])
        result[name] = TensorLayout(name, shape, storage_dtype(model, name), NHWC if len(shape) == 4 else PLAIN)
    return result


def native_nhwc(op: IntOp) -> bool:
    """Whether the NPU runs the operation directly on channels-last data."""
    if op.kind == "linear":  # a dense layer over W (rank 4): a band of rows holds whole W x C planes
        return (op.attrs.get("layout") in ("conv", "conv_transpose") and len(op.attrs.get("kernel", [])) == 2
                or op.attrs.get("layout") == "dense")
    if op.kind == "concat":  # along C or W: a band of rows of each input is a block of the output's band
        return op.attrs.get("axis") in (1, -3, 3, -1)
    if op.kind == "matmul":  # rank-4 operands: the heads (C) are the batch, read innermost
        return True
    if op.kind == "softmax":  # along W: a band of rows holds whole W x C planes
        return op.attrs.get("axis") in (3, -1)
    if op.kind == "move":
        return slice_keeps_axis(op, 4, 2) or channel_local(op)
    return op.kind in POINTWISE_KINDS or op.kind == "average_pool" or channel_local(op)


def channel_local(op: IntOp) -> bool:
    """Every output channel depends only on the same input channel, with nothing per channel in the operation.

    Reductions over H and/or W that keep the reduced axes (global pooling), windowed pooling (MaxPool, AveragePool:
    its multipliers are per output position, not per channel), linear Resize over H and W, and nearest Resize by
    constant scales, nearest Resize to constant sizes of H and W only (``axes`` [2, 3]: the lowering writes sizes
    that keep N and C so) and Pad by constant pads that leave N and C alone.
    """
    if op.kind == "average_pool" or op.kind == "move" and op.op_type == "MaxPool":
        return True
    if op.kind == "interpolate":  # linear/cubic Resize: one matrix per resized axis, none per channel
        return not {int(axis) % 4 for axis in op.attrs.get("axes", [])} & {0, 1}
    if op.kind in ("reduce_sum", "reduce_l2"):
        axes = op.attrs.get("axes") or []
        return bool(op.attrs.get("keepdims")) and bool(axes) and set(axes) <= {2, 3}
    if op.kind == "move" and op.op_type == "Resize" and len(op.inputs) == 3 and "input2" in op.consts:
        scales = np.asarray(op.consts["input2"]).reshape(-1)
        return scales.size == 4 and bool(np.all(scales[:2] == 1))
    if op.kind == "move" and op.op_type == "Resize" and len(op.inputs) == 4 and "input3" in op.consts:
        axes = op.attrs.get("attributes", {}).get("axes") or []
        return bool(axes) and {int(axis) % 4 for axis in axes} <= {2, 3}
    if op.kind == "move" and op.op_type == "Pad" and len(op.inputs) <= 3 and "input1" in op.consts:
        pads = np.asarray(op.consts["input1"]).reshape(-1)  # a scalar pad value: the same for every channel
        return pads.size == 8 and not pads[[0, 1, 4, 5]].any() and np.asarray(op.consts.get("input2", 0)).size <= 1
    return False


def slice_keeps_axis(op: IntOp, rank: int, axis: int) -> bool:
    """A Slice with constant axes that leaves ``axis`` whole (so it runs band by band along it)."""
    if op.op_type != "Slice" or "input3" not in op.consts or "input1" not in op.consts:
        return False
    return all(int(a) % rank != axis for a in np.asarray(op.consts["input3"]).reshape(-1))


def transposes(model: QuantizedModel, layer: Layer, layouts: dict[str, TensorLayout]) -> list[str]:
    """Rank-4 tensors a layer reads or writes through a transposing DMA (its kernel is not channels-last)."""
    if native_nhwc(layer.main(model)):
        return []
    return [name for name in (*layer.inputs, *layer.outputs) if layouts[name].layout == NHWC]
