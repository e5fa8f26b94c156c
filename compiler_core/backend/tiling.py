"""Backend pass 3, tiling: each layer is cut into tiles whose working set fits one core's SRAM.

A tile is a band of output rows ``[r0, r1)`` and a range of output channels ``[c0, c1)``. Layers
whose output is one NHWC tensor and whose main operation is a 2-D convolution or point-wise work
tile by rows (a convolution reads its input rows with the halo its kernel needs); a ``linear`` with
one group may also split its output channels, so that only a slice of the weights is resident, and a
channel-local layer (global pooling, Resize) splits its channels, each tile reading only its channels
of the input (:func:`channel_sliced`). A MatMul of two activations tiles by its rows (the leading
axes flattened with the rows of A) and may split the columns of B (:mod:`compiler_core.backend.matmul`).
Every other layer is one tile holding its whole tensors. A tile's working set is the resident
weights slice (with its per-channel bias, multiplier and shift) + LUTs + twice the input and output
tile buffers (double-buffered DMA: the next tile streams in while this one computes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from compiler_core.backend.fusion import POINTWISE_KINDS, Layer
from compiler_core.backend.layout import NHWC, TensorLayout, channel_local, native_nhwc, slice_keeps_axis
from compiler_core.backend.matmul import matmul_geometry
from compiler_core.errors import DoesNotFitError
from compiler_core.quantization.program import IntOp, QuantizedModel

PER_CHANNEL_BYTES = 12
"""int32 bias, multiplier and shift per output channel of a ``linear``."""
ALIGN = 64
PIPELINE_TILES = 4
"""Row bands cut into at least this many tiles (when rows allow), so transfers overlap computation."""


def align(value: int) -> int:
    """``value`` rounded up to a multiple of 64 bytes."""
    return (value + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class Tile:
    """Output rows ``[r0, r1)`` and channels ``[c0, c1)`` computed by one core in one step."""

    core: int
    r0: int
    r1: int
    c0: int
    c1: int


@dataclass
class LayerTiling:
    """How one layer is tiled and split across the cores of a core mode.

    Attributes:
        rows: ``True`` when the layer tiles by output rows (else each tile covers all rows).
        split: ``spatial`` (row bands per core), ``channel`` (output channels per core) or ``none``.
        tiles: the tiles, grouped by channel chunk, in execution order per core.
        sram: bytes of the largest tile's working set: ``weights``, ``luts``, ``activations``, ``total``.
    """

    rows: bool
    split: str
    tiles: list[Tile]
    sram: dict[str, int] = field(default_factory=dict)


def row_tiled(model: QuantizedModel, layer: Layer, layouts: dict[str, TensorLayout]) -> bool:
    """Whether the layer can be computed band of output rows by band of output rows."""
    op = layer.main(model)
    if op.kind == "matmul":
        return matmul_geometry(model, layer, layouts) is not None
    if len(layer.outputs) != 1:
        return False
    out = layouts[layer.outputs[0]]
    rank, axis = len(out.shape), out.row_axis
    if out.layout == NHWC and op.kind == "linear":
        return native_nhwc(op) or dense_over_width(model, layer, layouts) and out.shape[0] == 1
    if op.kind == "linear":  # a dense layer over [1, tokens, features]: each token's row on its own
        source = layouts[layer.inputs[0]]
        return (op.attrs.get("layout") == "dense" and rank >= 3 and out.shape[0] == 1
                and source.shape[:-1] == out.shape[:-1] and source.layout == out.layout)
    if op.kind == "interpolate":  # a band of output rows reads the input rows its H matrix weights (input_rows)
        return (rank == 4 and axis == 2 and out.shape[0] == 1 and len(layer.ops) == 1 and native_nhwc(op)
                and len(layer.inputs) == 1 and layouts[layer.inputs[0]].layout == out.layout)
    row_local = (op.kind in POINTWISE_KINDS or op.kind == "concat" or slice_keeps_axis(op, rank, axis)
                 or reduces_after(op, rank, axis))
    if rank < 3 or out.shape[0] != 1 or not row_local or out.layout == NHWC and not native_nhwc(op):
        return False  # a band of NHWC rows is read as stored: a transposing DMA moves whole tensors only
    if op.kind == "concat" and op.attrs.get("axis", 0) % rank in (0, axis):
        return False
    inputs = [layouts[name] for name in layer.inputs]
    if any(len(item.shape) != rank or item.layout != out.layout or item.shape[axis] not in (1, out.rows)
           for item in inputs):
        return False
    # constants broadcast from the right: their row axis is absent, 1, or (point-wise) the tile's rows of it
    return op.kind == "move" or all(row_sliceable_const(model.ops[index], array, rank, axis, out.rows)
                                    for index in layer.ops for array in model.ops[index].consts.values())


def row_sliceable_const(op: IntOp, array, rank: int, axis: int, rows: int) -> bool:
    """Whether a tile of rows can use this constant: no row axis, a broadcast one, or (a point-wise
    operand such as an attention mask) one as long as the output's, of which the tile takes its rows."""
    if array.ndim < rank - axis:
        return True
    length = array.shape[array.ndim - (rank - axis)]
    return length == 1 or (op.kind in POINTWISE_KINDS and length == rows)


