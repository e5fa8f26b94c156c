"""The QBCompilerError hierarchy: every user-facing failure has a stable code and a remedy."""

from __future__ import annotations

from typing import Any


class QBCompilerError(Exception):
    """Base of every error the compiler raises on purpose.

    Attributes:
        code: Stable, machine-readable code (e.g. ``MODEL_LOAD_ERROR``); never renamed.
        message: What went wrong, in one sentence.
        hint: What the user can do about it (may be empty).
        fields: Structured context such as ``file``, ``node``, ``op`` or ``stage``.
    """

    code = "INTERNAL_ERROR"

    def __init__(self, message: str, *, hint: str = "", **fields: Any) -> None:
        self.message = message
        self.hint = hint
        self.fields = {key: value for key, value in fields.items() if value is not None}
        super().__init__(str(self))

    def __str__(self) -> str:
        return f"{self.message} {self.hint}".strip() if self.hint else self.message

    def one_line(self) -> str:
        """The ``ERROR [CODE]: message`` line the CLI prints."""
        return f"ERROR [{self.code}]: {self}".replace("\n", " ")

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form used by the JSONL channel and the GUI."""
        return {"code": self.code, "message": self.message, "hint": self.hint, **_jsonable(self.fields)}


def _jsonable(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: (v if isinstance(v, (str, int, float, bool, list, dict)) else str(v)) for k, v in fields.items()}


class ArgumentError(QBCompilerError):
    """A function or CLI argument is missing, malformed or contradicts another one."""

    code = "ARGUMENT_ERROR"


class ConfigError(QBCompilerError):
    """A compile configuration (file, dict or object) is invalid."""

    code = "CONFIG_ERROR"


class ModelLoadError(QBCompilerError):
    """The source model cannot be read: missing, truncated, wrong format, missing external data."""

    code = "MODEL_LOAD_ERROR"


class InvalidModelError(QBCompilerError):
    """The model was read but is not a valid graph (fails the checker or type/shape inference)."""

    code = "INVALID_MODEL"


class DynamicShapeError(QBCompilerError):
    """A dynamic dimension could not be pinned to a static size."""

    code = "DYNAMIC_SHAPE"


class UnsupportedOpsError(QBCompilerError):
    """The graph holds operators the compiler (or the target device) cannot handle.

    ``fields["ops"]`` lists ``{"op", "count", "nodes", "reason"}`` for every offending op type.
    """

    code = "UNSUPPORTED_OPS"


class DoesNotFitError(QBCompilerError):
    """A layer's smallest tile does not fit the core SRAM of the target device.

    ``fields`` names the layer (``layer``), the bytes its minimum tile needs (``needed_bytes``,
    with ``weights_bytes``, ``activation_bytes``, ``lut_bytes``) and the SRAM per core (``sram_bytes``).
    """

    code = "DOES_NOT_FIT"


class CalibrationError(QBCompilerError):
    """Calibration data is missing, unreadable or does not fit the model inputs."""

    code = "CALIBRATION_ERROR"


class MxqFormatError(QBCompilerError):
    """An MXQ file is corrupt, truncated or of an unknown version."""

    code = "MXQ_FORMAT_ERROR"


class OutputWriteError(QBCompilerError):
    """An output file (.mblt, .mxq, config, project) could not be written."""

    code = "OUTPUT_WRITE_ERROR"


class CancelledError(QBCompilerError):
    """The user cancelled the job; nothing was written."""

    code = "CANCELLED"


class InternalError(QBCompilerError):
    """A bug in the compiler. The message asks the user to report it."""

    code = "INTERNAL_ERROR"


ERROR_CODES = {cls.code: cls for cls in QBCompilerError.__subclasses__()}
