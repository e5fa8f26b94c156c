"""Sparse TFLite tensors (the ``DENSIFY`` input format) -> dense numpy arrays.

Follows ``tensorflow/lite/kernels/internal/utils/sparsity_format_converter.cc``: the tensor is
traversed level by level in ``traversal_order`` over the *expanded* shape (each blocked dimension
split into a block index and an in-block index, the block dimensions appended at the end). A dense
level enumerates ``dense_size`` children per parent; a CSR level enumerates
``indices[segments[p]:segments[p + 1]]`` for parent ``p``. Vectorised over all parents at once.
"""

from __future__ import annotations

import numpy as np

from compiler_core.frontends.tflite.reader import DimensionMetadata, Sparsity


def densify(values: np.ndarray, shape: tuple[int, ...], sparsity: Sparsity) -> np.ndarray:
    """The dense array of ``shape`` whose non-zeros are ``values`` laid out as ``sparsity`` says."""
    rank = len(shape)
    order = sparsity.traversal_order or tuple(range(len(sparsity.dim_metadata)))
    positions = np.zeros(1, dtype=np.int64)
    level_coordinates: list[np.ndarray] = []
    for meta in sparsity.dim_metadata:
        positions, level_coordinates = _descend(meta, positions, level_coordinates)
    expanded = {dim: level_coordinates[level] for level, dim in enumerate(order)}
    index = []
    for dim in range(rank):
        coordinate = expanded[dim]
        if dim in sparsity.block_map:
            block_dim = rank + sparsity.block_map.index(dim)
            block_size = sparsity.dim_metadata[order.index(block_dim)].dense_size
            coordinate = coordinate * block_size + expanded[block_dim]
        index.append(coordinate)
    dense = np.zeros(shape, dtype=values.dtype)
    dense[tuple(index)] = values[positions]
    return dense


def _descend(meta: DimensionMetadata, positions: np.ndarray,
             coordinates: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    """One traversal level: children's storage positions and every level's coordinate per child."""
    if meta.dense:
        size = meta.dense_size
        children = (positions[:, None] * size + np.arange(size)).ravel()
        return children, [c.repeat(size) for c in coordinates] + [np.tile(np.arange(size), positions.size)]
    starts, ends = meta.segments[positions], meta.segments[positions + 1]
    counts = ends - starts
    children = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts) + np.repeat(starts, counts)
    return children, [c.repeat(counts) for c in coordinates] + [meta.indices[children]]
