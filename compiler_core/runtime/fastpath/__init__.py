"""The fast simulator: a bit-exact, batched executor of QuantizedModels, built once per model.

:class:`FastExecutor` turns every IntOp into a prepared step (weights as float arrays, proven
requantization methods, lookup tables, onnxruntime convolution sessions) and then only runs them.
Kinds without a fast step run the golden kernel (``kernels.KERNELS[kind]``) unchanged, so every
kind the golden executor knows runs here too, with identical codes. docs/numerics.md, "Fast path".
"""

from compiler_core.runtime.fastpath.plan import (
    FAST_STEPS,
    FastExecutor,
    batch_size,
    executor_for,
    register_fast,
)

__all__ = ["FAST_STEPS", "FastExecutor", "batch_size", "executor_for", "register_fast"]
