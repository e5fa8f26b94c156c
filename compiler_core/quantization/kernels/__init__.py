"""Integer lowerings and kernels, by name.

Which ONNX op uses which lowering is said once, in the op registry (:mod:`compiler_core.ops`,
``OpDef.lowering``). Here each kernel module registers, under a name, its lowering (MBLT group ->
IntOp with integer constants), its kernel (integer inputs -> integer outputs, per
docs/numerics.md) and the policy for its output parameters; a lowering may emit IntOps of other
kinds registered with :func:`register_kernel` (a Mul of two activations emits ``mul``).
"""

from __future__ import annotations

from collections.abc import Callable
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
FixedParams = Callable[["Group", "LoweringContext", "tuple[float, float] | None"], "QuantParams"]

OBSERVE, SAME_AS_INPUT, FIXED, EXACT = "observe", "same_as_input", "fixed", "exact"


@dataclass(frozen=True)
class OpSpec:
    """How one ONNX op type is quantized.

    Attributes:
        kind: kernel name (several op types may share one kernel).
        lower: builds the IntOp from a group.
        output_policy: ``observe`` (calibrated range), ``same_as_input`` (data movement keeps the
            input's parameters), ``fixed`` (the kernel sets them, e.g. Softmax's ``1/(127 * 2^k)``) or
            ``exact`` (no float output).
        fixed_params: parameters for the ``fixed`` policy, given the calibrated range of the output's
            set (None when there is none).
    """

    kind: str
    lower: Lowering
    output_policy: str | Callable[[Group, LoweringContext], str] = OBSERVE
    fixed_params: FixedParams | None = None

    def policy(self, group: Group, context: LoweringContext) -> str:
        """The output policy for this group (some ops decide per node)."""
        return self.output_policy(group, context) if callable(self.output_policy) else self.output_policy


LOWERINGS: dict[str, OpSpec] = {}
KERNELS: dict[str, Kernel] = {}


class KernelRefusal(ValueError):
    """A lowering cannot build an integer kernel for this node; the message says why (no bug)."""


def register(kind: str, lower: Lowering, kernel: Kernel, *,
             output_policy: str | Callable[[Group, LoweringContext], str] = OBSERVE,
             fixed_params: FixedParams | None = None) -> None:
    """Register the lowering ``kind`` (named by ``OpDef.lowering``) and the kernel of the same name."""
    KERNELS[kind] = kernel
    LOWERINGS[kind] = OpSpec(kind, lower, output_policy, fixed_params)


def register_kernel(kind: str, kernel: Kernel) -> None:
    """Register a kernel for IntOps that a lowering of another name emits."""
    KERNELS[kind] = kernel


def spec_for(op_type: str) -> OpSpec | None:
    """The lowering the op registry names for ``op_type`` (None when it has no kernel)."""
    from compiler_core.ops import get_op

    entry = get_op(op_type)
    return LOWERINGS.get(entry.lowering) if entry is not None and entry.lowering else None


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
