"""The long jobs of the workbench as plain functions (Qt-free): parse, load, compile.

Each takes ``callback=`` and ``cancel_token=`` like the ``compiler_core`` API, so
:class:`qbstudio.workers.Worker` runs them in a thread and tests can call them directly.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx_ir as ir

from compiler_core.api import load_mblt, mblt_compile, mxq_compile
from compiler_core.config import CompileConfig
from compiler_core.fileio import sha256_file
from compiler_core.progress import as_reporter
from qbstudio.state.runs import read_analysis

logger = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    """A parsed model ready for the graph view and the panels.

    Attributes:
        mblt_path: The MBLT file.
        model: The MBLT loaded with onnx-ir.
        sha256: The MBLT file's content hash: runs compiled from it carry it.
        name: The graph's name when the model has several ("Prefill" of a decoder LLM), else "".
        others: The model's other graphs by name, each an MBLT path and its model (a decoder LLM's "Decode").
    """

    mblt_path: Path
    model: ir.Model
    sha256: str = ""
    name: str = ""
    others: dict[str, tuple[Path, ir.Model]] = field(default_factory=dict)

    @property
    def graph_names(self) -> list[str]:
        """The names of the model's graphs, the main one first; empty for a model of one graph."""
        return [self.name, *self.others] if self.others else []

    def graph(self, name: str) -> tuple[Path, ir.Model]:
        """The MBLT path and model of graph ``name`` (the main one for "" or its own name)."""
        return self.others.get(name, (self.mblt_path, self.model))


PARSE_TARGET = "qbstudio.tasks:parse_to_file"
"""What :func:`parse_model` runs in a child process."""
LLM_PARSE_TARGET = "qbstudio.tasks:parse_llm_to_files"
"""What :func:`parse_llm_model` runs in a child process."""
LLM_GRAPHS = ("Prefill", "Decode")
"""A decoder LLM's graph names, the project's MBLT first."""


def llm_decode_path(mblt_path: str | Path) -> Path:
    """Where a decoder LLM's decode graph is kept beside the project's MBLT (its prefill graph)."""
    from compiler_core.llm import decode_mblt_path

    return decode_mblt_path(mblt_path)


def parse_model(source: str, mblt_path: str | Path, *, backend: str | None, input_shapes: dict[str, list[int]],
                output_names: list[str] | None = None, constant_inputs: dict[str, float] | None = None,
                allow_pickle: bool = False, submodule: str = "", callback=None, cancel_token=None) -> LoadedModel:
    """Parse ``source`` to ``mblt_path`` in a child process (atomic; nothing written on cancel), load it here.

    ``output_names`` ends the graph at those tensors (e.g. before a NonMaxSuppression); ``constant_inputs``
    binds scalar inputs; ``allow_pickle`` lets the torch frontend unpickle a whole module; ``submodule`` compiles
    a TorchScript file's child module instead of the whole. The frontends'
    libraries stay out of the workbench's process: importing TensorFlow (Keras, SavedModel) where
    QtWebEngine's Chromium runs crashed the workbench with a segmentation fault, and what a frontend loads
    (TensorFlow, torch: gigabytes) is freed with the child. A child that dies is an InternalError here.
    """
    from qbstudio.process_jobs import run_in_process

    path = run_in_process(PARSE_TARGET, str(source), str(mblt_path), backend=backend, input_shapes=input_shapes,
                          output_names=output_names, constant_inputs=constant_inputs, allow_pickle=allow_pickle,
                          submodule=submodule, callback=callback, cancel_token=cancel_token)
    return open_mblt(path, callback=callback, cancel_token=cancel_token)


def parse_to_file(source: str, mblt_path: str, *, backend: str | None, input_shapes: dict[str, list[int]],
                  output_names: list[str] | None = None, constant_inputs: dict[str, float] | None = None,
                  allow_pickle: bool = False, submodule: str = "", callback=None, cancel_token=None) -> str:
    """Parse ``source`` to ``mblt_path`` (atomic; nothing written on cancel); returns the MBLT's path."""
    reporter = as_reporter(callback, cancel_token)
    options: dict[str, Any] = {"allow_pickle": True} if allow_pickle else {}  # torch frontend options only
    if submodule:
        options["submodule"] = submodule
    return str(mblt_compile(source, mblt_path, backend=backend, input_shape_dict=input_shapes or None,
                            constant_inputs=constant_inputs or None, output_names=output_names or None,
                            callback=reporter, **options))


def parse_llm_model(source: str, mblt_path: str | Path, *, callback=None, cancel_token=None) -> LoadedModel:
    """Parse a decoder LLM (GGUF file, transformers folder) in a child process: its prefill graph to
    ``mblt_path``, its decode graph to :func:`llm_decode_path`; load both here."""
    from qbstudio.process_jobs import run_in_process

    run_in_process(LLM_PARSE_TARGET, str(source), str(mblt_path), callback=callback, cancel_token=cancel_token)
    return open_llm(mblt_path, callback=callback, cancel_token=cancel_token)


def parse_llm_to_files(source: str, mblt_path: str, *, callback=None, cancel_token=None) -> str:
    """:func:`compiler_core.llm.parse_llm` to ``mblt_path`` and its :func:`llm_decode_path`."""
    from compiler_core.llm import parse_llm

    parse_llm(source, mblt_path, llm_decode_path(mblt_path), callback=as_reporter(callback, cancel_token))
    return mblt_path


