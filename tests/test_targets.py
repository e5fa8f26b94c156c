"""Tests for compiler_core.targets: device profiles, the op-support rules, reports and CPU offload."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx
import onnx.defs
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler_core.errors import ArgumentError, UnsupportedOpsError
from compiler_core.ops import UNITS, all_ops
from compiler_core.targets import (
    SupportStatus,
    apply_offload,
    check_support,
    format_report_table,
    get_device,
    list_devices,
    plan_cpu_offload,
    validate_inference_scheme,
)

FLOAT = TensorProto.FLOAT
ALL_DEVICES = ["aries-rb", "regulus-ra", "regulus-rb", "regulus-rb-usb"]


# -- model builders -----------------------------------------------------------------------------


def _const(name: str, array) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


def _weights(name: str, *shape: int) -> onnx.TensorProto:
    return _const(name, np.random.default_rng(0).standard_normal(shape).astype(np.float32))


def _model(nodes, inputs, outputs, initializers=()) -> ir.Model:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    return ir.from_proto(onnx.shape_inference.infer_shapes(proto, strict_mode=True))


def _io(name: str, shape, elem_type=FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, shape)


def _out(name: str) -> onnx.ValueInfoProto:
    """A graph output whose type and shape come from shape inference."""
    return helper.make_empty_tensor_value_info(name)


def _single(op_type: str, shape, extra_inputs=(), initializers=(), outputs=1, **attrs) -> ir.Model:
    """One node ``op_type(x, *extra_inputs)`` named ``node`` on a float input of ``shape``."""
    names = [f"y{i}" for i in range(outputs)]
    node = helper.make_node(op_type, ["x", *extra_inputs], names, name="node", **attrs)
    return _model([node], [_io("x", shape)], [_out(n) for n in names], initializers)


def _verdict(model: ir.Model, device: str = "aries-rb", node: str = "node"):
    return check_support(model, device).entries[node]


def _small_cnn(batch: int = 1) -> ir.Model:
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], name="fc", transB=1),
    ]
    inits = [
        _weights("w", 8, 3, 3, 3),
        _weights("b", 8),
        _weights("fc_w", 10, 8 * 16 * 16),
        _weights("fc_b", 10),
    ]
    for node in nodes:
        node.metadata_props.add(key="mblt.source_name", value=f"model/{node.name}")
    return _model(nodes, [_io("x", [batch, 3, 32, 32])], [_out("y")], inits)


def _transformer_block() -> ir.Model:
    nodes = [
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["n"], name="ln", axis=-1),
        helper.make_node("Erf", ["n"], ["e"], name="erf"),
        helper.make_node("Softmax", ["e"], ["y"], name="softmax", axis=-1),
    ]
    inits = [_weights("gamma", 32), _weights("beta", 32)]
    return _model(nodes, [_io("x", [1, 16, 32])], [_out("y")], inits)


# -- devices ------------------------------------------------------------------------------------


def test_device_registry_lists_the_four_device_strings():
    assert list_devices() == ALL_DEVICES


def test_peak_throughput_matches_published_figures():
    assert get_device("aries-rb").peak_tops == pytest.approx(80, rel=0.02)
    assert get_device("regulus-rb").peak_tops == pytest.approx(10, rel=0.02)
    assert get_device("aries-rb").total_cores == 8


def test_device_capabilities_follow_the_reference():
    assert not get_device("regulus-ra").has_mfu
    assert get_device("regulus-rb").has_mfu and get_device("aries-rb").has_mfu
    usb = get_device("regulus-rb-usb")
    assert usb.float_io is False and usb.usb_transfer_bytes_per_s == pytest.approx(400e6)
    assert get_device("regulus-rb").usb_transfer_bytes_per_s is None
    assert get_device("aries-rb").precisions == {
        "weights": ("int4", "int8", "int16"),
        "activations": ("int8", "int16"),
    }
    with pytest.raises(dataclasses.FrozenInstanceError):
        get_device("aries-rb").has_mfu = False  # type: ignore[misc]
    assert json.loads(json.dumps(get_device("aries-rb").to_dict()))["core_modes"] == [
        "single",
        "multi",
        "global4",
        "global8",
    ]


def test_device_lookup_ignores_case_and_spaces():
    assert get_device("  Regulus-RB ").name == "regulus-rb"


@pytest.mark.parametrize(
    ("chip", "expected"),
    [
        ("ARIES", ["aries-rb"]),
        ("aries", ["aries-rb"]),
        ("REGULUS", ["regulus-ra", "regulus-rb", "regulus-rb-usb"]),
        ("regulus", ["regulus-ra", "regulus-rb", "regulus-rb-usb"]),
    ],
)
def test_chip_names_are_rejected_with_their_device_strings(chip, expected):
    with pytest.raises(ArgumentError) as info:
        get_device(chip)
    assert "chip name, not a device string" in info.value.message
    chip_part = info.value.message.split("devices are:")[1]
    assert [name.strip(" .") for name in chip_part.split(",")] == expected
    assert "aries-rb" in info.value.hint and "regulus-rb-usb" in info.value.hint


def test_typo_in_device_string_lists_valid_strings():
    with pytest.raises(ArgumentError) as info:
        get_device("aries-rd")
    assert "Did you mean 'aries-rb'" in str(info.value)
    assert all(name in info.value.hint for name in ALL_DEVICES)
    assert info.value.code == "ARGUMENT_ERROR"


def test_inference_scheme_all_expands_per_chip():
    assert validate_inference_scheme("aries-rb", "all") == ["single", "multi", "global4", "global8"]
    assert validate_inference_scheme("aries-rb", "global8") == ["global8"]
    assert validate_inference_scheme("regulus-rb", "all") == ["single"]
    assert validate_inference_scheme(get_device("regulus-ra"), "single") == ["single"]


@pytest.mark.parametrize(
    ("device", "scheme"), [("regulus-rb", "multi"), ("regulus-ra", "global4"), ("aries-rb", "global16")]
)
def test_inference_scheme_not_offered_is_an_argument_error(device, scheme):
    with pytest.raises(ArgumentError) as info:
        validate_inference_scheme(device, scheme)
    assert repr(scheme) in info.value.message and "allowed: single" in info.value.message


# -- the rule table -----------------------------------------------------------------------------


def test_op_registry_covers_about_110_real_onnx_ops_with_known_units():
    assert len(all_ops()) >= 105
    for op_type, rule in all_ops().items():
        assert rule.unit in (*UNITS, None), op_type
        onnx.defs.get_schema(op_type, 21, "")  # raises on a misspelt op type or one newer than opset 21


def test_small_cnn_is_fully_supported_on_every_device():
    for device in ALL_DEVICES:
        report = check_support(_small_cnn(), device)
        assert report.all_supported, format_report_table(report)
        assert list(report.entries) == ["conv", "relu", "pool", "flatten", "fc"]
        assert report.unsupported_error() is None
    entries = check_support(_small_cnn(), "aries-rb").entries
    assert [e.unit for e in entries.values()] == ["MAC", "VEC", "VEC", "SHAPE", "MAC"]
    assert entries["conv"].source_name == "model/conv"


@pytest.mark.parametrize("device", ["aries-rb", "regulus-rb", "regulus-rb-usb"])
def test_mfu_ops_are_supported_where_the_mfu_exists(device):
    report = check_support(_transformer_block(), device)
    assert report.all_supported
    assert {e.unit for e in report.entries.values()} == {"MFU"}


def test_mfu_ops_need_the_mfu_on_regulus_ra():
    report = check_support(_transformer_block(), "regulus-ra")
    assert [e.status for e in report.entries.values()] == [SupportStatus.NEEDS_MFU] * 3
    softmax = report.entries["softmax"].reason
    assert softmax.startswith("Softmax needs the multi-function unit (MFU)")
    assert "regulus-ra does not have" in softmax and "regulus-rb" in softmax and "cpu_offload" in softmax
    error = report.unsupported_error()
    assert isinstance(error, UnsupportedOpsError)
    assert [op["op"] for op in error.fields["ops"]] == ["LayerNormalization", "Erf", "Softmax"]
    assert "regulus-rb" in error.hint and "cpu_offload" in error.hint


def test_batch_two_conv_is_flagged():
    entry = check_support(_small_cnn(batch=2), "aries-rb").entries["conv"]
    assert entry.status == SupportStatus.UNSUPPORTED
    assert entry.reason == "batch 2 not supported; NPU runs batch 1"


def test_a_batch_refusal_names_the_shape_to_give_not_cpu_offload():
    """slovorez pinned to 8 words a batch: the refusal offered cpu_offload (the CPU parts run batch 1 too) and
    replacing the Convs; the batch is the input's shape, so the hint names the one to give."""
    hint = check_support(_small_cnn(batch=2), "aries-rb").unsupported_error().hint
    assert "--input-shape x=1,3,32,32" in hint and "once per sample" in hint
    assert "cpu_offload" not in hint and "replace these ops" not in hint


