"""The golden executor: runs a QuantizedModel bit-exactly per docs/numerics.md, in numpy.

Float inputs are quantized with the input parameters, every operation runs its integer kernel,
and float outputs are dequantized. Intermediate codes are freed as soon as no later operation
reads them, unless the caller asks to keep them (per-layer analysis).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import numpy as np

from compiler_core.errors import ArgumentError
from compiler_core.quantization import kernels
from compiler_core.quantization.program import QuantizedModel


def quantize_inputs(model: QuantizedModel, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Float (or exact integer) feeds -> the codes/values the integer program starts from."""
    env = {}
    for spec in model.inputs:
        if spec.name not in feeds:
            raise ArgumentError(f"Missing input '{spec.name}'.",
                                hint=f"The model takes: {', '.join(s.name for s in model.inputs)}.")
        value = np.asarray(feeds[spec.name])
        if list(value.shape) != list(spec.shape):
            raise ArgumentError(f"Input '{spec.name}' has shape {list(value.shape)}, expected {spec.shape}.",
                                hint="Pass arrays with the model's input shape (batch 1).")
        env[spec.name] = model.params(spec.name).quantize(value) if spec.name in model.tensors else value
    return env


def execute(model: QuantizedModel, env: dict[str, np.ndarray], *, keep: Collection[str] | bool = ()) -> dict:
    """Run every operation on ``env`` (input codes); returns the final environment.

    Args:
        model: the integer program.
        env: codes of the model inputs (from :func:`quantize_inputs`).
        keep: tensor names to keep for the caller (``True`` keeps all); outputs are always kept.
    """
    kernels.load_all()
    last_use = model.last_uses()
    wanted = {spec.name for spec in model.outputs}
    for index, op in enumerate(model.ops):
        inputs = [env[name] if name else None for name in op.inputs]
        for name, value in zip(op.outputs, kernels.KERNELS[op.kind](op, inputs)):
            env[name] = value
        for name in op.inputs:
            if name and last_use.get(name) == index and name not in wanted and not is_kept(name, keep):
                env.pop(name, None)
    return env


def is_kept(name: str, keep: Collection[str] | bool) -> bool:
    """Whether ``keep`` (``True`` for all, else a collection of names) asks for tensor ``name``."""
    return keep is True or (not isinstance(keep, bool) and name in keep)


def run_codes(model: QuantizedModel, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Output codes (int64) for float feeds."""
    env = execute(model, quantize_inputs(model, feeds))
    return {spec.name: env[spec.name] for spec in model.outputs}


def run(model: QuantizedModel, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Dequantized (float32) outputs for float feeds."""
    codes = run_codes(model, feeds)
    return {name: dequantize_output(model, name, value) for name, value in codes.items()}


def dequantize_output(model: QuantizedModel, name: str, value: np.ndarray) -> np.ndarray:
    """Codes -> float32 for quantized tensors; exact tensors unchanged."""
    if name in model.tensors:
        return model.params(name).dequantize(value).astype(np.float32)
    return value
