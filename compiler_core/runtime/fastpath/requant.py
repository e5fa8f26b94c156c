"""Exact Q31 requantization in float64, chosen and proven per layer when the plan is built.

The golden rule (docs/numerics.md) is ``y = clamp(rha((acc + bias) * M / 2**S) + zp, lo, hi)`` on
int64. The fast executor holds accumulators as exact integers in float32/float64 and computes
``v = acc * m + c`` in float64 with ``m = M * 2**-S`` (exact) and ``c = (bias*M + 2**(S-1) + zp*2**S) * 2**-S``,
then ``floor(v)``. Per layer, for every accumulator it can produce (``|acc| <= bound``), the
first of these that holds is used:

``float64``
    Every numerator ``|a| * M + 2**(S-1) + |zp| * 2**S`` (``a = acc + bias``) is below ``2**53``,
    so ``v`` is exact and ``floor(v) = rha + zp``, except at negative exact ties
    (``a * M = -(2j + 1) * 2**(S-1)``). Modular arithmetic rules these out per channel; where one is
    possible the layer rounds with ``trunc(v + copysign(0.5, v))`` instead.
``float64-proven``
    Both ``floor(clip(fl(fl(acc * m) + c)))`` and the golden function are monotone in ``acc``
    (``M > 0``): they are equal everywhere iff they step up at the same accumulator for every
    output code in ``(lo, hi]``. The builder locates each golden step, evaluates both functions on a
    window around it and accepts only if they agree there and the step lies inside the window.
``float64-guarded``
    ``v`` is within ``2**-52 * max|v|`` of the exact value, so ``floor(v)`` is exact wherever ``v`` is
    farther than a 4x margin from an integer; the few elements nearer (including every exact tie)
    are recomputed with the golden int64 arithmetic at run time.
``exact``
    the golden int64 :func:`~compiler_core.quantization.fixedpoint.requantize` (shifts below 1 or
    above 1000, or bounds beyond ``2**53``).
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from compiler_core.quantization.fixedpoint import requantize

logger = logging.getLogger(__name__)

FLOAT32_EXACT = 1 << 24
FLOAT64_EXACT = 1 << 53
THREADS = 2
PARALLEL_ELEMENTS = 1 << 18  # below this, one block on the calling thread
BLOCK_ELEMENTS = 1 << 16  # float64 scratch of a block stays in the L2 cache
MAX_PROOF_POINTS = 1 << 22  # thresholds x parameter entries checked for the float32 method
_WINDOW = np.arange(-2, 3)


CHOICE_MEMO_ENTRIES = 4096
_CHOSEN = ("_m64", "_c64", "_ties", "_margin")  # what _choose sets besides the method (read-only afterwards)
_choices: dict[tuple, tuple[str, dict]] = {}
_choices_lock = threading.Lock()


class Requantizer:
    """``acc -> clamp(rha((acc + bias) * M / 2**S) + zp, lo, hi)`` as float32 codes, bit-exact.

    Args:
        multiplier: int M, any shape broadcastable against the accumulator.
        shift: int S, same shape as ``multiplier``.
        bias: int offsets added to the accumulator (broadcastable), or ``None``.
        zero_point: output zero point (scalar, or per channel: broadcastable like ``multiplier``).
        clamp: ``(lo, hi)`` output code bounds.
        bound: an upper bound of ``|acc|`` over every input the layer can receive.

    The chosen method and its constants are remembered per process by all of these arguments (the
    last :data:`CHOICE_MEMO_ENTRIES`): sweep points and repeated compiles share most layers' parameters.
    """

    def __init__(self, multiplier: np.ndarray, shift: np.ndarray, bias: np.ndarray | None, zero_point,
                 clamp: tuple[int, int], bound: int) -> None:
        multiplier, shift = np.asarray(multiplier, dtype=np.int64), np.asarray(shift, dtype=np.int64)
        bias = np.zeros((), dtype=np.int64) if bias is None else np.asarray(bias, dtype=np.int64)
        multiplier, shift, bias, zero = np.broadcast_arrays(multiplier, shift, bias,
                                                            np.asarray(zero_point, dtype=np.int64))
        self.multiplier, self.shift, self.bias, self.zero_point = (np.ascontiguousarray(a)
                                                                   for a in (multiplier, shift, bias, zero))
        (self.low, self.high), self.bound = (int(clamp[0]), int(clamp[1])), int(bound)
        key = (self.multiplier.shape, self.multiplier.tobytes(), self.shift.tobytes(), self.bias.tobytes(),
               self.zero_point.tobytes(), self.low, self.high, self.bound)
        with _choices_lock:
            known = _choices.get(key)
        if known is None:
            method = self._choose()
            known = (method, {name: getattr(self, name) for name in _CHOSEN if hasattr(self, name)})
            with _choices_lock:
                _choices[key] = known
                while len(_choices) > CHOICE_MEMO_ENTRIES:
                    _choices.pop(next(iter(_choices)))
        self.method = known[0]
        self.__dict__.update(known[1])

    # -- running ---------------------------------------------------------------------------------

    def __call__(self, acc: np.ndarray) -> np.ndarray:
        """Float32 codes for an exact-integer float accumulator."""
        if self.method == "exact":
            return self._exact(acc.astype(np.int64), self.bias, self.multiplier, self.shift, self.zero_point)
        if self.method == "float64-guarded":
            value = np.multiply(acc, self._m64, dtype=np.float64)
            value += self._c64
            return self._guarded(acc, value)
        shape = np.broadcast_shapes(acc.shape, self._m64.shape)
        out = np.empty(shape, dtype=np.float32)
        blocks = _blocks(acc.shape, self._m64.shape) if shape == acc.shape else [((...,), (...,))]
        if len(blocks) == 1:
            self._float_into(acc, self._m64, self._c64, self.zero_point, out)
        else:  # numpy releases the GIL: cache-sized blocks on two threads
            list(_pool().map(lambda block: self._float_into(acc[block[0]], self._m64[block[1]], self._c64[block[1]],
                                                            self.zero_point[block[1]], out[block[0]]), blocks))
        return out

    def _float_into(self, acc: np.ndarray, multiplier: np.ndarray, constant: np.ndarray, zero_point: np.ndarray,
                    out: np.ndarray) -> None:
        value = np.multiply(acc, multiplier, dtype=np.float64)
        value += constant
        if self._ties:  # v + copysign(0.5, v) is exact (numerator below 2**53); trunc rounds halves away
            value = np.trunc(value + np.copysign(0.5, value), out=value)
            value += zero_point
        np.floor(value, out=out, casting="same_kind")
        np.clip(out, self.low, self.high, out=out)  # = floor(clip(v)): the bounds are integers

    def _exact(self, acc: np.ndarray, bias, multiplier, shift, zero_point) -> np.ndarray:
        exact = requantize(acc + bias, multiplier, shift) + zero_point
        return np.clip(exact, self.low, self.high).astype(np.float32)

    def _guarded(self, acc: np.ndarray, value: np.ndarray) -> np.ndarray:
        """``floor(v)`` where ``v`` is farther than its rounding error from an integer; golden int64 elsewhere."""
        nearest = np.rint(value)
        nearest -= value
        np.abs(nearest, out=nearest)
        doubtful = nearest < self._margin
        codes = np.floor(value, out=np.empty(value.shape, dtype=np.float32), casting="same_kind")
        np.clip(codes, self.low, self.high, out=codes)
        if doubtful.any():
            shape = value.shape
            codes[doubtful] = self._exact(acc[doubtful].astype(np.int64), np.broadcast_to(self.bias, shape)[doubtful],
                                          np.broadcast_to(self.multiplier, shape)[doubtful],
                                          np.broadcast_to(self.shift, shape)[doubtful],
                                          np.broadcast_to(self.zero_point, shape)[doubtful])
        return codes

    # -- choosing and proving ----------------------------------------------------------------------

    def _choose(self) -> str:
        if np.any(self.shift > 1000) or np.any(self.shift < 1) or self.bound >= FLOAT64_EXACT:
            return "exact"
        self._m64 = np.ldexp(self.multiplier.astype(np.float64), -self.shift)
        self._ties = False
        if self._exact_in_float64():
            return "float64"
        if np.all(self.multiplier > 0) and self._rounding_proven():
            return "float64-proven"
        self._c64 = self._constants(with_rounding=True)
        largest = (self.bound + np.abs(self.bias)) * np.abs(self._m64) + np.abs(self._c64)
        # |v - exact| <= 2 ulp(max |v|) (product, sum, rounded constant): 2**-49 * max|v| is a 4x margin
        self._margin = max(float(largest.max()) * 2.0 ** -49, 2.0 ** -40)
        return "float64-guarded"

    def _entries(self) -> list[tuple[int, int, int, int]]:
        return list(zip(self.multiplier.reshape(-1).tolist(), self.shift.reshape(-1).tolist(),
                        self.bias.reshape(-1).tolist(), self.zero_point.reshape(-1).tolist()))

    def _constants(self, with_rounding: bool) -> np.ndarray:
        """``(bias * M [+ 2**(S-1) + zp * 2**S]) * 2**-S`` per entry, correctly rounded to float64."""
        numerators = [float(b * m + ((1 << (s - 1)) + (z << s) if with_rounding else 0))
                      for m, s, b, z in self._entries()]
        return np.ldexp(np.array(numerators, dtype=np.float64).reshape(self.shift.shape), -self.shift)

    def _exact_in_float64(self) -> bool:
        """Every product and sum exact: numerators ``|a| * M + 2**(S-1) + |zp| * 2**S`` below ``2**53``."""
        entries = self._entries()
        for multiplier, shift, bias, zero in entries:
            worst = (self.bound + abs(bias)) * abs(multiplier) + (1 << (shift - 1)) + (abs(zero) << shift)
            if worst >= FLOAT64_EXACT:
                return False
        self._ties = any(_tie_possible(abs(m), s, self.bound + abs(b)) for m, s, b, _ in entries)
        self._c64 = self._constants(with_rounding=not self._ties)
        return True

    def _rounding_proven(self) -> bool:
        """Prove ``floor(clip(fl64(fl64(acc * m) + c)))`` equals the golden codes for every ``|acc| <= bound``."""
        if self.multiplier.size * (self.high - self.low) * _WINDOW.size > MAX_PROOF_POINTS:
            return False
        codes = np.arange(self.low + 1, self.high + 1, dtype=np.int64)
        self._c64 = self._constants(with_rounding=True)
        shape = (-1, 1, 1)
        bias, zero = self.bias.reshape(shape), self.zero_point.reshape(shape)
        # the golden code reaches k at ceil(real step) (+-1 for float error): check a +-2 window around it
        real_step = (codes[None, :, None] - zero - 0.5) / self._m64.reshape(shape) - bias
        limit = self.bound + 3
        points = np.clip(np.ceil(real_step), -limit, limit).astype(np.int64) + _WINDOW[None, None, :]
        golden = np.clip(requantize(points + bias, self.multiplier.reshape(shape), self.shift.reshape(shape))
                         + zero, self.low, self.high)
        fast = points.astype(np.float64) * self._m64.reshape(shape)
        fast = np.floor(np.clip(fast + self._c64.reshape(shape), self.low, self.high))
        if not np.array_equal(golden, fast.astype(np.int64)):
            return False
        k = codes[None, :, None]
        inside = (golden[..., :1] < k) & (golden[..., -1:] >= k)
        below_reach = (golden[..., :1] >= k) & (points[..., :1] <= -self.bound)
        above_reach = (golden[..., -1:] < k) & (points[..., -1:] >= self.bound)
        return bool(np.all(inside | below_reach | above_reach))


def _blocks(shape: tuple[int, ...], parameter_shape: tuple[int, ...]) -> list[tuple[tuple, tuple]]:
    """``(accumulator index, parameter index)`` per block along the first axis longer than 1 (one block when small)."""
    size = int(np.prod(shape))
    axis = next((a for a, n in enumerate(shape) if n > 1), None)
    if size < PARALLEL_ELEMENTS or axis is None:
        return [((...,), (...,))]
    count = min(shape[axis], max(2, size // BLOCK_ELEMENTS))
    offset = axis - (len(shape) - len(parameter_shape))
    sliced = offset >= 0 and parameter_shape[offset] == shape[axis]
    edges = np.linspace(0, shape[axis], count + 1).astype(int)
    blocks = []
    for start, stop in zip(edges[:-1], edges[1:]):
        index = (slice(None),) * axis + (slice(start, stop),)
        blocks.append((index, (slice(None),) * offset + (slice(start, stop),) if sliced else (...,)))
    return blocks


_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="qb-requant")
    return _POOL


def _tie_possible(multiplier: int, shift: int, bound: int) -> bool:
    """Whether ``a * M`` can be an odd multiple of ``2**(S-1)`` for some ``0 < |a| <= bound``."""
    if shift < 1 or multiplier == 0:
        return False
    zeros = (multiplier & -multiplier).bit_length() - 1
    if zeros >= shift:
        return False
    modulus = 1 << (shift - zeros)
    odd = multiplier >> zeros
    residue = ((1 << (shift - 1 - zeros)) * pow(odd, -1, modulus)) % modulus
    return min(residue, modulus - residue) <= bound
