"""Accuracy metrics of a quantized model against its FP32 reference, accumulated over samples.

Everything returns plain, JSON-serialisable dicts. SQNR is ``10 log10(sum(ref^2) / sum((ref - q)^2))``
over all elements of all samples; cosine is computed per sample and averaged; top-k agreement
compares the reference's top-1 class with the quantized top-1 / top-5 (classifier outputs only).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

WARN_SQNR_DB = 20.0
FLAG_SQNR_DB = 10.0


BLOCK = 1 << 15  # elements per step of the fused sums: three float64 blocks stay in the L2 cache
NEAR_ZERO_ENERGY = 1e-6  # a sample 60 dB quieter than the loudest one has no meaningful direction


@dataclass
class TensorComparison:
    """Running comparison of one tensor over samples.

    Besides the totals it keeps each sample's reference energy (``sum(ref^2)``), so that
    :meth:`to_dict` can leave out of the cosine the samples whose reference is (near) zero: the
    cosine of two near-zero vectors measures rounding noise, not the quantization.
    """

    signal: float = 0.0
    noise: float = 0.0
    max_abs_error: float = 0.0
    cosines: list[float] = field(default_factory=list)
    top1: float = 0.0
    top5: float = 0.0
    samples: int = 0
    energies: list[float] = field(default_factory=list)
    rms_floor: float = 0.0
    peak: float | None = None
    """The largest ``|reference|`` seen, when tracked (``TensorComparison(peak=0.0)``: the model's outputs)."""
    padding: int = 0
    """Positions left out as padding over all samples (:func:`at_tokens`)."""

    def add(self, reference: np.ndarray, quantized: np.ndarray, classifier: bool = False) -> None:
        """Accumulate one sample."""
        self._accumulate(np.asarray(reference), np.asarray(quantized), 0.0, 1.0, classifier)

    def add_codes(self, reference: np.ndarray, codes: np.ndarray, scale: float, zero_point: float,
                  classifier: bool = False) -> None:
        """Accumulate one sample given as per-tensor integer codes (``real = scale * (codes - zero_point)``).

        The same numbers as ``add(reference, scale * (codes - zero_point))`` without materialising the
        dequantized tensor; ``scale`` also becomes the tensor's :attr:`rms_floor` (one quantization step).
        """
        self.rms_floor = max(self.rms_floor, float(scale))
        self._accumulate(np.asarray(reference), np.asarray(codes), float(zero_point), float(scale), classifier)

    def _accumulate(self, reference: np.ndarray, test: np.ndarray, offset: float, scale: float,
                    classifier: bool) -> None:
        if reference.size != test.size:
            raise ValueError(f"reference has {reference.size} elements, quantized {test.size}")
        signal, noise, cross, test_squared, max_error = fused_sums(reference, test, offset, scale)
        self.signal += signal
        self.noise += noise
        if self.peak is not None and reference.size:
            self.peak = max(self.peak, float(np.abs(reference).max()))
        self.max_abs_error = max(self.max_abs_error, max_error)
        # one value per sample has no direction: its "cosine" is only the sign, 1.0 whatever the error
        self.cosines.append(_cosine_from_sums(signal, test_squared, cross, reference, test, offset)
                            if reference.size > 1 else math.nan)
        self.energies.append(signal / max(reference.size, 1))
        self.samples += 1
        if classifier:  # per position for a sequence of class scores: the share of positions that agree
            classes = next((size for size in reversed(reference.shape) if size != 1), 1)  # [1, C, 1, 1] too
            ref = np.asarray(reference, dtype=np.float64).reshape(-1, classes)
            values = (np.asarray(test, dtype=np.float64).reshape(-1, classes) - offset) * scale
            expected = np.argmax(ref, axis=1)[:, None]
            best = np.argmax(values, axis=1)[:, None]
            # in the top 5 when fewer than 5 classes score higher (a tie does not push it out, as argpartition's
            # arbitrary order among equal values could: top-5 below top-1 on a model with a constant output)
            above = np.sum(values > np.take_along_axis(values, expected, axis=1), axis=1)
            self.top1 += float(np.mean(best == expected))
            self.top5 += float(np.mean(above < 5))

    def near_zero_samples(self) -> list[int]:
        """Indices of the samples whose reference is (near) zero.

        Near zero: RMS below one quantization step (when known, see :meth:`add_codes`), or energy per
        element below :data:`NEAR_ZERO_ENERGY` times the loudest sample's.
        """
        if not self.energies:
            return []
        loudest = max(self.energies)
        floor = max(self.rms_floor ** 2, NEAR_ZERO_ENERGY * loudest)
        if loudest == 0:
            return list(range(len(self.energies)))
        return [index for index, energy in enumerate(self.energies) if energy < floor]

    def to_dict(self, classifier: bool = False) -> dict:
        """Summary: SQNR (dB), mean/min cosine, max abs error, top-k agreement, verdict.

        SQNR sums signal and noise over all samples, so a near-zero sample barely weighs in; the cosine
        mean and min leave near-zero samples out (``near_zero_samples`` lists their indices, and
        ``cosine_mean`` is ``None`` when every sample is near zero, and for a one-element tensor: a scalar's cosine
        is only its sign).
        """
        sqnr = sqnr_db(self.signal, self.noise)
        quiet = set(self.near_zero_samples()) if len(self.energies) == len(self.cosines) else set()
        kept = [value for index, value in enumerate(self.cosines) if index not in quiet and not math.isnan(value)]
        result = {"sqnr_db": _finite(sqnr), "cosine_mean": float(np.mean(kept)) if kept else None,
                  "cosine_min": float(np.min(kept)) if kept else None,
                  "max_abs_error": self.max_abs_error, "samples": self.samples, "verdict": verdict(sqnr)}
        if self.peak is not None:
            result["reference_peak"] = self.peak
        if quiet:
            result["near_zero_samples"] = sorted(quiet)
        if self.padding:
            result["padding_positions"] = self.padding
        if self.cosines and all(math.isnan(value) for value in self.cosines):
            result["single_value"] = True  # why there is no cosine
        if classifier and self.samples:
            result.update(top1_agreement=self.top1 / self.samples, top5_agreement=self.top5 / self.samples)
        return result


def fused_sums(reference: np.ndarray, test: np.ndarray, offset: float = 0.0,
               scale: float = 1.0) -> tuple[float, float, float, float, float]:
    """``(ref.ref, err.err, ref.q, q.q, max|err|)`` in float64 with ``q = scale * (test - offset)``, ``err = ref - q``.

    Works block by block in float64 buffers that stay in cache, so a large float32 activation is read
    once instead of being converted and streamed through memory by every separate sum.
    """
    ref, values = np.ravel(reference), np.ravel(test)
    sums = np.zeros(4)
    max_error = 0.0
    buffers = np.empty((3, min(BLOCK, ref.size)))
    for start in range(0, ref.size, BLOCK):
        stop = min(start + BLOCK, ref.size)
        r, q, e = buffers[:, :stop - start]
        r[...] = ref[start:stop]
        q[...] = values[start:stop]
        if offset:
            q -= offset
        if scale != 1.0:
            q *= scale
        np.subtract(r, q, out=e)
        sums += (r @ r, e @ e, r @ q, q @ q)
        max_error = max(max_error, float(e.max()), -float(e.min()))
    return float(sums[0]), float(sums[1]), float(sums[2]), float(sums[3]), max_error


def _cosine_from_sums(signal: float, test_squared: float, cross: float, reference, test, offset: float) -> float:
    norm = float(np.sqrt(signal) * np.sqrt(test_squared))
    if norm == 0:
        both_zero = not np.any(reference) and not np.any(np.asarray(test, dtype=np.float64) - offset)
        return 1.0 if both_zero else 0.0
    return cross / norm


def sqnr_db(signal: float, noise: float) -> float:
    """Signal-to-quantization-noise ratio in dB (``inf`` for a perfect match)."""
    if noise <= 0:
        return math.inf
    if signal <= 0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def cosine(first: np.ndarray, second: np.ndarray, first_squared: float | None = None) -> float:
    """Cosine similarity of 1-D float64 arrays; 1.0 when both are all-zero.

    ``first_squared``: ``first @ first`` when the caller has it already (saves one pass over ``first``).
    """
    first_squared = first @ first if first_squared is None else first_squared
    norm = float(np.sqrt(first_squared) * np.sqrt(second @ second))  # = norm(first) * norm(second), bit for bit
    if norm == 0:
        return 1.0 if not np.any(first) and not np.any(second) else 0.0
    return float(first @ second) / norm


def verdict(sqnr: float, warn_db: float = WARN_SQNR_DB, flag_db: float = FLAG_SQNR_DB) -> str:
    """``ok``, ``warn`` (below ``warn_db``) or ``flag`` (below ``flag_db``)."""
    if sqnr < flag_db:
        return "flag"
    return "warn" if sqnr < warn_db else "ok"


PROBABILITY_OPS = frozenset({"Softmax", "LogSoftmax", "Sigmoid"})
LOGIT_OPS = frozenset({"Gemm", "MatMul", "Add", "Conv"})


SHAPE_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})
EMBEDDING_NAME = re.compile(r"embed|feature|descriptor|vector|latent|hidden|pooler|encoding", re.IGNORECASE)
"""Output names that say a linear output is an embedding, not logits (``embedding``, ``dvector``, ``features``,
``last_hidden_state``, ``pooler_output``)."""


