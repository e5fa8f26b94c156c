"""Quantization parameters and per-tensor quantization state (initial -> calibrated -> frozen)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler_core.quantization.fixedpoint import round_half_away


class QuantState(str, enum.Enum):
    """Life cycle of a tensor's quantization: no range yet, a calibrated range, frozen integer params."""

    INITIAL = "initial"
    CALIBRATED = "calibrated"
    FROZEN = "frozen"


def code_range(bits: int, signed: bool = True) -> tuple[int, int]:
    """``(qmin, qmax)`` of a ``bits``-wide integer code."""
    if signed:
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


@dataclass(frozen=True)
class QuantParams:
    """Affine quantization ``real = scale * (code - zero_point)`` of one tensor.

    Attributes:
        scale: float64 scale, shape ``()`` (per tensor) or ``(C,)`` (per channel on ``axis``).
        zero_point: int64 zero point(s), same shape as ``scale``.
        bits: code width (8 or 16).
        signed: signed codes (int8/int16) or unsigned (uint8 model inputs).
        axis: channel axis for per-channel parameters, else ``None``.
    """

    scale: np.ndarray
    zero_point: np.ndarray
    bits: int = 8
    signed: bool = True
    axis: int | None = None

    @property
    def qmin(self) -> int:
        """Smallest code."""
        return code_range(self.bits, self.signed)[0]

    @property
    def qmax(self) -> int:
        """Largest code."""
        return code_range(self.bits, self.signed)[1]

    @property
    def dtype(self) -> np.dtype:
        """numpy dtype of the codes."""
        return np.dtype(f"{'' if self.signed else 'u'}int{self.bits}")

    def _broadcast(self, values: np.ndarray, array: np.ndarray) -> np.ndarray:
        if self.axis is None or np.ndim(values) == 0:
            return values
        shape = [1] * array.ndim
        shape[self.axis] = -1
        return np.reshape(values, shape)

    def quantize(self, real: np.ndarray) -> np.ndarray:
        """Float -> int64 codes (round half away from zero, saturating)."""
        real = np.asarray(real, dtype=np.float64)
        codes = round_half_away(real / self._broadcast(self.scale, real)) + self._broadcast(self.zero_point, real)
        return np.clip(codes, self.qmin, self.qmax)

    def dequantize(self, codes: np.ndarray) -> np.ndarray:
        """int codes (or exact integer codes held as floats, as the fast simulator's) -> float64 real values."""
        codes = np.asarray(codes)
        if codes.dtype.kind == "f":  # same values as the int64 path: code - zp is exact in float64
            values = codes.astype(np.float64)
            values -= self._broadcast(self.zero_point, values)
            values *= self._broadcast(self.scale, values)
            return values
        codes = codes.astype(np.int64, copy=False)
        return self._broadcast(self.scale, codes) * (codes - self._broadcast(self.zero_point, codes))

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return {"scale": np.asarray(self.scale).tolist(), "zero_point": np.asarray(self.zero_point).tolist(),
                "bits": self.bits, "signed": self.signed, "axis": self.axis}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QuantParams:
        """Inverse of :meth:`to_dict`."""
        return cls(np.asarray(data["scale"], dtype=np.float64), np.asarray(data["zero_point"], dtype=np.int64),
                   int(data["bits"]), bool(data["signed"]), data.get("axis"))


def params_from_range(low: float, high: float, *, bits: int = 8, symmetric: bool = True) -> QuantParams:
    """Per-tensor parameters covering ``[low, high]`` (which must contain 0).

    Symmetric quantization puts 0 at code 0, except for non-negative ranges, which use the whole
    code range with the zero point at the smallest code (one more bit for ReLU outputs).
    """
    qmin, qmax = code_range(bits)
    low, high = min(float(low), 0.0), max(float(high), 0.0)
    if high - low <= 0:
        high = low + 1e-8
    if symmetric and low < 0:
        scale = max(-low, high) / qmax
        zero_point = 0
    else:
        scale = (high - low) / (qmax - qmin)
        zero_point = int(np.clip(qmin - round_half_away(low / scale), qmin, qmax))
    return QuantParams(np.float64(scale), np.int64(zero_point), bits)


@dataclass
class TensorQuant:
    """Quantization record of one activation tensor.

    Attributes:
        name: tensor (value) name in the MBLT.
        state: where the tensor is in its life cycle.
        bits: chosen activation width (8 or 16).
        observed_range: calibrated float range ``(low, high)``.
        params: frozen integer parameters.
        source: why the parameters are what they are (``observer:max_percentile``, ``shared:<tensor>``, ...).
    """

    name: str
    state: QuantState = QuantState.INITIAL
    bits: int = 8
    observed_range: tuple[float, float] | None = None
    params: QuantParams | None = None
    source: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def calibrate(self, low: float, high: float, source: str) -> None:
        """Record the calibrated range (state -> calibrated)."""
        self.observed_range = (float(low), float(high))
        self.source = source
        self.state = QuantState.CALIBRATED

    def freeze(self, params: QuantParams, source: str | None = None) -> None:
        """Fix the integer parameters (state -> frozen)."""
        self.params = params
        self.bits = params.bits
        if source:
            self.source = source
        self.state = QuantState.FROZEN

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return {"name": self.name, "state": self.state.value, "bits": self.bits,
                "observed_range": list(self.observed_range) if self.observed_range else None,
                "params": self.params.to_dict() if self.params else None, "source": self.source}
