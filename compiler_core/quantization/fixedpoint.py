"""Fixed-point primitives of the virtual NPU, exactly as written in docs/numerics.md.

Everything here is exact integer arithmetic on numpy ``int64`` arrays: the golden executor and
the integer-parameter generator both call these functions, so they agree by construction.
"""

from __future__ import annotations

import numpy as np

INT64 = np.int64
_SATURATED = 1 << 60
MAX_ACCUMULATOR_BITS = 46
_ROUND_LIMIT = float(1 << 62)  # rounding saturates here instead of overflowing int64


def round_half_away(values: np.ndarray) -> np.ndarray:
    """Round float values to the nearest integer, halves away from zero (as int64; NaN -> 0)."""
    values = np.asarray(values, dtype=np.float64)
    rounded = round_half_away_float(values.reshape(-1)).astype(INT64).reshape(values.shape)
    return rounded[()] if not values.shape else rounded  # a scalar for a scalar, as numpy's ufuncs give


def round_half_away_float(values: np.ndarray) -> np.ndarray:
    """:func:`round_half_away` as float64 integer values (saturated at ``2**62``), for callers that go on in float."""
    values = np.asarray(values, dtype=np.float64)
    if np.isnan(values).any():
        values = np.where(np.isnan(values), 0.0, values)
    magnitude = np.abs(values)
    np.minimum(magnitude, _ROUND_LIMIT, out=magnitude)  # +-inf saturate too
    whole = np.floor(magnitude)
    magnitude -= whole  # the fraction, exact
    whole += magnitude >= 0.5  # exact: no 0.5 added before flooring
    return np.copysign(whole, values, out=whole)


def rounding_shift(values: np.ndarray, bits: int) -> np.ndarray:
    """``round_half_away(values / 2**bits)`` for int64 ``values``."""
    values = np.asarray(values, dtype=INT64)
    return np.sign(values) * ((np.abs(values) + (1 << (bits - 1))) >> bits)


def quantize_multiplier(real: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
    """Split real multipliers ``m`` into ``(M, S)`` with ``m ~= M * 2**-S`` and ``2**30 <= |M| < 2**31``.

    ``M`` carries the sign of ``m``; ``m == 0`` gives ``(0, 0)``. ``S`` may be any integer (large
    for tiny multipliers, small or negative for huge ones; see :func:`requantize`).
    """
    real = np.atleast_1d(np.asarray(real, dtype=np.float64))
    if not np.all(np.isfinite(real)):
        raise ValueError("multiplier must be finite")
    fraction, exponent = np.frexp(np.abs(real))  # |m| = fraction * 2**exponent, fraction in [0.5, 1)
    mantissa = round_half_away(fraction * (1 << 31))
    carry = mantissa == (1 << 31)
    mantissa = np.where(carry, 1 << 30, mantissa)
    exponent = exponent + carry
    shift = 31 - exponent.astype(INT64)
    zero = real == 0
    mantissa = np.where(zero, 0, mantissa) * np.where(real < 0, -1, 1)
    return mantissa.astype(INT64), np.where(zero, 0, shift).astype(INT64)


def requantize(accumulator: np.ndarray, multiplier: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """``round_half_away(acc * M / 2**S)`` computed exactly in int64.

    ``|acc|`` must stay below ``2**46``. Magnitudes of ``2**60`` or more saturate to ``2**60``
    (callers clamp to the output range anyway).
    """
    acc = np.asarray(accumulator, dtype=INT64)
    multiplier = np.asarray(multiplier, dtype=INT64)
    shift = np.asarray(shift, dtype=INT64)
    sign = np.sign(acc) * np.sign(multiplier)
    magnitude = _scaled_magnitude(np.abs(acc), np.abs(multiplier), shift)
    return sign * magnitude


def _scaled_magnitude(acc: np.ndarray, multiplier: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """``floor((acc * M + 2**(S-1)) / 2**S)`` for non-negative ``acc < 2**46`` and ``M < 2**31``."""
    if acc.size and shift.size and int(acc.max()) < (1 << 31) and int(shift.min()) >= 1 and int(shift.max()) <= 62:
        # fast path (8-bit layers): acc * M < 2**62, so the product and the half fit in int64
        return np.minimum((acc * multiplier + np.left_shift(1, shift - 1)) >> shift, _SATURATED)
    acc, multiplier, shift = np.broadcast_arrays(acc, multiplier, shift)
    high, low = multiplier >> 16, multiplier & 0xFFFF
    part_high = acc * high                     # < 2**61
    part_low = acc * low                       # < 2**62
    # S >= 17: floor((high*2**16 + low + 2**(S-1)) / 2**S) = floor((high + 2**(S-17) + low>>16) / 2**(S-16))
    wide = np.clip(shift, 17, 78)
    numerator = part_high + np.left_shift(np.ones_like(wide), wide - 17) + (part_low >> 16)
    result = np.where(shift - 16 < 63, numerator >> np.clip(wide - 16, 1, 62), 0)
    # S <= 16: floor((high*2**16 + low + R) / 2**S) = high << (16-S) + (low + R) >> S  (or low << -S)
    up = np.clip(16 - shift, 0, 60)
    high_part = np.left_shift(np.where(part_high < np.right_shift(_SATURATED, up), part_high, 0), up)
    half = np.where(shift >= 1, np.left_shift(1, np.clip(shift - 1, 0, 15)), 0)
    low_part = np.where(shift >= 1, (part_low + half) >> np.clip(shift, 0, 16),
                        np.left_shift(np.where(part_low < np.right_shift(_SATURATED, -np.minimum(shift, 0)), part_low, 0),
                                      np.clip(-shift, 0, 60)))
    overflow = (part_high >= np.right_shift(_SATURATED, up)) | ((shift < 1) & (part_low >= np.right_shift(
        _SATURATED, np.clip(-shift, 0, 60))))
    result = np.where(shift <= 16, np.where(overflow, _SATURATED, high_part + low_part), result)
    return np.minimum(result, _SATURATED)


def rounding_divide(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """Integer division rounding halves away from zero (``denominator > 0``)."""
    numerator = np.asarray(numerator, dtype=INT64)
    denominator = np.asarray(denominator, dtype=INT64)
    magnitude = (2 * np.abs(numerator) + denominator) // (2 * denominator)
    return np.sign(numerator) * magnitude


def integer_sqrt(values: np.ndarray) -> np.ndarray:
    """``floor(sqrt(v))`` for non-negative int64 ``v`` below ``2**62``, exact."""
    values = np.asarray(values, dtype=INT64)
    root = np.floor(np.sqrt(values.astype(np.float64))).astype(INT64)
    for _ in range(2):
        root = np.where(root * root > values, root - 1, root)
        root = np.where((root + 1) * (root + 1) <= values, root + 1, root)
    return root


def saturate(values: np.ndarray, low: int | np.ndarray, high: int | np.ndarray) -> np.ndarray:
    """Clamp to ``[low, high]`` (int64)."""
    return np.clip(np.asarray(values, dtype=INT64), low, high)