@pytest.mark.parametrize(
    ("attrs", "reason"),
    [
        ({"kernel_shape": [33, 33]}, "kernel 33x33 exceeds the NPU limit of 32 per dimension"),
        ({"kernel_shape": [3, 3], "strides": [9, 9]}, "stride 9x9 exceeds the limit of 8"),
        ({"kernel_shape": [3, 3], "dilations": [65, 65]}, "dilation 65x65 exceeds the NPU limit of 64"),
    ],
)
def test_conv_window_limits_are_flagged(attrs, reason):
    kernel = attrs["kernel_shape"]
    model = _single("Conv", [1, 3, 256, 256], ["w"], [_weights("w", 4, 3, *kernel)], **attrs)
    entry = _verdict(model)
    assert entry.status == SupportStatus.UNSUPPORTED and entry.reason.startswith(reason)


def test_patchify_conv_with_stride_equal_to_kernel_is_supported():
    model = _single("Conv", [1, 3, 224, 224], ["w"], [_weights("w", 8, 3, 16, 16)], strides=[16, 16])
    assert _verdict(model).status == SupportStatus.SUPPORTED


def test_conv1d_and_depthwise_are_supported_and_conv3d_is_flagged():
    conv1d = _single("Conv", [1, 4, 64], ["w"], [_weights("w", 8, 4, 5)])
    depthwise = _single("Conv", [1, 8, 16, 16], ["w"], [_weights("w", 8, 1, 3, 3)], group=8)
    assert all(_verdict(m).status == SupportStatus.SUPPORTED for m in (conv1d, depthwise))
    conv3d = _verdict(_single("Conv", [1, 4, 8, 16, 16], ["w"], [_weights("w", 8, 4, 3, 3, 3)]))
    assert conv3d.status == SupportStatus.UNSUPPORTED and "3-D Conv not supported (1-D, 2-D only)" in conv3d.reason


