"""The MBLT operator set: the standard ONNX ops a canonical MBLT may contain.

A parsed model may use any ONNX op on the way in; canonicalization folds shape arithmetic and
constants away. What is left must be an op of the registry (:mod:`compiler_core.ops`) marked
``canonical``. Whether a given *device* runs an op is a separate question answered by the same
registry through ``compiler_core.targets``.
"""

from __future__ import annotations

from compiler_core.ops import canonical_op_types

MBLT_OPSET_VERSION = 21
MBLT_IR_VERSION = 10
MBLT_FORMAT_VERSION = "1"


DATA_DEPENDENT_OPS = frozenset({"NonMaxSuppression", "NonZero", "Unique", "Compress"})
"""Ops whose output shape depends on the input values: never in a static MBLT unless folded as constants.

They are post-processing in real models (box selection, masking); the parse refuses them early with the
tensors to cut the graph at (``output_names``).
"""


def is_mblt_op(domain: str, op_type: str) -> bool:
    """True if ``op_type`` in ``domain`` may appear in a canonical MBLT.

    Not allowed: NonMaxSuppression (its output shape depends on the data, and an MBLT is static;
    run box selection after the model), control flow (If/Loop/Scan must fold away), sequences, and
    ops newer than opset 21.
    """
    return domain in ("", "ai.onnx") and op_type in canonical_op_types()
