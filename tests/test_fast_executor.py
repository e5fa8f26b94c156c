"""The fast simulator gives exactly the golden executor's codes: per kind, per requantization method, on real models.

- :class:`Requantizer` against ``fixedpoint.requantize`` on random multipliers, shifts, biases, zero
  points and accumulator bounds, with accumulators placed on the rounding steps and exact ties; every
  method (float64, float64-proven, float64-guarded, exact) must be exercised.
- One small model per op family (random weights, random calibration, 8- and 16-bit activations),
  fed normal and saturating inputs, one sample and a batch of three.
- The real models (Fashion sample CNN, MobileNetV2, MiniLM, PP-OCRv4 det/rec/cls, Silero VAD):
  fast vs golden codes of every output on a realistic input, and a batch of two against two
  single runs; the fast plan must accelerate the heavy kinds (no golden ``linear``).
"""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler_core.api import mblt_compile, quantize
from compiler_core.quantization import executor
from compiler_core.quantization.fixedpoint import quantize_multiplier, requantize
from compiler_core.runtime.fastpath import FastExecutor
from compiler_core.runtime.fastpath.requant import Requantizer

RNG = np.random.default_rng(7)
ROOT = Path(__file__).resolve().parents[1]
FASHION = ROOT / "resources" / "samples" / "fashion_cnn"
INT16 = {"bit": {"layerOverrides": {"activation16Bits": ["*"]}}}


# -- requantization --------------------------------------------------------------------------------


