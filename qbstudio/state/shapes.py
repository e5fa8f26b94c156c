"""Model input shapes as a file declares them, and the static values the shape dialog suggests (no onnx import)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

logger = logging.getLogger(__name__)

Dim = int | str | None


@dataclass(frozen=True)
class InputShape:
    """One graph input as the file declares it.

    Attributes:
        name: Input name.
        dims: Each dimension: an int, a symbolic name, or None when unknown.
        dtype: Element type name (``float32`` ...).
    """

    name: str
    dims: tuple[Dim, ...]
    dtype: str

    @property
    def dynamic(self) -> bool:
        """Whether any dimension is not a fixed positive integer."""
        return any(not isinstance(dim, int) or dim <= 0 for dim in self.dims)

    def suggested(self) -> list[int]:
        """A static shape to offer: the fixed dims, 1 for the first dynamic dim (batch), else 0 (to fill in)."""
        return [dim if isinstance(dim, int) and dim > 0 else (1 if index == 0 else 0)
                for index, dim in enumerate(self.dims)]


_BATCH_WORDS = ("batch",)
_SEQUENCE_WORDS = ("seq", "length", "token", "sentence", "time", "len")
_SPATIAL_WORDS = ("height", "width")
_DETECTOR_WORDS = ("yolo", "det", "ocr", "ssd", "retina", "640", "text")
IMAGE_SIDE = 224
DETECTOR_SIDE = 640
SEQUENCE_LENGTH = 128


def dim_key(shape: InputShape, index: int) -> str:
    """The name the shape dialog asks for: a symbolic dim's own name (shared by every input using it),
    or ``input[index]`` for an unnamed one."""
    dim = shape.dims[index]
    return dim if isinstance(dim, str) and dim else f"{shape.name}[{index}]"


def dynamic_dim_keys(shapes: list[InputShape]) -> dict[str, list[str]]:
    """Dynamic dim key -> the inputs using it, in first-seen order (shared symbolic dims appear once)."""
    keys: dict[str, list[str]] = {}
    for shape in shapes:
        for index, dim in enumerate(shape.dims):
            if not isinstance(dim, int) or dim <= 0:
                users = keys.setdefault(dim_key(shape, index), [])
                if shape.name not in users:
                    users.append(shape.name)
    return keys


def suggest_dims(shapes: list[InputShape], model_name: str = "") -> dict[str, int]:
    """A value for every dynamic dim from its name, position and the model's name.

    Batch (the first dim, or a name with "batch") is 1; sequence-like names (``sequence_length``,
    ``seq``, ``tokens`` ...) and the later dims of 2-D/3-D inputs are 128; the spatial dims of an image
    input are 224, or 640 when the model's name suggests a detector (``yolo``, ``det``, ``ocr`` ...).
    """
    side = DETECTOR_SIDE if any(word in model_name.lower() for word in _DETECTOR_WORDS) else IMAGE_SIDE
    values: dict[str, int] = {}
    for shape in shapes:
        for index, dim in enumerate(shape.dims):
            if isinstance(dim, int) and dim > 0:
                continue
            values.setdefault(dim_key(shape, index), _suggest_dim(shape, index, side))
    return values


def _suggest_dim(shape: InputShape, index: int, side: int) -> int:
    name = shape.dims[index].lower() if isinstance(shape.dims[index], str) else ""
    if index == 0 or any(word in name for word in _BATCH_WORDS):
        return 1
    if any(word in name for word in _SPATIAL_WORDS):
        return side
    if any(word in name for word in _SEQUENCE_WORDS):
        return SEQUENCE_LENGTH
    if len(shape.dims) == 4:
        channels_first = shape.dims[1] in (1, 3) or index in (2, 3) and shape.dims[3] not in (1, 3)
        if (channels_first and index == 1) or (not channels_first and index == 3):
            return 3
        return side
    return SEQUENCE_LENGTH


def resolve_shapes(shapes: list[InputShape], values: dict[str, int]) -> dict[str, list[int]]:
    """The static shape of every dynamic input, with each dynamic dim taken from ``values`` by key."""
    return {shape.name: [dim if isinstance(dim, int) and dim > 0 else values[dim_key(shape, index)]
                         for index, dim in enumerate(shape.dims)]
            for shape in shapes if shape.dynamic}


SCALAR_TYPES = {"int": int, "float": float, "bool": bool, "number": float}
"""``forward`` parameter types (TorchScript schema or Python annotation text) whose value is one number."""


def is_scalar_type(type_text: str) -> bool:
    """Whether a ``forward`` parameter of this type takes one value (``sr: int``), not a tensor's shape."""
    return type_text.strip().lower() in SCALAR_TYPES


def read_input_answer(type_text: str, text: str) -> list[int] | int | float | bool:
    """What the user typed for a ``forward`` parameter: a shape (``1, 576``) or a scalar (``16000``).

    Raises:
        ValueError: the text is not a shape of positive integers, or not a value of the scalar type;
            the message says what is expected.
    """
    text = text.strip()
    kind = SCALAR_TYPES.get(type_text.strip().lower())
    if kind is bool:
        if text.lower() in ("true", "1", "yes"):
            return True
        if text.lower() in ("false", "0", "no"):
            return False
        raise ValueError("true or false")
    if kind is not None:
        try:
            return kind(int(text) if kind is int else float(text))
        except ValueError:
            raise ValueError(f"a number ({type_text})") from None
    parts = [part for part in text.replace("x", ",").replace(" ", ",").split(",") if part]
    if not parts or not all(part.isdigit() and int(part) > 0 for part in parts):
        raise ValueError("a shape of positive integers, e.g. 1, 3, 224, 224")
    return [int(part) for part in parts]
