"""Plan and run: the per-kind registry of fast steps, the golden fallback, batching and freeing.

Codes of quantized tensors travel as float32 arrays holding exact integers (every code width is at
most 16 bits); exact tensors (int64 ids, bool masks) keep their own dtype. A step receives the
inputs of its IntOp and returns its outputs in that representation. The golden fallback converts
codes to int64 on the way in and back on the way out, so it sees exactly what the golden executor
would hand it.

Batching: when every tensor of the model has a static leading dimension of 1, the executor runs N
samples at once with that dimension set to N. Steps declare whether they are batch-safe; the others
(including every golden fallback) run sample by sample inside the batch. Models whose tensors do
not all lead with a batch dimension of 1 run sample by sample as a whole.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

import numpy as np

from compiler_core.errors import ArgumentError
from compiler_core.quantization import kernels
from compiler_core.quantization.executor import is_kept
from compiler_core.quantization.params import QuantParams
from compiler_core.quantization.program import IntOp, QuantizedModel

logger = logging.getLogger(__name__)

StepFunction = Callable[[list], list]


@dataclass
class Step:
    """One prepared operation.

    Attributes:
        run: inputs (codes as float32, exact tensors as they are) -> outputs.
        batch_safe: True when ``run`` treats a leading dimension N as N independent samples.
        method: short description for logs and tests (``"fast"``, ``"golden"``, requant method ...).
    """

    run: StepFunction
    batch_safe: bool = True
    method: str = "fast"


class PlanContext:
    """What a step builder may ask about the model."""

    def __init__(self, model: QuantizedModel) -> None:
        self.model = model

    def params(self, tensor: str) -> QuantParams | None:
        """Frozen parameters of a quantized tensor, ``None`` for exact tensors or absent names."""
        record = self.model.tensors.get(tensor)
        return record.params if record is not None else None

    def span(self, tensor: str, zero_point) -> int | None:
        """Largest ``|code - zero_point|`` the tensor can hold (``None`` when it has no codes)."""
        params = self.params(tensor)
        if params is None:
            return None
        zero_point = np.asarray(zero_point, dtype=np.int64)
        return int(max(np.max(params.qmax - zero_point), np.max(zero_point - params.qmin)))

    def shape(self, tensor: str) -> list[int] | None:
        """Static (batch 1) shape of a tensor."""
        return self.model.shapes.get(tensor)


StepBuilder = Callable[[IntOp, PlanContext], "Step | None"]
FAST_STEPS: dict[str, StepBuilder] = {}


def register_fast(kind: str) -> Callable[[StepBuilder], StepBuilder]:
    """Decorator: ``builder(op, context) -> Step | None`` for IntOps of ``kind`` (``None`` = use the golden kernel)."""
    def decorate(builder: StepBuilder) -> StepBuilder:
        FAST_STEPS[kind] = builder
        return builder
    return decorate


def _load_steps() -> None:
    from compiler_core.runtime.fastpath import elementwise, linear, movement, normalization  # noqa: F401


def golden_step(op: IntOp, context: PlanContext) -> Step:
    """The golden kernel of ``op.kind`` on int64 codes, sample by sample inside a batch."""
    kernel = kernels.KERNELS[op.kind]
    quantized = [name in context.model.tensors for name in op.outputs]

    def run(inputs: list) -> list:
        widened = [value.astype(np.int64) if value is not None and value.dtype == np.float32 else value
                   for value in inputs]
        outputs = kernel(op, widened)
        return [np.asarray(value, dtype=np.float32) if code else value for value, code in zip(outputs, quantized)]

    return Step(run, batch_safe=False, method="golden")


def build_step(op: IntOp, context: PlanContext) -> Step:
    """The fast step for ``op``, or the golden one when no fast step applies."""
    builder = FAST_STEPS.get(op.kind)
    step = builder(op, context) if builder is not None else None
    return step if step is not None else golden_step(op, context)


class FastExecutor:
    """A QuantizedModel prepared for fast, bit-exact execution (build once, run many times).

    Args:
        model: the integer program.
    """

    def __init__(self, model: QuantizedModel) -> None:
        kernels.load_all()
        _load_steps()
        self.model = model
        context = PlanContext(model)
        self.steps = [build_step(op, context) for op in model.ops]
        self.batchable = all(len(shape) >= 1 and shape[0] == 1 for shape in model.shapes.values())
        self._last_use = model.last_uses()
        self._outputs = [spec.name for spec in model.outputs]
        logger.debug("Fast plan of %d operations: %s", len(self.steps), self.methods())

    def methods(self) -> dict[str, int]:
        """How many steps use each method (``golden`` for fallbacks)."""
        counts: dict[str, int] = {}
        for step in self.steps:
            counts[step.method] = counts.get(step.method, 0) + 1
        return counts

    # -- public entry points -----------------------------------------------------------------------

    def run_codes(self, feeds: Mapping[str, np.ndarray], *, keep: Collection[str] | bool = ()) -> dict[str, np.ndarray]:
        """int64 output codes (and the codes of ``keep``) for float/exact feeds with a leading batch N >= 1."""
        return self.execute_codes(self.quantize_inputs(feeds), keep=keep)

    def execute_codes(self, codes: Mapping[str, np.ndarray], *, keep: Collection[str] | bool = (),
                      as_int64: bool = True) -> dict[str, np.ndarray]:
        """Codes of the outputs (and of ``keep``) for input codes (int or float32) with a leading batch N.

        Models that cannot run batched run sample by sample; the results are concatenated. Codes come
        back as int64 (as from the golden executor), or with ``as_int64=False`` as the exact float32
        the steps use (half the memory; ``QuantParams.dequantize`` takes either).
        """
        count = self._batch_size(codes)
        if count > 1 and not self.batchable:
            parts = [self.execute_codes({name: value[i:i + 1] for name, value in codes.items()}, keep=keep,
                                        as_int64=as_int64) for i in range(count)]
            return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}
        env = {name: value.astype(np.float32) if name in self.model.tensors and value.dtype != np.float32 else value
               for name, value in codes.items()}
        env = self.execute(env, keep=keep, batch=count)
        return {name: _batched(_widen(value) if as_int64 else value, count) for name, value in env.items()
                if name in self._outputs or is_kept(name, keep)}

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Dequantized (float32) outputs, as :func:`compiler_core.quantization.executor.run`."""
        codes = self.run_codes(feeds)
        return {name: self.dequantize(name, codes[name]) for name in self._outputs}

    def dequantize(self, name: str, codes: np.ndarray) -> np.ndarray:
        """Codes -> float32 for quantized tensors; exact tensors unchanged."""
        if name in self.model.tensors:
            return self.model.params(name).dequantize(codes).astype(np.float32)
        return codes

    def quantize_inputs(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Float (or exact) feeds -> the representation the steps run on (codes as float32)."""
        env = {}
        for spec in self.model.inputs:
            if spec.name not in feeds:
                raise ArgumentError(f"Missing input '{spec.name}'.",
                                    hint=f"The model takes: {', '.join(s.name for s in self.model.inputs)}.")
            value = np.asarray(feeds[spec.name])
            if list(value.shape[1:]) != list(spec.shape[1:]) or value.ndim != len(spec.shape):
                raise ArgumentError(f"Input '{spec.name}' has shape {list(value.shape)}, expected {spec.shape} "
                                    "(any leading batch size).", hint="Pass arrays with the model's input shape.")
            if spec.name in self.model.tensors:
                value = self.model.params(spec.name).quantize(value).astype(np.float32)
            env[spec.name] = value
        return env

    def execute(self, env: dict[str, np.ndarray], *, keep: Collection[str] | bool = (), batch: int = 1) -> dict:
        """Run every step on ``env`` (model inputs in step representation); returns the final environment."""
        for index, (op, step) in enumerate(zip(self.model.ops, self.steps)):
            inputs = [env[name] if name else None for name in op.inputs]
            outputs = step.run(inputs) if batch == 1 or step.batch_safe else _per_sample(step, inputs, batch)
            for name, value in zip(op.outputs, outputs):
                env[name] = value
            for name in op.inputs:
                if name and self._last_use.get(name) == index and name not in self._outputs and not is_kept(name, keep):
                    env.pop(name, None)
        return env

    def _batch_size(self, feeds: Mapping[str, np.ndarray]) -> int:
        return batch_size(feeds, {spec.name: spec.shape for spec in self.model.inputs})


def batch_size(feeds: Mapping[str, np.ndarray], shapes: Mapping[str, list[int]]) -> int:
    """Samples in ``feeds``: 1 when every array has its input's shape, else the common leading dimension N.

    Raises:
        ArgumentError: the leading dimensions disagree, or an input has no leading batch dimension of 1.
    """
    given = {name: np.shape(value) for name, value in feeds.items() if name in shapes}
    if all(list(shape) == list(shapes[name]) for name, shape in given.items()):
        return 1
    if any(not shapes[name] or shapes[name][0] != 1 for name in given):
        raise ArgumentError("This model runs one sample at a time: not every input has a leading batch "
                            "dimension of 1.", hint=f"Pass inputs of shapes {dict(shapes)}.")
    sizes = {shape[0] for shape in given.values() if len(shape) >= 1}
    if len(sizes) > 1:
        raise ArgumentError(f"Inputs disagree on the batch size: {sorted(sizes)}.",
                            hint="Pass the same number of samples for every input.")
    return int(sizes.pop()) if sizes else 1


def _per_sample(step: Step, inputs: list, batch: int) -> list:
    """Run a non-batch-safe step once per sample (inputs with a leading 1 are shared)."""
    results = []
    for index in range(batch):
        sample = [value[index:index + 1] if value is not None and value.ndim and value.shape[0] == batch else value
                  for value in inputs]
        results.append(step.run(sample))
    return [np.concatenate([result[position] for result in results]) for position in range(len(results[0]))]


def _batched(value: np.ndarray, count: int) -> np.ndarray:
    """Values that do not depend on the inputs keep a leading 1: repeat them for every sample."""
    if count > 1 and value.ndim and value.shape[0] == 1:
        return np.repeat(value, count, axis=0)
    return value


def _widen(value: np.ndarray) -> np.ndarray:
    return value.astype(np.int64) if value.dtype == np.float32 else value


_CACHE: dict[int, tuple[weakref.ref, FastExecutor]] = {}


def executor_for(model: QuantizedModel) -> FastExecutor:
    """The FastExecutor of ``model``, built on first use and kept while the model lives.

    The plan holds prepared copies of the model's constants: a model changed after its first run
    needs a new ``FastExecutor(model)``.
    """
    key = id(model)
    entry = _CACHE.get(key)
    if entry is not None and entry[0]() is model:
        return entry[1]
    executor = FastExecutor(model)
    # The callback holds the dict itself: at interpreter exit the module global may already be None.
    _CACHE[key] = (weakref.ref(model, lambda _, cache=_CACHE: cache.pop(key, None)), executor)
    return executor