def test_conv_with_activation_weights_is_flagged():
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="node")
    model = _model([node], [_io("x", [1, 3, 8, 8]), _io("w", [4, 3, 3, 3])], [_out("y")])
    assert "input 'W' must be a constant" in _verdict(model).reason


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        (
            lambda: _single(
                "Resize", [1, 3, 8, 8], ["", "s"], [_const("s", np.float32([1, 1, 2, 2]))], mode="linear",
                coordinate_transformation_mode="tf_crop_and_resize",
            ),
            "Resize coordinate_transformation_mode 'tf_crop_and_resize' not supported",
        ),
        (
            lambda: _single("Resize", [1, 3, 8, 8], ["", "s"], [_const("s", np.float32([1, 2, 2, 2]))]),
            "Resize may only scale the spatial axes",
        ),
        (lambda: _single("Cast", [1, 4], to=TensorProto.INT64), "Cast to int64 not supported"),
        (lambda: _single("Relu", [1, 1, 1, 1, 2, 2]), "rank-6 tensor 'x' exceeds the NPU limit of rank 5"),
        (lambda: _single("MaxPool", [1, 3, 8, 8], outputs=2, kernel_shape=[2, 2]), "MaxPool Indices output"),
        (lambda: _single("Einsum", [2, 2], ["x", "x"], equation="ij,jk,kl->il"), "no integer kernel for Einsum"),
        (lambda: _single("TopK", [1, 8], ["k"], [_const("k", np.int64([2]))], outputs=2), "no integer kernel for TopK"),
        (
            lambda: _single("Pad", [1, 3, 8, 8], ["p"], [_const("p", np.int64([0] * 8))], mode="wrap"),
            "Pad mode 'wrap' not supported",
        ),
        (lambda: _single("Det", [1, 3, 3]), "unsupported: no NPU implementation of Det"),
    ],
)
def test_constraint_violations_name_the_problem(model, reason):
    entry = _verdict(model())
    assert entry.status == SupportStatus.UNSUPPORTED
    assert reason in entry.reason


