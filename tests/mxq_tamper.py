"""Structure-aware tampering of a real MXQ: valid CRCs, wrong content (shared by tests and `make fuzz`)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from compiler_core.mxq import read_mxq, write_mxq


def load_parts(path: Path) -> dict[str, Any]:
    """The sections of a good MXQ, as Python values to tamper with."""
    mxq = read_mxq(path)
    return {"device": mxq.target_device, "meta": mxq.meta, "program": mxq.program,
            "consts": {name: np.array(array) for name, array in mxq.consts.items()},
            "cpu": dict(mxq.cpu) or None, "calib": mxq.calib}


def write_parts(parts: dict[str, Any], path: Path) -> Path:
    """Write (possibly tampered) parts as a container with valid CRCs."""
    return write_mxq(path, target_device=parts["device"], meta=parts["meta"], program=parts["program"],
                     consts=parts["consts"], cpu=parts["cpu"], calib=parts["calib"])


def _wrong_type(value: Any) -> Any:
    return 7 if isinstance(value, str) else "tampered"


def tamperings(parts: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every content tampering the issue lists, applied to every operation: (label, tampered parts)."""
    ops = parts["program"]["ops"]
    defined = [spec["name"] for spec in parts["program"]["inputs"]]
    for index, op in enumerate(ops):
        label = f"op {index} {op['name']} ({op['kind']})"
        yield f"{label}: unknown kernel kind", _edit(parts, index, lambda o: o.update(kind="no_such_kernel"))
        if op["kind"] in ("move", "exact"):  # long fuzz: an empty op type reached onnx.reference at infer
            for op_type in ("", "NoSuchOp"):
                yield (f"{label}: op type {op_type!r}", _edit(parts, index, lambda o, t=op_type: o.update(op_type=t)))
        for key, value in op["attrs"].items():
            yield (f"{label}: attribute {key} of the wrong type",
                   _edit(parts, index, lambda o, k=key, v=value: o["attrs"].update({k: _wrong_type(v)})))
        for key, name in op["consts"].items():
            tampered = copy.copy(parts)
            array = parts["consts"][name]
            tampered["consts"] = {**parts["consts"], name: np.append(array.reshape(-1), array.reshape(-1)[:1])}
            yield f"{label}: constant {key} of the wrong shape", tampered
        for slot, name in enumerate(op["inputs"]):
            if name:
                yield (f"{label}: input {slot} names a tensor nothing defines",
                       _edit(parts, index, lambda o, s=slot: o["inputs"].__setitem__(s, "ghost_tensor")))
                if index + 1 < len(ops):
                    later = ops[index + 1]["outputs"][0]
                    yield (f"{label}: input {slot} reads a later operation's output",
                           _edit(parts, index, lambda o, s=slot, t=later: o["inputs"].__setitem__(s, t)))
        for slot, name in enumerate(op["inputs"]):
            if name:
                yield (f"{label}: input {slot} emptied",
                       _edit(parts, index, lambda o, s=slot: o["inputs"].__setitem__(s, "")))
        if op["attrs"].get("layout") in ("conv", "conv_transpose"):  # long fuzz: conv output no longer the recorded
            yield (f"{label}: pads grown", _edit(parts, index, lambda o: o["attrs"].update(
                pads=[pad + 1 for pad in o["attrs"]["pads"]])))
        if op["kind"] == "linear":  # long fuzz: zero points for another channel count broke the fast path's broadcast
            for key in ("zp_x", "zp_y"):
                yield (f"{label}: {key} for 2 channels",
                       _edit(parts, index, lambda o, k=key: o["attrs"].update({k: [0, 0]})))
        for output in op["outputs"]:
            yield f"{label}: recorded shape of {output} altered", _reshaped(parts, output)
        if defined:
            yield (f"{label}: output redefines an existing tensor",
                   _edit(parts, index, lambda o, t=defined[0]: o["outputs"].__setitem__(0, t)))
        defined.extend(op["outputs"])
    yield from _npu_tamperings(parts)


def _npu_tamperings(parts: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The tile program's layer list with JSON values of the wrong type (the long fuzz's two findings)."""
    if not parts["program"].get("npu", {}).get("layers"):
        return
    for label, key, value in (("inputs null", "inputs", None), ("outputs nested", "outputs", [["x"]]),
                              ("ops a string", "ops", "0"), ("fused null", "fused", None),
                              ("unknown unit", "unit", "gpu")):
        tampered = copy.deepcopy({k: v for k, v in parts.items() if k != "consts"})
        tampered["consts"] = parts["consts"]
        tampered["program"]["npu"]["layers"][0][key] = value
        yield f"tile program layer 0: {label}", tampered


def _reshaped(parts: dict[str, Any], name: str) -> dict[str, Any]:
    """The program records a different (same-rank) shape for tensor ``name``."""
    tampered = copy.copy(parts)
    tampered["program"] = copy.deepcopy(parts["program"])
    shape = tampered["program"]["shapes"][name]
    shape[-1] += 1
    return tampered


def _edit(parts: dict[str, Any], index: int, change) -> dict[str, Any]:
    tampered = copy.copy(parts)
    tampered["program"] = copy.deepcopy(parts["program"])
    change(tampered["program"]["ops"][index])
    return tampered
