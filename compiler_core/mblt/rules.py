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


MBLT_REWRITE_RULES = RewriteRuleSet([BatchNormToAffine.rule()]).rules
"""Our rules, in application order."""
