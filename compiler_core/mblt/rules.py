"""Rewrite rules the onnxscript defaults lack, applied during canonicalization.

Each rule is pattern / check / rewrite; a failed check says why, so a remaining node can be
explained to the user.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase, RewriteRuleSet


class BatchNormToAffine(RewriteRuleClassBase):
    """Inference BatchNormalization not preceded by a Conv/Gemm -> ``Mul`` + ``Add`` by constants.

    The optimizer folds BatchNorm into a producing Conv, ConvTranspose or Gemm; a BatchNorm after
    anything else (an Add, a pooling, an input) becomes a per-channel affine that later passes can
    fold into the next layer.
    """

    def pattern(self, op, x, scale, bias, mean, var):
        return op.BatchNormalization(x, scale, bias, mean, var, _allow_other_attributes=True,
                                     _outputs=["y"])

    def check(self, context, x, scale, bias, mean, var, y) -> MatchResult:
        result = MatchResult()
        node = y.producer()
        if len(node.outputs) > 1 and any(out.uses() for out in node.outputs[1:]):
            return result.fail(f"{node.name}: training-mode outputs are used.")
        if any(v.const_value is None for v in (scale, bias, mean, var)):
            return result.fail(f"{node.name}: statistics are not constants.")
        if x.shape is None or len(x.shape) < 2:
            return result.fail(f"{node.name}: the input rank is unknown.")
        return result

    def rewrite(self, op, x, scale, bias, mean, var, y):
        node = y.producer()
        epsilon = node.attributes.get("epsilon", ir.AttrFloat32("epsilon", 1e-5)).as_float()
        gamma, beta, mu, sigma2 = (v.const_value.numpy().astype(np.float64) for v in (scale, bias, mean, var))
        multiplier = gamma / np.sqrt(sigma2 + epsilon)
        offset = beta - mu * multiplier
        broadcast = [-1] + [1] * (len(x.shape) - 2)
        mul = op.initializer(ir.tensor(multiplier.reshape(broadcast).astype(np.float32)), name=f"{node.name}_scale")
        add = op.initializer(ir.tensor(offset.reshape(broadcast).astype(np.float32)), name=f"{node.name}_shift")
        return op.Add(op.Mul(x, mul), add)


def _is_scalar(value, expected: float, tolerance: float = 1e-4) -> bool:
    const = value.const_value
    return const is not None and const.size == 1 and abs(float(const.numpy().reshape(())) - expected) <= tolerance


class _ErfGeluBase(RewriteRuleClassBase):
    """``x * 0.5 * (1 + erf(x / sqrt(2)))`` (exact GELU spelled out by exporters) -> ``Gelu``.

    One ``Gelu`` node is one look-up table on the NPU instead of five quantized steps.
    """

    def check(self, context, x, root2, one, half, **_) -> MatchResult:
        result = MatchResult()
        if not _is_scalar(root2, 2**0.5) or not _is_scalar(one, 1.0) or not _is_scalar(half, 0.5):
            return result.fail("constants are not sqrt(2), 1 and 0.5")
        return result

    def rewrite(self, op, x, root2, one, half, **_):
        return op.Gelu(x)


class ErfGeluOuterHalf(_ErfGeluBase):
    """``x * (0.5 * (1 + erf(x / sqrt 2)))``."""

    def pattern(self, op, x, root2, one, half):
        return op.Mul(x, op.Mul(half, op.Add(op.Erf(op.Div(x, root2)), one)))


class ErfGeluInnerHalf(_ErfGeluBase):
    """``(x * 0.5) * (1 + erf(x / sqrt 2))``."""

    def pattern(self, op, x, root2, one, half):
        return op.Mul(op.Mul(x, half), op.Add(op.Erf(op.Div(x, root2)), one))


class WholeWindowAveragePool(RewriteRuleClassBase):
    """AveragePool whose window is the whole (unpadded) input -> ``GlobalAveragePool``.

    TFLite writes global pooling as AVERAGE_POOL_2D with the feature map's size as its window
    (64x64 in MediaPipe's selfie segmentation), which exceeds the NPU's pooling window; the global
    pool computes the same mean without one.
    """

    def pattern(self, op, x):
        return op.AveragePool(x, _allow_other_attributes=True, _outputs=["y"])

    def check(self, context, x, y) -> MatchResult:
        result = MatchResult()
        node = y.producer()
        if x.shape is None or not all(isinstance(d, int) for d in x.shape):
            return result.fail(f"{node.name}: the input shape is not static.")
        spatial = list(x.shape)[2:]
        attributes = {name: attribute.value for name, attribute in node.attributes.items()}
        if list(attributes.get("kernel_shape", [])) != spatial:
            return result.fail(f"{node.name}: the window is not the whole input.")
        if any(attributes.get("pads", [0])) or attributes.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
            return result.fail(f"{node.name}: the input is padded.")
        if any(d != 1 for d in attributes.get("dilations", [1])):
            return result.fail(f"{node.name}: the window is dilated.")
        return result

    def rewrite(self, op, x, y):
        return op.GlobalAveragePool(x)


MBLT_REWRITE_RULES = RewriteRuleSet(
    [BatchNormToAffine.rule(), ErfGeluOuterHalf.rule(), ErfGeluInnerHalf.rule(), WholeWindowAveragePool.rule()],
    commute=True).rules
"""Our rules, in application order (operand orders of commutative ops included)."""