def test_integer_indices_computed_at_run_time_are_flagged():
    lookup = helper.make_node("Gather", ["table", "ids"], ["y"], name="node")
    model = _model([lookup], [_io("ids", [1, 4], TensorProto.INT64)], [_out("y")], [_weights("table", 10, 8)])
    assert _verdict(model).status == SupportStatus.SUPPORTED  # embedding lookup of model-input ids
    nodes = [helper.make_node("ArgMax", ["x"], ["ids"], axis=1, keepdims=0, name="argmax"),
             helper.make_node("Gather", ["table", "ids"], ["y"], name="node")]
    model = _model(nodes, [_io("x", [1, 10])], [_out("y")], [_weights("table", 10, 8)])
    verdict = check_support(model, "aries-rb").entries["node"]
    assert verdict.status == SupportStatus.UNSUPPORTED and "'ids' is int64 computed at run time" in verdict.reason
    cast = helper.make_node("Cast", ["mask"], ["y"], to=TensorProto.FLOAT, name="node")
    model = _model([cast], [_io("mask", [1, 4], TensorProto.INT64)], [_out("y")])
    assert _verdict(model).status == SupportStatus.SUPPORTED  # integer model input converted on arrival
    add = helper.make_node("Add", ["i", "i"], ["y"], name="node")
    model = _model([add], [_io("i", [1, 4], TensorProto.INT64)], [_out("y")])
    assert "input 'i' is int64 computed at run time" in _verdict(model).reason


@pytest.mark.parametrize(
    ("model", "needs_mfu"),
    [
        (lambda: _single("Div", [1, 4], ["d"], [_const("d", np.float32([2.0]))]), False),
        (lambda: _single("Div", [1, 4], ["x"]), True),
        (lambda: _single("Pow", [1, 4], ["e"], [_const("e", np.float32(2.0))]), False),
        (lambda: _single("Pow", [1, 4], ["e"], [_const("e", np.float32(0.5))]), True),
        (lambda: _single("HardSwish", [1, 4]), True),
        (lambda: _single("LeakyRelu", [1, 4]), False),
        (
            lambda: _single(
                "Clip", [1, 4], ["lo", "hi"], [_const("lo", np.float32(0)), _const("hi", np.float32(6))]
            ),
            False,
        ),
    ],
)
def test_conditional_mfu_use(model, needs_mfu):
    entry = _verdict(model(), "regulus-ra")
    expected = SupportStatus.NEEDS_MFU if needs_mfu else SupportStatus.SUPPORTED
    assert entry.status == expected, entry.reason


def test_a_kept_lstm_has_no_kernel_and_says_why():
    """Canonicalization unrolls LSTMs it can; one left in the graph has no integer kernel."""
    hidden, size = 4, 8
    inits = [_weights("W", 1, 4 * hidden, size), _weights("R", 1, 4 * hidden, hidden)]
    verdict = _verdict(_single("LSTM", [5, 1, size], ["W", "R"], inits, hidden_size=hidden))
    assert verdict.status == SupportStatus.UNSUPPORTED
    assert "no integer kernel for LSTM" in verdict.reason and "unrolls" in verdict.reason


# -- report -------------------------------------------------------------------------------------


def _with_unknown_ops() -> ir.Model:
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Det", ["r"], ["d0"], name="det_0"),
        helper.make_node("Det", ["r"], ["d1"], name="det_1"),
        helper.make_node("Add", ["d0", "d1"], ["y"], name="add"),
    ]
    return _model(nodes, [_io("x", [2, 3, 3])], [_out("y")])


