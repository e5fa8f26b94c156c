"""InputSpec: what calibration data must provide for each model input (name, shape, dtype, layout)."""

from __future__ import annotations

import json
from collections.abc import Sequence
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
        codes: ``(dtype name, scale, zero point)`` when the source model took this input as quantized integers (a
            full-integer TFLite model): arrays of that dtype are its codes, read as ``(q - zero point) * scale``.
    """

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    layout: str
    codes: tuple[str, float, int] | None = None

    def real_values(self, array: np.ndarray) -> np.ndarray:
        """``array`` as the input's values: the source's integer codes dequantized (:attr:`codes`), else as is."""
        if self.codes is None or array.dtype.name != self.codes[0]:
            return array
        return (array.astype(np.float64) - self.codes[2]) * self.codes[1]

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
    codes = input_codes(model)
    return [_input_spec(value, codes.get(value.name)) for value in model.graph.inputs]


def input_codes(model: ir.Model) -> dict[str, tuple[str, float, int]]:
    """Input name -> ``(dtype name, scale, zero point)`` of the inputs the source model took as per-tensor quantized
    integers (the TFLite importer's calibration hints: the MBLT takes their real values)."""
    from compiler_core.frontends.tflite.importer import CALIBRATION_HINTS_KEY

    hints = json.loads(model.metadata_props.get(CALIBRATION_HINTS_KEY, "{}") or "{}")
    names = {value.name for value in model.graph.inputs}
    return {hint["onnx_value"]: (hint["dtype"].lower(), hint["scale"][0], hint["zero_point"][0])
            for hint in hints.values()
            if hint.get("onnx_value") in names and len(hint.get("scale", ())) == 1
            and hint.get("dtype", "").lower() in ("int8", "uint8", "int16")}


def _input_spec(value: ir.Value, codes: tuple[str, float, int] | None = None) -> InputSpec:
    dims = list(value.shape) if value.shape is not None else None
    if dims is None or any(not isinstance(d, int) for d in dims) or value.dtype is None:
        raise CalibrationError(f"Model input '{value.name}' has no static shape and type ({value.shape}).",
                               hint="Pin dynamic dimensions with input_shape_dict when parsing the model.")
    return InputSpec(value.name, tuple(int(d) for d in dims), np.dtype(value.dtype.numpy()), layout_hint(list(dims)),
                     codes)



TOKEN_INPUT_ROLES: dict[str, tuple[str, ...]] = {
    "ids": ("input_ids", "ids", "input", "tokens", "token_ids"),
    "mask": ("attention_mask", "input_mask", "mask"),
    "types": ("token_type_ids", "segment_ids", "type_ids"),
    "positions": ("position_ids",),
}
"""Role of a transformer input -> the input names it goes by (HF exports, TF BERT's ``input_mask``/``segment_ids``)."""


def token_input_roles(specs: Sequence[Any]) -> dict[str, str] | None:
    """Input name -> role (``ids``, ``mask``, ``types``, ``positions``) when every input of ``specs`` is an integer
    input of one of those roles and one is the token ids; else None (the model does not take tokenized text)."""
    by_name = {name: role for role, names in TOKEN_INPUT_ROLES.items() for name in names}
    roles = {}
    for spec in specs:
        role = by_name.get(spec.name.lower())
        if role is None or not np.issubdtype(spec.dtype, np.integer):
            return None
        roles[spec.name] = role
    return roles if "ids" in roles.values() else None


def input_kind(specs: Sequence[InputSpec]) -> str:
    """``tokens`` (every input a token input, :func:`token_input_roles`), ``image`` (one input images feed) or
    ``other``: what calibration data and which preset suit the model."""
    if specs and token_input_roles(specs) is not None:
        return "tokens"
    return "image" if any(spec.is_image for spec in specs) else "other"