def reduces_after(op: IntOp, rank: int, axis: int) -> bool:
    """Softmax or layer normalisation over axes after ``axis``: each output row needs only its own input row."""
    return op.kind in ("softmax", "layernorm") and op.attrs.get("axis", -1) % rank > axis


def dense_over_width(model: QuantizedModel, layer: Layer, layouts: dict[str, TensorLayout]) -> bool:
    """A dense layer over the last axis of a rank-4 tensor (stored NHWC: that axis is W, not C).

    Each output row needs only the same input row (the whole W x C plane of it), so it tiles by rows; its tiles'
    channel ranges count the tensor's C, not the weights' output channels, so it never splits them and keeps every
    weight resident (a ``[1, 64, 64, 512] x [512, 1]`` attention score of text2tashkeel's BiLSTM needed 4 MiB in one
    tile and was refused; Swin/ConvNeXt-style Linears over channels-last feature maps loaded only C weight rows).
    """
    op = layer.main(model)
    return (op.kind == "linear" and op.attrs.get("layout") == "dense" and len(layer.inputs) >= 1
            and layouts[layer.outputs[0]].layout == NHWC and layouts[layer.inputs[0]].layout == NHWC
            and layouts[layer.inputs[0]].shape[:-1] == layouts[layer.outputs[0]].shape[:-1])


def channel_splittable(op: IntOp) -> bool:
    """A ``linear`` with one group can compute any range of its output channels from the whole input."""
    if op.kind != "linear" or op.attrs.get("group", 1) != 1:
        return False
    return op.attrs.get("layout") == "dense" or (op.attrs.get("layout") in ("conv", "conv_transpose")
                                                 and len(op.attrs["kernel"]) == 2)


def channel_sliced(model: QuantizedModel, layer: Layer, layouts: dict[str, TensorLayout]) -> bool:
    """A channel-local layer on NHWC tensors: a tile of output channels reads only those channels of the input."""
    if len(layer.inputs) != 1 or len(layer.outputs) != 1 or not channel_local(layer.main(model)):
        return False
    return layouts[layer.inputs[0]].layout == NHWC and layouts[layer.outputs[0]].layout == NHWC


def splits_channels(model: QuantizedModel, layer: Layer, layouts: dict[str, TensorLayout]) -> bool:
    """Whether tiles may cover a range of the output channels (weights slice, input channels slice, columns of B)."""
    return (channel_splittable(layer.main(model)) and not dense_over_width(model, layer, layouts)
            or channel_sliced(model, layer, layouts) or matmul_geometry(model, layer, layouts) is not None)


