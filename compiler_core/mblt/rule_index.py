"""Rewrite rules tried only on nodes their pattern can start from, and the optimizer loop that uses them.

onnxscript's ``RewriteRuleSet`` tries every rule on every node; a rule whose pattern ends in one
node of a fixed op type fails on any other node at its first check, after setting up a match and
formatting a failure message (PP-OCR cls: 57,000 tries, 2.7 s of a 4.4 s parse under cProfile).
:func:`indexed_rules` gives copies of the rules that return ``None`` at once for a node of another op
type, or whose inputs are not produced by the op types the pattern computes them with, which is
exactly what the full match would return, so the rewritten graph is the same. (A
pattern with several output nodes, such as onnxscript's ``SlicesSplit``, also scans the whole graph
per try: quadratic in the node count without the index.)
:func:`optimize` is ``onnxscript.optimizer.optimize_ir`` (same passes, same order) with the default
rewrite rules indexed that way, a constant folder that skips node-level shape inference where the
node's outputs already have static shapes, and :class:`LiftConstants`, the library's constant lifting
without a ``typing.Protocol`` ``isinstance`` per Constant node.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import logging
import math
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np
import onnx
import onnx_ir as ir
from onnx_ir.passes import common as common_passes
from onnx_ir.passes.common import initializer_deduplication as _deduplication
from onnxscript import optimizer as onnxscript_optimizer
from onnxscript import rewriter
from onnxscript.optimizer import _constant_folding
from onnxscript.rewriter import RewriteRuleSet, _context
from onnxscript.rewriter import _rewrite_rule as rewrite_rule_module
from onnxscript.rewriter._matcher import SimplePatternMatcher
from onnxscript.rewriter._pattern_ir import Constant as ConstantPattern
from onnxscript.rewriter._pattern_ir import NodeOutputPattern, StringConstantPattern, Var
from onnxscript.rewriter._rewrite_rule import RewriteRule
from onnxscript.rewriter.rules.common import _fuse_batchnorm, _no_op

logger = logging.getLogger(__name__)


def root_op_type(rule: RewriteRule) -> str | None:
    """The op type every node the rule can match at must have, or ``None`` when any node may start a match."""
    pattern = getattr(rule, "_target_pattern", None)
    matcher = getattr(rule, "_matcher", None)
    if pattern is None or type(matcher) is not SimplePatternMatcher or not pattern.output_nodes:
        return None
    op = pattern.output_nodes[0].op  # a multi-output pattern is matched with the node as its first output node
    return op.value() if isinstance(op, StringConstantPattern) else None


def input_op_types(rule: RewriteRule) -> list[tuple[int, str]]:
    """(input position, op type) pairs the root node's inputs must be produced by for the rule to match.

    An input the pattern computes with a node of a fixed op type can only match a value that such a
    node produces (the matcher fails on anything else, a graph input or an initializer included).
    """
    pattern = getattr(rule, "_target_pattern", None)
    if root_op_type(rule) is None:
        return []
    required = []
    for index, value in enumerate(pattern.output_nodes[0].inputs):
        if isinstance(value, NodeOutputPattern) and isinstance(value.producer().op, StringConstantPattern):
            required.append((index, value.producer().op.value()))
    return required


def producer_tree(rule: RewriteRule, depth: int = 4) -> tuple[tuple[int, str, tuple], ...]:
    """:func:`input_op_types` followed up the pattern: (input position, op type, the same for that producer's inputs)
    down to ``depth`` nodes from the root. The matcher matches a computed input's producer with the pattern's node
    (its op type first) and that node's inputs in turn, so a graph whose producers have other op types fails it too
    (a pattern written in several operand orders is a rule per order: only one order's producers fit)."""
    if root_op_type(rule) is None:
        return ()
    return _required_producers(rule._target_pattern.output_nodes[0], depth)


def shared_variables(rule: RewriteRule, depth: int = 4) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """The places, within :func:`producer_tree`'s reach, of each pattern variable the pattern reads more than once: for
    each, the input-position paths from the root (``(1,)``: the root's input 1; ``(0, 0)``: input 0 of the root's
    input-0 producer). The matcher binds a variable to one value, so a graph whose values there differ fails it (the
    ``x`` of ``HardSigmoid(x) * x``)."""
    if root_op_type(rule) is None:
        return ()
    places: dict[str, list[tuple[int, ...]]] = {}
    _variable_places(rule._target_pattern.output_nodes[0], (), depth, places)
    return tuple(tuple(paths) for paths in places.values() if len(paths) > 1)


def _variable_places(node_pattern, path: tuple[int, ...], depth: int, places: dict) -> None:
    for index, value in enumerate(node_pattern.inputs):
        if isinstance(value, NodeOutputPattern) and isinstance(value.producer().op, StringConstantPattern):
            if depth > 1:
                _variable_places(value.producer(), (*path, index), depth - 1, places)
        elif isinstance(value, Var) and value.name is not None:
            places.setdefault(value.name, []).append((*path, index))


def _at(node: ir.Node, path: tuple[int, ...]) -> ir.Value | None:
    """The value at ``path`` from ``node`` (see :func:`shared_variables`), whose producers :func:`_inputs_produced_by`
    found."""
    value = None
    for index in path:
        if value is not None:
            node = value.producer()
            if node is None:
                return None
        value = node.inputs[index] if index < len(node.inputs) else None
        if value is None:
            return None
    return value


def _required_producers(node_pattern, depth: int) -> tuple[tuple[int, str, tuple], ...]:
    required = []
    for index, value in enumerate(node_pattern.inputs):
        if isinstance(value, NodeOutputPattern) and isinstance(value.producer().op, StringConstantPattern):
            inner = _required_producers(value.producer(), depth - 1) if depth > 1 else ()
            required.append((index, value.producer().op.value(), inner))
    return tuple(required)


def constant_inputs(rule: RewriteRule) -> list[tuple[int, bool]]:
    """(input position, scalar?) of the root node's inputs the pattern requires to be constants.

    The matcher fails a constant pattern (``x * 1``, ``x + 0``) on a value without ``const_value``, and
    a scalar one on a constant of rank > 0, before it compares the value.
    """
    pattern = getattr(rule, "_target_pattern", None)
    if root_op_type(rule) is None:
        return []
    return [(index, not isinstance(value.value, list)) for index, value in enumerate(pattern.output_nodes[0].inputs)
            if isinstance(value, ConstantPattern)]


def indexed_rules(rules: Sequence[RewriteRule]) -> list[RewriteRule]:
    """Shallow copies of ``rules`` that skip nodes of another op type than their pattern's root."""
    return [_skip_other_op_types(rule) for rule in rules]


class Prefilter(NamedTuple):
    """What an indexed rule checks on a node of its pattern's root op type before the library's full try (the pattern
    match and check), each a test the full try would also fail: the root's inputs are produced by the op types the
    pattern computes them with (and their inputs in turn, four nodes up), a variable the pattern reads twice there is
    one value, the root's constant operands are the pattern's constants, and the rule's condition
    (:data:`_RULE_CONDITIONS`) holds. Empty checks are skipped."""

    producers: tuple[tuple[int, str, tuple], ...]
    """What :func:`producer_tree` requires of the root's inputs."""
    constants: tuple[tuple[int, ConstantPattern], ...]
    condition: Callable[[ir.Node], bool] | None
    full_try: Callable
    """The library's ``try_rewrite`` of the rule."""
    shared: tuple[tuple[tuple[int, ...], ...], ...] = ()
    """What :func:`shared_variables` finds: places that must hold one value."""


def admits(prefilter: Prefilter, node: ir.Node) -> bool:
    """True if the full try of the prefilter's rule may rewrite ``node`` (of the rule's root op type)."""
    return ((not prefilter.producers or _inputs_produced_by(node, prefilter.producers))
            and (not prefilter.shared or _same_values(node, prefilter.shared))
            and (not prefilter.constants or _constants_match(node, prefilter.constants))
            and (prefilter.condition is None or _holds(prefilter.condition, node)))


def _same_values(node: ir.Node, shared: tuple[tuple[tuple[int, ...], ...], ...]) -> bool:
    for paths in shared:
        first = _at(node, paths[0])
        if any(_at(node, path) is not first for path in paths[1:]):
            return False
    return True


def _skip_other_op_types(rule: RewriteRule) -> RewriteRule:
    op_type = root_op_type(rule)
    if op_type is None:
        return rule
    indexed = copy.copy(rule)
    full_try = rule.try_rewrite
    prefilter = Prefilter(producer_tree(rule), tuple(_constant_patterns(rule)),
                          _RULE_CONDITIONS.get(rule.name or ""), full_try, shared_variables(rule))

    def try_rewrite(model, graph_or_function, node, *, verbose=None, tracer=None):
        if tracer is None and (node.op_type != op_type or not admits(prefilter, node)):
            return None
        return full_try(model, graph_or_function, node, verbose=verbose, tracer=tracer)

    indexed.try_rewrite = try_rewrite
    indexed.prefilter = prefilter  # read by IndexedRuleSet, which calls admits and full_try without the wrapper
    return indexed


def _inputs_produced_by(node: ir.Node, producers: Sequence[tuple[int, str, tuple]]) -> bool:
    """True if the node's inputs are produced by nodes of the op types :func:`producer_tree` requires, up the tree."""
    for index, op_type, inner in producers:
        value = node.inputs[index] if index < len(node.inputs) else None
        producer = value.producer() if value is not None else None
        if producer is None or producer.op_type != op_type or (inner and not _inputs_produced_by(producer, inner)):
            return False
    return True


def _constant_patterns(rule: RewriteRule) -> list[tuple[int, ConstantPattern]]:
    """(input position, pattern) of the root node's inputs the pattern requires to be given constants."""
    if root_op_type(rule) is None:
        return []
    pattern = rule._target_pattern
    return [(index, value) for index, value in enumerate(pattern.output_nodes[0].inputs)
            if isinstance(value, ConstantPattern)]


def _constants_match(node: ir.Node, constants: Sequence[tuple[int, ConstantPattern]]) -> bool:
    """False if an input the pattern wants to be a given constant is not one: the comparison of onnxscript's matcher
    (``PatternMatcher._match_constant``: a constant, a scalar or a vector of the pattern's length, each value close to
    the pattern's within its tolerances), which would fail the full match the same way."""
    for index, pattern in constants:
        value = node.inputs[index] if index < len(node.inputs) else None
        const = value.const_value if value is not None else None
        if const is None:
            return False
        try:
            array = const.numpy()
        except Exception:  # noqa: BLE001 - the full match decides (the matcher fails on a missing file)
            return True
        expected = pattern._value
        if isinstance(expected, list):
            if array.shape != (len(expected),) or not all(
                    math.isclose(array.item(i), expected[i], rel_tol=pattern._rel_tol, abs_tol=pattern._abs_tol)
                    for i in range(len(expected))):
                return False
        elif array.ndim != 0 or not math.isclose(array.item(), expected, rel_tol=pattern._rel_tol,
                                                 abs_tol=pattern._abs_tol):
            return False
    return True


def _holds(condition: Callable[[ir.Node], bool], node: ir.Node) -> bool:
    try:
        return condition(node)
    except Exception:  # noqa: BLE001 - the full try decides (and raises) as it would without the condition
        return True


def _explicit_padding_needed(node: ir.Node) -> bool:
    """First condition of onnxscript's ``NormalizePadFormatConv`` check: an ``auto_pad`` other than NOTSET."""
    return node.attributes.get_string("auto_pad", None) not in (None, "NOTSET")


def _bias_may_be_zero(node: ir.Node) -> bool:
    """onnxscript's ``RemoveOptionalBiasFrom*`` match and check (Conv, ConvTranspose, Gemm with a bias at input 2):
    the pattern has exactly three inputs and its variable ``b`` never matches a missing one; the check wants an
    all-zero constant bias."""
    if len(node.inputs) != 3 or node.inputs[2] is None:
        return False
    tensor = ir.convenience.get_const_tensor(node.inputs[2])
    return tensor is not None and bool(np.equal(tensor.numpy(), 0.0).all())


def _kernel_too_wide(node: ir.Node) -> bool:
    """First conditions of our ``SplitWideConvKernel`` check: constant weights with a kernel wider than the NPU's."""
    from compiler_core.ops.constraints import MAX_KERNEL

    weights = node.inputs[1] if len(node.inputs) > 1 else None
    if weights is None or weights.const_value is None:
        return weights is None and len(node.inputs) > 1  # a missing weight input: the full try decides
    return any(size > MAX_KERNEL for size in weights.const_value.shape[2:])


def _stride_too_long(node: ir.Node) -> bool:
    """First condition of our ``FramedStridedConv`` check: a stride longer than the NPU's."""
    from compiler_core.ops.constraints import MAX_STRIDE

    strides = node.attributes.get_ints("strides", None)
    return strides is not None and any(stride > MAX_STRIDE for stride in strides)


def _operand_constant_after(producer: str) -> Callable[[ir.Node], bool]:
    """Conditions of our ``{producer}{Mul,Add,Sub,Div}Channel`` checks, in either operand order: one operand a
    constant, the other the output of a ``producer`` (Conv, ConvTranspose) that nothing else reads (not a graph
    output)."""

    def condition(node: ir.Node) -> bool:
        constant = any(value is not None and value.const_value is not None for value in node.inputs)
        return constant and any(
            value is not None and value.producer() is not None and value.producer().op_type == producer
            and len(value.uses()) == 1 and not value.is_graph_output() for value in node.inputs)

    return condition


def _scaled_conv_plus_scalar(node: ir.Node) -> bool:
    """onnxscript's ``ConvAffineFusion`` (``Conv * scale + offset``), in any operand order: one operand of the Add is
    a Mul with a Conv's output among its operands, and one is a one-element constant (or made by a ``Constant``
    node, which the check evaluates first)."""
    scaled = False
    scalar = False
    for value in node.inputs:
        producer = value.producer() if value is not None else None
        if producer is not None and producer.op_type == "Mul":
            scaled = scaled or any(operand is not None and operand.producer() is not None
                                   and operand.producer().op_type == "Conv" for operand in producer.inputs)
        if value is not None and ((value.const_value is not None and value.const_value.size == 1)
                                  or (producer is not None and producer.op_type == "Constant")):
            scalar = True
    return scaled and scalar


def _shape_computed(node: ir.Node) -> bool:
    """First condition of onnxscript's ``MaterializeReshapeShape`` check: the Reshape's target shape is not a
    constant already."""
    shape = node.inputs[1] if len(node.inputs) > 1 else None
    return shape is None or shape.const_value is None


def _normalized_deviation(node: ir.Node) -> bool:
    """onnxscript's ``LayerNormFusion`` (``Mul(normalized, scale)``): its first operand is computed by a Mul or a Div
    (``deviation * inv_std_dev`` or ``deviation / std_dev``, the pattern's two ways) whose first operand is computed
    by a Sub (``deviation = x - mean``)."""
    normalized = node.inputs[0] if node.inputs else None
    producer = normalized.producer() if normalized is not None else None
    if producer is None or producer.op_type not in ("Mul", "Div") or not producer.inputs:
        return False
    deviation = producer.inputs[0]
    return deviation is not None and deviation.producer() is not None and deviation.producer().op_type == "Sub"


def _bound_computed(node: ir.Node) -> bool:
    """Our ``ClipRuntimeBounds`` check: a Clip bound (a named input 1 or 2) that is not a constant."""
    return any(value is not None and value.name and value.const_value is None for value in node.inputs[1:3])


_RULE_CONDITIONS: dict[str, Callable[[ir.Node], bool]] = {
    "LayerNormFusion": _normalized_deviation,
    "ClipRuntimeBounds": _bound_computed,
    "MaterializeReshapeShape": _shape_computed,
    "SplitWideConvKernel": _kernel_too_wide,
    "FramedStridedConv": _stride_too_long,
    **{f"{producer}{operator}Channel": _operand_constant_after(producer)
       for producer in ("Conv", "ConvTranspose") for operator in ("Mul", "Add", "Sub", "Div")},
    "ConvAffineFusion": _scaled_conv_plus_scalar,
    "NormalizePadFormatConv": _explicit_padding_needed,
    "NormalizePadFormatConvInteger": _explicit_padding_needed,
    "RemoveOptionalBiasFromConv": _bias_may_be_zero,
    "RemoveOptionalBiasFromConvTranspose": _bias_may_be_zero,
    "RemoveOptionalBiasFromGemm": _bias_may_be_zero,
}
"""Rules whose check fails on most nodes of their op type after an expensive match set-up (the library's and ours):
the check's condition, evaluated on the root node first (a node it rejects is one the full try rejects)."""


class IndexedRuleSet(RewriteRuleSet):
    """A ``RewriteRuleSet`` that tries on each node only the rules whose pattern can start at its op type.

    The library's loop calls every rule's ``try_rewrite`` on every node (about 60 rules x every node x every
    pass); here the rules are looked up by the node's op type (rules without a root op type are tried on
    every node), in the set's order, so the first rule that matches is the one the library would apply and
    the rewritten graph is the same. Dead nodes are removed with :class:`RemoveUnusedNodes`, the library's
    pass with fewer schema look-ups. A tracer, or a rule that extracts a function, takes the library's path.
    """

    def __init__(self, rules: Sequence[RewriteRule]) -> None:
        super().__init__(rules)
        roots = [root_op_type(rule) for rule in self.rules]
        entries = [(rule, getattr(rule, "apply_directly", None), getattr(rule, "prefilter", None)) for rule in self.rules]
        self._by_op_type = {op_type: [entry for entry, root in zip(entries, roots) if root in (None, op_type)]
                            for op_type in set(roots) - {None}}
        self._any_op_type = [entry for entry, root in zip(entries, roots) if root is None]
        self._library_path = any(rule.as_function for rule in self.rules)

    def _candidates(self, op_type: str) -> list[tuple[RewriteRule, Callable | None, Prefilter | None]]:
        """(rule, its ``apply_directly``, its :class:`Prefilter`) of the rules that may match at a node of ``op_type``,
        in the set's order (listed when the set is built); the prefilter is None for a rule that is not an indexed copy
        (tried in full)."""
        return self._by_op_type.get(op_type, self._any_op_type)

    def _apply_to_graph_or_function(self, model: ir.Model, graph_or_function: ir.Graph | ir.Function, *,
                                    verbose: int | None, tracer=None,
                                    fused_biases: dict[ir.Node, ir.Value] | None = None) -> int:
        if tracer is not None or self._library_path:
            return super()._apply_to_graph_or_function(model, graph_or_function, verbose=verbose, tracer=tracer)
        for rule in self.rules:
            if rule.graph_pre_visitor:
                rule.graph_pre_visitor()
        count = 0
        for node in graph_or_function:
            if fused_biases:
                bias = fused_biases.pop(node, None)
                if bias is not None:
                    _give_fused_bias(graph_or_function, node, bias)
            for rule, direct, prefilter in self._candidates(node.op_type):
                if direct is not None:
                    if direct(graph_or_function, node):
                        count += 1
                        break
                    continue
                if prefilter is None:
                    delta = rule.try_rewrite(model, graph_or_function, node, verbose=verbose)
                elif admits(prefilter, node):  # what the indexed copy's try_rewrite does, one call fewer per node
                    delta = prefilter.full_try(model, graph_or_function, node, verbose=verbose)
                else:
                    continue
                if delta is None:
                    continue
                if delta.new_initializers and isinstance(graph_or_function, ir.Function):
                    continue  # a function holds no initializers: the library goes on with the next rule
                _replace(graph_or_function, node, rule, delta)
                count += 1
                break
            for attribute in node.attributes.values():
                if attribute.type == ir.AttributeType.GRAPH:
                    count += self._apply_to_graph_or_function(model, attribute.value, verbose=verbose)
                elif attribute.type == ir.AttributeType.GRAPHS:
                    count += sum(self._apply_to_graph_or_function(model, subgraph, verbose=verbose)
                                 for subgraph in attribute.value)
        for rule in self.rules:
            if rule.graph_post_visitor:
                rule.graph_post_visitor()
        return count

    def apply_to_model(self, model: ir.Model, *, verbose: int | None = None, tracer=None) -> int:
        """Apply the rules to the main graph and the model's functions; returns how many rewrites were made."""
        if tracer is not None or self._library_path:
            give_fused_biases(model)
            return super().apply_to_model(model, verbose=verbose, tracer=tracer)
        return self.apply_and_tell_clean(model, verbose=verbose)[0]

    def apply_and_tell_clean(self, model: ir.Model, *, verbose: int | None = None) -> tuple[int, bool]:
        """:meth:`apply_to_model`, also telling whether its closing removal of unused nodes found none to remove.

        Then the graph has no dead node or initializer left (the rewrites' renaming after it changes no use), so
        a :class:`RemoveUnusedNodes` run next would change nothing.
        """
        if self._library_path:
            give_fused_biases(model)
            return super().apply_to_model(model, verbose=verbose), False
        onnxscript_optimizer.basic_constant_propagation(model.graph)
        functions = list(model.functions.values())  # not the ones the rewrites add
        fused_biases = model.meta.pop(FUSED_BIASES, None)
        count = self._apply_to_graph_or_function(model, model.graph, verbose=verbose, fused_biases=fused_biases)
        for node, bias in (fused_biases or {}).items():  # a node the pass removed before its turn needs none
            if node.graph is model.graph:
                _give_fused_bias(model.graph, node, bias)
        for function in functions:
            onnxscript_optimizer.basic_constant_propagation(function)
            count += self._apply_to_graph_or_function(model, function, verbose=verbose)
        clean = self.remove_unused_nodes and not RemoveUnusedNodes()(model).modified
        if count:
            NameFix()(model)  # the rewrites may name new values like existing ones
        return count, clean


def _replace(graph_or_function: ir.Graph | ir.Function, node: ir.Node, rule: RewriteRule, delta) -> None:
    """Put a rule's replacement into the graph, as the library's rule set does."""
    for initializer in delta.new_initializers:
        graph_or_function.initializers[initializer.name] = initializer
    onnxscript_optimizer.basic_constant_propagation(delta.new_nodes)
    if rule.name:
        for new_node in delta.new_nodes:
            new_node.metadata_props[rewrite_rule_module.RULE_NAME_TAG] = rule.name
    ir.convenience.replace_nodes_and_values(graph_or_function, node, delta.match.nodes if rule.remove_nodes else [],
                                            delta.new_nodes, delta.match.outputs, delta.new_outputs)
    if rewrite_rule_module.merge_metadata:
        rewrite_rule_module._default_metadata_merger.copy_merged_metadata(delta.match.nodes, delta.new_nodes)


def indexed_rule_set(rules: Sequence[RewriteRule]) -> RewriteRuleSet:
    """An :class:`IndexedRuleSet` of :func:`indexed_rules` copies of ``rules``."""
    return IndexedRuleSet(indexed_rules(rules))


class _BatchNormFusionRewrite:
    """The rewrite of onnxscript's BatchNormalization fusions (same arithmetic, same initializer names), building
    the fused tensors with ``ir.Tensor``: the library's ``ir.tensor`` first tests the array against
    ``TensorProtocol``, a ``typing.Protocol`` ``isinstance`` that walks the protocol's members (about 0.15 ms per
    tensor, two per fused BatchNorm; PP-OCR fuses dozens)."""

    def rewrite(self, op, x: ir.Value, inbound_out: ir.Value, batchnorm_out: ir.Value):
        batchnorm = batchnorm_out.producer()
        gamma, beta, mean, variance = (value.const_value.numpy() for value in batchnorm.inputs[1:])
        epsilon = batchnorm.attributes.get("epsilon", ir.Attr("epsilon", ir.AttributeType.FLOAT, 1e-5)).as_float()
        inbound = inbound_out.producer()
        attributes = dict(inbound.attributes)
        gemm_beta = attributes.pop("beta", None)  # Gemm scales its bias by beta: folded in here
        bias_scale = gemm_beta.as_float() if gemm_beta is not None else 1.0
        has_bias = len(inbound.inputs) > 2
        weights, fused_bias = self.fused(inbound.inputs[1].const_value.numpy(),
                                         inbound.inputs[2].const_value.numpy() if has_bias else None, bias_scale,
                                         (gamma, beta, mean, variance), epsilon, inbound.attributes)
        bias_name = inbound.inputs[2].name if has_bias else inbound.inputs[1].name + "_bias"
        return op.op(self.op_type, x, op.initializer(ir.Tensor(weights), name=inbound.inputs[1].name),
                     op.initializer(ir.Tensor(fused_bias), name=bias_name), **attributes)

    def fused(self, weights: np.ndarray, bias: np.ndarray | None, bias_scale: float,
              parameters: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], epsilon: float,
              attributes) -> tuple[np.ndarray, np.ndarray]:
        """(fused weights, fused bias) of the inbound op's ``weights`` and ``bias`` (None: zeros) and the BatchNorm's
        (scale, shift, mean, variance) and epsilon: the library's arithmetic."""
        gamma, beta, mean, variance = parameters
        scale = gamma / np.sqrt(variance + epsilon)
        weights = self._scale_weights(weights, scale, attributes)
        if bias is None:
            bias = np.zeros_like(mean)
        return weights, (bias_scale * bias - mean) * scale + beta


    def apply_directly(self, graph_or_function: ir.Graph | ir.Function, batchnorm: ir.Node, rule_name: str) -> bool:
        """The library's match, check and replacement of this fusion at ``batchnorm``, without its pattern matcher and
        rewrite tape (about 0.25 ms per fused BatchNorm, dozens per PP-OCR model); False where the library's rule
        does not apply (or would raise), leaving the graph as it is.

        The match: a BatchNormalization of five inputs whose first is the first output of a node of this op type
        (standard domain, with an input), the two nodes' other outputs unused and not graph outputs. The check: the
        inbound weights (and bias) and the four BatchNorm parameters are constant initializers, not graph inputs, and
        the weights and bias feed nothing else. The replacement: as the library's rule set puts it in (new
        initializers under the old weight names, the rule name tag, the matched nodes' metadata merged).
        """
        if _is_function(graph_or_function) or batchnorm.domain not in ("", "ai.onnx") or len(batchnorm.inputs) != 5:
            return False
        inbound_out = batchnorm.inputs[0]
        inbound = inbound_out.producer() if inbound_out is not None else None
        if inbound is None or inbound.op_type != self.op_type or inbound.domain not in ("", "ai.onnx") \
                or not inbound.outputs or inbound.outputs[0] is not inbound_out or len(inbound.inputs) < 2 \
                or inbound.inputs[0] is None:
            return False
        matched = (batchnorm, inbound)
        result = batchnorm.outputs[0]
        for node in matched:
            for value in node.outputs:
                if value is not result and (value.is_graph_output()
                                            or any(user not in matched for user, _ in value.uses())):
                    return False
        own = list(inbound.inputs[1:3])
        for value in (*own, *batchnorm.inputs[1:]):
            if value is None or not value.is_initializer() or value.const_value is None or value.is_graph_input():
                return False
        if any(user not in matched for value in own for user, _ in value.uses()):
            return False
        op = _context.TapeBuilder()
        output = self.rewrite(op, inbound.inputs[0], inbound_out, result)
        (node,) = op.nodes
        for initializer in op.initializers:
            graph_or_function.initializers[initializer.name] = initializer
        node.metadata_props[rewrite_rule_module.RULE_NAME_TAG] = rule_name
        ir.convenience.replace_nodes_and_values(graph_or_function, batchnorm, matched, [node], [result], [output])
        if rewrite_rule_module.merge_metadata:
            rewrite_rule_module._default_metadata_merger.copy_merged_metadata(list(matched), [node])
        return True


class _FuseBatchNormIntoConv(_BatchNormFusionRewrite, _fuse_batchnorm.FuseBatchNormIntoConv):
    pass


class _FuseBatchNormIntoConvTranspose(_BatchNormFusionRewrite, _fuse_batchnorm.FuseBatchNormIntoConvTranspose):
    pass


class _FuseBatchNormIntoGemm(_BatchNormFusionRewrite, _fuse_batchnorm.FuseBatchNormIntoGemm):
    pass


FUSED_BIASES = "mblt.fused_biases"
"""``model.meta`` key: fused Conv node -> the bias initializer :func:`fuse_batchnorms_proto` computed for it, which the
first indexed rule set pass registers and gives the node when it reaches it (see :func:`fuse_batchnorms_proto`)."""

_FLOAT_CODE = int(ir.DataType.FLOAT)
_FLOAT_TENSOR_FIELDS = frozenset({"dims", "data_type", "name", "raw_data", "float_data"})
_VARIABLE_OPS = frozenset({
    "Conv", "ConvTranspose", "BatchNormalization", "Relu", "LeakyRelu", "PRelu", "Sigmoid", "HardSigmoid", "HardSwish",
    "Tanh", "Clip", "Add", "Sub", "Mul", "Div", "MatMul", "Gemm", "MaxPool", "AveragePool", "GlobalAveragePool",
    "GlobalMaxPool", "Concat", "Reshape", "Transpose", "Flatten", "Softmax", "Resize", "Upsample", "Pad", "Identity"})
"""Ops whose outputs the constant folder never makes constants while an input is not constant (no shape-only read
such as ``Shape``/``Size``/``CastLike``, no selection such as ``Where``)."""


def fuse_batchnorms_proto(graph: onnx.GraphProto, tensors: dict[str, ir.Tensor],
                          large: dict[str, onnx.TensorProto]) -> dict[str, ir.Value]:
    """Fuse each ``Conv -> BatchNormalization`` of a converted source protobuf as the optimizer's first rewrite pass
    would, before the graph is deserialized: the BatchNorm and its four parameters are never deserialized, matched or
    replaced in onnx-ir (PP-OCR cls: 35 of them, a tenth of its parse).

    Only a pair where nothing else could act first is fused here (else the optimizer fuses it as before): the library
    rule's conditions (:meth:`_BatchNormFusionRewrite.apply_directly`: the Conv's output read only by the BatchNorm,
    its weights and bias initializers read only by it, the BatchNorm's parameters initializers), float32 tensors, no
    tag of an earlier rewrite, and none of the default rules at a Conv applying to it, before or after: no
    ``auto_pad``, no ``Pad`` before it, a bias (given or fused) that is not all zeros. Its input must not be a value
    the constant folding before that pass could turn into a constant (the folder would fold the Conv itself). The
    fused Conv replaces the BatchNorm node in place, with the rule's arithmetic (:meth:`_BatchNormFusionRewrite.fused`),
    metadata (the rule's tag, then the BatchNorm's and the Conv's merged) and attributes; its weights (and a given
    bias) keep their initializers' places, as stubs whose tensors are set in ``tensors`` (name -> the ``ir.Tensor`` the
    caller gives the deserialized initializer), and the parameters no node reads any more are dropped. A bias the Conv
    did not have is a new initializer, which the rule set appends when it reaches the node (after the folding's
    initializers): it is returned by the fused node's name, for :data:`FUSED_BIASES`.

    Args:
        graph: The converted graph, after the constants were lifted to initializers (modified in place).
        tensors: Tensors of initializers that are stubs in ``graph`` (extended in place).
        large: Other initializers held apart from ``graph`` (those whose weights change are removed).

    Returns:
        Fused node name -> its new bias initializer.
    """
    if not rewrite_rule_module.merge_metadata:
        return {}
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    graph_inputs = {info.name for info in graph.input}
    outputs = {info.name for info in graph.output}
    producer: dict[str, onnx.NodeProto] = {}
    reads: Counter[str] = Counter()
    variable = set(graph_inputs) - initializers.keys()
    for node in graph.node:  # standard-domain nodes only (the protobuf path's graphs)
        inputs, node_outputs = node.input, node.output
        reads.update(inputs)
        if node.op_type in _VARIABLE_OPS and not variable.isdisjoint(inputs):
            variable.update(node_outputs)
        for name in node_outputs:
            producer[name] = node
    fusion = _FuseBatchNormIntoConv()
    removed: set[str] = set()  # the fused Convs' outputs
    parameters: set[str] = set()
    biases: dict[str, ir.Value] = {}
    taken = {*initializers, *graph_inputs, *producer}
    names = Counter(node.name for node in graph.node)
    fused_names: set[str] = set()
    for batchnorm in graph.node:
        if batchnorm.op_type != "BatchNormalization" or not batchnorm.name or names[batchnorm.name] != 1:
            continue
        plan = _proto_fusion_plan(batchnorm, producer, reads, outputs, initializers, graph_inputs, variable, taken,
                                  tensors, large)
        if plan is None or plan[0].name in fused_names:
            continue
        conv, arrays, bias_name = plan
        weights, bias = fusion.fused(arrays[0], arrays[1], 1.0, arrays[2:], _epsilon(batchnorm), {})
        if not bias.any():
            continue
        parameters.update(batchnorm.input[1:])
        removed.add(conv.output[0])
        fused_names.add(batchnorm.name)
        _write_fused_conv(batchnorm, conv)
        for name, array in ((conv.input[1], weights), (bias_name if len(conv.input) > 2 else None, bias)):
            if name is None:
                continue
            stub = initializers[name]
            stub.ClearField("raw_data")
            stub.ClearField("float_data")
            tensors[name] = ir.Tensor(array)
            large.pop(name, None)
        if len(conv.input) <= 2:
            tensor = ir.Tensor(bias)
            biases[batchnorm.name] = ir.Value(name=bias_name, shape=ir.Shape(list(tensor.shape.dims)),
                                              type=ir.TensorType(tensor.dtype), const_value=tensor)
            taken.add(bias_name)
    if not removed:
        return {}
    for index in reversed([i for i, node in enumerate(graph.node)
                           if node.op_type == "Conv" and node.output[0] in removed]):
        del graph.node[index]
    for index in reversed([i for i, info in enumerate(graph.value_info) if info.name in removed]):
        del graph.value_info[index]
    read = {name for node in graph.node for name in node.input}
    for index in reversed([i for i, tensor in enumerate(graph.initializer)
                           if tensor.name in parameters and tensor.name not in read and tensor.name not in outputs]):
        del graph.initializer[index]
    return biases


def _proto_fusion_plan(batchnorm: onnx.NodeProto, producer: dict[str, onnx.NodeProto], reads: Counter[str],
                       outputs: set[str], initializers: dict[str, onnx.TensorProto], graph_inputs: set[str],
                       variable: set[str], taken: set[str], tensors: dict[str, ir.Tensor],
                       large: dict[str, onnx.TensorProto]) -> tuple[onnx.NodeProto, list, str] | None:
    """(the Conv, [weights, bias or None, scale, shift, mean, variance], the fused bias's name) where
    :func:`fuse_batchnorms_proto` fuses ``batchnorm``, else None."""
    if batchnorm.domain not in ("", "ai.onnx") or len(batchnorm.input) != 5 or not all(batchnorm.input) \
            or len(batchnorm.output) != 1 or _has_rule_tag(batchnorm):
        return None
    conv = producer.get(batchnorm.input[0])
    if conv is None or conv.op_type != "Conv" or conv.domain not in ("", "ai.onnx") or len(conv.output) != 1 \
            or not 2 <= len(conv.input) <= 3 or not all(conv.input) or conv.input[0] not in variable \
            or _has_rule_tag(conv) or any(attribute.name == "auto_pad" for attribute in conv.attribute):
        return None
    before = producer.get(conv.input[0])
    if (before is not None and before.op_type == "Pad") or reads[conv.output[0]] != 1 or conv.output[0] in outputs:
        return None
    own = list(conv.input[1:])
    if any(reads[name] != 1 or name in outputs for name in own):
        return None
    arrays = []
    for name in (*own, *batchnorm.input[1:]):
        if name not in initializers or name in graph_inputs:
            return None
        array = _float_array(name, initializers[name], tensors, large)
        if array is None:
            return None
        arrays.append(array)
    if len(own) == 1:
        bias_name = own[0] + "_bias"
        if bias_name in taken:
            return None
        arrays.insert(1, None)
    else:
        bias_name = own[1]
        if not arrays[1].any():  # a zero bias: the default rules take it out of the Conv first
            return None
    return conv, arrays, bias_name


def _float_array(name: str, stub: onnx.TensorProto, tensors: dict[str, ir.Tensor],
                 large: dict[str, onnx.TensorProto]) -> np.ndarray | None:
    """The float32 array of an initializer, as its deserialized tensor reads it, or None if it is not float32 or
    holds more than its data (its stub is then rewritten as the onnx-ir fusion writes a new tensor)."""
    if stub.data_type != _FLOAT_CODE or any(field.name not in _FLOAT_TENSOR_FIELDS for field, _ in stub.ListFields()):
        return None
    tensor = tensors.get(name)
    if tensor is not None:
        return tensor.numpy() if tensor.dtype == ir.DataType.FLOAT else None
    proto = large.get(name, stub)
    if proto is not stub and (proto.data_type != _FLOAT_CODE or any(
            field.name not in _FLOAT_TENSOR_FIELDS for field, _ in proto.ListFields())):
        return None
    if proto.HasField("raw_data"):
        return np.frombuffer(proto.raw_data, dtype=_RAW_DTYPES[_FLOAT_CODE]).reshape(proto.dims)
    return np.array(proto.float_data, dtype=np.float32).reshape(proto.dims)  # the same numbers as the library's read


def _has_rule_tag(node: onnx.NodeProto) -> bool:
    return any(entry.key == rewrite_rule_module.RULE_NAME_TAG for entry in node.metadata_props)


def _epsilon(batchnorm: onnx.NodeProto) -> float:
    """The BatchNorm's epsilon as onnx-ir reads it (``Attr.as_float``), 1e-5 if not given."""
    for attribute in batchnorm.attribute:
        if attribute.name == "epsilon":
            if attribute.type == onnx.AttributeProto.FLOAT:
                return attribute.f
            return ir.serde.deserialize_attribute(attribute).as_float()
    return 1e-5


def _write_fused_conv(batchnorm: onnx.NodeProto, conv: onnx.NodeProto) -> None:
    """Make the BatchNorm node the fused Conv (as the rule set writes it: the Conv's inputs and attributes, the
    BatchNorm's output, the rule's tag and the two nodes' metadata merged, BatchNorm first); its name stays, as the
    handle :func:`fuse_batchnorms_proto` returns the bias by."""
    metadata = {rewrite_rule_module.RULE_NAME_TAG: "FuseBatchNormIntoConv"}
    merger = rewrite_rule_module._default_metadata_merger
    for node in (batchnorm, conv):
        merger.update_dict(metadata, {entry.key: entry.value for entry in node.metadata_props})
    output = batchnorm.output[0]
    name = batchnorm.name
    batchnorm.Clear()
    batchnorm.op_type, batchnorm.name = "Conv", name
    batchnorm.input.extend(conv.input)
    batchnorm.output.append(output)
    batchnorm.attribute.extend(conv.attribute)
    for key, value in metadata.items():
        batchnorm.metadata_props.add(key=key, value=value)


def _give_fused_bias(graph: ir.Graph | ir.Function, node: ir.Node, bias: ir.Value) -> None:
    """Register the bias :func:`fuse_batchnorms_proto` computed for ``node`` and make it the node's third input."""
    graph.initializers[bias.name] = bias
    node.resize_inputs(3)
    node.replace_input_with(2, bias)


def give_fused_biases(model: ir.Model) -> None:
    """Give every fused Conv still waiting for it its bias (:data:`FUSED_BIASES`), now."""
    for node, bias in model.meta.pop(FUSED_BIASES, {}).items():
        if node.graph is model.graph:
            _give_fused_bias(model.graph, node, bias)


def _quick_library_rules() -> dict[str, RewriteRule]:
    """Library rule name -> our rule with the same pattern, check and result, rewriting quicker (and, in an
    :class:`IndexedRuleSet`, applied directly: ``apply_directly``)."""
    rules = {}
    for cls in (_FuseBatchNormIntoConv, _FuseBatchNormIntoConvTranspose, _FuseBatchNormIntoGemm):
        name = cls.__mro__[2].__name__
        instance = cls()
        rule = cls.rule(name=name)
        rule.apply_directly = functools.partial(instance.apply_directly, rule_name=name)
        rules[name] = rule
    return rules


_DEFAULT_RULES: RewriteRuleSet | None = None


def default_rules() -> RewriteRuleSet:
    """The optimizer's rewrite rules (the library's defaults, quicker and exact where ours replace them), indexed;
    built on the first call, once per process."""
    global _DEFAULT_RULES
    if _DEFAULT_RULES is None:
        from compiler_core.mblt.rules import EXACT_NO_OP_RULES

        quick = _quick_library_rules()
        # the library's x * 1, x + 0, x - 0, x / 1 match within 1e-8 (x + 1e-10 is not x): ours match exactly
        approximate = {id(rule) for rule in _no_op.rules.rules if root_op_type(rule) in ("Mul", "Add", "Sub", "Div")}
        library = [quick.get(rule.name, rule) for rule in rewriter._DEFAULT_REWRITE_RULES if id(rule) not in approximate]
        _DEFAULT_RULES = indexed_rule_set([*EXACT_NO_OP_RULES, *library])
    return _DEFAULT_RULES


class _FoldConstants(_constant_folding.FoldConstantsPass):
    """onnxscript's constant folder, without the per-node ONNX inference for nodes whose outputs already
    carry a dtype and a fully static shape (the whole-model inference before the optimizer gave them):
    inference cannot refine such a shape, and serializing every node for it dominated the folder's time."""

    def call(self, model: ir.Model) -> _constant_folding.FoldConstantsResult:
        """The library's ``call``, with :class:`NameFix` for its closing ``NameFixPass``."""
        self._reset()
        self._opset_imports = model.opset_imports
        with _quick_reference_ops():
            self.visit_graph(model.graph)
            for function in model.functions.values():
                self.visit_function(function)
        if self._modified:
            NameFix()(model)  # the folding may name new values like existing ones
        return _constant_folding.FoldConstantsResult(model, self._modified, self._state.symbolic_value_map)

    def _do_inference(self, node: ir.Node) -> None:
        if _statically_typed(node):
            return
        super()._do_inference(node)

    def visit_node(self, node: ir.Node, root: ir.Graph | ir.Function) -> None:
        """The library's ``visit_node``, which visits the attributes of a node it leaves in place only for their
        subgraphs: here only a node holding a graph has its attributes visited."""
        replacement = self.process_node(node, is_function=_is_function(root))
        if replacement is not None:
            self.replace_node(node, replacement, root)
        elif holds_graph(node):
            for attribute in node.attributes.values():
                self.visit_attribute(attribute)

    def process_node(self, node: ir.Node, is_function: bool) -> _constant_folding.Replacement | None:
        """The library's ``process_node``, which returns None at once for a node it would leave as it is, having
        nothing to do for it: no input has a value to stand for it, not a ``Constant``, outputs typed statically
        (no inference), no partial evaluator for its op (``Shape``, ``Reshape``, ``Cast`` ...), and an input that
        is not a constant, so it cannot be evaluated (most nodes: Conv, Relu, Mul of activations)."""
        if self._left_alone(node):
            return None
        return super().process_node(node, is_function)

    def _prepare_folded_tensor(self, node: ir.Node, output_name: str, output_array) -> ir.Tensor | None:
        """The library's ``_prepare_folded_tensor`` (the folded array as a named tensor, or None when it is too large
        and larger than the inputs it replaces), building the tensor of a numpy array with ``ir.Tensor``: the library's
        ``ir.tensor`` tests the array against ``TensorProtocol`` and two more ``typing.Protocol`` classes first (75 us
        per folded value here, 6 ms for the first of a process) and then builds the same ``ir.Tensor``."""
        if type(output_array) is not np.ndarray:
            return super()._prepare_folded_tensor(node, output_name, output_array)
        tensor = ir.Tensor(output_array)
        tensor.name = output_name
        if output_array.size > self.output_size_limit:
            removed = sum(_constant_folding._get_numpy_value(value).size for value in node.inputs
                          if value is not None and len(value.uses()) == 1
                          and _constant_folding._get_numpy_value(value) is not None)
            if output_array.size - removed > 0:
                logger.info("Skip storing constant folded array %s due to large size %s.", output_name,
                            output_array.size)
                return None
        return tensor

    def _left_alone(self, node: ir.Node) -> bool:
        if node.op_type == "Constant" or not node.inputs:
            return False
        state = self._state
        variable = False
        for value in node.inputs:
            if value is None:
                continue
            standing_in = state.get_sym_value(value)
            if standing_in is not None and isinstance(standing_in, ir.Value):
                return False
            variable = variable or value.const_value is None
        if not variable or not _statically_typed(node):
            return False
        version = self._opset_imports.get(node.domain)
        if version is None:
            return True
        evaluators = _partial_evaluators(node.domain, node.op_type, version)
        return not evaluators or (evaluators == _SHAPE_ADD and _no_shape_operand(node, state))


class _ReferenceOps(_constant_folding.ReferenceEvaluator):
    """onnxscript's reference evaluator (``onnx.reference`` implementations of the ops it folds), finding an op's
    implementation class as ``onnx.reference.ops.load_op`` does, without the registry ``load_op`` builds on its first
    call: an ``issubclass`` with the ``OpRun`` ABC for every name in ``onnx.reference.ops``, where each name that is not
    an op walks all 400 subclasses (7-9 ms, once per process). An op it does not find takes the library's way."""

    def __init__(self) -> None:
        self._instances: dict[tuple, object] = {}

    def get_evaluator(self, domain: str, op: str, version: int) -> Callable | None:
        implementation = _reference_op(domain, op, version)
        if implementation is None:
            return super().get_evaluator(domain, op, version)
        return implementation.eval

    def evaluate(self, domain: str, op: str, version: int, *args, **kwargs):
        """The library's ``evaluate`` (``OpRun.eval``: the op's instance created from its attributes, then run), with
        one instance per op class, input count and attributes while the folding runs (:meth:`forget`): creating one
        builds a NodeProto and reads the op's schema, about 0.1 ms, and a model folds many alike (PP-OCR cls: 18
        Reshapes to ``[1, C, 1, 1]``); ``onnx.reference``'s own evaluator runs each node's instance again and again.
        Attributes other than numbers, strings and lists of them take the library's way."""
        implementation = _reference_op(domain, op, version)
        attributes = _attribute_key(kwargs) if implementation is not None else None
        if attributes is None:
            return super().evaluate(domain, op, version, *args, **kwargs)
        key = (implementation, len(args), attributes)
        try:
            instance = self._instances.get(key)
            if instance is None:
                instance = self._instances[key] = implementation.create(len(args), **kwargs)
            results = instance.run(*args)
        except Exception as error:  # noqa: BLE001 - as the library's evaluate: logged, nothing folded
            _constant_folding.logger.warning("Evaluation failed: %s", error)
            return None
        return results[0] if len(results) == 1 else results

    def forget(self) -> None:
        """Drop the op instances (at the end of a folding pass)."""
        self._instances.clear()


_KEY_SCALARS = (int, float, str)


def _attribute_key(attributes: dict) -> tuple | None:
    """A key telling the attribute values apart by type and ``repr`` (``0.0`` and ``-0.0`` differ), or None when one
    is not a number, a string or a list of them."""
    key = []
    for name in sorted(attributes):
        value = attributes[name]
        if type(value) in _KEY_SCALARS:
            key.append((name, type(value), repr(value)))
        elif type(value) in (list, tuple) and all(type(item) in _KEY_SCALARS for item in value):
            key.append((name, type(value), tuple((type(item), repr(item)) for item in value)))
        else:
            return None
    return tuple(key)


@functools.cache
def _reference_op(domain: str, op_type: str, version: int | None) -> type | None:
    """The class ``load_op(domain, op_type, version)`` returns, from the classes of ``onnx.reference.ops`` named
    ``op_type`` or ``op_type_<version>`` (the registry's keys): the latest version up to ``version`` (the unversioned
    one, else the latest, when there is only one); None where ``load_op`` builds its registry for another answer
    (another domain, no version asked for, no class, no version that fits)."""
    from onnx.reference.op_run import OpRun
    from onnx.reference.ops import _op_list

    if domain != "" or version is None:  # load_op asks for the current opset then
        return None
    versions: dict[int | None, type] = {}
    prefix = op_type + "_"
    for name, value in vars(_op_list).items():
        if name == op_type:
            versions[None] = value
        elif name.startswith(prefix) and name[len(prefix):].isdigit() and name[len(prefix):].isascii():
            versions[int(name[len(prefix):])] = value
    if not versions or not all(isinstance(value, type) and issubclass(value, OpRun) for value in versions.values()):
        return None
    if None not in versions:
        versions[None] = versions[max(v for v in versions if v is not None)]
    if len(versions) == 1:
        return versions[None]
    fitting = [v for v in versions if v is not None and v <= version]
    return versions[max(fitting)] if fitting else None


_QUICK_REFERENCE_OPS = _ReferenceOps()


@contextmanager
def _quick_reference_ops():
    """Fold with :class:`_ReferenceOps` (onnxscript's folder evaluates through its module's evaluator): the same
    implementations, so the same folded values."""
    saved = _constant_folding._reference_evaluator
    evaluator = _constant_folding._reference_evaluator = _QUICK_REFERENCE_OPS
    try:
        yield
    finally:
        _constant_folding._reference_evaluator = saved
        if isinstance(evaluator, _ReferenceOps):
            evaluator.forget()


def _is_function(graph_or_function: ir.Graph | ir.Function) -> bool:
    """``isinstance(graph_or_function, ir.Function)``, answered without it for a plain graph: onnx-ir's classes derive
    from ``typing.Protocol`` classes, so each ``isinstance`` with them goes through the protocol machinery."""
    return type(graph_or_function) is not ir.Graph and isinstance(graph_or_function, ir.Function)


def _statically_typed(node: ir.Node) -> bool:
    """True if every output of the node has a dtype and a static shape (loops, not generators: called for every node
    of every folding pass)."""
    for output in node.outputs:
        shape = output.shape
        if output.dtype is None or shape is None:
            return False
        for dim in shape.dims:
            if not isinstance(dim, int) or dim < 0:
                return False
    return True


@functools.cache
def _partial_evaluators(domain: str, op_type: str, version: int) -> tuple[Callable, ...]:
    """The partial evaluators onnxscript's folder has registered for the op at that opset version."""
    return tuple(_constant_folding.registry.lookup_evaluators(domain, op_type, version))


_SHAPE_ADD = (_constant_folding.add,)
"""The library's only partial evaluator of ``Add``: it adds two one-element shape values (symbolic dims), and does
nothing unless both operands have a shape value (a 1-D constant, or a symbolic ``Shape`` standing for the value)."""


def _no_shape_operand(node: ir.Node, state) -> bool:
    """True if an operand of the node is a value that is not a constant and that the folder knows no ``Shape`` for:
    :data:`_SHAPE_ADD` then returns None (an ``Add`` of activations, the usual one)."""
    return any(value is not None and value.const_value is None and not isinstance(state.get_sym_value(value), ir.Shape)
               for value in node.inputs)


class ReadOnceTensor(ir.serde.TensorProtoTensor):
    """``TensorProtoTensor`` that reads its shape and dtype once and keeps the array of a small tensor after the first
    ``numpy()``: the library's reads them from the protobuf on every call (the data copied out of the protobuf each
    time), and the passes ask for the same small constants again and again (PP-OCR cls: 437 reads of 272 tensors per
    parse, the scalar operands of its HardSwish dozens of times each). A read-only array (data in ``raw_data``) is
    handed out as the library hands it out; a writable one (data in a typed field, which the library copies into a
    new array on every call) as a fresh copy of the kept one, so no caller sees another's changes. The protobuf is the
    same, so the tensor serializes to the same bytes."""

    __slots__ = ("_array", "_dims", "_type", "_writable")

    def __init__(self, proto: onnx.TensorProto) -> None:
        super().__init__(proto)
        self._array = None
        self._writable = False
        self._dims = None
        self._type = None

    @property
    def shape(self) -> ir.Shape:
        if self._dims is None:
            self._dims = super().shape
        return self._dims

    @property
    def dtype(self) -> ir.DataType:
        if self._type is None:
            self._type = super().dtype
        return self._type

    def numpy(self) -> np.ndarray:
        kept = self._array
        if kept is not None:  # read-only: handed out as the library hands it out, a writable array as a fresh copy
            return kept.copy() if self._writable else kept
        array = self._raw_array() if self._proto.HasField("raw_data") else None
        if array is None:
            array = super().numpy()
        if array.size <= _KEPT_ELEMENTS:
            self._writable = array.flags.writeable
            self._array = array.copy() if self._writable else array
        return array


    def _raw_array(self) -> np.ndarray | None:
        """What the library's ``numpy()`` gives for data in ``raw_data`` of a whole-byte numeric type (a read-only
        array over the bytes, in the library's little-endian dtype), without its per-call look-ups; None for any other
        tensor (sub-byte, string, external), which the library reads."""
        proto = self._proto
        dtype = _RAW_DTYPES.get(proto.data_type)
        if dtype is None or proto.data_location == onnx.TensorProto.EXTERNAL:
            return None
        return np.frombuffer(proto.raw_data, dtype=dtype).reshape(proto.dims)


def _raw_dtypes() -> dict[int, np.dtype]:
    """ONNX data type code -> the numpy dtype the library reads ``raw_data`` as (``dtype.numpy().newbyteorder("<")``),
    for the types it reads that way: whole bytes per element, not strings."""
    dtypes = {}
    for data_type in ir.DataType:
        if data_type in (ir.DataType.UNDEFINED, ir.DataType.STRING) or data_type.bitwidth not in (8, 16, 32, 64, 128):
            continue
        try:
            dtypes[int(data_type)] = data_type.numpy().newbyteorder("<")
        except (TypeError, ValueError):  # no numpy type for it: the library raises, so leave it to the library
            continue
    return dtypes


_RAW_DTYPES = _raw_dtypes()
_KEPT_ELEMENTS = 4096
"""Largest array a :class:`ReadOnceTensor` keeps (a weight read once, by a fusion, is not worth its memory)."""


def read_once(graph: ir.Graph) -> None:
    """Make each protobuf-backed initializer of the graph a :class:`ReadOnceTensor` over the same protobuf."""
    for value in graph.initializers.values():
        tensor = value.const_value
        if type(tensor) is ir.serde.TensorProtoTensor:
            value.const_value = ReadOnceTensor(tensor.raw)


class LiftConstants(common_passes.LiftConstantsToInitializersPass):
    """``LiftConstantsToInitializersPass``, taking a ``value`` tensor straight from its attribute.

    The library reads it through ``Attr.as_tensor``, whose ``isinstance(value, TensorProtocol)`` walks
    the protocol's members on every call on Python 3.11 (about 1 s of a 4-model parse under cProfile,
    one call per Constant node; PP-OCR keeps every weight in one). An attribute of type ``TENSOR``
    holds a tensor by construction, so the check can never fail here; the lifted graph is the same.
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        """The library's ``call``, which walks every node looking for ``Constant`` nodes with a walk that searches each
        node's attributes for subgraphs; after the first lift a graph usually has none, found with a quicker walk."""
        if not any(node.op_type == "Constant" for node in all_nodes(model.graph)):
            return ir.passes.PassResult(model, modified=False)
        return super().call(model)

    def _constant_node_attribute_to_tensor(self, node: ir.Node, attr_name: str, attr_value: ir.Attr,
                                           initializer_name: str) -> ir.TensorProtocol | None:
        if attr_name == "value" and attr_value.type == ir.AttributeType.TENSOR:
            tensor = attr_value.value
            return tensor if tensor.size >= self.size_limit else None
        return super()._constant_node_attribute_to_tensor(node, attr_name, attr_value, initializer_name)


class RemoveUnusedNodes(common_passes.RemoveUnusedNodesPass):
    """``RemoveUnusedNodesPass`` (dead nodes and initializers, unused optional outputs, trailing empty inputs) with
    one schema look-up per op type and opset instead of one per node and call: ``onnx.defs.get_schema`` builds a
    Python schema object each time, about 10 us, and the pass runs a dozen times per parse."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        count = _remove_unused_nodes(model.graph, model.graph.opset_imports.get(""))
        kept = frozenset([*model.graph.outputs, *model.graph.inputs])
        for name, value in list(model.graph.initializers.items()):
            if not value.uses() and value not in kept:
                del model.graph.initializers[name]
                count += 1
        for function in model.functions.values():
            count += _remove_unused_nodes(function, function.opset_imports.get(""))
        return ir.passes.PassResult(model, modified=bool(count))


class NameFix(common_passes.NameFixPass):
    """``NameFixPass`` (unique, non-empty value and node names), which changes nothing when every name already is:
    checked first with one walk over the graph's values and nodes, where the pass also sets up its renaming for each.
    A model with functions or subgraphs (scoped names) takes the pass."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if not model.functions and _names_unique(model.graph):
            return ir.passes.PassResult(model, modified=False)
        return super().call(model)


def _names_unique(graph: ir.Graph) -> bool:
    """True if the graph holds no subgraph and its values (inputs, outputs, initializers, node inputs and outputs) and
    nodes all have names, distinct values distinct names and distinct nodes distinct names."""
    values = {*graph.inputs, *graph.outputs, *graph.initializers.values()}
    node_names = set()
    count = 0
    for node in graph:
        if holds_graph(node):
            return False
        node_names.add(node.name)
        count += 1
        values.update(node.inputs)
        values.update(node.outputs)
    values.discard(None)
    names = {value.name for value in values}
    return len(node_names) == count and len(names) == len(values) and "" not in node_names | names \
        and None not in node_names | names


class DeduplicateInitializers(common_passes.DeduplicateInitializersPass):
    """``DeduplicateInitializersPass`` (initializers of the same dtype, dims and bytes, up to ``size_limit`` elements,
    become one) reading a protobuf-backed tensor's dims from its protobuf: the library builds a ``Shape`` for each
    tensor twice (size and key); and reading the bytes only of initializers whose dtype and dims another one has (the
    others cannot be equal to any). A model whose nodes hold subgraphs takes the library's pass."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        if any(holds_graph(node) for node in graph):
            return super().call(model)
        modified = False
        candidates = []
        for initializer in tuple(graph.initializers.values()):
            tensor = initializer.const_value
            if initializer.is_graph_input() or initializer.is_graph_output() or tensor is None:
                _deduplication._should_skip_initializer(initializer, self.size_limit)  # skipped, with its warning
                continue
            dims = tuple(tensor.raw.dims) if type(tensor) is ir.serde.TensorProtoTensor else tuple(tensor.shape)
            if math.prod(dims) <= self.size_limit:
                candidates.append((initializer, tensor, (tensor.dtype, dims)))
        shared = Counter(kind for _, _, kind in candidates)
        kept: dict[tuple[ir.DataType, tuple[int, ...], bytes], ir.Value] = {}
        for initializer, tensor, kind in candidates:
            if shared[kind] == 1:  # no other initializer of its dtype and dims: its bytes equal none
                continue
            key = (*kind, _deduplication._tobytes(tensor))
            if key in kept:
                modified = True
                initializer.replace_all_uses_with(kept[key])
                graph.initializers.pop(initializer.name)
            else:
                kept[key] = initializer
        return ir.passes.PassResult(model=model, modified=modified)


def merge_equal_weights(graph: ir.Graph) -> int:
    """Merge initializers of the same dtype, dims and bytes of any size (:class:`DeduplicateInitializers` stops at
    1024 elements); only those whose dtype and dims meet another's are read. Returns how many went.

    A weight a model shares between layers (ALBERT-style) comes out of constant folding once per reader (each
    ``Transpose(W)`` folds on its own): merged again, the MBLT holds it once instead of once per layer.
    """
    groups: dict[tuple, list[ir.Value]] = {}
    for initializer in graph.initializers.values():
        tensor = initializer.const_value
        if tensor is not None and not initializer.is_graph_input() and not initializer.is_graph_output():
            groups.setdefault((tensor.dtype, tuple(tensor.shape)), []).append(initializer)
    merged = 0
    for members in groups.values():
        if len(members) < 2:
            continue
        first: dict[bytes, ir.Value] = {}
        for initializer in members:
            data = initializer.const_value.tobytes()
            digest = hashlib.sha256(data).digest()
            if digest in first and first[digest].const_value.tobytes() == data:
                initializer.replace_all_uses_with(first[digest])
                graph.initializers.pop(initializer.name)
                merged += 1
            else:
                first.setdefault(digest, initializer)
    return merged


class OutputFix(common_passes.OutputFixPass):
    """``OutputFixPass`` (an Identity for a graph output listed twice or that is a graph input), which has nothing to
    do when the main graph's outputs are distinct values none of which is an input: checked there first when no node
    holds a subgraph and the model has no functions (the library walks every node for subgraphs, twice)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        outputs = list(graph.outputs)
        if (not model.functions and len(set(outputs)) == len(outputs)
                and not any(output.is_graph_input() for output in outputs)
                and not any(holds_graph(node) for node in graph)):
            return ir.passes.PassResult(model, modified=False)
        return super().call(model)


class TopologicalSort(common_passes.TopologicalSortPass):
    """``TopologicalSortPass``, which leaves a graph that is in topological order already as it is: its sort is stable
    (it places the nodes last to first, each time the last one in the current order whose consumers are all placed,
    so a graph in order keeps its order). That is checked first, with one walk, when the model has no functions and no
    node holds a subgraph."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if not model.functions and _in_topological_order(model.graph):
            return ir.passes.PassResult(model, modified=False)
        return super().call(model)


def _in_topological_order(graph: ir.Graph) -> bool:
    """True if no node holds a subgraph and each node's inputs are made by nodes before it (or by none)."""
    placed = set()
    for node in graph:
        if holds_graph(node):
            return False
        for value in node.inputs:
            if value is not None:
                producer = value.producer()
                if producer is not None and producer not in placed:
                    return False
        placed.add(node)
    return True


class RemoveUnusedFunctions(common_passes.RemoveUnusedFunctionsPass):
    """``RemoveUnusedFunctionsPass`` without its walk over every node when the model has no functions to remove."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if not model.functions:
            return ir.passes.PassResult(model, modified=False)
        return super().call(model)


class Inline(common_passes.InlinePass):
    """``InlinePass`` without its walk over every node when the model has no functions (nothing can be inlined)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if not model.functions:
            return ir.passes.PassResult(model, modified=False)
        return super().call(model)


class RemoveUnusedOpsets(common_passes.RemoveUnusedOpsetsPass):
    """``RemoveUnusedOpsetsPass`` (opset imports no node uses), collecting the used domains with a walk that looks for
    subgraphs only in nodes holding a graph attribute; the same domains, so the same imports are removed."""

    def _process_graph_like(self, graph_like: ir.Graph | ir.Function, used_domains: set[str]) -> bool:
        used_domains.update(node.domain for node in all_nodes(graph_like))
        unused = set(graph_like.opset_imports) - used_domains
        for domain in unused:
            del graph_like.opset_imports[domain]
        return bool(unused)


class LiftSubgraphInitializers(common_passes.LiftSubgraphInitializersToMainGraphPass):
    """``LiftSubgraphInitializersToMainGraphPass``, which does nothing when no node holds a subgraph."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if not any(holds_graph(node) for node in model.graph):
            return ir.passes.PassResult(model, modified=False)
        return super().call(model)


_GRAPH_ATTRIBUTES = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)


def holds_graph(node: ir.Node) -> bool:
    """True if one of the node's attributes is a graph or a list of graphs (a loop, not a generator: thousands of calls
    per parse)."""
    for attribute in node.attributes.data.values():  # noqa: SIM110 - any() with a generator is slower here
        if attribute.type in _GRAPH_ATTRIBUTES:
            return True
    return False


def all_nodes(graph_like: ir.Graph | ir.Function) -> ir.traversal.RecursiveGraphIterator:
    """Every node, subgraphs included, in ``RecursiveGraphIterator`` order; only nodes that hold a graph are searched
    for subgraphs (the library's walk looks through every node's attributes)."""
    return ir.traversal.RecursiveGraphIterator(graph_like, recursive=holds_graph)


def _remove_unused_nodes(graph: ir.Graph | ir.Function, opset_version: int | None) -> int:
    outputs = frozenset(graph.outputs)
    count = 0
    for node in reversed(graph):
        for output in node.outputs:
            if output in outputs or output.uses():
                break
        else:  # no output is used
            graph.remove(node, safe=True)
            count += 1
            continue
        while node.inputs and node.inputs[-1] is None:
            node.resize_inputs(len(node.inputs) - 1)
        if opset_version is not None:
            _drop_unused_optional_outputs(node, outputs, opset_version)
        if not holds_graph(node):
            continue
        for attribute in node.attributes.values():
            if attribute.type == ir.AttributeType.GRAPH:
                count += _remove_unused_nodes(attribute.as_graph(), opset_version)
            elif attribute.type == ir.AttributeType.GRAPHS:
                count += sum(_remove_unused_nodes(subgraph, opset_version) for subgraph in attribute.as_graphs())
    return count


def _drop_unused_optional_outputs(node: ir.Node, graph_outputs: frozenset[ir.Value], opset_version: int) -> None:
    """Unname the unused optional outputs of a standard op and drop the trailing unnamed ones."""
    if node.domain not in ("", "onnx.ai"):  # the library's spelling: "ai.onnx" nodes are left alone there too
        return
    schema = _output_schema(node.op_type, opset_version, node.domain)
    if schema is None:
        return
    optional, has_training_mode = schema
    if node.op_type == "BatchNormalization":  # before opset 14 the output count selects training mode
        if not has_training_mode:
            return
        mode = node.attributes.get("training_mode")
        if mode is not None and (mode.is_ref() or mode.type != ir.AttributeType.INT or mode.as_int() != 0):
            return
        node.attributes.pop("training_mode", None)
    if optional is None or not any(optional):
        return
    for index, output in enumerate(node.outputs[:len(optional)]):
        if optional[index] and output not in graph_outputs and not output.uses():
            output.name = ""
    kept = len(node.outputs)
    while kept and not node.outputs[kept - 1].name:
        kept -= 1
    node.resize_outputs(kept)


@functools.cache
def _output_schema(op_type: str, opset_version: int, domain: str) -> tuple[tuple[bool, ...] | None, bool] | None:
    """(whether each formal output is optional, None if one is variadic; whether ``training_mode`` is an
    attribute) of a standard op, or None when ONNX has no schema for it."""
    try:
        schema = onnx.defs.get_schema(op_type, opset_version, domain=domain)
    except onnx.defs.SchemaError:
        return None
    options = [output.option for output in schema.outputs]
    if onnx.defs.OpSchema.FormalParameterOption.Variadic in options:
        return None, "training_mode" in schema.attributes
    return (tuple(option == onnx.defs.OpSchema.FormalParameterOption.Optional for option in options),
            "training_mode" in schema.attributes)


def apply_rules(rules: RewriteRuleSet, model: ir.Model) -> tuple[int, bool]:
    """``rules.apply_to_model(model)`` and whether no dead node is left (see :meth:`IndexedRuleSet.apply_and_tell_clean`;
    always False for another rule set)."""
    if isinstance(rules, IndexedRuleSet):
        return rules.apply_and_tell_clean(model)
    return rules.apply_to_model(model), False


class _Rewrite(ir.passes.InPlacePass):
    """``onnxscript.rewriter.RewritePass`` (modified when a rule applied) that remembers whether the rule set's
    closing removal of unused nodes found none (``clean``)."""

    def __init__(self, rules: RewriteRuleSet) -> None:
        super().__init__()
        self.rules = rules
        self.clean = False

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        count, self.clean = apply_rules(self.rules, model)
        return ir.passes.PassResult(model, bool(count))


class _RemoveUnusedNodesUnless(RemoveUnusedNodes):
    """:class:`RemoveUnusedNodes`, skipped (not modified) while ``clean()`` says the graph has no dead node: the
    run would find nothing to remove, so the result and the ``modified`` flag are the same."""

    def __init__(self, clean: Callable[[], bool]) -> None:
        super().__init__()
        self._clean = clean

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if self._clean():
            return ir.passes.PassResult(model, modified=False)
        return super().call(model)


class _Loop(ir.passes.PassManager):
    """``PassManager`` that remembers whether its last step modified nothing (``settled``)."""

    settled = False

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        overall = False
        self.settled = False
        for step in range(self.steps):
            try:
                modified = ir.passes.Sequential.call(self, model).modified
            except Exception as error:
                raise ir.passes.PassError(f"An error occurred at step {step}") from error
            overall = overall or modified
            self.settled = not modified
            if self.settled and self.early_stop:
                break
        return ir.passes.PassResult(model, overall)


def optimize(model: ir.Model, num_iterations: int, *, input_size_limit: int, output_size_limit: int,
             should_fold: Callable[[ir.Node], bool | None]) -> None:
    """``onnxscript.optimizer.optimize_ir(model, num_iterations, ...)`` with the indexed default rules.

    The library's removals of unused nodes right after a removal that found none are skipped (the one after the
    rewrite pass, whose rule set removes unused nodes itself, and the one after a loop that ended on a step that
    changed nothing): they cannot find anything either.
    """
    rewrite = _Rewrite(default_rules())
    loop = _Loop(
        [_FoldConstants(shape_inference=True, input_size_limit=input_size_limit,
                                             output_size_limit=output_size_limit, should_fold=should_fold),
         rewrite,
         _RemoveUnusedNodesUnless(lambda: rewrite.clean),
         RemoveUnusedFunctions(),
         RemoveUnusedOpsets()],
        steps=num_iterations, early_stop=True)
    ir.passes.Sequential(
        Inline(),
        loop,
        _RemoveUnusedNodesUnless(lambda: loop.settled),
        LiftConstants(lift_all_constants=True, size_limit=0),
        LiftSubgraphInitializers(),
        DeduplicateInitializers(),
        common_passes.CommonSubexpressionEliminationPass(),
        OutputFix(),
        NameFix(),
    )(model)
