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


def test_conv_hessian_is_the_im2col_inputs_second_moment():
    import onnx_ir as ir
    from numpy.lib.stride_tricks import sliding_window_view

    from compiler_core.quantization.gptq import _conv_hessian

    rng = np.random.default_rng(4)
    x = rng.normal(size=(2, 4, 9, 7)).astype(np.float32)
    node = ir.node("Conv", [], attributes={"group": 2, "strides": [2, 1], "pads": [1, 0, 1, 2]})
    hessian, count = _conv_hessian(x, node, (6, 2, 3, 3))
    padded = np.pad(x, [(0, 0), (0, 0), (1, 1), (0, 2)])
    windows = sliding_window_view(padded, (3, 3), axis=(2, 3))[:, :, ::2]  # [N, C, oh, ow, 3, 3]
    for group in range(2):
        columns = windows[:, 2 * group:2 * group + 2].transpose(0, 2, 3, 1, 4, 5).reshape(-1, 18).astype(np.float64)
        np.testing.assert_allclose(hessian[group], columns.T @ columns / len(columns), rtol=1e-5, atol=1e-6)
    assert count == 2 * 5 * 7


def _conv_model(tmp_path):
    """Two convolutions reading channels that live near a 2-dimensional subspace (as real feature maps do)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    mixing = rng.normal(size=(8, 2)).astype(np.float32)
    first = rng.normal(size=(12, 8, 3, 3)).astype(np.float32) * 0.2
    second = rng.normal(size=(4, 12, 1, 1)).astype(np.float32) * 0.3
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1], name="conv"),
         helper.make_node("Relu", ["c"], ["r"], name="relu"),
         helper.make_node("Conv", ["r", "w2"], ["y"], name="pointwise")], "convs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(first, "w1"), numpy_helper.from_array(second, "w2")])
    source = tmp_path / "convs.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), str(source))

    def sample(seed):
        noise = np.random.default_rng(seed)
        latent = noise.normal(size=(2, 12, 12)).astype(np.float32)
        return {"x": (np.einsum("cl,lhw->chw", mixing, latent)
                      + 0.02 * noise.normal(size=(8, 12, 12)).astype(np.float32))[None]}

    calib = tmp_path / "calib"
    calib.mkdir()
    for index in range(8):
        np.save(calib / f"{index:02d}.npy", sample(index)["x"])
    return source, calib, [sample(100 + index) for index in range(4)]


def test_gptq_conv_weights_keep_the_program_exact_and_the_output_closer(tmp_path):
    import onnxruntime as ort

    from compiler_core.api import mblt_compile, quantize
    from compiler_core.quantization import executor
    from compiler_core.runtime.fastpath.plan import executor_for

    source, calib, samples = _conv_model(tmp_path)
    mblt = mblt_compile(source, tmp_path / "convs.mblt", backend="onnx")
    programs = {rounding: quantize(mblt, calib, analysis=False, analysis_holdout=0, config_preset="a16w8",
                                   bit_config={"weightRounding": rounding}).model for rounding in ("nearest", "gptq")}
    nearest, gptq = ({op.name: op for op in programs[key].ops if op.kind == "linear"} for key in ("nearest", "gptq"))
    assert set(nearest) == set(gptq) and len(gptq) == 2
    for name, op in gptq.items():
        assert op.attrs["weight_scale"] == nearest[name].attrs["weight_scale"]  # same grid, other codes
        assert op.consts["weight"].dtype == np.int8 and not np.array_equal(op.consts["weight"],
                                                                           nearest[name].consts["weight"])
    reference = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
    fast = executor_for(programs["gptq"])
    errors = {key: [] for key in programs}
    for sample in samples:
        expected = reference.run(None, sample)[0]
        golden = executor.run(programs["gptq"], sample)["y"]
        np.testing.assert_array_equal(fast.run(sample)["y"], golden)
        for key, program in programs.items():
            errors[key].append(float(np.mean((executor.run(program, sample)["y"] - expected) ** 2)))
    gain = 10 * np.log10(np.mean(errors["nearest"]) / np.mean(errors["gptq"]))
    assert gain > 2.0, (gain, errors)  # 2.6 dB measured


def test_grouped_gptq_gives_the_codes_of_one_group_at_a_time():
    from compiler_core.quantization.gptq import gptq_conv_codes
    from compiler_core.quantization.kernels.linear import weight_channel_scales

    rng = np.random.default_rng(6)
    for groups, per_group, inputs in ((24, 1, 1), (4, 3, 2)):  # depthwise, grouped
        weight = rng.normal(size=(groups * per_group, inputs, 3, 3))
        x = rng.normal(size=(groups, 200, inputs * 9)) @ rng.normal(size=(groups, inputs * 9, inputs * 9))
        hessians = np.matmul(x.transpose(0, 2, 1), x) / 200
        hessians[0, 2, :] = hessians[0, :, 2] = 0  # a dead input
        scale = weight_channel_scales(weight, 8)
        rows = weight.reshape(weight.shape[0], -1)
        expected = np.concatenate([gptq_round(rows[g * per_group:(g + 1) * per_group], hessians[g], 8,
                                              scale=scale[g * per_group:(g + 1) * per_group])[0]
                                   for g in range(groups)])
        np.testing.assert_array_equal(gptq_conv_codes(weight, hessians, scale, 8).reshape(rows.shape), expected)