def head_op_type(tensor: str, producers: Mapping[str, tuple[str, str | None]]) -> str:
    """ONNX op type of the operation writing ``tensor``, looking through shape-only ops ("" if none).

    Args:
        tensor: The output's name.
        producers: Tensor name -> (op type of its producer, the producer's first input or None), for any graph form.
    """
    entry = producers.get(tensor)
    for _ in range(len(producers)):
        if entry is None or entry[0] not in SHAPE_OPS or not entry[1]:
            break
        entry = producers.get(entry[1])
    return entry[0] if entry is not None else ""


def is_classifier_output(shape: list[int], head_op: str, model_outputs: int, name: str = "") -> bool:
    """Whether an output holds class scores, so that top-1/top-5 agreement is reported for it.

    The one rule (every report, table and chart follows it): a ``[1, C]`` output is class scores when
    it comes from ``Softmax``/``LogSoftmax``/``Sigmoid`` (probabilities, ``C >= 2``), or when it is
    the model's only output and comes from a linear layer (``Gemm``/``MatMul``/``Add``/``Conv``:
    logits, ``C >= 10``). A linear ``[1, C]`` output next to other outputs is treated as a regression
    (MediaPipe hand/pose landmarks beside a presence score, MTCNN box and landmark offsets): the arg-max
    of coordinates means nothing. A sequence of class scores, ``[1, T, C]`` or ``[T, 1, C]`` (CTC text
    recognizers such as PP-OCR rec or a CRNN, token taggers), follows the same rule on ``C`` and is
    compared per position: top-1 agreement is then the share of positions whose arg-max agrees. Scores with
    singleton dimensions around ``C`` (``[1, C, 1, 1]`` from a 1x1-convolution head, ``[1, 1, 1, C]`` in NHWC)
    count as ``[1, C]``. Two kinds are never class scores: a ``Sigmoid`` sequence or map (each value its own
    probability: a time-frequency mask, polyphonic note activations, where the arg-max of a frame picks nothing),
    and a linear output the model names as an embedding (:data:`EMBEDDING_NAME`: a speaker d-vector, a face or
    sentence embedding, whose arg-max is a meaningless coordinate).

    Args:
        shape: The output's shape.
        head_op: ONNX op type of the operation producing it (shape-only ops such as Reshape skipped).
        model_outputs: How many outputs the model has.
        name: The output's name ("" when unknown).
    """
    if len(shape) == 3 and 1 in shape[:2] and max(shape[:2]) >= 2:  # [1, T, C] or [T, 1, C]: a sequence
        if head_op == "Sigmoid":
            return False
        shape = [1, shape[2]]
    elif len(shape) > 2 and shape[0] == 1 and sum(size != 1 for size in shape[1:]) == 1:
        shape = [1, max(shape[1:])]  # [1, C, 1, 1] or [1, 1, 1, C]: a 1x1-conv head (SqueezeNet, NHWC nets)
    if len(shape) != 2 or shape[0] != 1:
        return False
    if head_op in PROBABILITY_OPS:
        return shape[1] >= 2
    return head_op in LOGIT_OPS and model_outputs == 1 and shape[1] >= 10 and not EMBEDDING_NAME.search(name)


