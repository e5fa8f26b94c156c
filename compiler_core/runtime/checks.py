"""Checks of run-time inputs against a compiled model's interface: names, shape, dtype and range.

A float input takes floating-point values (cast to float32, NaN and infinity refused) or, when the
NPU body reads it directly, integer codes of exactly the input's code dtype and inside its code
range. Integer and bool inputs (token ids, masks) take arrays of their kind whose values fit.
Everything else is an :class:`ArgumentError` saying what was expected; nothing is converted
silently (a uint8 image fed to an int8-code input used to give garbage).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np

from compiler_core.errors import ArgumentError
from compiler_core.quantization.program import QuantizedModel, ValueSpec

logger = logging.getLogger(__name__)


def check_feeds(specs: Sequence[ValueSpec], program: QuantizedModel,
                feeds: Mapping[str, np.ndarray], *, batch: int = 1) -> dict[str, np.ndarray]:
    """Validate NCHW ``feeds`` for a model whose inputs are ``specs`` and whose NPU body is ``program``.

    With ``batch`` N > 1, inputs of batch 1 take N samples stacked on the leading axis.

    Returns:
        The feeds by name: floats as the spec's float dtype, codes and exact values unchanged in value.

    Raises:
        ArgumentError: a missing or unknown input, a wrong shape, dtype or value range.
    """
    names = [spec.name for spec in specs]
    unknown = sorted(set(feeds) - set(names))
    missing = [name for name in names if name not in feeds or feeds[name] is None]
    if unknown or missing:
        raise ArgumentError(f"Inputs do not match the model: missing {missing or 'none'}, unknown {unknown or 'none'}.",
                            hint=f"The model's inputs are: {', '.join(names)}.")
    body = {spec.name for spec in program.inputs}
    return {spec.name: _checked(spec, np.asarray(feeds[spec.name]), program, spec.name in body, batch)
            for spec in specs}


def _checked(spec: ValueSpec, array: np.ndarray, program: QuantizedModel, in_body: bool, batch: int) -> np.ndarray:
    shape = [batch, *spec.shape[1:]] if batch > 1 and spec.shape[:1] == [1] else list(spec.shape)
    if list(array.shape) != shape:
        raise ArgumentError(f"Input '{spec.name}' has shape {list(array.shape)}, expected {shape} (NCHW).",
                            hint="Reshape or transpose the array to the model's input shape.", input=spec.name)
    expected = np.dtype(spec.dtype)
    if expected.kind == "f":
        return _float_input(spec, array, expected, program if in_body and spec.name in program.tensors else None)
    if expected.kind == "b":
        if array.dtype.kind != "b":
            raise _dtype_error(spec, array, "a bool array")
        return array
    if array.dtype.kind not in "iu":
        raise _dtype_error(spec, array, f"an integer array ({expected.name})")
    info = np.iinfo(expected)
    _check_range(spec, array, info.min, info.max, f"{expected.name} values")
    return array.astype(expected, copy=False)


def _float_input(spec: ValueSpec, array: np.ndarray, expected: np.dtype,
                 program: QuantizedModel | None) -> np.ndarray:
    if array.dtype.kind == "f":
        if array.size and not np.isfinite(array).all():
            raise ArgumentError(f"Input '{spec.name}' contains NaN or infinite values.",
                                hint="Pass finite values.", input=spec.name)
        if program is not None and array.size:
            _warn_far_outside(spec.name, array, program)
        return array.astype(expected, copy=False)
    params = program.params(spec.name) if program is not None else None
    if params is not None and array.dtype == params.dtype:
        _check_range(spec, array, params.qmin, params.qmax, f"{params.dtype.name} codes")
        return array
    codes = f" or {params.dtype.name} codes (zero point {np.asarray(params.zero_point).tolist()})" if params else ""
    raise ArgumentError(
        f"Input '{spec.name}' takes {expected.name} values{codes}; a {array.dtype.name} array was given.",
        hint=f"Convert it, e.g. array.astype(np.{expected.name}), and apply the model's preprocessing "
             "(normalization) first; integer arrays are never reinterpreted silently.",
        input=spec.name, expected=expected.name, given=array.dtype.name)


_WARNED_RANGES: set[tuple[int, str]] = set()
FAR_OUTSIDE = 4.0
"""Values beyond the input's range by this many range widths are not that input's values (pixels 0..255 given to an
input calibrated on normalized values)."""


def _warn_far_outside(name: str, array: np.ndarray, program: QuantizedModel) -> None:
    """Warn once per model input when most values saturate far outside the range the input was quantized for."""
    params = program.params(name)
    scale, zero_point = np.asarray(params.scale, np.float64), np.asarray(params.zero_point, np.float64)
    low, high = float(((params.qmin - zero_point) * scale).min()), float(((params.qmax - zero_point) * scale).max())
    width = high - low
    found_low, found_high = float(array.min()), float(array.max())
    if (id(program), name) in _WARNED_RANGES or not (found_high > high + FAR_OUTSIDE * width
                                                     or found_low < low - FAR_OUTSIDE * width):
        return
    codes = params.quantize(array)
    saturated = float(np.mean((codes == params.qmin) | (codes == params.qmax)))
    if saturated < 0.25:
        return
    _WARNED_RANGES.add((id(program), name))
    pixels = (" It takes uint8 pixels: pass the image as a uint8 array." if params.dtype == np.uint8 else
              " Apply the model's preprocessing (normalization) first.")
    logger.warning("Input '%s' holds float values %.4g..%.4g, far outside the %.4g..%.4g it was quantized for "
                   "(%.0f %% of them saturate): float inputs are the model's own input values.%s", name, found_low,
                   found_high, low, high, 100 * saturated, pixels)


def _check_range(spec: ValueSpec, array: np.ndarray, low: int, high: int, what: str) -> None:
    if array.size == 0:
        return
    found_low, found_high = int(array.min()), int(array.max())
    if found_low < low or found_high > high:
        raise ArgumentError(f"Input '{spec.name}' holds values {found_low}..{found_high}, outside the "
                            f"{low}..{high} range of {what}.", hint="Pass values inside that range.",
                            input=spec.name)


def _dtype_error(spec: ValueSpec, array: np.ndarray, wanted: str) -> ArgumentError:
    return ArgumentError(f"Input '{spec.name}' takes {wanted}; a {array.dtype.name} array was given.",
                         hint="Convert the array to the model's input dtype.", input=spec.name,
                         expected=spec.dtype, given=array.dtype.name)


def host_io(device_name: str, float_io: bool) -> str:
    """How a device exchanges tensors with the host: ``"float32"`` or ``"quantized"`` (logged once per launch).

    On an integer-only device (``float_io=False``, e.g. ``regulus-rb-usb``) the runtime quantizes the
    inputs and dequantizes the outputs on the host; the NPU itself only ever sees codes.
    """
    if float_io:
        return "float32"
    logger.info("%s takes quantized I/O only: the runtime quantizes inputs and dequantizes outputs on the host",
                device_name)
    return "quantized"
