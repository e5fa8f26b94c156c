"""Tiling geometry of a MatMul of two activations: ``Y[..., M, N] = A[..., M, K] x B[..., K, N]``.

The tiler treats the output as ``batch x M`` rows of ``N`` elements (the leading axes, heads for
attention, flattened with the rows of A, as they are stored in the arena): a tile is a range of
these rows ``[r0, r1)`` and of the columns ``[c0, c1)`` of B. Its input regions are the rows of A it
multiplies (contiguous), the matrices of B of every batch its rows touch, restricted to its columns
(one strided transfer: the rows of consecutive matrices of B are equally spaced), and its output
region is its rows of Y, restricted to its columns.

Rank-4 operands ``[1, heads, M, K]`` are stored channels-last (``[1, M, K, heads]``, NHWC): the heads
are the innermost axis, so a tile is a band of rows of every head (``rows`` is M), reading its rows
of A, all of B (its columns) and writing its rows of Y, each element a group of ``heads`` values.
Operands with different leading axes (a broadcast batch) or a rank-4 batch other than 1 stay one tile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from compiler_core.backend.fusion import Layer
from compiler_core.backend.layout import NHWC, TensorLayout
from compiler_core.quantization.program import QuantizedModel


@dataclass(frozen=True)
class Region:
    """A 2-D region of a stored tensor: ``runs`` runs of ``run`` bytes, ``stride`` apart, from ``offset``."""

    offset: int
    run: int
    runs: int
    stride: int

    @property
    def nbytes(self) -> int:
        """Bytes the region holds once gathered."""
        return self.run * self.runs


@dataclass(frozen=True)
class MatmulGeometry:
    """Shapes of a tileable MatMul of two activations and the element sizes of A, B and Y."""

    batch: int
    m: int
    k: int
    n: int
    a_item: int
    b_item: int
    y_item: int
    channels_last: bool = False
    """The batch (heads) is the innermost stored axis (rank-4 NHWC operands): every tile covers all of it."""

    @property
    def rows(self) -> int:
        """Output rows the tiler cuts: ``batch x M`` (``M`` when the batch is channels-last)."""
        return self.m if self.channels_last else self.batch * self.m

    @property
    def group(self) -> int:
        """Stored values per matrix element: the heads when they are innermost, else 1."""
        return self.batch if self.channels_last else 1

    def batches(self, r0: int, r1: int) -> tuple[int, int]:
        """Matrices of B ``[first, last)`` that output rows ``[r0, r1)`` need."""
        if self.channels_last:
            return 0, self.batch
        return r0 // self.m, (r1 - 1) // self.m + 1

    def a_region(self, r0: int, r1: int) -> Region:
        """Rows ``[r0, r1)`` of A (all of K)."""
        run = self.k * self.group * self.a_item
        return Region(r0 * run, (r1 - r0) * run, 1, 0)

    def b_region(self, r0: int, r1: int, c0: int, c1: int) -> Region:
        """Columns ``[c0, c1)`` of the matrices of B that rows ``[r0, r1)`` need."""
        first, last = (0, 1) if self.channels_last else self.batches(r0, r1)
        item = self.group * self.b_item
        row = self.n * item
        if c1 - c0 == self.n:
            return Region(first * self.k * row, (last - first) * self.k * row, 1, 0)
        return Region((first * self.k * self.n + c0) * item, (c1 - c0) * item, (last - first) * self.k, row)

    def y_region(self, r0: int, r1: int, c0: int, c1: int) -> Region:
        """Rows ``[r0, r1)`` and columns ``[c0, c1)`` of Y."""
        item = self.group * self.y_item
        row = self.n * item
        if c1 - c0 == self.n:
            return Region(r0 * row, (r1 - r0) * row, 1, 0)
        return Region((r0 * self.n + c0) * item, (c1 - c0) * item, r1 - r0, row)

    def regions(self, r0: int, r1: int, c0: int, c1: int) -> list[Region]:
        """The tile's regions of A, B and Y, in that order."""
        return [self.a_region(r0, r1), self.b_region(r0, r1, c0, c1), self.y_region(r0, r1, c0, c1)]


def matmul_geometry(model: QuantizedModel, layer: Layer, layouts: dict[str, TensorLayout]) -> MatmulGeometry | None:
    """The tiling geometry of a layer whose main operation is a MatMul of two activations, or None.

    None when the operation is something else or its operands cannot be cut by rows (a broadcast
    batch, a rank-4 operand stored NHWC, a vector operand).
    """
    op = layer.main(model)
    if op.kind != "matmul" or len(layer.inputs) != 2 or len(layer.outputs) != 1:
        return None
    a, b, y = (layouts[name] for name in (*layer.inputs, layer.outputs[0]))
    rank = len(y.shape)
    if rank < 2 or any(len(item.shape) != rank for item in (a, b, y)):
        return None
    channels_last = {item.layout for item in (a, b, y)} == {NHWC}
    if channels_last and y.shape[0] != 1 or not channels_last and NHWC in {a.layout, b.layout, y.layout}:
        return None
    if not a.shape[:-2] == b.shape[:-2] == y.shape[:-2] or a.shape[-1] != b.shape[-2]:
        return None
    if (y.shape[-2], y.shape[-1]) != (a.shape[-2], b.shape[-1]):
        return None
    return MatmulGeometry(math.prod(y.shape[:-2]), a.shape[-2], a.shape[-1], b.shape[-1],
                          a.itemsize, b.itemsize, y.itemsize, channels_last)