def test_unknown_ops_make_one_error_listing_op_count_and_nodes():
    report = check_support(_with_unknown_ops(), "aries-rb")
    assert report.counts() == {"supported": 2, "needs_mfu": 0, "unsupported": 2, "cpu_offloaded": 0}
    assert not report.all_supported and not report.compilable
    assert [e.node for e in report.flagged()] == ["det_0", "det_1"]
    assert list(report.by_op()) == ["Relu", "Det", "Add"] and len(report.by_op()["Det"]) == 2
    error = report.unsupported_error()
    assert error.code == "UNSUPPORTED_OPS"
    assert error.fields["ops"] == [
        {
            "op": "Det",
            "count": 2,
            "nodes": ["det_0", "det_1"],
            "reason": "unsupported: no NPU implementation of Det",
        }
    ]
    assert "Det x2 (det_0, det_1)" in error.message and "cpu_offload" in error.hint


def test_error_lists_at_most_three_nodes_per_op():
    nodes = [helper.make_node("Det", ["x"], [f"d{i}"], name=f"det_{i}") for i in range(5)]
    model = _model(nodes, [_io("x", [3, 3])], [_out(f"d{i}") for i in range(5)])
    (op,) = check_support(model, "aries-rb").unsupported_error().fields["ops"]
    assert op["count"] == 5 and op["nodes"] == ["det_0", "det_1", "det_2"]


def test_report_serialises_to_json():
    report = check_support(_transformer_block(), "regulus-ra")
    data = json.loads(json.dumps(report.to_dict()))
    assert data["device"] == "regulus-ra" and data["counts"]["needs_mfu"] == 3
    assert data["nodes"][2] == {
        "node": "softmax",
        "op_type": "Softmax",
        "status": "needs_mfu",
        "reason": report.entries["softmax"].reason,
        "unit": "MFU",
        "source_name": "",
    }
    assert json.loads(json.dumps(report.unsupported_error().to_dict()))["code"] == "UNSUPPORTED_OPS"


def test_report_table_is_aligned_and_summarised():
    report = check_support(_with_unknown_ops(), "aries-rb")
    lines = format_report_table(report).splitlines()
    assert lines[0].split() == ["node", "op", "status", "reason"]
    assert len({line.index(line.split()[2]) for line in lines[:5]}) == 1  # status column aligned
    assert lines[-1] == "aries-rb: 4 node(s): 2 supported, 0 needs_mfu, 2 unsupported, 0 cpu_offloaded"
    flagged = format_report_table(report, only_flagged=True).splitlines()
    assert [line.split()[0] for line in flagged[1:-1]] == ["det_0", "det_1"]
    clean = format_report_table(check_support(_small_cnn(), "aries-rb"), only_flagged=True)
    assert "(no flagged nodes)" in clean


def test_unknown_device_in_check_support_is_an_argument_error():
    with pytest.raises(ArgumentError):
        check_support(_small_cnn(), "REGULUS")


# -- CPU offload --------------------------------------------------------------------------------


def _offload_model(inner_unsupported: bool) -> ir.Model:
    """x -> Asinh (head) -> Add -> LayerNorm [-> Atan] -> MatMul -> Atan -> Asinh (tail)."""
    body_end = "a" if inner_unsupported else "n"
    nodes = [
        helper.make_node("Asinh", ["x"], ["e"], name="embed"),
        helper.make_node("Add", ["e", "pos"], ["h"], name="add_pos"),
        helper.make_node("LayerNormalization", ["h", "gamma", "beta"], ["n"], name="ln"),
        *([helper.make_node("Atan", ["n"], ["a"], name="atan_mid")] if inner_unsupported else []),
        helper.make_node("MatMul", [body_end, "proj_w"], ["p"], name="proj"),
        helper.make_node("Atan", ["p"], ["t"], name="atan_tail"),
        helper.make_node("Asinh", ["t"], ["y"], name="asinh_tail"),
    ]
    inits = [
        _weights("pos", 1, 16, 32),
        _weights("gamma", 32),
        _weights("beta", 32),
        _weights("proj_w", 32, 8),
    ]
    return _model(nodes, [_io("x", [1, 16, 32])], [_out("y")], inits)


