"""CPU offload: split an MBLT into a CPU head, an NPU body and a CPU tail along the OffloadPlan."""

from __future__ import annotations

from dataclasses import dataclass

import onnx
import onnx.utils
import onnx_ir as ir

from compiler_core.targets import OffloadPlan


@dataclass
class Partition:
    """The three parts; ``head``/``tail`` are ONNX bytes (``None`` when empty), ``body`` an onnx-ir model."""

    head: bytes | None
    body: ir.Model
    tail: bytes | None
    body_inputs: list[str]
    body_outputs: list[str]

    def to_dict(self) -> dict:
        """Boundary description stored in the MXQ meta."""
        return {"head": self.head is not None, "tail": self.tail is not None,
                "body_inputs": self.body_inputs, "body_outputs": self.body_outputs}


def partition(model: ir.Model, plan: OffloadPlan) -> Partition:
    """Cut ``model`` into head / body / tail (the body keeps the MBLT's node names)."""
    proto = ir.to_proto(model)
    head_nodes, tail_nodes = set(plan.cpu_head), set(plan.cpu_tail)
    body_nodes = [node for node in proto.graph.node if node.name not in head_nodes | tail_nodes]
    graph_inputs = [value.name for value in proto.graph.input]
    graph_outputs = [value.name for value in proto.graph.output]
    produced_in_body = {name for node in body_nodes for name in node.output}
    initializers = {init.name for init in proto.graph.initializer}
    body_inputs = _ordered({name for node in body_nodes for name in node.input
                            if name and name not in produced_in_body and name not in initializers})
    tail_reads = {name for node in proto.graph.node if node.name in tail_nodes for name in node.input}
    body_outputs = _ordered({name for name in produced_in_body if name in tail_reads or name in graph_outputs})
    produced_in_head = {name for node in proto.graph.node if node.name in head_nodes for name in node.output}
    head_outputs = _ordered({name for name in produced_in_head
                             if name in body_inputs or name in tail_reads or name in graph_outputs})
    extractor = onnx.utils.Extractor(proto)
    head = _extract(extractor, [n for n in graph_inputs if _reaches(proto, n, head_nodes)],
                    head_outputs) if head_nodes else None
    # The tail reads the body's outputs, graph inputs, and what the head computed for it alone (a sequence
    # classifier's last-token index from the ids, which never passes through the NPU).
    tail = _extract(extractor, _ordered(set(body_outputs) | {n for n in tail_reads
                                                             if n in graph_inputs or n in produced_in_head}),
                    [n for n in graph_outputs if n not in body_outputs and n not in produced_in_head]
                    ) if tail_nodes else None
    body = ir.serde.deserialize_model(extractor.extract_model(body_inputs, body_outputs))
    body.metadata_props.update(model.metadata_props)
    return Partition(head, body, tail, body_inputs, body_outputs)


def _extract(extractor: onnx.utils.Extractor, inputs: list[str], outputs: list[str]) -> bytes:
    return extractor.extract_model(inputs, outputs).SerializeToString()


def _reaches(proto: onnx.ModelProto, name: str, nodes: set[str]) -> bool:
    return any(name in node.input for node in proto.graph.node if node.name in nodes)


def _ordered(names: set[str]) -> list[str]:
    return sorted(names)
