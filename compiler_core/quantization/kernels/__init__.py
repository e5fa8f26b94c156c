"""Registry of integer operations: per ONNX op, how it is lowered and how its kernel runs.

Adding an op is one ``register`` call in one kernel module: its lowering (MBLT group -> IntOp with
integer constants), its kernel (integer inputs -> integer outputs, per docs/numerics.md) and the
policy for its output parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from compiler_core.quantization.graph import Group
    from compiler_core.quantization.lowering import LoweringContext
    from compiler_core.quantization.params import QuantParams
    from compiler_core.quantization.program import IntOp

Lowering = Callable[["Group", "LoweringContext"], "IntOp"]
Kernel = Callable[["IntOp", list[np.ndarray]], list[np.ndarray]]
FixedParams = Callable[["Group", "LoweringContext"], "QuantParams"]

OBSERVE, SAME_AS_INPUT, FIXED, EXACT = "observe", "same_as_input", "fixed", "exact"


@dataclass(frozen=True)
class OpSpec:
    """How one ONNX op type is quantized.

    Attributes:
        kind: kernel name (several op types may share one kernel).
        lower: builds the IntOp from a group.
        output_policy: ``observe`` (calibrated range), ``same_as_input`` (data movement keeps the
            input's parameters), ``fixed`` (e.g. Softmax's ``1/127``) or ``exact`` (no float output).
        fixed_params: parameters for the ``fixed`` policy.
    """

    kind: str
    lower: Lowering
    output_policy: str | Callable[[Group, LoweringContext], str] = OBSERVE
    fixed_params: FixedParams | None = None

    def policy(self, group: Group, context: LoweringContext) -> str:
        """The output policy for this group (some ops decide per node)."""
        return self.output_policy(group, context) if callable(self.output_policy) else self.output_policy


OP_SPECS: dict[str, OpSpec] = {}
KERNELS: dict[str, Kernel] = {}


def register(op_types: Iterable[str], kind: str, lower: Lowering, kernel: Kernel, *,
             output_policy: str | Callable[[Group, LoweringContext], str] = OBSERVE, fixed_params: FixedParams | None = None) -> None:
    """Register ``kernel`` under ``kind`` and map every op type in ``op_types`` to it."""
    KERNELS[kind] = kernel
    for op_type in op_types:
        OP_SPECS[op_type] = OpSpec(kind, lower, output_policy, fixed_params)


def load_all() -> None:
    """Import every kernel module so their ``register`` calls run."""
    from compiler_core.quantization.kernels import (  # noqa: F401
        elementwise,
        linear,
        lut,
        movement,
        normalization,
        pooling,
        prelu,
        resize,
        softmax,
    )