def test_offload_splits_head_body_and_tail():
    model = _offload_model(inner_unsupported=False)
    report = check_support(model, "aries-rb")
    plan = plan_cpu_offload(model, report)
    assert plan.cpu_head == ["embed"]
    assert plan.npu_body == ["add_pos", "ln", "proj"]
    assert plan.cpu_tail == ["atan_tail", "asinh_tail"]
    assert plan.inner_unsupported == [] and plan.npu_ready and plan.has_cpu_parts
    offloaded = apply_offload(report, plan)
    assert offloaded.compilable and not offloaded.all_supported
    assert offloaded.counts()["cpu_offloaded"] == 3
    assert offloaded.entries["embed"].reason.startswith(
        "runs on the CPU (head) because unsupported: no NPU implementation of Asinh"
    )
    assert offloaded.entries["asinh_tail"].reason == (
        "runs on the CPU (tail) because unsupported: no NPU implementation of Asinh"
    )
    assert report.entries["embed"].status == SupportStatus.UNSUPPORTED  # the input report is unchanged
    assert json.loads(json.dumps(plan.to_dict()))["cpu_tail"] == ["atan_tail", "asinh_tail"]


def test_unsupported_node_inside_the_body_is_reported():
    model = _offload_model(inner_unsupported=True)
    report = check_support(model, "aries-rb")
    plan = plan_cpu_offload(model, report)
    assert plan.cpu_head == ["embed"] and plan.cpu_tail == ["atan_tail", "asinh_tail"]
    assert plan.npu_body == ["add_pos", "ln", "atan_mid", "proj"]
    assert plan.inner_unsupported == ["atan_mid"] and not plan.npu_ready
    offloaded = apply_offload(report, plan)
    assert not offloaded.compilable
    assert [e.node for e in offloaded.blocking()] == ["atan_mid"]
    assert "inside the NPU body" in offloaded.entries["atan_mid"].reason
    assert offloaded.unsupported_error().fields["ops"][0]["nodes"] == ["atan_mid"]


def test_missing_mfu_at_the_end_is_offloaded_to_the_cpu_tail():
    cnn = _small_cnn()
    softmax = ir.node("Softmax", [cnn.graph.outputs[0]], name="softmax", num_outputs=1)
    cnn.graph.append(softmax)
    softmax.outputs[0].name = "probs"
    cnn.graph.outputs[0] = softmax.outputs[0]
    report = check_support(cnn, "regulus-ra")
    plan = plan_cpu_offload(cnn, report)
    assert plan.cpu_head == [] and plan.cpu_tail == ["softmax"] and plan.npu_ready
    assert apply_offload(report, plan).entries["softmax"].status == SupportStatus.CPU_OFFLOADED
    # Planning again from the offloaded report gives the same split.
    assert plan_cpu_offload(cnn, apply_offload(report, plan)) == plan


def test_graph_of_one_unsupported_node_goes_to_the_head():
    model = _single("Det", [3, 3])
    plan = plan_cpu_offload(model, check_support(model, "aries-rb"))
    assert plan.cpu_head == ["node"] and plan.npu_body == [] and plan.cpu_tail == []


def test_supported_node_between_head_nodes_joins_the_cpu_head():
    """RoBERTa's position ids: Equal -> Not (supported) -> Cast -> CumSum ... on the token ids, all on the CPU."""
    nodes = [
        helper.make_node("Equal", ["ids", "pad"], ["is_pad"], name="equal"),
        helper.make_node("Not", ["is_pad"], ["keep"], name="not"),
        helper.make_node("Cast", ["keep"], ["keep_i"], name="cast", to=TensorProto.INT64),
        helper.make_node("CumSum", ["keep_i", "axis"], ["positions"], name="cumsum"),
        helper.make_node("Gather", ["table", "positions"], ["pos_embed"], name="gather", axis=0),
        helper.make_node("Add", ["pos_embed", "x"], ["y"], name="add"),
    ]
    inits = [_const("pad", np.int64(1)), _const("axis", np.int64(1)), _weights("table", 16, 8)]
    model = _model(nodes, [_io("ids", [1, 16], TensorProto.INT64), _io("x", [1, 16, 8])], [_out("y")], inits)
    report = check_support(model, "aries-rb")
    assert report.entries["not"].status == SupportStatus.SUPPORTED
    plan = plan_cpu_offload(model, report)
    assert plan.cpu_head == ["equal", "not", "cast", "cumsum", "gather"]
    assert plan.npu_body == ["add"] and plan.npu_ready