def output_rows(model: QuantizedModel, layer: Layer, layouts: dict[str, TensorLayout]) -> int:
    """Rows a row-tiled layer cuts: the output's row axis, or ``batch x M`` of a MatMul of activations."""
    geometry = matmul_geometry(model, layer, layouts)
    return geometry.rows if geometry is not None else layouts[layer.outputs[0]].rows


def input_rows(op: IntOp, r0: int, r1: int, in_height: int, out_height: int) -> tuple[int, int, int, int]:
    """Input rows ``[start, end)`` an output band needs, and the zero rows to pad above and below.

    A ConvTranspose runs as a stride-1 convolution of its zero-inserted input: the band's rows of
    that input are the real rows ``[start, end)`` with zeros inserted, padded (or, when negative,
    cropped) by ``top`` and ``bottom``.
    """
    if op.kind == "linear" and op.attrs.get("layout") == "conv_transpose":
        step, dilation, kernel = op.attrs["input_strides"][0], op.attrs["dilations"][0], op.attrs["kernel"][0]
        first = r0 - op.attrs["pads"][0]  # rows of the zero-inserted input, before its padding
        last = r1 - 1 - op.attrs["pads"][0] + (kernel - 1) * dilation + 1
        start = min(max(0, -(-first // step)), in_height - 1)
        end = max(min(in_height, (last - 1) // step + 1), start + 1)
        return start, end, start * step - first, last - ((end - 1) * step + 1)
    if op.kind == "linear" and op.attrs.get("layout") == "conv":
        top = op.attrs["pads"][0]
        stride, dilation, kernel = op.attrs["strides"][0], op.attrs["dilations"][0], op.attrs["kernel"][0]
        start = r0 * stride - top
        end = (r1 - 1) * stride - top + (kernel - 1) * dilation + 1
        return max(start, 0), min(end, in_height), max(-start, 0), max(end - in_height, 0)
    if op.kind == "interpolate" and "weight2" in op.consts:  # the input rows the band's rows of W_H weight
        used = np.flatnonzero(np.any(op.consts["weight2"][r0:r1] != 0, axis=0))
        return int(used[0]), int(used[-1]) + 1, 0, 0
    if in_height == out_height:
        return r0, r1, 0, 0
    return 0, in_height, 0, 0


def weight_bytes(op: IntOp, c0: int, c1: int, *, whole: bool = False) -> int:
    """Resident weight bytes of output channels ``[c0, c1)`` of a MAC layer (0 for other kinds); ``whole``: all of
    them (:func:`dense_over_width`)."""
    if op.kind != "linear":
        return 0
    weight = op.consts["weight"]
    c0, c1 = weight_channels(op, c0, c1, whole=whole)
    per_channel = weight.nbytes // weight.shape[0]
    return align((c1 - c0) * (per_channel + PER_CHANNEL_BYTES))


def weight_channels(op: IntOp, c0: int, c1: int, *, whole: bool = False) -> tuple[int, int]:
    """Weight rows a tile of output channels ``[c0, c1)`` needs (all of them unless the layer splits by channel;
    ``whole``: a layer whose channel ranges are not its weights', :func:`dense_over_width`)."""
    return (c0, c1) if channel_splittable(op) and not whole else (0, int(op.consts["weight"].shape[0]))


def lut_bytes(model: QuantizedModel, layer: Layer) -> int:
    """Bytes of the LUTs (``lut`` operations) the layer uses, resident for the whole layer.

    An embedding table (``gather_table``) stays in DRAM: the rows a tile needs are gathered by index.
    """
    return align(sum(array.nbytes for index in layer.ops for array in model.ops[index].consts.values()
                     if model.ops[index].kind == "lut"))


def out_channels(model: QuantizedModel, layer: Layer, layouts: dict[str, TensorLayout]) -> int:
    """Channels of the output (axis 1 of NHWC tensors, the last axis otherwise; the columns of B of a MatMul)."""
    geometry = matmul_geometry(model, layer, layouts)
    if geometry is not None:
        return geometry.n
    layout = layouts[layer.outputs[0]]
    return layout.shape[1] if layout.layout == NHWC else (layout.shape[-1] if layout.shape else 1)


def activation_bytes(model: QuantizedModel, layer: Layer, layouts: dict[str, TensorLayout], rows: bool,
                     r0: int, r1: int, c0: int, c1: int) -> int:
    """Input and output tile bytes of one tile (one buffer set; double buffering doubles it)."""
    op = layer.main(model)
    geometry = matmul_geometry(model, layer, layouts)
    if geometry is not None:
        return sum(align(region.nbytes) for region in geometry.regions(r0, r1, c0, c1))
    total = 0
    out = layouts[layer.outputs[0]]
    channels = out_channels(model, layer, layouts)
    sliced = channel_sliced(model, layer, layouts)
    for name in layer.inputs:
        layout = layouts[name]
        if rows:
            start, end, _, _ = input_rows(op, r0, r1, layout.rows, out.rows)
            total += align((end - start) * layout.row_bytes())
        else:
            total += align(layout.nbytes * (c1 - c0) // channels if sliced else layout.nbytes)
    for name in layer.outputs:
        layout = layouts[name]
        whole = (r1 - r0) * layout.row_bytes() if rows else layout.nbytes
        total += align(whole * (c1 - c0) // max(channels, 1)) if name == layer.outputs[0] else align(layout.nbytes)
    return total


def working_set(model: QuantizedModel, layer: Layer, layouts: dict[str, TensorLayout], rows: bool,
                r0: int, r1: int, c0: int, c1: int) -> dict[str, int]:
    """SRAM bytes of one tile: weights slice, LUTs and double-buffered activation tiles.

    A layer that is one tile (not row-tiled, no channel split) has nothing to overlap: one buffer set.
    """
    op = layer.main(model)
    weights = weight_bytes(op, c0, c1, whole=dense_over_width(model, layer, layouts))
    luts = lut_bytes(model, layer)
    sets = 2 if rows or splits_channels(model, layer, layouts) else 1
    activations = sets * activation_bytes(model, layer, layouts, rows, r0, r1, c0, c1)
    return {"weights": weights, "luts": luts, "activations": activations, "total": weights + luts + activations}


def tile_layer(model: QuantizedModel, layer: Layer, layouts: dict[str, TensorLayout], sram: int,
               cores: int) -> LayerTiling:
    """Tile one layer for ``cores`` cores working on it together.

    Raises:
        DoesNotFitError: even the smallest tile (one row, one output channel) exceeds ``sram``.
    """
    rows = row_tiled(model, layer, layouts)
    height = output_rows(model, layer, layouts) if rows else 1
    channels = max(out_channels(model, layer, layouts), 1)
    splittable = splits_channels(model, layer, layouts)
    if rows and height >= cores:
        split, bands, chunk_groups = "spatial", _even(height, cores), [(0, channels)]
    elif splittable and channels >= cores > 1:
        split, bands, chunk_groups = "channel", [(0, height)], _even(channels, cores)
    else:
        split, bands, chunk_groups = "none", [(0, height)], [(0, channels)]
    tiles: list[Tile] = []
    largest: dict[str, int] = {"total": 0}
    for core_index in range(max(len(bands), len(chunk_groups))):
        band = bands[core_index] if len(bands) > 1 else bands[0]
        group = chunk_groups[core_index] if len(chunk_groups) > 1 else chunk_groups[0]
        core_tiles, need = _fit(model, layer, layouts, rows, band, group, sram, core_index, splittable)
        tiles.extend(core_tiles)
        largest = need if need["total"] > largest["total"] else largest
    return LayerTiling(rows, split, tiles, largest)


def does_not_fit(layer: str, need: dict[str, int], sram: int, label: str = "") -> DoesNotFitError:
    """The refusal of ``layer`` (an operation's MBLT name; ``label`` says it for the user, e.g. with its source
    node) whose smallest tile's working set ``need`` exceeds ``sram`` bytes."""
    return DoesNotFitError(
        f"Layer {label or layer} does not fit the core SRAM: its smallest tile needs {need['total']:,} bytes "
        f"(weights {need['weights']:,}, activations {need['activations']:,}, LUTs {need['luts']:,}) and a core has "
        f"{sram:,}.",
        hint="Reduce the input resolution or the layer's width, or use a device with more SRAM per core.",
        layer=layer, needed_bytes=need["total"], weights_bytes=need["weights"], activation_bytes=need["activations"],
        lut_bytes=need["luts"], sram_bytes=sram)


def _even(count: int, parts: int) -> list[tuple[int, int]]:
    edges = [count * i // parts for i in range(parts + 1)]
    return [(a, b) for a, b in zip(edges, edges[1:]) if b > a]


def _fit(model, layer, layouts, rows, band, group, sram, core, splittable: bool) -> tuple[list[Tile], dict[str, int]]:
    """Largest tiles of ``band`` x ``group`` that fit: fewest channel chunks first, then most rows."""
    (r0, r1), (c0, c1) = band, group
    channels = c1 - c0
    chunks = 1
    while True:
        width = math.ceil(channels / chunks)
        row_count = _max_rows(model, layer, layouts, rows, r0, r1, c0, c0 + width, sram)
        if row_count:
            row_count = min(row_count, math.ceil((r1 - r0) / PIPELINE_TILES)) if rows else row_count
            break
        if chunks >= channels or not splittable:
            c_end = c0 + 1 if splittable else c1
            need = (_row_tile_need(model, layer, layouts, r0, r1, c0, c_end, 1) if rows
                    else working_set(model, layer, layouts, False, r0, r1, c0, c_end))
            raise does_not_fit(layer.main(model).name, need, sram)
        chunks = min(chunks * 2, channels)
    width = math.ceil(channels / chunks)
    tiles = []
    for start in range(c0, c1, width):
        end = min(start + width, c1)
        for row in range(r0, r1, row_count):
            tiles.append(Tile(core, row, min(row + row_count, r1), start, end))
    sets = [working_set(model, layer, layouts, rows, tile.r0, tile.r1, tile.c0, tile.c1) for tile in tiles]
    return tiles, max(sets, key=lambda need: need["total"])


def _row_tile_set(model, layer, layouts, r0, r1, c0, c1, count: int) -> int:
    """Bytes of the largest ``count``-row tile's working set (:func:`_row_tile_need`)."""
    return _row_tile_need(model, layer, layouts, r0, r1, c0, c1, count)["total"]


def _row_tile_need(model, layer, layouts, r0, r1, c0, c1, count: int) -> dict[str, int]:
    """Working set of the largest ``count``-row tile of rows ``[r0, r1)``.

    A tile away from the tensor's edges reads the most input rows (its halo is not clipped on
    either side), so the first, a middle and the last position bound every tile of the band. A
    MatMul tile reads the most matrices of B when it starts on a matrix's last row.
    """
    starts = {r0, r0 + max(r1 - r0 - count, 0) // 2, max(r1 - count, r0)}
    geometry = matmul_geometry(model, layer, layouts)
    if geometry is not None:
        widest = r0 + (geometry.m - 1 - r0) % geometry.m  # first start on a matrix's last row
        starts.add(min(widest, max(r1 - count, r0)))
    return max((working_set(model, layer, layouts, True, start, start + count, c0, c1) for start in starts),
               key=lambda need: need["total"])


def _max_rows(model, layer, layouts, rows, r0, r1, c0, c1, sram) -> int:
    """Most output rows per tile (0 when not even one fits); all rows when the layer is not row-tiled."""
    if not rows:
        return r1 - r0 if working_set(model, layer, layouts, False, r0, r1, c0, c1)["total"] <= sram else 0
    low, high = 0, r1 - r0
    while low < high:
        middle = (low + high + 1) // 2
        if _row_tile_set(model, layer, layouts, r0, r1, c0, c1, middle) <= sram:
            low = middle
        else:
            high = middle - 1
    return low