def open_mblt(mblt_path: str | Path, *, callback=None, cancel_token=None) -> LoadedModel:
    """Load an existing MBLT."""
    reporter = as_reporter(callback, cancel_token)
    with reporter.stage("open", total=1, message=f"opening {Path(mblt_path).name}"):
        model = load_mblt(mblt_path)
        sha = sha256_file(mblt_path)
        reporter.advance()
    return LoadedModel(Path(mblt_path), model, sha)


def open_llm(mblt_path: str | Path, *, callback=None, cancel_token=None) -> LoadedModel:
    """Load a decoder LLM's two MBLTs (prefill at ``mblt_path``, decode beside it)."""
    loaded = open_mblt(mblt_path, callback=callback, cancel_token=cancel_token)
    decode = llm_decode_path(mblt_path)
    reporter = as_reporter(callback, cancel_token)
    with reporter.stage("open", total=1, message=f"opening {decode.name}"):
        loaded.others = {LLM_GRAPHS[1]: (decode, load_mblt(decode))}
        reporter.advance()
    loaded.name = LLM_GRAPHS[0]
    return loaded


@dataclass
class CompileOutcome:
    """What :func:`compile_run` returns.

    Attributes:
        result: ``CompileResult.to_dict()``.
        analysis: The analysis JSON beside the MXQ (None if none was written).
        precisions: Layer name -> precision from the quantized program.
        duration_s: Wall time.
    """

    result: dict[str, Any]
    analysis: dict[str, Any] | None
    precisions: dict[str, str]
    duration_s: float


def compile_run(mblt_path: Path, save_path: Path, config: CompileConfig, calib_data_path: str | None,
                use_random_calib: bool, *, callback=None, cancel_token=None) -> CompileOutcome:
    """``compiler_core.api.mxq_compile`` into ``save_path``'s folder; the folder is removed on failure/cancel."""
    started = time.perf_counter()
    run_dir = save_path.parent
    try:
        result = mxq_compile(str(mblt_path), target_device=config.target_device, calib_data_path=calib_data_path,
                             save_path=save_path, compile_config=config,
                             use_random_calib=use_random_calib if not calib_data_path else None,
                             config_save_path=run_dir / "compile_config.json", callback=callback,
                             cancel_token=cancel_token)
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    precisions = {name: row["precision"] for row in result.quantize.model.layer_table() if row.get("precision")
                  for name in (row["name"], *row.get("nodes", []))}
    return CompileOutcome(result.to_dict(), read_analysis(result.analysis_path), precisions,
                          time.perf_counter() - started)


def sensitivity_report(mblt_path: Path, config: CompileConfig, calib_data_path: str | None, use_random: bool, *,
                       samples: int = 2, callback=None, cancel_token=None) -> dict[str, Any]:
    """The per-layer sensitivity of the project's MBLT under ``config`` (``SensitivityReport.to_dict()``)."""
    from compiler_core.api import sensitivity

    report = sensitivity(mblt_path, calib_data_path, compile_config=config, use_random_calib=use_random or None,
                         samples=samples, callback=callback, cancel_token=cancel_token)
    return report.to_dict()


@dataclass
class LlmCompileRequest:
    """What the workbench's LLM compile dialog asks for (:func:`compile_llm_job`).

    Attributes:
        text_path: Plain UTF-8 calibration text (tokenized with the model's tokenizer).
        preset: ``llm``, ``llm_fast`` or ``llm_accurate``.
        prefill_len: Tokens per prefill call.
        max_len: KV-cache positions.
        num_samples: Calibration windows of ``prefill_len`` tokens.
    """

    text_path: str
    preset: str = "llm"
    prefill_len: int = 32
    max_len: int = 1024
    num_samples: int = 32


LLM_PRESETS = ("llm", "llm_accurate", "llm_fast")
"""The compile presets offered for a decoder LLM, the default first."""
LLM_COMPILE_TARGET = "qbstudio.tasks:compile_llm_job"
"""What the workbench runs in a child process to compile a decoder LLM."""


def compile_llm_job(source: str, manifest_path: str, device: str, request: LlmCompileRequest, *,
                    inference_scheme: str = "single", callback=None, cancel_token=None) -> dict[str, Any]:
    """:func:`compiler_core.llm.compile_llm` to ``manifest_path`` (``<stem>.llm.json``) and the MXQs beside it.

    The manifest's folder is the compile's own: it is removed on failure or cancel. Returns the manifest as
    written, with ``path``.
    """
    from compiler_core.errors import CalibrationError
    from compiler_core.llm import compile_llm

    folder = Path(manifest_path).parent
    try:
        try:
            text = Path(request.text_path).read_text(encoding="utf-8", errors="replace")
        except OSError as error:
            raise CalibrationError(f"Cannot read the calibration text '{request.text_path}': {error.strerror}.",
                                   hint="Choose a plain text file.") from error
        manifest = compile_llm(source, manifest_path, target_device=device, prefill_len=request.prefill_len,
                               max_len=request.max_len, calib_text=text, num_samples=request.num_samples,
                               config_preset=request.preset, inference_scheme=inference_scheme,
                               callback=as_reporter(callback, cancel_token))
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    manifest.pop("results", None)  # CompileResult objects: the MXQs and the manifest on disk say the same
    return {**manifest, "path": str(manifest_path)}
