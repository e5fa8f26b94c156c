"""One compile session: the MBLT read and hashed once, then carried in memory through every stage.

parse -> check -> calibrate -> quantize -> analyse -> write all take the :class:`MbltSession`
instead of a path, so no stage reloads or rehashes the file (DESIGN section 3). Stages that need
extra graph outputs (statistics, per-layer analysis) expose them on the shared graph only while
they build their onnxruntime session (:func:`compiler_core.calibration.statistics.session_with_outputs`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from compiler_core.errors import ModelLoadError
from compiler_core.fileio import sha256_bytes
from compiler_core.mblt.io import FORMAT_KEY, INPUTS_KEY, PROVENANCE_KEY

logger = logging.getLogger(__name__)


@dataclass
class MbltSession:
    """An MBLT in memory with its identity.

    Attributes:
        path: the file it was read from.
        graph: the model (shared by the stages; a stage that changes it restores it).
        sha256: hex sha256 of the file's bytes.
        provenance: the provenance record with ``format_version`` and ``inputs``, as
            :func:`compiler_core.mblt.io.read_provenance` returns it.
    """

    path: Path
    graph: ir.Model
    sha256: str
    provenance: dict[str, Any]

    @classmethod
    def open(cls, path: str | Path) -> MbltSession:
        """Read the file once: hash its bytes, parse them, check that it is an MBLT.

        Raises:
            ModelLoadError: missing, unreadable, or not written by this compiler's parse stage.
        """
        path = Path(path)
        if not path.is_file():
            raise ModelLoadError(f"MBLT file '{path}' does not exist.",
                                 hint="Check the path, or run `qbcompiler parse` first.", file=str(path))
        data = path.read_bytes()
        try:
            proto = onnx.ModelProto.FromString(data)
            if any(tensor.data_location == onnx.TensorProto.EXTERNAL for tensor in proto.graph.initializer):
                onnx.load_external_data_for_model(proto, str(path.parent))
            graph = ir.from_proto(proto)
        except (DecodeError, ValueError, OSError) as error:
            raise ModelLoadError(f"'{path.name}' cannot be read as an MBLT (truncated or wrong file): {error}.",
                                 hint="Parse the source model again.", file=str(path)) from error
        props = dict(graph.metadata_props)
        if FORMAT_KEY not in props:
            raise ModelLoadError(f"'{path.name}' is an ONNX file but not an MBLT (no {FORMAT_KEY} metadata).",
                                 hint="Run `qbcompiler parse --model FILE` to make an MBLT from it.", file=str(path))
        provenance = json.loads(props.get(PROVENANCE_KEY, "{}"))
        provenance.update(format_version=props[FORMAT_KEY], inputs=json.loads(props.get(INPUTS_KEY, "[]")))
        logger.debug("MBLT %s read once (%d bytes)", path.name, len(data))
        return cls(path, graph, sha256_bytes(data), provenance)
