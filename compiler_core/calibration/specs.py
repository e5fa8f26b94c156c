"""InputSpec: what calibration data must provide for each model input (name, shape, dtype, layout)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_ir as ir

from compiler_core.errors import CalibrationError
from compiler_core.mblt.io import layout_hint


@dataclass(frozen=True)
class InputSpec:
    """One model input as calibration data must provide it.

    Attributes:
        name: Graph input name.
        shape: Static shape, batch dimension included.
        dtype: numpy dtype of the input.
        layout: Layout hint from the shape: ``NCHW``, ``NHWC``, ``NCW``, ``NC`` or ``""``.
    """

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    layout: str

    @property
    def is_image(self) -> bool:
        """Whether the input is 4-D with 1 or 3 channels, so images can feed it."""
        return self.layout in ("NCHW", "NHWC") and self.channels in (1, 3)

    @property
    def channels(self) -> int:
        """Channel count of a 4-D input (0 for other ranks)."""
        return {"NCHW": self.shape[1], "NHWC": self.shape[-1]}.get(self.layout, 0) if len(self.shape) == 4 else 0

    @property
    def spatial_size(self) -> tuple[int, int]:
        """(height, width) of a 4-D input."""
        return (self.shape[2], self.shape[3]) if self.layout == "NCHW" else (self.shape[1], self.shape[2])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype.name, "layout": self.layout}


def input_specs(model: ir.Model) -> list[InputSpec]:
    """The :class:`InputSpec` of every graph input of ``model`` (an MBLT), in graph order.

    Raises:
        CalibrationError: an input has a dynamic dimension or no element type.
    """
    return [_input_spec(value) for value in model.graph.inputs]


def _input_spec(value: ir.Value) -> InputSpec:
    dims = list(value.shape) if value.shape is not None else None
    if dims is None or any(not isinstance(d, int) for d in dims) or value.dtype is None:
        raise CalibrationError(f"Model input '{value.name}' has no static shape and type ({value.shape}).",
                               hint="Pin dynamic dimensions with input_shape_dict when parsing the model.")
    return InputSpec(value.name, tuple(int(d) for d in dims), np.dtype(value.dtype.numpy()), layout_hint(list(dims)))


