"""GPTQ weight rounding: lower layer-output error than round-to-nearest, on the compiler's own weight grid."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from compiler_core.quantization.gptq import gptq_on_grid, gptq_round, output_error  # noqa: E402
from compiler_core.quantization.kernels.linear import _quantize_weight  # noqa: E402


def correlated_layer(seed: int = 0, samples: int = 2048, inputs: int = 96, outputs: int = 48):
    """A random weight and the Hessian of inputs that live near a 12-dimensional subspace (as real activations)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, 12)) @ rng.normal(size=(12, inputs)) + 0.05 * rng.normal(size=(samples, inputs))
    x[:, 3] *= 20  # one outlier channel
    weight = rng.normal(size=(outputs, inputs)) * 0.02
    return weight, x.T @ x / samples


def test_gptq_lowers_the_layer_output_error_below_round_to_nearest():
    weight, hessian = correlated_layer()
    codes, scale, off_grid = gptq_on_grid(weight, hessian)
    nearest, nearest_scale = _quantize_weight(weight, 8)
    gptq_error = output_error(weight, codes * scale[:, None], hessian)
    nearest_error = output_error(weight, nearest * nearest_scale[:, None], hessian)
    assert gptq_error < 0.3 * nearest_error
    assert off_grid == 0 and np.abs(codes).max() <= 127 and np.array_equal(codes, np.round(codes))


def test_gptq_codes_are_what_the_compiler_quantizes_them_to():
    weight, hessian = correlated_layer(seed=1)
    codes, scale, _ = gptq_on_grid(weight, hessian)
    stored = (codes * scale[:, None]).astype(np.float32)  # what the exported model holds
    compiled, compiled_scale = _quantize_weight(stored.astype(np.float64), 8)
    np.testing.assert_array_equal(compiled, codes)
    np.testing.assert_allclose(compiled_scale, scale, rtol=1e-6)


def test_gptq_with_uncorrelated_inputs_is_round_to_nearest():
    weight, _ = correlated_layer(seed=2)
    codes, scale = gptq_round(weight, np.diag(np.linspace(1, 3, weight.shape[1])))
    nearest, nearest_scale = _quantize_weight(weight, 8)  # a diagonal Hessian leaves nothing to compensate
    np.testing.assert_array_equal(codes, nearest)
    np.testing.assert_allclose(scale, nearest_scale)


def test_act_order_rounds_on_the_same_grid():
    weight, hessian = correlated_layer(seed=3)
    codes, scale = gptq_round(weight, hessian, act_order=True)
    assert np.abs(codes).max() <= 127
    assert output_error(weight, codes * scale[:, None], hessian) < output_error(
        weight, _quantize_weight(weight, 8)[0] * scale[:, None], hessian)