def _random_layer(rng: np.random.Generator, trial: int):
    channels = int(rng.integers(1, 24))
    real = np.exp(rng.uniform(-14, 0, channels))
    if trial % 5 == 0:
        real *= rng.choice([-1, 1], channels)
    if trial % 7 == 0:
        real[:] = 2.0 ** -int(rng.integers(3, 20))  # M = 2**30: exact ties are reachable
    multiplier, shift = quantize_multiplier(real)
    bound = int(rng.choice([100, 5_000, 300_000, 10**7, 10**9, 10**12]))
    bias = rng.integers(-bound // 2 - 1, bound // 2 + 1, channels)
    bits = 8 if trial % 3 else 16
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    zero_point = int(rng.integers(low, high)) if trial % 2 else 0
    return real, multiplier, shift, bias, zero_point, (low, high), bound


def test_requantizer_equals_golden_requantize_with_every_method():
    rng = np.random.default_rng(0)
    methods = collections.Counter()
    for trial in range(240):
        real, multiplier, shift, bias, zero_point, clamp, bound = _random_layer(rng, trial)
        column = (-1, 1)
        requant = Requantizer(multiplier.reshape(column), shift.reshape(column), bias.reshape(column), zero_point,
                              clamp, bound)
        methods[requant.method] += 1
        acc = rng.integers(-bound, bound + 1, (real.size, 1000))
        steps = np.round((np.arange(16) - 8 + 0.5) / real.reshape(column)) - bias.reshape(column)
        acc[:, :16] = np.clip(steps + rng.integers(-1, 2, steps.shape), -bound, bound)
        fast = requant(acc.astype(np.float32 if bound < 1 << 24 else np.float64))
        golden = np.clip(requantize(acc + bias.reshape(column), multiplier.reshape(column), shift.reshape(column))
                         + zero_point, *clamp)
        assert np.array_equal(fast.astype(np.int64), golden), (trial, requant.method)
    assert {"float64", "float64-proven", "float64-guarded"} <= set(methods), methods


def test_exact_method_for_shifts_out_of_float_range():
    requant = Requantizer(np.array([1 << 30]), np.array([0]), None, 3, (-128, 127), 100)
    assert requant.method == "exact"
    acc = np.arange(-100, 101, dtype=np.float32)
    golden = np.clip(requantize(acc.astype(np.int64), 1 << 30, 0) + 3, -128, 127)
    assert np.array_equal(requant(acc).astype(np.int64), golden)


# -- one small model per op family -------------------------------------------------------------------


def _model(nodes, inputs: dict[str, list[int]], outputs: dict[str, list[int] | None], initializers=None):
    graph = helper.make_graph(
        nodes, "fast", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs.items()],
        [numpy_helper.from_array(np.asarray(v, dtype=np.float32), n) for n, v in (initializers or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def _weights(*shape):
    return RNG.standard_normal(shape).astype(np.float32) * 0.3


def _conv_block():
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c1"], ["r0"]),
             helper.make_node("Mul", ["r0", "per_channel"], ["r1"]),
             helper.make_node("Conv", ["r1", "wd"], ["c2"], pads=[1, 1, 1, 1], group=8, dilations=[1, 1]),
             helper.make_node("Clip", ["c2", "lo", "hi"], ["r2"]),
             helper.make_node("Conv", ["r2", "w3"], ["c3"]),
             helper.make_node("AveragePool", ["c3"], ["p"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["p", "c3"], ["s"]),
             helper.make_node("GlobalAveragePool", ["s"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1)]
    init = {"w1": _weights(8, 3, 3, 3), "b1": _weights(8), "per_channel": _weights(8, 1, 1), "wd": _weights(8, 1, 3, 3), "lo": 0.0, "hi": 6.0,
            "w3": _weights(6, 8, 1, 1), "wf": _weights(5, 6), "bf": _weights(5)}
    return _model(nodes, {"x": [1, 3, 12, 12]}, {"y": [1, 5]}, init)


def _conv1d_and_pooling():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[2, 2], dilations=[2]),
             helper.make_node("MaxPool", ["c"], ["m"], kernel_shape=[2], strides=[2]),
             helper.make_node("Sigmoid", ["m"], ["s"]),
             helper.make_node("ReduceMean", ["s", "axes"], ["y"], keepdims=1)]
    model = _model(nodes, {"x": [1, 4, 16]}, {"y": None}, {"w": _weights(6, 4, 3)})
    model.graph.initializer.append(numpy_helper.from_array(np.array([2], dtype=np.int64), "axes"))
    return model


def _attention():
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"]), helper.make_node("MatMul", ["x", "wk"], ["k"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["scores"]),
             helper.make_node("Div", ["scores", "scale"], ["scaled"]),
             helper.make_node("Softmax", ["scaled"], ["attn"], axis=-1),
             helper.make_node("MatMul", ["attn", "x"], ["ctx"]),
             helper.make_node("Mul", ["ctx", "q"], ["prod"]),
             helper.make_node("Sub", ["prod", "bias"], ["shifted"]),
             helper.make_node("LayerNormalization", ["shifted", "gamma", "beta"], ["norm"], axis=-1),
             helper.make_node("Gelu", ["norm"], ["act"]),
             helper.make_node("Reshape", ["act", "shape"], ["flat"]),
             helper.make_node("Concat", ["flat", "flat2"], ["y"], axis=1)]
    init = {"wq": _weights(8, 8), "wk": _weights(8, 8), "scale": 2.0, "bias": _weights(8),
            "gamma": 1 + _weights(8), "beta": _weights(8)}
    model = _model(nodes, {"x": [1, 6, 8], "flat2": [1, 16]}, {"y": None}, init)
    model.graph.initializer.append(numpy_helper.from_array(np.array([1, 48], dtype=np.int64), "shape"))
    return model


def _movement():
    nodes = [helper.make_node("Pad", ["x", "pads"], ["p"]),
             helper.make_node("Slice", ["p", "starts", "ends", "axes"], ["s"]),
             helper.make_node("Resize", ["s", "", "scales"], ["r"], mode="linear"),
             helper.make_node("Resize", ["r", "", "scales"], ["n"], mode="nearest"),
             helper.make_node("PRelu", ["n", "slope"], ["pr"]),
             helper.make_node("Unsqueeze", ["pr", "ax0"], ["u"]),
             helper.make_node("Squeeze", ["u", "ax0"], ["y"])]
    model = _model(nodes, {"x": [1, 2, 5, 5]}, {"y": None}, {"scales": [1.0, 1.0, 2.0, 2.0],
                                                           "slope": _weights(2, 1, 1)})
    for name, value in {"pads": [0, 0, 1, 1, 0, 0, 1, 1], "starts": [1], "ends": [6], "axes": [2], "ax0": [0]}.items():
        model.graph.initializer.append(numpy_helper.from_array(np.array(value, dtype=np.int64), name))
    return model


def _conv_transpose():
    nodes = [helper.make_node("ConvTranspose", ["x", "w", "b"], ["t"], strides=[2, 2], pads=[1, 0, 0, 1],
                              output_padding=[1, 1]),
             helper.make_node("ConvTranspose", ["t", "wg"], ["y"], strides=[1, 2], group=2, pads=[2, 1, 2, 1])]
    return _model(nodes, {"x": [1, 4, 5, 6]}, {"y": None},
                  {"w": _weights(4, 6, 3, 3), "b": _weights(6), "wg": _weights(6, 2, 2, 3)})


def _reductions_and_norms():
    """Div of two activations, n-ary Max/Min/Sum/Mean, Group/InstanceNormalization, ReduceL2, CumSum."""
    nodes = [helper.make_node("Sigmoid", ["z"], ["s"]),
             helper.make_node("Div", ["x", "s"], ["d"]),
             helper.make_node("Max", ["d", "x"], ["m"]),
             helper.make_node("Min", ["x", "z", "low"], ["mi"]),
             helper.make_node("Sum", ["m", "mi", "x"], ["su"]),
             helper.make_node("Mean", ["su", "z"], ["me"]),
             helper.make_node("GroupNormalization", ["me", "gscale", "gbias"], ["gn"], num_groups=2),
             helper.make_node("InstanceNormalization", ["me", "iscale", "ibias"], ["inn"]),
             helper.make_node("ReduceL2", ["inn", "axes"], ["l2"], keepdims=1),
             helper.make_node("CumSum", ["inn", "axis2"], ["cs"], reverse=1, exclusive=1),
             helper.make_node("CumSum", ["cs", "axis3"], ["cs2"]),
             helper.make_node("Div", ["l2", "cs2"], ["y"])]
    init = {"low": _weights(1, 4, 1, 1), "gscale": 1 + _weights(4), "gbias": _weights(4),
            "iscale": 1 + _weights(4), "ibias": _weights(4)}
    model = _model(nodes, {"x": [1, 4, 6, 6], "z": [1, 4, 6, 6]}, {"y": None, "cs2": None, "gn": [1, 4, 6, 6]}, init)
    for name, value in {"axes": [2, 3], "axis2": [2], "axis3": [3]}.items():
        model.graph.initializer.append(numpy_helper.from_array(np.array(value, dtype=np.int64), name))
    return model


def _class_token():
    """ViT's start: a constant class token concatenated before the tokens (a constant Concat piece)."""
    nodes = [helper.make_node("Concat", ["cls", "x"], ["t"], axis=1),
             helper.make_node("MatMul", ["t", "w"], ["y"])]
    return _model(nodes, {"x": [1, 4, 8]}, {"y": None}, {"cls": _weights(1, 1, 8), "w": _weights(8, 6)})


FAMILIES = {"class_token": _class_token, "conv_transpose": _conv_transpose, "conv": _conv_block, "conv1d_pool_lut": _conv1d_and_pooling, "attention": _attention,
            "movement": _movement, "reductions_norms": _reductions_and_norms}


@pytest.fixture(scope="module", params=[(family, bits) for family in FAMILIES for bits in (8, 16)],
                ids=lambda p: f"{p[0]}-a{p[1]}")
def family_program(request, tmp_path_factory):
    family, bits = request.param
    folder = tmp_path_factory.mktemp(family)
    source = folder / "model.onnx"
    onnx.save(FAMILIES[family](), str(source))
    mblt = mblt_compile(source, folder / "model.mblt", backend="onnx")
    config = {"compile_config": INT16} if bits == 16 else {}
    return quantize(mblt, use_random_calib=True, analysis=False, **config).model


@pytest.mark.parametrize("amplitude", [1.0, 30.0])
def test_small_models_match_golden_codes_single_and_batched(family_program, amplitude):
    fast = FastExecutor(family_program)
    feeds = {spec.name: (RNG.standard_normal([3, *spec.shape[1:]]) * amplitude).astype(np.float32)
             for spec in family_program.inputs}
    batched = fast.run_codes(feeds)
    for index in range(3):
        sample = {name: value[index:index + 1] for name, value in feeds.items()}
        golden = executor.run_codes(family_program, sample)
        single = fast.run_codes(sample)
        for name, codes in golden.items():
            assert np.array_equal(single[name], codes), (name, fast.methods())
            assert np.array_equal(batched[name][index:index + 1], codes), name


ALWAYS_FAST = {"add", "mul", "scale", "lut", "softmax", "layernorm", "divide", "extremum", "sum", "groupnorm",
               "reduce_l2", "cumsum", "reduce_sum", "average_pool", "concat", "clamp"}


def test_arithmetic_kinds_do_not_fall_back_to_golden(family_program):
    fast = FastExecutor(family_program)
    fallbacks = [op.kind for op, step in zip(family_program.ops, fast.steps)
                 if step.method == "golden" and op.kind in ALWAYS_FAST]
    assert not fallbacks, fast.methods()


def test_kept_tensors_match_the_golden_environment(family_program):
    feeds = {spec.name: RNG.standard_normal(spec.shape).astype(np.float32) for spec in family_program.inputs}
    golden = executor.execute(family_program, executor.quantize_inputs(family_program, feeds), keep=True)
    fast = FastExecutor(family_program).run_codes(feeds, keep=True)
    assert set(fast) == set(golden)
    for name, codes in golden.items():
        assert np.array_equal(fast[name], codes), name


def test_a_kind_without_a_fast_step_runs_its_golden_kernel(family_program, monkeypatch):
    from compiler_core.runtime.fastpath import plan

    plan._load_steps()  # registered first, so the empty registry below stays empty
    monkeypatch.setattr(plan, "FAST_STEPS", {})
    fast = FastExecutor(family_program)
    assert set(fast.methods()) == {"golden"}
    feeds = {spec.name: RNG.standard_normal([2, *spec.shape[1:]]).astype(np.float32) for spec in family_program.inputs}
    codes = fast.run_codes(feeds)
    for index in range(2):
        golden = executor.run_codes(family_program, {n: v[index:index + 1] for n, v in feeds.items()})
        for name, value in golden.items():
            assert np.array_equal(codes[name][index:index + 1], value)


@pytest.mark.parametrize("method", ["linear/integer/", "linear/float32-split/"])
def test_wide_dense_layer_on_16_bit_codes_splits_them_into_bytes_exactly(tmp_path, monkeypatch, method):
    if method == "linear/float32-split/":  # the path for weights beyond int8: take it by declining MatMulInteger
        from compiler_core.runtime.fastpath import linear

        monkeypatch.setattr(linear, "_integer_dense", lambda *args: None)
    nodes = [helper.make_node("Add", ["x", "bias"], ["wide"]),  # model inputs stay 8-bit; this output is 16-bit
             helper.make_node("MatMul", ["wide", "w"], ["y"])]
    model = _model(nodes, {"x": [1, 4, 256]}, {"y": None}, {"bias": _weights(256), "w": RNG.standard_normal((256, 32))})
    onnx.save(model, str(tmp_path / "model.onnx"))
    mblt = mblt_compile(tmp_path / "model.onnx", tmp_path / "model.mblt", backend="onnx")
    program = quantize(mblt, use_random_calib=True, analysis=False, compile_config=INT16).model
    fast = FastExecutor(program)
    assert any(name.startswith(method) for name in fast.methods()), fast.methods()
    feeds = {"x": (RNG.standard_normal([3, 4, 256]) * 30).astype(np.float32)}
    batched = fast.run_codes(feeds)
    for index in range(3):
        golden = executor.run_codes(program, {"x": feeds["x"][index:index + 1]})
        for name, codes in golden.items():
            assert np.array_equal(batched[name][index:index + 1], codes), name


# -- real models -------------------------------------------------------------------------------------


def _real_program(name: str, folder: Path):
    import realmodels

    if name == "fashion_cnn":
        mblt = mblt_compile(FASHION / "model.onnx", folder / "fashion.mblt")
        feed = {"image": RNG.random((1, 1, 28, 28)).astype(np.float32)}
    else:
        try:
            source, shapes, constants = realmodels.real_models()[name]()
        except realmodels.RealModelUnavailable as error:
            pytest.skip(f"{name}: {error}")
        if name == "ppocr_det":
            shapes = {key: [1, 3, 320, 320] for key in shapes}  # the golden executor is slow at 640x640
        mblt = mblt_compile(source, folder / f"{name}.mblt", backend="onnx", input_shape_dict=shapes,
                            constant_inputs=constants)
        feed = {k: v for k, v in realmodels.sample_inputs(source, shapes, seed=1, constant_inputs=constants).items()}
    if name == "minilm_l6":  # token ids must be real: random ones index past the vocabulary
        import realdata

        config = {"calib_data_path": realdata.minilm_calibration_manifest(8), "config_preset": "transformer_encoder"}
    else:
        config = {"use_random_calib": True}
    try:
        program = quantize(mblt, analysis=False, **config).model
    except ValueError as error:  # e.g. PP-OCRv4 rec: Div of two activations has no integer kernel yet
        pytest.skip(f"{name} does not quantize yet: {error}")
    return program, {spec.name: np.asarray(feed[spec.name]) for spec in program.inputs}


REAL = ["fashion_cnn", "mobilenet_v2", "minilm_l6", "ppocr_det", "ppocr_rec", "ppocr_cls", "silero_ifless"]


@pytest.mark.slow
@pytest.mark.parametrize("name", REAL)
def test_real_models_fast_codes_equal_golden_codes(name, tmp_path):
    program, feed = _real_program(name, tmp_path)
    fast = FastExecutor(program)
    assert "golden" not in {step.method for op, step in zip(program.ops, fast.steps) if op.kind == "linear"}
    golden = executor.run_codes(program, feed)
    codes = fast.run_codes(feed)
    for output, value in golden.items():
        assert np.array_equal(codes[output], value), (name, output)
    if not fast.batchable:  # e.g. Silero's state [2, 1, 128]: no leading batch axis to stack on
        return
    second = {key: value * 0.5 if value.dtype == np.float32 else value for key, value in feed.items()}
    batch = fast.run_codes({key: np.concatenate([feed[key], second[key]]) for key in feed})
    again = fast.run_codes(second)
    for output, value in golden.items():
        assert np.array_equal(batch[output][:1], value), (name, output)
        assert np.array_equal(batch[output][1:], again[output]), (name, output)


# -- the runtime ---------------------------------------------------------------------------------------


def test_model_infer_runs_a_batch_with_the_golden_codes(tmp_path, monkeypatch):
    from compiler_core.api import mxq_compile
    from compiler_core.runtime import Accelerator, Model

    monkeypatch.setenv("QBCOMPILER_CACHE_DIR", str(tmp_path / "cache"))
    mxq = mxq_compile(str(FASHION / "model.onnx"), "aries-rb", str(FASHION / "calib"), tmp_path / "fashion.mxq",
                      compile_config=FASHION / "compile_config.yaml", analysis_holdout=0).mxq_path
    model = Model(mxq, input_layout="NCHW")
    model.launch(Accelerator("aries-rb"))
    images = RNG.random((5, 1, 28, 28)).astype(np.float32)
    batch = model.infer(images, raw=True)[0]
    assert batch.shape[0] == 5
    for index in range(5):
        golden = model.artifact.run({"image": images[index:index + 1]}, raw=True, golden=True)[0]
        assert np.array_equal(batch[index:index + 1], golden)
        assert np.array_equal(model.infer(images[index:index + 1], raw=True)[0], golden)


def test_analysis_of_a_model_that_folds_heads_into_the_first_axis(tmp_path):
    """A one-sample tensor [heads, tokens, d] runs sample by sample; the analysis takes each sample's rows.

    A HuggingFace ViT ended in INTERNAL_ERROR here (its class-token Concat and head-folding Reshape).
    """
    nodes = [helper.make_node("Concat", ["cls", "x"], ["t"], axis=1),
             helper.make_node("Reshape", ["t", "heads"], ["h"]),
             helper.make_node("MatMul", ["h", "w"], ["m"]),
             helper.make_node("Reshape", ["m", "back"], ["y"])]
    model = _model(nodes, {"x": [1, 4, 8]}, {"y": None}, {"cls": _weights(1, 1, 8), "w": _weights(4, 6)})
    for name, value in {"heads": [2, 5, 4], "back": [1, 5, 12]}.items():
        model.graph.initializer.append(numpy_helper.from_array(np.array(value, dtype=np.int64), name))
    source = tmp_path / "heads.onnx"
    onnx.save(model, str(source))
    result = quantize(mblt_compile(source, tmp_path / "heads.mblt", backend="onnx"), use_random_calib=True)
    layers = {row["layer"]: row for row in result.analysis["layers"]}
    assert layers and all(row["samples"] > 1 for row in layers.values())
    assert all(row["sqnr_db"] > 20 for row in layers.values()), layers


def test_requantizer_blocks_on_threads_give_the_same_codes():
    rng = np.random.default_rng(3)
    channels = 64
    multiplier, shift = quantize_multiplier(np.exp(rng.uniform(-12, -4, channels)))
    bias = rng.integers(-5000, 5000, channels)
    shape = (-1, 1, 1)
    requant = Requantizer(multiplier.reshape(shape), shift.reshape(shape), bias.reshape(shape), -3, (-128, 127),
                          1 << 20)
    acc = rng.integers(-(1 << 20), 1 << 20, (2, channels, 64, 64))
    golden = np.clip(requantize(acc + bias.reshape(shape), multiplier.reshape(shape), shift.reshape(shape)) - 3,
                     -128, 127)
    assert requant.method != "exact"
    assert np.array_equal(requant(acc.astype(np.float32)).astype(np.int64), golden)
    assert np.array_equal(requant(acc[:1].astype(np.float32)).astype(np.int64), golden[:1])
