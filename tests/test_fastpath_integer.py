"""Dense layers on onnxruntime MatMulInteger: exact int32 sums for 8-bit and byte-split 16-bit inputs."""

from __future__ import annotations

import numpy as np
import pytest

from compiler_core.quantization.params import QuantParams
from compiler_core.runtime.fastpath.linear import _integer_dense


def _params(bits: int, signed: bool) -> QuantParams:
    return QuantParams(np.float64(0.1), np.int64(0), bits, signed)


@pytest.mark.parametrize(("bits", "signed", "zero_point"), [(8, True, 0), (8, True, -7), (8, False, 0), (8, False, 131),
                                                            (16, True, 0), (16, True, 1234), (16, False, 40000)])
def test_integer_dense_equals_int64_matmul_including_the_extreme_codes(bits, signed, zero_point):
    params = _params(bits, signed)
    rng = np.random.default_rng(bits + zero_point)
    weight = rng.integers(-127, 128, (48, 300))  # [N, K]
    weight[0] = 127
    weight[1] = -127
    weight[2, ::2], weight[2, 1::2] = 127, -127
    codes = rng.integers(params.qmin, params.qmax + 1, (2, 5, 300))
    codes[0, 0], codes[0, 1] = params.qmax, params.qmin  # worst-case products
    span = max(params.qmax - zero_point, zero_point - params.qmin)
    bound = span * int(np.abs(weight).sum(axis=1).max())
    accumulate = _integer_dense(weight, params, zero_point, bound)
    assert accumulate is not None
    got = accumulate(codes.astype(np.float32))
    expected = (codes - zero_point) @ weight.T
    assert np.array_equal(np.asarray(got, dtype=np.int64), expected)


def test_integer_dense_declines_what_it_cannot_do_exactly():
    weight = np.ones((4, 8), dtype=np.int64)
    assert _integer_dense(weight * 128, _params(8, True), 0, 10) is None  # weights beyond int8
    assert _integer_dense(weight, None, 0, 10) is None  # input without codes
    assert _integer_dense(weight, _params(8, True), np.array([0, 1]), 10) is None  # per-channel input zero point
    assert _integer_dense(weight, _params(8, True), 0, 1 << 31) is None  # int32 could overflow