PADDING_MASK_NAME = re.compile(r"mask$", re.IGNORECASE)
"""Inputs read as a token padding mask (1: a token, 0: padding): ``attention_mask`` (HuggingFace), ``input_mask`` (TF
BERT), ``mask`` (khmersm), when their values are 0/1 and their shape [1, S]."""


def token_positions(sample: Mapping[str, np.ndarray]) -> np.ndarray | None:
    """The positions of one sample that hold tokens, from its padding mask input, or None.

    A ``[1, S]`` input named like :data:`PADDING_MASK_NAME` (bool or numbers) whose values are all 0 or 1, with at least one 1
    and one 0. Outputs of shape ``[1, S, ...]`` are compared at these positions only (:func:`at_tokens`): what a
    model writes at padding is not used, and some models (DeBERTa-v2: layer norms of near-zero rows) make it
    arbitrary there, so int8 cannot follow it (cosine 0.50 over all positions, 0.999 over the tokens).
    """
    for name, value in sample.items():
        array = np.asarray(value)
        if PADDING_MASK_NAME.search(name) and array.ndim == 2 and array.shape[0] == 1 and array.size:
            keep = array[0] != 0
            if np.isin(array, (0, 1)).all() and keep.any() and not keep.all():
                return keep
    return None


def at_tokens(value: np.ndarray, keep: np.ndarray | None) -> np.ndarray:
    """``value`` at the token positions (axis 1) when it is a ``[1, S, ...]`` tensor of rank >= 3; else as it is."""
    if keep is None or np.ndim(value) < 3 or np.shape(value)[0] != 1 or np.shape(value)[1] != keep.size:
        return value
    return np.asarray(value)[:, keep]


def _finite(value: float) -> float | None:
    """JSON has no infinities: ``inf`` SQNR (exact match) is reported as 999.0."""
    if math.isinf(value):
        return 999.0 if value > 0 else -999.0
    return value
